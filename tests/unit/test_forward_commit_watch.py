"""Watching the history job's commits (sink/forward/commit_watch.py CommitWatcher), alone: a
committed file written by a fake job, a fake clock; what is committed and what keeps records
waiting."""
import json
import os

from sink.forward.commit_watch import AckedChunk, CommitWatcher
from sink.forward.spool import SpoolPosition
from sink.history import commits


class Clock:
    def __init__(self):
        self.now = 500.0

    def __call__(self):
        return self.now


def watcher(tmp_path, clock, **kw):
    return CommitWatcher(str(tmp_path / commits.FILE_NAME), job_file=str(tmp_path / commits.JOB_FILE),
                         stale_after=60, clock=clock, **kw)


def job_commits(tmp_path, batch, offset, tid="A"):
    path = str(tmp_path / commits.FILE_NAME)
    commits.write_committed(path, batch, {"m": {"topic_id": tid, "offsets": {0: offset}}})
    os.utime(path, ns=(batch * 10**9, batch * 10**9))     # a new file by its stat


def test_the_committed_position_follows_the_file_chunk_by_chunk(tmp_path):
    clock = Clock()
    w = watcher(tmp_path, clock)
    w.acked(AckedChunk(100, 10, {("m", 0): 10}, {"m": "A"}))
    w.acked(AckedChunk(200, 20, {("m", 0): 20}, {"m": "A"}))
    job_commits(tmp_path, 1, 15)                  # the table has offsets up to 14: the first chunk
    assert w.advance(SpoolPosition(200, 20), False, {"m": "A"}) is None
    assert w.committed == (100, 10) and len(w.pending) == 1
    job_commits(tmp_path, 2, 20)
    w.advance(SpoolPosition(200, 20), False, {"m": "A"})
    assert w.committed == (200, 20) and not w.pending and w.waiting_since is None


def test_the_lag_is_how_long_the_oldest_records_waited_on_the_clock(tmp_path):
    clock = Clock()
    w = watcher(tmp_path, clock)
    job_commits(tmp_path, 1, 0)
    w.acked(AckedChunk(100, 10, {("m", 0): 10}, {"m": "A"}))
    w.advance(SpoolPosition(100, 10), False, {"m": "A"})
    clock.now += 42.0
    assert w.waiting_seconds() == 42.0 and w.status == "ok"
    w.advance(SpoolPosition(100, 10), False, {"m": "A"})
    assert w.status == "ok"                                  # 42 s < stale_after
    clock.now += 20.0
    w.advance(SpoolPosition(100, 10), False, {"m": "A"})
    assert w.status == "stale" and "committed nothing for 62 s" in w.problem
    assert "10 records kept in the spool for 62 s" in w.problem


def test_no_file_and_no_job_is_said_at_once_a_starting_job_is_given_time(tmp_path):
    clock = Clock()
    w = watcher(tmp_path, clock)
    w.acked(AckedChunk(100, 10, {("m", 0): 10}, {"m": "A"}))
    w.advance(SpoolPosition(100, 10), False, {"m": "A"})
    assert w.status == "missing" and "no history job running" in w.problem
    (tmp_path / commits.JOB_FILE).write_text(json.dumps({
        "pid": os.getpid(), "table": "/t", "committed_file": str(tmp_path / commits.FILE_NAME)}))
    w.advance(SpoolPosition(100, 10), False, {"m": "A"})
    assert w.status == "ok"
    clock.now += 61
    w.advance(SpoolPosition(100, 10), False, {"m": "A"})
    assert w.status == "stale" and "has not committed anything yet" in w.problem


def test_a_chunk_written_to_a_topic_incarnation_gone_for_good_is_data_lost(tmp_path):
    """Kafka and the job both have topic id B now; the oldest waiting chunk went to A: no commit
    can ever cover it, which the watcher says so that it is sent again."""
    w = watcher(tmp_path, Clock())
    w.acked(AckedChunk(100, 10, {("m", 0): 10}, {"m": "A"}))
    job_commits(tmp_path, 1, 3, tid="B")
    lost = w.advance(SpoolPosition(100, 10), False, {"m": "B"})
    assert lost is not None and "under topic id A; Kafka and the job now have B" in lost
    assert w.committed == (0, 0)


def test_everything_acknowledged_is_committed_when_idle_with_nothing_pending(tmp_path):
    """Records no chunk covers (torn tails, other shards' records) do not hold the spool."""
    w = watcher(tmp_path, Clock())
    w.load(SpoolPosition(50, 5))
    w.advance(SpoolPosition(80, 8), False, {})
    assert w.committed == (50, 5)                 # something may still be in flight
    w.advance(SpoolPosition(80, 8), True, {})
    assert w.committed == (80, 8)
