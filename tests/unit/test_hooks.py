"""Hooks (broker/core/hooks.py) without sockets: events reach only the hooks providing them,
the broker runs with none, and a store restores sessions through the broker's API."""
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.broker import Broker
from broker.core.hooks import (
    AUTH_CHECKS,
    DURABILITY,
    EVENTS,
    LIFECYCLE,
    ROUTING,
    STORED_EVENTS,
    AllowAll,
    Hook,
)
from broker.core.message import Message
from broker.core.session import NEVER, Inflight
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.store.sqlite import Store
from settings import MQTTConfig
from tests.unit.test_core import Client, Clock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Recorder(Hook):
    """Implements every event; records those it is called for. Provides what it is told."""

    def __init__(self, provides, refuse=False):
        self.provides = frozenset(provides)
        self.calls = []
        self.refuse = refuse
        self.handles = 0

    def names(self):
        return [c[0] for c in self.calls]

    def on_message_accepted(self, msg, client_id, username, protocol):
        self.calls.append(("on_message_accepted", msg.topic, client_id, protocol))
        return not self.refuse

    def on_retain(self, topic, msg):
        self.calls.append(("on_retain", topic, msg.payload if msg else None))

    def on_will_published(self, session, msg):
        self.calls.append(("on_will_published", session.client_id, msg.topic))

    def on_client_connected(self, session, present):
        self.calls.append(("on_client_connected", session.client_id, present))

    def on_client_disconnected(self, session, publish_will):
        self.calls.append(("on_client_disconnected", session.client_id, publish_will))

    def on_session_saved(self, session):
        self.calls.append(("on_session_saved", session.client_id, session.expiry_interval))

    def on_session_deleted(self, client_id):
        self.calls.append(("on_session_deleted", client_id))

    def on_subscribed(self, client_id, sub):
        self.calls.append(("on_subscribed", client_id, sub.filter))

    def on_unsubscribed(self, client_id, filt):
        self.calls.append(("on_unsubscribed", client_id, filt))

    def on_qos2_received(self, client_id, pid):
        self.calls.append(("on_qos2_received", client_id, pid))

    def on_qos2_released(self, client_id, pid):
        self.calls.append(("on_qos2_released", client_id, pid))

    def on_message_stored(self, client_id, msg, qos, retain, sub_ids, pid=None):
        self.handles += 1
        self.calls.append(("on_message_stored", client_id, msg.topic, pid, self.handles))
        return self.handles

    def on_stored_sending(self, handle, pid):
        self.calls.append(("on_stored_sending", handle, pid))

    def on_stored_released(self, handle):
        self.calls.append(("on_stored_released", handle))

    def on_stored_done(self, handle):
        self.calls.append(("on_stored_done", handle))


def make(*hooks, **cfg):
    clock = Clock()
    return Broker(MQTTConfig(**cfg), clock=clock, wall=clock, hooks=hooks), clock


def persistent(b, cid, expiry=100, **kw):
    c = Client(b)
    c.connect(cid, clean=False, props={PR.SESSION_EXPIRY_INTERVAL: expiry}, **kw)
    return c


# ---------------------------------------------------------------- the registry
def test_event_dispatched_only_to_hooks_providing_it():
    retain_only = Recorder({"on_retain"})
    connects_only = Recorder({"on_client_connected"})
    b, _ = make(retain_only, connects_only)
    pub = Client(b)
    pub.connect("p")
    pub.send(P.Publish("r/1", b"kept", 1, True, packet_id=1))
    assert pub.received()[0].type == P.PUBACK
    # both implement every event: each was called only for the one it provides
    assert retain_only.calls == [("on_retain", "r/1", b"kept")]
    assert connects_only.calls == [("on_client_connected", "p", False)]
    # nothing takes accepted messages nor persists sessions: connection.py skips those calls
    assert b.accepting == () and b.store is None and type(b.auth) is AllowAll
    b.remove_hook(retain_only)
    pub.send(P.Publish("r/1", b"", 0, True))
    assert retain_only.calls == [("on_retain", "r/1", b"kept")]  # removed: no longer called
    assert b.retained.match("r/#") == []


def test_broker_runs_without_any_hook():
    b, _ = make()
    assert list(b.hooks) == [] and b.accepting == () and b.store is None and not b.durable
    sub = persistent(b, "s")
    sub.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(1))]))
    sub.received()
    sub.conn.connection_lost()
    pub = Client(b)
    pub.connect("p")
    pub.send(P.Publish("t/1", b"queued", 1, packet_id=1))
    pub.send(P.Publish("t/r", b"kept", 0, True))
    assert [(a.type, a.reason_code) for a in pub.received()] == [(P.PUBACK, 0)]
    sub2 = Client(b)
    assert sub2.connect("s", clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 100}).session_present
    (got,) = sub2.received()
    assert got.payload == b"queued" and got.qos == 1
    assert b.sessions["s"].store is None  # persistent, but nothing to persist it to
    assert [m.payload for m in b.retained.match("t/#")] == [b"kept"]


def test_core_imports_nothing_from_sink_store_server_or_asyncio():
    code = ("import sys, broker.core.broker, broker.core.connection, broker.core.hooks\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sink', 'asyncio') or "
            "m.startswith(('broker.store', 'broker.server', 'broker.transport', 'broker.auth', "
            "'broker.observability')))\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_core_source_has_no_import_of_sink_store_server_auth_or_asyncio():
    """Also imports inside functions (the sink's record type was imported lazily before)."""
    import ast
    import glob
    bad = []
    for path in glob.glob(os.path.join(ROOT, "broker", "core", "*.py")) + \
            glob.glob(os.path.join(ROOT, "broker", "protocol", "*.py")):
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            else:
                continue
            for n in names:
                if n.split(".")[0] in ("sink", "asyncio", "socket") or \
                        n.lstrip(".").split(".")[0] in ("store", "server", "transport", "auth",
                                                        "observability") and n.startswith(".."):
                    bad.append((os.path.basename(path), n))
    assert bad == []


def test_recording_hook_sees_accepted_messages_retained_changes_and_session_saves():
    rec = Recorder(set(EVENTS) - set(AUTH_CHECKS) - set(DURABILITY) - set(LIFECYCLE) - set(ROUTING))
    b, _ = make(rec)
    assert b.accepting == (rec.on_message_accepted,) and b.store is not None
    sub = persistent(b, "s")
    sub.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(2))]))
    sub.received()
    assert rec.names() == ["on_client_connected", "on_session_saved", "on_subscribed"]
    rec.calls.clear()
    pub = Client(b)
    pub.connect("p")  # a clean session: connected, never saved
    pub.send(P.Publish("t/r", b"kept", 1, True, packet_id=1))
    pub.send(P.Publish("t/r", b"", 0, True))  # deletes the retained message (and is routed)
    d, empty = sub.received()
    assert (d.qos, empty.payload) == (1, b"")
    assert rec.calls[:4] == [("on_client_connected", "p", False),
                             ("on_message_accepted", "t/r", "p", 5), ("on_retain", "t/r", b"kept"),
                             ("on_message_stored", "s", "t/r", d.packet_id, 1)]
    assert ("on_retain", "t/r", None) in rec.calls
    sub.send(P.Ack(P.PUBACK, d.packet_id))
    assert rec.calls[-1] == ("on_stored_done", 1)
    # the session goes offline: disconnected, saved with its expiry; a message waits stored
    sub.conn.connection_lost()
    assert rec.calls[-2:] == [("on_client_disconnected", "s", True), ("on_session_saved", "s", 100)]
    pub.send(P.Publish("t/q", b"later", 2, packet_id=2))
    assert rec.calls[-1] == ("on_message_stored", "s", "t/q", None, 2)  # queued: no packet id
    sub2 = Client(b)
    sub2.connect("s", clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 100})
    (q,) = sub2.received()
    assert ("on_stored_sending", 2, q.packet_id) in rec.calls
    sub2.send(P.Ack(P.PUBREC, q.packet_id))
    sub2.received()
    assert rec.calls[-1] == ("on_stored_released", 2)
    # inbound QoS 2 of a persistent session
    sub2.send(P.Publish("x", b"in", 2, packet_id=7))
    sub2.send(P.Ack(P.PUBREL, 7))
    assert ("on_qos2_received", "s", 7) in rec.calls and rec.calls[-1] == ("on_qos2_released", "s", 7)
    sub2.send(P.Unsubscribe(3, ["t/#"]))
    assert rec.calls[-1] == ("on_unsubscribed", "s", "t/#")
    # Clean Start discards the session: deleted
    Client(b).connect("s", clean=True)
    assert ("on_session_deleted", "s") in rec.calls


def test_refusing_hook_keeps_the_message_from_everyone():
    rec = Recorder({"on_message_accepted"}, refuse=True)
    b, _ = make(rec)
    sub, pub = Client(b), Client(b)
    sub.connect("s")
    sub.send(P.Subscribe(1, [("#", P.SubscriptionOptions(1))]))
    sub.received()
    pub.connect("p")
    pub.send(P.Publish("a", b"x", 1, True, packet_id=1))
    (ack,) = pub.received()
    assert (ack.type, ack.reason_code) == (P.PUBACK, 0x97)  # Quota exceeded
    assert sub.received() == [] and b.retained.match("#") == []
    assert b.stats["sink_refused"] == 1


def test_will_reaches_hooks_and_subscribers():
    rec = Recorder({"on_will_published", "on_message_accepted"})
    b, _ = make(rec)
    sub = Client(b)
    sub.connect("s")
    sub.send(P.Subscribe(1, [("w", P.SubscriptionOptions(0))]))
    sub.received()
    c = Client(b)
    c.connect("c", will=P.Will("w", b"gone", 0, False))
    c.conn.connection_lost()
    assert rec.calls == [("on_will_published", "c", "w"), ("on_message_accepted", "w", "c", 5)]
    assert [p.payload for p in sub.received()] == [b"gone"]


def test_hooks_registry_refuses_what_is_not_a_hook():
    b, _ = make()
    with pytest.raises(TypeError, match="not a hook"):
        b.add_hook(object())
    with pytest.raises(TypeError, match="SinkHook"):
        Broker(sink=object())  # a sink object that makes no hook
    with pytest.raises(ValueError, match="unknown events"):
        b.add_hook(Recorder({"on_message_routed"}))
    b.add_hook(Recorder(set(STORED_EVENTS)))
    with pytest.raises(ValueError, match="two hooks store messages"):
        b.add_hook(Recorder({"on_message_stored"}))
    assert len(list(b.hooks)) == 1  # the refused one is not attached


# ---------------------------------------------------------------- auth as a hook
class DenyPublish(Hook):
    provides = frozenset({"allow_publish"})

    def allow_publish(self, client_id, username, topic):
        return not topic.startswith("secret/")


class DenyUser(AllowAll):
    def authenticate(self, client_id, username, password):
        return 0x86 if username == "mallory" else 0


def test_auth_hooks_combine_deny_wins_and_allow_all_fills_the_gaps():
    b, _ = make(DenyPublish(), DenyUser())
    pub = Client(b)
    pub.connect("p", username="alice")
    pub.send(P.Publish("secret/x", b"x", 1, packet_id=1))
    pub.send(P.Publish("open/x", b"x", 1, packet_id=2))
    assert [a.reason_code for a in pub.received()] == [0x87, 0x10]
    c = Client(b)
    c.send(P.Connect("m", 5, username="mallory", password=b"pw"))
    (ack,) = c.received()
    assert ack.reason_code == 0x86
    # the one auth hook providing every check is used as is
    only = DenyUser()
    b2, _ = make(only)
    assert b2.auth is only


# ---------------------------------------------------------------- restore through the API
def test_restore_session_applies_caps_and_schedules_the_will():
    rec = Recorder({"on_session_saved", "on_session_deleted", "on_will_published"})
    b, clock = make(rec, session_expiry_maximum=50)
    will = P.Will("w/gone", b"bye", 0, False, {PR.WILL_DELAY_INTERVAL: 5})
    s = b.restore_session("a", 100, None, "alice", will, 9)
    assert s is b.sessions["a"] and s.expiry_interval == 50 and s.username == "alice"
    assert s.next_pid == 9 and s.expires_at == clock() + 50 and s.store is b.store
    assert rec.calls == [("on_session_saved", "a", 50)]  # capped: stored again
    # expired while the broker was down: not restored, its deletion reported
    assert b.restore_session("old", 100, clock() - 1) is None and "old" not in b.sessions
    assert rec.calls[-1] == ("on_session_deleted", "old")
    # "never" under a cap of 0 for 3.1.x sessions: gone
    b0, _ = make(persistent_client_expiration=0)
    assert b0.restore_session("n", NEVER, None) is None
    # the will: due after its delay, as after a lost connection; a reconnect in time cancels it
    watcher = Client(b)
    watcher.connect("watch")
    watcher.send(P.Subscribe(1, [("w/#", P.SubscriptionOptions(0))]))
    watcher.received()
    b.tick()
    assert watcher.received() == []
    clock.t += 5
    b.tick()
    assert [p.payload for p in watcher.received()] == [b"bye"]
    assert ("on_will_published", "a", "w/gone") in rec.calls


def test_restore_subscription_outbound_qos2_and_retained():
    b, clock = make()
    s = b.restore_session("s", 100, None)
    sub = b.restore_subscription("s", "t/#", 1, False, False, 0, 4)
    assert sub is s.subscriptions["t/#"] and b.restore_subscription("nobody", "x", 0, False, False, 0, None) is None
    with pytest.raises(ValueError, match="invalid topic filter"):
        b.restore_subscription("s", "a/#/b", 0, False, False, 0, None)
    m1 = Message("t/1", b"one", 1, False, None, None, "c", 1.0)
    m2 = Message("t/2", b"two", 1, False, None, None, "c", 1.0)
    assert b.restore_outbound("s", m1, 1, False, (4,), 3, False, "h1")
    assert b.restore_outbound("s", m2, 1, False, None, None, False, "h2")
    assert not b.restore_outbound("nobody", m2, 1, False, None, None, False, "h3")
    e = s.inflight_out[3]
    assert isinstance(e, Inflight) and (e.msg, e.qos, e.sub_ids, e.released, e.handle) == \
        (m1, 1, (4,), False, "h1")
    b.restore_qos2("s", 11)
    assert 11 in s.inflight_in
    # routed to the restored subscription: queued behind the restored one
    pub = Client(b)
    pub.connect("p")
    pub.send(P.Publish("t/3", b"three", 1, packet_id=1))
    c = Client(b)
    assert c.connect("s", clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 100}).session_present
    got = c.received()
    assert [(p.payload, p.dup, p.packet_id if p.dup else None) for p in got] == \
        [(b"one", True, 3), (b"two", False, None), (b"three", False, None)]
    expired = Message("r/x", b"old", 0, True, None, clock() - 1, "c", 1.0)
    fresh = Message("r/y", b"new", 0, True, None, clock() + 60, "c", 1.0)
    assert not b.restore_retained(expired) and b.restore_retained(fresh)
    assert [m.topic for m in b.retained.match("r/#")] == ["r/y"]


def test_restored_queued_messages_go_in_front_in_order_and_count_in_the_byte_bounds():
    """Queued messages restored in front of a session's queue (older than what it queued
    meanwhile) keep their order and are counted in mqtt.max_queued_bytes and
    mqtt.max_queued_bytes_total; delivered, they give back exactly what they took."""
    b, _ = make(max_queued_bytes=1000, max_queued_bytes_total=5000)
    s = b.restore_session("s", 100, None)
    b.restore_subscription("s", "t/#", 1, False, False, 0, None)
    pub = Client(b)
    pub.connect("p")
    pub.send(P.Publish("t/live", b"live", 1, packet_id=1))  # queued while offline
    old = [Message(f"t/{i}", b"old%d" % i, 1, False, None, None, "c", 1.0) for i in range(2)]
    used = s.queues.per_session - s.queue_room
    assert b.restore_queued("s", [(m, 1, False, None, None) for m in old], front=True)
    assert not b.restore_queued("nobody", [(old[0], 1, False, None, None)], front=True)
    added = sum(len(m.payload) + len(m.topic_bytes) for m in old)
    assert s.queues.per_session - s.queue_room == used + added
    assert s.queues.total - s.queues.room == used + added
    c = Client(b)
    assert c.connect("s", clean=False, props={PR.SESSION_EXPIRY_INTERVAL: 100}).session_present
    got = c.received()
    assert [p.payload for p in got] == [b"old0", b"old1", b"live"]
    assert s.queue_room == s.queues.per_session and s.queues.room == s.queues.total


def test_store_load_goes_through_the_broker_api(tmp_path):
    clock = Clock()
    store = Store(str(tmp_path / "s.db"), clock=clock, wall=clock)
    b = Broker(MQTTConfig(), clock=clock, wall=clock, store=store)
    assert b.store is not None and b.store.owner is store and b.hooks.barrier == (store.barrier,)
    c = persistent(b, "s", will=P.Will("w", b"bye", 1, False))
    c.send(P.Subscribe(1, [("t/#", P.SubscriptionOptions(2))]))
    c.received()
    pub = Client(b)
    pub.connect("p")
    pub.send(P.Publish("t/1", b"q", 2, packet_id=1))
    pub.send(P.Publish("t/r", b"kept", 0, True))
    d, _ = c.received()
    assert d.qos == 2
    assert store.commit() > 0
    store.close()  # the broker stops while "s" is connected, its QoS 2 message in flight

    calls = []

    class Recording:
        """The broker as the store sees it, each restore_* call noted (a proxy: the Broker
        may be compiled, and compiled classes take no interpreted subclass)."""
        def __init__(self, broker):
            self.broker = broker

        def __getattr__(self, name):
            attr = getattr(self.broker, name)
            if name not in ("restore_session", "restore_subscription", "restore_outbound",
                            "restore_retained"):
                return attr

            def noted(*a, **kw):
                calls.append(name.removeprefix("restore_"))
                return attr(*a, **kw)
            return noted

    store2 = Store(str(tmp_path / "s.db"), clock=clock, wall=clock)
    b2 = Broker(MQTTConfig(), clock=clock, wall=clock)
    summary = store2.load(Recording(b2))
    assert calls == ["session", "subscription", "outbound", "retained"]
    assert summary["sessions"] == 1 and summary["retained"] == 1
    assert store2 in b2.hooks and b2.sessions["s"].store is b2.store  # load attached the store
    s = b2.sessions["s"]
    assert s.inflight_out[d.packet_id].msg.payload == b"q"
    assert s.will.topic == "w" and b2.delayed_wills["s"] is s  # an abnormal end: will due now
    store2.close()


OBSERVED = ("on_message_accepted", "on_retain", "on_will_published", "on_client_connected",
            "on_client_disconnected", "on_session_saved", "on_subscribed")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sets(st.sampled_from(OBSERVED)), min_size=0, max_size=5),
       st.lists(st.booleans(), min_size=5, max_size=5))
def test_each_hook_gets_exactly_the_events_it_provides(provides, removed):
    """Any number of hooks with any subsets of events, some removed again: every event reaches
    every hook still attached that provides it, and no other."""
    hooks = [Recorder(p) for p in provides]
    b, _ = make(*hooks)
    gone = [h for h, r in zip(hooks, removed) if r]
    for h in gone:
        b.remove_hook(h)
    c = persistent(b, "c", will=P.Will("w", b"bye", 0, False))
    c.send(P.Subscribe(1, [("t", P.SubscriptionOptions(0))]))
    c.send(P.Publish("t", b"kept", 0, True))
    c.conn.connection_lost()
    for h in hooks:
        expected = set() if h in gone else set(h.provides)
        assert set(h.names()) == expected, (h.provides, h.calls)


# ---------------------------------------------------------------- in-flight records
def test_inflight_records_have_named_fields_and_each_delivery_its_own():
    b, _ = make()
    s1, s2, pub = Client(b), Client(b), Client(b)
    for c, cid in ((s1, "a"), (s2, "b")):
        c.connect(cid)
        c.send(P.Subscribe(1, [("t", P.SubscriptionOptions(2))]))
        c.received()
    pub.connect("p")
    pub.send(P.Publish("t", b"one", 2, packet_id=1))
    (d1,), (d2,) = s1.received(), s2.received()
    e1 = b.sessions["a"].inflight_out[d1.packet_id]
    e2 = b.sessions["b"].inflight_out[d2.packet_id]
    assert (e1.msg.payload, e1.qos, e1.retain, e1.released, e1.handle) == (b"one", 2, False, False, None)
    s1.send(P.Ack(P.PUBREC, d1.packet_id))
    assert s1.received()[0].type == P.PUBREL and e1.released
    s1.send(P.Ack(P.PUBCOMP, d1.packet_id))
    assert d1.packet_id not in b.sessions["a"].inflight_out
    pub.send(P.Publish("t", b"two", 1, packet_id=2))
    (n1,), (_n2,) = s1.received(), s2.received()
    new = b.sessions["a"].inflight_out[n1.packet_id]
    assert new.msg.payload == b"two" and new.qos == 1 and not new.released
    assert e1.msg.payload == b"one" and e1.released  # the acknowledged record is left as it was
    # the unacknowledged record of the other session is untouched
    assert e2.msg.payload == b"one" and b.sessions["b"].inflight_out[d2.packet_id] is e2


def test_hook_figures_reach_metrics_and_sys_topics_with_labels():
    """A hook's stats() become gauges mqtt_<section>_<name> and $SYS/broker/<section>/<name>;
    a dict named <name>_by_<label> becomes one labelled gauge and one topic per key."""
    from broker.observability.metrics import hook_metrics
    from broker.observability.sys_topics import hook_topics
    figures = {"cluster": {"members": 2, "node": "n1", "ready": True,
                           "clients_by_node": {"n1": 3, "n2": 5}}}
    fams = {f.name: f for f in hook_metrics(figures)}
    assert fams["mqtt_cluster_members"].samples[0].value == 2
    clients = fams["mqtt_cluster_clients"]
    assert [(s.labels, s.value) for s in clients.samples] == [({"node": "n1"}, 3.0),
                                                              ({"node": "n2"}, 5.0)]
    assert "mqtt_cluster_node" not in fams  # text is not a gauge
    assert hook_topics(figures) == {"$SYS/broker/cluster/members": "2",
                                    "$SYS/broker/cluster/node": "n1",
                                    "$SYS/broker/cluster/ready": "true",
                                    "$SYS/broker/cluster/clients/n1": "3",
                                    "$SYS/broker/cluster/clients/n2": "5"}


class PublishRules(Hook):
    """An auth hook that checks PUBLISHes; ``checks``: its needs_publish_check answer (None: it
    has no such method and is asked about every PUBLISH)."""
    provides = frozenset({"allow_publish"})

    def __init__(self, checks: bool | None) -> None:
        self.asked: list[str] = []
        if checks is not None:
            self.needs_publish_check = lambda client_id, username: checks

    def allow_publish(self, client_id, username, topic):
        self.asked.append(topic)
        return topic != "denied"


def test_whether_publishes_are_checked_is_each_auth_hooks_answer_and_yes_without_one():
    """needs_publish_check: no auth hook, no check; a hook without the method is asked about
    every PUBLISH; several hooks: checked when any of them must."""
    from broker.core.hooks import ALLOW_ALL, Checks, needs_publish_check
    assert not needs_publish_check(ALLOW_ALL, "c", None)
    assert needs_publish_check(PublishRules(None), "c", None)
    assert not needs_publish_check(PublishRules(False), "c", None)
    assert not needs_publish_check(Checks([PublishRules(False), PublishRules(False)]), "c", None)
    assert needs_publish_check(Checks([PublishRules(False), PublishRules(None)]), "c", None)


@pytest.mark.parametrize("checks, asked", [(None, ["denied"]), (False, [])])
def test_a_hook_that_says_no_check_is_not_asked_about_a_publish(checks, asked):
    """[MQTT-3.3.4-1] the PUBLISH's ack says the check's outcome: with the hook asked, 0x87."""
    hook = PublishRules(checks)
    clock = Clock()
    b = Broker(MQTTConfig(), clock=clock, wall=clock, hooks=[hook])
    c = Client(b)
    c.connect("c")
    c.send(P.Publish(topic="denied", payload=b"x", qos=1, packet_id=1))
    ack = c.received()[-1]
    assert hook.asked == asked
    assert ack.type == P.PUBACK and ack.reason_code == (0x87 if asked else 0x10)
