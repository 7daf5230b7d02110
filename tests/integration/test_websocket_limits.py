"""WebSocket clients get the same limits as TCP ones: maximum packet size (from the frame header,
nothing buffered), write backpressure for a stalled reader, max_connections. Real sockets,
broker as a separate process so its RSS can be measured."""
from __future__ import annotations

import os
import socket
import threading
import time
import urllib.request

import pytest

from broker.protocol import packets as P
from broker.protocol.codec import encode
from tests.conftest import BrokerProcess, free_port
from tests.integration.helpers import flood_stalled_reader
from tests.integration.test_scale import rss_kib
from tests.mqtt_raw import RawClient
from tests.ws_raw import HandshakeRefused, WSClient, frame_header

MiB = 1 << 20


def ws_broker(tmp_path, listener: str = "", **settings):
    ws_port, metrics_port = free_port(), free_port()
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f"""
[metrics]
enabled = true
host = "127.0.0.1"
port = {metrics_port}
sys_interval = 0

[[listeners]]
type = "ws"
port = {ws_port}
path = "/mqtt"
{listener}
""")
    b = BrokerProcess(tmp_path, settings={"persistence.enabled": False, **settings},
                      args=["--config", str(cfg)]).start()
    b.ws_port, b.metrics_port = ws_port, metrics_port
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", ws_port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    return b


def metric(b, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=10).read()
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise AssertionError(f"no metric {name}")


@pytest.mark.timeout(180)
def test_huge_websocket_frame_is_refused_from_its_header(tmp_path):
    """maximum_packet_size 64 KiB: a frame announcing 150 MiB is refused (close 1009) when its
    header arrives; streaming the payload anyway does not grow the broker's memory."""
    b = ws_broker(tmp_path, **{"mqtt.maximum_packet_size": 65536})
    try:
        c = WSClient(b.ws_port, timeout=30)
        assert c.connect("big").reason_code == 0
        base = rss_kib(b.proc.pid)
        mask = os.urandom(4)
        c.sock.sendall(frame_header(150 * MiB, mask=mask))
        chunk = os.urandom(MiB)
        sent = 0
        try:
            while sent < 150 * MiB:
                c.sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the broker closed the connection first
        grown_mib = (rss_kib(b.proc.pid) - base) / 1024
        with pytest.raises(ConnectionError):
            while True:
                c.recv(timeout=30)
        print(f"\n150 MiB frame: {sent / MiB:.0f} MiB streamed, broker RSS grew {grown_mib:.1f} MiB, "
              f"close code {c.close_code}")
        assert c.close_code == 1009   # Message Too Big (RFC 6455 7.4.1)
        assert grown_mib < 8
        c.close()
        # the broker still serves WebSocket clients, and packets within the limit pass
        ok = WSClient(b.ws_port)
        assert ok.connect("ok").reason_code == 0
        ok.send(P.Subscribe(1, [("big/t", P.SubscriptionOptions(0))]))
        ok.recv_type(P.SUBACK)
        ok.send(P.Publish("big/t", b"y" * 60000))
        assert ok.recv_type(P.PUBLISH).payload == b"y" * 60000
        ok.close()
        assert b.alive()
    finally:
        b.stop()


@pytest.mark.timeout(240)
def test_stalled_websocket_reader_cannot_grow_broker_memory(tmp_path):
    """As tests/integration/test_scale.py does for TCP: a WebSocket subscriber that stops
    reading gets QoS 0 dropped once its buffer passes the high-water mark."""
    b = ws_broker(tmp_path)
    try:
        stalled = WSClient(b.ws_port, rcvbuf=4096)
        assert stalled.connect("stalled").reason_code == 0
        stalled.send(P.Subscribe(1, [("flood/#", P.SubscriptionOptions(0))]))
        stalled.recv_type(P.SUBACK)            # and never reads again
        base = rss_kib(b.proc.pid)
        pub = flood_stalled_reader(b.port)  # ~300 MB offered to a reader that reads nothing
        grown_mib = (rss_kib(b.proc.pid) - base) / 1024
        dropped = metric(b, 'mqtt_messages_dropped_total{reason="slow_consumer"}')
        print(f"\nbroker RSS grew {grown_mib:.1f} MiB while ~300 MiB were offered to a stalled "
              f"WebSocket reader; {dropped:.0f} messages dropped for it")
        assert grown_mib < 50
        assert dropped > 100_000
        assert b.alive()
        pub.close()
        stalled.close()
    finally:
        b.stop()


@pytest.mark.timeout(120)
def test_max_connections_counts_websocket_clients(tmp_path):
    b = ws_broker(tmp_path, **{"mqtt.max_connections": 2})
    try:
        tcp = RawClient(b.port)
        assert tcp.connect("tcp1").reason_code == 0
        ws = WSClient(b.ws_port)
        assert ws.connect("ws1").reason_code == 0
        with pytest.raises(HandshakeRefused) as refused:
            WSClient(b.ws_port)
        assert refused.value.status == 503
        extra = RawClient(b.port)               # TCP counts the WebSocket client too
        with pytest.raises((ConnectionError, OSError)):
            extra.connect("tcp2")
        extra.close()
        tcp.close()                              # a slot frees up: WebSocket clients get it
        deadline = time.monotonic() + 20
        while True:
            try:
                again = WSClient(b.ws_port)
                break
            except HandshakeRefused:
                assert time.monotonic() < deadline, "the freed slot was not given to a WS client"
                time.sleep(0.1)
        assert again.connect("ws2").reason_code == 0
        again.close()
        ws.close()
    finally:
        b.stop()


@pytest.mark.timeout(180)
def test_websocket_reader_that_catches_up_gets_messages_again(tmp_path):
    """The other half of backpressure: once the stalled reader drains its buffer the broker
    resumes writing to it (resume_writing), so new messages reach it again."""
    b = ws_broker(tmp_path)
    try:
        slow = WSClient(b.ws_port, rcvbuf=4096, timeout=60)
        assert slow.connect("slow").reason_code == 0
        slow.send(P.Subscribe(1, [("flood/#", P.SubscriptionOptions(0))]))
        slow.recv_type(P.SUBACK)
        pub = RawClient(b.port)
        pub.connect("pub")
        chunk = encode(P.Publish("flood/x", b"x" * 1024, 0, False), 5) * 1000
        for _ in range(20):  # ~20 MB while the reader reads nothing: the broker pauses it
            pub.send(chunk)
        deadline = time.monotonic() + 20
        while metric(b, 'mqtt_messages_dropped_total{reason="slow_consumer"}') == 0:
            assert time.monotonic() < deadline, "the broker never paused the stalled reader"
            time.sleep(0.2)
        seen = threading.Event()

        def read():
            while not seen.is_set():
                try:
                    pkt = slow.recv(timeout=60)
                except (TimeoutError, ConnectionError, OSError):
                    return
                if pkt.type == P.PUBLISH and pkt.topic == "flood/marker":
                    seen.set()
        t = threading.Thread(target=read, daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        while not seen.is_set():
            assert time.monotonic() < deadline, "no message reached the reader after it caught up"
            pub.publish("flood/marker", b"again")
            seen.wait(0.2)
        t.join(10)
        pub.close()
        slow.close()
    finally:
        b.stop()


def test_websocket_handshake_from_another_sites_page_is_refused(tmp_path):
    """A browser's handshake whose Origin is not the listener's own host:port nor in
    allowed_origins gets HTTP 403 before the upgrade (a page on another site cannot use the
    visitor's browser as an anonymous loopback client); no Origin (not a browser), the same
    origin and a listed one connect."""
    b = ws_broker(tmp_path, listener='allowed_origins = ["https://app.example.com"]')
    try:
        for origin in ("http://evil.example", f"http://127.0.0.1:{b.ws_port + 1}",
                       "http://127.0.0.1", "null", "https://app.example.com.evil.example"):
            with pytest.raises(HandshakeRefused) as refused:
                WSClient(b.ws_port, headers={"Origin": origin})
            assert refused.value.status == 403, origin
        for i, headers in enumerate(({}, {"Origin": f"http://127.0.0.1:{b.ws_port}"},
                                     {"Origin": "https://app.example.com"})):
            ws = WSClient(b.ws_port, headers=headers)
            assert ws.connect(f"ok{i}").reason_code == 0
            ws.close()
        assert "allowed_origins" in b.logs()
    finally:
        b.stop()
