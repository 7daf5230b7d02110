"""An ACL change (reload) applies to what is already waiting for a client: queued messages, and
retained messages waiting to be replayed, are checked again before they are sent; existing
subscriptions the ACL no longer grants deliver nothing it does not allow (sans-I/O, the real
AccessControl on files; Mosquitto checks read access of each message it sends)."""
from __future__ import annotations

from pathlib import Path

from broker.auth import AccessControl
from broker.core.broker import Broker
from broker.protocol import properties as PR
from settings import MQTTConfig
from tests.sansio import Client, Clock, ack, lose, nothing, publish_ok, recv_publish, subscribe

BEFORE = "user alice\ntopic write #\nuser bob\ntopic read secret/#\ntopic read public/#\n"
PERSIST = {PR.SESSION_EXPIRY_INTERVAL: 3600}


def setup(tmp_path: Path, **cfg):
    acl = tmp_path / "acl"
    acl.write_text(BEFORE)
    ac = AccessControl(acl_file=str(acl), decision_cache_size=100)
    clock = Clock()
    b = Broker(MQTTConfig(**cfg), clock=clock, wall=clock, auth=ac)
    alice = Client(b)
    assert alice.connect("alice", username="alice").reason_code == 0
    return b, ac, acl, alice


def bob(b, props=None) -> Client:
    c = Client(b)
    assert c.connect("bob", clean=False, props={**PERSIST, **(props or {})},
                     username="bob").reason_code == 0
    return c


def test_queued_messages_not_readable_after_reload_are_not_delivered(tmp_path):
    """bob may read secret/# when the messages are queued for his offline session; the ACL is
    reloaded without that grant: on reconnecting he gets none of them (counted as
    not_authorized), nor new ones on the subscription the ACL no longer grants, while public/#
    still flows."""
    b, ac, acl, alice = setup(tmp_path)
    c = bob(b)
    assert subscribe(c, "secret/#", "public/#", qos=1).reason_codes == [1, 1]
    lose(c)
    for i, t in enumerate(("secret/1", "secret/2", "public/1")):
        publish_ok(alice, t, b"m", qos=1, pid=i + 1)
    assert len(b.sessions["bob"].queue) == 3
    acl.write_text("user alice\ntopic write #\nuser bob\ntopic read public/#\n")
    ac.reload()
    before = b.stats["dropped_not_authorized"]
    c = bob(b)
    m = recv_publish(c)
    assert m.topic == "public/1"
    ack(c, m)
    assert nothing(c) and b.stats["dropped_not_authorized"] == before + 2
    assert b.queues.used == 0
    publish_ok(alice, "secret/3", b"new", qos=1, pid=9)
    publish_ok(alice, "public/2", b"new", qos=1, pid=10)
    m = recv_publish(c)
    assert m.topic == "public/2" and nothing(c)


def test_deny_rule_added_by_reload_filters_a_connected_clients_queue(tmp_path):
    """bob is connected, his Receive Maximum 1 holds the rest in the queue; a reload adds a deny
    rule: what waits for him on the denied topic is not sent when the window frees."""
    b, ac, acl, alice = setup(tmp_path)
    c = bob(b, {PR.RECEIVE_MAXIMUM: 1})
    subscribe(c, "secret/#", qos=1)
    for i in range(4):
        publish_ok(alice, f"secret/{i % 2}", f"{i}".encode(), qos=1, pid=i + 1)
    first = recv_publish(c)
    assert first.payload == b"0" and len(b.sessions["bob"].queue) == 3
    acl.write_text(BEFORE + "topic deny secret/1\n")
    ac.reload()
    ack(c, first)
    m = recv_publish(c)
    assert (m.topic, m.payload) == ("secret/0", b"2")
    ack(c, m)
    assert nothing(c) and not b.sessions["bob"].queue


def test_retained_replay_waiting_is_checked_again_after_reload(tmp_path):
    """Retained messages waiting to be replayed to a new subscription (paced under
    backpressure) are checked against the reloaded ACL too."""
    b, ac, acl, alice = setup(tmp_path)
    for i in range(3):
        publish_ok(alice, f"secret/r{i}", b"v", qos=1, pid=i + 1, retain=True)
    c = bob(b)
    c.conn.pause_writing()  # the client reads slowly: the replay waits
    subscribe(c, "secret/#", qos=0)
    assert b.sessions["bob"].feeds  # (nothing sent yet)
    acl.write_text("user alice\ntopic write #\nuser bob\ntopic read public/#\n")
    ac.reload()
    c.conn.resume_writing()
    assert nothing(c) and not b.sessions["bob"].feeds


def test_unchanged_acl_drops_nothing_and_checks_no_message(tmp_path, monkeypatch):
    """Without a reload no queued message is checked again (the common path is one comparison
    per pump), and a reload that keeps bob's grants delivers everything."""
    b, ac, acl, alice = setup(tmp_path)
    c = bob(b)
    subscribe(c, "secret/#", qos=1)
    lose(c)
    for i in range(3):
        publish_ok(alice, "secret/x", b"m", qos=1, pid=i + 1)
    calls = []
    real = ac.allow_read
    monkeypatch.setattr(b.queues, "allow_read", lambda *a: calls.append(a) or real(*a))
    c = bob(b)
    for _ in range(3):
        ack(c, recv_publish(c))
    assert calls == []
    lose(c)
    publish_ok(alice, "secret/y", b"m", qos=1, pid=7)
    ac.reload()  # same file: every grant stays
    c = bob(b)
    ack(c, recv_publish(c))
    assert len(calls) == 1 and nothing(c)
