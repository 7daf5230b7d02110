"""Many connections: 10,000 idle MQTT connections held, memory measured, others still served."""
import asyncio
import resource

import pytest

from broker.protocol import packets as P
from broker.protocol.codec import encode
from tests.conftest import BrokerProcess
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
