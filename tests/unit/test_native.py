"""The compiled codec (broker/protocol/native.py): which one runs, and never a stale one."""
from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

import broker.protocol
from broker.protocol import codec, native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


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


def test_the_codec_runs_compiled_where_it_can_be_built():
    """setup.sh builds it where gcc and Python.h are; the suite's second pass asks for pure."""
    if os.environ.get(native.PURE_ENV) == "1":
        assert broker.protocol.CODEC == "pure" and codec.__file__.endswith("codec.py")
        assert native.running() == "pure"
        return
    buildable = (shutil.which("gcc") is not None
                 and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
    if not buildable:
        pytest.skip("no gcc or Python headers here: setup.sh leaves the pure-Python codec")
    assert broker.protocol.CODEC == "compiled", "bash scripts/setup.sh should have compiled it"
    assert native.running() == "compiled" and not codec.__file__.endswith(".py")
    assert native.compiled_files() and len(native.compiled_files()) == len(native.COMPILED)


def _copy_package(tmp_path, stamp: str) -> str:
    """broker/ with protocol/ only, with fake compiled modules (never imported when not chosen)."""
    dst = tmp_path / "broker"
    shutil.copytree(os.path.join(ROOT, "broker", "protocol"), dst / "protocol",
                    ignore=shutil.ignore_patterns("*.so", "native.stamp", "__pycache__"))
    shutil.copy(os.path.join(ROOT, "broker", "__init__.py"), dst / "__init__.py")
    for name in native.COMPILED:
        (dst / "protocol" / (name + SUFFIX)).write_bytes(b"not a shared library")
    (dst / "protocol" / "native.stamp").write_text(stamp + "\n")
    return str(tmp_path)


def _import_codec(root: str, env: dict | None = None) -> subprocess.CompletedProcess:
    code = ("import broker.protocol as p, broker.protocol.codec as c, broker.protocol.properties as q;"
            "print(p.CODEC, c.__file__, q.__file__)")
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": root, **(env or {})}, timeout=60)


def test_a_stale_build_is_never_run(tmp_path):
    """Compiled from an older source: the source runs instead, and a warning says how to rebuild."""
    root = _copy_package(tmp_path, stamp="0" * 64)
    out = _import_codec(root, {native.PURE_ENV: "0"})
    assert out.returncode == 0, out.stderr
    chosen, codec_file, props_file = out.stdout.split()
    assert chosen == "stale"
    assert codec_file.endswith(os.path.join("protocol", "codec.py"))
    assert props_file.endswith(os.path.join("protocol", "properties.py"))
    assert "compiled from an older codec.py" in out.stderr and "scripts/setup.sh" in out.stderr


def test_pure_python_can_be_asked_for(tmp_path):
    root = _copy_package(tmp_path, stamp=native.source_digest())
    out = _import_codec(root, {native.PURE_ENV: "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "pure" and out.stdout.split()[1].endswith("codec.py")
    assert "older" not in out.stderr


def test_a_matching_stamp_loads_the_compiled_modules(tmp_path):
    """The stamp matches: the (here fake) compiled module is what Python imports."""
    root = _copy_package(tmp_path, stamp=native.source_digest())
    out = _import_codec(root, {native.PURE_ENV: "0"})
    assert out.returncode != 0 and "ImportError" in out.stderr  # it tried the fake .so


def test_the_digest_covers_both_sources(tmp_path):
    """Both compiled sources, and packets.py, whose Final constants the compiled codec has built
    in: editing any of them makes the compiled modules stale."""
    assert "packets" in native.BUILT_IN
    for name in native.COMPILED + native.BUILT_IN:
        shutil.copy(os.path.join(native.HERE, name + ".py"), tmp_path / (name + ".py"))
    before = native.source_digest(str(tmp_path))
    assert before == native.source_digest()
    for name in native.COMPILED + native.BUILT_IN:
        path = tmp_path / (name + ".py")
        text = path.read_text()
        path.write_text(text + "\n")
        assert native.source_digest(str(tmp_path)) != before
        path.write_text(text)


# Decodes a seeded corpus (every byte fixture, the fuzz seeds, and mutations of both), re-encodes
# what decoded, and prints one digest of every outcome: packet, error type and reason code.
_DIFFERENTIAL = r"""
import hashlib, random, sys
from broker.protocol import native
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
    built = native.choose(bool(native.compiled_files()), native.read_stamp(), native.source_digest(),
                          False)
    if built != "compiled":  # (whichever codec this process runs: MQTT_PURE_PYTHON=1 or not)
        pytest.skip("the codec is not compiled here (no gcc or Python headers): nothing to compare")
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


def test_without_a_compiler_setup_goes_on_with_the_pure_codec(tmp_path):
    """build_native.py where the C compiler fails: a warning saying what to install, no compiled
    module left behind (not even the fake one there before), and the package runs the source."""
    root = _copy_package(tmp_path, stamp="0" * 64)
    os.makedirs(tmp_path / "scripts")
    shutil.copy(os.path.join(ROOT, "scripts", "build_native.py"), tmp_path / "scripts")
    out = subprocess.run([sys.executable, str(tmp_path / "scripts" / "build_native.py")],
                         cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CC": "/bin/false", "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr
    assert "could not compile the codec" in out.stderr and "apt-get install gcc" in out.stderr
    left = os.listdir(tmp_path / "broker" / "protocol")
    assert not [f for f in left if f.endswith(".so") or f == "native.stamp"], left
    imported = _import_codec(root, {native.PURE_ENV: "0"})
    assert imported.returncode == 0 and imported.stdout.split()[0] == "pure", imported.stderr
