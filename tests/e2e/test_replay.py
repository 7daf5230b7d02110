"""Replay over MQTT through the whole product (docs/history.md "Replay over MQTT"): a real broker with its
sink and an embedded Kafka (Tansu), the history job writing the table, and MQTT clients.

Messages are published, the job commits them in two runs (the committed file is then put back
to what the first run wrote: it lags the table, as it does by a batch in a running job), more
are published that only Kafka has, then a client subscribes to "$replay/<time>/s/#" with a small
Receive Maximum while more are published; once the broker says the replay is live, more still.
It receives every message once, in order per topic: the older ones from the table, the rest from
Kafka, then live ones without the marker, with neither gap nor duplicate; never more
unacknowledged PUBLISHes than its Receive Maximum [MQTT-3.3.4-9]; nothing the ACL keeps from it.
Nothing here depends on the machine's speed: the test waits for the switch (a busy machine
makes it later, never wrong)."""
from __future__ import annotations

import datetime as dt
import re
import shutil
import threading
import time

import pytest

from broker.auth import hash_password
from broker.protocol import packets as P
from broker.protocol import properties as PR
from sink.history.commits import committed_path
from sink.history.job import Job, run
from tests.conftest import BrokerProcess
from tests.integration.test_sink_kafka import consume
from tests.mqtt_raw import RawClient

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.timeout(900)]
FAST = dict(n=2 ** 10, r=8, p=1)
TOPICS = ("s/a", "s/b", "s/c", "s/secret/x")
RECEIVE_MAX = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory, spark):
    """Tansu, a broker with users (alice publishes, bob may read s/# but s/secret/#, carol may
    not read s/#), 40 messages in the table (two job runs; the committed file of the first put
    back) and 20 more in Kafka only."""
    from kafka_client.embedded import EmbeddedKafka
    tmp = tmp_path_factory.mktemp("replay")
    kafka = EmbeddedKafka(log_file=str(tmp / "tansu.log"))
    kafka.start()
    pw, acl = tmp / "passwd", tmp / "acl"
    pw.write_text("".join(f"{u}:{hash_password(u + '-pw', **FAST)}\n"
                          for u in ("alice", "bob", "carol")))
    acl.write_text("user alice\ntopic readwrite s/#\n"
                   "user bob\ntopic read s/#\ntopic deny s/secret/#\n"
                   "user carol\ntopic read other/#\n")
    table = tmp / "history"
    broker = BrokerProcess(tmp, settings={"history.table": str(table),
                                          "auth.password_file": str(pw),
                                          "auth.acl_file": str(acl)},
                           args=["--kafka-bootstrap", kafka.bootstrap], log_level="INFO").start()
    pub = RawClient(broker.port)
    pub.connect("alice-pub", username="alice", password=b"alice-pw")
    sent: list = []
    state = {"kafka": kafka, "broker": broker, "pub": pub, "sent": sent, "tmp": tmp,
             "table": str(table), "t0": time.time()}
    cfg = Job.of(bootstrap=kafka.bootstrap, table=str(table), trigger_seconds=1,
                 available_now=True, source="python", connect=False, data_dir=str(tmp))
    try:
        publish(state, 20)
        assert run(spark, cfg) == 0
        first_file = tmp / "committed-first.json"
        shutil.copy(committed_path(str(table)), first_file)
        publish(state, 20)
        assert run(spark, cfg) == 0
        # the committed file lags the table by the second run: its rows are in both
        shutil.copy(first_file, committed_path(str(table)))
        state["in_table"] = len(sent)
        publish(state, 20)                               # in Kafka only
        yield state
    finally:
        pub.close()
        broker.stop()
        kafka.stop()


def publish(state, n: int, pid0: int = 1) -> None:
    """n messages from alice over the topics in turn, QoS 1, with properties; waits until Kafka
    has every one so far."""
    pub, sent = state["pub"], state["sent"]
    for _i in range(n):
        k = len(sent)
        topic = TOPICS[k % len(TOPICS)]
        props = {PR.CONTENT_TYPE: "text/plain", PR.USER_PROPERTY: [("k", str(k))]}
        pub.publish(topic, b"m%d" % k, qos=1, pid=(k % 60000) + 1, properties=props)
        assert pub.recv_type(P.PUBACK).reason_code < 0x80  # (0x10: no subscribers yet)
        sent.append((topic, b"m%d" % k))
    assert len(consume(state["kafka"].bootstrap, "mqtt.messages", len(sent), timeout=60)) \
        >= len(sent)


SWITCHED = re.compile(r"bob-sub: replay of s/#: (\d+) messages from the history table, (\d+) "
                      r"from Kafka, \d+ held live; live from now on")
WAIT = 600   # s: a safety net against a replay that never goes live, not a speed requirement


def in_background(fn, *args) -> tuple[threading.Thread, list]:
    """fn(*args) on a thread; what it raised, in the list."""
    errors: list = []

    def run():
        try:
            fn(*args)
        except BaseException as exc:  # (said by the test's thread)
            errors.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def test_replay_table_then_kafka_then_live_once_each_in_order_within_receive_maximum(stack):
    broker = stack["broker"]
    since = dt.datetime.fromtimestamp(stack["t0"] - 5, dt.timezone.utc)
    sub = RawClient(broker.port, timeout=30)
    sub.connect("bob-sub", username="bob", password=b"bob-pw",
                properties={PR.RECEIVE_MAXIMUM: RECEIVE_MAX})
    ack = sub.subscribe(f"$replay/{since:%Y-%m-%dT%H:%M:%SZ}/s/#", qos=1)
    assert ack.reason_codes == [1], ack
    # flow control: RECEIVE_MAX PUBLISHes, then nothing until they are acknowledged
    window = [sub.recv_type(P.PUBLISH) for _ in range(RECEIVE_MAX)]
    assert sub.nothing(1.5), "more unacknowledged PUBLISHes than the client's Receive Maximum"
    got = list(window)
    for m in window:
        sub.send(P.Ack(P.PUBACK, m.packet_id))
    # published while the replay runs: held, or read from Kafka, whichever the switch finds
    during, errors = in_background(publish, stack, 20)
    switched = after = None
    after_errors: list = []
    n_after = 0
    deadline = time.monotonic() + WAIT
    # The client takes what comes (acknowledging each) until the broker says the replay is live
    # (its INFO line: everything accepted before the SUBSCRIBE sent, the held ones after);
    # then more are published, which must arrive as they are, without the marker.
    while True:
        assert not errors and not after_errors, errors + after_errors
        if switched is None:
            switched = SWITCHED.search(broker.logs())
        if switched is not None and after is None and not during.is_alive():
            n_after = len(stack["sent"])
            after, after_errors = in_background(publish, stack, 10)
        want = [(t, p) for t, p in stack["sent"] if not t.startswith("s/secret")]
        if after is not None and not after.is_alive() and len(got) >= len(want):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"{'no switch to live' if switched is None else 'not every message'} "
                        f"within {WAIT} s: {len(got)} of {len(want)} messages received; the "
                        f"broker's log ends:\n{broker.logs()[-3000:]}")
        try:
            m = sub.recv(2)
        except TimeoutError:
            continue
        assert m.type == P.PUBLISH, m
        sub.send(P.Ack(P.PUBACK, m.packet_id))
        got.append(m)
    assert not errors and not after_errors, errors + after_errors
    want = [(t, p) for t, p in stack["sent"] if not t.startswith("s/secret")]
    pairs = [(m.topic, m.payload) for m in got]
    assert sorted(pairs) == sorted(want), "not every message exactly once"
    for topic in TOPICS[:3]:                                  # in order per topic
        assert [p for t, p in pairs if t == topic] == [p for t, p in want if t == topic]
    marked = ["replay" in dict((m.properties or {}).get(PR.USER_PROPERTY, [])) for m in got]
    first_live = marked.index(False)
    assert all(marked[:first_live]) and not any(marked[first_live:]), \
        "replayed messages (with the marker) are followed by live ones (without), not mixed"
    n_before = len([t for t, _ in stack["sent"][:60] if not t.startswith("s/secret")])
    assert first_live >= n_before                             # everything published before
    live = [(t, p) for t, p in stack["sent"][n_after:] if not t.startswith("s/secret")]
    assert live and pairs[-len(live):] == live                # published after the switch: live
    m0 = got[0]
    ups = dict(m0.properties[PR.USER_PROPERTY])
    assert m0.properties[PR.CONTENT_TYPE] == "text/plain" and ups["k"] == "0"   # its own
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ups["replay"])
    assert ups["replay-id"]
    # the table gave the first run's messages; its second run's (past the committed file) and
    # the newer ones came from Kafka
    assert int(switched.group(1)) == 20 and int(switched.group(2)) >= 40, switched.group(0)
    sub.close()


def test_replay_needs_read_access_to_the_filter(stack):
    sub = RawClient(stack["broker"].port)
    sub.connect("carol-sub", username="carol", password=b"carol-pw")
    ack = sub.subscribe("$replay/-1h/s/#", qos=1)
    assert ack.reason_codes == [0x87]
    assert "not authorized to read s/#" in ack.properties[PR.REASON_STRING]
    sub.close()
