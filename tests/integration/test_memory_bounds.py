"""Hostile clients cannot grow the broker's memory: retained replays to clients that do not
read, SUBSCRIBE repeating one filter, huge packets before CONNECT, many long topics.
Through real sockets; the broker's RSS (VmRSS of its process) is sampled while it works."""
import socket
import threading
import time

import pytest

from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder, encode
from broker.protocol.properties import encode_vbi
from tests.conftest import BrokerProcess
from tests.integration.helpers import P, assert_served, bye, connect, publish_ok, recv_publish, uniq

MIB = 1 << 20


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class PeakRSS:
    """Samples a process's RSS every 20 ms in a thread; `peak` is the highest seen."""

    def __init__(self, pid: int):
        self.pid = pid
        self.base = rss(pid)
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, rss(self.pid))
            except (OSError, RuntimeError):
                return

    def grown_mib(self) -> float:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss(self.pid))
        return (self.peak - self.base) / MIB


@pytest.fixture
def lean_broker(tmp_path):
    b = BrokerProcess(tmp_path, settings={"persistence.enabled": False, "metrics.sys_interval": 0}).start()
    yield b
    alive = b.alive()
    b.stop()
    assert alive, "the broker died:\n" + b.logs()[-3000:]


def non_reader(port: int, packets: list) -> socket.socket:
    """A raw client that connects, sends `packets` and never reads again."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(encode(P.Connect(f"mute-{time.monotonic_ns()}", P.MQTT_5)))
    for p in packets:
        s.sendall(p if isinstance(p, bytes) else encode(p))
    return s


@pytest.mark.timeout(300)
def test_retained_replay_to_clients_that_do_not_read_is_bounded(lean_broker):
    """300 retained messages of 100 KB (30 MB): four clients subscribe to all of them and never
    read, a fifth sends one 18 KB SUBSCRIBE repeating a filter 3000 times. The broker used to
    encode every replay at once (hundreds of MiB); now replays wait under backpressure.
    A reading client still gets every retained message exactly once per distinct filter."""
    b = lean_broker
    top = uniq("big")
    pub = connect(b.port)
    for i in range(300):
        pub.publish(f"{top}/{i}", bytes([i % 256]) * 100_000, retain=True)
    publish_ok(pub, uniq("sync"), qos=1)  # all of the above were processed
    time.sleep(0.5)
    peak = PeakRSS(b.proc.pid)
    mutes = [non_reader(b.port, [P.Subscribe(1, [(f"{top}/#", P.SubscriptionOptions(0))])])
             for _ in range(4)]
    dup = P.Subscribe(1, [(f"{top}/7", P.SubscriptionOptions(0))] * 3000)
    assert len(encode(dup)) > 18_000
    mutes.append(non_reader(b.port, [dup]))
    # a normal reader: SUBACK with one code per filter, then each retained message once per
    # distinct filter (the '#' filter twice in this SUBSCRIBE counts once)
    r = connect(b.port)
    ack = r.subscribe(f"{top}/#", f"{top}/#", f"{top}/5", qos=1)
    assert ack.reason_codes == [1, 1, 1]
    got = [recv_publish(r, timeout=30) for _ in range(301)]
    assert r.nothing(1.0)
    assert all(m.retain for m in got)
    topics = sorted(m.topic for m in got)
    assert topics == sorted([f"{top}/{i}" for i in range(300)] + [f"{top}/5"])
    assert all(m.payload == bytes([int(m.topic.rsplit("/", 1)[1]) % 256]) * 100_000 for m in got)
    assert_served(b.port)
    time.sleep(1.0)
    grown = peak.grown_mib()
    print(f"\nbroker RSS grew {grown:.1f} MiB (peak) with 5 non-reading subscribers")
    assert grown < 40, f"broker RSS grew {grown:.1f} MiB"
    for s in mutes:
        s.close()
    bye(pub, r)


def connect_start(total: int, level: int = P.MQTT_5) -> bytes:
    """The first bytes of a CONNECT whose Remaining Length says `total` bytes follow."""
    body = encode(P.Connect("huge", level))
    return b"\x10" + encode_vbi(total) + body[2:]


@pytest.mark.timeout(300)
def test_huge_connect_is_refused_before_it_is_buffered(lean_broker):
    """Ten sockets each send the start of a 20 MiB CONNECT and keep sending: the broker
    answers CONNACK 0x95 and closes without buffering them (it used to hold 200 MiB);
    another client is served meanwhile, and a CONNECT with a 64 KiB will is still accepted."""
    b = lean_broker
    peak = PeakRSS(b.proc.pid)
    replies = [None] * 10

    def hostile(i):
        s = socket.create_connection(("127.0.0.1", b.port), timeout=60)
        got = b""
        try:
            s.sendall(connect_start(20 * MIB))
            chunk = b"\x00" * 65536
            for _ in range(20 * MIB // 65536 - 1):
                s.sendall(chunk)
        except OSError:
            pass  # closed by the broker: expected
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                got += data
        except OSError:
            pass
        s.close()
        replies[i] = got

    threads = [threading.Thread(target=hostile, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    assert_served(b.port)
    for t in threads:
        t.join(120)
    grown = peak.grown_mib()
    print(f"\nbroker RSS grew {grown:.1f} MiB while 10 clients sent 20 MiB CONNECTs")
    for got in replies:
        pkts, err = Decoder(P.MQTT_5).feed(got)
        assert err is None and [p.type for p in pkts] == [P.CONNACK], got[:40]
        assert pkts[0].reason_code == rc.PACKET_TOO_LARGE
    assert grown < 40, f"broker RSS grew {grown:.1f} MiB"
    ok = connect(b.port, will=P.Will("w/t", b"w" * 65535, 0, False))
    bye(ok)
    assert_served(b.port)


@pytest.mark.timeout(300)
def test_many_long_topics_do_not_stay_in_memory(lean_broker):
    """3000 distinct 60 KB topics nobody subscribes to: the match cache used to keep them all
    (~180 MB, kept after the client left)."""
    b = lean_broker
    c = connect(b.port)
    publish_ok(c, "warm/up", qos=1)
    time.sleep(0.5)
    peak = PeakRSS(b.proc.pid)
    long = "L" * 60_000
    for i in range(3000):
        c.publish(f"long/{i}/{long}", b"x")
    publish_ok(c, uniq("sync"), qos=1)
    bye(c)
    assert_served(b.port)
    time.sleep(0.5)
    grown = peak.grown_mib()
    print(f"\nbroker RSS grew {grown:.1f} MiB after 3000 distinct 60 KB topics")
    assert grown < 40, f"broker RSS grew {grown:.1f} MiB"
