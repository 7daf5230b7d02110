"""The cluster's replicated state: members, who owns each client id, session records, timers.

Every node reads the control topic from its beginning and applies each record here, in log
order. The same records in the same order give every node the same state, so every decision
that must have one answer cluster-wide (which CONNECT of a client id won, whether a node is
gone, who publishes a will) is decided by the order Kafka gave the records, never by clocks.
Sans-I/O: `apply()` returns the effects this node must act on (cluster/node.py does), and
`due()` says which timers this node must fire now.

Records (JSON objects; key `n:<node id>` or `c:<client id>`):

* `join`, `beat`, `leave`, `evict` (key n:): a node incarnation (`inc`, new at every start)
  joins, is alive, leaves on SIGTERM, or is declared dead by another node that has not seen it
  for `node_timeout`. Records written by an incarnation that is not the node's current live one
  are ignored: a node that was declared dead is fenced, whatever it still writes.
* `claim` (key c:): a CONNECT on `node`. Its offset is the new epoch of the client id: the last
  claim in the log wins (MQTT's takeover: the newest connection), so two concurrent CONNECTs on
  two nodes end with one owner on every node. The previous owner, if connected, is told to
  disconnect its client (0x8E) and to hand the session over.
* `state` (key c:): the full state of a client at an epoch, written by its owner (connected,
  session expiry and deadline, will and its deadline, the session's checkpoint). Valid only for
  the current epoch (a late write of an old owner is ignored), or as the previous owner's last
  word (`final`) on its session, which the new owner waits for when that owner is alive.
* `end` (key c:): the session ended (expired, or a clean session's connection closed).
* `interest` (key `i:<node id>`): the topic filters a node's sessions subscribe to; `bell`
  (key `r:<node id>`): wakes that node's reading of the messages topic (cluster/interest.py).
* `ban`, `unban` (key `b:<kind>:<value>`): a ban added or removed through any node's admin API
  (broker/admin/bans.py): every node applies it to its own ban list (refusing CONNECTs) and
  disconnects the clients it covers. The last record per key wins, so a replay gives the list.

Every record is checked whole (records.decode_control) and signed (cluster/trust.py) before it
is applied here. Each carries `seq`, a number its writer (`node`, `inc`; `by`, `by_inc` for an
`evict`) increases with every record it writes: a record whose `seq` is not above the last one
applied from its writer is a copy (a producer's retry, or a signed record written again by
someone who read it from Kafka) and is ignored, so an old join cannot end a live incarnation nor
an old claim take a client id again.

Each client record holds the client's whole state, so a compacting Kafka that keeps only the
last record per key keeps what matters; the owner re-asserts its state if a stale write ever
lands after its own (see `Stale`), and the topic is created with a compaction lag far longer
than that takes.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple

NEVER = 0xFFFFFFFF  # Session Expiry Interval meaning "does not expire"

# A control record as applied (records.decode_control): a JSON object whose fields depend on its kind.
# Fields are read with .get() even where the kind always carries them, so it is typed Any.
Record = Any


@dataclass
class Member:
    node: str
    inc: str
    alive: bool = True
    seen: float = 0.0        # local clock when its last record was applied
    left: bool = False       # left cleanly (SIGTERM) rather than declared dead
    # how far it has read each messages partition (its last heartbeat's `read`), None: unknown;
    # read_ok False: its heartbeats may name offsets of a log Kafka lost, until it joins again
    read: dict[int, int] | None = None
    read_ok: bool = True
    # the topic filters its sessions subscribe to (its last `interest` record); None: not said,
    # or more than it lists (cluster/interest.py takes it as wanting every message)
    wants: list[str] | None = None


@dataclass
class Client:
    cid: str
    epoch: int               # offset of the claim that made the current owner
    node: str
    inc: str
    connected: bool = True
    clean: bool = False      # the claim asked Clean Start
    expiry: int = 0          # Session Expiry Interval granted (s); 0: ends with the connection
    expires_at: float | None = None  # wall clock (s) when an offline session ends
    will: dict | None = None
    will_at: float | None = None     # wall clock (s) when the pending will is published
    user: str | None = None
    session: dict | None = None      # the latest checkpoint of the session (written by cluster/node.py)
    prev: tuple | None = None        # (node, inc, epoch) of an owner whose last word is awaited
    handed_over: bool = True         # that last word arrived (or none is awaited)
    # (node, inc, epoch, will, user): the will of a connection taken over from another node,
    # which that node publishes when it ends the connection; published by the cluster if that
    # node incarnation is declared gone before it said the connection ended
    orphan_will: tuple | None = None


# ------------------------------------------------------------------ effects
class Claimed(NamedTuple):
    """A claim took effect: `client` is the new state; `prev` the client before it (None: new)."""
    client: Client
    req: str
    prev: Client | None


class Superseded(NamedTuple):
    """This node's ownership of `cid` (epoch `epoch`) ended: a newer claim, or the session ended
    elsewhere. Disconnect the client (0x8E when `by_claim`) and forget the session here;
    `final` asks for the session's last state (a handoff record) first."""
    cid: str
    epoch: int
    by_claim: bool
    final: bool
    publish_will: bool


class HandedOver(NamedTuple):
    """The previous owner's last word on `cid` arrived: its session can be rebuilt."""
    cid: str


class WillDue(NamedTuple):
    """The record that fired a will was applied: its writer (`by`) publishes it."""
    cid: str
    will: dict
    user: str | None
    by: str


class Ended(NamedTuple):
    cid: str
    epoch: int


class Evicted(NamedTuple):
    """A node incarnation is gone (declared dead, left, or restarted)."""
    node: str
    inc: str
    me: bool
    left: bool = False  # it said so itself (a clean stop), not declared dead by another


class Stale(NamedTuple):
    """A record for `cid` from an owner that no longer is one was applied after this node's
    state: the current owner writes its state again (the last record per key stays valid)."""
    cid: str


class Copy(NamedTuple):
    """The record at `offset` is a copy of one applied before (its writer's `seq` is not
    above the last one applied): ignored."""
    offset: int
    kind: str


class InterestChanged(NamedTuple):
    """A node's topic filters changed (or it joined or left): who wants which topics
    (cluster/interest.py)."""
    node: str


class Rung(NamedTuple):
    """A bell for this node: a node wrote messages some session here wants (cluster/interest.py)."""
    by: str


class BanChanged(NamedTuple):
    """A ban was added (`removed` False) or removed through some node: applied on every node."""
    ban: dict
    removed: bool


def rendezvous(key: str, nodes: Iterable[str]) -> str | None:
    """The node of `nodes` that `key` maps to (highest random weight): every node with the same
    live set computes the same one, and a node leaving moves only its own keys."""
    best, best_w = None, b""
    for n in nodes:
        w = hashlib.blake2b(f"{n}\0{key}".encode(), digest_size=8).digest()
        if best is None or w > best_w:
            best, best_w = n, w
    return best


def _will_delay(will: dict | None) -> int:
    return int((will or {}).get("delay") or 0)


class ControlState:
    def __init__(self, node: str, inc: str, clock: Callable[[], float]) -> None:
        self.node = node
        self.inc = inc
        self.clock = clock           # monotonic, local: only for "not seen for node_timeout"
        self.members: dict[str, Member] = {}
        self.clients: dict[str, Client] = {}
        self.applied = -1            # offset of the last record applied
        self.seqs: dict[tuple, int] = {}  # (node, inc) of each writer -> its last seq applied

    # ------------------------------------------------------------ queries
    def alive(self) -> list[str]:
        return sorted(n for n, m in self.members.items() if m.alive)

    def me_alive(self) -> bool:
        m = self.members.get(self.node)
        return m is not None and m.alive and m.inc == self.inc

    def _writer_alive(self, rec: Record) -> bool:
        m = self.members.get(rec.get("node"))
        return m is not None and m.alive and m.inc == rec.get("inc")

    def executor(self, c: Client) -> str | None:
        """Who fires the timers of an offline session: its owner while that one is alive,
        else the live node its client id maps to."""
        m = self.members.get(c.node)
        if m is not None and m.alive and m.inc == c.inc:
            return c.node
        return rendezvous(c.cid, self.alive())

    # ------------------------------------------------------------ apply
    def apply(self, offset: int, key: str, rec: Record | None, at: float) -> list:
        """Apply the record at `offset`; `at` is its timestamp (wall clock, s): deadlines that
        follow from it are computed from it, so every node computes the same ones."""
        self.applied = offset
        if rec is None:  # a tombstone: cleanup for compaction after an `end`; nothing to do
            return []
        kind = rec.get("t")
        seq = rec.get("seq")
        if seq is not None:  # (records.decode_control requires it; tests may leave it out)
            writer = (rec.get("by"), rec.get("by_inc")) if kind == "evict" else \
                (rec.get("node"), rec.get("inc"))
            if seq <= self.seqs.get(writer, 0):
                return [Copy(offset, kind)]  # written again: applied once already
            self.seqs[writer] = seq
        if key.startswith("n:"):
            return self._apply_node(kind, rec, at)
        if key.startswith("b:"):
            return [BanChanged(rec, kind == "unban")]
        if key.startswith("i:"):
            m = self.members.get(rec.get("node"))
            if m is None or not m.alive or m.inc != rec.get("inc"):
                return []
            m.wants = rec.get("filters")
            return [InterestChanged(m.node)]
        if key.startswith("r:"):
            return [Rung(rec.get("node"))] if rec.get("to") == self.node else []
        if key.startswith("c:"):
            cid = key[2:]
            if kind == "claim":
                return self._apply_claim(offset, cid, rec, at)
            if kind == "state":
                return self._apply_state(cid, rec)
            if kind == "end":
                return self._apply_end(cid, rec)
        return []

    def _apply_node(self, kind: str, rec: Record, at: float) -> list:
        node, inc = rec.get("node"), rec.get("inc")
        m = self.members.get(node)
        out: list = []
        if kind == "join":
            if m is not None and m.alive and m.inc != inc:
                out += self._gone(m, at)  # the node restarted: its old incarnation is gone
            self.members[node] = Member(node, inc, True, self.clock())
            out.append(InterestChanged(node))
        elif kind == "beat":
            if m is None or (not m.alive and m.inc != inc):
                # an incarnation whose join was compacted away
                self.members[node] = Member(node, inc, True, self.clock())
                out.append(InterestChanged(node))
            elif m.alive and m.inc == inc:
                m.seen = self.clock()
                read = rec.get("read")
                if read is not None and m.read_ok:
                    m.read = {int(p): o for p, o in read.items()}
            # else: a fenced incarnation still beating: ignored
        elif kind in ("leave", "evict") and m is not None and m.alive and m.inc == inc:
            if kind == "evict" and not self._writer_alive({"node": rec.get("by"),
                                                           "inc": rec.get("by_inc")}):
                return out  # only a live member may declare another dead
            m.left = kind == "leave"
            out += self._gone(m, at)
        return out

    def _gone(self, m: Member, at: float) -> list:
        """A node incarnation is gone: its connected clients are disconnected as of `at`
        (an abnormal end: wills after their delay [MQTT-3.1.2-8], expiry from then)."""
        m.alive = False
        out: list = [Evicted(m.node, m.inc, m.node == self.node and m.inc == self.inc, m.left),
                     InterestChanged(m.node)]
        for c in list(self.clients.values()):
            if c.prev is not None and c.prev[:2] == (m.node, m.inc) and not c.handed_over:
                c.handed_over = True  # its last word will never come: rebuild from what is known
                out.append(HandedOver(c.cid))
            o = c.orphan_will
            if o is not None and o[:2] == (m.node, m.inc):
                # the connection it took over ended with that node, its will unpublished
                # [MQTT-3.1.2-8]: published by the client's current executor, once
                c.orphan_will = None
                by = self.executor(c)
                if by is not None:
                    out.append(WillDue(c.cid, o[3], o[4], by))
            if c.node != m.node or c.inc != m.inc or not c.connected:
                continue
            c.connected = False
            self._offline(c, at)
            if c.expiry == 0 and c.will is None:
                del self.clients[c.cid]
                out.append(Ended(c.cid, c.epoch))
        return out

    @staticmethod
    def _offline(c: Client, at: float) -> None:
        if c.expiry != NEVER:
            c.expires_at = at + c.expiry
        if c.will is not None:
            # published after its delay, or when the session ends if that is sooner
            c.will_at = at + min(_will_delay(c.will), c.expiry if c.expiry != NEVER else NEVER)

    def _apply_claim(self, offset: int, cid: str, rec: Record, at: float) -> list:
        if not self._writer_alive(rec):
            return []  # a fenced node's claim: it cannot own anything
        prev = self.clients.get(cid)
        c = Client(cid, offset, rec["node"], rec["inc"], True, bool(rec.get("clean")),
                   int(rec.get("expiry") or 0), None, rec.get("will"), None, rec.get("user"))
        out: list = []
        if prev is not None:
            c.orphan_will = prev.orphan_will
            if not prev.connected and prev.will is not None and prev.will_at is not None and \
                    prev.will_at <= at and not self._writer_alive({"node": prev.node, "inc": prev.inc}):
                # the will of a session whose node is gone was due before this claim and its
                # executor had not fired it yet [MQTT-3.1.2-8]: the claimant publishes it
                out.append(WillDue(cid, prev.will, prev.user, c.node))
            # the session continues (Clean Start 0) if it exists: offline with an expiry, or
            # still connected [MQTT-3.1.2-5]
            same_session = not c.clean and (prev.expiry > 0 or prev.connected)
            if same_session:
                c.session = prev.session  # resumed: the new owner rebuilds from it
            publish_will = prev.connected and prev.will is not None and \
                (c.clean or _will_delay(prev.will) == 0)
            if prev.node != c.node or prev.inc != c.inc:
                prev_alive = self._writer_alive({"node": prev.node, "inc": prev.inc})
                if same_session and prev_alive:
                    c.prev = (prev.node, prev.inc, prev.epoch)
                    c.handed_over = False  # wait for its final state (rebuild from the freshest)
                if publish_will and prev_alive:
                    # its node publishes it when it applies this claim, and says so (final); if
                    # it is gone before (killed, not yet declared gone), the cluster does (_gone)
                    c.orphan_will = (prev.node, prev.inc, prev.epoch, prev.will, prev.user)
            if prev.node == self.node and prev.inc == self.inc and \
                    (c.node != self.node or c.inc != self.inc):
                # [MQTT-3.1.4-3] this node's connection (or offline session) is taken over by
                # another node; the old connection's will goes out if its delay is 0, or if the
                # session ends (Clean Start) [MQTT-3.1.2-8]; a resumed session with a delayed
                # will: not sent. (A claim of this node on its own client id is no rival: the
                # broker core takes over its own connection and resumes or ends its session,
                # as one broker does.)
                out.append(Superseded(cid, prev.epoch, True, c.prev is not None or publish_will,
                                      publish_will))
        self.clients[cid] = c
        out.insert(0, Claimed(c, rec.get("req", ""), prev))
        return out

    def _apply_state(self, cid: str, rec: Record) -> list:
        c = self.clients.get(cid)
        epoch = rec.get("epoch")
        if c is None:
            # no claim seen: compacted away (a replay), so this record is the client's state;
            # unless its writer is known to be fenced (then the client ended meanwhile)
            m = self.members.get(rec.get("node"))
            if rec.get("fired") or (m is not None and (not m.alive or m.inc != rec.get("inc"))):
                return []  # (an executor's timer record is never a client's only state)
            c = Client(cid, epoch, rec.get("node"), rec.get("inc"))
            self._set_state(c, rec)
            self.clients[cid] = c
            return []
        if epoch == c.epoch:
            if not self._may_write(c, rec):
                return []
            fired = c.will is not None and rec.get("will") is None and rec.get("fired")
            will, user = c.will, c.user
            if rec.get("node") == c.node and rec.get("inc") == c.inc:
                self._set_state(c, rec)  # the owner: the whole state
            elif fired:
                c.will = c.will_at = None  # the executor of an orphan: only its timer fired
            else:
                return []
            if fired:
                # (`fired` holds only when c.will, saved in `will`, was not None)
                return [WillDue(cid, will, user, rec.get("node"))]  # type: ignore[arg-type]
            return []
        self._orphan_will_handled(c, rec)
        if c.prev is not None and epoch == c.prev[2] and rec.get("final"):
            if rec.get("session") is not None:
                c.session = rec.get("session")
            if not c.handed_over:
                c.handed_over = True
                return [HandedOver(cid)]
            return []
        if c.node == self.node and c.inc == self.inc:
            return [Stale(cid)]
        return []

    @staticmethod
    def _orphan_will_handled(c: Client, rec: Record) -> None:
        """A record of the node whose connection `c` took over, saying that connection ended
        there (its will published by that node's own rules)."""
        o = c.orphan_will
        if o is not None and rec.get("epoch") == o[2] and (rec.get("node"), rec.get("inc")) == o[:2] \
                and (rec.get("final") or rec.get("t") == "end" or not rec.get("connected")):
            c.orphan_will = None

    def _may_write(self, c: Client, rec: Record) -> bool:
        """A live incarnation that owns the client, or fires the timers of an orphan."""
        if not self._writer_alive(rec):
            return False
        return (rec.get("node") == c.node and rec.get("inc") == c.inc) or \
            self.executor(c) == rec.get("node")

    @staticmethod
    def _set_state(c: Client, rec: Record) -> None:
        c.connected = bool(rec.get("connected"))
        c.expiry = int(rec.get("expiry") or 0)
        c.expires_at = rec.get("expires_at")
        c.will = rec.get("will")
        c.will_at = rec.get("will_at")
        c.user = rec.get("user")
        if "session" in rec:
            c.session = rec.get("session")

    def _apply_end(self, cid: str, rec: Record) -> list:
        c = self.clients.get(cid)
        if c is not None and rec.get("epoch") != c.epoch:
            self._orphan_will_handled(c, rec)
        if c is None or rec.get("epoch") != c.epoch or not self._may_write(c, rec):
            return []
        del self.clients[cid]
        out: list = []
        if rec.get("fired") and c.will is not None:
            out.append(WillDue(cid, c.will, c.user, rec.get("node")))
        if c.node == self.node and c.inc == self.inc and rec.get("node") != self.node:
            out.append(Superseded(cid, c.epoch, False, False, False))
        out.append(Ended(cid, c.epoch))
        return out

    # ------------------------------------------------------------ timers
    def due(self, now: float) -> list[tuple[str, Client]]:
        """("will" | "expire", client) for the timers this node must fire now: those of offline
        sessions whose owner is gone (an owner that is alive runs its own, in its broker core)."""
        if not self.me_alive():
            return []
        out = []
        for c in self.clients.values():
            if c.connected:
                continue
            m = self.members.get(c.node)
            if m is not None and m.alive and m.inc == c.inc:
                continue  # the owner's broker core runs them
            if self.executor(c) != self.node:
                continue
            if c.expires_at is not None and c.expires_at <= now:
                out.append(("expire", c))
            elif c.will is not None and c.will_at is not None and c.will_at <= now:
                out.append(("will", c))
        return out

    def silent(self, timeout: float) -> list[Member]:
        """Live members (other than this node) not heard from for `timeout` seconds."""
        now = self.clock()
        return [m for m in self.members.values()
                if m.alive and m.node != self.node and now - m.seen > timeout]


# ------------------------------------------------------------------ record builders
def node_record(kind: str, node: str, inc: str, **extra: Any) -> dict:
    return {"t": kind, "node": node, "inc": inc, **extra}


def claim_record(node: str, inc: str, req: str, clean: bool, expiry: int, will: dict | None,
                 user: str | None) -> dict:
    return {"t": "claim", "node": node, "inc": inc, "req": req, "clean": clean,
            "expiry": expiry, "will": will, "user": user}


def state_record(c: Client, node: str, inc: str, **changes: Any) -> dict:
    rec = {"t": "state", "epoch": c.epoch, "node": node, "inc": inc, "connected": c.connected,
           "expiry": c.expiry, "expires_at": c.expires_at, "will": c.will, "will_at": c.will_at,
           "user": c.user, "session": c.session}
    rec.update(changes)
    return rec


def ban_record(node: str, inc: str, ban: dict) -> dict:
    """A ban as broker/admin/bans.py BanList.add made it (kind, value, reason, until, at, by)."""
    return {"t": "ban", "node": node, "inc": inc, "kind": ban["kind"], "value": ban["value"],
            "reason": str(ban.get("reason") or "")[:500], "until": ban.get("until"),
            "at": ban.get("at"), "by": str(ban.get("by") or "")}


def unban_record(node: str, inc: str, kind: str, value: str) -> dict:
    return {"t": "unban", "node": node, "inc": inc, "kind": kind, "value": value}


def end_record(c: Client, node: str, inc: str, fired: bool = False) -> dict:
    return {"t": "end", "epoch": c.epoch, "node": node, "inc": inc, "fired": fired}
