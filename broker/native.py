"""Which modules run compiled (mypyc), and never a compiled build older than its source.

`scripts/build_native.py` (run by scripts/setup.sh) compiles with mypyc, into extension modules
next to their sources, sharing one library (broker/_native__mypyc.*.so):

- the codec: broker/protocol/packets.py, properties.py and codec.py (decode and encode);
- the core: broker/core/message.py, router.py, session.py, connection.py and broker.py (the
  per-message path: a PUBLISH's handling, routing and delivery).

`broker/native.stamp` holds the digest of the sources they were compiled against: every module
of broker/protocol and broker/core (mypyc builds in their constants and types). Python imports an
extension module before a `.py` of the same name, so a build older than its source would run
silently in its place. `select()`, called by the `__init__` of broker/protocol and broker/core
before anything imports their modules, prevents that: all of them are imported from their
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
    """Modules compiled together into one shared library (they call each other natively)."""
    name: str                       # for messages
    modules: tuple[str, ...]        # compiled, by full name, in import order
    checked_with: tuple[str, ...]   # packages whose every .py is in the digest
    library: str                    # mypyc's group name: the shared library with their code

    def source(self, module: str, root: str = ROOT) -> str:
        return os.path.join(root, *module.split(".")) + ".py"

    def stamp(self, root: str = ROOT) -> str:
        return os.path.join(root, *self.library.split(".")[:-1], "native.stamp")

    def sources(self, root: str = ROOT) -> list[str]:
        """The .py files the digest covers, in a fixed order."""
        found = []
        for package in self.checked_with:
            d = os.path.join(root, *package.split("."))
            found += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".py"))
        return found


# One group: the core reads the packets' fields and calls the codec natively only when they are
# compiled together (bench/core_bench.py --instructions, qos1_acked: 26,625 instructions per
# delivery with the codec and the core in two libraries, 20,437 in one).
NATIVE = Group("codec and core",
               ("broker.protocol.packets", "broker.protocol.properties", "broker.protocol.codec",
                "broker.core.message", "broker.core.router", "broker.core.session",
                "broker.core.connection", "broker.core.broker"),
               ("broker.protocol", "broker.core"), "broker._native")
_chosen: dict[Group, str] = {}


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
    for module in group.modules:
        base = group.source(module, root)[:-3]
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if os.path.exists(base + suffix):
                found.append(base + suffix)
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
    """choose() for the group as built under root; some of its modules compiled but not all is
    'stale' too (a compiled module calls the others natively: they must all be compiled)."""
    have = compiled_files(group, root)
    if have and len(have) < len(group.modules) and not pure_requested:
        return "stale"
    return choose(bool(have), read_stamp(group, root), source_digest(group, root), pure_requested)


class _FromSource:
    """Imports the named modules from their .py, ahead of an extension module of that name (a
    meta path finder: importlib.abc is not imported for its base class, it loads tempfile and
    shutil into every broker)."""

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = paths  # full module name -> its source

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        where = self.paths.get(fullname)
        return None if where is None else importlib.util.spec_from_file_location(fullname, where)


def select(group: Group = NATIVE) -> str:
    """Make sure the group's modules that get imported match their sources; returns what was
    chosen: 'compiled', 'pure' or 'stale' (then pure, with a warning). Called by the __init__ of
    each package holding some of them, before those are imported; decided once."""
    choice = _chosen.get(group)
    if choice is not None:
        return choice
    found = compiled_files(group)
    choice = "pure" if not found else state(group, pure_requested=os.environ.get(PURE_ENV) == "1")
    _chosen[group] = choice
    if choice == "stale":
        warnings.warn(f"the compiled {group.name} ({len(found)} modules) were built from older "
                      f"sources of {', '.join(group.checked_with)}: running the pure-Python "
                      f"sources instead (slower). Rebuild with: bash scripts/setup.sh",
                      RuntimeWarning, stacklevel=3)
    if found and choice != "compiled":
        sys.meta_path.insert(0, _FromSource({m: group.source(m) for m in group.modules}))
    return choice


def running(group: Group = NATIVE) -> str:
    """'compiled' or 'pure': what the group's imported modules are (for the start-up log)."""
    module = importlib.import_module(group.modules[-1])
    path = getattr(module, "__file__", "") or ""
    return "pure" if path.endswith(".py") else "compiled"
