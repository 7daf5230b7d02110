"""Compile the codec (broker/protocol/codec.py, properties.py) with mypyc, in place.

    .venv/bin/python scripts/build_native.py [--force] [--clean]

Run by scripts/setup.sh. Does nothing when the compiled modules match the sources
(broker/protocol/native.stamp holds the digest they were built from); otherwise builds them
with the machine's C compiler (about 10 s) and writes the stamp. Without a compiler or the
Python headers it says so and leaves the pure-Python codec in place: the broker runs the
same, slower. `--clean` removes the compiled modules. See broker/protocol/native.py.
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
PKG = os.path.join(ROOT, "broker", "protocol")
GROUP = "broker.protocol._native"  # one shared library for both modules, inside the package


def _native():
    """broker/protocol/native.py alone: importing the package would load the modules it replaces."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_native_select", os.path.join(PKG, "native.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def artefacts() -> list[str]:
    return [p for pattern in ("codec.*.so", "properties.*.so", "_native__mypyc.*.so",
                              "native.stamp") for p in glob.glob(os.path.join(PKG, pattern))]


def clean() -> None:
    for path in artefacts():
        os.remove(path)


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import setup
    native = _native()
    digest = native.source_digest()
    sources = [os.path.join("broker", "protocol", n + ".py") for n in native.COMPILED]
    clean()
    tmp = tempfile.mkdtemp(prefix="mypyc-build-")
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypyc names modules by their path from here
    try:
        with warnings.catch_warnings():  # setuptools' note on pyproject.toml's beta table
            warnings.simplefilter("ignore")
            setup(name="mqtt-codec-native", ext_modules=mypycify(sources, opt_level="3",
                                                                 group_name=GROUP),
                  script_args=["-q", "build_ext", "--inplace", "--build-temp", tmp,
                               "--build-lib", tmp])
    finally:
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(os.path.join(ROOT, ".mypy_cache"), ignore_errors=True)
        shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)  # mypyc's C sources
    with open(native.STAMP, "w", encoding="ascii") as f:
        f.write(digest + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--force", action="store_true", help="rebuild even when up to date")
    p.add_argument("--clean", action="store_true", help="remove the compiled modules and stop")
    args = p.parse_args(argv)
    if args.clean:
        clean()
        return 0
    native = _native()
    complete = len(native.compiled_files()) == len(native.COMPILED)
    if native.choose(complete, native.read_stamp(), native.source_digest(), False) == "compiled" \
            and not args.force:
        return 0  # up to date
    print("build_native: compiling the codec with mypyc (about 10 s)", flush=True)
    try:
        build()
    except BaseException as exc:  # SystemExit from setuptools on a compiler error
        if isinstance(exc, KeyboardInterrupt):
            raise
        clean()
        print(f"build_native: WARNING: could not compile the codec ({exc}); the broker runs the "
              f"pure-Python codec, which is slower. A C compiler and the Python headers are "
              f"needed (Debian: apt-get install gcc python3-dev).", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
