"""What the server shares with what it starts: the MQTT protocols (TCP, TLS, WebSocket), the
metrics endpoint, $SYS and the dashboard. Plain state, as uvicorn's ServerState: none of them
sees the Server (its listeners and lifecycle, broker/server.py), only this."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from settings import Config

    from ..admin.bans import BanList
    from ..core.broker import Broker
    from .connection_protocol import AckGate


class ServerState:
    __slots__ = ("broker", "config", "loop", "acks", "auth_checks", "bans", "flush",
                 "held_out", "bytes_in", "bytes_out")

    def __init__(self, broker: Broker, config: Config, acks: AckGate, flush: Callable[[], None],
                 bans: BanList, auth_checks: Any = None) -> None:
        self.broker = broker            # the sans-I/O core
        self.config = config
        self.acks = acks                # PUBACK/PUBREC waiting for durability
        self.flush = flush              # write what every connection produced this turn
        self.bans = bans
        self.auth_checks = auth_checks  # password checks off the loop (auth/checks.py), or None
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set at start
        # output of a connection waiting for durability (MQTTProtocol.hold_output), oldest
        # first: [data, ready]; later output of the connection queues behind it
        self.held_out: dict[Any, deque[list]] = {}
        self.bytes_in = 0               # traffic, for metrics, $SYS and the dashboard
        self.bytes_out = 0
