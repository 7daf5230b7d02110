"""Which modules run compiled (mypyc), and never a compiled build older than its source.

`scripts/build_native.py` (run by scripts/setup.sh) compiles two groups of modules with mypyc
into extension modules next to their sources:

- the codec: broker/protocol/properties.py and codec.py (decode and encode);
- the core: broker/core/message.py, router.py, session.py, connection.py and broker.py (the
  per-message path: a PUBLISH's handling, routing and delivery).

Each group's `native.stamp` holds the digest of the sources it was compiled against: every
module of the packages it is type-checked with (mypyc builds in their constants and types).
Python imports an extension module before a `.py` of the same name, so a build older than its
source would run silently in its place. `select()`, called by each package's `__init__` before
anything imports its modules, prevents that: the package's modules are imported from their
sources instead when

- the digest differs from the stamp (edited since the build: warns how to rebuild),
- or the environment sets MQTT_PURE_PYTHON=1 (the test suite's second pass uses it).

Compiled or not, it is the same code; the compiled one runs faster. Nothing here does I/O beyond
reading the sources at import.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `broker` lies
PURE_ENV = "MQTT_PURE_PYTHON"


@dataclass(frozen=True)
class Group:
    """Modules compiled together into one shared library, inside their package."""
    name: str                       # for messages: "codec", "core"
    package: str                    # "broker.protocol"
    modules: tuple[str, ...]        # compiled, in import order
    checked_with: tuple[str, ...]   # packages whose every .py is in the digest

    def directory(self, root: str = ROOT) -> str:
        return os.path.join(root, *self.package.split("."))

    def stamp(self, root: str = ROOT) -> str:
        return os.path.join(self.directory(root), "native.stamp")

    @property
    def library(self) -> str:
        """mypyc's group name: the shared library holding the modules' code."""
        return self.package + "._native"

    def sources(self, root: str = ROOT) -> list[str]:
        """The .py files the digest covers, in a fixed order."""
        found = []
        for package in self.checked_with:
            d = os.path.join(root, *package.split("."))
            found += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".py"))
        return found


CODEC = Group("codec", "broker.protocol", ("properties", "codec"), ("broker.protocol",))
CORE = Group("core", "broker.core", ("message", "router", "session", "connection", "broker"),
             ("broker.protocol", "broker.core"))
GROUPS = (CODEC, CORE)
BY_PACKAGE = {g.package: g for g in GROUPS}


def source_digest(group: Group, root: str = ROOT) -> str:
    """sha256 over the group's sources (Group.sources), with their names."""
    h = hashlib.sha256()
    for path in group.sources(root):
        h.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def compiled_files(group: Group, root: str = ROOT) -> list[str]:
    """The extension modules this Python would import for the group's modules, where present."""
    found = []
    for name in group.modules:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(group.directory(root), name + suffix)
            if os.path.exists(path):
                found.append(path)
                break
    return found


def choose(have_compiled: bool, stamp: str | None, digest: str, pure_requested: bool) -> str:
    """'compiled', 'pure' (asked for, or nothing compiled) or 'stale' (compiled != source)."""
    if not have_compiled or pure_requested:
        return "pure"
    return "compiled" if stamp == digest else "stale"


def read_stamp(group: Group, root: str = ROOT) -> str | None:
    try:
        with open(group.stamp(root), encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def state(group: Group, root: str = ROOT, pure_requested: bool = False) -> str:
    """choose() for the group as built under root."""
    return choose(bool(compiled_files(group, root)), read_stamp(group, root),
                  source_digest(group, root), pure_requested)


class _FromSource:
    """Imports the named modules from their .py, ahead of an extension module of that name (a
    meta path finder: importlib.abc is not imported for its base class, it loads tempfile and
    shutil into every broker)."""

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = paths  # full module name -> its source

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        where = self.paths.get(fullname)
        return None if where is None else importlib.util.spec_from_file_location(fullname, where)


def select(package: str) -> str:
    """Make sure the package's modules that get imported match their sources; returns what was
    chosen: 'compiled', 'pure' or 'stale' (then pure, with a warning)."""
    group = BY_PACKAGE[package]
    found = compiled_files(group)
    if not found:
        return "pure"
    choice = state(group, pure_requested=os.environ.get(PURE_ENV) == "1")
    if choice == "stale":
        warnings.warn(f"the {group.name}'s compiled modules ({', '.join(os.path.basename(p) for p in found)}) "
                      f"were built from older sources of {', '.join(group.checked_with)}: running "
                      f"the pure-Python sources instead (slower). Rebuild with: bash scripts/setup.sh",
                      RuntimeWarning, stacklevel=3)
    if choice != "compiled":
        d = group.directory()
        sys.meta_path.insert(0, _FromSource({f"{package}.{name}": os.path.join(d, name + ".py")
                                             for name in group.modules}))
    return choice


def running(group: Group = CODEC) -> str:
    """'compiled' or 'pure': what the group's imported modules are (for the start-up log)."""
    module = importlib.import_module(f"{group.package}.{group.modules[-1]}")
    path = getattr(module, "__file__", "") or ""
    return "pure" if path.endswith(".py") else "compiled"
