"""A minimal blocking MQTT client over a raw socket, built on the project's codec.

For tests that need exact control of the bytes (error cases, flows, properties).
"""
from __future__ import annotations

import socket
import time

from broker.protocol import packets as P
from broker.protocol.codec import Decoder, encode


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", level: int = P.MQTT_5,
                 timeout: float = 5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.level = level
        self.decoder = Decoder(level)
        self.pending: list = []
        self.timeout = timeout

    def send(self, pkt_or_bytes) -> None:
        data = pkt_or_bytes if isinstance(pkt_or_bytes, (bytes, bytearray)) \
            else encode(pkt_or_bytes, self.level)
        self.sock.sendall(data)

    def connect(self, client_id: str = "", clean_start: bool = True, keep_alive: int = 60,
                properties: dict | None = None, will: P.Will | None = None,
                username: str | None = None, password: bytes | None = None) -> P.Connack:
        self.send(P.Connect(client_id, self.level, clean_start=clean_start, keep_alive=keep_alive,
                            properties=properties, will=will, username=username, password=password))
        ack = self.recv()
        assert ack.type == P.CONNACK, ack
        return ack

    def recv(self, timeout: float | None = None):
        """Next packet; raises TimeoutError if none arrives, ConnectionError when closed."""
        if self.pending:
            return self.pending.pop(0)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no packet received")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError("no packet received") from None
            if not data:
                raise ConnectionError("connection closed by the broker")
            pkts, err = self.decoder.feed(data)
            if err:
                raise err
            self.pending.extend(pkts)
            if self.pending:
                return self.pending.pop(0)

    def recv_type(self, ptype: int, timeout: float | None = None):
        pkt = self.recv(timeout)
        assert pkt.type == ptype, f"expected {P.TYPE_NAMES[ptype]}, got {pkt!r}"
        return pkt

    def expect_closed(self, timeout: float = 5.0) -> list:
        """Read until the broker closes the connection; returns the packets seen before."""
        seen = []
        while True:
            try:
                seen.append(self.recv(timeout))
            except ConnectionError:
                return seen
            except OSError:
                return seen

    def nothing(self, timeout: float = 0.3) -> bool:
        try:
            pkt = self.recv(timeout)
        except TimeoutError:
            return True
        self.pending.insert(0, pkt)
        return False

    def subscribe(self, *filters, qos: int = 0, pid: int = 1, properties=None, **opts) -> P.Suback:
        self.send(P.Subscribe(pid, [(f, P.SubscriptionOptions(qos, **opts)) for f in filters],
                              properties))
        return self.recv_type(P.SUBACK)

    def publish(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False,
                pid: int | None = None, properties=None, dup: bool = False):
        self.send(P.Publish(topic, payload, qos, retain, dup, pid if qos else None, properties))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
