"""The compiled codec and core (broker/native.py): which one runs, and never a stale one."""
from __future__ import annotations

import importlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

import broker.core
import broker.protocol
from broker import native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
G = native.NATIVE


@pytest.mark.parametrize("have, stamp, pure, want", [
    (False, None, False, "pure"),       # nothing compiled
    (False, "d", False, "pure"),
    (True, "d", False, "compiled"),     # built from this source
    (True, "old", False, "stale"),      # source edited since the build
    (True, None, False, "stale"),       # built, stamp lost
    (True, "d", True, "pure"),          # MQTT_PURE_PYTHON=1
    (True, "old", True, "pure"),
])
def test_choose(have, stamp, pure, want):
    assert native.choose(have, stamp, "d", pure) == want


def test_it_runs_compiled_where_it_can_be_built():
    """setup.sh builds it where gcc and Python.h are; the suite's second pass asks for pure."""
    modules = [importlib.import_module(m) for m in G.modules]
    if os.environ.get(native.PURE_ENV) == "1":
        assert broker.protocol.CODEC == broker.core.CORE == "pure" and native.running() == "pure"
        assert all(m.__file__.endswith(".py") for m in modules)
        return
    buildable = (shutil.which("gcc") is not None
                 and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
    if not buildable:
        pytest.skip("no gcc or Python headers here: setup.sh leaves the pure-Python sources")
    assert broker.protocol.CODEC == broker.core.CORE == "compiled", \
        "bash scripts/setup.sh should have compiled them"
    assert native.running() == "compiled"
    assert not any(m.__file__.endswith(".py") for m in modules)
    assert len(native.compiled_files(G)) == len(G.modules)


def _copy_package(tmp_path, stamp: str) -> str:
    """broker/ with native.py, protocol/ and core/, with fake compiled modules (never imported
    when not chosen) and the given stamp; settings/ and mqtt_topics/ come from ROOT."""
    dst = tmp_path / "broker"
    for sub in ("protocol", "core"):
        shutil.copytree(os.path.join(ROOT, "broker", sub), dst / sub,
                        ignore=shutil.ignore_patterns("*.so", "native.stamp", "__pycache__"))
    for f in ("__init__.py", "native.py"):
        shutil.copy(os.path.join(ROOT, "broker", f), dst / f)
    for module in G.modules:
        with open(G.source(module, str(tmp_path))[:-3] + SUFFIX, "wb") as f:
            f.write(b"not a shared library")
    with open(G.stamp(str(tmp_path)), "w") as f:
        f.write(stamp + "\n")
    return str(tmp_path)


_IMPORT = """
import importlib
from broker import native
files = [importlib.import_module(m).__file__ for m in native.NATIVE.modules]
import broker.protocol, broker.core
print(broker.protocol.CODEC, broker.core.CORE, *files)
"""


def _import(root: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _IMPORT], cwd=root, capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{root}:{ROOT}", **(env or {})})


def _chosen(out: subprocess.CompletedProcess) -> tuple[str, list[str]]:
    assert out.returncode == 0, out.stderr
    codec, core, *files = out.stdout.split()
    assert codec == core  # decided once, for both packages
    assert len(files) == len(G.modules)
    return codec, files


def test_a_stale_build_is_never_run(tmp_path):
    """Compiled from older sources: the sources run instead, every one of them (a compiled
    module among sources would not match them), and a warning says how to rebuild."""
    root = _copy_package(tmp_path, "0" * 64)
    out = _import(root, {native.PURE_ENV: "0"})
    chosen, files = _chosen(out)
    assert chosen == "stale" and all(f.endswith(".py") for f in files), files
    assert "older sources" in out.stderr and "scripts/setup.sh" in out.stderr


def test_a_build_missing_a_module_is_never_run(tmp_path):
    """One compiled module gone (the others call it natively): all run from their sources."""
    root = _copy_package(tmp_path, native.source_digest(G))
    os.remove(G.source("broker.core.router", root)[:-3] + SUFFIX)
    assert native.state(G, root) == "stale"
    out = _import(root, {native.PURE_ENV: "0"})
    chosen, files = _chosen(out)
    assert chosen == "stale" and all(f.endswith(".py") for f in files), files


def test_pure_python_can_be_asked_for(tmp_path):
    root = _copy_package(tmp_path, native.source_digest(G))
    out = _import(root, {native.PURE_ENV: "1"})
    chosen, files = _chosen(out)
    assert chosen == "pure" and all(f.endswith(".py") for f in files), files
    assert "older" not in out.stderr


def test_a_matching_stamp_loads_the_compiled_modules(tmp_path):
    """The stamp matches: the (here fake) compiled modules are what Python imports."""
    root = _copy_package(tmp_path, native.source_digest(G))
    out = _import(root, {native.PURE_ENV: "0"})
    assert out.returncode != 0 and "ImportError" in out.stderr  # it tried the fake .so


def test_the_digest_covers_every_module_it_is_checked_with(tmp_path):
    """Every module of broker/protocol and broker/core (mypyc builds in their constants and
    types) is in the digest: editing any makes the compiled modules stale; a module outside
    them (broker/server.py) does not."""
    root = _copy_package(tmp_path, native.source_digest(G))
    shutil.copy(os.path.join(ROOT, "broker", "server.py"), tmp_path / "broker" / "server.py")
    before = native.source_digest(G, root)
    assert before == native.source_digest(G)
    sources = G.sources(root)
    assert {G.source(m, root) for m in G.modules} <= set(sources)
    assert {os.path.basename(p) for p in sources} >= {"empties.py", "hooks.py", "errors.py"}
    for path in sources + [str(tmp_path / "broker" / "server.py")]:
        with open(path) as f:
            text = f.read()
        with open(path, "a") as f:
            f.write("\n")
        changed = native.source_digest(G, root) != before
        assert changed == (path in sources), path
        with open(path, "w") as f:
            f.write(text)


# Decodes a seeded corpus (every byte fixture, the fuzz seeds, and mutations of both), re-encodes
# what decoded, and prints one digest of every outcome: packet, error type and reason code.
_DIFFERENTIAL = r"""
import hashlib, random, sys
from broker import native
from broker.protocol.codec import Decoder, decode_one, encode, is_one_packet
from tests import fuzzing, vectors
rng = random.Random(11)
corpus = [v.data for v in vectors.ALL] + fuzzing.ALL_SEEDS
inputs = corpus + [fuzzing.mutated(rng, corpus) for _ in range(4000)]
h = hashlib.sha256()
for data in inputs:
    for level in (4, 5):
        outs = [Decoder(level, 1 << 20).feed(data)]
        if is_one_packet(data):  # decode_one's precondition (Connection.feed checks it)
            outs.append(decode_one(data, level))
        for out in outs:
            pkts, err = out
            h.update(repr(pkts).encode())
            h.update(repr((type(err).__name__, getattr(err, "reason_code", None), str(err))).encode())
            for p in pkts:
                try:
                    h.update(encode(p, level))
                except Exception as exc:
                    h.update(type(exc).__name__.encode())
print(native.running(), len(inputs), h.hexdigest())
"""


def test_compiled_and_pure_codec_agree_on_every_input():
    built = native.state(G)
    if built != "compiled":  # (whichever codec this process runs: MQTT_PURE_PYTHON=1 or not)
        pytest.skip(f"the codec is not compiled here (build state: {built}; setup.sh compiles "
                    "it where gcc and the Python headers exist): nothing to compare")
    runs = {}
    for pure in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", _DIFFERENTIAL], cwd=ROOT, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": ROOT, native.PURE_ENV: pure},
                             timeout=300)
        assert out.returncode == 0, out.stderr
        runs[pure] = out.stdout.split()
    assert runs["0"][0] == "compiled" and runs["1"][0] == "pure"
    assert int(runs["0"][1]) > 4000
    assert runs["0"][2] == runs["1"][2]  # same packets, errors and re-encodings


def test_without_a_compiler_setup_goes_on_with_the_pure_sources(tmp_path):
    """build_native.py where the C compiler fails: a warning saying what to install, no compiled
    module left behind (not even the fake ones there before), and the packages run the sources."""
    root = _copy_package(tmp_path, "0" * 64)
    os.makedirs(tmp_path / "scripts")
    shutil.copy(os.path.join(ROOT, "scripts", "build_native.py"), tmp_path / "scripts")
    out = subprocess.run([sys.executable, str(tmp_path / "scripts" / "build_native.py")],
                         cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CC": "/bin/false", "PYTHONPATH": root,
                              native.PURE_ENV: "0"})  # (the suite's pure pass sets it to 1)
    assert out.returncode == 0, out.stderr
    assert "could not compile the codec and core" in out.stderr
    assert "apt-get install gcc" in out.stderr
    left = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "broker") for f in files]
    assert not [f for f in left if f.endswith(".so") or f.endswith("native.stamp")], left
    chosen, files = _chosen(_import(root, {native.PURE_ENV: "0"}))
    assert chosen == "pure" and all(f.endswith(".py") for f in files), files
