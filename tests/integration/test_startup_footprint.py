"""A broker started on a plain configuration (no config file, TCP only, sink, cluster, dashboard,
metrics endpoint and auth files off) loads only what that configuration uses: none of the
optional features' libraries, none of the standard modules kept for mistakes and files it was
not given, and no thread besides its own (the event loop's thread pool stays unstarted). And the
numeric-address listener it makes itself behaves and fails as the event loop's would."""
from __future__ import annotations

import ast
import asyncio
import os
import socket
import subprocess
import sys

import pytest
import uvloop

from broker.transport.sockets import numeric_listen_socket
from tests.conftest import ROOT, free_port

# a child that starts the broker as `python -m broker` does, and reports once it listens
PROBE = r"""
import os, signal, socket, sys, threading, time
from broker.__main__ import main
port = int(sys.argv[1])

def report():
    while True:
        with socket.socket() as s:  # (not create_connection: its getaddrinfo loads the IDNA codec)
            try:
                s.connect(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.05)
    time.sleep(0.3)
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    print(repr({"modules": sorted(sys.modules), "threads": threads}), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=report, daemon=True).start()
sys.exit(main(sys.argv[2:]))
"""

# optional features' libraries, and standard modules only a mistake, a config file, a password
# file or a ban list needs
NOT_LOADED = [
    "numpy", "aiohttp", "prometheus_client", "kafka", "websockets", "sink", "cluster",
    "kafka_client", "broker.dashboard", "broker.observability.metrics",
    "broker.transport.websocket", "tomllib", "difflib", "tempfile", "shutil", "ipaddress",
    "json", "secrets", "encodings.idna",
]


def started_broker_state(tmp_path, *args: str) -> dict:
    port = free_port()
    p = subprocess.run([sys.executable, "-c", PROBE, str(port), "--host", "127.0.0.1", "--port",
                        str(port), "--data-dir", str(tmp_path), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    return ast.literal_eval(p.stdout.strip().splitlines()[-1])


def test_a_plain_broker_loads_no_optional_feature_and_starts_no_thread_pool(tmp_path):
    state = started_broker_state(tmp_path)
    loaded = [m for m in NOT_LOADED
              if any(x == m or x.startswith(m + ".") for x in state["modules"])]
    assert loaded == [], f"a plain broker imported {loaded}"
    assert "broker.core.broker" in state["modules"] and "uvloop" in state["modules"]
    if state["threads"] is not None:  # the main thread and the probe's: no libuv worker
        assert state["threads"] == 2, state["threads"]


def test_a_broker_given_a_config_file_loads_its_parser(tmp_path):
    """The other side of the lazy import: a file is still read (and tomllib loaded for it)."""
    conf = tmp_path / "b.toml"
    conf.write_text("[mqtt]\nreceive_maximum = 100\n")
    state = started_broker_state(tmp_path, "--config", str(conf))
    assert "tomllib" in state["modules"]


LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def bind_error(loop_name: str, host: str, port: int, own: bool) -> OSError:
    """The error binding a taken port gives: the loop's create_server, or ours."""
    loop = LOOPS[loop_name]()
    try:
        if own:
            with pytest.raises(OSError) as exc:
                numeric_listen_socket(host, port)
        else:
            with pytest.raises(OSError) as exc:
                loop.run_until_complete(loop.create_server(asyncio.Protocol, host, port,
                                                           reuse_address=True))
        return exc.value
    finally:
        loop.close()


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"),
                                         (socket.AF_INET6, "::1")])
def test_a_taken_numeric_address_fails_as_the_event_loops_create_server(loop_name, family, host):
    if family == socket.AF_INET6 and not ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    with socket.socket(family) as held:
        held.bind((host, 0))
        held.listen()
        port = held.getsockname()[1]
        theirs = bind_error(loop_name, host, port, own=False)
        ours = bind_error(loop_name, host, port, own=True)
    assert (ours.errno, str(ours), ours.strerror) == (theirs.errno, str(theirs), theirs.strerror)


def test_the_numeric_listener_socket_has_the_loops_options():
    with numeric_listen_socket("127.0.0.1", 0) as s:  # type: ignore[union-attr]
        assert s.family == socket.AF_INET and s.type == socket.SOCK_STREAM
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
        assert s.getsockname()[0] == "127.0.0.1"
    if ipv6_loopback():
        with numeric_listen_socket("::1", 0) as s:  # type: ignore[union-attr]
            assert s.family == socket.AF_INET6
            assert s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
    # names (and what inet_pton refuses) are left to the loop's resolver
    assert numeric_listen_socket("localhost", 0) is None
    assert numeric_listen_socket("", 0) is None
    assert numeric_listen_socket("fe80::1%lo", 0) is None
