"""The broker core: sessions, routing of accepted messages, wills, expiry, timers.

Sans-I/O. The asyncio server (broker/server.py) creates a Connection per socket,
feeds it bytes, flushes `dirty` connections once per event-loop turn and calls
`tick()` about once a second. Persistence, the sink and auth are hooks (core/hooks.py):
the broker runs without any of them, and imports none of them.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from mqtt_topics import parse_shared, valid_topic_filter
from settings import MQTTConfig

from ..protocol import packets as P
from ..protocol import properties as PR
from ..protocol.codec import encode
from .clientlog import ClientLog, shown
from .hooks import ALLOW_ALL, Hooks  # ALLOW_ALL: the checks without an auth hook
from .message import Message
from .retain import RetainedStore
from .router import Router
from .session import NEVER, Inflight, QueueEntry, Queues, Session, Subscriber, Subscription, entry_size
from .timeouts import ConnectionTable

if TYPE_CHECKING:
    from .connection import Connection
    from .hooks import Persistence
    from .router import GroupKey

log = logging.getLogger(__name__)


def server_capabilities(cfg: MQTTConfig) -> dict[int, int]:
    """The CONNACK properties that follow from the configuration alone, in the order sent:
    limits below the protocol's defaults and features not available [MQTT-3.2.2-9] .. (3.2.2.3)."""
    caps: dict[int, int] = {}
    if cfg.receive_maximum != 65535:
        caps[PR.RECEIVE_MAXIMUM] = cfg.receive_maximum
    if cfg.maximum_qos < 2:
        caps[PR.MAXIMUM_QOS] = cfg.maximum_qos
    if not cfg.retain_available:
        caps[PR.RETAIN_AVAILABLE] = 0
    if cfg.maximum_packet_size < 268435455:
        caps[PR.MAXIMUM_PACKET_SIZE] = cfg.maximum_packet_size
    if cfg.topic_alias_maximum:
        caps[PR.TOPIC_ALIAS_MAXIMUM] = cfg.topic_alias_maximum
    if not cfg.wildcard_subscription_available:
        caps[PR.WILDCARD_SUBSCRIPTION_AVAILABLE] = 0
    if not cfg.subscription_identifiers_available:
        caps[PR.SUBSCRIPTION_IDENTIFIER_AVAILABLE] = 0
    if not cfg.shared_subscription_available:
        caps[PR.SHARED_SUBSCRIPTION_AVAILABLE] = 0
    if cfg.server_keep_alive:  # [MQTT-3.2.2-21]
        caps[PR.SERVER_KEEP_ALIVE] = cfg.server_keep_alive
    return caps


class Broker:
    def __init__(self, mqtt: MQTTConfig | None = None, sink: Any = None, auth: Any = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 store: Any = None, hooks: Sequence[Any] = ()) -> None:
        """sink, auth, store: hooks (or objects whose hook() makes one, as sink.forward.service.Sink),
        attached like those of `hooks`, in the order store, sink, auth, hooks."""
        self.cfg = mqtt or MQTTConfig()
        self.hooks = Hooks()
        # derived from the hooks (_hooks_changed): the checks (ALLOW_ALL without an auth hook);
        # the persistence events persistent sessions call (session.store), or None; the hooks
        # accepted messages are offered to (connection.py calls offer() only when there are some)
        self.auth: Any = ALLOW_ALL  # `auth is ALLOW_ALL`: everything allowed, its checks are skipped
        self.store: Persistence | None = None
        self.accepting: tuple[Callable[..., Any], ...] = ()
        # the hook that routes accepted messages instead of this broker (the cluster), and the
        # one that admits CONNECTs (core/hooks.py ROUTING); None without a cluster
        self.router_hook: Callable[..., Any] | None = None
        self.admit: Callable[..., Any] | None = None
        self.install: Callable[..., Any] | None = None  # the routing hook's say on when a new subscription starts
        # setting name -> subscriptions read back (restore_subscription) it did not let in
        self.restore_refused: dict[str, int] = {}
        # the hook that takes SUBSCRIBEs to "$replay/..." filters (core/hooks.py REPLAY), or None
        self.replay_hook: Callable[..., Any] | None = None
        # some hook provides barrier(): PUBACK/PUBREC are held until it says the message is
        # durable (AcksHeld events; the ack gate decides, core/durability.py)
        self.durable = False
        self.clock = clock
        self.wall = wall
        self.sessions: dict[str, Session] = {}
        self.router = Router(self.cfg.match_cache_entries, self.cfg.match_cache_bytes)
        self.retained = RetainedStore(entry_size)  # bytes: payload + topic, as queued entries
        # the queue byte bounds and the ACL generation every session shares (session.py)
        self.queues = Queues(self.cfg.max_queued_bytes, self.cfg.max_queued_bytes_total)
        # what one inbound packet may carry besides its size (the codec checks it while decoding)
        self.limits = PR.Limits(self.cfg.max_filters_per_subscribe, self.cfg.max_user_properties,
                                self.cfg.max_user_property_bytes)
        # log lines about clients: escaped, shortened, rate-limited (clientlog.py)
        self.client_log = ClientLog(clock, self.cfg.client_log_lines_per_second)
        # anonymous clients (no user name) from other machines than this one: set by the server
        # from auth.allow_anonymous (None there: only from loopback addresses); the core alone
        # (tests, embedding) lets everyone in, as without an auth hook
        self.anonymous_remote = True
        # open connections, filed by their next deadline (connect timeout, keep alive): tick()
        # looks only at those due (core/timeouts.py)
        self.connections = ConnectionTable()
        self.dirty: list[Connection] = []  # connections with bytes to write
        # ... whose output this turn holds a persistent session's new QoS 2 PUBLISH: the caller
        # writes it once the hooks providing barrier() hold its packet id (Session._send)
        self.durable_out: set[Connection] = set()
        # set by the server: called when dirty becomes non-empty
        self.schedule_flush: Callable[[], Any] | None = None
        # set by the server when password checks are slow: a CONNECT with a user name then
        # returns an AuthRequested event (core/events.py); the caller runs auth.authenticate
        # off the event loop and calls conn.auth_done(...)
        self.defer_auth = False
        self.max_deferred_bytes = 1 << 20  # bytes a client may send while its check runs
        self.delayed_wills: dict[str, Session] = {}
        self.stats = {"dropped_queue_full": 0, "dropped_expired": 0, "dropped_too_large": 0,
                      "dropped_slow_consumer": 0, "dropped_not_authorized": 0,
                      "dropped_topic_limit": 0, "sink_refused": 0, "connections_total": 0,
                      "dropped_retained_replay": 0, "refused_max_sessions": 0,
                      "dropped_queues_total": 0, "dropped_retained_quota": 0}
        # the CONNACK properties every v5 connection gets (3.2.2.3), and the successful CONNACKs
        # with only these, by (protocol level, session present): at most 6, encoded once
        self.capabilities = server_capabilities(self.cfg)
        # a read of one packet up to this size is decoded whatever the connection's state (within
        # both inbound limits), without a per-connection Decoder (connection.py feed)
        self.small_packet_limit = min(self.cfg.maximum_packet_size, self.cfg.max_connect_packet_size)
        self.connacks: dict[tuple[int, bool], bytes] = {}
        self.received_by_qos = [0, 0, 0]
        self.sent_by_qos = [0, 0, 0]
        self._id_counter = 0
        self._sessions_warned_at: float | None = None  # last max_sessions WARNING (one a minute)
        # banned client ids, user names, addresses (broker/admin/bans.py): a CONNECT is refused
        # with 0x8A when bans(client_id, username, peer) names a reason; None: no ban list
        self.bans: Callable[[str, str | None, str], str | None] | None = None
        for hook in (store, sink, auth, *hooks):
            if hook is not None:
                self.add_hook(_as_hook(hook))

    # ------------------------------------------------------------ hooks
    def add_hook(self, hook: Any) -> None:
        """Attach a hook (core/hooks.py): it receives the events in its `provides`."""
        self.hooks.add(hook)
        self._hooks_changed()
        attach = getattr(hook, "attach", None)
        if attach is not None:
            attach(self)

    def remove_hook(self, hook: Any) -> None:
        self.hooks.remove(hook)
        self._hooks_changed()

    def has_hook(self, hook: Any) -> bool:
        """Whether `hook` is attached to this broker."""
        return hook in self.hooks

    def _hooks_changed(self) -> None:
        h = self.hooks
        self.auth = h.auth
        self.store = h.persistence
        self.accepting = h.on_message_accepted
        self.durable = bool(h.barrier)
        self.router_hook = h.route[0] if h.route else None
        self.admit = h.admit[0] if h.admit else None
        self.install = h.install[0] if h.install else None
        self.replay_hook = h.replay[0] if h.replay else None
        self.queues.allow_read = None if self.auth is ALLOW_ALL else self.auth.allow_read
        for s in self.sessions.values():  # persistent sessions report to the current hooks
            s.store = self.store if s.expiry_interval else None

    # ------------------------------------------------------------ sessions
    def new_client_id(self) -> str:
        self._id_counter += 1
        return f"auto-{int(self.wall() * 1000):x}-{self._id_counter}"

    def granted_expiry(self, requested: int, v5: bool = True) -> int:
        """The Session Expiry Interval the broker keeps a session for: what a v5 client asks, at
        most mqtt.session_expiry_maximum (3.2.2.3.2: the CONNACK then says the value used). A 3.1.x
        clean session 0 has no interval in the protocol: mqtt.persistent_client_expiration, under
        the same maximum. Also applied to a v5 DISCONNECT's interval and to restored sessions."""
        cfg = self.cfg
        if not v5:
            requested = cfg.persistent_client_expiration
        return min(requested, cfg.session_expiry_maximum)

    def session_limit_reached(self, client_id: str) -> bool:
        """mqtt.max_sessions: a CONNECT creating one more session is refused once the broker holds
        that many (connected and offline); resuming or taking over a session is not."""
        limit = self.cfg.max_sessions
        if not limit or len(self.sessions) < limit:
            return False
        self.stats["refused_max_sessions"] += 1
        now = self.clock()
        if self._sessions_warned_at is None or now - self._sessions_warned_at >= 60:
            self._sessions_warned_at = now
            log.warning("refused a new session for client '%s': the broker holds %d sessions, the "
                        "limit mqtt.max_sessions (%d refused so far). Raise mqtt.max_sessions, or "
                        "lower mqtt.session_expiry_maximum / mqtt.persistent_client_expiration so "
                        "offline sessions expire sooner", shown(client_id), len(self.sessions),
                        self.stats["refused_max_sessions"])
        return True

    def session_of(self, client_id: str) -> Session | None:
        """The session of this client id held here (connected or not), or None."""
        return self.sessions.get(client_id)

    def open_session(self, client_id: str, clean_start: bool) -> tuple[Session, bool]:
        """[MQTT-3.1.2-4]: Clean Start discards any existing session; else it is resumed
        [MQTT-3.1.2-5] or a new one is created [MQTT-3.1.2-6]."""
        old = self.sessions.get(client_id)
        if old is not None and clean_start:
            self.end_session(old)
            old = None
        if old is not None:
            self.delayed_wills.pop(client_id, None)  # [MQTT-3.1.3-9] reconnected in time: will not sent
            old.will = None
            old.will_at = None
            old.expires_at = None
            for f in self.hooks.on_client_connected:
                f(old, True)
            return old, True
        s = self._new_session(client_id)
        for f in self.hooks.on_client_connected:
            f(s, False)
        return s, False

    def _new_session(self, client_id: str) -> Session:
        s = Session(client_id, self.cfg.max_queued_messages, self.cfg.queue_qos0_messages,
                    self.stats, self.sent_by_qos, self.queues)
        self.sessions[client_id] = s
        return s

    def end_session(self, session: Session) -> None:
        """The session ends: remove its subscriptions; a pending will is published now."""
        client_id = session.client_id
        if self.sessions.get(client_id) is session:
            del self.sessions[client_id]
        if session.subscriptions:
            for sub in session.subscriptions.values():
                self.router.remove(sub)
            session.drop_subscriptions()
        if session.queue:
            session.drop_queue()
        if session.store is not None:
            session.store.delete_session(client_id)
        if self.delayed_wills and self.delayed_wills.pop(client_id, None) is session and session.will:
            self.publish_will(session)  # [MQTT-3.1.2-8]: will delay elapsed or session ended

    def connection_closed(self, session: Session, publish_will: bool, now: float) -> None:
        """The network connection of a session went away."""
        session.connection = None
        for f in self.hooks.on_client_disconnected:
            f(session, publish_will)
        if session.feeds:
            session.feeds_to_queue()
        will = session.will
        if publish_will and will is not None:
            delay = _will_delay(will)
            if delay and session.expiry_interval:  # [MQTT-3.1.2-8]
                self._defer_will(session, now + delay)
            else:
                self.publish_will(session)
        elif not publish_will:
            session.will = None  # [MQTT-3.1.2-10] discarded (DISCONNECT 0x00)
        # [MQTT-3.1.2-23]: kept after the connection closes unless the interval is 0
        if session.expiry_interval == 0:
            self.end_session(session)
            return
        if session.expiry_interval != NEVER:
            session.expires_at = now + session.expiry_interval
        if session.store is not None:
            session.store.save_session(session)
            if self.schedule_flush is not None:
                self.schedule_flush()  # commit soon even though nothing is written

    def _defer_will(self, session: Session, at: float) -> None:
        """The will is published at `at` (tick()), unless the client reconnects first."""
        session.will_at = at
        self.delayed_wills[session.client_id] = session

    def publish_will(self, session: Session) -> None:
        will = session.will
        session.will = None  # [MQTT-3.1.2-10] removed once published
        session.will_at = None
        if will is None:
            return
        if session.store is not None and self.sessions.get(session.client_id) is session:
            session.store.save_session(session)  # the will is gone from the stored session too
        props = dict(will.properties) if will.properties else None
        expires_at = None
        if props:
            props.pop(PR.WILL_DELAY_INTERVAL, None)
            exp = props.pop(PR.MESSAGE_EXPIRY_INTERVAL, None)
            if exp is not None:
                expires_at = self.clock() + exp
            props = props or None
        if will.topic.startswith("$SYS") or \
                not self.auth.allow_publish(session.client_id, session.username, will.topic):
            return
        msg = Message(will.topic, will.payload, will.qos, will.retain, props, expires_at,
                      session.client_id, self.wall())
        for f in self.hooks.on_will_published:
            f(session, msg)
        if self.accepting and not self.offer(msg, session.client_id, session.username,
                                             session.link_level):
            return
        self.publish(msg, None)

    def flag_read_checks(self) -> None:
        """The ACL changed: which subscriptions need a per-message read check (those overlapping
        deny rules, and those the ACL no longer grants as a whole: each message is then checked),
        and queued messages are checked again before they are sent (Session.recheck_read)."""
        check = self.auth.needs_read_check
        granted = self.auth.allow_subscribe
        for s in self.sessions.values():
            for sub in s.subscriptions.values():
                sub.read_check = (check(s.client_id, s.username, sub.filter)
                                  or not granted(s.client_id, s.username, sub.filter))
        self.queues.acl_gen += 1

    # ------------------------------------------------------------ restore (a persistent store)
    def restore_session(self, client_id: str, interval: int, expires_at_wall: float | None,
                        username: str | None = None, will: Any = None,
                        next_pid: int = 1) -> Session | None:
        """A persistent session read back at start: offline until its client reconnects. The
        current mqtt.session_expiry_maximum / persistent_client_expiration apply (a stored
        "never" too). None when it expired while the broker was down (or under the caps): its
        deletion is reported like any session's. A will is due after its delay, as if the
        connection had just been lost (the broker stopped while the session was connected)."""
        now, wall = self.clock(), self.wall()
        cap = self.granted_expiry(interval, v5=interval != NEVER)
        capped = cap < interval
        if capped and expires_at_wall is not None:
            expires_at_wall -= interval - cap  # offline since expires_at - interval
        if (expires_at_wall is not None and expires_at_wall <= wall) or (capped and cap == 0):
            if self.store is not None:
                self.store.delete_session(client_id)
            return None
        s = self._new_session(client_id)
        s.expiry_interval = cap
        s.username = username
        s.next_pid = next_pid or 1
        # stopped while connected (no stored expiry): offline from now, for its interval
        s.expires_at = (now + (expires_at_wall - wall) if expires_at_wall is not None else
                        (None if cap == NEVER else now + cap))
        s.store = self.store
        if will is not None:
            s.will = will
            self._defer_will(s, now + _will_delay(will))  # [MQTT-3.1.2-8]: an abnormal end
        if capped and self.store is not None:
            self.store.save_session(s)
        return s

    def restore_subscription(self, client_id: str, filt: str, qos: int, no_local: bool,
                             retain_as_published: bool, retain_handling: int,
                             sub_id: int | None) -> Subscription | None:
        """A stored subscription of a restored session (None: no such session); ValueError for
        a filter that is not one."""
        s = self.sessions.get(client_id)
        if s is None:
            return None
        shared = parse_shared(filt)
        group, tf = shared if shared else (None, filt)
        if not valid_topic_filter(tf):
            raise ValueError(f"invalid topic filter {filt!r}")
        if filt not in s.subscriptions:
            # the bounds a SUBSCRIBE has now hold for what is read back too (they may have been
            # lowered, or the subscriptions stored before there were any): beyond them it is
            # dropped, from the store too, and restored() says how many
            cap = self.cfg.max_subscriptions_per_client
            over = ("max_subscriptions_per_client" if cap and len(s.subscriptions) >= cap
                    else self.subscription_over(s, filt, tf))
            if over is not None:
                self.restore_refused[over] = self.restore_refused.get(over, 0) + 1
                if s.store is not None:
                    s.store.delete_subscription(client_id, filt)
                return None
        sub = Subscription(filt, tf, group, qos, no_local, retain_as_published, retain_handling,
                           sub_id, s)
        sub.read_check = self.auth.needs_read_check(client_id, s.username, filt)
        s.add_subscription(sub)
        self.router.add(sub)
        return sub

    def restore_outbound(self, client_id: str, msg: Message, qos: int, retain: bool, sub_ids: Any,
                         pid: int | None, released: bool, handle: Any) -> bool:
        """A stored outbound message of a restored session: in flight (pid) or queued."""
        s = self.sessions.get(client_id)
        if s is None:
            return False
        s.may_send_qos12()
        if pid:
            e = s.inflight_out[pid] = Inflight(msg, qos, retain, sub_ids, handle)
            e.released = released
        else:
            s.requeue((msg, qos, retain, sub_ids, handle))
        return True

    def restore_queued(self, client_id: str, entries: list[QueueEntry], front: bool = False) -> bool:
        """Queued messages of a restored session, oldest first: after what its queue holds, or
        (`front`) before it, in the same order. Each counts towards mqtt.max_queued_bytes and
        mqtt.max_queued_bytes_total as if queued now (Session.requeue), and is credited back
        when sent: the caller bounds how many it restores."""
        s = self.sessions.get(client_id)
        if s is None:
            return False
        if entries:
            s.may_send_qos12()
        for e in reversed(entries) if front else entries:
            s.requeue(e, front)
        return True

    def restore_qos2(self, client_id: str, pid: int, unsure: bool = False) -> None:
        """An inbound QoS 2 packet id of a restored session, still awaiting its PUBREL; or,
        `unsure`, awaiting it in a state that may be older than the client's (Session.qos2_unsure)."""
        s = self.sessions.get(client_id)
        if s is not None:
            if unsure:
                s.qos2_restored_unsure(pid)
            else:
                s.qos2_received(pid)

    def restore_retained(self, msg: Message) -> bool:
        """A stored retained message; False (not kept) when it has expired."""
        if msg.expires_at is not None and msg.expires_at <= self.clock():
            return False
        self.retained.set(msg.topic, msg)
        return True

    def restored(self) -> None:
        """The store finished restoring: warn when what was read back fills mqtt.max_sessions or
        the retained store's bounds (nothing stored is dropped for them: new ones are refused)."""
        if self.restore_refused:
            log.warning("subscriptions read back beyond the limits were dropped (%s): their "
                        "clients must subscribe again; raise the limits to keep such sets",
                        ", ".join(f"{n} over mqtt.{name}" for name, n in self.restore_refused.items()))
            self.restore_refused = {}
        limit = self.cfg.max_sessions
        if limit and len(self.sessions) >= limit:
            log.warning("restored %d sessions, mqtt.max_sessions is %d: CONNECTs with new client ids "
                        "are refused (0x97) until sessions end; raise mqtt.max_sessions",
                        len(self.sessions), limit)
        cfg, r = self.cfg, self.retained
        if ((cfg.max_retained_messages and r.count >= cfg.max_retained_messages)
                or (cfg.max_retained_bytes and r.bytes >= cfg.max_retained_bytes)):
            log.warning("restored %d retained messages (%d bytes); mqtt.max_retained_messages is %d "
                        "and mqtt.max_retained_bytes %d: new retained messages are refused until "
                        "some are deleted (or raise the limits)", r.count, r.bytes,
                        cfg.max_retained_messages, cfg.max_retained_bytes)

    def hook_stats(self) -> dict[str, Any]:
        """{section: {name: value}} of the hooks providing stats() (the sink's, the cluster's)."""
        out: dict[str, Any] = {}
        for stats in self.hooks.stats:
            try:
                out.update(stats())
            except Exception as exc:  # figures must never fail because of one hook
                log.debug("stats of a hook failed: %s", exc)
        return out

    # ------------------------------------------------------------ commands (broker/admin)
    def kick(self, client_id: str, why: str = "administrative action") -> bool:
        """Disconnect a connected client: DISCONNECT 0x98 Administrative action (MQTT 5; 3.1.x:
        the connection is closed); its will is published as on any server-side close. False
        when no client with that id is connected."""
        s = self.sessions.get(client_id)
        conn = s.connection if s is not None else None
        if conn is None:
            return False
        conn.server_disconnect(0x98, why, publish_will=True)
        return True

    def publish_operator(self, msg: Message, username: str | None = None) -> int | None:
        """A message published by the broker's operator (admin API) as an accepted PUBLISH
        is: handed to the hooks taking accepted messages (the sink), then publish() (retained,
        routed; in a cluster through its log). None when a hook refused it (the sink's spool is
        full), else how many sessions got it (-1: unknown, a cluster routes it)."""
        if self.accepting and not self.offer(msg, msg.sender or "", username, 5):
            return None
        return self.publish(msg, None)

    # ------------------------------------------------------------ messages
    def retained_fits(self, msg: Message) -> bool:
        """Whether the retained store may take `msg` (a non-empty payload: empty ones delete)
        within mqtt.max_retained_message_size, max_retained_messages and max_retained_bytes;
        replacing a topic's message counts only the difference."""
        cfg = self.cfg
        size = len(msg.payload)
        if cfg.max_retained_message_size and size > cfg.max_retained_message_size:
            return False
        if not (cfg.max_retained_messages or cfg.max_retained_bytes):
            return True
        r = self.retained
        old = r.get(msg.topic)
        if old is None:
            return ((not cfg.max_retained_messages or r.count < cfg.max_retained_messages) and
                    (not cfg.max_retained_bytes or
                     r.bytes + size + len(msg.topic_bytes) <= cfg.max_retained_bytes))
        return not cfg.max_retained_bytes or \
            r.bytes + size - len(old.payload) <= cfg.max_retained_bytes

    def retained_refused(self, msg: Message, conn: Any, who: str) -> None:
        """A retained message the store had no room for: counted (dropped_retained_quota) and
        logged, rate-limited."""
        self.stats["dropped_retained_quota"] += 1
        cfg, r = self.cfg, self.retained
        self.client_log.line(log, logging.WARNING, conn,
                             "%s: retained message on '%s' (%d bytes) not stored: the retained store "
                             "holds %d messages, %d bytes (mqtt.max_retained_messages %d, "
                             "max_retained_bytes %d, max_retained_message_size %d)", who,
                             msg.topic, len(msg.payload), r.count, r.bytes,
                             cfg.max_retained_messages, cfg.max_retained_bytes,
                             cfg.max_retained_message_size)

    def retain(self, msg: Message) -> None:
        """[MQTT-3.3.1-5] store/replace; an empty payload deletes [MQTT-3.3.1-6] and is not
        stored [MQTT-3.3.1-7]."""
        if not self.cfg.retain_available:
            return
        m = msg if msg.payload else None
        self.retained.set(msg.topic, m)
        for f in self.hooks.on_retain:
            f(msg.topic, m)

    def publish(self, msg: Message, sender: Session | None) -> int:
        """An accepted message (offered to the hooks already): its retained update
        [MQTT-3.3.1-5], then every matching subscription. Returns how many sessions got it,
        or -1 when the hook that routes messages took it (the cluster: its log decides, and
        every node delivers it with deliver())."""
        if msg.retain and msg.payload and not self.retained_fits(msg):
            # mqtt.max_retained_*: delivered, not retained (a will or the operator's message
            # has no failure code to give; a client's PUBLISH is decided in connection.py)
            self.retained_refused(msg, None, msg.sender or "operator")
            retain = False
        else:
            retain = msg.retain
        hook = self.router_hook
        if hook is not None:
            hook(msg, sender)  # (the cluster checks retained_fits again before it retains)
            return -1
        if retain:  # [MQTT-3.3.1-8] RETAIN 0: nothing stored, replaced or removed
            self.retain(msg)
        return self.route(msg, sender)

    def deliver(self, msg: Message, sender_id: str | None, shared: bool = False) -> int:
        """A message the routing hook hands back (from the cluster's log): to the matching
        subscriptions of this node's sessions; No Local [MQTT-3.8.3-3] by the publisher's client
        id, wherever it is connected now. Shared subscriptions only when `shared` (the cluster
        gives each message to one member of a group, through its own stream)."""
        sender = self.sessions.get(sender_id) if sender_id is not None else None
        return self.route(msg, sender, shared)

    def deliver_with(self, msg: Message, sender_id: str | None,
                     starting: list[Subscription]) -> int:
        """deliver(), and to `starting` too: subscriptions that match the message but are not
        routed yet (the cluster starts a new one from a position in its log, record by record),
        merged per session with the routed ones as route() merges overlapping subscriptions."""
        sender = self.sessions.get(sender_id) if sender_id is not None else None
        normal: list[tuple[Subscriber, list[Subscription]]] = list(self.router.match(msg.topic)[0])
        for sub in starting:
            for i, (session, subs) in enumerate(normal):
                if session is sub.session:
                    normal[i] = (session, [*subs, sub])
                    break
            else:
                normal.append((sub.session, [sub]))
        return self.fan_out(msg, sender, normal, ())

    def shared_groups(self) -> tuple[int, list[GroupKey]]:
        """(version, the $share groups with a member here): the version changes whenever a group
        gains or loses a member, so a routing hook that runs a stream per group (the cluster)
        looks at the groups only then."""
        r = self.router
        return r.shared_version, list(r.shared_groups)  # (a group leaves with its last member)

    def deliver_shared(self, msg: Message, key: GroupKey) -> Session | None:
        """A message for one $share group (key: (group, topic filter)) from the routing hook's
        stream of that group: to one of this node's members [MQTT-4.8.2-3] at its granted QoS;
        the member's Session, or None when the group has no member here (any more)."""
        for k, members in self.router.match(msg.topic)[1]:
            if k != key:
                continue
            s = self.router.pick(key, members)
            session = s.session
            if not isinstance(session, Session):  # (a $share group's members are sessions)
                return None
            if s.read_check and not self.auth.allow_read(session.client_id, session.username,
                                                          msg.topic):
                return None
            qos = s.qos if s.qos < msg.qos else msg.qos
            session.deliver(msg, qos, msg.retain and s.retain_as_published,
                            (s.sub_id,) if s.sub_id else None, self.clock())
            return session
        return None

    def add_subscription(self, sub: Subscription, replacing: bool = False) -> None:
        """A client's new (or replaced) subscription starts taking messages: now, or, with a
        routing hook providing install() (the cluster), once that hook has delivered what was
        published before it (so it gets what a single broker would give it)."""
        if self.install is None or replacing:
            self.router.add(sub)
        else:
            self.install(sub)

    def subscription_over(self, session: Session, filt: str, topic_filter: str) -> str | None:
        """The bound one more subscription of `session` (to filt: not one it holds) would pass,
        or None when it fits (docs/conformance.md "Subscription limits"): the filters' length held by the
        session and by the broker, the wildcard levels of the session's filter shapes and of all
        shapes subscribed (these bound the trie nodes one PUBLISH can visit: Router)."""
        cfg, r = self.cfg, self.router
        n = len(filt)
        if cfg.max_subscription_bytes and session.filter_bytes + n > cfg.max_subscription_bytes:
            return "max_subscription_bytes"
        if (cfg.max_subscription_bytes_total
                and r.filter_bytes + n > cfg.max_subscription_bytes_total):
            return "max_subscription_bytes_total"
        if not session.wildcard_room(topic_filter, cfg.max_wildcard_levels):
            return "max_wildcard_levels"
        if not r.wildcard_room(topic_filter, cfg.max_wildcard_levels_total):
            return "max_wildcard_levels_total"
        return None

    def remove_subscription(self, sub: Subscription) -> None:
        """A subscription ends (UNSUBSCRIBE, or replaced by a new SUBSCRIBE of its filter; a
        history replay's live tap)."""
        self.router.remove(sub)

    def route_from_now(self, sub: Subscription) -> None:
        """A subscription routed from now on, without the routing hook's install(): the one
        install() held back once it has caught up (the cluster), or a history replay's tap."""
        self.router.add(sub)

    def has_plain_subscribers(self) -> bool:
        """Whether any subscription here is not a $share one (nothing to route otherwise)."""
        return self.router.has_plain()

    def plain_filters(self) -> tuple[int, dict[str, int]]:
        """(version, filter -> subscriptions) of the plain subscriptions here; the version
        changes whenever a filter gains its first subscription or loses its last. The dict is
        the router's own: read, never changed."""
        return self.router.plain_version, self.router.plain_filters

    def subscribers_of(self, topic: str) -> list[tuple[Subscriber, list[Subscription]]]:
        """The (subscriber, its matching subscriptions) a message on `topic` goes to, $share
        groups aside; cached per topic (Router.match)."""
        return self.router.match(topic)[0]

    def retained_matching(self, topic_filter: str) -> Iterator[tuple[Any, Message]]:
        """Lazily, the retained messages matching a filter (RetainedStore.walk): a new
        subscription's retained delivery [MQTT-3.3.1-9]."""
        return self.retained.walk(topic_filter)

    def retained_count(self) -> int:
        """How many retained messages the broker holds ($-topics included)."""
        return self.retained.count

    def set_retained(self, topic: str, msg: Message | None) -> None:
        """A retained message set (or deleted: None) elsewhere (the cluster's log): kept here
        for new subscriptions, no hook told."""
        self.retained.set(topic, msg)

    def every_session(self) -> list[Session]:
        """The sessions of this broker, connected or not (a copy: the caller may end some)."""
        return list(self.sessions.values())

    def client_ids(self) -> list[tuple[str, str | None, str]]:
        """(client id, user name, address) of every connected client (BrokerView.client_ids)."""
        from .view import BrokerView
        return BrokerView(self).client_ids()

    def count_dropped(self, reason: str, n: int = 1) -> None:
        """`n` messages a hook dropped, counted as stats["dropped_" + reason] (BrokerView, $SYS,
        metrics and the dashboard show them with the broker's own drops)."""
        key = "dropped_" + reason
        self.stats[key] = self.stats.get(key, 0) + n

    def every_retained(self) -> list[Message]:
        """Every retained message held here ($-topics included), e.g. to write them all."""
        return self.retained.all()

    def release_session(self, client_id: str, publish_will: bool, why: str) -> Session | None:
        """The session moved to another node (the cluster): disconnect its client (DISCONNECT
        0x8E to MQTT 5 [MQTT-3.1.4-3]) and forget it here, without ending it (no deletion
        event: it lives on where it moved). Its will goes out only if `publish_will`."""
        s = self.sessions.pop(client_id, None)
        if s is None:
            return None
        self.delayed_wills.pop(client_id, None)
        s.store = None  # its changes are no longer this node's to record
        link, s.connection = s.connection, None  # (so closing the connection does not end the session)
        for sub in s.subscriptions.values():
            self.router.remove(sub)
        if link is not None:
            link.server_disconnect(0x8E, why, publish_will=False)
        if publish_will and s.will is not None:
            self.publish_will(s)
        s.will = None
        return s

    def route(self, msg: Message, sender: Session | None, shared: bool = True) -> int:
        """Deliver to every matching subscription; returns how many sessions got it."""
        groups: Sequence[tuple[GroupKey, list[Subscription]]]
        normal, groups = self.router.match(msg.topic)
        if not shared:
            groups = ()
        if not normal and not groups:
            return 0
        return self.fan_out(msg, sender, normal, groups)

    def fan_out(self, msg: Message, sender: Session | None,
                normal: Sequence[tuple[Subscriber, list[Subscription]]],
                groups: Sequence[tuple[GroupKey, list[Subscription]]]) -> int:
        """route() once the matches are known: (session, [subscriptions]) pairs and shared
        groups."""
        sub_ids: tuple[int, ...] | None
        now = self.clock()
        mqos = msg.qos
        n = 0
        may_read = self.auth.allow_read
        for session, subs in normal:
            if len(subs) == 1:
                s = subs[0]
                if s.no_local and session is sender:  # [MQTT-3.8.3-3]
                    continue
                if s.read_check and not may_read(session.client_id, session.username, msg.topic):
                    continue  # a deny rule of the receiving client (docs/security.md "Access control")
                qos = s.qos if s.qos < mqos else mqos  # [MQTT-3.8.4-8] downgrade
                retain = msg.retain and s.retain_as_published  # [MQTT-3.3.1-12], [MQTT-3.3.1-13]
                sub_ids = (s.sub_id,) if s.sub_id else None
            else:
                # Overlapping subscriptions: one copy at the highest granted QoS carrying
                # every matching Subscription Identifier [MQTT-3.3.4-2], [MQTT-3.3.4-3].
                qos = -1
                retain = False
                check = False
                ids: list[int] = []
                for s in subs:
                    if s.no_local and session is sender:
                        continue
                    check = check or s.read_check
                    if s.qos > qos:
                        qos = s.qos
                    retain = retain or (msg.retain and s.retain_as_published)
                    if s.sub_id:
                        ids.append(s.sub_id)
                if qos < 0 or check and not may_read(session.client_id, session.username,
                                                     msg.topic):
                    continue
                if qos > mqos:
                    qos = mqos
                sub_ids = tuple(ids) or None
            session.deliver(msg, qos, retain, sub_ids, now)
            n += 1
        for key, members in groups:
            s = self.router.pick(key, members)  # 4.8.2: one member of each group
            if s.read_check and not may_read(s.session.client_id, s.session.username, msg.topic):
                continue
            qos = s.qos if s.qos < mqos else mqos  # [MQTT-4.8.2-3] the granted QoS
            s.session.deliver(msg, qos, msg.retain and s.retain_as_published,
                              (s.sub_id,) if s.sub_id else None, now)
            n += 1
        return n

    def offer(self, msg: Message, client_id: str, username: str | None, protocol: int) -> bool:
        """Hand an accepted message to the hooks taking them (on_message_accepted: the sink,
        the cluster); False when one refuses it (the sink's spool is full)."""
        for accept in self.accepting:
            if not accept(msg, client_id, username, protocol):
                self.stats["sink_refused"] += 1
                return False
        return True

    def publish_local(self, msg: Message) -> int:
        """A message of the broker itself ($SYS): retained in memory and routed; no hook sees
        it (not stored, not sent to the sink). Returns how many sessions got it."""
        if msg.retain:
            self.retained.set(msg.topic, msg if msg.payload else None)
        return self.route(msg, None)

    # ------------------------------------------------------------ output
    def connack(self, level: int, present: bool) -> bytes:
        """A successful CONNACK with no properties but the broker's capabilities (v5): encoded
        once per (protocol level, session present)."""
        data = self.connacks.get((level, present))
        if data is None:
            props = (self.capabilities or None) if level == P.MQTT_5 else None
            data = self.connacks[(level, present)] = encode(P.Connack(present, 0, props), level)
        return data

    def mark_dirty(self, conn: Connection) -> None:
        if not self.dirty and self.schedule_flush is not None:
            self.schedule_flush()
        self.dirty.append(conn)

    # ------------------------------------------------------------ timers
    def tick(self, now: float | None = None) -> None:
        """Keep alive, delayed wills, session and message expiry. Call about once a second."""
        now = self.clock() if now is None else now
        self.client_log.tick(now)
        self.router.sweep()
        for conn in self.connections.due(now):
            conn.look_at(now)
        for cid, s in list(self.delayed_wills.items()):
            if s.will_at is not None and s.will_at <= now:
                del self.delayed_wills[cid]
                self.publish_will(s)
        for s in list(self.sessions.values()):
            if s.connection is None and s.expires_at is not None and s.expires_at <= now:
                self.client_log.line(log, logging.DEBUG, None, "session %s expired", s.client_id)
                self.end_session(s)  # [MQTT-4.1.0-2]
            elif s.queue and s.connection is None:
                s.purge_expired(now)

    def shutdown(self, reference: str | None = None) -> None:
        """Server shutting down: DISCONNECT 0x8B to v5 clients, or 0x9C Use another server with
        a Server Reference (a cluster node leaving, 4.11); wills only if configured."""
        code, why = (0x9C, "this node is leaving the cluster: use another server") if reference \
            else (0x8B, "server shutting down")
        for conn in list(self.connections):
            conn.server_disconnect(code, why, publish_will=self.cfg.publish_will_on_shutdown,
                                   reference=reference)


def _as_hook(obj: Any) -> Any:
    """A hook, or the hook an extension object makes (sink.forward.service.Sink.hook())."""
    if hasattr(obj, "provides"):
        return obj
    make = getattr(obj, "hook", None)
    if make is None:
        raise TypeError(f"{type(obj).__name__} is not a hook: it has neither a `provides` set "
                        "nor a hook() method (see broker/core/hooks.py; for a sink object "
                        "wrap it: sink.forward.hook.SinkHook(obj))")
    return make()


def _will_delay(will: Any) -> int:
    """The Will Delay Interval (3.1.3.2.2), 0 when absent."""
    delay: int = (will.properties or {}).get(PR.WILL_DELAY_INTERVAL, 0)
    return delay
