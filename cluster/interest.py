"""Interest: a node reads the messages topic only while some session on it may want what is
written there (deploy/SCALE.md "Interest").

Every node reads every message record otherwise, and what a node pays per record is mostly
per fetch (kafka-python's request and response handling, the hand-over to the loop), not per
record: at 5,000 msg/s a node none of whose sessions wanted any record spent 19-25 us per
message (bench/cluster_bench.py --only filter). So the reading is gated, not the records:

* Each node tells the others the topic filters its sessions subscribe to: an `interest`
  control record (key `i:<node>`, control.py) whenever a filter gains its first subscription
  on it or loses its last (Broker.plain_filters(); `$SYS/...` aside: only the broker itself
  publishes there, never through the cluster); past MAX_FILTERS it says "everything".
* A node that writes a message rings each other node whose filters match its topic: a `bell`
  control record (key `r:<node>`), at most one per BELL_EVERY seconds to each node.
* A node fetches the messages partitions while it is awake: for AWAKE_FOR seconds after a bell
  or after its own filters changed, and whenever it holds its own messages until they are
  read back, is starting new subscriptions, or is spilling (cluster/held.py). Asleep, it
  fetches them once every SKIM_EVERY seconds and goes through what was written meanwhile as
  before (keys first: cluster/reading.py), in one larger fetch.

Nothing here decides what a session gets: the read positions do, as before (every record is
read, in order, however late). A missed or late bell (a node whose filters the writer has not
read yet, a bell that arrives after the node went to sleep) delays a delivery by at most
SKIM_EVERY seconds; it never loses one. What a node with no matching subscriber pays is one
fetch of the messages partitions per SKIM_EVERY (its keys scanned) instead of one per fetch
wait.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from mqtt_topics import TopicTrie

if TYPE_CHECKING:
    from .control import ControlState

MAX_FILTERS = 1000      # a node with more filters says "every message" (None)
BELL_EVERY = 0.25       # seconds between two bells from one node to another
AWAKE_FOR = 2.0         # seconds a node reads the messages topic after a bell or a change of its filters
SKIM_EVERY = 0.5        # seconds between two reads of the messages topic by a node asleep
CACHE_ENTRIES = 100_000  # topics whose nodes to ring are remembered (emptied when full)


class Interest:
    """`state`: the cluster's replicated state (each member's `wants`); `clock`: monotonic."""

    def __init__(self, node: str, state: Callable[[], ControlState | None],
                 clock: Callable[[], float]) -> None:
        self.node = node
        self.state = state
        self.clock = clock
        # writing: the other nodes' filters, and per topic the nodes to ring (None: rebuild)
        self.trie: TopicTrie | None = None
        self.everything: tuple[str, ...] = ()   # nodes that want every message
        self.cache: dict[str, tuple[str, ...]] = {}
        self.next_bell: dict[str, float] = {}   # node -> when it may be rung again
        self.bells = 0
        # reading
        self.said: int | None = None            # the version of this node's filters last said
        self.listed: list[str] | None | bool = False  # what it said then (False: nothing yet)
        self.awake_until = 0.0
        self.next_skim = 0.0
        self.skims = 0
        self.rung = 0

    # ------------------------------------------------------------ this node's filters
    def changed(self, version: int, filters: dict[str, int]) -> dict | None:
        """The `interest` record to write when this node's filters changed since it last said
        them (None otherwise); this node reads the messages topic for AWAKE_FOR from now, until
        the writers have read it."""
        if version == self.said:
            return None
        self.said = version
        # $SYS/... is the broker's own, never a cluster message (clients may not publish there)
        mine = sorted(f for f in filters if not f.startswith("$SYS"))
        listed = mine if len(mine) <= MAX_FILTERS else None
        if listed == self.listed:
            return None
        self.listed = listed
        self.awake_until = self.clock() + AWAKE_FOR
        return {"filters": listed}

    def again(self) -> None:
        """Say this node's filters again at the next chance (it joined again)."""
        self.said = None
        self.listed = False

    # ------------------------------------------------------------ writing: whom to ring
    def others_changed(self) -> None:
        """Some node's filters, or the live members, changed."""
        self.trie = None
        self.cache = {}

    def _build(self) -> None:
        trie, everything = TopicTrie(), []
        st = self.state()
        for m in st.members.values() if st is not None else ():
            if not m.alive or m.node == self.node:
                continue
            if m.wants is None:
                everything.append(m.node)
                continue
            for f in m.wants:
                trie.add(f, m.node, True)
        self.trie, self.everything = trie, tuple(sorted(everything))

    def wanted_by(self, topic: str) -> tuple[str, ...]:
        """The other live nodes whose sessions may want a message on `topic`."""
        got = self.cache.get(topic)
        if got is not None:
            return got
        if self.trie is None:
            self._build()
        nodes = set(self.everything)
        for values in self.trie.match(topic):  # type: ignore[union-attr]
            nodes.update(values)
        got = tuple(sorted(nodes))
        if len(self.cache) >= CACHE_ENTRIES:
            self.cache = {}
        self.cache[topic] = got
        return got

    def to_ring(self, topic: str, now: float) -> list[str]:
        """The nodes to ring for a message written now on `topic` (each at most once per
        BELL_EVERY)."""
        nodes = self.wanted_by(topic)
        if not nodes:
            return []
        out = []
        nb = self.next_bell
        for n in nodes:
            if nb.get(n, 0.0) <= now:
                nb[n] = now + BELL_EVERY
                out.append(n)
        self.bells += len(out)
        return out

    # ------------------------------------------------------------ reading: awake or not
    def wake(self) -> None:
        """A bell for this node was read."""
        self.rung += 1
        self.awake_until = self.clock() + AWAKE_FOR

    def reads_messages(self, busy: bool) -> bool:
        """Whether the next fetch includes the messages partitions (asked on the reading
        thread before each fetch): while awake or `busy` (held, starting or spilling
        messages: cluster/node.py), else once every SKIM_EVERY."""
        now = self.clock()
        if busy or now < self.awake_until:
            return True
        if now >= self.next_skim:
            self.next_skim = now + SKIM_EVERY
            self.skims += 1
            return True
        return False
