"""A minimal blocking MQTT-over-WebSocket client on a raw socket (RFC 6455 client side).

For tests that need control a library would not give: a frame header announcing a huge
length, a reader that stops reading, an HTTP refusal of the handshake.
"""
from __future__ import annotations

import base64
import os
import socket
import struct
import time

from broker.protocol import packets as P
from broker.protocol.codec import Decoder, encode


class HandshakeRefused(Exception):
    def __init__(self, status: int, head: str):
        super().__init__(f"HTTP {status}: {head!r}")
        self.status = status


def frame_header(length: int, opcode: int = 2, fin: bool = True, mask: bytes = b"\0\0\0\0") -> bytes:
    """A masked client frame header announcing `length` payload bytes."""
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        hdr = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        hdr = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        hdr = struct.pack("!BBQ", first, 0x80 | 127, length)
    return hdr + mask


def mask_payload(payload: bytes, mask: bytes) -> bytes:
    if mask == b"\0\0\0\0":
        return payload
    n = len(payload)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


class WSClient:
    def __init__(self, port: int, path: str = "/mqtt", level: int = P.MQTT_5,
                 timeout: float = 10.0, rcvbuf: int | None = None, headers: dict | None = None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect, so the TCP window stays small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.level = level
        self.timeout = timeout
        self.decoder = Decoder(level)
        self.pending: list = []
        self.buf = b""
        self.close_code: int | None = None
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                           "Sec-WebSocket-Protocol: mqtt\r\n"
                           + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
                           + "\r\n").encode())
        while b"\r\n\r\n" not in self.buf:
            data = self.sock.recv(4096)
            if not data:
                raise ConnectionError(f"closed during the handshake: {self.buf!r}")
            self.buf += data
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        if status != 101:
            raise HandshakeRefused(status, head.decode("latin-1"))

    # ------------------------------------------------------------ sending
    def send_frame(self, payload: bytes, opcode: int = 2) -> None:
        mask = os.urandom(4)
        self.sock.sendall(frame_header(len(payload), opcode, mask=mask) + mask_payload(payload, mask))

    def send(self, pkt) -> None:
        self.send_frame(encode(pkt, self.level))

    def connect(self, client_id: str, **kw) -> P.Connack:
        self.send(P.Connect(client_id, self.level, **kw))
        ack = self.recv()
        assert ack.type == P.CONNACK, ack
        return ack

    # ------------------------------------------------------------ receiving
    def _read(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame received")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError("no frame received") from None
            if not data:
                raise ConnectionError("connection closed by the broker")
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self, timeout: float | None = None) -> tuple[int, bytes]:
        """(opcode, payload) of the next server frame (servers do not mask)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        b0, b1 = self._read(2, deadline)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._read(2, deadline))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._read(8, deadline))[0]
        return b0 & 0x0F, self._read(n, deadline)

    def recv(self, timeout: float | None = None):
        """Next MQTT packet; ConnectionError (close_code set) when the WebSocket closes."""
        while not self.pending:
            op, payload = self.recv_frame(timeout)
            if op == 8:
                self.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                raise ConnectionError(f"WebSocket closed by the broker ({self.close_code})")
            if op != 2:
                continue
            pkts, err = self.decoder.feed(payload)
            if err:
                raise err
            self.pending.extend(pkts)
        return self.pending.pop(0)

    def recv_type(self, ptype: int, timeout: float | None = None):
        pkt = self.recv(timeout)
        assert pkt.type == ptype, f"expected {P.TYPE_NAMES[ptype]}, got {pkt!r}"
        return pkt

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
