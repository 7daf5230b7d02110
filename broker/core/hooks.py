"""Hooks: how persistence, the Kafka sink, auth, $SYS and metrics attach to the core.

A hook declares in `provides` the events it handles (mochi-mqtt's Provides()). The registry
keeps, per event, the tuple of the bound handlers of the hooks that provide it, recomputed when
a hook is added or removed: an event nobody provides costs an empty-tuple test, so the broker
runs with no hook at all. Sans-I/O: this module imports nothing outside the core.

Events (handler signatures are the Hook methods below):

* messages: on_message_accepted (may refuse: the sink's spool is full), on_retain,
  on_will_published
* clients: on_client_connected, on_client_disconnected
* session state, for persistent sessions only (Session Expiry Interval > 0 / 3.1.1 clean
  session 0): on_session_saved, on_session_deleted, on_subscribed, on_unsubscribed,
  on_qos2_received, on_qos2_released
* stored copies of outbound messages (queued or in flight): on_message_stored returns a handle,
  then on_stored_sending / on_stored_released / on_stored_done. One hook at most provides these
  (it owns the handles).
* checks (auth): authenticate, check_client_id, allow_publish, allow_subscribe, allow_read,
  needs_read_check. With no hook providing one, everything is allowed (AllowAll).
* durability: barrier() -> Pending | None, what an acknowledgement of what the hook was handed
  so far must wait for (core/durability.py). The ack gate asks each hook providing it once per
  read with QoS 1/2 acks, and sends the acks when every token resolved, or their failure codes.
* routing (one hook at most): route(msg, sender) takes an accepted message (and its retained
  update) instead of the broker's own router: the cluster sends it through Kafka and every node
  delivers it with Broker.deliver(); admit(...) -> Pending | None holds a CONNECT until the
  client id is this node's (the cluster's claim), Broker.release_session() lets a session go.
* replay (one hook at most): replay(conn, filt, options, sub_id) -> (reason code, reason
  string or None) for a SUBSCRIBE filter under REPLAY_PREFIX ("$replay/"): the history of a
  topic filter, then its live messages (docs/history.md "Replay over MQTT"). The hook checks and installs
  the subscription itself; without such a hook the filter is refused (0x83).
* lifecycle, called by the asyncio layer: on_start (listeners not yet open: restore state),
  on_turn_end (the end of an event-loop turn, before its output is written: commit), on_tick
  (about once a second), on_stop; and stats() -> {section: {name: value}} for metrics, $SYS and
  the dashboard.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .hookhost import HookHost

Handlers = tuple[Callable[..., Any], ...]  # the bound handlers of one event (Hooks)

MESSAGE_EVENTS = ("on_message_accepted", "on_retain", "on_will_published")
CLIENT_EVENTS = ("on_client_connected", "on_client_disconnected")
SESSION_EVENTS = ("on_session_saved", "on_session_deleted", "on_subscribed", "on_unsubscribed",
                  "on_qos2_received", "on_qos2_released")
STORED_EVENTS = ("on_message_stored", "on_stored_sending", "on_stored_released", "on_stored_done")
AUTH_CHECKS = ("authenticate", "check_client_id", "allow_publish", "allow_subscribe",
               "allow_read", "needs_read_check")
DURABILITY = ("barrier",)
LIFECYCLE = ("on_start", "on_turn_end", "on_tick", "on_stop", "stats")
# one hook at most: it routes accepted messages instead of the broker (the cluster, through its
# log, back to Broker.deliver() on every node), and admits CONNECTs (a claim on the client id)
ROUTING = ("route", "admit", "locate", "install")
# one hook at most: a SUBSCRIBE to a filter under REPLAY_PREFIX is its to decide and install
REPLAY = ("replay",)
REPLAY_PREFIX = "$replay/"
EVENTS = (MESSAGE_EVENTS + CLIENT_EVENTS + SESSION_EVENTS + STORED_EVENTS + AUTH_CHECKS
          + DURABILITY + LIFECYCLE + ROUTING + REPLAY)


class AdmitRefused(NamedTuple):
    """What admit() returns to refuse a CONNECT at once, before anything is claimed: CONNACK
    with `code` (e.g. 0x87 Not authorized) and `why` as its Reason String."""
    code: int
    why: str


class Hook:
    """Base class: subclasses set `provides` and implement those methods."""
    provides: frozenset[str] = frozenset()

    # (message, session, subscription, handle, Pending: Any below, so that hooks in other
    # packages may name what they take and return more precisely)
    def attach(self, broker: HookHost) -> None:
        """Called when the hook is added to a broker (e.g. to call back into it): what it may
        use of it is what HookHost (core/hookhost.py) lists."""

    # ---------------------------------------------------------------- messages
    def on_message_accepted(self, msg: Any, client_id: str, username: str | None,
                            protocol: int) -> bool:
        """A PUBLISH (or will) was accepted, before it is routed. False refuses it: the
        publisher gets 0x97 Quota exceeded and nobody receives it. A hook that must make it
        durable also provides barrier()."""
        return True

    # ---------------------------------------------------------------- durability
    def barrier(self) -> Any:
        """A core.durability.Pending resolving once everything this hook was handed so far is
        durable (its failure reason if it cannot be), or None when nothing waits."""
        return None

    # ---------------------------------------------------------------- routing
    def route(self, msg: Any, sender: Any) -> Any:
        """Take an accepted message (offered to on_message_accepted first) and its retained
        update; it reaches subscribers through Broker.deliver() (on this node and others)."""

    def install(self, sub: Any) -> None:
        """A new subscription: add it to broker.router when it should start taking messages
        (the cluster: once the messages in its log before it have been delivered)."""

    def locate(self, client_id: str) -> str | None:
        """Which node holds this client id's session (a cluster), None if none."""
        return None

    def admit(self, client_id: str, clean_start: bool, expiry: int, will: Any, username: str | None,
              level: int) -> Any:
        """A CONNECT passed its checks: None to go on at once, an AdmitRefused to refuse it
        with that reason code (a check only the hook can make, e.g. the client id is another
        user's session on another node), or a Pending the CONNACK waits for (its failure
        refuses the CONNECT with 0x88 Server unavailable)."""
        return None

    # ---------------------------------------------------------------- replay
    def replay(self, conn: Any, filt: str, options: Any,
               sub_id: int | None) -> tuple[int, str | None]:
        """A SUBSCRIBE names `filt` under REPLAY_PREFIX on connection `conn`: (the SUBACK reason
        code, a Reason String or None). The hook installs the subscription (session.subscriptions,
        Broker.router) and sends what it replays through the session (Session.add_feed)."""
        return 0x83, None

    # ---------------------------------------------------------------- lifecycle
    def on_start(self) -> None:
        """The server starts (before it listens): restore state into the attached broker."""

    def on_turn_end(self) -> None:
        """An event-loop turn ends; its output is written next (after what this commits)."""

    def on_tick(self) -> None:
        """About once a second."""

    def on_stop(self) -> None:
        """The server stopped: release files and threads."""

    def stats(self) -> dict[str, Any]:
        """{section: {name: number or text}} for metrics, $SYS and the dashboard."""
        return {}

    def on_retain(self, topic: str, msg: Any) -> None:
        """The retained message of `topic` was set (msg) or deleted (None)."""

    def on_will_published(self, session: Any, msg: Any) -> None:
        """A will message is being published (routed unless a check refuses it)."""

    # ---------------------------------------------------------------- clients
    def on_client_connected(self, session: Any, present: bool) -> None:
        """A CONNECT is accepted: its session opened (resumed when present)."""

    def on_client_disconnected(self, session: Any, publish_will: bool) -> None:
        """The network connection of a session went away."""

    # ---------------------------------------------------------------- persistent sessions
    def on_session_saved(self, session: Any) -> None:
        """A persistent session's own fields changed (expiry, username, will, next pid)."""

    def on_session_deleted(self, client_id: str) -> None:
        """A persistent session ended: forget it and everything it held."""

    def on_subscribed(self, client_id: str, sub: Any) -> None:
        """A persistent session's subscription was added or replaced."""

    def on_unsubscribed(self, client_id: str, filt: str) -> None:
        """A persistent session's subscription was removed."""

    def on_qos2_received(self, client_id: str, pid: int) -> None:
        """An inbound QoS 2 PUBLISH awaits its PUBREL."""

    def on_qos2_released(self, client_id: str, pid: int) -> None:
        """The PUBREL came (or the PUBREC failed): the packet id is free."""

    def on_message_stored(self, client_id: str, msg: Any, qos: int, retain: bool, sub_ids: Any,
                          pid: int | None = None) -> Any:
        """An outbound message of a persistent session is queued (pid None) or in flight:
        returns a handle the following events name (None: not stored)."""

    def on_stored_sending(self, handle: Any, pid: int) -> None:
        """A queued message is sent with packet id `pid`."""

    def on_stored_released(self, handle: Any) -> None:
        """PUBREC came for a QoS 2 message: PUBREL is next."""

    def on_stored_done(self, handle: Any) -> None:
        """Acknowledged, expired or discarded: the copy is no longer needed."""


class AllowAll(Hook):
    """The checks when no auth hook is attached: anonymous access, every topic."""
    provides = frozenset(AUTH_CHECKS)

    def authenticate(self, client_id: str, username: str | None, password: bytes | None) -> int:
        return 0

    def allow_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return True

    def allow_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return True

    def check_client_id(self, client_id: str, username: str | None) -> int:
        return 0

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return False

    def allow_read(self, client_id: str, username: str | None, topic: str) -> bool:
        return True


ALLOW_ALL = AllowAll()  # the one the broker uses without an auth hook: callers skip its checks


def needs_publish_check(auth: Any, client_id: str, username: str | None) -> bool:
    """Whether a connection's PUBLISHes go through auth.allow_publish, decided once when its
    CONNECT is accepted. An auth hook may say no with an optional
    ``needs_publish_check(client_id, username)`` (the broker's own AccessControl does for every
    client but the rules' one when no ACL file is configured); a hook without it is asked
    every time. A call per PUBLISH that can only answer yes cost a plain broker 10-30 % of its
    QoS 0 and QoS 1 fan-in (bench/bench.py: 339-444k -> 299-315k msg/s QoS 0)."""
    if auth is ALLOW_ALL:
        return False
    decide = getattr(auth, "needs_publish_check", None)
    return True if decide is None else bool(decide(client_id, username))


class Checks:
    """The checks of several auth hooks: a refusal by any of them refuses (deny wins)."""
    # bound in __init__ (setattr): the one hook's method, or a combination
    authenticate: Callable[..., int]
    check_client_id: Callable[..., int]
    allow_publish: Callable[..., bool]
    allow_subscribe: Callable[..., bool]
    allow_read: Callable[..., bool]
    needs_read_check: Callable[..., bool]

    def __init__(self, hooks: list[Any]) -> None:
        default = AllowAll()
        by = {c: [getattr(h, c) for h in hooks if c in h.provides] or [getattr(default, c)]
              for c in AUTH_CHECKS}
        self.hooks = hooks
        for name in ("authenticate", "check_client_id"):  # the first non-zero code
            fns = by[name]
            setattr(self, name, fns[0] if len(fns) == 1 else _first_code(fns))
        for name in ("allow_publish", "allow_subscribe", "allow_read"):
            fns = by[name]
            setattr(self, name, fns[0] if len(fns) == 1 else _all(fns))
        fns = by["needs_read_check"]
        self.needs_read_check = fns[0] if len(fns) == 1 else _any(fns)
        # the hooks that check PUBLISHes, each asked whether it must (needs_publish_check)
        self._publish_checkers = [h for h in hooks if "allow_publish" in h.provides]
        # the password file, if any (the server then checks passwords off the event loop)
        self.passwords = next((h.passwords for h in hooks
                               if getattr(h, "passwords", None) is not None), None)

    def needs_publish_check(self, client_id: str, username: str | None) -> bool:
        return any(needs_publish_check(h, client_id, username) for h in self._publish_checkers)

    def reload(self) -> None:
        for h in self.hooks:
            r = getattr(h, "reload", None)
            if r is not None:
                r()


def _first_code(fns: list[Callable[..., int]]) -> Callable[..., int]:
    def check(*args: Any) -> int:
        for f in fns:
            code = f(*args)
            if code:
                return code
        return 0
    return check


def _all(fns: list[Callable[..., bool]]) -> Callable[..., bool]:
    return lambda *args: all(f(*args) for f in fns)


def _any(fns: list[Callable[..., bool]]) -> Callable[..., bool]:
    return lambda *args: any(f(*args) for f in fns)


def _fan_out(fns: list[Callable[..., Any]]) -> Callable[..., None]:
    def dispatch(*args: Any) -> None:
        for f in fns:
            f(*args)
    return dispatch


def _noop(*args: Any) -> None:
    return None


class Persistence:
    """What the core calls on a persistent session's state (session.store, broker.store),
    turned into the SESSION_EVENTS and STORED_EVENTS of the hooks providing them. Each
    method is bound once, when the hooks change: to the one handler (no extra call), to a
    fan-out over several, or to a no-op."""
    _METHODS = (("save_session", "on_session_saved"), ("delete_session", "on_session_deleted"),
                ("save_subscription", "on_subscribed"), ("delete_subscription", "on_unsubscribed"),
                ("qos2_add", "on_qos2_received"), ("qos2_remove", "on_qos2_released"),
                ("enqueue", "on_message_stored"), ("set_pid", "on_stored_sending"),
                ("set_released", "on_stored_released"), ("remove", "on_stored_done"))
    # bound in __init__ (setattr), as _METHODS pairs them
    save_session: Callable[..., Any]
    delete_session: Callable[..., Any]
    save_subscription: Callable[..., Any]
    delete_subscription: Callable[..., Any]
    qos2_add: Callable[..., Any]
    qos2_remove: Callable[..., Any]
    enqueue: Callable[..., Any]
    set_pid: Callable[..., Any]
    set_released: Callable[..., Any]
    remove: Callable[..., Any]

    def __init__(self, hooks: list[Any]) -> None:
        self.owner: Any = None  # the hook holding stored message copies (STORED_EVENTS), if any
        for h in hooks:
            if h.provides & set(STORED_EVENTS):
                if self.owner is not None:
                    raise ValueError(f"two hooks store messages ({type(self.owner).__name__}, "
                                     f"{type(h).__name__}): attach one persistent store")
                self.owner = h
        for method, event in self._METHODS:
            fns = [getattr(h, event) for h in hooks if event in h.provides]
            setattr(self, method, fns[0] if len(fns) == 1 else _fan_out(fns) if fns else _noop)


class Hooks:
    """The registry: hooks in the order added; per event, the tuple of handlers."""
    # per event (EVENTS), set by _index()
    on_message_accepted: Handlers
    on_retain: Handlers
    on_will_published: Handlers
    on_client_connected: Handlers
    on_client_disconnected: Handlers
    on_session_saved: Handlers
    on_session_deleted: Handlers
    on_subscribed: Handlers
    on_unsubscribed: Handlers
    on_qos2_received: Handlers
    on_qos2_released: Handlers
    on_message_stored: Handlers
    on_stored_sending: Handlers
    on_stored_released: Handlers
    on_stored_done: Handlers
    authenticate: Handlers
    check_client_id: Handlers
    allow_publish: Handlers
    allow_subscribe: Handlers
    allow_read: Handlers
    needs_read_check: Handlers
    barrier: Handlers
    on_start: Handlers
    on_turn_end: Handlers
    on_tick: Handlers
    on_stop: Handlers
    stats: Handlers
    route: Handlers
    admit: Handlers
    locate: Handlers
    install: Handlers
    replay: Handlers

    def __init__(self) -> None:
        self.hooks: list[Any] = []
        self._index()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.hooks)

    def __contains__(self, hook: object) -> bool:
        return hook in self.hooks

    def add(self, hook: Any) -> None:
        if not isinstance(getattr(hook, "provides", None), (set, frozenset)):
            raise TypeError(f"{type(hook).__name__} is not a hook: it declares no `provides` set")
        unknown = set(hook.provides) - set(EVENTS)
        if unknown:
            raise ValueError(f"{type(hook).__name__} provides unknown events {sorted(unknown)}; "
                             f"known: {', '.join(EVENTS)}")
        missing = sorted(e for e in hook.provides if not callable(getattr(hook, e, None)))
        if missing:
            raise TypeError(f"{type(hook).__name__} provides {missing} but has no such methods")
        self.hooks.append(hook)
        try:
            self._index()
        except ValueError:
            self.hooks.remove(hook)
            self._index()
            raise

    def remove(self, hook: Any) -> None:
        self.hooks.remove(hook)
        self._index()

    def providing(self, event: str) -> list[Any]:
        return [h for h in self.hooks if event in h.provides]

    def _index(self) -> None:
        hooks = self.hooks
        for event in EVENTS:
            setattr(self, event, tuple(getattr(h, event) for h in hooks if event in h.provides))
        auth = [h for h in hooks if h.provides & set(AUTH_CHECKS)]
        # one auth hook providing every check is used as is (no indirection, its own extras
        # such as reload() stay reachable); else the combination, AllowAll filling the gaps
        self.auth: Any = (auth[0] if len(auth) == 1 and auth[0].provides >= set(AUTH_CHECKS)
                     else Checks(auth) if auth else ALLOW_ALL)
        persistent = [h for h in hooks if h.provides & set(SESSION_EVENTS + STORED_EVENTS)]
        self.persistence = Persistence(persistent) if persistent else None
        for event in ROUTING + REPLAY:
            if len(getattr(self, event)) > 1:
                raise ValueError(f"two hooks provide {event}: attach one "
                                 f"{'replay hook' if event in REPLAY else 'cluster'}")
