"""History replay over MQTT (docs/history.md "Replay over MQTT"), sans-I/O: the "$replay/..." syntax, the
core's replay capability, and the session's feed with a fake worker (records pushed in as the
worker would stream them): every message once and in order, the worker's records and then the
live ones with neither gap nor duplicate, the client's Receive Maximum and a paused transport
respected ([MQTT-3.3.4-9]), the ACL, the end of a replay with its connection or UNSUBSCRIBE."""
from __future__ import annotations

import pytest

from broker.core.hooks import Hook
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from settings.tree import ReplayConfig
from sink.replay import records
from sink.replay.hook import ReplayHook
from sink.replay.spec import BadReplay, parse, parse_time
from tests.sansio import Client, make, publish_ok
from tests.sansio_pubsub import take

V4, V5 = P.MQTT_311, P.MQTT_5
O = P.SubscriptionOptions
NOW_MS = 1_714_557_600_000  # 2024-05-01T10:00:00Z


# ---------------------------------------------------------------- the syntax

def test_replay_times_iso_epoch_and_relative():
    assert parse_time("2024-05-01T10:00:00Z", 0) == NOW_MS
    assert parse_time("2024-05-01T10:00Z", 0) == NOW_MS
    assert parse_time("2024-05-01T10:00:00.250", 0) == NOW_MS + 250     # no zone: UTC
    assert parse_time("2024-05-01T08:00:00-02:00", 0) == NOW_MS
    assert parse_time("2024-05-01", 0) == NOW_MS - 10 * 3_600_000
    assert parse_time("1714557600", 0) == NOW_MS
    assert parse_time("1714557600.5", 0) == NOW_MS + 500
    assert parse_time("-90s", NOW_MS) == NOW_MS - 90_000
    assert parse_time("-1.5h", NOW_MS) == NOW_MS - 5_400_000
    assert parse_time("-1w", NOW_MS) == NOW_MS - 7 * 86_400_000


def test_replay_filter_with_range_and_wildcards():
    s = parse("$replay/-2h..-1h/sensors/+/temp", NOW_MS)
    assert (s.filter, s.since_ms, s.until_ms) == ("sensors/+/temp", NOW_MS - 7_200_000,
                                                  NOW_MS - 3_600_000)
    s = parse("$replay/2024-05-01T10:00:00Z/#", 0)
    assert (s.filter, s.since_ms, s.until_ms) == ("#", NOW_MS, None)
    assert parse("$replay/-1h../a", NOW_MS).until_ms is None  # an open end


@pytest.mark.parametrize("filt, says", [
    ("$replay/-1h", "no time or no topic filter"),
    ("$replay//a/b", "no time or no topic filter"),
    ("$replay/yesterday/a", "is not a time"),
    ("$replay/2024-13-45/a", "is not a time"),
    ("$replay/-1h..-2h/a", "not after its start"),
    ("$replay/2024-05-01T10:00+02:00/a", "not a valid topic filter"),
    ("$replay/-1h/a/#/b", "not a valid topic filter"),
    ("$replay/-1h/$share/g/a", "neither a shared subscription"),
])
def test_replay_filter_errors_say_what_to_write(filt, says):
    with pytest.raises(BadReplay, match=says):
        parse(filt, NOW_MS)


# ---------------------------------------------------------------- the core without a replay hook

@pytest.mark.parametrize("level, code", [(V5, rc.IMPLEMENTATION_SPECIFIC_ERROR), (V4, 0x80)])
def test_replay_without_a_replay_hook_is_refused_saying_why(level, code):
    """[MQTT-3.9.3-2]: a failure code for the filter; MQTT 5 gets a Reason String."""
    b, _ = make()
    c = Client(b, level)
    c.connect("c")
    c.send(P.Subscribe(1, [("$replay/-1h/a/#", O(1)), ("a/b", O(1))]))
    ack = take(c, P.SUBACK)
    assert ack.reason_codes == [code, 1]
    if level == V5:
        assert "needs the analytics sink" in ack.properties[PR.REASON_STRING]
    assert "$replay/-1h/a/#" not in b.sessions["c"].subscriptions


def test_suback_reason_string_left_out_when_too_large_for_the_client():
    """[MQTT-3.1.2-24]: the SUBACK goes without its Reason String rather than not at all."""
    b, _ = make()
    c = Client(b, V5)
    c.connect("c", props={PR.MAXIMUM_PACKET_SIZE: 20})
    c.send(P.Subscribe(1, [("$replay/-1h/a/#", O(1))]))
    ack = take(c, P.SUBACK)
    assert ack.reason_codes == [rc.IMPLEMENTATION_SPECIFIC_ERROR] and not ack.properties


# ---------------------------------------------------------------- with the hook and a fake worker

class SinkIds(Hook):
    """What the sink hook does for the replay: each accepted message gets a message id."""
    provides = frozenset({"on_message_accepted"})

    def __init__(self):
        self.n = 0
        self.forwarded = 0

    def on_message_accepted(self, msg, client_id, username, protocol) -> bool:
        self.n += 1
        msg.sink_id = b"live-%x" % self.n
        return True

    # (the Sink's side the replay hook asks)
    def accepted_seq(self) -> int:
        return self.n

    def forwarded_seq(self) -> int:
        return self.forwarded


class FakeControl:
    def __init__(self, hook, settings):
        self.hook, self.settings = hook, settings
        self.wants, self.syncs, self.arms, self.closed = 0, [], [], False
        self.feed = None

    def arm(self) -> int:
        self.arms.append(self.hook.sink.accepted_seq())
        return self.arms[-1]

    def want(self) -> None:
        self.wants += 1

    def sync(self, generation: int) -> None:
        self.syncs.append(generation)

    def close(self) -> None:
        self.closed = True


class AvailableHook(ReplayHook):
    def unavailable(self):
        return None


class Denies(Hook):
    """An auth hook: `secret/...` may be neither read nor subscribed to by client `c`."""
    provides = frozenset({"allow_subscribe", "allow_read", "needs_read_check"})

    def allow_subscribe(self, client_id, username, filt):
        return not filt.startswith("secret")

    def allow_read(self, client_id, username, topic):
        return not topic.startswith("secret")

    def needs_read_check(self, client_id, username, filt):
        return True


def setup(auth=None, **cfg):
    b, clock = make()
    clock.t = NOW_MS / 1000
    ids = SinkIds()
    b.add_hook(ids)
    if auth is not None:
        b.add_hook(auth)
    hook = AvailableHook(ReplayConfig(**cfg), ids, {"table": "unused"}, control_factory=FakeControl)
    b.add_hook(hook)
    return b, clock, ids, hook


def replaying(b, hook, filt="$replay/-1h/s/#", qos=1, cid="c", level=V5, connect_props=None,
              **opts):
    c = Client(b, level)
    c.connect(cid, props=connect_props)
    c.send(P.Subscribe(1, [(filt, O(qos, **opts))]))
    ack = take(c, P.SUBACK)
    feed = next(iter(hook.feeds), None)
    return c, ack, feed


def rec(n: int, topic="s/a", qos=1, at_ms=None, **kw) -> tuple:
    return records.make(f"hist-{n:x}", topic, b"h%d" % n, qos, False,
                        at_ms if at_ms is not None else NOW_MS - 60_000 + n, "dev", **kw)


def live_rec(n: int, topic="s/a", payload=None) -> tuple:
    """Kafka's copy of the n-th live message (same id as the sink gave it)."""
    return records.make(f"live-{n:x}", topic, payload or b"l%d" % n, 1, False, NOW_MS, "pub")


def turn(c: Client) -> list:
    """The PUBLISHes of one event-loop turn (a feed's burst is written at the end of the turn
    that flushed the connection: Connection.take_output), not acknowledged."""
    return [m for m in c.received() if m.type == P.PUBLISH]


def deliver(c: Client) -> list:
    """Every PUBLISH the broker sends until it has nothing more, each acknowledged."""
    out = []
    idle = 0
    while idle < 2:
        got = turn(c)
        idle = 0 if got else idle + 1
        for m in got:
            if m.qos == 1:
                c.send(P.Ack(P.PUBACK, m.packet_id))
            out.append(m)
    return out


def user_props(m) -> dict:
    return dict((m.properties or {}).get(PR.USER_PROPERTY, []))


def test_replay_sends_history_then_held_live_then_live_once_each_in_order():
    b, clock, ids, hook = setup()
    c, ack, feed = replaying(b, hook)
    assert ack.reason_codes == [1] and feed is not None
    ctl = feed.control
    assert ctl.arms == [0] and ctl.wants == 1           # armed at the SUBSCRIBE, asked for records
    pub = Client(b, V5)
    pub.connect("pub")
    publish_ok(pub, "s/a", b"l1", qos=1, pid=1)          # accepted during the replay: held
    publish_ok(pub, "s/a", b"l2", qos=1, pid=2)
    assert deliver(c) == []                              # nothing yet: the history comes first
    feed.poll_sync(ids.n)                                # Kafka has everything before the arming
    assert ctl.syncs == [1]
    # the worker: three rows of the table, then Kafka, which already had the first live one
    feed.add([rec(1), rec(2), rec(3), ("table", 3), live_rec(1), ("synced", 1)])
    got = deliver(c)
    assert [m.payload for m in got] == [b"h1", b"h2", b"h3", b"l1", b"l2"]
    assert [("replay" in user_props(m)) for m in got] == [True] * 4 + [False]
    assert user_props(got[0])["replay-id"] == "hist-1"
    assert user_props(got[0])["replay"] == records.iso_ms(NOW_MS - 60_000 + 1)
    assert ctl.closed                                    # live from now on: the worker ends
    publish_ok(pub, "s/a", b"l3", qos=1, pid=3)
    (m,) = deliver(c)
    assert m.payload == b"l3" and "replay" not in user_props(m)
    assert feed.counts["table"] == 3 and feed.counts["kafka"] == 1 and feed.counts["live"] == 1


def test_replayed_publish_keeps_original_properties_qos_downgrade_and_subscription_id():
    b, clock, ids, hook = setup()
    c = Client(b, V5)
    c.connect("c")
    c.send(P.Subscribe(1, [("$replay/-1h/s/#", O(1))], {PR.SUBSCRIPTION_IDENTIFIER: [7]}))
    take(c, P.SUBACK)
    feed = next(iter(hook.feeds))
    feed.add([rec(1, qos=2, payload_format=1, content_type="text/plain", response_topic="r/1",
                  correlation_data=b"\x00c", user_properties=[("u", "1"), ("u", "2")])])
    (m,) = deliver(c)
    p = m.properties
    assert m.qos == 1 and m.retain is False                   # [MQTT-3.8.4-8]: the granted QoS
    assert (p[PR.PAYLOAD_FORMAT_INDICATOR], p[PR.CONTENT_TYPE], p[PR.RESPONSE_TOPIC],
            p[PR.CORRELATION_DATA]) == (1, "text/plain", "r/1", b"\x00c")
    assert p[PR.USER_PROPERTY][:2] == [("u", "1"), ("u", "2")]  # in order, then the marker
    assert [k for k, _ in p[PR.USER_PROPERTY][2:]] == ["replay", "replay-id"]
    assert p[PR.SUBSCRIPTION_IDENTIFIER] == [7]                # [MQTT-3.3.4-3]


def test_replay_respects_receive_maximum_and_asks_for_more_as_the_window_frees():
    """[MQTT-3.3.4-9]: never more unacknowledged QoS 1 PUBLISHes than the client allows."""
    b, clock, ids, hook = setup()
    c, _, feed = replaying(b, hook, connect_props={PR.RECEIVE_MAXIMUM: 2})
    feed.add([rec(i) for i in range(1, 11)])
    first = turn(c) + turn(c)
    assert [m.payload for m in first] == [b"h1", b"h2"]
    assert turn(c) + turn(c) == []                              # held until acknowledged
    got = [m.payload for m in first]
    for _ in range(10):
        for m in first:
            c.send(P.Ack(P.PUBACK, m.packet_id))
        first = turn(c) + turn(c)
        assert len(first) <= 2
        got += [m.payload for m in first]
    assert got == [b"h%d" % i for i in range(1, 11)]
    assert feed.control.wants >= 2                              # ran low: asked for more


def test_replay_sends_nothing_while_the_transport_is_paused():
    b, clock, ids, hook = setup()
    c, _, feed = replaying(b, hook, qos=0)
    c.conn.pause_writing()
    feed.add([rec(1, qos=0), rec(2, qos=0)])
    assert c.received() == []       # QoS 0 waits too: replayed messages are not dropped
    c.conn.resume_writing()
    assert [m.payload for m in deliver(c)] == [b"h1", b"h2"]


def test_replay_bursts_are_bounded_per_turn():
    b, clock, ids, hook = setup()
    c, _, feed = replaying(b, hook, qos=0)
    from sink.replay import feed as F
    feed.add([rec(i, qos=0) for i in range(F.BURST_MESSAGES + 5)])
    assert turn(c) == []                         # (this turn's flush pumps)
    assert len(turn(c)) == F.BURST_MESSAGES      # one turn
    assert len(turn(c)) == 5                     # the next


def test_live_held_beyond_its_bound_comes_from_the_stream_and_the_tap_is_armed_again():
    b, clock, ids, hook = setup(live_buffer_messages=2)
    c, _, feed = replaying(b, hook)
    ctl = feed.control
    pub = Client(b, V5)
    pub.connect("pub")
    for i in range(1, 4):
        publish_ok(pub, "s/a", b"l%d" % i, qos=1, pid=i)
    assert feed.armed == 0 and feed.counts["disarmed"] == 1     # dropped: Kafka has them
    feed.poll_sync(ids.n)
    assert ctl.syncs == []                                     # no sync while disarmed
    feed.add([rec(1), ("table", 1), live_rec(1), live_rec(2), live_rec(3), ("head",)])
    got = deliver(c)
    assert [m.payload for m in got] == [b"h1", b"l1", b"l2", b"l3"]
    assert feed.armed == 2 and ctl.arms == [0, 3]               # armed again at Kafka's end
    publish_ok(pub, "s/a", b"l4", qos=1, pid=4)
    feed.poll_sync(ids.n)
    assert ctl.syncs == [2]
    feed.add([live_rec(4), ("synced", 2)])                      # Kafka had it too: sent once
    got = deliver(c)
    assert [m.payload for m in got] == [b"l4"]
    publish_ok(pub, "s/a", b"l5", qos=1, pid=5)
    assert [m.payload for m in deliver(c)] == [b"l5"]


def test_a_stale_synced_marker_is_ignored():
    b, clock, ids, hook = setup(live_buffer_messages=1)
    c, _, feed = replaying(b, hook)
    feed.poll_sync(0)
    assert feed.control.syncs == [1]
    pub = Client(b, V5)
    pub.connect("pub")
    publish_ok(pub, "s/a", b"l1", qos=1, pid=1)
    publish_ok(pub, "s/a", b"l2", qos=1, pid=2)     # over the bound: disarmed
    feed.add([live_rec(1), live_rec(2), ("synced", 1)])
    assert [m.payload for m in deliver(c)] == [b"l1", b"l2"]
    assert feed.state == "replaying" and not feed.control.closed


def test_switch_abandoned_when_live_outruns_the_client_then_nothing_lost_or_doubled():
    b, clock, ids, hook = setup(live_buffer_messages=3)
    c, _, feed = replaying(b, hook, connect_props={PR.RECEIVE_MAXIMUM: 1})
    pub = Client(b, V5)
    pub.connect("pub")
    publish_ok(pub, "s/a", b"l1", qos=1, pid=1)
    publish_ok(pub, "s/a", b"l2", qos=1, pid=2)
    feed.poll_sync(ids.n)
    # the stream after the synced marker (read ahead): Kafka's copies of l1..l3
    feed.add([("table", 0), ("synced", 1), live_rec(1), live_rec(2), live_rec(3)])
    got = []
    (m,) = turn(c) + turn(c)                                    # l1, switching
    got.append(m.payload)
    publish_ok(pub, "s/a", b"l3", qos=1, pid=3)
    publish_ok(pub, "s/a", b"l4", qos=1, pid=4)
    publish_ok(pub, "s/a", b"l5", qos=1, pid=5)                 # more than 3 held: back to Kafka
    assert feed.state == "replaying"
    c.send(P.Ack(P.PUBACK, m.packet_id))
    feed.add([live_rec(4), live_rec(5), ("head",)])
    got += [x.payload for x in deliver(c)]
    assert got == [b"l1", b"l2", b"l3", b"l4", b"l5"]


def test_messages_the_sink_does_not_keep_go_live_at_once():
    b, clock, ids, hook = setup()
    c, _, feed = replaying(b, hook)
    from broker.core.message import Message
    b.publish(Message("s/x", b"no-id", 1, False, None, None, "pub", NOW_MS / 1000), None)
    (m,) = deliver(c)
    assert m.payload == b"no-id"


def test_replay_applies_the_acl_per_message_and_to_the_filter():
    b, clock, ids, hook = setup(auth=Denies())
    c, ack, feed = replaying(b, hook, filt="$replay/-1h/#")
    assert ack.reason_codes == [1]
    feed.add([rec(1, topic="s/a"), rec(2, topic="secret/x"), rec(3, topic="s/b")])
    assert [m.topic for m in deliver(c)] == ["s/a", "s/b"]
    c2 = Client(b, V5)
    c2.connect("c2")
    c2.send(P.Subscribe(1, [("$replay/-1h/secret/#", O(1))]))
    ack = take(c2, P.SUBACK)
    assert ack.reason_codes == [rc.NOT_AUTHORIZED]
    assert "not authorized to read secret/#" in ack.properties[PR.REASON_STRING]


def test_no_local_and_expired_messages_are_not_replayed():
    b, clock, ids, hook = setup()
    c, _, feed = replaying(b, hook, cid="me", no_local=True)
    mine = records.make("hist-9", "s/a", b"mine", 1, False, NOW_MS - 1000, "me")
    gone = rec(2, message_expiry=10)                  # accepted a minute ago, 10 s to live
    fresh = rec(3, message_expiry=3600)
    feed.add([mine, gone, fresh])
    (m,) = deliver(c)
    assert m.payload == b"h3" and 3530 <= m.properties[PR.MESSAGE_EXPIRY_INTERVAL] <= 3541
    assert feed.counts["expired"] == 1


def test_a_bounded_replay_ends_at_its_synced_marker():
    b, clock, ids, hook = setup()
    c, _, feed = replaying(b, hook, filt="$replay/-2h..-1h/s/#")
    pub = Client(b, V5)
    pub.connect("pub")
    publish_ok(pub, "s/a", b"late", qos=1, pid=1)     # after the range: never sent
    feed.poll_sync(ids.n)
    feed.add([rec(1, at_ms=NOW_MS - 5_000_000), ("table", 1), ("synced", 1)])
    assert [m.payload for m in deliver(c)] == [b"h1"]
    assert feed.state == "done" and not hook.feeds
    publish_ok(pub, "s/a", b"later", qos=1, pid=2)
    assert deliver(c) == []
    assert "$replay/-2h..-1h/s/#" in b.sessions["c"].subscriptions   # until UNSUBSCRIBE


def test_unsubscribe_and_disconnect_end_the_replay():
    b, clock, ids, hook = setup()
    c, _, feed = replaying(b, hook)
    c.send(P.Unsubscribe(2, ["$replay/-1h/s/#"]))
    assert take(c, P.UNSUBACK).reason_codes == [0]
    hook.on_tick()
    assert feed.state == "done" and feed.control.closed and not hook.feeds
    pub = Client(b, V5)
    pub.connect("pub")
    publish_ok(pub, "s/a", b"x", qos=1, pid=1)
    assert deliver(c) == []                            # the tap left the router
    c2, _, feed2 = replaying(b, hook, cid="c2")
    c2.send(P.Disconnect())
    assert feed2.state == "done" and feed2.control.closed
    assert "$replay/-1h/s/#" not in b.sessions.get("c2", type("S", (), {"subscriptions": {}})).subscriptions


def test_worker_error_disconnects_saying_why():
    b, clock, ids, hook = setup()
    c, _, feed = replaying(b, hook)
    feed.add([("error", "Kafka at k:9092 did not answer within 60 s")])
    pkts = c.received()
    assert pkts[-1].type == P.DISCONNECT and pkts[-1].reason_code == 0x83
    assert "Kafka at k:9092 did not answer" in pkts[-1].properties[PR.REASON_STRING]
    assert hook.totals["failed"] == 1


def test_replay_limits_refuse_with_quota_exceeded():
    b, clock, ids, hook = setup(max_replays=1)
    replaying(b, hook)
    c2 = Client(b, V5)
    c2.connect("c2")
    c2.send(P.Subscribe(1, [("$replay/-1h/s/#", O(1))]))
    ack = take(c2, P.SUBACK)
    assert ack.reason_codes == [rc.QUOTA_EXCEEDED]
    assert "max_replays" in ack.properties[PR.REASON_STRING]


def test_without_a_history_table_the_suback_says_so(tmp_path):
    b, clock = make()
    hook = ReplayHook(ReplayConfig(), SinkIds(), {"table": str(tmp_path / "history")},
                      control_factory=FakeControl)
    b.add_hook(hook)
    c = Client(b, V5)
    c.connect("c")
    c.send(P.Subscribe(1, [("$replay/-1h/s/#", O(1))]))
    ack = take(c, P.SUBACK)
    assert ack.reason_codes == [rc.IMPLEMENTATION_SPECIFIC_ERROR]
    assert "no history table at" in ack.properties[PR.REASON_STRING]
    assert "python -m sink.job" in ack.properties[PR.REASON_STRING]


def test_replay_works_for_mqtt_311_clients_without_properties():
    b, clock, ids, hook = setup()
    c, ack, feed = replaying(b, hook, level=V4)
    assert ack.reason_codes == [1]
    feed.add([rec(1)])
    (m,) = deliver(c)
    assert m.payload == b"h1" and not m.properties


def test_known_mask_finds_ids_of_the_kafka_boundary():
    import numpy as np

    from sink.history.dedup import Ledger, TaskFilter
    from sink.replay.worker import known_mask
    f = TaskFilter(Ledger())
    ids = [b"abc-1", b"abc-2", b"abc-3", b"other", b"zz-10"]
    data = np.frombuffer(b"".join(ids), np.uint8)
    length = np.array([len(i) for i in ids], np.int64)
    start = np.concatenate(([0], np.cumsum(length)[:-1]))
    f.keep(data, start, length)
    mask = known_mask(f.kept, [b"abc-2", b"abc-4", b"zz-10", b"other", b"zz-f"])
    assert mask.tolist() == [True, False, True, False, False]


# ---------------------------------------------------------------- times out of range, failures

@pytest.mark.parametrize("when", [
    "253402300800",                    # 10000-01-01 in Unix seconds
    "99999999999999",
    "9" * 400,                         # a float of inf
    "-1m..253402300800",
    "9999-12-31T23:59:59-02:00",       # 10000-01-01T01:59:59Z
    "-" + "9" * 400 + "h",
])
def test_a_time_out_of_range_is_refused_as_invalid_and_the_connection_stays(when, caplog):
    """[MQTT-3.9.3-2]: a failure code for that filter (0x8F, saying which time), the others of
    the SUBSCRIBE granted, the connection open; no traceback in the log."""
    b, clock, ids, hook = setup()
    c = Client(b, V5)
    c.connect("c")
    c.send(P.Subscribe(1, [(f"$replay/{when}/s/#", O(1)), ("a/b", O(1))]))
    ack = take(c, P.SUBACK)
    assert ack.reason_codes == [rc.TOPIC_FILTER_INVALID, 1]
    assert "9999-12-31" in ack.properties[PR.REASON_STRING] or \
        "is not a time" in ack.properties[PR.REASON_STRING]
    c.send(P.PingReq())
    assert take(c, P.PINGRESP)
    assert not hook.feeds and not any(r.exc_info for r in caplog.records)


def test_times_before_1970_mean_the_epoch():
    assert parse_time("1900-01-01", NOW_MS) == 0
    assert parse("$replay/-100000w/a", NOW_MS).since_ms == 0


def test_a_failure_inside_the_replay_hook_refuses_that_filter_in_one_log_line(caplog):
    """Whatever goes wrong while a replay starts refuses that filter (0x80, a Reason String),
    with one log line per filter (rate-limited as every line about a client), no traceback."""
    b, clock, ids, hook = setup()

    def broken(hook_, settings):
        raise OverflowError("date value out of range")
    hook.control_factory = broken
    c = Client(b, V5)
    c.connect("c")
    c.send(P.Subscribe(1, [("$replay/-1h/s/#", O(1)), ("a/b", O(1))]))
    ack = take(c, P.SUBACK)
    assert ack.reason_codes == [rc.UNSPECIFIED_ERROR, 1]
    assert "could not start this replay" in ack.properties[PR.REASON_STRING]
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "OverflowError: date value out of range" in lines[0].getMessage()
    c.send(P.PingReq())
    assert take(c, P.PINGRESP)
    assert not hook.feeds and "$replay/-1h/s/#" not in b.sessions["c"].subscriptions


# ---------------------------------------------------------------- the slots: per user, idle

def test_one_user_gets_its_share_of_the_replay_slots_whatever_its_connections():
    """[replay] max_per_user: two connections of one user cannot hold every slot."""
    b, clock, ids, hook = setup(max_replays=4, max_per_client=2, max_per_user=2)
    codes = []
    for cid in ("u-1", "u-2"):
        c = Client(b, V5)
        c.connect(cid, username="u")
        c.send(P.Subscribe(1, [("$replay/-1h/s/1", O(1)), ("$replay/-1h/s/2", O(1))]))
        ack = take(c, P.SUBACK)
        codes += ack.reason_codes
    assert codes == [1, 1, rc.QUOTA_EXCEEDED, rc.QUOTA_EXCEEDED]
    assert "max_per_user" in ack.properties[PR.REASON_STRING]
    other = Client(b, V5)
    other.connect("o", username="other")
    other.send(P.Subscribe(1, [("$replay/-1h/s/1", O(1))]))
    assert take(other, P.SUBACK).reason_codes == [1]           # the others' share is free


def test_a_replay_that_caught_up_holds_no_slot():
    b, clock, ids, hook = setup(max_replays=1)
    c, _, feed = replaying(b, hook)
    feed.poll_sync(ids.n)
    feed.add([("table", 0), ("synced", 1)])
    deliver(c)
    assert feed.state == "live"
    c2 = Client(b, V5)
    c2.connect("c2")
    c2.send(P.Subscribe(1, [("$replay/-1h/s/#", O(1))]))
    assert take(c2, P.SUBACK).reason_codes == [1]


def test_a_replay_whose_client_takes_nothing_ends_after_idle_seconds_freeing_its_slot():
    """A client that never acknowledges (Receive Maximum reached) holds its slot only for
    [replay] idle_seconds: then it is told (DISCONNECT 0x83, saying why) and the slot is free."""
    b, clock, ids, hook = setup(max_replays=1, idle_seconds=60)
    c, _, feed = replaying(b, hook, connect_props={PR.RECEIVE_MAXIMUM: 1})
    feed.add([rec(i) for i in range(1, 5)])
    assert len(turn(c) + turn(c)) == 1                          # then nothing: never acknowledged
    clock.t += 59
    hook.on_tick()
    assert feed.state == "replaying"
    clock.t += 2
    hook.on_tick()
    assert feed.state == "done" and feed.control.closed and not hook.feeds
    pkts = c.received()
    assert pkts[-1].type == P.DISCONNECT and pkts[-1].reason_code == 0x83
    assert "idle_seconds" in pkts[-1].properties[PR.REASON_STRING]


def test_a_slow_client_that_takes_messages_is_not_idle():
    b, clock, ids, hook = setup(idle_seconds=60)
    c, _, feed = replaying(b, hook, connect_props={PR.RECEIVE_MAXIMUM: 1})
    feed.add([rec(i) for i in range(1, 5)])
    for _ in range(3):
        (m,) = turn(c) + turn(c)
        clock.t += 50
        hook.on_tick()
        c.send(P.Ack(P.PUBACK, m.packet_id))
    assert feed.state == "replaying"
    clock.t += 500                                              # waiting for the worker: not idle
    deliver(c)
    hook.on_tick()
    assert feed.state == "replaying"


def test_replayed_records_mqtt_cannot_carry_are_skipped_and_counted():
    """A record from Kafka or the table is held to a PUBLISH's checks: a topic with U+0000
    [MQTT-4.7.3-2], longer than 65535 bytes [MQTT-4.7.3-3] or with a wildcard [MQTT-3.3.2-2] is
    skipped (counted), the subscriber stays connected and gets the good ones."""
    b, clock, ids, hook = setup()
    c, _, feed = replaying(b, hook)
    feed.add([rec(1), rec(2, topic="s/a\x00b"), rec(3, topic="s/" + "x" * 70_000),
              rec(4, topic="s/+"), rec(5)])
    got = deliver(c)
    assert [m.payload for m in got] == [b"h1", b"h5"]
    assert feed.counts["invalid"] == 3 and not c.conn.close_requested


def test_a_replay_filter_repeated_in_one_subscribe_is_one_subscription_with_the_last_options():
    """[MQTT-3.8.4-3]: the replay hook is asked once, for the last occurrence (its options win),
    and every occurrence gets its code [MQTT-3.9.3-1]; a second filter keeps its own."""
    b, clock, ids, hook = setup()
    made = []
    hook.control_factory = lambda h, s: made.append(FakeControl(h, s)) or made[-1]
    c = Client(b, V5)
    c.connect("c")
    c.send(P.Subscribe(1, [("$replay/-1h/s/#", O(1))] * 500 + [("$replay/-1h/s/#", O(0)),
                                                                ("$replay/-2h/t/#", O(1))]))
    ack = take(c, P.SUBACK)
    assert ack.reason_codes == [0] * 501 + [1]
    assert len(made) == 2 and len(hook.feeds) == 2
    assert b.sessions["c"].subscriptions["$replay/-1h/s/#"].qos == 0
