"""Many connections: 10,000 idle MQTT connections held, memory measured, others still served."""
import asyncio
import resource

import pytest

from broker.protocol import packets as P
from broker.protocol.codec import encode
from tests.conftest import BrokerProcess
from tests.integration.helpers import flood_stalled_reader
from tests.mqtt_raw import RawClient

N = 10_000


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def open_connections(port: int, n: int) -> list:
    conns = []
    sem = asyncio.Semaphore(500)

    async def one(i):
        async with sem:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(encode(P.Connect(f"idle-{i}", 4, keep_alive=0), 4))
            ack = await asyncio.wait_for(r.readexactly(4), 30)
            assert ack == b"\x20\x02\x00\x00", ack
            conns.append((r, w))

    await asyncio.gather(*(one(i) for i in range(n)))
    return conns


@pytest.mark.timeout(240)
def test_ten_thousand_idle_connections(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = N + 2000  # per process: this one and the broker each hold N sockets
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"needs {want} file descriptors, the hard limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # inherited by the broker process
    b = BrokerProcess(tmp_path, settings={"persistence.enabled": False, "metrics.sys_interval": 0}).start()
    try:
        probe = RawClient(b.port)
        probe.connect("probe")
        base = rss_kib(b.proc.pid)

        async def run():
            conns = await open_connections(b.port, N)
            await asyncio.sleep(1.0)
            held = rss_kib(b.proc.pid)
            # the broker still serves others while holding them all
            c = RawClient(b.port)
            c.connect("after")
            c.subscribe("ping")
            c.publish("ping", b"pong")
            got = c.recv_type(P.PUBLISH)
            for _, w in conns:
                w.close()
            return len(conns), held, got

        n, held, got = asyncio.run(run())
        per_conn = (held - base) / n
        print(f"\n{n} idle connections: broker RSS {base} KiB -> {held} KiB, "
              f"{per_conn:.1f} KiB per connection")
        assert n == N
        assert got.payload == b"pong"
        assert b.alive()
    finally:
        b.stop()


@pytest.mark.timeout(120)
def test_stalled_reader_cannot_grow_broker_memory(tmp_path):
    """A subscriber that stops reading: its socket buffer fills, then QoS 0 messages to it are
    dropped (counted) instead of piling up in the broker; other clients are still served."""
    import socket
    import urllib.request

    from tests.conftest import free_port
    mport = free_port()
    b = BrokerProcess(tmp_path, settings={"metrics.enabled": True, "metrics.port": mport,
                                          "persistence.enabled": False}).start()
    try:
        stalled = RawClient(b.port)
        stalled.connect("stalled")
        stalled.subscribe("flood/#")
        stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read again
        base = rss_kib(b.proc.pid)
        flood_stalled_reader(b.port).close()  # ~300 MB offered to a reader that reads nothing
        grown_mib = (rss_kib(b.proc.pid) - base) / 1024
        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        dropped = [float(line.split()[-1]) for line in body.splitlines()
                   if line.startswith('mqtt_messages_dropped_total{reason="slow_consumer"}')]
        print(f"\nbroker RSS grew {grown_mib:.1f} MiB while ~300 MiB were offered to a stalled "
              f"reader; {dropped[0]:.0f} messages dropped for it")
        assert grown_mib < 100
        assert dropped and dropped[0] > 100_000
        assert b.alive()
    finally:
        b.stop()
