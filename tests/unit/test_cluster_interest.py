"""Which nodes want which topics (cluster/interest.py), without Kafka: a node says its sessions'
topic filters when one gains its first subscription or loses its last; a writer rings exactly the
other live nodes whose filters match a message's topic, at most once per BELL_EVERY; a node reads
the messages topic while awake (a bell, its own filters changed, messages held or starting) and
otherwise once every SKIM_EVERY. Bells only hasten reading: what a session gets is decided by
the read positions, as before."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import packets as P
from cluster import control as C
from cluster import interest as I
from cluster import records as R
from mqtt_topics import matches
from tests.sansio import Client, bye, make, subscribe
from tests.unit.test_cluster_control import Clock, Log, Replica, join


def interest(log, node, inc, filters):
    log.write(f"i:{node}", {"t": "interest", "node": node, "inc": inc, "filters": filters})


def writer(replica: Replica) -> I.Interest:
    return I.Interest(replica.state.node, lambda: replica.state, replica.clock)


def test_a_writer_rings_the_live_nodes_whose_filters_match_the_topic():
    log = Log()
    for n in ("n1", "n2", "n3"):
        join(log, n, f"{n}-i")
    interest(log, "n2", "n2-i", ["sensors/+/temp", "alerts/#"])
    interest(log, "n3", "n3-i", ["elsewhere/#"])
    r = Replica(log, "n1", "n1-i")
    r.catch_up()
    w = writer(r)
    assert w.wanted_by("sensors/a/temp") == ("n2",)
    assert w.wanted_by("alerts") == ("n2",)  # '#' matches its parent level [MQTT-4.7.1-2]
    assert w.wanted_by("elsewhere/x") == ("n3",)
    assert w.wanted_by("sensors/a/humidity") == ()
    # [MQTT-4.7.2-1] a filter starting with a wildcard does not match a topic starting with '$'
    log.write("i:n3", {"t": "interest", "node": "n3", "inc": "n3-i", "filters": ["#"]})
    r.catch_up()
    assert C.InterestChanged("n3") in r.effects
    w.others_changed()
    assert w.wanted_by("$app/x") == ()
    assert w.wanted_by("any/thing") == ("n3",)


def test_a_node_that_has_not_said_its_filters_or_says_too_many_is_rung_for_everything():
    log = Log()
    join(log, "n1", "n1-i")
    join(log, "n2", "n2-i")
    join(log, "n3", "n3-i")
    interest(log, "n3", "n3-i", None)  # more than MAX_FILTERS
    r = Replica(log, "n1", "n1-i")
    r.catch_up()
    assert writer(r).wanted_by("a/b") == ("n2", "n3")


def test_the_filters_of_a_gone_or_older_incarnation_are_not_rung():
    log = Log()
    join(log, "n1", "n1-i")
    join(log, "n2", "old")
    interest(log, "n2", "old", ["a/#"])
    join(log, "n2", "new")               # n2 restarted: its filters are said again by "new"
    interest(log, "n2", "old", ["b/#"])  # a late record of the old incarnation: ignored
    r = Replica(log, "n1", "n1-i")
    r.catch_up()
    assert r.state.members["n2"].wants is None and writer(r).wanted_by("b/x") == ("n2",)
    interest(log, "n2", "new", ["a/#"])
    log.write("n:n2", C.node_record("leave", "n2", "new"))
    r.catch_up()
    assert writer(r).wanted_by("a/x") == ()  # gone: nobody to ring


def test_a_node_is_rung_at_most_once_per_bell_interval_and_never_itself():
    log = Log()
    join(log, "n1", "n1-i")
    join(log, "n2", "n2-i")
    interest(log, "n1", "n1-i", ["#"])
    interest(log, "n2", "n2-i", ["#"])
    r = Replica(log, "n1", "n1-i")
    r.catch_up()
    w = writer(r)
    assert w.to_ring("t", 10.0) == ["n2"]
    assert w.to_ring("u", 10.0 + I.BELL_EVERY / 2) == []
    assert w.to_ring("t", 10.0 + I.BELL_EVERY) == ["n2"]
    assert w.bells == 2


def test_a_bell_wakes_only_the_node_it_is_for():
    log = Log()
    join(log, "n1", "n1-i")
    join(log, "n2", "n2-i")
    log.write("r:n2", {"t": "bell", "node": "n1", "inc": "n1-i", "to": "n2"})
    r2, r1 = Replica(log, "n2", "n2-i"), Replica(log, "n1", "n1-i")
    r2.catch_up()
    r1.catch_up()
    assert C.Rung("n1") in r2.effects
    assert not any(isinstance(e, C.Rung) for e in r1.effects)


def test_a_node_says_its_filters_when_one_gains_its_first_subscription_or_loses_its_last():
    """Broker.plain_filters(): $share subscriptions are not counted (their groups read their
    own streams); a second subscription to a filter changes nothing to say."""
    broker, _ = make()
    mine = I.Interest("n1", lambda: None, Clock())
    assert mine.changed(*broker.plain_filters()) == {"filters": []}
    assert mine.changed(*broker.plain_filters()) is None
    a, b, c = Client(broker), Client(broker), Client(broker)
    for cl, cid in ((a, "a"), (b, "b"), (c, "c")):
        cl.connect(cid)
    subscribe(a, "s/+/t")
    assert mine.changed(*broker.plain_filters()) == {"filters": ["s/+/t"]}
    subscribe(b, "s/+/t")
    subscribe(c, "$share/g/x/#")
    assert mine.changed(*broker.plain_filters()) is None
    a.send(P.Unsubscribe(2, ["s/+/t"]))
    assert mine.changed(*broker.plain_filters()) is None  # b still has it
    assert broker.plain_filters()[1] == {"s/+/t": 1}
    subscribe(c, "$SYS/broker/#")  # the broker's own topics never come through the cluster
    assert mine.changed(*broker.plain_filters()) is None
    bye(b)
    assert mine.changed(*broker.plain_filters()) == {"filters": []}


def test_more_filters_than_a_record_lists_are_said_as_everything():
    mine = I.Interest("n1", lambda: None, Clock())
    many = {f"d/{i}": 1 for i in range(I.MAX_FILTERS + 1)}
    assert mine.changed(1, many) == {"filters": None}


def test_an_asleep_node_reads_the_messages_topic_once_per_skim_and_awake_at_every_fetch():
    clock = Clock()
    mine = I.Interest("n1", lambda: None, clock)
    mine.changed(1, {})  # its filters just changed: awake until the writers know them
    assert all(mine.reads_messages(False) for _ in range(3))
    clock.t += I.AWAKE_FOR
    reads = []
    for _ in range(40):  # 2 s of fetches every 50 ms
        reads.append(mine.reads_messages(False))
        clock.t += 0.05
    assert sum(reads) == round(2.0 / I.SKIM_EVERY)
    assert mine.reads_messages(True)  # held or starting messages: always
    mine.wake()
    assert all(mine.reads_messages(False) for _ in range(3)) and mine.rung == 1
    clock.t += I.AWAKE_FOR + I.SKIM_EVERY
    assert mine.reads_messages(False) and not mine.reads_messages(False)


class OneBatchKafka:
    """A Fetcher's surface over logs that grow: each fetch answers a partition with at most
    BATCH records from its position (one fetch does not always reach the end), and its end."""
    BATCH = 10

    def __init__(self, ends: dict) -> None:
        self.ends = dict(ends)
        self.positions = dict.fromkeys(ends, 0)
        self.high: dict = {}
        self.skip: frozenset = frozenset()
        self.wait_ms = 5
        self.read: list[set] = []  # per fetch, the topics it read

    def fetch(self) -> list:
        topics = {tp[0] for tp in self.positions if tp[0] not in self.skip}
        self.read.append(topics)
        for tp in self.positions:
            if tp[0] in topics:
                self.positions[tp] = min(self.positions[tp] + self.BATCH, self.ends[tp])
                self.high[tp] = self.ends[tp]
        return []

    def sample_ends(self, topics) -> None:
        self.high.update({tp: e for tp, e in self.ends.items() if tp[0] in topics})

    def lost_data(self, why: str) -> None:
        raise AssertionError(why)

    def take_lost(self) -> None:
        return None


def test_a_skim_reads_the_messages_topic_to_where_it_ended_however_many_fetches_that_takes():
    """A node asleep that read one fetch per skim fell further behind (a fetch does not always
    reach the end), and a session moved to it got again what its last node had delivered. A
    skim goes on to the end known when it began, then the node sleeps again (and does not
    chase what is written meanwhile)."""
    from cluster.link import FetchReader
    ctl, msg = ("ctl", 0), ("msg", 0)
    k = OneBatchKafka({ctl: 0, msg: 0})
    skims = iter([False, False, True] + [False] * 30)
    r = FetchReader(k, None, lambda b: None, gated=frozenset({"msg"}),  # type: ignore[arg-type]
                    follow=lambda: next(skims))
    r.SAMPLE_EVERY = 0.0   # (its ends asked for at every fetch while asleep)

    def fetch() -> list:
        if len(k.read) == 1:
            k.ends[msg] = 95     # written while asleep: known to the skim by its sampled end
        if len(k.read) == 5:
            k.ends[msg] = 500    # written during the skim: left to the next one
        r.stopping = len(k.read) >= 20
        return OneBatchKafka.fetch(k)
    k.fetch = fetch  # type: ignore[method-assign]
    r.run()
    reading = [i for i, topics in enumerate(k.read) if "msg" in topics]
    assert reading == list(range(2, 12)), reading  # the skim and the 9 more to offset 95
    assert k.positions[msg] == 100  # (past 95 in its last batch: 500 were there by then)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a/b", "a/+", "+/b", "#", "a/#", "c", "$s/b", "+/+/c"]),
                max_size=4, unique=True),
       st.sampled_from(["a/b", "a", "c", "a/b/c", "$s/b", "x/y/c", "b"]))
def test_a_node_is_rung_exactly_when_one_of_its_filters_matches(filters, topic):
    log = Log()
    join(log, "n1", "n1-i")
    join(log, "n2", "n2-i")
    interest(log, "n2", "n2-i", filters)
    r = Replica(log, "n1", "n1-i")
    r.catch_up()
    want = any(matches(f, topic) for f in filters)
    assert writer(r).wanted_by(topic) == (("n2",) if want else ())


@pytest.mark.parametrize("key,rec,why", [
    ("i:n2", {"t": "interest", "node": "n1", "inc": "i", "seq": 1, "filters": []}, "under key"),
    ("i:n1", {"t": "interest", "node": "n1", "inc": "i", "seq": 1, "filters": [""]}, "mistyped"),
    ("i:n1", {"t": "interest", "node": "n1", "inc": "i", "seq": 1}, "missing"),
    ("r:n3", {"t": "bell", "node": "n1", "inc": "i", "seq": 1, "to": "n2"}, "under key"),
    ("n:n1", {"t": "bell", "node": "n1", "inc": "i", "seq": 1, "to": "n1"}, "under key"),
])
def test_malformed_interest_and_bell_records_are_refused(key, rec, why):
    with pytest.raises(R.Malformed, match=why):
        R.decode_control(key.encode(), R.dumps(rec))


def test_interest_and_bell_records_a_node_writes_are_well_formed():
    for key, rec in (("i:n1", {"t": "interest", "node": "n1", "inc": "i", "seq": 1,
                                "filters": ["a/#", "+/b"]}),
                     ("i:n1", {"t": "interest", "node": "n1", "inc": "i", "seq": 2, "filters": None}),
                     ("r:n2", {"t": "bell", "node": "n1", "inc": "i", "seq": 3, "to": "n2"})):
        assert R.decode_control(key.encode(), R.dumps(rec)) == (key, rec)
