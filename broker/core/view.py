"""One narrow, read-only view of the broker for everything that only looks: the dashboard, the
admin API, $SYS and metrics.

They get plain data (records of clients, sessions, subscriptions and retained messages, a dict
of figures), never the core's objects, and nothing here runs per message: figures are computed
when asked. Changing state goes through the core's commands (Broker.kick, Broker.retain, ...)
called by broker/admin/service.py. Sans-I/O, like the rest of the core.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .message import check_new_message

if TYPE_CHECKING:
    from .broker import Broker
    from .connection import Connection
    from .session import Session, Subscription

PROTOCOLS = {3: "3.1", 4: "3.1.1", 5: "5.0"}


@dataclass(frozen=True, slots=True)
class SubscriptionRecord:
    client_id: str
    filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    subscription_id: int | None


@dataclass(frozen=True, slots=True)
class ClientRecord:
    """A connected client (past its CONNECT)."""
    client_id: str
    protocol: str
    username: str | None
    address: str
    connected_since: float     # epoch seconds
    keep_alive: int
    subscriptions: tuple[SubscriptionRecord, ...]  # at most the limit asked
    subscription_count: int
    inflight: int
    queued: int


@dataclass(frozen=True, slots=True)
class SessionRecord:
    client_id: str
    username: str | None
    connected: bool
    expiry_interval: int
    expires_in: float | None   # seconds until an offline session ends (None: connected / never)
    subscription_count: int
    inflight: int
    queued: int


@dataclass(frozen=True, slots=True)
class RetainedRecord:
    topic: str
    payload: bytes
    qos: int
    accepted_at: float | None  # epoch seconds
    expires_in: float | None   # seconds left of its Message Expiry Interval (None: none)


class BrokerView:
    """Read-only questions about one Broker."""

    __slots__ = ("_b",)

    def __init__(self, broker: Broker) -> None:
        self._b = broker

    # ------------------------------------------------------------ figures
    def stats(self) -> dict[str, Any]:
        """Gauges, then the counters (copies), computed now. ``retained`` counts the messages
        clients retained; ``retained_sys`` the broker's own ($-topics, e.g. $SYS)."""
        b = self._b
        sessions = b.sessions.values()
        connected = sum(1 for c in b.connections if c.session is not None)
        sys_retained = self.retained_sys_count()
        v: dict[str, Any] = {"connections": len(b.connections), "clients_connected": connected,
             "sessions": len(b.sessions), "subscriptions": b.router.count,
             "retained": b.retained.count - sys_retained, "retained_sys": sys_retained,
             "queued": sum(len(s.queue) for s in sessions),
             "queued_bytes": b.queues.used, "retained_bytes": b.retained.bytes,
             "inflight": sum(len(s.inflight_out) for s in sessions),
             "received_by_qos": tuple(b.received_by_qos), "sent_by_qos": tuple(b.sent_by_qos)}
        v.update(b.stats)
        return v

    def counters(self) -> dict[str, Any]:
        """The monotonic counters only (cheap: for rates sampled often)."""
        b = self._b
        return {"received_by_qos": tuple(b.received_by_qos), "sent_by_qos": tuple(b.sent_by_qos),
                **b.stats}

    def hook_stats(self) -> dict[str, Any]:
        """The hooks' own figures by section ("sink", "cluster", ...: Broker.hook_stats)."""
        return self._b.hook_stats()

    def retained_sys_count(self) -> int:
        r = self._b.retained
        return sum(len(r.match(name + "/#")) for name in list(r.root.children)
                   if name.startswith("$"))

    # ------------------------------------------------------------ settings and time
    @property
    def maximum_qos(self) -> int:
        """mqtt.maximum_qos: the highest QoS the broker takes."""
        return self._b.cfg.maximum_qos

    @property
    def retain_available(self) -> bool:
        """mqtt.retain_available: whether retained messages are kept."""
        return self._b.cfg.retain_available

    def message_problem(self, topic: str, payload: bytes, props: dict[int, Any] | None) -> str | None:
        """Why a new message could not be published as a client's PUBLISH under this broker's
        [mqtt] limits (message.check_new_message), None when it can."""
        return check_new_message(topic, payload, props, self._b.cfg)

    def clock(self) -> float:
        """The broker's monotonic clock (what expiry times are measured in)."""
        return self._b.clock()

    def wall(self) -> float:
        """The broker's wall clock (epoch seconds: a message's accepted_at)."""
        return self._b.wall()

    # ------------------------------------------------------------ clients and sessions
    def _connected(self) -> Iterator[tuple[Connection, Session]]:
        for conn in list(self._b.connections):
            s = conn.session
            if s is not None and s.connection is conn:  # past CONNECT, still its session's link
                yield conn, s

    def clients(self, query: str = "", limit: int = 500,
                subscriptions: int = 100) -> tuple[list[ClientRecord], int]:
        """(records sorted by client id, how many matched): connected clients whose id contains
        `query` (any case)."""
        q = query.lower()
        found = sorted(((c, s) for c, s in self._connected()
                        if not q or q in c.client_id.lower()), key=lambda cs: cs[0].client_id)
        return [self._client(c, s, subscriptions) for c, s in found[:limit]], len(found)

    def client(self, client_id: str, subscriptions: int = 1000) -> ClientRecord | None:
        s = self._b.sessions.get(client_id)
        if s is None or s.connection is None:
            return None
        return self._client(s.connection, s, subscriptions)

    def _client(self, conn: Connection, s: Session, n_subs: int) -> ClientRecord:
        b = self._b
        subs = tuple(_sub(s.client_id, sub) for sub in list(s.subscriptions.values())[:n_subs])
        return ClientRecord(
            conn.client_id, PROTOCOLS.get(conn.level, str(conn.level)), conn.username, conn.peer,
            round(b.wall() - (b.clock() - conn.connected_at), 3), conn.keep_alive, subs,
            len(s.subscriptions), len(s.inflight_out), len(s.queue))

    def sessions(self, query: str = "", limit: int = 500,
                 connected: bool | None = None) -> tuple[list[SessionRecord], int]:
        """(records sorted by client id, how many matched), connected and offline."""
        b = self._b
        q = query.lower()
        now = b.clock()
        found = sorted((s for s in b.sessions.values()
                        if (not q or q in s.client_id.lower())
                        and (connected is None or (s.connection is not None) == connected)),
                       key=lambda s: s.client_id)
        out = [SessionRecord(s.client_id, s.username, s.connection is not None, s.expiry_interval,
                             None if s.connection is not None or s.expires_at is None
                             else round(max(0.0, s.expires_at - now), 3),
                             len(s.subscriptions), len(s.inflight_out), len(s.queue))
               for s in found[:limit]]
        return out, len(found)

    def subscriptions(self, client_id: str | None = None, contains: str = "",
                      limit: int = 1000) -> tuple[list[SubscriptionRecord], int]:
        """(records, how many matched): every session's subscriptions (one client's with
        client_id), sorted by client id and filter; `contains` keeps filters containing it."""
        sessions = self._b.sessions
        chosen = ([sessions[client_id]] if client_id in sessions else []) if client_id is not None \
            else sorted(sessions.values(), key=lambda s: s.client_id)
        out: list[SubscriptionRecord] = []
        n = 0
        for s in chosen:
            for sub in sorted(s.subscriptions.values(), key=lambda x: x.filter):
                if contains and contains not in sub.filter:
                    continue
                n += 1
                if len(out) < limit:
                    out.append(_sub(s.client_id, sub))
        return out, n

    def client_ids(self) -> list[tuple[str, str | None, str]]:
        """(client id, user name, address) of every connected client."""
        return [(c.client_id, c.username, c.peer) for c, _ in self._connected()]

    # ------------------------------------------------------------ retained
    def retained(self, filt: str = "#", limit: int = 2000) -> tuple[list[RetainedRecord], int]:
        """(records sorted by topic, how many matched) for a topic filter ('#' skips $-topics
        [MQTT-4.7.2-1]; ask '$SYS/#' for those); expired messages are left out."""
        b = self._b
        now = b.clock()
        found = sorted((m for m in b.retained.match(filt)
                        if m.expires_at is None or m.expires_at > now), key=lambda m: m.topic)
        out = [RetainedRecord(m.topic, bytes(m.payload), m.qos,
                              m.accepted_at, None if m.expires_at is None
                              else round(m.expires_at - now, 3))
               for m in found[:limit]]
        return out, len(found)

    def locate(self, client_id: str) -> str | None:
        """The node whose session this client id is, in a cluster (the hook providing
        locate()); None on a single broker or when nobody has it."""
        for locate in self._b.hooks.locate:
            node: str | None = locate(client_id)
            return node
        return None

    def retained_topic(self, topic: str) -> bool:
        return self._b.retained.get(topic) is not None


def _sub(client_id: str, sub: Subscription) -> SubscriptionRecord:
    return SubscriptionRecord(client_id, sub.filter, sub.qos, sub.no_local,
                              sub.retain_as_published, sub.retain_handling, sub.sub_id)
