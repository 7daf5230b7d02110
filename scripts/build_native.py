"""Compile the codec and the core with mypyc, in place (broker/native.py says which modules)

    .venv/bin/python scripts/build_native.py [--force] [--clean]

Run by scripts/setup.sh. Does nothing when the compiled modules match their sources
(broker/native.stamp holds the digest they were built from) or MQTT_PURE_PYTHON=1 asks for the
pure-Python ones (without --force); otherwise builds them with the
machine's C compiler (about 40 s) and writes the stamp.
Without a compiler or the Python headers it says so and leaves the pure-Python sources in
place: the broker runs the same, slower. `--clean` removes the compiled modules.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = 40  # about, on one core of the machine in README's tables


def _native():
    """broker/native.py alone: importing the package would load the modules it chooses."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_native_select",
                                                  os.path.join(ROOT, "broker", "native.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (dataclasses looks the module up)
    spec.loader.exec_module(mod)
    return mod


def artefacts(group) -> list[str]:
    patterns = [group.source(m, ROOT)[:-3] + ".*.so" for m in group.modules]
    patterns.append(os.path.join(ROOT, *group.library.split(".")) + "__mypyc.*.so")
    return [p for pattern in patterns for p in glob.glob(pattern)] + \
        [p for p in [group.stamp(ROOT)] if os.path.exists(p)]


# what builds before the core was compiled left: the codec's own library and stamp
LEGACY = ("broker/protocol/_native__mypyc.*.so", "broker/protocol/native.stamp")


def clean(group) -> None:
    for path in artefacts(group) + [p for g in LEGACY for p in glob.glob(os.path.join(ROOT, g))]:
        os.remove(path)


def build(native, group) -> None:
    from mypyc.build import mypycify
    from setuptools import setup
    digest = native.source_digest(group, ROOT)
    sources = [os.path.relpath(group.source(m, ROOT), ROOT) for m in group.modules]
    clean(group)
    tmp = tempfile.mkdtemp(prefix="mypyc-build-")
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypyc names modules by their path from here
    try:
        with warnings.catch_warnings():  # setuptools' note on pyproject.toml's beta table
            warnings.simplefilter("ignore")
            setup(name="mqtt-broker-native",
                  ext_modules=mypycify(sources, opt_level="3", group_name=group.library,
                                       target_dir=os.path.join(tmp, "c")),
                  script_args=["-q", "build_ext", "--inplace", "--build-temp", tmp,
                               "--build-lib", tmp])
    finally:
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.join(ROOT, ".mypy_cache"), ignore_errors=True)
        # (mypyc's C sources went under tmp: build/ keeps what else is built there, the history
        # job's compiled guard, sink/history/guard.py)
    with open(group.stamp(ROOT), "w", encoding="ascii") as f:
        f.write(digest + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--force", action="store_true", help="rebuild even when up to date")
    p.add_argument("--clean", action="store_true", help="remove the compiled modules and stop")
    args = p.parse_args(argv)
    native = _native()
    group = native.NATIVE
    if args.clean:
        clean(group)
        return 0
    if native.state(group, ROOT) == "compiled" and not args.force:
        return 0  # up to date (state(): every module built, from these sources)
    if os.environ.get(native.PURE_ENV) == "1" and not args.force:
        return 0  # the pure-Python core asked for (MQTT_PURE_PYTHON=1): nothing to compile for it
    print(f"build_native: compiling the {group.name} with mypyc (about {SECONDS} s)", flush=True)
    try:
        build(native, group)
    except BaseException as exc:  # SystemExit from setuptools on a compiler error
        if isinstance(exc, KeyboardInterrupt):
            raise
        clean(group)
        print(f"build_native: WARNING: could not compile the {group.name} ({exc}); the broker "
              f"runs its pure-Python source, which is slower. A C compiler and the Python "
              f"headers are needed (Debian: apt-get install gcc python3-dev).", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
