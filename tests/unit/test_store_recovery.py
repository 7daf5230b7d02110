"""Store.load restores row by row: a bad row or a damaged part of the file costs only itself."""
import logging
import shutil
import sqlite3

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.core.broker import Broker
from broker.core.message import Message
from broker.core.session import Session, Subscription
from broker.store.sqlite import Store

LONG = "x" * 100


def retained_msg(i: int, size: int = 10) -> Message:
    topic = f"r/{LONG}/{i}"
    return Message(topic, b"m%05d" % i + bytes(size), 1, True, None, None, "c", 1.0)


def build(path, n_retained=5, size=10, per_commit=True) -> None:
    s = Store(str(path))
    for i in range(n_retained):
        m = retained_msg(i, size)
        s.retain_set(m.topic, m)
        if per_commit:
            s.commit()  # one commit per message, as the broker does per turn
    sess = Session("keeper", 100, False, {}, [0, 0, 0])
    sess.expiry_interval = 3600
    sess.store = s
    s.save_session(sess)
    s.save_subscription("keeper", Subscription("a/#", "a/#", None, 1, False, False, 0, None, sess))
    s.enqueue("keeper", Message("a/b", b"queued", 1, False, None, None, "c", 1.0), 1, False, None)
    s.qos2_add("keeper", 7)
    s.commit()
    s.close()


def test_blob_retained_topic_does_not_stop_startup(tmp_path, caplog):
    path = tmp_path / "state.db"
    build(path)
    db = sqlite3.connect(path)
    db.execute("INSERT INTO retained VALUES (?, 1)", (b"bad/blob",))  # a topic stored as a BLOB
    db.commit()
    db.close()
    b = Broker()
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        summary = Store(str(path)).load(b)
    assert summary["retained"] == 5 and summary["dropped"] == {"retained": 1}
    assert sorted(m.topic for m in b.retained.all()) == sorted(f"r/{LONG}/{i}" for i in range(5))
    assert "keeper" in b.sessions and 7 in b.sessions["keeper"].inflight_in
    warn = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("table retained: restored 5 rows, dropped 1 unreadable rows" in w for w in warn), warn


def test_damaged_payload_is_dropped_not_restored(tmp_path, caplog):
    """A truncated file can read back a payload whose overflow pages are zeros, without any
    SQLite error (hypothesis found it: test_any_truncation_...): the row's checksum catches it."""
    path = tmp_path / "state.db"
    build(path, n_retained=3, size=5000)
    db = sqlite3.connect(path)
    db.execute("UPDATE messages SET payload = zeroblob(length(payload)) WHERE topic = ?",
               (f"r/{LONG}/1",))
    db.commit()
    db.close()
    b = Broker()
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        summary = Store(str(path)).load(b)
    assert sorted(m.topic for m in b.retained.all()) == [f"r/{LONG}/0", f"r/{LONG}/2"]
    assert summary["dropped"]["messages"] == 1
    assert any("checksum mismatch" in r.getMessage() for r in caplog.records)


def test_files_without_checksums_still_load_and_get_the_column(tmp_path):
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)  # the messages table as it was before the checksum column
    db.executescript("""
        CREATE TABLE messages (id INTEGER PRIMARY KEY, topic TEXT NOT NULL, payload BLOB,
            qos INTEGER, retain INTEGER, props BLOB, expires_at REAL, accepted_at REAL);
        CREATE TABLE retained (topic TEXT PRIMARY KEY, msg_id INTEGER);
        INSERT INTO messages VALUES (1, 'old/t', x'6869', 1, 1, NULL, NULL, 1.0);
        INSERT INTO retained VALUES ('old/t', 1);""")
    db.close()
    b = Broker()
    s = Store(str(path))
    assert s.load(b)["retained"] == 1 and b.retained.all()[0].payload == b"hi"
    m = retained_msg(7)
    s.retain_set(m.topic, m)
    s.commit()
    s.close()
    b2 = Broker()
    assert Store(str(path)).load(b2)["retained"] == 2


def test_a_bad_row_in_every_table_costs_only_that_row(tmp_path, caplog):
    path = tmp_path / "state.db"
    build(path)
    db = sqlite3.connect(path)
    db.execute("INSERT INTO messages VALUES (900, ?, x'00', 1, 0, NULL, NULL, 1.0, NULL)", (b"blob",))
    db.execute("INSERT INTO messages VALUES (901, 't', x'00', 1, 0, x'ffff', NULL, 1.0, NULL)")  # bad props
    db.execute("INSERT INTO sessions VALUES (?, 60, NULL, NULL, NULL, 1)", (b"blob-id",))
    db.execute("INSERT INTO sessions VALUES ('bad-will', 60, NULL, NULL, x'0102', 1)")
    db.execute("INSERT INTO subscriptions VALUES ('keeper', ?, 1, 0, 0, 0, NULL)", (b"x/#",))
    db.execute("INSERT INTO subscriptions VALUES ('keeper', 'a/#/b', 1, 0, 0, 0, NULL)")
    db.execute("INSERT INTO outbound VALUES (999, 'keeper', 1, 'one', 0, NULL, NULL, 0)")
    db.execute("INSERT INTO qos2_in VALUES ('keeper', 'seven')")
    db.commit()
    db.close()
    b = Broker()
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        summary = Store(str(path)).load(b)
    assert summary["dropped"] == {"messages": 2, "sessions": 2, "subscriptions": 2,
                                  "outbound": 1, "qos2_in": 1}
    keeper = b.sessions["keeper"]
    assert list(keeper.subscriptions) == ["a/#"]
    assert [q[0].payload for q in keeper.queue] == [b"queued"]
    assert keeper.inflight_in == {7} and summary["retained"] == 5
    assert set(b.sessions) == {"keeper"}
    warned = {r.getMessage().split(":")[1].strip().split()[1] for r in caplog.records
              if r.levelno == logging.WARNING and "table" in r.getMessage()}
    assert warned == {"messages", "sessions", "subscriptions", "outbound", "qos2_in"}


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "state.db"
    build(path, n_retained=300, size=1000)
    return path  # (a path, not the bytes: hypothesis prints the arguments of a failure)


def test_half_truncated_file_recovers_a_share(tmp_path, big_store, caplog):
    path = tmp_path / "state.db"
    data = big_store.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    b = Broker()
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        summary = Store(str(path)).load(b)
    assert 0 < summary["retained"] < 300, summary
    for m in b.retained.all():  # what is restored is genuine
        assert m.payload[:6] == b"m%05d" % int(m.topic.rsplit("/", 1)[1])
    assert any(f"table retained: restored {summary['retained']} rows" in r.getMessage()
               or "table retained: restored" in r.getMessage() for r in caplog.records)
    assert any("unreadable parts" in r.getMessage() for r in caplog.records)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 1.0))
@example(cut=0.8836286513077696)  # a retained payload read back with zeroed overflow pages
def test_any_truncation_loads_without_error_and_only_genuine_rows(tmp_path, big_store, cut):
    d = tmp_path / f"cut-{cut}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    path = d / "state.db"
    data = big_store.read_bytes()
    path.write_bytes(data[:int(len(data) * cut)])
    b = Broker()
    summary = Store(str(path)).load(b)  # never raises
    for m in b.retained.all():
        assert m.payload[:6] == b"m%05d" % int(m.topic.rsplit("/", 1)[1])
    if cut == 1.0:
        assert summary["retained"] == 300
    # whatever was recovered was written to the fresh file: a restart has it all
    b2 = Broker()
    assert Store(str(path)).load(b2)["retained"] == len(b.retained.all())


def test_a_stored_message_mqtt_cannot_carry_is_dropped_at_restore(tmp_path, caplog):
    """A retained or queued row whose topic is longer than 65535 bytes [MQTT-4.7.3-3] (a
    PUBLISH's two-byte length cannot say it) is dropped and logged; the good ones load."""
    path = tmp_path / "state.db"
    build(path, n_retained=3)
    db = sqlite3.connect(path)
    long_topic = "t/" + "x" * 70_000
    mid = db.execute("SELECT MAX(id) FROM messages").fetchone()[0] + 1
    for i, topic in enumerate((long_topic, long_topic + "/q")):
        db.execute("INSERT INTO messages VALUES (?, ?, ?, 1, ?, NULL, NULL, 1.0, NULL)",
                   (mid + i, topic, b"bad", 1 - i))
    db.execute("INSERT INTO retained VALUES (?, ?)", (long_topic, mid))
    db.execute("INSERT INTO outbound (client_id, msg_id, qos, retain) VALUES ('keeper', ?, 1, 0)", (mid + 1,))
    db.commit()
    db.close()
    b = Broker()
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        summary = Store(str(path)).load(b)
    assert sorted(m.topic for m in b.retained.all()) == [f"r/{LONG}/{i}" for i in range(3)]
    assert summary["dropped"]["messages"] == 2
    queued = [e[0].topic for e in b.sessions["keeper"].queue]
    assert queued == ["a/b"]
    assert any("[MQTT-4.7.3-3]" in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)


def test_a_stored_will_with_a_wildcard_topic_is_dropped_and_its_session_kept(tmp_path, caplog):
    """A will whose topic is not a topic name [MQTT-3.3.2-2] (written into the store directly:
    the CONNECT check never saw it) is not published at restore; the session is restored."""
    from broker.protocol import packets as P
    from broker.store.sqlite import encode_will
    path = tmp_path / "state.db"
    build(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE sessions SET will = ? WHERE client_id = 'keeper'",
               (encode_will(P.Will("dev/+/gone", b"bye")),))
    db.commit()
    db.close()
    b = Broker()
    with caplog.at_level(logging.WARNING, logger="broker.store"):
        Store(str(path)).load(b)
    assert "keeper" in b.sessions and b.sessions["keeper"].will is None
    assert any("will of session 'keeper' is dropped" in r.getMessage() and "[MQTT-3.3.2-2]"
               in r.getMessage() for r in caplog.records)
