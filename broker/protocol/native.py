"""Which codec runs: the mypyc-compiled one, or the pure-Python source.

`scripts/build_native.py` (run by scripts/setup.sh) compiles `codec.py` and `properties.py`
with mypyc into extension modules next to them, and writes `native.stamp`: the digest of the
sources it compiled. Python imports an extension module before a `.py` of the same name, so
a compiled module older than its source would run silently in its place. `select()` (called
by the package's `__init__`, before anything imports the codec) prevents that: it loads the
pure-Python source instead when

- the sources' digest differs from the stamp (edited since the build: warns how to rebuild),
- or the environment sets MQTT_PURE_PYTHON=1 (the test suite's second pass uses it).

The two are the same code: the compiled one only runs faster (decode and encode are the
broker's hottest paths). Nothing here does I/O beyond reading the two sources at import.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import warnings

COMPILED = ("properties", "codec")  # in import order: codec imports properties
# sources the compiled modules have parts of built in (packets.py's Final constants): in the digest
BUILT_IN = ("packets",)
HERE = os.path.dirname(os.path.abspath(__file__))
STAMP = os.path.join(HERE, "native.stamp")
PURE_ENV = "MQTT_PURE_PYTHON"


def source_digest(directory: str = HERE) -> str:
    """sha256 over the sources that get compiled (and BUILT_IN), in a fixed order."""
    h = hashlib.sha256()
    for name in COMPILED + BUILT_IN:
        with open(os.path.join(directory, name + ".py"), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def compiled_files() -> list[str]:
    """The extension modules this Python would import for COMPILED, where present."""
    found = []
    for name in COMPILED:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(HERE, name + suffix)
            if os.path.exists(path):
                found.append(path)
                break
    return found


def choose(have_compiled: bool, stamp: str | None, digest: str, pure_requested: bool) -> str:
    """'compiled', 'pure' (asked for, or nothing compiled) or 'stale' (compiled != source)."""
    if not have_compiled or pure_requested:
        return "pure"
    return "compiled" if stamp == digest else "stale"


def read_stamp() -> str | None:
    try:
        with open(STAMP, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def _load_source(package: str, name: str) -> None:
    """Import HERE/name.py as package.name, ahead of the extension module of that name."""
    full = f"{package}.{name}"
    loader = importlib.machinery.SourceFileLoader(full, os.path.join(HERE, name + ".py"))
    spec = importlib.util.spec_from_loader(full, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    loader.exec_module(module)
    setattr(sys.modules[package], name, module)


def select(package: str) -> str:
    """Make sure the codec that gets imported matches its source; returns what was chosen."""
    found = compiled_files()
    if not found:
        return "pure"
    choice = choose(True, read_stamp(), source_digest(), os.environ.get(PURE_ENV) == "1")
    if choice == "stale":
        warnings.warn(f"{', '.join(os.path.basename(p) for p in found)} were compiled from an "
                      f"older codec.py/properties.py: running the pure-Python source instead "
                      f"(slower). Rebuild with: bash scripts/setup.sh", RuntimeWarning,
                      stacklevel=3)
    if choice != "compiled":
        for name in COMPILED:
            _load_source(package, name)
    return choice


def running() -> str:
    """'compiled' or 'pure': what the imported codec is (for the start-up log)."""
    codec = importlib.import_module(__package__ + ".codec")
    path = getattr(codec, "__file__", "") or ""
    return "pure" if path.endswith(".py") else "compiled"
