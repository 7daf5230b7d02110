"""Which store changes force a commit at the end of their turn, and which may wait for a later
one (broker/store/sqlite.py): a connected session's row and a QoS 1 delivery's bookkeeping wait
(at least once allows a resend after a crash); everything acknowledged, offline sessions' rows and
what QoS 0 / QoS 2 deliveries depend on are committed in their turn (at most / exactly once)."""
import sqlite3

from broker.core.message import Message
from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.store import sqlite as store_mod
from broker.store.sqlite import Store
from tests.sansio import Client, drain, make

EXPIRY = {PR.SESSION_EXPIRY_INTERVAL: 3600}


def stored(path, sql: str):
    """Rows as another process reading the file sees them (what a SIGKILL would leave)."""
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def setup(tmp_path, qos: int):
    """A persistent subscriber at `qos` with two messages queued while it was offline."""
    path = str(tmp_path / "state.db")
    b, clock = make()
    store = Store(path, clock=clock, wall=clock)
    b.add_hook(store)
    sub = Client(b)
    sub.connect("dev", clean=False, props=EXPIRY)
    sub.send(P.Subscribe(1, [("t", P.SubscriptionOptions(qos))]))
    store.on_turn_end()
    sub.received()
    sub.conn.connection_lost()
    pub = Client(b)
    pub.connect("pub")
    for i in range(2):
        pub.send(P.Publish("t", b"m%d" % i, qos, packet_id=i + 1))
    store.on_turn_end()
    drain(pub.conn)
    assert not store.ops and not store.urgent
    return b, store, path


def test_a_qos1_delivery_and_a_connected_sessions_row_wait_for_a_later_commit(tmp_path):
    """Reconnecting sends the queued QoS 1 messages; the session's row and their packet ids are
    not committed at the end of that turn (a reconnect storm would commit once per turn), but by
    the next tick; the PUBACKs' deletions likewise. Killed before that, the store holds the
    messages queued (sent again after a restart: QoS 1 is at least once) [MQTT-4.3.2-1]."""
    b, store, path = setup(tmp_path, 1)
    sub = Client(b)
    assert sub.connect("dev", clean=False, props=EXPIRY).session_present
    store.on_turn_end()
    sent = [p for p in sub.received() if p.type == P.PUBLISH]
    assert [p.payload for p in sent] == [b"m0", b"m1"] and store.ops and not store.urgent
    assert stored(path, "SELECT pid FROM outbound ORDER BY seq") == [(None,), (None,)]
    for p in sent:
        sub.send(P.Ack(P.PUBACK, p.packet_id))
    store.on_turn_end()
    assert len(stored(path, "SELECT seq FROM outbound")) == 2  # still waiting
    store.on_tick()
    assert not store.ops and stored(path, "SELECT seq FROM outbound") == []
    assert stored(path, "SELECT expires_at FROM sessions") == [(None,)]  # connected


def test_a_qos2_delivery_is_committed_before_its_publish_goes_out(tmp_path):
    """A queued QoS 2 message is sent with a packet id only once that id is on disk: after a crash
    it is sent again with the same id and DUP=1, never as a new message [MQTT-4.3.3-1],
    [MQTT-4.4.0-1]."""
    b, store, path = setup(tmp_path, 2)
    sub = Client(b)
    sub.connect("dev", clean=False, props=EXPIRY)
    assert store.urgent
    store.on_turn_end()  # what the server's flush does before writing
    pids = [p.packet_id for p in sub.received() if p.type == P.PUBLISH]
    assert sorted(r[0] for r in stored(path, "SELECT pid FROM outbound")) == sorted(pids)
    sub.send(P.Ack(P.PUBREC, pids[0]))
    assert store.urgent  # the PUBREL's state: committed in its turn [MQTT-4.3.3-6]


def test_an_offline_sessions_row_is_committed_in_its_turn(tmp_path):
    """A disconnect stores the session's expiry and drops its will: committed at the end of its
    turn, so a crash right after does not publish a will the client had cancelled
    [MQTT-3.1.2-10]."""
    b, store, path = setup(tmp_path, 1)
    sub = Client(b)
    sub.connect("dev", clean=False, props=EXPIRY, will=P.Will("w", b"gone", 0, False))
    store.on_turn_end()
    assert stored(path, "SELECT will IS NOT NULL FROM sessions") == [(0,)]  # (lazy: not yet)
    store.on_tick()
    assert stored(path, "SELECT will IS NOT NULL FROM sessions") == [(1,)]
    sub.send(P.Disconnect())
    sub.conn.connection_lost()
    assert store.urgent
    store.on_turn_end()
    assert stored(path, "SELECT will IS NOT NULL, expires_at IS NOT NULL FROM sessions") == [(0, 1)]


def test_waiting_changes_are_bounded(tmp_path, monkeypatch):
    """At most LAZY_MAX_OPS changes wait: then the end of the turn commits them."""
    monkeypatch.setattr(store_mod, "LAZY_MAX_OPS", 3)
    b, store, path = setup(tmp_path, 1)
    sub = Client(b)
    sub.connect("dev", clean=False, props=EXPIRY)  # the session's row and two packet ids
    store.on_turn_end()
    assert not store.ops


def test_a_queued_qos0_message_sent_is_removed_in_its_turn(tmp_path):
    """mqtt.queue_qos0_messages: a queued QoS 0 message, once sent, is deleted in its turn, so a
    crash does not send it twice (at most once, 4.3.1)."""
    path = str(tmp_path / "state.db")
    b, clock = make(queue_qos0_messages=True)
    store = Store(path, clock=clock, wall=clock)
    b.add_hook(store)
    sub = Client(b)
    sub.connect("dev", clean=False, props=EXPIRY)
    sub.send(P.Subscribe(1, [("t", P.SubscriptionOptions(0))]))
    sub.conn.connection_lost()
    b.route(Message("t", b"q0", 0, False, None, None, "x", 0.0), None)
    store.on_turn_end()
    assert len(stored(path, "SELECT seq FROM outbound")) == 1
    sub = Client(b)
    sub.connect("dev", clean=False, props=EXPIRY)
    assert [p.payload for p in sub.received() if p.type == P.PUBLISH] == [b"q0"]
    assert store.urgent
    store.on_turn_end()
    assert stored(path, "SELECT seq FROM outbound") == []
