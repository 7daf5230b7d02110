"""Store commits when the disk fails: nothing is lost or half-written, output can go on, and the
store writes again when the disk recovers. SQLITE_FULL for real via PRAGMA max_page_count."""
import logging

from broker.core.broker import Broker
from broker.core.message import Message
from broker.core.session import Session
from broker.store.sqlite import Store


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def full(store: Store) -> None:
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count={pages}")  # no page more: SQLITE_FULL


def roomy(store: Store) -> None:
    store.db.execute("PRAGMA max_page_count=1000000")


def retained(store: Store, b: Broker, i: int, size: int = 20000) -> None:
    m = Message(f"r/{i}", b"%05d" % i + bytes(size), 1, True, None, None, "c", 1.0)
    b.retained.set(m.topic, m)
    store.retain_set(m.topic, m)


def test_failed_commit_keeps_changes_retries_with_backoff_and_recovers(tmp_path, caplog):
    clock = Clock()
    store = Store(str(tmp_path / "s.db"), clock=clock)
    b = Broker(store=store)
    store.load(b)
    retained(store, b, 0, 10)
    assert store.commit() == 2
    full(store)
    retained(store, b, 1)
    with caplog.at_level(logging.DEBUG, logger="broker.store"):
        assert store.commit() == -1      # before the fix: raised, and the batch was gone
        assert len(store.ops) == 2 and store.failing == 1
        assert store.commit() == -1      # within the retry delay: not even tried
        clock.t += 0.3
        assert store.commit() == -1 and store.failing == 2  # tried again, still full
        roomy(store)
        assert store.commit() == -1      # the delay doubled (0.5 s)
        clock.t += 0.6
        assert store.commit() == 2 and store.failing == 0 and not store.ops
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "free disk space" in errors[0].getMessage()
    assert any("succeed again" in r.getMessage() for r in caplog.records
               if r.levelno == logging.INFO)
    store.close()
    b2 = Broker()
    assert Store(str(tmp_path / "s.db")).load(b2)["retained"] == 2


def test_too_many_pending_changes_are_dropped_then_the_whole_state_rewritten(tmp_path, caplog):
    clock = Clock()
    store = Store(str(tmp_path / "s.db"), clock=clock, max_pending=5)
    b = Broker(store=store)
    store.load(b)
    s = Session("keeper", 100, False, b.stats, b.sent_by_qos)
    s.expiry_interval = 3600
    s.store = store
    b.sessions["keeper"] = s
    store.save_session(s)
    retained(store, b, 0, 10)
    assert store.commit() > 0
    full(store)
    for i in range(1, 6):
        retained(store, b, i)
    with caplog.at_level(logging.ERROR, logger="broker.store"):
        assert store.commit() == -1
    assert store.resync and not store.ops  # memory bounded: the changes are dropped
    assert any("rewritten" in r.getMessage() for r in caplog.records)
    retained(store, b, 0, 10)              # replaced meanwhile
    b.retained.set("r/3", None)           # and one deleted
    store.retain_set("r/3", None)
    roomy(store)
    clock.t += 1
    assert store.commit() > 0 and not store.resync
    store.close()
    b2 = Broker()
    summary = Store(str(tmp_path / "s.db")).load(b2)
    assert sorted(m.topic for m in b2.retained.all()) == ["r/0", "r/1", "r/2", "r/4", "r/5"]
    assert "keeper" in b2.sessions and summary["retained"] == 5
