"""Small helpers shared by the broker-core integration tests (real sockets, RawClient)."""
from __future__ import annotations

import socket
import time
import uuid

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol.codec import encode
from tests.mqtt_raw import RawClient


def uniq(prefix: str = "t") -> str:
    """A topic (or client id) no other test uses, so tests can share one broker."""
    return f"{prefix}/{uuid.uuid4().hex[:12]}"


def cid(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def connect(port: int, client_id: str | None = None, level: int = P.MQTT_5,
            expect_present: bool | None = None, **kw) -> RawClient:
    """A connected RawClient; asserts the CONNACK accepted the connection."""
    c = RawClient(port, level=level)
    ack = c.connect(cid() if client_id is None else client_id, **kw)
    assert ack.reason_code == 0, f"CONNACK refused: {ack!r}"
    if expect_present is not None:
        assert ack.session_present is expect_present, ack
    c.connack = ack
    return c


def read_until_closed(c: RawClient, timeout: float = 5.0) -> list:
    """Every packet the broker sends until it closes the connection.

    Fails (rather than returning quietly) when the connection is still open after `timeout`.
    """
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"the broker did not close the connection; saw {seen!r}")
        try:
            seen.append(c.recv(left))
        except TimeoutError:
            raise AssertionError(f"the broker did not close the connection; saw {seen!r}") from None
        except (ConnectionError, OSError):
            return seen


def expect_disconnect(c: RawClient, code: int, timeout: float = 5.0) -> list:
    """The broker sends DISCONNECT with `code` and closes the connection."""
    seen = read_until_closed(c, timeout)
    discs = [p for p in seen if p.type == P.DISCONNECT]
    assert discs, f"connection closed without a DISCONNECT; saw {seen!r}"
    assert discs[-1].reason_code == code, \
        f"DISCONNECT reason 0x{discs[-1].reason_code:02X}, expected 0x{code:02X}: {discs[-1]!r}"
    assert seen[-1] is discs[-1], f"packets after DISCONNECT: {seen!r}"
    return seen


def bye(*clients: RawClient) -> None:
    """Normal DISCONNECT (0x00) and close."""
    for c in clients:
        try:
            c.send(P.Disconnect())
        except OSError:
            pass
        c.close()


def ack(c: RawClient, pub: P.Publish) -> None:
    """Complete the flow of a PUBLISH received from the broker (PUBACK, or PUBREC+PUBCOMP)."""
    if pub.qos == 1:
        c.send(P.Ack(P.PUBACK, pub.packet_id))
    elif pub.qos == 2:
        c.send(P.Ack(P.PUBREC, pub.packet_id))
        other = []  # packets that arrive before the PUBREL stay queued, in order
        while True:
            rel = c.recv()
            if rel.type == P.PUBREL:
                break
            other.append(rel)
        c.pending[:0] = other
        assert rel.packet_id == pub.packet_id
        c.send(P.Ack(P.PUBCOMP, pub.packet_id))


def publish_ok(c: RawClient, topic: str, payload: bytes = b"x", qos: int = 0, pid: int = 1,
               expect_code: int | None = None, **kw):
    """Publish and complete the inbound flow; returns the PUBACK/PUBREC (None for QoS 0)."""
    c.publish(topic, payload, qos=qos, pid=pid, **kw)
    if qos == 0:
        return None
    a = recv_skipping(c, P.PUBACK if qos == 1 else P.PUBREC)
    assert a.packet_id == pid
    if expect_code is not None:
        assert a.reason_code == expect_code, f"reason 0x{a.reason_code:02X}, expected 0x{expect_code:02X}"
    if qos == 2:
        c.send(P.Ack(P.PUBREL, pid))
        comp = recv_skipping(c, P.PUBCOMP)
        assert comp.packet_id == pid and comp.reason_code == 0
    return a


def recv_skipping(c: RawClient, ptype: int):
    """The next packet of `ptype`; PUBLISHes arriving first (the client's own subscription)
    stay queued in order for later reads."""
    other = []
    while True:
        pkt = c.recv()
        if pkt.type == ptype:
            c.pending[:0] = other
            return pkt
        assert pkt.type == P.PUBLISH, f"expected {P.TYPE_NAMES[ptype]}, got {pkt!r}"
        other.append(pkt)


def recv_publish(c: RawClient, timeout: float = 5.0) -> P.Publish:
    return c.recv_type(P.PUBLISH, timeout)


def props(pkt) -> dict:
    return pkt.properties or {}


def assert_served(port: int) -> None:
    """The broker still serves other clients: a fresh subscriber gets a fresh publisher's message."""
    topic = uniq("alive")
    sub = connect(port)
    assert sub.subscribe(topic, qos=1).reason_codes == [1]
    pub = connect(port)
    publish_ok(pub, topic, b"still-alive", qos=1, expect_code=0)
    m = recv_publish(sub)
    assert (m.topic, m.payload, m.qos) == (topic, b"still-alive", 1)
    ack(sub, m)
    bye(sub, pub)


def raw_publish(topic: str, payload: bytes = b"", qos: int = 0, pid: int | None = None,
                properties: dict | None = None, first: int | None = None, level: int = P.MQTT_5) -> bytes:
    """Encoded PUBLISH; `first` overrides the fixed-header byte (to forge flags)."""
    data = bytearray(encode(P.Publish(topic, payload, qos, False, False, pid if qos else None,
                                      properties), level))
    if first is not None:
        data[0] = first
    return bytes(data)


def raw_connect_bytes(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes on a fresh socket; return everything received until the broker closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the broker did not close the connection; got {out!r}")
            s.settimeout(left)
            try:
                chunk = s.recv(4096)
            except socket.timeout:
                raise AssertionError(f"the broker did not close the connection; got {out!r}") from None
            except ConnectionError:
                return out
            if not chunk:
                return out
            out += chunk
    finally:
        s.close()


__all__ = ["P", "PR", "uniq", "cid", "connect", "read_until_closed", "expect_disconnect", "bye",
           "ack", "publish_ok", "recv_publish", "props", "assert_served", "raw_publish",
           "raw_connect_bytes", "RawClient"]


def flood_stalled_reader(port: int, mib: int = 300) -> socket.socket:
    """Offer ~`mib` MiB of QoS 0 on flood/x (for a subscriber that stopped reading), check that
    another client on the same broker is still served; return the publisher's socket."""
    pub = socket.create_connection(("127.0.0.1", port))
    pub.sendall(encode(P.Connect("flooder", 4), 4))
    pub.recv(4)
    chunk = encode(P.Publish("flood/x", b"x" * 1024), 4) * 1000  # ~1 MB per send
    for _ in range(mib):
        pub.sendall(chunk)
    other = RawClient(port)
    other.connect("other")
    other.subscribe("ok")
    other.publish("ok", b"served")
    assert other.recv_type(P.PUBLISH, timeout=60).payload == b"served"
    other.close()
    return pub
