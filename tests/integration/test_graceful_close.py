"""After the broker ends a connection (DISCONNECT with a reason code, or a 3.1.1 close), a client
that is still sending must read the DISCONNECT and then EOF, never "Connection reset by peer":
the broker half-closes and drops the client's further input for a bounded time before closing
(Eclipse Paho interoperability test_flow_control2). Real sockets, TCP and WebSocket."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from broker.protocol import packets as P
from broker.protocol import reason_codes as rc
from broker.protocol.codec import Decoder, encode
from tests.conftest import BrokerProcess, free_port, wait_port
from tests.mqtt_raw import RawClient
from tests.ws_raw import WSClient

pytestmark = pytest.mark.timeout(90)

RECEIVE_MAXIMUM = 10
TRAILER = 8000  # QoS 0 PUBLISHes (~200 KB) sent in one go right behind the offending packet


def publishes(level: int, qos: int, first_pid: int, n: int) -> bytes:
    return b"".join(encode(P.Publish("flood/t", b"x" * 16, qos, False, False,
                                     (first_pid + i - 1) % 65535 + 1 if qos else None), level)
                    for i in range(n))


class Flooder(threading.Thread):
    """Sends the first chunk, then `more` chunks every millisecond until told to stop (a client
    still pipelining when the broker disconnects it) or until sending fails."""

    def __init__(self, send, first: bytes, more, stop_on_disconnect: bool = True):
        super().__init__(daemon=True)
        self.send, self.first, self.more = send, first, more
        self.stop = threading.Event()
        self.error: OSError | None = None
        self.sent = 0

    def run(self) -> None:
        try:
            self.send(self.first)
            i = 0
            while not self.stop.is_set():
                chunk = self.more(i)
                self.send(chunk)
                self.sent += len(chunk)
                i += 1
                time.sleep(0.001)
        except OSError as exc:
            self.error = exc


def read_to_eof(sock: socket.socket, level: int, on_disconnect, timeout: float = 30.0):
    """Packets the broker sent and how the stream ended: "eof" or the OSError raised."""
    dec, seen = Decoder(level), []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except socket.timeout:
            break
        except OSError as exc:
            return seen, exc
        if not data:
            return seen, "eof"
        pkts, err = dec.feed(data)
        assert err is None, err
        seen += pkts
        if any(p.type == P.DISCONNECT for p in pkts):
            on_disconnect()
    return seen, "timeout"


@pytest.fixture
def limited(make_broker):
    return make_broker({"mqtt.receive_maximum": RECEIVE_MAXIMUM, "persistence.enabled": False})


def test_receive_maximum_disconnect_is_read_while_client_still_sends(limited):
    """QoS 2 PUBLISHes beyond Receive Maximum, sent without reading: DISCONNECT 0x93 then EOF."""
    c = RawClient(limited.port)
    assert c.connect("flooder").properties.get(0x21) == RECEIVE_MAXIMUM
    f = Flooder(c.sock.sendall, publishes(P.MQTT_5, 2, 1, RECEIVE_MAXIMUM + 20)
                + publishes(P.MQTT_5, 0, 0, TRAILER),
                lambda i: publishes(P.MQTT_5, 2, 1000 + 20 * i, 20))
    f.start()
    seen, end = read_to_eof(c.sock, P.MQTT_5, f.stop.set)
    f.stop.set()
    f.join(10)
    c.close()
    disconnects = [p for p in seen if p.type == P.DISCONNECT]
    assert [d.reason_code for d in disconnects] == [rc.RECEIVE_MAXIMUM_EXCEEDED], seen[-3:]
    assert end == "eof", f"the stream ended with {end!r}, not EOF, after {f.sent} bytes flooded"
    assert f.error is None, f"sending after the DISCONNECT failed: {f.error!r}"
    assert limited.alive()


def test_flow_control2_paho_interop(broker):
    """Eclipse Paho client_test5 test_flow_control2: Receive Maximum + 1 QoS 2 PUBLISHes, one
    send each, nothing read; then the client reads until it gets DISCONNECT 0x93."""
    c = RawClient(broker.port)
    ack = c.connect("paho-fc2")
    maximum = ack.properties.get(0x21, 65535)
    for i in range(1, maximum + 2):
        c.send(P.Publish("client_test5/TopicA", b"message %d" % i, 2, False, False, i))
    seen, end = read_to_eof(c.sock, P.MQTT_5, lambda: None)
    c.close()
    assert [p.reason_code for p in seen if p.type == P.DISCONNECT] == [rc.RECEIVE_MAXIMUM_EXCEEDED]
    assert end == "eof", end


def test_311_close_is_graceful_while_client_still_sends(limited):
    """3.1.1 has no server DISCONNECT: a protocol violation (second CONNECT) closes with FIN."""
    c = RawClient(limited.port, level=P.MQTT_311)
    c.connect("flooder311")
    second = encode(P.Connect("again", P.MQTT_311), P.MQTT_311)
    f = Flooder(c.sock.sendall, publishes(P.MQTT_311, 0, 0, 20) + second
                + publishes(P.MQTT_311, 0, 0, TRAILER),
                lambda i: publishes(P.MQTT_311, 0, 0, 20))
    f.start()
    seen, end = read_to_eof(c.sock, P.MQTT_311, f.stop.set)
    f.stop.set()
    f.join(10)
    c.close()
    assert end == "eof", f"the stream ended with {end!r}, not EOF"
    assert f.error is None, f"sending before the EOF was read failed: {f.error!r}"


def test_client_that_never_stops_sending_is_closed_within_the_bound(limited):
    """A client ignoring the DISCONNECT and sending forever is cut off (close_linger_seconds /
    close_linger_bytes); meanwhile other clients are served."""
    c = RawClient(limited.port)
    c.connect("hostile")
    f = Flooder(c.sock.sendall, publishes(P.MQTT_5, 2, 1, RECEIVE_MAXIMUM + 20),
                lambda i: publishes(P.MQTT_5, 2, 1000 + 20 * i, 20))
    f.start()
    other = RawClient(limited.port)
    other.connect("bystander")
    other.subscribe("b/#", qos=1)
    other.publish("b/x", b"hi", qos=1, pid=7)
    got = {other.recv().type, other.recv().type}
    assert got == {P.PUBACK, P.PUBLISH}
    f.join(60)  # generous: the bound is 2 s by default
    assert not f.is_alive(), "the broker kept reading a client that never stops sending"
    assert f.error is not None
    other.send(b"\xc0\x00")  # PINGREQ
    assert other.recv_type(P.PINGRESP)
    other.close()
    c.close()


def test_flood_beyond_linger_bytes_is_cut_off(make_broker):
    b = make_broker({"mqtt.receive_maximum": RECEIVE_MAXIMUM, "mqtt.close_linger_bytes": 1000,
                     "mqtt.close_linger_seconds": 60, "persistence.enabled": False})
    c = RawClient(b.port)
    c.connect("hostile-bytes")
    f = Flooder(c.sock.sendall, publishes(P.MQTT_5, 2, 1, RECEIVE_MAXIMUM + 20),
                lambda i: publishes(P.MQTT_5, 2, 1000 + 20 * i, 20))
    f.start()
    f.join(50)  # well before close_linger_seconds: the byte bound ends it
    assert not f.is_alive() and f.error is not None
    c.close()


# ------------------------------------------------------------ WebSocket
def ws_broker(tmp_path):
    ws_port = free_port()
    cfg = tmp_path / "ws.toml"
    cfg.write_text(f'[[listeners]]\ntype = "ws"\nport = {ws_port}\npath = "/mqtt"\n')
    b = BrokerProcess(tmp_path, {"mqtt.receive_maximum": RECEIVE_MAXIMUM,
                                 "persistence.enabled": False},
                      ["--config", str(cfg)]).start()
    wait_port(ws_port, b.proc)
    b.ws_port = ws_port
    return b


def test_websocket_disconnect_then_close_handshake_while_client_still_sends(tmp_path):
    b = ws_broker(tmp_path)
    try:
        ws = WSClient(b.ws_port)
        ws.connect("ws-flooder")

        def frames(data: bytes) -> None:  # one MQTT packet per binary frame
            dec = Decoder(P.MQTT_5)
            pkts, _ = dec.feed(data)
            for p in pkts:
                ws.send(p)

        f = Flooder(frames, publishes(P.MQTT_5, 2, 1, RECEIVE_MAXIMUM + 20)
                    + publishes(P.MQTT_5, 0, 0, 200),
                    lambda i: publishes(P.MQTT_5, 2, 1000 + 20 * i, 20))
        f.start()
        disconnect = None
        deadline = time.monotonic() + 30
        while disconnect is None and time.monotonic() < deadline:
            pkt = ws.recv(timeout=30)
            if pkt.type == P.DISCONNECT:
                disconnect = pkt
        f.stop.set()
        f.join(10)
        assert f.error is None, f"sending after the DISCONNECT failed: {f.error!r}"
        assert disconnect is not None and disconnect.reason_code == rc.RECEIVE_MAXIMUM_EXCEEDED
        with pytest.raises(ConnectionError):
            ws.recv(timeout=30)
        assert ws.close_code == 1000  # the broker's Close frame, after the DISCONNECT
        ws.send_frame(b"\x03\xe8", opcode=8)  # our Close: the handshake completes
        ws.sock.settimeout(30)
        try:
            rest = ws.sock.recv(65536)
        except OSError as exc:
            rest = exc
        assert rest == b"", f"after the closing handshake: {rest!r}, not EOF"
        ws.close()
    finally:
        b.stop()
