"""A cluster node: the broker hook that makes one broker of many processes (README "Cluster").

Attached like the state store and the sink (core/hooks.py), it provides:

* route: every accepted message goes to the messages topic (key = MQTT topic: per-topic order)
  and, when retained, to the retained topic; it is delivered at once to this node's own
  subscribers (in its publisher's order, across topics), and every other node reads the
  messages topic and delivers each record to its own subscribers (Broker.deliver), so a message
  published anywhere reaches every matching subscriber. This node skips its own records when it
  reads them back (cluster/held.py); a session rebuilt here before that gets them from those held.
* barrier: a QoS 1/2 PUBLISH is acknowledged once Kafka acknowledged its record (acks=all).
* admit: a CONNECT writes a claim on its client id to the control topic and waits for it to be
  applied; the last claim in the log owns the client id (cluster/control.py, cluster/claims.py).
  A session that lived on another node is rebuilt here from its last checkpoint and the
  messages topic (cluster/rebuild.py).
* the persistence events: persistent sessions' checkpoints (subscriptions, the log positions
  below which everything was delivered and acknowledged, in-flight packet ids) go to the control
  topic, so a session survives the node it was on, SIGKILL included (cluster/checkpoints.py).
* timers of sessions whose node is gone (wills, expiry) are fired by one live node
  (cluster/membership.py, with the heartbeats).
* bans: a ban made through any node's admin API is a control record every node applies.

Every record it writes is signed with the cluster's key and every record it reads must be
(cluster/trust.py); a record that is not, or whose content is malformed (cluster/records.py),
is ignored and counted (stats: ignored_*). What it reads is applied by cluster/reading.py;
which records are copies of one read, by cluster/copies.py; after Kafka lost its data, what is
written again comes from cluster/keep.py and cluster/recovery.py (_recover tells each part).

This class is the facade the broker sees: each part above has its own state and is given
callables and values, not the node (handover.give still takes it; the share streams see it
through the ShareHost protocol); the node wires them and forwards the hook's calls.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable

from broker.core.durability import Pending
from broker.core.hooks import SESSION_EVENTS, STORED_EVENTS, AdmitRefused, Hook
from broker.core.session import Session
from kafka_client.fetch import Fetcher
from kafka_client.headers import H_MESSAGE_ID
from kafka_client.recordscan import Scanned

from . import control as C
from . import handover, recovery
from . import records as R
from .checkpoints import Checkpoints, Handle
from .claims import Claims
from .copies import Copies
from .held import Held
from .interest import Interest
from .keep import BATCH, FAILED, MARK, Entry, Keep
from .link import FetchReader, Topics, ensure_topics
from .membership import Membership
from .produce import Producer
from .reading import Reading
from .rebuild import Rebuild
from .shares import Shares
from .trust import REPLAYED, Trust

if TYPE_CHECKING:
    from broker.admin.bans import BanList
    from broker.core.hookhost import HookHost
    from broker.core.message import Message
    from broker.core.session import Subscription
    from broker.protocol.packets import Will
    from settings import ClusterConfig

log = logging.getLogger(__name__)

NEVER = 0xFFFFFFFF


class _Batch:
    """Records produced since the last barrier(): its token resolves when all are acknowledged."""
    __slots__ = ("count", "token", "failure")

    def __init__(self) -> None:
        self.count = 0
        self.token: Pending | None = None
        self.failure: str | None = None


class ClusterNode(Hook):
    provides = frozenset(("route", "admit", "locate", "install", "barrier", "on_start", "on_turn_end", "on_tick",
                          "on_stop", "stats", "on_client_connected", "on_client_disconnected")
                         + SESSION_EVENTS + STORED_EVENTS)

    def __init__(self, cfg: ClusterConfig, bootstrap: str, wall: Callable[[], float] = time.time,
                 key: bytes | None = None, key_made: str | None = None) -> None:
        """`key`: the cluster's key (settings.secrets.cluster_key; None: a key of this node
        alone, for a node that is its own cluster, as in tests); `key_made`: the file of a key
        made by this start (a node that joins a cluster whose records are signed with another
        key then stops, saying which file to replace)."""
        if not cfg.node_id:
            raise ValueError("cluster.node_id is empty: give each node an id of its own, "
                             "e.g. --set cluster.node_id=n1")
        if not bootstrap:
            raise ValueError("the cluster needs a Kafka every node reaches: --kafka-bootstrap "
                             "HOST:PORT or cluster.bootstrap_servers (README \"Cluster\")")
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.node = cfg.node_id
        self.inc = uuid.uuid4().hex[:12]
        self.topics = Topics(cfg.topic_prefix)
        self.wall = wall
        self.trust = Trust(key if key is not None else os.urandom(32))
        self.key_made = key_made
        self.bans: BanList | None = None  # the server's ban list (share_bans())
        # set by attach() / on_start(), before anything else here runs (on_stop() may run
        # without them: it checks); of the core's Broker, only what HookHost lists
        self.broker: HookHost = None  # type: ignore[assignment]  # attach()
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # on_start()
        self.state: C.ControlState = None  # type: ignore[assignment]  # on_start()
        self.partitions = cfg.partitions
        self.producer: Producer = None  # type: ignore[assignment]  # on_start()
        self.fetcher: Fetcher = None  # type: ignore[assignment]  # on_start()
        self.reader: FetchReader | None = None
        self.batch: _Batch | None = None
        self.last_token: Pending | None = None  # of the last batch barrier() handed out
        self.routed_upto: dict[int, int] = {}    # messages partition -> next offset to deliver
        self.ids = itertools.count(1)
        self.seq = itertools.count(1)            # of the control records written (control.py)
        self.counters = {"produced": 0, "read": 0, "delivered": 0, "claims": 0, "takeovers": 0,
                         "rebuilt_sessions": 0, "rebuilt_messages": 0, "wills_fired": 0,
                         "evictions": 0, "produce_errors": 0, "resent": 0, "resent_skipped": 0,
                         "deliver_failed": 0, "rebuild_behind": 0}
        # heartbeats, evictions, the timers of sessions whose node is gone
        self.membership = Membership(cfg, wall, lambda: self.state, self._write_control,
                                     lambda: self.routed_upto, lambda floor: self.keep.trim(floor),
                                     self.counters)
        # what this node wrote and not every node has read: written again if Kafka loses it
        self.keep = Keep(cfg.keep_bytes, cfg.keep_seconds, time.monotonic,
                         self.membership.read_floor)
        # the message ids read: which records are copies of one read before (replays, and
        # the messages written again after Kafka lost its data)
        self.copies = Copies(self.trust, self.counters)
        # the persistent sessions held here: their state records, written at turn ends
        self.checkpoints = Checkpoints(cfg, wall, lambda: self.state, self._write_control,
                                       lambda: self.routed_upto,
                                       lambda: f"{self.node}-{self.inc}-{self.last_mid}")
        # the messages accepted here, delivered here at once, until read back
        self.held = Held(cfg, self.topics.messages, lambda: self.producer, lambda: self.routed_upto,
                         lambda: self.reading.waiting_subs, lambda: f"{self.node}-{self.inc}".encode(),
                         self.copies, self.counters)
        # what this node reads of its topics, and the new subscriptions starting
        self.reading = Reading(self.topics, self.trust, self.copies, self.held, self.counters, wall,
                               lambda: self.routed_upto, self._apply_control)
        # sessions that lived on another node, rebuilt here
        self.rebuilds = Rebuild(cfg, bootstrap, self.topics.messages, wall, self.trust,
                                self.checkpoints, self.counters, lambda: self.routed_upto,
                                self.held.held_for, self.on_message_stored, self.reading.decode,
                                lambda: self.loop, self._messages_end, self._claim_current)
        # the CONNECTs waiting for their claims on their client ids
        self.claims = Claims(cfg, wall, lambda: self.state, self._write_control,
                             lambda: next(self.ids), self.rebuilds.rebuild, self.counters)
        self.qos2_in: set[str] = set()           # sessions with inbound QoS 2 ids new this read
        self.qos2_pid: tuple[str, int] | None = None  # (client id, packet id) of the PUBLISH routed next
        self.last_mid = 0                        # the number of the last message id written
        self.shares = Shares(self)
        # which nodes want which topics: bells to them, and when this node reads the messages
        self.interest = Interest(self.node, lambda: self.state, time.monotonic)
        self.ready = False
        self.stopping = False
        self.fenced = False
        self.recovering = False  # Kafka lost its data and _recover() has not run yet
        self.beat_handle: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ lifecycle
    def attach(self, broker: HookHost) -> None:
        self.broker = broker
        for part in (self.membership, self.checkpoints, self.held, self.reading, self.rebuilds,
                     self.claims):
            part.broker = broker

    def on_start(self) -> None:
        """Before the listeners open: create the topics, read the control and retained topics to
        their ends (so retained messages and ownership are known before any client), join."""
        self.loop = asyncio.get_running_loop()
        try:
            counts = ensure_topics(self.bootstrap, self.topics, self.cfg.partitions,
                                   self.cfg.replication_factor, self.cfg.kafka)
        except Exception as exc:  # kafka-python's errors are not OSError / RuntimeError
            raise RuntimeError(f"cluster: cannot use the Kafka at {self.bootstrap} ({exc}): is it "
                               "running and reachable from this node? (--kafka-bootstrap, "
                               "cluster.bootstrap_servers)") from exc
        self.partitions = counts[self.topics.messages]
        self.state = C.ControlState(self.node, self.inc, time.monotonic)
        self.producer = Producer(self.loop, self.bootstrap, self.cfg.kafka, self._completed,
                                 sign=self.trust.sign)
        # one ordered log each, read from partition 0 only: a Kafka that lost its data may
        # create them again with more partitions (at the first write, before ensure_topics)
        self.producer.sender.pinned = {self.topics.control: 0, self.topics.retained: 0}
        f = self.fetcher = Fetcher(self.bootstrap, self.cfg.kafka, self.cfg.fetch_wait_ms, Scanned,
                                   create_topics=False)
        msgs = [(self.topics.messages, p) for p in range(self.partitions)]
        replay = [(self.topics.retained, p) for p in range(counts[self.topics.retained])] + \
            [(self.topics.control, 0)]
        t0 = time.monotonic()
        f.positions.update(f.offsets(replay, "earliest"))
        ends = f.offsets(replay, "latest")
        f.positions.update(f.offsets(msgs, "latest"))  # messages: from now on
        for (_, p), off in ((tp, f.positions[tp]) for tp in msgs):
            self.routed_upto[p] = off
        self._read_until(lambda: all(f.positions[tp] >= max(end, f.high.get(tp, 0))
                                     for tp, end in ends.items()),
                         "the control and retained topics")
        foreign = self.trust.ignored["other_key"]
        if foreign and self.key_made:
            raise RuntimeError(
                f"cluster: {foreign} records in Kafka are signed with another cluster key, and "
                f"this node has just made its own ({self.key_made}): it would ignore the other "
                "nodes and they it. Give it the other nodes' key: replace that file with theirs, "
                "or set cluster.key_file / $MQTT_CLUSTER_KEY (README \"Cluster\")")
        self.membership.join()
        self.producer.kick()
        self._read_until(self.state.me_alive, "this node's join")
        log.info("cluster: node %s joined (incarnation %s) in %.2f s: %d members alive (%s), "
                 "%d clients known, %d retained messages", self.node, self.inc,
                 time.monotonic() - t0, len(self.state.alive()), ", ".join(self.state.alive()),
                 len(self.state.clients), self.broker.retained_count())
        self.ready = True
        self.reader = FetchReader(f, self.loop, self._apply, lost=self._kafka_lost,
                                  lost_elsewhere=self._lost_elsewhere,
                                  gated=frozenset((self.topics.messages,)),
                                  follow=self._reads_messages)
        self._say_interest()  # this node's topic filters, to the others
        self.reader.start()
        self.beat_handle = self.loop.call_later(self.cfg.heartbeat_seconds, self._beat)

    def _read_until(self, done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        """Start-up only (the loop serves nothing yet): poll and apply on this thread."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster: could not read {what} from Kafka at "
                                   f"{self.bootstrap} within {timeout:.0f} s")
            batches = self.fetcher.fetch()
            if batches:
                self._apply(batches)

    def on_stop(self) -> None:
        """SIGTERM: the connections were closed (their records written); say this node leaves."""
        self.stopping = True
        if self.beat_handle is not None:
            self.beat_handle.cancel()
        self.on_turn_end()
        self.shares.stop()
        if self.producer is not None and self.ready and not self.fenced:
            self.membership.leave()
            if not self.producer.flush(5):
                log.warning("cluster: could not write everything to Kafka at shutdown")
        if self.reader is not None:
            self.reader.stop()
            self.reader.join(2)
        if self.producer is not None:
            self.producer.close()
        if self.fetcher is not None:
            self.fetcher.close()

    # ------------------------------------------------------------ Kafka lost its data
    def _lost_elsewhere(self) -> str | None:
        """On the reader's thread: a loss the producer saw (its records' offsets went back, or
        a topic it wrote to was made again), unless it is the one being recovered from."""
        why = self.producer.take_went_back()
        return None if self.recovering else why

    def _kafka_lost(self, why: str) -> None:
        """On the reader's thread: Kafka lost the data this node had read (an in-memory Kafka
        restarted empty, a Kafka replaced or its topics recreated; kafka_client/fetch.py saw it).
        The topics are created again if missing, then the loop rebuilds the cluster's state in
        the new log (_recover()) before the reader hands over anything read from it."""
        log.error("cluster: the Kafka at %s lost its data (%s): node %s reads its new logs from "
                  "their start, creates the cluster's topics again if missing and writes again "
                  "its join, the state of the sessions it holds, the retained messages and bans, "
                  "and the %d messages it wrote that not every node had read",
                  self.bootstrap, why, self.node, len(self.keep.entries))
        self.recovering = True  # until _recover() ran: the producer's view of it is this loss
        partitions = recovery.topics_again(self.bootstrap, self.topics, self.cfg, self.partitions,
                                           lambda: self.fetcher.positions,  # (this thread's)
                                           lambda: self.stopping)
        try:
            self.loop.call_soon_threadsafe(self._recover, partitions)
        except RuntimeError:
            pass  # the loop closed: the node is stopping

    def _recover(self, partitions: int) -> None:
        """On the loop, after Kafka lost its data: what this node knew of the old logs'
        positions is dropped (the new logs are read from their start), and what the cluster's
        state needs from this node is written to the new control and retained topics: its join,
        the state of every session it holds (a node that reads the new log learns who holds
        them from those records), and, written by one live node (the same on every node),
        the retained messages and the bans. The control state read so far is kept: it is this node's
        knowledge of the cluster, and the other nodes write theirs again too."""
        if self.stopping or self.fenced or self.state is None:
            return
        self.partitions = partitions
        self.routed_upto = {p: 0 for p in range(partitions)}
        messages = self.topics.messages
        # which copies written again are new here (cluster/copies.py): not those read of the
        # lost log, nor those delivered here as accepted, their records never read back (cluster/held.py):
        # the copies of those do not match the bytes held, so they are let go here
        self.copies.lost(messages)
        self.held.lost()
        self.membership.forget_read()
        # every message kept is written again, first; those still waiting to be sent are sent
        # only as their copies (which their acknowledgements then wait for)
        again = recovery.resend_kept(self.keep, self.producer, messages)
        self.counters["resent"] += again
        self.producer.acked_upto.clear()
        self.held.spill = (self.producer.handed, None)  # (their offsets named the old log)
        self.producer.take_went_back()  # the same loss, seen by the producer meanwhile
        self.recovering = False
        self.reading.waiting_subs = [(sub, dict.fromkeys(range(partitions), 0))
                                     for sub, _ in self.reading.waiting_subs]
        self.checkpoints.lost(partitions)
        self.membership.join()
        self.interest.again()  # (its filters went with the lost log)
        rewritten = 0
        if C.rendezvous("retained", self.state.alive()) == self.node:
            rewritten = recovery.rewrite_retained(self.broker, self.producer, self.topics.retained,
                                                  self._batch(), self.node, self.inc,
                                                  lambda: next(self.ids))
            for ban in self.bans.list() if self.bans is not None else ():
                self._write_control(R.ban_key(ban["kind"], ban["value"]),
                                    C.ban_record(self.node, self.inc, ban))
        self.on_turn_end()
        self.producer.kick()
        log.info("cluster: node %s wrote again its join, the state of %d sessions, %d "
                 "retained messages and %d messages not every node had read after Kafka lost "
                 "its data", self.node, len(self.checkpoints.bound), rewritten, again)

    def stats(self) -> dict:
        """For metrics (mqtt_cluster_*, clients{node=...}), $SYS/broker/cluster/... and the
        dashboard: this node, the members, connected clients per node, counters."""
        st = self.state
        out: dict[str, Any] = dict(self.counters)
        out.update((f"ignored_{why}", n) for why, n in self.trust.ignored.items())
        members = self.members()
        out.update(node=self.node, members=sum(1 for m in members if m["alive"]),
                   members_list=",".join(m["node"] for m in members if m["alive"]),
                   clients_known=len(st.clients) if st else 0,
                   clients_by_node={m["node"]: m["clients"] for m in members if m["alive"]},
                   share_groups=len(self.shares.streams),
                   kept=len(self.keep.entries), kept_bytes=self.keep.bytes,
                   kept_dropped=self.keep.dropped,
                   backlog=self.producer.backlog if self.producer is not None else 0,
                   held=len(self.held.local),
                   # cluster/interest.py: bells written to other nodes and read for this one,
                   # and the reads of the messages topic while asleep
                   bells_written=self.interest.bells, bells_read=self.interest.rung,
                   skims=self.interest.skims,
                   # kafka_client/fetch.py: partitions Kafka answered empty below their end
                   # for STUCK_WARN seconds (Tansu with a short fetch wait)
                   fetch_stuck=self.fetcher.stuck if self.fetcher is not None else 0)
        return {"cluster": out}

    def locate(self, client_id: str) -> str | None:
        """The node whose session this client id is (connected or not), None if none."""
        return self.owner_of(client_id)

    def members(self) -> list[dict]:
        """For $SYS, metrics and the dashboard: each member and the clients it owns."""
        st = self.state
        if st is None:
            return []
        owned: dict[str, int] = {}
        for c in st.clients.values():
            if c.connected:
                owned[c.node] = owned.get(c.node, 0) + 1
        return [{"node": m.node, "alive": m.alive, "left": m.left, "me": m.node == self.node,
                 "clients": owned.get(m.node, 0) if m.alive else 0}
                for m in sorted(st.members.values(), key=lambda m: m.node)]

    def owner_of(self, client_id: str) -> str | None:
        c = self.state.clients.get(client_id) if self.state else None
        return c.node if c is not None else None

    # ------------------------------------------------------------ producing
    def _send(self, topic: str, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]] | None = None,
              ts: int | None = None, batch: _Batch | None = None) -> None:
        if batch is not None:
            batch.count += 1
        self.producer.send(topic, key, value, headers,
                           int(self.wall() * 1000) if ts is None else ts, batch)

    def _completed(self, items: list[tuple[_Batch | Entry | None, str | None]]) -> None:
        """Records Kafka acknowledged (failure None) or gave up on."""
        mark = None
        for tag, failure in items:
            if failure is not None:
                self.counters["produce_errors"] += 1
            if type(tag) is Entry:  # a kept message: below the offsets acknowledged so far
                if mark is None:
                    acked, messages = self.producer.acked_upto, self.topics.messages
                    mark = {p: acked.get((messages, p), 0) for p in range(self.partitions)}
                tag[MARK] = mark if failure is None else FAILED  # (Keep.answered)
                batch = tag[BATCH]
            else:
                batch = tag
            if batch is None:
                continue
            batch.count -= 1
            if failure is not None and batch.failure is None:
                batch.failure = failure
            if batch.token is not None and (batch.count == 0 or batch.failure):
                batch.token.resolve(batch.failure)
        if self.held.deferred is not None:
            self.held.spilling()

    def _write_control(self, key: str, rec: dict | None) -> None:
        """A control record; acknowledgements asked for after it wait for it too (barrier).
        Numbered (`seq`, control.py): a copy of it written again is not applied again."""
        if rec is not None:
            rec["seq"] = next(self.seq)
        self._send(self.topics.control, key.encode(), None if rec is None else R.dumps(rec),
                   batch=self._batch())

    def _batch(self) -> _Batch:
        b = self.batch
        if b is None:
            b = self.batch = _Batch()
        return b

    # ------------------------------------------------------------ the hook: messages
    def route(self, msg: Message, sender: Session | None) -> None:
        """An accepted message: to the messages topic (and the retained one), and to this node's
        subscribers at once (its acknowledgement still waits for Kafka: barrier()); the other
        nodes deliver it when they read it."""
        if msg.qos == 0 and self.producer.backlog > self.cfg.max_backlog:
            # Kafka takes less than clients publish: QoS 0 is dropped (at most once) and counted,
            # QoS 1/2 wait (their acks hold their publishers' windows)
            self.broker.count_dropped("cluster_busy")
            return
        b = self._batch()
        client_id = sender.client_id if sender is not None else (msg.sender or "")
        username = sender.username if sender is not None else None
        level = sender.link_level if sender is not None else 5
        broker = self.broker
        qos2_id = None
        held = self.qos2_pid
        if held is not None:
            self.qos2_pid = None
            if held[0] == client_id and msg.qos == 2 and sender is not None:
                qos2_id = held[1]
        n = self.last_mid = next(self.ids)
        body = R.message_body(msg, client_id, username, level, self.node,
                              f"{self.node}-{self.inc}-{n}", broker.clock(), qos2_id)
        ts = int(msg.accepted_at * 1000)
        b.count += 1
        kept = self.keep.add(body, ts, b) if msg.qos else None
        signed = self.producer.send_body(self.topics.messages, body, ts,
                                         b if kept is None else kept)
        self.counters["produced"] += 1
        for node in self.interest.to_ring(msg.topic, time.monotonic()):
            self._write_control(f"r:{node}", {"t": "bell", "node": self.node, "inc": self.inc,
                                              "to": node})
        self.held.here(msg, client_id, signed, n)
        if msg.retain and broker.cfg.retain_available and \
                (not msg.payload or broker.retained_fits(msg)):
            # [MQTT-3.3.1-5] kept cluster-wide; an empty payload deletes it [MQTT-3.3.1-6];
            # (over mqtt.max_retained_*: refused or delivered unretained by the connection)
            if msg.payload:
                b.count += 1
                self.producer.send_body(self.topics.retained, body, ts, b)
            else:
                self._send(self.topics.retained, msg.topic_bytes, None, [(
                    H_MESSAGE_ID, f"{self.node}-{self.inc}-{next(self.ids)}".encode())], ts, b)
            # here at once too (a client that publishes a retained message, then subscribes on
            # this node, gets it, as on one broker); every node, this one included, applies the
            # record again in the log's order, so concurrent updates end the same everywhere
            broker.set_retained(msg.topic, msg if msg.payload else None)

    def barrier(self) -> Pending | None:
        """What the acks of this read wait for: every record written so far, the session
        records this read changed (a persistent session's SUBSCRIBE) included. (Kafka answers
        this node's writes in order: the last batch's token stands for the earlier ones.)"""
        if self.checkpoints.owed():
            self.on_turn_end()
        b = self.batch
        if b is None:
            if not self.qos2_in:
                last = self.last_token
                return last if last is not None and not last.done else None
            b = self._batch()
        self.batch = None
        b.token = self.last_token = Pending()
        if b.count == 0 or b.failure:
            b.token.resolve(b.failure)
        if not self.qos2_in:
            return b.token
        cids, self.qos2_in = self.qos2_in, set()
        done = Pending()

        def written(t: Pending) -> None:
            # the messages are in the log: now the checkpoint naming their packet ids
            if t.failure is not None:
                done.resolve(t.failure)
                return
            ck = self.checkpoints
            ck.dirty.update(cid for cid in cids if cid in ck.bound)
            then = self.barrier()
            if then is None:
                done.resolve()
            else:
                self.producer.kick()
                then.add_done_callback(lambda t2: done.resolve(t2.failure))

        b.token.add_done_callback(written)
        return done

    # ------------------------------------------------------------ reading (on the loop)
    def _apply(self, batches: list) -> None:
        """A fetch's records, on the loop (cluster/reading.py)."""
        self.reading.apply(batches)

    def _apply_control(self, off: int, name: str, body: dict | None, at: float) -> None:
        self._act(self.state.apply(off, name, body, at))

    # ------------------------------------------------------------ for the share streams (ShareHost)
    def share_start(self) -> dict[int, int]:
        return {p: self.routed_upto.get(p, 0) for p in range(self.partitions)}

    def share_message(self, topic: str, offset: int, key: bytes | None, value: bytes | None,
                      headers: list, ts: int) -> Message | None:
        why = self.trust.check_fields(topic, key, value, headers, ts)
        if why is not None:
            self.trust.ignore(why, f"{topic} offset {offset}")
            return None
        got = self.reading.decode(topic, offset, key, value, headers, ts, self.broker.clock(),
                                  self.wall())
        return None if got is None else got[0]

    # ------------------------------------------------------------ new subscriptions
    def install(self, sub: Subscription) -> None:
        """A new subscription takes the log's messages from where this node knows it ends at
        the SUBSCRIBE: past what it has routed, what its last fetch saw and what Kafka has
        acknowledged of this node's own writes. Every one of those records existed before the
        SUBSCRIBE, so nothing published after it is skipped; a record published a moment before
        (less than the log's latency) may still reach it, as if it had come a moment later."""
        if sub.group is not None:  # a $share group's messages come by its own stream, from
            self.broker.route_from_now(sub)  # the group's committed position (cluster/shares.py)
            return
        high, acked, topic = self.fetcher.high, self.producer.acked_upto, self.topics.messages
        since = {p: max(upto, high.get((topic, p), 0), acked.get((topic, p), 0))
                 for p, upto in self.routed_upto.items()}
        s = sub.session
        if isinstance(s, Session) and s.store is not None:  # a persistent session's checkpoint records it
            self.checkpoints.since[(s.client_id, sub.filter)] = since
        self.reading.start(sub, since)

    # ------------------------------------------------------------ control effects
    def _act(self, effects: list) -> None:
        for ev in effects:
            kind = type(ev)
            if kind is C.Claimed:
                self._claimed(ev)
            elif kind is C.Superseded:
                self._superseded(ev)
            elif kind is C.HandedOver:
                self.claims.handed_over(ev.cid)
            elif kind is C.WillDue:
                self.membership.will_due(ev)
            elif kind is C.Ended:
                self.membership.ended(ev.cid)
            elif kind is C.Evicted:
                self.counters["evictions"] += 1
                if ev.me:
                    if not self.stopping:  # (its own `leave` at shutdown is not a fencing)
                        self._fenced()
                else:
                    self.membership.evicted(ev)
            elif kind is C.InterestChanged:
                self.interest.others_changed()
            elif kind is C.Rung:
                self.interest.wake()
            elif kind is C.BanChanged:
                self._ban_changed(ev)
            elif kind is C.Copy:
                self.trust.ignore(REPLAYED, f"{self.topics.control} offset {ev.offset}", ev.kind)
            elif kind is C.Stale:
                self.checkpoints.stale(ev.cid)  # this node's state is the current one

    def _claimed(self, ev: C.Claimed) -> None:
        c = ev.client
        if c.node != self.node or c.inc != self.inc:
            return
        # this node's own session, claimed again here: it is the new epoch's from now on,
        # whether or not the CONNECT that claimed it takes it (it may have gone meanwhile);
        # its state, written again under this epoch, says whether it is connected
        self.checkpoints.rebind(c.cid, c.epoch)
        self.claims.claimed(ev)

    def _superseded(self, ev: C.Superseded) -> None:
        """This node's session of `cid` is another node's now (or ended there)."""
        broker = self.broker
        s = broker.session_of(ev.cid)
        epoch = self.checkpoints.unbind(ev.cid)
        if s is not None and ev.final and epoch == ev.epoch:
            rec = self.checkpoints.state_record(s, ev.epoch, final=True, connected=False)
            if not handover.give(self, s, rec):  # (what the log no longer has goes with it)
                self._write_control(f"c:{ev.cid}", rec)
        self.checkpoints.drop(ev.cid)
        if s is not None:
            broker.release_session(ev.cid, ev.publish_will,
                                   "session taken over by a connection on another node")

    def _fenced(self) -> None:
        """Other nodes declared this one dead (it was silent too long): every client of this node
        is another node's to serve now. Drop them and join again as a new incarnation."""
        log.error("cluster: this node (%s) was declared gone by the cluster (no heartbeat for "
                  "cluster.node_timeout = %.1f s); dropping its clients and joining again",
                  self.node, self.cfg.node_timeout)
        broker = self.broker
        for cid in [s.client_id for s in broker.every_session()]:
            self.checkpoints.unbind(cid)
            broker.release_session(cid, False, "this node rejoins the cluster: reconnect")
        self.checkpoints.reset()
        self.qos2_in.clear()
        self.claims.fail_all()
        self.inc = uuid.uuid4().hex[:12]
        self.state.inc = self.inc
        self.membership.join()
        self.interest.again()

    # ------------------------------------------------------------ admission (CONNECT)
    def admit(self, client_id: str, clean_start: bool, expiry: int, will: Will | None, username: str | None,
              level: int) -> Pending | AdmitRefused:
        token = Pending()
        if not self.ready or self.fenced:
            token.resolve("this cluster node is not ready yet; try again")
            return token
        return self.claims.admit(client_id, clean_start, expiry, will, username)

    # ------------------------------------------------------------ the hook: clients
    def on_client_connected(self, session: Session, present: bool) -> None:
        self.checkpoints.connected(session)

    def on_client_disconnected(self, session: Session, publish_will: bool) -> None:
        self.checkpoints.disconnected(session)

    # persistence events (persistent sessions only): their state records (cluster/checkpoints.py)
    def on_session_saved(self, session: Session) -> None:
        self.checkpoints.dirty.add(session.client_id)

    def on_session_deleted(self, client_id: str) -> None:
        self.checkpoints.deleted(client_id)

    def on_subscribed(self, client_id: str, sub: Subscription) -> None:
        self.checkpoints.subscribed(client_id, sub.filter)

    def on_unsubscribed(self, client_id: str, filt: str) -> None:
        self.checkpoints.unsubscribed(client_id, filt)

    def on_qos2_received(self, client_id: str, pid: int) -> None:
        # (before route(): its record carries the id) its PUBREC waits for a checkpoint naming
        # the id, written once the message is in the log (barrier()): a node that takes the
        # session over then knows a DUP resend of it is not a new message [MQTT-4.3.3-9]
        self.qos2_in.add(client_id)
        self.qos2_pid = (client_id, pid)

    def on_qos2_released(self, client_id: str, pid: int) -> None:
        # the PUBCOMP waits for the checkpoint without the id (barrier()): the client reuses
        # it only once no node can take a reuse for a resend of the message released
        self.checkpoints.dirty.add(client_id)

    def on_message_stored(self, client_id: str, msg: Message, qos: int, retain: bool,
                          sub_ids: tuple[int, ...] | None, pid: int | None = None) -> Handle:
        h = Handle(client_id, msg.store_id if isinstance(msg.store_id, tuple) else None, pid, qos)
        placing = self.held.placing
        if placing is not None and h.pos is None and msg is placing.msg:
            placing.handles.append(h)  # its place in the log once read back (Held.own)
        self.checkpoints.stored(h)
        return h

    def on_stored_sending(self, handle: Handle, pid: int) -> None:
        handle.pid = pid
        if handle.qos == 2:
            # a QoS 2 PUBLISH leaves with this id: the checkpoint written at the end of this
            # turn names it, so a node that rebuilds the session resends it with this id and
            # DUP 1 [MQTT-4.4.0-1] instead of as a new message the client would deliver again
            self.checkpoints.dirty.add(handle.cid)

    def on_stored_released(self, handle: Handle) -> None:
        # [MQTT-4.3.3-6] PUBREC came: the PUBREL waits for the checkpoint saying so (the ack
        # gate, barrier()), so no node ever sends this message again as a PUBLISH
        handle.released = True
        self.checkpoints.dirty.add(handle.cid)

    def on_stored_done(self, handle: Handle) -> None:
        self.checkpoints.done(handle)

    # ------------------------------------------------------------ writing session state
    def on_turn_end(self) -> None:
        if self.ready:
            self.shares.reconcile()  # a $share group gained its first member here, or lost its last
            self._say_interest()
        self.checkpoints.write_owed()

    def _say_interest(self) -> None:
        """This node's topic filters to the others, when one gained its first subscription here
        or lost its last (cluster/interest.py)."""
        said = self.interest.changed(*self.broker.plain_filters())
        if said is not None:
            self._write_control(f"i:{self.node}", {"t": "interest", "node": self.node,
                                                   "inc": self.inc, **said})
            self.producer.kick()

    def _messages_end(self) -> dict[int, int]:
        """Per messages partition, where its log ends as this node last knew it (its reading's
        last answer, or the ends it asks for while asleep: cluster/link.py FetchReader)."""
        high, topic = self.fetcher.high, self.topics.messages
        return {p: high.get((topic, p), 0) for p in range(self.partitions)}

    def _claim_current(self, claim) -> bool:
        """A claim applied here is still the client id's current one (not claimed again since)."""
        st = self.state
        c = st.clients.get(claim.cid) if st is not None else None
        return c is not None and claim.client is not None and c.epoch == claim.client.epoch \
            and c.node == st.node and c.inc == st.inc

    def _reads_messages(self) -> bool:
        """On the reader's thread, before each fetch: whether it includes the messages
        partitions (cluster/interest.py); always while this node holds messages it accepted
        until their records are read back, starts new subscriptions, spills or recovers."""
        held = self.held
        return self.interest.reads_messages(
            bool(held.local) or held.spill is not None or bool(self.reading.waiting_subs)
            or self.rebuilds.catching_up > 0 or self.recovering or not self.ready)

    # ------------------------------------------------------------ timers
    def on_tick(self) -> None:
        self.shares.tick()
        now = time.monotonic()
        if self.held.local:
            self.held.forget(now)
        self.claims.expire(now)
        if self.checkpoints.due(now):
            self.on_turn_end()

    def _beat(self) -> None:
        """The heartbeat timer (cluster/membership.py)."""
        try:
            self.membership.beat()
            if self.ready and not self.fenced:
                self._say_interest()  # (a session that ended without a turn's output)
        except Exception:
            log.exception("cluster: heartbeat failed")
        self.beat_handle = self.loop.call_later(self.cfg.heartbeat_seconds, self._beat)

    # ------------------------------------------------------------ bans
    def share_bans(self, bans: BanList) -> None:
        """The server's ban list is the cluster's: its changes go to the control topic, and the
        changes read there (from any node) apply to it (_ban_changed)."""
        self.bans = bans
        bans.shared = self._share_ban

    def _share_ban(self, op: str, ban: dict) -> None:
        if self.producer is None or self.stopping:
            log.warning("cluster: the ban change (%s %s %r) was made before this node joined "
                        "the cluster or while it stops: it applies on this node only", op,
                        ban["kind"], ban["value"][:100])
            return
        rec = C.ban_record(self.node, self.inc, ban) if op == "ban" else \
            C.unban_record(self.node, self.inc, ban["kind"], ban["value"])
        self._write_control(R.ban_key(ban["kind"], ban["value"]), rec)
        self.producer.kick()

    def _ban_changed(self, ev: C.BanChanged) -> None:
        """A ban made through some node: kept here (CONNECTs refused) and its clients here
        disconnected."""
        bans = self.bans
        if bans is None:
            return
        ban = bans.apply_shared(ev.ban, ev.removed)
        if ban is None or self.broker is None:
            return
        broker = self.broker
        for cid, user, peer in broker.client_ids():
            if bans.matches(ban, cid, user, peer):
                broker.kick(cid, "banned by the broker's administrator")
