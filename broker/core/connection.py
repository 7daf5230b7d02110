"""One client connection: CONNECT rules, inbound PUBLISH flows, SUBSCRIBE, keep alive.

Sans-I/O: `data_received(bytes)` in, events out (core/events.py: AuthRequested,
AcksHeld, AdmitRequested; an empty tuple on the fast path); encoded packets accumulate in `out`
and the caller writes them; `close_requested` asks the caller to close the socket after
writing (a dirty connection: after its flush; else, after the client's DISCONNECT, at once).
Flow control is an input: pause_writing()/resume_writing(). The connection holds no
transport: the asyncio side (broker/transport/connection_protocol.py) owns it.
Packets are checked against the MQTT 5.0 rules (section 3 and 4.13).

What a connection may use of its broker is `ConnectionHost` (core/host.py), listed there in
groups (settings, time, counters, output, CONNECT, PUBLISH, SUBSCRIBE); tests/unit/
test_interfaces.py refuses anything else. The broker is typed as the Broker itself, not the
Protocol, so the compiled core calls it natively (bench/core_bench.py --instructions: 8% fewer
per QoS 0 delivery, 5% per QoS 1). Its session's state changes through Broker and Session
methods and the CONNECT's fields.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..protocol import packets as P
from ..protocol import properties as PR
from ..protocol import reason_codes as rc
from ..protocol.codec import Decoder, decode_one, encode, encode_ack, is_one_packet, puback_ids
from ..protocol.errors import MalformedPacket, MQTTError, ProtocolError
from ..protocol.properties import encode_vbi
from .connect_checks import client_id_refusal, login_refusal, will_refusal
from .events import NO_EVENTS, AcksHeld, AdmitRequested, AuthRequested, HeldAck
from .hooks import ALLOW_ALL, REPLAY_PREFIX, AdmitRefused, needs_publish_check
from .message import Message
from .empties import NO_ENTRIES
from .session import NEVER, RetainedBudget, Subscription
from mqtt_topics import parse_shared, valid_topic_filter

if TYPE_CHECKING:
    from .broker import Broker
    from .session import Session

log = logging.getLogger(__name__)

# _AUTHENTICATING: its password is being checked (AuthRequested); _ADMITTING: held for the
# admission hook (AdmitRequested: the cluster's claim). Packets sent meanwhile wait (deferred).
_NEW, _CONNECTED, _CLOSED, _AUTHENTICATING, _ADMITTING = 0, 1, 2, 3, 4
MAX_DEFERRED = 1000  # packets a client may send while its password is being checked
# memory per idle connection: nothing allocated until used (the aliases hold empties.NO_ENTRIES,
# `out` None, until their first entry)
NO_OUTPUT: tuple[()] = ()  # take_output() when there is none
# close_requested, one of three (falsy only while open): KEEP_OPEN; BROKER_ENDS when the broker
# ends the connection (the caller lingers: the client may still be sending, and must read the
# DISCONNECT, not a reset); CLIENT_DONE after the client's DISCONNECT, when the client sends
# nothing more [MQTT-3.14.4-1]: the socket is closed at once
KEEP_OPEN, BROKER_ENDS, CLIENT_DONE = 0, 1, 2
NO_PROPERTIES: MappingProxyType[int, Any] = MappingProxyType({})  # a packet without properties (3.1.1, or none sent)
NO_CLIENT_LIMIT = 268435460  # a client that states no Maximum Packet Size (3.1.2.11.4)
ACK_WITH_CODE = 6  # bytes of a v5 PUBACK, PUBREC, PUBREL or PUBCOMP with a Reason Code (3.4.2.1)


class Connection:
    __slots__ = ("broker", "_peer", "decoder", "state", "level", "client_id", "username", "session",
                 "keep_alive", "last_rx", "connected_at", "receive_max", "max_packet_size",
                 "alias_max", "request_problem_info", "in_aliases", "in_alias_bytes", "out_aliases", "out",
                 "is_dirty", "close_requested", "events", "pending_acks",
                 "connect_seen", "owner", "paused", "identity", "deferred",
                 "deferred_bytes", "connect_expiry", "log_at", "check_at", "publish_check")

    def __init__(self, broker: Broker, peer: str | None = "?") -> None:
        self.broker = broker
        self._peer = peer  # None: asked from the owner at first use (peer)
        # None while every read held whole packets of at most 129 bytes (codec.decode_one); a
        # Decoder from the first read that does not (stream_decoder): most idle clients never need one
        self.decoder: Decoder | None = None
        self.state = _NEW
        self.level = P.MQTT_5
        self.client_id = ""
        self.username: str | None = None
        # None until the CONNECT is accepted; typed as what the handlers of a connected client see
        self.session: Session = None  # type: ignore[assignment]
        self.keep_alive = 0
        self.last_rx = broker.clock()
        self.connected_at = self.last_rx
        # the client's limits (CONNECT properties)
        self.receive_max = 65535
        self.max_packet_size = NO_CLIENT_LIMIT
        self.alias_max = 0
        self.request_problem_info = True
        # topic aliases: inbound alias -> topic, outbound topic -> alias
        self.in_aliases: dict[int, str] = NO_ENTRIES  # a dict once the client maps one
        self.in_alias_bytes = 0  # length of the topics in in_aliases (mqtt.max_topic_alias_bytes)
        self.out_aliases: dict[str, int] = NO_ENTRIES  # a dict once the broker assigns one
        self.out: list[bytes | bytearray] | None = None  # a list while there is output for this turn
        self.is_dirty = False
        self.close_requested: int = KEEP_OPEN  # (or BROKER_ENDS, CLIENT_DONE)
        self.events: list[Any] | None = None  # events for the caller, created on the first one
        self.pending_acks = 0      # QoS>0 PUBLISHes accepted, ack waiting for durability
        self.connect_seen = False
        self.owner: Any = None     # the caller's handle (opaque here; the flush hands it back)
        self.paused = False        # input: the caller cannot take more output (pause_writing)
        self.identity: str | None = None  # verified TLS client certificate name, if used
        self.deferred: list[Any] | None = None  # packets received while the password is checked
        self.deferred_bytes = 0            # bytes received while the password is checked
        self.connect_expiry = 0            # the Session Expiry Interval the CONNECT asked for
        self.log_at = 0.0                  # this connection's log-line budget (clientlog.py)
        self.check_at: int | None = None   # its slot in broker.connections (core/timeouts.py)
        self.publish_check = True          # PUBLISHes asked of auth.allow_publish (set at accept)
        broker.connections.file(self, self.last_rx + broker.cfg.connect_timeout)
        broker.stats["connections_total"] += 1

    @property
    def peer(self) -> str:
        """The client's address, for log lines: with peer=None, the owner's peer_name(), made at
        first use (an idle connection holds no string for it)."""
        p = self._peer
        if p is None:
            owner = self.owner
            p = self._peer = owner.peer_name() if owner is not None else "?"
        return p

    @peer.setter
    def peer(self, value: str) -> None:
        self._peer = value

    def local(self) -> bool:
        """Whether the client connects from this machine (a loopback address): asked from the
        owner (its transport's address), else told by `peer` (sans-I/O)."""
        owner = self.owner
        if owner is not None:
            return bool(owner.peer_is_loopback())
        return is_loopback(self.peer)

    def note(self, level: int, fmt: str, *args: object) -> bool:
        """A log line about this connection: every argument escaped and shortened, at most a
        few lines per connection and a bounded rate for all (core/clientlog.py)."""
        return self.broker.client_log.line(log, level, self, fmt, *args)

    # ------------------------------------------------------------ output
    def write(self, data: bytes | bytearray) -> None:
        out = self.out
        if out is not None:
            out.append(data)
        else:
            self.out = [data]
        if not self.is_dirty:
            self.is_dirty = True
            self.broker.mark_dirty(self)

    def take_output(self) -> Sequence[bytes | bytearray]:
        out = self.out
        self.out = None
        self.is_dirty = False
        s = self.session
        if s is not None and s.feeds and not self.paused and s.connection is self:
            s.pump(self.broker.clock())  # paced retained messages: their next burst, for the next turn
        return NO_OUTPUT if out is None else out

    def emit(self, event: object) -> None:
        if self.events is None:
            self.events = [event]
        else:
            self.events.append(event)

    def write_durable(self) -> None:
        """This turn's output holds a persistent session's new QoS 2 PUBLISH: the caller writes
        it once the hooks providing barrier() hold its packet id (Broker.durable_out)."""
        self.broker.durable_out.add(self)

    def wake(self) -> None:
        """Be flushed this turn even with nothing to write (take_output() pumps what waits)."""
        if not self.is_dirty:
            self.is_dirty = True
            self.broker.mark_dirty(self)

    def take_events(self) -> Sequence[Any]:
        ev = self.events
        if ev is None:
            return NO_EVENTS
        self.events = None
        return ev

    def hold(self, ack: HeldAck, suback: bool = False) -> None:
        """An ack that waits for durability: into this read's AcksHeld event (one per read)."""
        ev = self.events
        if ev is not None and type(ev[-1]) is AcksHeld:
            held = ev[-1]
            held.acks.append(ack)
        else:
            held = AcksHeld(ack)
            self.emit(held)
        if suback:
            held.subacks += 1
        else:
            self.pending_acks += 1

    def acks_done(self, acks: list[HeldAck], failure: str | None = None, subacks: int = 0) -> None:
        """The acks of an AcksHeld event, decided: failure None means the messages are
        durable, send the acks; otherwise never a success: v5 the same ack with 0x80
        Unspecified error, 3.1.x has no failure ack: close. [MQTT-4.3.2-4], [MQTT-4.3.3-8]:
        the PUBACK/PUBREC goes out only once the broker owns the message. Each ack is encoded
        here, once, as what it turned out to be."""
        self.pending_acks -= len(acks) - subacks
        if self.state == _CLOSED:
            return
        if failure is not None:
            return self.fail_acks(acks, failure)
        out = self.out  # write() for each, in one step: a read's acks are many
        if out is None:
            out = self.out = []
        level = self.level
        for a in acks:
            if isinstance(a, int):  # events.held_ack(type, packet id, reason code)
                out.append(encode_ack(a >> 24, (a >> 8) & 0xFFFF, a & 0xFF, None, level))
            elif not self.send_fitting(a):  # (its size without a Reason String was checked)
                self.unsendable(P.SUBACK, len(encode(a, level)))
        if not self.is_dirty:
            self.is_dirty = True
            self.broker.mark_dirty(self)

    def fail_acks(self, acks: list[HeldAck], why: str) -> None:
        """The held acks become failures: v5 the same ack with 0x80 Unspecified error; 3.1.x has
        no failure acknowledgement, so the connection is closed."""
        v5 = self.level == P.MQTT_5
        props = {PR.REASON_STRING: why} if v5 and self.request_problem_info else None
        session = self.session
        unsendable = False
        closes = False  # a PUBACK/PUBREC failed: a 3.1.x client is disconnected
        for a in acks:
            if not isinstance(a, int):
                # a SUBACK: the subscriptions could not be made durable: each filter failed
                # ([MQTT-3.9.3-1] one code per filter; 0x80 is a failure in 3.1.1 and 5)
                if not self.send_fitting(P.Suback(a.packet_id, [0x80] * len(a.reason_codes),
                                                  props if v5 else None)):
                    unsendable = True
                continue
            ptype, pid = a >> 24, (a >> 8) & 0xFFFF  # (events.ack_fields)
            if ptype == P.PUBREL or ptype == P.PUBCOMP:
                # the release is this session's state here whatever the store did: the flow
                # goes on (only a move before the next checkpoint could send the PUBLISH again)
                self.write(encode_ack(ptype, pid, rc.SUCCESS, None, self.level))
                continue
            closes = True
            if ptype == P.PUBREC and pid in session.inflight_in:
                # [MQTT-4.3.3-9]: after a PUBREC >= 0x80 a PUBLISH with this id is a new message
                session.inflight_in.discard(pid)
                if session.store is not None:
                    session.store.qos2_remove(session.client_id, pid)
            if v5:
                data = encode_ack(ptype, pid, rc.UNSPECIFIED_ERROR, props, P.MQTT_5)
                if len(data) > self.max_packet_size:  # [MQTT-3.4.2-2]: without the Reason String
                    data = encode_ack(ptype, pid, rc.UNSPECIFIED_ERROR, None, P.MQTT_5)
                if len(data) > self.max_packet_size:
                    unsendable = True
                else:
                    self.write(data)
        if unsendable and self.state != _CLOSED:
            self.unsendable(P.PUBACK, 6)
        if not v5 and closes and self.state != _CLOSED:
            self.note(logging.WARNING, "closing %s (%s): %s; a 3.1.x client has no failure "
                      "acknowledgement", self.client_id, self.peer, why)
            self.close(publish_will=True)

    def pause_writing(self) -> None:
        """The caller's write buffer is full: QoS 0 is dropped, QoS 1/2 queued (Session)."""
        self.paused = True

    def resume_writing(self) -> None:
        """The transport drained: send what waited in the session's queue."""
        self.paused = False
        if self.session is not None and self.session.connection is self:
            self.session.pump(self.broker.clock())

    def outbound_alias(self, topic: str) -> tuple[int, bool]:
        """(alias, whether the topic must be sent) for a PUBLISH towards this client."""
        a = self.out_aliases.get(topic)
        if a is not None:
            return a, False
        if len(self.out_aliases) < self.alias_max and self.broker.cfg.outbound_topic_aliases:
            a = len(self.out_aliases) + 1
            if self.out_aliases is NO_ENTRIES:
                self.out_aliases = {}
            self.out_aliases[topic] = a
            return a, True
        return 0, True

    def outbound_alias_unsent(self, topic: str) -> None:
        """The PUBLISH that would have set up `topic`'s alias (outbound_alias() said it must be
        sent) was not sent (too large for the client): the alias is free again, as if never
        assigned [MQTT-3.3.2-11], 3.3.4."""
        self.out_aliases.pop(topic, None)

    def outbound_aliases_reset(self) -> None:
        self.out_aliases = NO_ENTRIES  # [MQTT-3.3.2-7]: aliases do not outlive the connection

    # ------------------------------------------------------------ input
    def data_received(self, data: bytes) -> Sequence[Any]:
        """Feed bytes read from the client; returns the events for the caller (NO_EVENTS
        mostly). Output accumulates in `out`."""
        self.feed(data)
        ev = self.events  # take_events(), inline: this runs for every read
        if ev is None:
            return NO_EVENTS
        self.events = None
        return ev

    def feed(self, data: bytes) -> None:
        state = self.state
        dec = self.decoder
        if state != _CONNECTED:
            if state == _CLOSED:
                return
            if state == _NEW and data[:1] != b"\x10" and (dec is None or not dec.buf) and data:
                # [MQTT-3.1.0-1]: the first packet must be CONNECT; no need to wait for the rest
                self.note(logging.INFO, "closing %s: first packet is not CONNECT", self.peer)
                self.close(publish_will=False)
                return
        b = self.broker
        now = self.last_rx = b.clock()
        if data[:1] == b"\x40" and state == _CONNECTED and (dec is None or not dec.buf):
            # a read of PUBACKs only (a QoS 1 subscriber's): acknowledged without a packet object
            # or handle()'s dispatch each; 4-byte packets, within maximum_packet_size once its
            # CONNECT was (bench/core_bench.py --instructions qos1_puback:
            # 51,968 -> 45,052 per delivery, with Session.acked() calling _freed() only when needed)
            ids = puback_ids(data)
            if ids is not None:
                return self.on_pubacks(ids, now)
        if dec is None and is_one_packet(data) and len(data) <= b.small_packet_limit:
            # the common read, one whole small packet: no Decoder needed (stream_decoder)
            if len(data) == 2 and state == _CONNECTED:
                # just a PINGREQ or an empty DISCONNECT (a quiet or a leaving client's traffic):
                # answered without handle()'s dispatch
                if data == b"\xc0\x00":
                    return self.write(b"\xd0\x00")  # [MQTT-3.12.4-1] PINGRESP
                if data == b"\xe0\x00":
                    return self.on_disconnect(P.DISCONNECT_NORMAL)
            packets, error = decode_one(data, self.level, b.limits)
        else:
            if dec is None:
                dec = self.stream_decoder()
            packets, error = dec.feed(data)
        if error is not None and self.state == _NEW and not packets:
            self.connect_seen = data[:1] == b"\x10"
            self.level = _sniff_level(data)
        for pkt in packets:
            if self.state == _CLOSED or self.close_requested:
                return
            try:
                self.handle(pkt)
            except MQTTError as exc:
                self.violation(exc)
                return
        if error is not None and self.state != _CLOSED:
            # (the codec returns MalformedPacket or ProtocolError, typed Exception there)
            self.violation(error)  # type: ignore[arg-type]
        if self.state >= _AUTHENTICATING:  # (or _ADMITTING)
            self.deferred_bytes += len(data)
            if self.deferred_bytes > self.broker.max_deferred_bytes:
                self.refuse_deferred(f"more than {self.broker.max_deferred_bytes} bytes")

    def on_pubacks(self, ids: list[int], now: float) -> None:
        """PUBACKs (codec.puback_ids), as handle() takes each."""
        session = self.session
        for pid in ids:
            if self.state == _CLOSED or self.close_requested:
                return
            if session.acked(pid, 1, now) is False:
                self.violation(wrong_ack(P.PUBACK, pid))
                return

    def stream_decoder(self) -> Decoder:
        """The Decoder for reads that are not one whole small packet, made at the first: packets
        split across reads, several per read, or larger; with max_connect_packet_size until the
        CONNECT is accepted (connect_accepted())."""
        cfg = self.broker.cfg
        self.decoder = Decoder(self.level, cfg.maximum_packet_size,
                               None if self.state == _CONNECTED else cfg.max_connect_packet_size,
                               self.broker.limits)
        return self.decoder

    def buffered(self) -> int:
        """Bytes of an incomplete packet held."""
        return 0 if self.decoder is None else self.decoder.buffered()

    def handle(self, pkt: Any) -> None:
        t = pkt.type
        if self.state != _CONNECTED:
            if self.state >= _AUTHENTICATING:  # (or _ADMITTING)
                return self.defer(pkt)
            if t != P.CONNECT:  # [MQTT-3.1.0-1]
                raise ProtocolError("PUBLISH before CONNECT" if t == P.PUBLISH
                                    else "the first packet must be CONNECT")
            return self.on_connect(pkt)
        if t == P.PUBLISH:
            self.on_publish(pkt)
        elif t == P.PUBACK or t == P.PUBCOMP:
            qos = 1 if t == P.PUBACK else 2
            if self.session.acked(pkt.packet_id, qos, self.broker.clock()) is False:
                raise wrong_ack(t, pkt.packet_id)
        elif t == P.PUBREC:
            code = self.session.received(pkt.packet_id, pkt.reason_code, self.broker.clock())
            if code == -1:
                raise ProtocolError(f"PUBREC for packet id {pkt.packet_id}, a QoS 1 delivery")
            if code is not None:
                # [MQTT-4.3.3-4] PUBREL with the PUBLISH's id (none after a PUBREC >= 0x80)
                if code and self.max_packet_size < ACK_WITH_CODE:  # [MQTT-3.1.2-24]
                    return self.unsendable(P.PUBREL, ACK_WITH_CODE)
                if code == 0 and self.broker.durable and self.session.store is not None:
                    # [MQTT-4.3.3-6] once PUBREL is sent the PUBLISH never is again: it waits
                    # until the hooks providing barrier() hold the release (the cluster's
                    # checkpoint: a node that takes the session over sends PUBREL, not PUBLISH)
                    # (not counted against Receive Maximum, as a SUBACK)
                    self.hold((P.PUBREL << 24) | (pkt.packet_id << 8) | code, suback=True)
                else:
                    self.write(encode_ack(P.PUBREL, pkt.packet_id, code, None, self.level))
        elif t == P.PUBREL:
            self.on_pubrel(pkt)
        elif t == P.PINGREQ:
            self.write(b"\xd0\x00")  # [MQTT-3.12.4-1] PINGRESP
        elif t == P.DISCONNECT:
            self.on_disconnect(pkt)
        elif t == P.SUBSCRIBE:
            self.on_subscribe(pkt)
        elif t == P.UNSUBSCRIBE:
            self.on_unsubscribe(pkt)
        elif t == P.CONNECT:  # [MQTT-3.1.0-2]
            raise ProtocolError("second CONNECT on a connection")
        elif t == P.AUTH:
            raise ProtocolError("AUTH without an authentication method (none is configured)")
        else:
            raise ProtocolError(f"{P.TYPE_NAMES[t]} is not sent by clients")

    # ------------------------------------------------------------ CONNECT
    def on_connect(self, c: P.Connect) -> None:
        self.connect_seen = True
        b = self.broker
        cfg = b.cfg
        self.level = c.protocol_level
        props = c.properties or NO_PROPERTIES
        if props:  # [MQTT-3.1.2-24]: what the broker sends from now on, the CONNACK included
            self.max_packet_size = props.get(PR.MAXIMUM_PACKET_SIZE, NO_CLIENT_LIMIT)
        client_id = self.client_id = c.client_id  # (for log lines until accepted)
        refusal = client_id_refusal(client_id, self.level, c.clean_start, cfg.max_client_id_length)
        if refusal is not None:
            return self.refuse(*refusal)
        assigned = None
        if not client_id:
            client_id = assigned = self.client_id = b.new_client_id()  # [MQTT-3.1.3-6]
        refusal = login_refusal(c.username, props, identity=self.identity, anonymous_allowed=(
            c.username is not None or self.identity is not None or b.anonymous_remote
            or self.local()))
        if refusal is not None:
            return self.refuse(*refusal)
        if b.bans is not None:  # broker/admin/bans.py: 0x8A Banned (3.1.x: 5), before any hash
            why = b.bans(client_id, c.username if self.identity is None else self.identity,
                         self.peer)
            if why:
                return self.refuse(rc.BANNED, why)
        if self.identity is not None:
            if not self.identity:  # the listener takes the user from a certificate: none was shown
                return self.refuse(rc.NOT_AUTHORIZED, "this listener needs a client certificate "
                                   "(use_identity_as_username): connect with one")
            c.username = self.identity  # TLS client certificate authenticates (listener option)
        elif b.defer_auth and c.username is not None:
            # a user name may cost a slow password hash (with or without a password: unknown
            # users and missing passwords cost a dummy hash): unless the result is remembered
            # (no hash: reconnect storms), the caller checks it off the event loop
            # (AuthRequested) and calls auth_done(); CONNACK follows then
            cached = getattr(b.auth, "authenticate_cached", None)
            code = cached(client_id, c.username, c.password) if cached is not None else None
            if code is None:
                self.state = _AUTHENTICATING
                self.deferred = []
                self.deferred_bytes = 0
                self.emit(AuthRequested(c, client_id, assigned))
                return
            if code:
                return self.refuse(code, "not authorized" if code == rc.NOT_AUTHORIZED
                                   else "bad user name or password")
        elif b.auth is not ALLOW_ALL:
            code = b.auth.authenticate(client_id, c.username, c.password)
            if code:
                return self.refuse(code, "not authorized" if code == rc.NOT_AUTHORIZED
                                   else "bad user name or password")
        self.accept(c, client_id, assigned)

    def awaiting_auth(self) -> bool:
        """Whether the connection still waits for its password check (not closed meanwhile)."""
        return self.state == _AUTHENTICATING

    def defer(self, pkt: Any) -> None:
        deferred: list[Any] = self.deferred  # type: ignore[assignment]  # (a list while authenticating)
        if len(deferred) >= MAX_DEFERRED:
            return self.refuse_deferred(f"more than {MAX_DEFERRED} packets")
        deferred.append(pkt)

    def refuse_deferred(self, what: str) -> None:
        """[MQTT-3.1.4-6]: nothing after CONNECT is processed before it is accepted, so it waits
        in memory; past the limit: CONNACK 0x97 Quota exceeded (an implementation-imposed
        limit, 3.2.2.2) and close [MQTT-3.2.2-7]."""
        self.deferred = None
        self.refuse(rc.QUOTA_EXCEEDED, f"{what} sent before CONNACK "
                                       "(wait for CONNACK before sending more)")

    def auth_done(self, c: P.Connect, client_id: str, assigned: str | None, code: int,
                  why: str | None = None) -> Sequence[Any]:
        """The AuthRequested check finished (code 0: accepted): refuse, or accept and run what
        waited. Returns the events of what waited, like data_received()."""
        return self._resume(_AUTHENTICATING, c, client_id, assigned, code, why)

    def admit_done(self, c: P.Connect, client_id: str, assigned: str | None,
                   failure: str | None) -> Sequence[Any]:
        """The AdmitRequested token resolved: refuse (0x88 Server unavailable) with its failure,
        or go on with the CONNECT and what waited. Returns events, like data_received()."""
        return self._resume(_ADMITTING, c, client_id, assigned,
                            rc.SERVER_UNAVAILABLE if failure else 0, failure)

    def _resume(self, held: int, c: P.Connect, client_id: str, assigned: str | None, code: int,
                why: str | None) -> Sequence[Any]:
        if self.state != held:
            return NO_EVENTS  # the connection went away meanwhile
        self.state = _NEW
        waiting, self.deferred = self.deferred, None
        try:
            if code:
                self.refuse(code, why or ("not authorized" if code == rc.NOT_AUTHORIZED
                                          else "bad user name or password"))
                return self.take_events()
            self.accept(c, client_id, assigned, admitted=held == _ADMITTING)
            if self.state == _ADMITTING:  # admission holds it now: they wait on
                self.deferred = waiting
                return self.take_events()
            for pkt in waiting:  # type: ignore[union-attr]  # (a list while authenticating)
                if self.state != _CONNECTED or self.close_requested:
                    break
                self.handle(pkt)
        except MQTTError as exc:
            self.violation(exc)
        return self.take_events()

    def accept(self, c: P.Connect, client_id: str, assigned: str | None,
               admitted: bool = False) -> None:
        """CONNECT passed authentication: will checks, admission, session, CONNACK."""
        b = self.broker
        cfg = b.cfg
        v5 = self.level == P.MQTT_5
        props = c.properties or NO_PROPERTIES
        if c.will is not None:
            w = c.will
            if not w.topic or "+" in w.topic or "#" in w.topic:  # [MQTT-4.7.3-1], [MQTT-4.7.0-1]
                raise MalformedPacket("will topic is not a valid topic name", rc.TOPIC_NAME_INVALID)
            rt = w.properties.get(PR.RESPONSE_TOPIC) if w.properties else None
            if rt is not None and (not rt or "+" in rt or "#" in rt):  # [MQTT-3.3.2-14]
                raise ProtocolError("the will's Response Topic must be a topic name without "
                                    "wildcards")
            refusal = will_refusal(w, cfg.maximum_qos, cfg.retain_available)
            if refusal is not None:
                return self.refuse(*refusal)
        if assigned is None and b.auth is not ALLOW_ALL:
            code = b.auth.check_client_id(client_id, c.username)  # [MQTT-3.1.3-8]
            if code:
                return self.refuse(code, "client id not allowed for this user (auth.client_id_pattern)")
        old = b.session_of(client_id)
        if old is not None and cfg.session_owner_check and old.username != c.username:
            # A session belongs to the user that created it: another user may not resume it,
            # discard it (Clean Start 1) nor take over its connection (docs/security.md "Access control").
            return self.refuse(rc.NOT_AUTHORIZED, "this client id is in use by another user's session")
        if old is None and cfg.max_sessions and b.session_limit_reached(client_id):  # (3.2.2.2: 0x97)
            return self.refuse(rc.QUOTA_EXCEEDED, "the broker holds as many sessions as it may; "
                                                  "try again later")
        self.client_id = client_id
        self.username = c.username
        self.publish_check = needs_publish_check(b.auth, client_id, c.username)
        if props:  # else the defaults set in __init__ (max_packet_size: set in on_connect)
            self.receive_max = props.get(PR.RECEIVE_MAXIMUM, 65535)
            self.alias_max = props.get(PR.TOPIC_ALIAS_MAXIMUM, 0)
            self.request_problem_info = bool(props.get(PR.REQUEST_PROBLEM_INFORMATION, 1))
        if v5:
            self.connect_expiry = props.get(PR.SESSION_EXPIRY_INTERVAL, 0)
            expiry = b.granted_expiry(self.connect_expiry)
        else:  # 3.1.1: clean session 0 lasts mqtt.persistent_client_expiration
            expiry = 0 if c.clean_start else b.granted_expiry(NEVER, v5=False)
        keep_alive = c.keep_alive
        server_ka = None
        if v5 and cfg.server_keep_alive:
            keep_alive = server_ka = cfg.server_keep_alive
        elif keep_alive > cfg.max_keep_alive or (keep_alive == 0 and cfg.max_keep_alive < 65535):
            keep_alive = cfg.max_keep_alive
            server_ka = keep_alive if v5 else None
        self.keep_alive = keep_alive  # [MQTT-3.2.2-22] the client's unless CONNACK has Server Keep Alive

        # The CONNACK, sized before anything changes: it must fit the client's Maximum Packet Size
        # [MQTT-3.1.2-24] (a successful one has no Reason String or User Property to leave out,
        # [MQTT-3.2.2-19], [MQTT-3.2.2-20]); if it does not, the connection is closed unanswered
        ack_props: dict[int, Any] | None = None
        if v5 and not (assigned is None and (server_ka is None or cfg.server_keep_alive)
                       and (PR.SESSION_EXPIRY_INTERVAL not in props
                            or expiry == props[PR.SESSION_EXPIRY_INTERVAL])):
            ack_props = {}
            if assigned:
                ack_props[PR.ASSIGNED_CLIENT_IDENTIFIER] = assigned  # [MQTT-3.1.3-7], [MQTT-3.2.2-16]
            ack_props.update(b.capabilities)
            if server_ka is not None:
                ack_props[PR.SERVER_KEEP_ALIVE] = server_ka
            if PR.SESSION_EXPIRY_INTERVAL in props and expiry != props[PR.SESSION_EXPIRY_INTERVAL]:
                ack_props[PR.SESSION_EXPIRY_INTERVAL] = expiry
        if v5:
            size = len(b.connack(P.MQTT_5, False) if ack_props is None else
                       encode(P.Connack(False, 0, ack_props), P.MQTT_5))
            if size > self.max_packet_size:
                return self.unsendable(P.CONNACK, size)

        if b.admit is not None and not admitted:
            # the hook that admits CONNECTs (the cluster's claim on the client id) may hold it
            token = b.admit(client_id, c.clean_start, expiry, c.will, c.username, self.level)
            if type(token) is AdmitRefused:  # decided before any claim is made
                return self.refuse(token.code, token.why)
            if token is not None:
                if not token.done:
                    self.state = _ADMITTING  # what follows waits, as for a password check
                    self.deferred = []
                    self.deferred_bytes = 0
                    self.emit(AdmitRequested(token, c, client_id, assigned))
                    return
                if token.failure is not None:
                    return self.refuse(rc.SERVER_UNAVAILABLE, token.failure)
            old = b.session_of(client_id)  # the admission may have brought the session here
        # [MQTT-3.1.4-3]: a client already connected with this id is taken over
        if old is not None and old.connection is not None:
            old.connection.server_disconnect(rc.SESSION_TAKEN_OVER, "another connection used this client id",
                                       publish_will=True)
        session, present = b.open_session(client_id, c.clean_start)  # [MQTT-3.1.4-4]
        session.expiry_interval = expiry
        session.username = c.username
        session.link_level = self.level
        session.will = c.will  # [MQTT-3.1.2-7]
        if b.store is not None and expiry and session.store is None:
            session.store = b.store  # outlives the connection: keep it on disk
        self.session = session
        self.state = _CONNECTED
        # connected since the CONNECT arrived (not the TCP accept, ms earlier): the same float
        # as last_rx, 24 bytes less per idle connection
        self.connected_at = self.last_rx
        b.connections.file(self, self.next_check())  # its Keep Alive deadline, if it has one
        if self.decoder is not None:
            self.decoder.connect_accepted()  # max_connect_packet_size no longer applies

        # [MQTT-3.2.2-2], [MQTT-3.2.2-3]: session present only when resuming [MQTT-3.1.4-5]; MQTT
        # 3.1 has no such flag (its CONNACK's first byte is reserved): always 0 there
        if ack_props is None:  # v5: the broker's capabilities only
            self.write(b.connack(self.level, present and self.level != P.MQTT_31))
        else:
            self.write(encode(P.Connack(present, 0, ack_props), P.MQTT_5))
        session.connection = self
        if session.store is not None:  # (connected: the store may commit it with a later turn)
            session.store.save_session(session)
        if log.isEnabledFor(logging.DEBUG):  # self.peer makes a string: only when logged
            self.note(logging.DEBUG, "client %s connected from %s (level %d, session present %s)",
                      client_id, self.peer, self.level, present)
        if present:
            session.resume(b.clock())

    def refuse(self, code: int, why: str) -> None:
        """CONNACK with a failure code, then close [MQTT-3.2.2-6]."""
        self.note(logging.INFO, "refused connection %s from %s: %s (0x%02X)",
                  self.client_id or "(no client id)", self.peer, why, code)
        if self.level == P.MQTT_5:
            self.send_fitting(P.Connack(False, code, {PR.REASON_STRING: why}))
        else:
            self.write(encode(P.Connack(False, rc.v4_connack_code(code)), self.level))
        self.close(publish_will=False)

    def send_fitting(self, pkt: Any) -> bool:
        """Write a CONNACK, SUBACK, UNSUBACK, DISCONNECT (any packet with a Reason String) within
        the client's Maximum Packet Size [MQTT-3.1.2-24]: when larger, without its Reason String,
        then without its User Properties ([MQTT-3.2.2-19], [MQTT-3.2.2-20], [MQTT-3.9.2-1],
        [MQTT-3.9.2-2], [MQTT-3.11.2-1], [MQTT-3.11.2-2], [MQTT-3.14.2-3], [MQTT-3.14.2-4]).
        False, and nothing written, when it is still too large."""
        data = encode(pkt, self.level)
        limit = self.max_packet_size
        if len(data) > limit:
            for pid in (PR.REASON_STRING, PR.USER_PROPERTY):
                if pkt.properties and pid in pkt.properties:
                    pkt.properties = {k: v for k, v in pkt.properties.items() if k != pid} or None
                    data = encode(pkt, self.level)
                    if len(data) <= limit:
                        break
            if len(data) > limit:
                return False
        self.write(data)
        return True

    def unsendable(self, ptype: int, size: int) -> None:
        """A packet the broker must send is larger than the client's Maximum Packet Size even
        without optional properties: it is not sent [MQTT-3.1.2-24], and as the exchange cannot
        go on, the connection is closed (before CONNACK: unanswered, as Mosquitto does)."""
        self.note(logging.INFO, "closing %s (%s): its %s of %d bytes would exceed the Maximum "
                  "Packet Size of %d bytes the client set", self.client_id or "connection",
                  self.peer, P.TYPE_NAMES[ptype], size, self.max_packet_size)
        self.close(publish_will=True)

    # ------------------------------------------------------------ PUBLISH in
    def on_publish(self, p: P.Publish) -> None:
        b = self.broker
        cfg = b.cfg
        qos = p.qos
        props = p.properties
        topic = p.topic
        if qos > cfg.maximum_qos:  # [MQTT-3.2.2-11]
            raise ProtocolError(f"QoS {qos} above the maximum QoS {cfg.maximum_qos}",
                                rc.QOS_NOT_SUPPORTED)
        if p.retain and not cfg.retain_available:  # [MQTT-3.2.2-14]
            raise ProtocolError("retained messages are not available", rc.RETAIN_NOT_SUPPORTED)
        expires_at = None
        new_alias = 0  # an alias this PUBLISH maps to its Topic Name: set once the topic is accepted
        if props is not None:
            raw = props
            props = self.check_publish_properties(raw)
            if PR.TOPIC_ALIAS in raw:
                new_alias = raw[PR.TOPIC_ALIAS]
                topic = self.resolve_alias(topic, new_alias)
                if not p.topic:
                    new_alias = 0
            if PR.MESSAGE_EXPIRY_INTERVAL in raw:
                expires_at = b.clock() + raw[PR.MESSAGE_EXPIRY_INTERVAL]
        if not topic:  # [MQTT-4.7.3-1]
            raise ProtocolError("PUBLISH with an empty topic and no topic alias")
        if "+" in topic or "#" in topic:  # [MQTT-3.3.2-2]
            raise ProtocolError("topic name contains a wildcard", rc.TOPIC_NAME_INVALID)
        pid = p.packet_id or 0  # (None only for QoS 0, then unused: QoS 1/2 have one [MQTT-2.2.1-3])
        session = self.session
        if qos:
            if qos == 2 and pid in session.inflight_in:
                # [MQTT-4.3.3-10]: a repeat before PUBREL is acknowledged, not delivered again
                self.write(encode_ack(P.PUBREC, pid, 0, None, self.level))
                return
            unsure = session.qos2_unsure
            if unsure and pid in unsure:  # (a session rebuilt from an older state: the cluster)
                unsure.discard(pid)
                if qos == 2 and p.dup:  # a resend [MQTT-3.3.1-1] of one that awaits its PUBREL
                    session.qos2_received(pid)
                    if session.store is not None:
                        session.store.qos2_add(session.client_id, pid)
                    self.write(encode_ack(P.PUBREC, pid, 0, None, self.level))
                    return
                # DUP 0: the client released the id since and reuses it: a new message
            if len(session.inflight_in) + self.pending_acks >= cfg.receive_maximum:
                raise ProtocolError("more unacknowledged QoS 1/2 PUBLISHes than Receive Maximum",
                                    rc.RECEIVE_MAXIMUM_EXCEEDED)  # [MQTT-3.3.4-7]
            if qos == 1 and pid in session.inflight_in:
                self.ack(qos, pid, rc.PACKET_IDENTIFIER_IN_USE)
                return
        n = len(topic)  # (a topic shorter than max_topic_levels has fewer levels: not counted)
        if n > cfg.max_topic_length or n >= cfg.max_topic_levels and topic.count("/") >= cfg.max_topic_levels:
            b.stats["dropped_topic_limit"] = b.stats.get("dropped_topic_limit", 0) + 1
            if new_alias:
                self.forget_alias(new_alias)
            return self.ack(qos, pid, rc.TOPIC_NAME_INVALID) if qos else None
        b.received_by_qos[qos] += 1
        if topic[0] == "$" and topic.startswith("$SYS") or \
                self.publish_check and not b.auth.allow_publish(self.client_id, self.username, topic):
            # $SYS belongs to the broker: clients may not publish there (as Mosquitto)
            b.stats["dropped_not_authorized"] = b.stats.get("dropped_not_authorized", 0) + 1
            if new_alias:
                self.forget_alias(new_alias)
            return self.ack(qos, pid, rc.NOT_AUTHORIZED) if qos else None
        if new_alias:
            self.map_alias(new_alias, topic)
        if (props is not None and props.get(PR.PAYLOAD_FORMAT_INDICATOR) == 1
                and cfg.validate_payload_format):
            try:
                p.payload.decode("utf-8")
            except UnicodeDecodeError:
                if qos == 0:
                    raise ProtocolError("payload is not UTF-8 as its Payload Format Indicator says",
                                        rc.PAYLOAD_FORMAT_INVALID)
                return self.ack(qos, pid, rc.PAYLOAD_FORMAT_INVALID)
        msg = Message(topic, p.payload, qos, p.retain, props, expires_at, self.client_id, b.wall())
        received = p.raw
        if received is not None and props is p.properties and received[0] & 0x08 == 0 \
                and (qos == 0 or not p.retain):
            # as received (DUP 0), nothing altered: subscribers on the same form get these bytes,
            # QoS 1/2 with their packet id patched in as in any form (Message.encoded): no encode
            # (bench/core_bench.py --instructions: qos1_fanin 47,207 -> 44,250 per delivery). Not
            # a retained QoS 1/2 one: the retained store would hold its bytes twice until sent
            # (bench/retained_cap.py)
            msg.forms[(True, qos, p.retain, None, None, 0, True) if self.level == 5
                      else (False, qos, p.retain)] = (
                received, P.publish_pid_offset(received, len(msg.topic_bytes)) if qos else -1)
        retain = p.retain
        if retain and p.payload and not b.retained_fits(msg):
            # mqtt.max_retained_*: v5 QoS 1/2 are refused (0x97 Quota exceeded, 3.3.4); QoS 0 and
            # 3.1.x, which have no failure code, are delivered without being retained
            b.retained_refused(msg, self, self.client_id)
            if qos and self.level == P.MQTT_5:
                return self.ack(qos, pid, rc.QUOTA_EXCEEDED)
            retain = False
        if b.accepting and not b.offer(msg, self.client_id, self.username, self.level):
            return self.ack(qos, pid, rc.QUOTA_EXCEEDED) if qos else None
        if qos == 2:  # (before routing: a routing hook may record the id with the message)
            session.qos2_received(pid)
            if session.store is not None:
                session.store.qos2_add(session.client_id, pid)
        # b.publish(msg, session), inline: this is the per-message path
        hook = b.router_hook
        if hook is None:
            if retain:  # [MQTT-3.3.1-8] RETAIN 0: nothing stored, replaced or removed
                b.retain(msg)
            n = b.route(msg, session)
        else:
            hook(msg, session)  # the cluster: through its log, then Broker.deliver() on every node
            n = -1
        if qos:
            self.ack(qos, pid, rc.SUCCESS if n else rc.NO_MATCHING_SUBSCRIBERS)

    def ack(self, qos: int, pid: int, code: int) -> None:
        if self.level != P.MQTT_5:
            code = 0
        ptype = P.PUBACK if qos == 1 else P.PUBREC
        if code and self.max_packet_size < ACK_WITH_CODE:  # [MQTT-3.1.2-24]
            return self.unsendable(ptype, ACK_WITH_CODE)
        if code < 0x80 and self.broker.durable:
            # sent by the caller once the hooks providing barrier() say the message is durable
            # (the ack gate calls acks_done, which encodes it); hold(), inline for the read's
            # later acks
            ev = self.events
            if ev is not None:
                held = ev[-1]
                if type(held) is AcksHeld:
                    held.acks.append((ptype << 24) | (pid << 8) | code)  # events.held_ack
                    self.pending_acks += 1
                    return
            self.hold((ptype << 24) | (pid << 8) | code)
        else:
            self.write(encode_ack(ptype, pid, code, None, self.level))

    def check_publish_properties(self, props: dict[int, Any]) -> dict[int, Any] | None:
        """Validate a client PUBLISH's properties; return those forwarded unaltered."""
        if PR.SUBSCRIPTION_IDENTIFIER in props:  # [MQTT-3.3.4-6]
            raise ProtocolError("a client PUBLISH must not carry a Subscription Identifier")
        rt = props.get(PR.RESPONSE_TOPIC)
        if rt is not None and (not rt or "+" in rt or "#" in rt):  # [MQTT-3.3.2-14]
            raise ProtocolError("Response Topic must be a topic name without wildcards")
        if PR.TOPIC_ALIAS in props or PR.MESSAGE_EXPIRY_INTERVAL in props:
            props = {k: v for k, v in props.items()
                     if k != PR.TOPIC_ALIAS and k != PR.MESSAGE_EXPIRY_INTERVAL}
            return props or None
        return props

    def resolve_alias(self, topic: str, alias: int) -> str:
        """Inbound Topic Alias (3.3.2.3.4): the topic a PUBLISH names. A Topic Name with an alias
        is mapped by map_alias() only once the topic is accepted (valid, allowed by the ACL)."""
        if alias == 0 or alias > self.broker.cfg.topic_alias_maximum:  # [MQTT-3.3.2-8], [MQTT-3.3.2-9]
            raise ProtocolError(f"topic alias {alias} is outside 1..{self.broker.cfg.topic_alias_maximum}",
                                rc.TOPIC_ALIAS_INVALID)
        if topic:
            return topic
        known = self.in_aliases.get(alias)
        if known is None:
            raise ProtocolError(f"topic alias {alias} has no mapping on this connection (never "
                                "set, or the PUBLISH setting it was refused)")
        return known

    def map_alias(self, alias: int, topic: str) -> None:
        """Set or replace the mapping [MQTT-3.3.2-12]. The topics one connection's aliases hold are
        bounded by mqtt.max_topic_alias_bytes: beyond it DISCONNECT 0x97 Quota exceeded."""
        old = self.in_aliases.get(alias)
        if old == topic:
            return
        size = self.in_alias_bytes + len(topic) - (len(old) if old else 0)
        limit = self.broker.cfg.max_topic_alias_bytes
        if limit and size > limit:
            raise ProtocolError(f"topic alias {alias} would make this connection's aliases hold "
                                f"{size} bytes of topics, more than {limit} "
                                "(mqtt.max_topic_alias_bytes): reuse aliases or send topic names",
                                rc.QUOTA_EXCEEDED)
        if self.in_aliases is NO_ENTRIES:
            self.in_aliases = {}
        self.in_aliases[alias] = topic
        self.in_alias_bytes = size

    def forget_alias(self, alias: int) -> None:
        """A PUBLISH mapping `alias` was refused for its topic: the alias maps nothing now, so
        later PUBLISHes using it alone are not sent to an earlier topic."""
        old = self.in_aliases.pop(alias, None) if self.in_aliases else None
        if old is not None:
            self.in_alias_bytes -= len(old)

    def on_pubrel(self, pkt: P.Ack) -> None:
        session = self.session
        ids = session.inflight_in
        unsure = session.qos2_unsure
        if pkt.packet_id in ids or unsure and pkt.packet_id in unsure:
            # (never in NO_IDS: a session's own set once any was awaited)
            (ids if pkt.packet_id in ids else unsure).remove(pkt.packet_id)  # [MQTT-4.3.3-12] free again
            code = rc.SUCCESS
            if session.store is not None:
                session.store.qos2_remove(session.client_id, pkt.packet_id)
        else:  # not awaited
            code = rc.PACKET_IDENTIFIER_NOT_FOUND  # 0x92
        if code and self.max_packet_size < ACK_WITH_CODE:  # [MQTT-3.1.2-24]
            return self.unsendable(P.PUBCOMP, ACK_WITH_CODE)
        if code == 0 and self.broker.durable and session.store is not None:
            # the client may reuse the id once PUBCOMP came: the hooks providing barrier() hold
            # its release first, so a broker that takes the session over never takes a reuse of
            # it for a resend of the message released [MQTT-4.3.3-9]
            self.hold((P.PUBCOMP << 24) | (pkt.packet_id << 8) | code, suback=True)
        else:
            self.write(encode_ack(P.PUBCOMP, pkt.packet_id, code, None, self.level))  # [MQTT-4.3.3-11]

    # ------------------------------------------------------------ SUBSCRIBE
    def on_subscribe(self, s: P.Subscribe) -> None:
        b = self.broker
        cfg = b.cfg
        v5 = self.level == P.MQTT_5
        sub_id = None
        if s.properties and PR.SUBSCRIPTION_IDENTIFIER in s.properties:
            sub_id = s.properties[PR.SUBSCRIPTION_IDENTIFIER][0]
        size = _ack_size(len(s.topics), v5)
        if size > self.max_packet_size:  # [MQTT-3.1.2-24]: its SUBACK could not be sent
            return self.unsendable(P.SUBACK, size)
        codes = []
        # filter -> (send retained, new before this packet, topic filter, qos, sub ids): a filter
        # repeated in one SUBSCRIBE replaces the earlier one [MQTT-3.8.4-3], so it is stored and
        # its retained messages sent once, with the last occurrence's options
        subscribed: dict[str, tuple[bool, bool, str, int, tuple[int] | None]] = {}
        session = self.session
        why = None  # a Reason String for the SUBACK (a refused history replay says why)
        # a history replay filter repeated in this packet is one subscription [MQTT-3.8.4-3]:
        # only its last occurrence (its options win) goes to the replay hook, which starts a
        # replay per call; the earlier ones get its code
        replays: dict[str, int] = {}
        try:
            for i, (filt, o) in enumerate(s.topics):
                if filt.startswith(REPLAY_PREFIX):  # a history replay: the replay hook's (hooks.py)
                    if not replays:
                        replays = {f: j for j, (f, _) in enumerate(s.topics)
                                   if f.startswith(REPLAY_PREFIX)}  # (each filter's last index)
                    if replays[filt] != i:
                        codes.append(-1)  # (its last occurrence's code, below)
                        continue
                    code, why = self.subscribe_replay(filt, o, sub_id, why)
                else:
                    code = self.subscribe_one(filt, o, sub_id, subscribed)
                    if code == rc.QUOTA_EXCEEDED and why is None:
                        why = self.quota_reason(filt)
                # [MQTT-3.9.3-1] in filter order, [MQTT-3.9.3-2] a Subscribe Reason Code each
                codes.append(code if v5 or code < 0x80 else 0x80)
        finally:
            if session.store is not None:
                for filt in subscribed:
                    session.store.save_subscription(session.client_id, session.subscriptions[filt])
        if replays and len(replays) < len(codes):
            for i, (filt, _) in enumerate(s.topics):
                if codes[i] < 0:
                    codes[i] = codes[replays[filt]]
        # one code per filter [MQTT-3.8.4-6]; a Reason String [MQTT-3.1.2-29] only if it fits
        # (send_fitting: [MQTT-3.1.2-24]; the SUBACK without it does, checked above)
        suback = P.Suback(s.packet_id, codes,
                          {PR.REASON_STRING: why} if why and v5 and self.request_problem_info else None)
        if b.durable and subscribed and session.store is not None:
            # a persistent session's subscriptions are acknowledged once they are durable (the
            # hooks providing barrier(): the store's commit, the cluster's Kafka write)
            self.hold(suback, suback=True)
        else:
            self.send_fitting(suback)
        now = b.clock()
        budget = None
        for filt, (send, _, topic_filter, qos, sid) in subscribed.items():
            if not send:
                continue
            if budget is None:
                budget = RetainedBudget(cfg.max_retained_replay)
            # [MQTT-3.3.1-9]: sent with RETAIN=1, paced like other traffic (Session.pump); the
            # ACL's deny rules of this client checked per message (docs/security.md "Access control")
            session.deliver_retained(b.retained_matching(topic_filter), qos, sid,
                                    session.subscriptions[filt].read_check, budget, now)

    def quota_reason(self, filt: str) -> str:
        """The SUBACK's Reason String for a filter refused with 0x97 (the first one only)."""
        shared = parse_shared(filt)  # (valid: refused for a quota)
        cfg, session = self.broker.cfg, self.session
        cap = cfg.max_subscriptions_per_client
        over = ("max_subscriptions_per_client" if cap and len(session.subscriptions) >= cap
                else self.broker.subscription_over(session, filt, shared[1] if shared else filt))
        what = f"mqtt.{over}" if over else "a subscription limit"
        return (f"{filt[:80]}: {what} reached (docs/conformance.md \"Subscription limits\"); "
                "unsubscribe some filters first")

    def subscribe_replay(self, filt: str, o: P.SubscriptionOptions, sub_id: int | None,
                         why: str | None) -> tuple[int, str | None]:
        """A "$replay/..." filter (docs/history.md "Replay over MQTT"): the replay hook checks and installs
        it; without one it is refused, saying why. (code, the SUBACK's Reason String so far)."""
        hook = self.broker.replay_hook
        if hook is None:
            return rc.IMPLEMENTATION_SPECIFIC_ERROR, (
                f"{filt}: history replay is not available on this broker: it needs the analytics "
                "sink ([sink] enabled) and the history job's table")
        code, reason = hook(self, filt, o, sub_id)
        return code, reason or why

    def subscribe_one(self, filt: str, o: P.SubscriptionOptions, sub_id: int | None,
                      subscribed: dict[str, tuple[bool, bool, str, int, tuple[int] | None]]) -> int:
        b = self.broker
        cfg = b.cfg
        try:
            shared = parse_shared(filt)
        except ValueError:
            return rc.TOPIC_FILTER_INVALID
        group, topic_filter = shared if shared else (None, filt)
        if (not valid_topic_filter(topic_filter) or topic_filter.count("/") >= cfg.max_topic_levels
                or len(topic_filter) > cfg.max_topic_length):
            return rc.TOPIC_FILTER_INVALID
        if group is not None:
            if not cfg.shared_subscription_available:
                return rc.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
            if o.no_local:  # [MQTT-3.8.3-4]
                raise ProtocolError("No Local on a shared subscription")
        if not cfg.wildcard_subscription_available and ("+" in topic_filter or "#" in topic_filter):
            return rc.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED
        if sub_id is not None and not cfg.subscription_identifiers_available:
            return rc.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED
        if not b.auth.allow_subscribe(self.client_id, self.username, filt):
            return rc.NOT_AUTHORIZED
        qos = min(o.qos, cfg.maximum_qos)
        session = self.session
        existed = filt in session.subscriptions
        if not existed:
            if (cfg.max_subscriptions_per_client
                    and len(session.subscriptions) >= cfg.max_subscriptions_per_client):
                return rc.QUOTA_EXCEEDED
            # the filters' bytes and wildcard levels, of this session and of all (Broker.
            # subscription_over, docs/conformance.md "Subscription limits")
            over = b.subscription_over(session, filt, topic_filter)
            if over is not None:
                self.note(logging.INFO, "%s: SUBSCRIBE of %s refused (0x97): mqtt.%s reached",
                          self.client_id, filt, over)
                return rc.QUOTA_EXCEEDED
        v5 = self.level == P.MQTT_5
        sub = Subscription(filt, topic_filter, group, qos, o.no_local and v5,
                           o.retain_as_published and v5, o.retain_handling if v5 else 0,
                           sub_id, session)
        sub.read_check = b.auth.needs_read_check(self.client_id, self.username, filt)
        if existed:
            b.remove_subscription(session.subscriptions[filt])
        session.add_subscription(sub)
        b.add_subscription(sub, existed)
        earlier = subscribed.get(filt)
        new = not existed if earlier is None else earlier[1]  # new before this SUBSCRIBE
        # Retain Handling: 0 send [MQTT-3.3.1-9], 1 send if new [MQTT-3.3.1-10], 2 don't
        # [MQTT-3.3.1-11]; never for shared
        send = group is None and (o.retain_handling == 0 or (o.retain_handling == 1 and new))
        subscribed[filt] = (send, new, topic_filter, qos, (sub_id,) if sub_id else None)
        return qos

    def on_unsubscribe(self, u: P.Unsubscribe) -> None:
        v5 = self.level == P.MQTT_5
        size = _ack_size(len(u.topics) if v5 else 0, v5)
        if size > self.max_packet_size:  # [MQTT-3.1.2-24]: its UNSUBACK could not be sent
            return self.unsendable(P.UNSUBACK, size)
        codes = []
        session = self.session
        for filt in u.topics:
            sub = session.drop_subscription(filt)  # [MQTT-3.10.4-1] exact match
            if sub is None:
                # a filter no SUBSCRIBE could have made ("#/a", "a/b#", "$share/g"): 0x8F, as
                # its SUBACK would have said, rather than "no subscription existed" (README
                # "Conformance notes": Mosquitto closes the connection instead, 0x81)
                codes.append(rc.NO_SUBSCRIPTION_EXISTED if _filter_well_formed(filt)
                             else rc.TOPIC_FILTER_INVALID)
            else:
                self.broker.remove_subscription(sub)  # [MQTT-3.10.4-2]
                codes.append(rc.SUCCESS)
                if session.store is not None:
                    session.store.delete_subscription(session.client_id, filt)
        # [MQTT-3.10.4-4] [MQTT-3.10.4-5] always an UNSUBACK, same id; [MQTT-3.10.4-6] one for all
        # filters; [MQTT-3.11.3-1] codes in filter order
        self.write(encode(P.Unsuback(u.packet_id, codes), self.level))

    # ------------------------------------------------------------ DISCONNECT / errors
    def on_disconnect(self, d: P.Disconnect) -> None:
        props = d.properties
        if props and PR.SESSION_EXPIRY_INTERVAL in props:
            if self.connect_expiry == 0 and props[PR.SESSION_EXPIRY_INTERVAL]:  # (section 3.14.2.2.2)
                raise ProtocolError("Session Expiry Interval set on DISCONNECT after 0 at CONNECT")
            # capped like the CONNECT's: mqtt.session_expiry_maximum
            self.session.expiry_interval = self.broker.granted_expiry(props[PR.SESSION_EXPIRY_INTERVAL])
        # (3.14.4: the Server closes the Network Connection.) Not marked dirty: with nothing to
        # write the caller closes at once, after this read; output already waiting made the
        # connection dirty, and the flush closes it after writing
        self.close_requested = CLIENT_DONE
        # [MQTT-3.14.4-3]: DISCONNECT 0x00 (and any 3.1.1 DISCONNECT, whose code is 0) discards
        # the will; [MQTT-3.1.2-8]: any other code (0x04, or an error such as 0x80) keeps it
        self.finish(publish_will=d.reason_code != rc.SUCCESS)

    def violation(self, exc: MQTTError) -> None:
        """A malformed packet or protocol error ends only this connection [MQTT-4.13.1-1] (4.13)."""
        code = exc.reason_code
        self.note(logging.INFO, "closing %s (%s): %s (0x%02X %s)", self.client_id or "connection",
                  self.peer, exc, code, rc.name(code))
        if self.state == _NEW:
            if code == rc.UNSUPPORTED_PROTOCOL_VERSION:
                # the client may not understand v5: answer with a 3.1.1 CONNACK, code 1
                self.write(b"\x20\x02\x00\x01")
            elif self.connect_seen and self.level == P.MQTT_5:
                self.send_fitting(P.Connack(False, code, {PR.REASON_STRING: str(exc)}))
            self.close(publish_will=False)
        else:
            why = str(exc)
            if code == rc.UNSUPPORTED_PROTOCOL_VERSION:
                # a second CONNECT with an unknown level: Protocol Error [MQTT-3.1.0-2]
                # (0x84 is a CONNACK-only reason code, not valid in DISCONNECT, 3.14.2.1)
                code = rc.PROTOCOL_ERROR
                why = f"second CONNECT on a connection ({why})"
            self.server_disconnect(code, why, publish_will=True)

    def server_disconnect(self, code: int, why: str, publish_will: bool = True,
                          reference: str | None = None) -> None:
        """DISCONNECT with a reason code (v5) and close; 3.1.x connections are just closed.
        `reference`: a Server Reference (4.11) telling the client where to go instead."""
        if self.state == _CLOSED:
            return
        if self.level == P.MQTT_5 and self.state == _CONNECTED:
            props = {PR.REASON_STRING: why} if why and self.request_problem_info else None
            if reference:
                props = {**(props or {}), PR.SERVER_REFERENCE: reference}
            self.send_fitting(P.Disconnect(code, props))  # (too large even bare: just closed)
        self.close(publish_will)

    def close(self, publish_will: bool) -> None:
        """End the connection: the server closes the socket after writing `out`."""
        if self.state == _CLOSED:
            return
        self.close_requested = BROKER_ENDS
        self.finish(publish_will)
        if not self.is_dirty:
            self.is_dirty = True
            self.broker.mark_dirty(self)

    def connection_lost(self) -> None:
        """The socket closed (by either side)."""
        self.finish(publish_will=True)

    def finish(self, publish_will: bool) -> None:
        if self.state == _CLOSED:
            return
        was_connected = self.state == _CONNECTED
        self.state = _CLOSED
        b = self.broker
        b.connections.remove(self)
        session = self.session
        if was_connected and session is not None and session.connection is self:
            b.connection_closed(session, publish_will, b.clock())

    def next_check(self) -> float | None:
        """When check_timeouts() may next act: the CONNECT deadline, then 1.5 x Keep Alive
        after the last packet; None when nothing can time out (Keep Alive 0, a password being
        checked, closed)."""
        if self.state == _NEW:
            return self.connected_at + self.broker.cfg.connect_timeout
        if self.state == _CONNECTED and self.keep_alive:
            return self.last_rx + self.keep_alive * 1.5
        return None

    def look_at(self, now: float) -> None:
        """Its deadline came (Broker.tick): time it out, or file it again for the next."""
        self.check_timeouts(now)
        if self.state != _CLOSED:
            self.broker.connections.file(self, self.next_check())

    def check_timeouts(self, now: float) -> None:
        if self.state == _NEW:
            if now - self.connected_at > self.broker.cfg.connect_timeout:
                self.note(logging.INFO, "no CONNECT from %s within %ss", self.peer,
                          self.broker.cfg.connect_timeout)
                self.close(publish_will=False)
        elif self.keep_alive and now - self.last_rx > self.keep_alive * 1.5:  # [MQTT-3.1.2-22]
            self.server_disconnect(rc.KEEP_ALIVE_TIMEOUT, "keep alive timeout", publish_will=True)


def wrong_ack(ptype: int, pid: int) -> ProtocolError:
    """A PUBACK or PUBCOMP that is not the one its message's flow waits for (Session.acked())."""
    return ProtocolError(f"{P.TYPE_NAMES[ptype]} for packet id {pid}, whose delivery waits for "
                         "another acknowledgement")


def _filter_well_formed(filt: str) -> bool:
    """Whether a SUBSCRIBE could have made this filter, shared or not [MQTT-4.7.1-1],
    [MQTT-4.7.1-2], [MQTT-4.8.2-1]."""
    try:
        shared = parse_shared(filt)
    except ValueError:
        return False
    return valid_topic_filter(shared[1] if shared else filt)


def _ack_size(codes: int, v5: bool) -> int:
    """Bytes of a SUBACK / UNSUBACK with `codes` reason codes and no properties."""
    body = 2 + (1 if v5 else 0) + codes
    return 1 + len(encode_vbi(body)) + body


def is_loopback(peer: str) -> bool:
    """Whether a connection's `peer` ("host:port", "ws:host:port") is a loopback address (this
    machine); False when it cannot be told."""
    return loopback_host((peer[3:] if peer.startswith("ws:") else peer).rpartition(":")[0])


def loopback_host(host: object) -> bool:
    """Whether an address (a string, as sockets give it) is a loopback address."""
    if not isinstance(host, str):
        return False
    if host.startswith("127.") or host == "::1":
        return True  # the usual case, without parsing
    import ipaddress  # (loaded at the first other address: not in a broker that sees none)
    try:
        ip = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack listener
    return bool((mapped or ip).is_loopback)


def _sniff_level(data: bytes) -> int:
    """Protocol level of a CONNECT that failed to decode, to answer in the client's version."""
    i = 1
    while i < len(data) and i < 5 and data[i] & 0x80:
        i += 1
    i += 1
    if i + 2 <= len(data):
        n = (data[i] << 8) | data[i + 1]
        if i + 2 + n < len(data):
            return data[i + 2 + n]
    return P.MQTT_311
