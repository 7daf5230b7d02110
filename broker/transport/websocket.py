"""MQTT over WebSockets (MQTT 5.0 section 6): binary frames, the "mqtt" subprotocol.

Uses the `websockets` library; each WebSocket connection is served by the same MQTTProtocol
as a TCP socket (connection_protocol.py), through a transport adapter, so the limits are the same:
`max_connections`, the write-buffer high-water mark with pause_writing/resume_writing (a
stalled reader gets QoS 0 dropped and QoS 1/2 queued in its bounded session, as on TCP),
and inbound size: a WebSocket message larger than `maximum_packet_size` (+ WS_FRAME_SLACK for
small packets batched behind a maximal one) is refused from its frame header, before any of
it is buffered (close code 1009, RFC 6455 section 7.4.1).

A browser's handshake carries Origin: one that is not the listener's own host:port (the Host
header) nor in the listener's ``allowed_origins`` is refused with HTTP 403 before the upgrade, so
a page on another site cannot use a visitor's browser as an MQTT client (as the dashboard checks
Origin: broker/auth/origin.py). Handshakes without Origin (devices, scripts) are not browsers'.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import Server as WSServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from ..auth.origin import origin_allowed
from .connection_protocol import MQTTProtocol

if TYPE_CHECKING:
    import ssl

    from settings import ListenerConfig

    from .state import ServerState

log = logging.getLogger(__name__)

WS_FRAME_SLACK = 65536   # bytes allowed in one WebSocket message beyond maximum_packet_size
CLOSE_TIMEOUT = 10.0     # seconds a close waits for buffered output before the socket is aborted


class WSTransport:
    """What MQTTProtocol and the server's flush need from a transport: write(), close(),
    extra info, and asyncio's flow control: `protocol.pause_writing()` when the bytes buffered
    for the client pass the high-water mark, `protocol.resume_writing()` once they drained
    below the low-water mark."""

    def __init__(self, ws: ServerConnection, protocol: MQTTProtocol, loop: asyncio.AbstractEventLoop) -> None:
        self.ws = ws
        self.protocol = protocol
        self.loop = loop
        self.pending: deque = deque()
        self.size = 0            # bytes in `pending` and in the frame being sent
        self.high = 65536
        self.low = 16384
        self.paused = False
        self.reading = asyncio.Event()  # cleared by pause_reading(): the handler stops reading
        self.reading.set()
        self.wake = asyncio.Event()
        self.closing = False
        self.task = loop.create_task(self._writer())

    # ------------------------------------------------------------ asyncio.WriteTransport-like
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = 65536 if high is None else high
        self.low = self.high // 4 if low is None else low

    def get_write_buffer_size(self) -> int:
        t = self.ws.transport
        return self.size + (t.get_write_buffer_size() if t is not None else 0)

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        self.pending.append(bytes(data))
        self.size += len(data)
        self.wake.set()
        if not self.paused and self.get_write_buffer_size() > self.high:
            self.paused = True
            self.protocol.pause_writing()

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.wake.set()
        self.reading.set()  # the handler ends its read loop
        # a client that reads nothing keeps the writer waiting: do not wait for it forever
        self.loop.call_later(CLOSE_TIMEOUT, self._abort_if_stuck)

    def pause_reading(self) -> None:
        self.reading.clear()  # websockets then stops reading the socket (its max_queue)

    def resume_reading(self) -> None:
        self.reading.set()

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return False  # close() ends the stream properly: the Close frame after the output

    def get_protocol(self) -> MQTTProtocol:
        return self.protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        t = self.ws.transport
        return t.get_extra_info(name, default) if t is not None else default

    # ------------------------------------------------------------ the writer task
    def _abort_if_stuck(self) -> None:
        if not self.task.done() and self.ws.transport is not None:
            self.ws.transport.abort()

    async def _writer(self) -> None:
        try:
            while True:
                await self.wake.wait()
                self.wake.clear()
                while self.pending:
                    data = b"".join(self.pending)
                    self.pending.clear()
                    # one binary frame per flush; returns once the socket buffer is below
                    # websockets' write_limit (32 KiB, under our low-water mark), so a client
                    # that reads again always gets resume_writing
                    await self.ws.send(data)
                    self.size -= len(data)
                    if self.paused and self.get_write_buffer_size() <= self.low:
                        self.paused = False
                        self.protocol.resume_writing()
                if self.closing:
                    await self.ws.close()
                    return
        except ConnectionClosed:
            return
        finally:
            self.reading.set()  # a handler waiting to read again sees the end


async def discard_input(ws: ServerConnection, seconds: float, max_bytes: int) -> None:
    """After our last output (a DISCONNECT) and Close frame: read and drop what the client still
    sends until it completes the closing handshake, for at most `seconds` and `max_bytes`, then
    abort. Unread input would stall websockets' reading (and so the handshake), and closing a
    socket with unread input resets it under the client before it reads the DISCONNECT."""
    n = 0
    try:
        async with asyncio.timeout(seconds):
            async for message in ws:
                n += len(message)
                if n > max_bytes:
                    break
            else:
                return
    except (TimeoutError, ConnectionClosed):
        pass
    if ws.transport is not None:
        ws.transport.abort()


async def start_listener(server: ServerState, listener: ListenerConfig,
                         ssl_context: ssl.SSLContext | None = None) -> WSServer:
    """Start a ws:// (or wss:// with ssl_context) listener; returns the websockets Server."""
    path = listener.path
    loop = asyncio.get_running_loop()
    cfg = server.config.mqtt
    connections = server.broker.connections

    def process_request(ws: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?")[0] != path:
            return Response(404, "Not Found", Headers(), f"MQTT is served on {path}\n".encode())
        origins = request.headers.get_all("Origin")
        hosts = request.headers.get_all("Host")
        if len(origins) > 1 or len(hosts) > 1 or not origin_allowed(
                origins[0] if origins else None, hosts[0] if hosts else None,
                listener.allowed_origins):
            # a page on another site: the browser would connect with the user's network position
            # (a loopback client is anonymous) and read or publish; refused before the upgrade
            server.broker.client_log.line(log, logging.WARNING, None, "refusing WebSocket client "
                                          "%s: Origin %r is not this listener's (Host %r) nor in "
                                          "its allowed_origins", ws.remote_address,
                                          ", ".join(origins)[:200], ", ".join(hosts)[:200])
            return Response(403, "Forbidden", Headers(),
                            b"this web page's Origin may not use this MQTT listener: list it in "
                            b"the listener's allowed_origins\n")
        if cfg.max_connections and len(connections) >= cfg.max_connections:
            server.broker.client_log.line(log, logging.WARNING, None, "refusing WebSocket client "
                                          "%s: max_connections (%d) reached", ws.remote_address,
                                          cfg.max_connections)
            return Response(503, "Service Unavailable", Headers(),
                            b"too many connections, try again later\n")
        return None

    async def handler(ws: ServerConnection) -> None:
        proto = MQTTProtocol(server, listener)
        transport = WSTransport(ws, proto, loop)
        # as for TCP: max_connections (handshakes racing past process_request), and the TLS
        # client identity on wss listeners with use_identity_as_username (conn.identity)
        proto.connection_made(transport)
        conn = proto.conn
        conn.peer = "ws:" + conn.peer
        try:
            if not transport.closing:
                async for message in ws:
                    if isinstance(message, str):  # [MQTT-6.0.0-1]: binary frames only
                        conn.note(logging.INFO, "text frame from %s: closing", conn.peer)
                        break
                    proto.data_received(message)  # [MQTT-6.0.0-2] frames need not align with packets
                    if conn.close_requested:
                        break
                    if not transport.reading.is_set():  # inbound backpressure (pause_reading)
                        await transport.reading.wait()
                        if conn.close_requested or transport.closing or transport.task.done():
                            break
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == 1009:  # websockets refused the frame
                conn.note(logging.INFO, "closing %s: WebSocket message larger than %d bytes "
                          "(maximum packet size %d)", conn.peer,
                          cfg.maximum_packet_size + WS_FRAME_SLACK, cfg.maximum_packet_size)
        finally:
            server.flush()         # what the connection wrote before it ended goes out first
            transport.close()
            proto.connection_lost(None)
            await discard_input(ws, cfg.close_linger_seconds, cfg.close_linger_bytes)
            try:
                await asyncio.wait_for(transport.task, CLOSE_TIMEOUT + 1)
            except (asyncio.TimeoutError, Exception):
                pass

    return await serve(handler, listener.host, listener.port,
                       # [MQTT-6.0.0-3] [MQTT-6.0.0-4]: "mqtt" offered and selected, else HTTP 400
                       subprotocols=[Subprotocol("mqtt")], process_request=process_request, ssl=ssl_context,
                       compression=None, ping_interval=None,
                       # refused from the frame header, never buffered (same bound as TCP's
                       # decoder: [MQTT-3.2.2-15] maximum packet size)
                       max_size=cfg.maximum_packet_size + WS_FRAME_SLACK)
