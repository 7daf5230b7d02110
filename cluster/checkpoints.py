"""The state of the persistent sessions this node holds, written to the control topic.

A session's state record (`state`, cluster/control.py) says where it is (node, epoch), whether
connected, its expiry and will; for a persistent session it carries its checkpoint: its
subscriptions (each with the log positions it was made at), the log positions below which every
matching record was delivered and acknowledged, the records in flight with their packet ids, its
inbound QoS 2 ids and the last message id this node wrote (cluster/rebuild.py Rebuild
reads it back on the node the session moves to). What the core's persistence events change is
marked here (dirty) and written at the end of the event-loop turn; positions that only moved
(progress) are written at most every cluster.checkpoint_seconds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from . import control as C
from . import records as R

if TYPE_CHECKING:
    from broker.core.hookhost import HookHost
    from broker.core.session import Session
    from settings import ClusterConfig


class Handle:
    """A stored outbound message of a persistent session: where it is in the messages topic."""
    __slots__ = ("cid", "pos", "pid", "released", "qos")

    def __init__(self, cid: str, pos: tuple[int, int] | None, pid: int | None, qos: int = 1) -> None:
        self.cid = cid
        self.pos = pos           # (partition, offset), or None (not from the log: a retained delivery)
        self.pid = pid
        self.released = False
        self.qos = qos


class Checkpoints:
    """`state`: the control state (the clients' epochs, this node's id and incarnation);
    `write`: a control record to write; `read_upto`: per messages partition, the next offset
    this node delivers; `wrote`: the message id of the last message this node wrote."""

    def __init__(self, cfg: ClusterConfig, wall: Callable[[], float],
                 state: Callable[[], C.ControlState | None],
                 write: Callable[[str, dict | None], None],
                 read_upto: Callable[[], dict[int, int]], wrote: Callable[[], str]) -> None:
        self.cfg = cfg
        self.wall = wall
        self.state = state
        self.write = write
        self.read_upto = read_upto
        self.wrote = wrote
        self.broker: HookHost = None  # type: ignore[assignment]  # ClusterNode.attach()
        self.bound: dict[str, int] = {}          # cid -> epoch of this node's session
        self.handles: dict[str, set] = {}        # cid -> live stored-message handles
        self.since: dict[tuple, dict] = {}       # (cid, filter) -> positions when subscribed
        self.dirty: set[str] = set()             # persistent sessions whose state to write
        self.progress: set[str] = set()          # ... whose positions moved
        self.ended: set[str] = set()             # sessions ended here this turn
        self.last_checkpoint = 0.0

    # ------------------------------------------------------------ the core's events
    def connected(self, session: Session) -> None:
        st = self.state()
        c = st.clients.get(session.client_id) if st is not None else None
        if st is None or c is None or c.node != st.node or c.inc != st.inc:
            return
        self.bound[session.client_id] = c.epoch
        self.dirty.add(session.client_id)

    def disconnected(self, session: Session) -> None:
        cid = session.client_id
        if cid in self.bound:
            self.dirty.add(cid)
            if session.expiry_interval == 0:
                self.ended.add(cid)  # a clean session ends with its connection
            # written at the end of this turn, not of the next one (a dropped connection of a
            # clean session writes nothing else: its end would wait for the next CONNECT)
            flush = self.broker.schedule_flush
            if flush is not None:
                flush()

    def deleted(self, client_id: str) -> None:
        self.ended.add(client_id)
        self.handles.pop(client_id, None)

    def subscribed(self, client_id: str, filt: str) -> None:
        # (a new subscription's start was set by ClusterNode.install(); a replaced one keeps its own)
        self.since.setdefault((client_id, filt), dict(self.read_upto()))
        self.dirty.add(client_id)

    def unsubscribed(self, client_id: str, filt: str) -> None:
        self.since.pop((client_id, filt), None)
        self.dirty.add(client_id)

    def stored(self, h: Handle) -> None:
        hs = self.handles.get(h.cid)
        if hs is None:
            hs = self.handles[h.cid] = set()
        hs.add(h)
        if h.pid is not None and h.qos == 2:
            self.dirty.add(h.cid)  # sent: its packet id in the checkpoint of this turn

    def done(self, handle: Handle) -> None:
        hs = self.handles.get(handle.cid)
        if hs is not None:
            hs.discard(handle)
        self.progress.add(handle.cid)

    # ------------------------------------------------------------ ownership changes
    def rebind(self, cid: str, epoch: int) -> None:
        """This node's own session, claimed again here: the new epoch's from now on."""
        if cid in self.bound and self.broker.session_of(cid) is not None:
            self.bound[cid] = epoch
            self.dirty.add(cid)

    def stale(self, cid: str) -> None:
        """A state record of an older epoch was read: this node's is written again."""
        if self.broker.session_of(cid) is not None and self.bound.get(cid) is not None:
            self.dirty.add(cid)

    def unbind(self, cid: str) -> int | None:
        """The session is another node's now: nothing more is written for it here; its epoch."""
        epoch = self.bound.pop(cid, None)
        self.dirty.discard(cid)
        self.progress.discard(cid)
        return epoch

    def drop(self, cid: str) -> None:
        self.handles.pop(cid, None)
        for k in [k for k in self.since if k[0] == cid]:
            del self.since[k]

    def reset(self) -> None:
        """This node was fenced: it holds no session any more (each unbound as released)."""
        self.handles.clear()
        self.dirty.clear()
        self.progress.clear()

    def lost(self, partitions: int) -> None:
        """Kafka lost its data: positions name the new log's start; every session held here is
        written again (a node that reads the new log learns who holds them from those)."""
        self.since = {k: dict.fromkeys(range(partitions), 0) for k in self.since}
        for hs in self.handles.values():
            for h in hs:
                h.pos = None  # its old offset names another record in the new log
        self.dirty.update(cid for cid in self.bound if self.broker.session_of(cid) is not None)

    # ------------------------------------------------------------ writing
    def owed(self) -> bool:
        """Whether state records are to be written (at the end of this turn)."""
        return bool(self.dirty or self.ended)

    def due(self, now: float) -> bool:
        """Whether the sessions whose positions moved are due a checkpoint (marked dirty)."""
        if self.progress and now - self.last_checkpoint >= self.cfg.checkpoint_seconds:
            self.last_checkpoint = now
            self.dirty |= {cid for cid in self.progress if cid in self.bound}
            self.progress.clear()
            return True
        return False

    def write_owed(self) -> None:
        """The ends and state records of this turn's sessions."""
        if not (self.dirty or self.ended):
            return
        broker = self.broker
        st = self.state()
        assert st is not None
        for cid in self.ended:
            epoch = self.bound.get(cid)
            s = broker.session_of(cid)
            if epoch is None or s is not None:
                continue  # a new session took its place (Clean Start): its own state follows
            del self.bound[cid]
            self.dirty.discard(cid)
            self.progress.discard(cid)
            c = st.clients.get(cid)
            if c is not None and c.epoch == epoch:
                self.write(f"c:{cid}", C.end_record(c, st.node, st.inc))
        self.ended.clear()
        for cid in self.dirty:
            s = broker.session_of(cid)
            epoch = self.bound.get(cid)
            if s is None or epoch is None:
                continue
            self.write(f"c:{cid}", self.state_record(s, epoch))
            self.progress.discard(cid)
        self.dirty.clear()

    def state_record(self, s: Session, epoch: int, final: bool = False,
                     connected: bool | None = None) -> dict:
        broker = self.broker
        st = self.state()
        assert st is not None
        now, wall = broker.clock(), self.wall()
        connected = s.connection is not None if connected is None else connected
        expires_at = None if connected or s.expires_at is None else wall + (s.expires_at - now)
        will_at = None if s.will_at is None else wall + (s.will_at - now)
        rec = {"t": "state", "epoch": epoch, "node": st.node, "inc": st.inc,
               "connected": connected, "expiry": s.expiry_interval, "expires_at": expires_at,
               "will": R.will_to_dict(s.will, wall), "will_at": will_at, "user": s.username,
               "session": self.checkpoint(s) if (s.expiry_interval or final) else None}
        if final:
            rec["final"] = True
        return rec

    def checkpoint(self, s: Session) -> dict:
        cid = s.client_id
        pos = dict(self.read_upto())
        # per partition, the first record not handed to the client yet (its first queued
        # message, else the end of what this node read): below it, a matching record is either
        # in `inflight` or was delivered and acknowledged, and is never sent again as new
        nxt = dict(self.read_upto())
        inflight = []
        pid_of = {}
        for pid, e in s.inflight_out.items():
            if e.handle is not None:
                pid_of[id(e.handle)] = (pid, e.released)
        for h in self.handles.get(cid, ()):
            if h.pos is None:
                continue
            p, off = h.pos
            if off < pos.get(p, off + 1):
                pos[p] = off
            held = pid_of.get(id(h))
            if held is not None:
                inflight.append([p, off, held[0], int(held[1])])
            elif off < nxt.get(p, off + 1):
                nxt[p] = off
        subs = []
        for sub in s.subscriptions.values():
            since = self.since.get((cid, sub.filter)) or {}
            since = {str(p): o for p, o in since.items() if o > pos.get(p, 0)}
            subs.append([sub.filter, sub.qos, int(sub.no_local), int(sub.retain_as_published),
                         sub.retain_handling, sub.sub_id, since or None])
        return {"subs": subs, "pos": {str(p): o for p, o in pos.items()}, "inflight": inflight,
                "next": {str(p): o for p, o in nxt.items() if o > pos.get(p, 0)},
                # the last message id this node wrote: the QoS 2 PUBLISHes of the client written
                # after it are not in "qos2" (cluster/rebuild.py finds them in the log)
                "wrote": self.wrote(),
                "next_pid": s.next_pid, "qos2": sorted(s.inflight_in | s.qos2_unsure),
                "expiry": s.expiry_interval,
                "user": s.username}


