"""MQTT over WebSockets (MQTT 5.0 section 6): binary frames, the "mqtt" subprotocol.

Uses the `websockets` library; each WebSocket connection feeds the same sans-I/O
Connection as TCP, through a small transport adapter.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque

from websockets.asyncio.server import serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Response

from ..core.connection import Connection
from . import tls

log = logging.getLogger("broker.websocket")


class WSTransport:
    """What the server's flush needs from a transport: write(), close(), buffer size."""

    def __init__(self, ws, loop):
        self.ws = ws
        self.pending: deque = deque()
        self.size = 0
        self.wake = asyncio.Event()
        self.closing = False
        self.task = loop.create_task(self._writer())

    def write(self, data) -> None:
        self.pending.append(bytes(data))
        self.size += len(data)
        self.wake.set()

    def close(self) -> None:
        self.closing = True
        self.wake.set()

    def get_write_buffer_size(self) -> int:
        return self.size

    def get_extra_info(self, name, default=None):
        return self.ws.transport.get_extra_info(name, default) if self.ws.transport else default

    async def _writer(self) -> None:
        try:
            while True:
                await self.wake.wait()
                self.wake.clear()
                while self.pending:
                    data = b"".join(self.pending)
                    self.pending.clear()
                    self.size = 0
                    await self.ws.send(data)  # one binary frame per flush
                if self.closing:
                    await self.ws.close()
                    return
        except ConnectionClosed:
            return


async def start_listener(server, listener: dict, ssl_context=None):
    """Start a ws:// (or wss:// with ssl_context) listener; returns the websockets Server."""
    path = listener.get("path", "/mqtt")
    loop = asyncio.get_running_loop()
    broker = server.broker

    def process_request(conn, request):
        if request.path.split("?")[0] != path:
            return Response(404, "Not Found", Headers(), f"MQTT is served on {path}\n".encode())
        return None

    async def handler(ws):
        peer = ws.remote_address
        conn = Connection(broker, f"ws:{peer[0]}:{peer[1]}" if peer else "ws:?")
        transport = WSTransport(ws, loop)
        conn.transport = transport
        conn.identity = tls.listener_identity(listener, transport.get_extra_info("ssl_object"))
        try:
            async for message in ws:
                if isinstance(message, str):  # [MQTT-6.0.0-1]: binary frames only
                    log.info("text frame from %s: closing", conn.peer)
                    break
                conn.data_received(message)
                if conn.held_acks:
                    server.hold_acks(conn)
                if conn.close_requested:
                    break
        except ConnectionClosed:
            pass
        finally:
            conn.connection_lost()
            server.flush()
            transport.close()
            try:
                await asyncio.wait_for(transport.task, 5)
            except (asyncio.TimeoutError, Exception):
                pass

    return await serve(handler, listener.get("host", "0.0.0.0"), listener.get("port", 9001),
                       subprotocols=["mqtt"], process_request=process_request, ssl=ssl_context,
                       compression=None, max_size=None, ping_interval=None)
