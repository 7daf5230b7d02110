"""The cluster's replicated control state (cluster/control.py), without Kafka: records applied in
log order on several replicas, nodes that write from stale views, fencing, wills fired once."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import control as C


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Log:
    """The control topic: records in the order Kafka gave them."""

    def __init__(self):
        self.records: list[tuple[str, dict | None, float]] = []

    def write(self, key, rec, at=0.0):
        self.records.append((key, rec, at))
        return len(self.records) - 1


class Replica:
    """One node's view: it has applied a prefix of the log."""

    def __init__(self, log: Log, node: str, inc: str):
        self.log = log
        self.clock = Clock()
        self.state = C.ControlState(node, inc, self.clock)
        self.upto = 0
        self.effects: list = []

    def catch_up(self, n: int | None = None):
        end = len(self.log.records) if n is None else min(len(self.log.records), self.upto + n)
        while self.upto < end:
            key, rec, at = self.log.records[self.upto]
            self.effects += self.state.apply(self.upto, key, rec, at)
            self.upto += 1


def join(log, node, inc, at=0.0):
    log.write(f"n:{node}", C.node_record("join", node, inc), at)


def claim(log, node, inc, cid, req="r", clean=False, expiry=60, will=None):
    return log.write(f"c:{cid}", C.claim_record(node, inc, req, clean, expiry, will, None))


def test_the_last_claim_in_the_log_owns_the_client_id_on_every_node():
    """[MQTT-3.1.4-3]: concurrent CONNECTs with one client id on two nodes end with one owner,
    the same on every node, decided by the log's order (not by clocks); the earlier owner is
    told to hand over and disconnect its client (0x8E)."""
    log = Log()
    join(log, "a", "a1")
    join(log, "b", "b1")
    claim(log, "a", "a1", "dev", "ra")
    claim(log, "b", "b1", "dev", "rb")
    a, b = Replica(log, "a", "a1"), Replica(log, "b", "b1")
    a.catch_up()
    b.catch_up()
    for r in (a, b):
        c = r.state.clients["dev"]
        assert (c.node, c.epoch) == ("b", 3)
    sup = [e for e in a.effects if isinstance(e, C.Superseded)]
    assert sup == [C.Superseded("dev", 2, True, True, False)]
    assert not [e for e in b.effects if isinstance(e, C.Superseded)]
    mine = [e.req for e in b.effects if isinstance(e, C.Claimed) and e.client.node == "b"]
    assert mine == ["rb"]


def test_a_late_state_record_of_a_superseded_owner_is_ignored_and_reasserted():
    log = Log()
    join(log, "a", "a1")
    join(log, "b", "b1")
    e_a = claim(log, "a", "a1", "dev")
    e_b = claim(log, "b", "b1", "dev")
    b = Replica(log, "b", "b1")
    b.catch_up()
    c = b.state.clients["dev"]
    log.write("c:dev", C.state_record(c, "b", "b1", connected=True, session={"subs": [["x", 1]]}))
    stale = C.Client("dev", e_a, "a", "a1")
    log.write("c:dev", C.state_record(stale, "a", "a1", connected=False, session={"subs": []}))
    b.catch_up()
    c = b.state.clients["dev"]
    assert (c.epoch, c.node, c.session) == (e_b, "b", {"subs": [["x", 1]]})
    assert C.Stale("dev") in b.effects  # b writes its state again: the last record stays valid


def test_records_of_a_node_declared_gone_are_fenced():
    log = Log()
    join(log, "a", "a1")
    join(log, "b", "b1")
    log.write("n:a", C.node_record("evict", "a", "a1", by="b", by_inc="b1"), 10.0)
    claim(log, "a", "a1", "dev")  # written by a before it learnt it was gone
    a, b = Replica(log, "a", "a1"), Replica(log, "b", "b1")
    a.catch_up()
    b.catch_up()
    for r in (a, b):
        assert "dev" not in r.state.clients and not r.state.members["a"].alive
    assert C.Evicted("a", "a1", True) in a.effects  # a learns it must rejoin
    join(log, "a", "a2")
    claim(log, "a", "a2", "dev")
    b.catch_up()
    assert b.state.clients["dev"].inc == "a2"


def test_a_node_that_leaves_is_told_apart_from_one_declared_gone():
    """A clean stop ("leave") is an expected departure (logged at INFO by the others); an
    eviction by another node is not (a WARNING)."""
    log = Log()
    for n in ("a", "b", "c"):
        join(log, n, n + "1")
    log.write("n:a", C.node_record("leave", "a", "a1"))
    log.write("n:b", C.node_record("evict", "b", "b1", by="c", by_inc="c1"))
    r = Replica(log, "c", "c1")
    r.catch_up()
    gone = {e.node: e.left for e in r.effects if isinstance(e, C.Evicted)}
    assert gone == {"a": True, "b": False}


def test_only_a_live_member_may_declare_another_gone():
    log = Log()
    join(log, "a", "a1")
    join(log, "b", "b1")
    log.write("n:a", C.node_record("evict", "a", "a1", by="z", by_inc="z1"))
    r = Replica(log, "b", "b1")
    r.catch_up()
    assert r.state.members["a"].alive


def test_clients_of_a_gone_node_go_offline_with_their_wills_and_expiry_from_that_moment():
    """[MQTT-3.1.2-8]: an abnormal end: the will after its delay (or at session end if sooner);
    the session expires its interval after the node was declared gone."""
    log = Log()
    join(log, "a", "a1")
    join(log, "b", "b1")
    claim(log, "a", "a1", "w1", expiry=100, will={"topic": "t", "payload": "x", "qos": 0,
                                                  "retain": False, "delay": 30})
    claim(log, "a", "a1", "w2", expiry=5, will={"topic": "t", "payload": "y", "qos": 0,
                                                "retain": False, "delay": 30})
    claim(log, "a", "a1", "plain", expiry=0)
    log.write("n:a", C.node_record("evict", "a", "a1", by="b", by_inc="b1"), 1000.0)
    b = Replica(log, "b", "b1")
    b.catch_up()
    w1, w2 = b.state.clients["w1"], b.state.clients["w2"]
    assert (w1.connected, w1.will_at, w1.expires_at) == (False, 1030.0, 1100.0)
    assert (w2.will_at, w2.expires_at) == (1005.0, 1005.0)  # the session ends first
    assert "plain" not in b.state.clients  # a clean session without will ends with its node
    assert b.state.due(1004.0) == []
    assert [(k, c.cid) for k, c in b.state.due(1005.0)] == [("expire", "w2")]
    assert sorted((k, c.cid) for k, c in b.state.due(1030.0)) == [("expire", "w2"), ("will", "w1")]


def test_a_will_is_published_once_even_when_two_nodes_fire_it():
    """Two executors with different views both write the firing record: the first applied is
    the one whose writer publishes; the second changes nothing."""
    log = Log()
    for n in ("a", "b", "c"):
        join(log, n, n + "1")
    will = {"topic": "t", "payload": "bye", "qos": 1, "retain": False, "delay": 0}
    claim(log, "a", "a1", "w", expiry=100, will=will)
    log.write("n:a", C.node_record("evict", "a", "a1", by="b", by_inc="b1"), 50.0)
    b, c = Replica(log, "b", "b1"), Replica(log, "c", "c1")
    b.catch_up()
    c.catch_up()
    cl = b.state.clients["w"]
    # both believe they are the executor (views differ in real life): both write
    log.write("c:w", C.state_record(cl, "b", "b1", will=None, will_at=None, fired=True))
    log.write("c:w", C.state_record(cl, "c", "c1", will=None, will_at=None, fired=True))
    b.catch_up()
    c.catch_up()
    dues = [e for e in b.effects if isinstance(e, C.WillDue)]
    assert len(dues) <= 1 and dues == [e for e in c.effects if isinstance(e, C.WillDue)]
    executor = b.state.executor(cl)
    if dues:
        assert dues[0].by == executor  # only the executor's record may fire it


def test_a_claim_resuming_a_session_waits_for_the_live_previous_owners_last_word():
    log = Log()
    join(log, "a", "a1")
    join(log, "b", "b1")
    e_a = claim(log, "a", "a1", "s", expiry=600)
    a_client = C.Client("s", e_a, "a", "a1")
    log.write("c:s", C.state_record(a_client, "a", "a1", connected=True, expiry=600,
                                    session={"subs": [["t/#", 1]], "pos": {"0": 5}}))
    claim(log, "b", "b1", "s", "rb", expiry=600)
    b = Replica(log, "b", "b1")
    b.catch_up()
    c = b.state.clients["s"]
    assert c.prev == ("a", "a1", e_a) and not c.handed_over
    log.write("c:s", C.state_record(a_client, "a", "a1", connected=False, expiry=600, final=True,
                                    session={"subs": [["t/#", 1]], "pos": {"0": 9}}))
    b.catch_up()
    assert C.HandedOver("s") in b.effects and b.state.clients["s"].session["pos"] == {"0": 9}


def test_a_previous_owner_that_dies_releases_the_wait():
    log = Log()
    join(log, "a", "a1")
    join(log, "b", "b1")
    claim(log, "a", "a1", "s", expiry=600)
    claim(log, "b", "b1", "s", "rb", expiry=600)
    log.write("n:a", C.node_record("evict", "a", "a1", by="b", by_inc="b1"))
    b = Replica(log, "b", "b1")
    b.catch_up()
    assert C.HandedOver("s") in b.effects and b.state.clients["s"].handed_over


def test_a_clean_start_claim_does_not_resume_the_session():
    log = Log()
    join(log, "a", "a1")
    join(log, "b", "b1")
    e = claim(log, "a", "a1", "s", expiry=600)
    log.write("c:s", C.state_record(C.Client("s", e, "a", "a1"), "a", "a1", connected=False,
                                    expiry=600, session={"subs": [["x", 1]]}))
    claim(log, "b", "b1", "s", clean=True)
    b = Replica(log, "b", "b1")
    b.catch_up()
    c = b.state.clients["s"]
    assert c.session is None and c.prev is None and c.handed_over


def test_a_node_restarting_with_a_new_incarnation_ends_its_old_ones_connections():
    log = Log()
    join(log, "a", "a1")
    claim(log, "a", "a1", "s", expiry=600)
    join(log, "a", "a2", at=77.0)
    r = Replica(log, "x", "x1")
    r.catch_up()
    c = r.state.clients["s"]
    assert not c.connected and c.expires_at == 677.0
    assert C.Evicted("a", "a1", False) in r.effects


def test_silent_members_are_reported_after_the_timeout():
    log = Log()
    join(log, "a", "a1")
    join(log, "b", "b1")
    b = Replica(log, "b", "b1")
    b.catch_up()
    b.clock.t = 4.0
    assert [m.node for m in b.state.silent(5.0)] == []
    b.clock.t = 6.0
    assert [m.node for m in b.state.silent(5.0)] == ["a"]
    log.write("n:a", C.node_record("beat", "a", "a1"))
    b.catch_up()
    assert b.state.silent(5.0) == []


def test_rendezvous_moves_only_the_keys_of_a_node_that_leaves():
    keys = [f"client-{i}" for i in range(2000)]
    before = {k: C.rendezvous(k, ["a", "b", "c"]) for k in keys}
    after = {k: C.rendezvous(k, ["a", "c"]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "b" for k in moved)
    counts = {n: sum(1 for k in keys if before[k] == n) for n in "abc"}
    assert min(counts.values()) > 500  # spread evenly enough


# ------------------------------------------------------------------ properties
ops = st.lists(st.tuples(st.sampled_from(["claim", "state", "end", "evict", "rejoin", "sync"]),
                         st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y"])),
               min_size=1, max_size=40)


@settings(max_examples=500, deadline=None)
@given(ops, st.lists(st.integers(0, 5), min_size=3, max_size=3))
def test_replicas_that_apply_one_log_agree_and_never_see_two_owners(script, lags):
    """Nodes write records from views that lag the log by different amounts (as they do: each
    reads Kafka at its own pace); whatever they write, every replica that applies the whole log
    ends in the same state, and each client id has one owner, a live incarnation."""
    log = Log()
    incs = {"a": "a0", "b": "b0", "c": "c0"}
    for n, i in incs.items():
        join(log, n, i)
    views = {n: Replica(log, n, incs[n]) for n in incs}
    for v in views.values():
        v.catch_up()
    for step, (op, n, cid) in enumerate(script):
        v = views[n]
        v.catch_up(lags[ord(n) - ord("a")] + 1)
        me = incs[n]
        c = v.state.clients.get(cid)
        if op == "claim":
            claim(log, n, me, cid, f"{n}{step}", expiry=60)
        elif op == "state" and c is not None:
            log.write(f"c:{cid}", C.state_record(c, n, me, connected=(step % 2 == 0)))
        elif op == "end" and c is not None:
            log.write(f"c:{cid}", C.end_record(c, n, me, fired=True))
        elif op == "evict":
            other = "abc"[(ord(n) - ord("a") + 1) % 3]
            m = v.state.members.get(other)
            if m is not None:
                log.write(f"n:{other}", C.node_record("evict", other, m.inc, by=n, by_inc=me))
        elif op == "rejoin" and not v.state.me_alive():
            incs[n] = f"{n}{step}"
            views[n] = Replica(log, n, incs[n])
            join(log, n, incs[n])
        elif op == "sync":
            v.catch_up()
    finals = []
    for n in incs:
        r = Replica(log, n, incs[n])
        r.catch_up()
        finals.append(r)
        for cl in r.state.clients.values():
            m = r.state.members.get(cl.node)
            if cl.connected:
                assert m is not None and m.alive and m.inc == cl.inc
        # a will fires at most once per claim (between two claims of its client id)
        since_claim: dict = {}
        for e in r.effects:
            if isinstance(e, C.Claimed):
                since_claim[e.client.cid] = 0
            elif isinstance(e, C.WillDue):
                since_claim[e.cid] = since_claim.get(e.cid, 0) + 1
                assert since_claim[e.cid] == 1, f"will of {e.cid} fired twice"
    ref = finals[0].state
    for r in finals[1:]:
        assert {k: (c.epoch, c.node, c.inc, c.connected) for k, c in r.state.clients.items()} == \
            {k: (c.epoch, c.node, c.inc, c.connected) for k, c in ref.clients.items()}
        assert {k: (m.inc, m.alive) for k, m in r.state.members.items()} == \
            {k: (m.inc, m.alive) for k, m in ref.members.items()}


def test_the_producer_cuts_a_turns_records_into_requests_of_bounded_size():
    from cluster.produce import _chunks
    work = [("t", 0, b"x" * n, i) for i, n in enumerate([400, 400, 400, 2000, 10, 10])]
    chunks = list(_chunks(work, 1000))
    assert [[w[3] for w in c] for c in chunks] == [[0, 1], [2], [3], [4, 5]]
    assert [w for c in chunks for w in c] == work  # every record once, in order
    assert list(_chunks(work[:1], 10)) == [work[:1]]  # one larger than the limit goes alone
