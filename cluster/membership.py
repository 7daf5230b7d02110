"""This node among the cluster's members (cluster/node.py runs it on its heartbeat timer).

Each heartbeat writes a `beat` control record naming how far this node has read the messages
topic; from the other nodes' beats it knows how far every live node has read (read_floor: the
messages kept to write again after a Kafka loss are let go below it, cluster/keep.py). A node
silent for cluster.node_timeout is declared gone (an `evict` record), and this node fires the
timers of sessions whose node is gone when it is their executor (control.py ControlState.due):
their wills, published here as their clients' messages, and their expiry.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from . import control as C
from . import records as R

if TYPE_CHECKING:
    from broker.core.hookhost import HookHost
    from settings import ClusterConfig

log = logging.getLogger(__name__)


class Membership:
    """Heartbeats, evictions and the timers of sessions whose node is gone.

    `state`: the node's replicated control state (control.py; set at its start); `write`: a
    control record to write (key, record); `read_upto`: per messages partition, the next offset
    this node delivers; `trim`: let go of the kept messages below a read floor; `counters`: the
    node's counters (wills_fired)."""

    def __init__(self, cfg: ClusterConfig, wall: Callable[[], float],
                 state: Callable[[], C.ControlState | None],
                 write: Callable[[str, dict | None], None],
                 read_upto: Callable[[], dict[int, int]],
                 trim: Callable[[dict[int, int] | None], object], counters: dict[str, int]) -> None:
        self.cfg = cfg
        self.wall = wall
        self.state = state
        self.write = write
        self.read_upto = read_upto
        self.trim = trim
        self.counters = counters
        self.broker: HookHost = None  # type: ignore[assignment]  # ClusterNode.attach()
        self.firing: set[tuple] = set()  # timers whose records are on their way

    def join(self) -> None:
        """This node's join (at its start, after a Kafka loss, as a new incarnation)."""
        st = self.state()
        assert st is not None
        self.write(f"n:{st.node}", C.node_record("join", st.node, st.inc, at=self.wall()))

    def leave(self) -> None:
        st = self.state()
        assert st is not None
        self.write(f"n:{st.node}", C.node_record("leave", st.node, st.inc))

    def beat(self) -> None:
        """A heartbeat: this node's read positions; the nodes silent too long declared gone;
        the timers due fired."""
        st = self.state()
        assert st is not None
        self.write(f"n:{st.node}", C.node_record(
            "beat", st.node, st.inc, read={str(p): o for p, o in self.read_upto().items()}))
        self.trim(self.read_floor())  # the kept messages every live node has read
        if st.me_alive():
            for m in st.silent(self.cfg.node_timeout):
                log.warning("cluster: node %s not heard from for %.1f s: declaring it gone",
                            m.node, self.cfg.node_timeout)
                self.write(f"n:{m.node}", C.node_record(
                    "evict", m.node, m.inc, by=st.node, by_inc=st.inc, at=self.wall()))
                m.seen = time.monotonic()  # once per timeout, until the record is applied
            self.fire_timers()

    def read_floor(self) -> dict[int, int] | None:
        """Per messages partition, the lowest position read by the live nodes (this one: where
        it is; the others: their last heartbeat); None when one has not said."""
        floor = dict(self.read_upto())
        st = self.state()
        if st is None:
            return floor
        for m in st.members.values():
            if not m.alive or (m.node == st.node and m.inc == st.inc):
                continue
            read = m.read
            if read is None:
                return None
            for p, o in floor.items():
                floor[p] = min(o, read.get(p, 0))
        return floor

    def forget_read(self) -> None:
        """Kafka lost its data: the members' heartbeats name the old log's offsets until they
        join again."""
        st = self.state()
        for m in st.members.values() if st is not None else ():
            m.read, m.read_ok = None, False

    def fire_timers(self) -> None:
        """Wills and expiry of sessions whose node is gone, this node being their executor."""
        st = self.state()
        assert st is not None
        for kind, c in st.due(self.wall()):
            if (c.cid, kind) in self.firing:
                continue
            self.firing.add((c.cid, kind))
            if kind == "expire":
                self.write(f"c:{c.cid}", C.end_record(c, st.node, st.inc,
                                                      fired=c.will is not None))
            else:
                self.write(f"c:{c.cid}", C.state_record(
                    c, st.node, st.inc, will=None, will_at=None, fired=True))

    # ------------------------------------------------------------ control effects
    def will_due(self, ev: C.WillDue) -> None:
        self.firing.discard((ev.cid, "will"))
        st = self.state()
        if st is not None and ev.by == st.node:
            self.publish_will(ev)

    def ended(self, cid: str) -> None:
        self.firing.discard((cid, "expire"))
        self.firing.discard((cid, "will"))

    def evicted(self, ev: C.Evicted) -> None:
        """Another node declared gone, or leaving (this node's own eviction: ClusterNode)."""
        if ev.left:  # a clean stop: expected, not a warning
            log.info("cluster: node %s (incarnation %s) left; its clients' sessions "
                     "and wills are taken over by the live nodes", ev.node, ev.inc)
        else:
            log.warning("cluster: node %s (incarnation %s) is gone; its clients' "
                        "sessions and wills are taken over by the live nodes",
                        ev.node, ev.inc)

    def publish_will(self, ev: C.WillDue) -> None:
        """A will of a client whose node is gone: published as that client's message."""
        broker = self.broker
        d = ev.will
        msg = R.will_message(d, ev.cid, broker.clock(), self.wall())
        if msg.topic.startswith("$SYS") or not broker.auth.allow_publish(ev.cid, ev.user, msg.topic):
            return
        self.counters["wills_fired"] += 1
        if broker.accepting and not broker.offer(msg, ev.cid, ev.user, 5):
            return
        broker.publish(msg, None)
