"""keep_until = "history": the spool drains whatever order the forwarder and the embedded Kafka are
killed and restarted in (the broker restarts both), with a fake clock, a fake Kafka that restarts
empty and re-creates a topic only when a Metadata request asks for it (the first answer after a
restart does not name its id yet, as Tansu's), a fake history job that commits what Kafka has,
and a forwarder that loads its checkpoint after each restart as the real process does.

Drains means: every record reaches the table (nothing lost), the committed position reaches the
end, and the spool keeps nothing back, so spool_max_bytes is never reached while Kafka and the
job are healthy."""
from __future__ import annotations

import itertools
import json
import logging
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_client.produce import NotReady
from kafka_client.record import decode_body, encode_message
from sink.forward import commit_watch, sources
from sink.forward import forwarder as fw
from sink.forward.forwarder import Runtime
from sink.forward.sources import Checkpoint, MemorySource
from sink.history import commits
from tests.unit.test_forwarder_states import Clock, KafkaTimeoutError, NoRealClock, make

TOPIC = "mqtt.messages"


class ConnectionLost(Exception):
    retriable = True


class World:
    """One embedded Kafka (a single partition of TOPIC) over its restarts, and the history job."""

    def __init__(self, clock: Clock, committed: str):
        self.clock = clock
        self.gen = 1             # the incarnation of the Kafka process (and of the topic)
        self.exists = True       # TOPIC exists in this incarnation
        self.up = True
        self.log: list[int] = []
        self.committed = committed
        self.table: set[int] = set()   # what the job committed, over every incarnation
        self.batch = 0
        self._mtime = 1_000_000_000

    def tid(self) -> str | None:
        return f"id-{self.gen}" if self.exists else None

    def restart_kafka(self) -> None:
        """SIGKILL and restart: memory storage, so it comes back empty, without the topic."""
        self.gen += 1
        self.exists = False
        self.log = []

    def job_commits(self) -> None:
        """The history job: reads what Kafka has and reports it committed (sink/history/commits.py)."""
        if not (self.up and self.exists):
            return
        self.table.update(self.log)
        self.batch += 1
        commits.write_committed(self.committed, self.batch,
                                 {TOPIC: {"topic_id": self.tid(), "offsets": {0: len(self.log)}}})
        self._mtime += 1_000_000   # the forwarder notices a new file by its stat
        os.utime(self.committed, ns=(self._mtime, self._mtime))


class Future:
    def __init__(self, gen: int, groups: dict):
        self.gen = gen
        self.values = [int(decode_body(body)[1]) for recs in groups.values() for _, body in recs]
        self.counts = {(t, 0): len(v) for t, v in groups.items()}
        self.exception = self.value = None
        self.done = False

    def poll(self) -> bool:
        return self.done


class Cluster:
    def __init__(self, world: World):
        self.world = world
        self._last_successful_refresh_ms = 0
        self.tid = None
        self.requested = False

    def topic_id(self, topic: str):
        return self.tid

    def request_update(self):
        self.requested = True

    def refresh(self) -> None:
        w = self.world
        if not w.up:
            return
        if not w.exists:         # this Metadata request makes Kafka create the topic; its answer
            w.exists = True      # does not name the new id yet
            self.tid = None
        else:
            self.tid = w.tid()
        self.requested = False
        self._last_successful_refresh_ms = w.clock.monotonic() * 1000


class Producer:
    """Stands in for produce.BatchSender, connected to WORLD."""
    world: World

    def __init__(self, pcfg):
        if not Producer.world.up:
            raise KafkaTimeoutError("no brokers")
        self.cluster = Cluster(Producer.world)
        self.inflight: list[Future] = []
        self.refreshed_at = 0.0

    def request_update(self):
        self.cluster.request_update()

    def maybe_refresh(self):
        if self.cluster.world.clock.monotonic() - self.refreshed_at > 5:
            self.refreshed_at = self.cluster.world.clock.monotonic()
            self.cluster.request_update()

    def partitions_for(self, topic, wait_ms=0):
        self.cluster.request_update()
        if wait_ms:
            self.cluster.refresh()
        return {0}

    def send(self, groups):
        w = self.cluster.world
        if not w.up:
            raise NotReady("connection not ready")
        if not self.cluster._last_successful_refresh_ms:
            self.cluster.request_update()
            raise NotReady("no metadata yet")
        fut = Future(w.gen, groups)
        self.inflight.append(fut)
        return fut

    def poll(self, ms=0):
        w = self.cluster.world
        if self.cluster.requested:
            self.cluster.refresh()
        for fut in self.inflight:
            if w.up and fut.gen == w.gen:
                base = len(w.log)
                if w.exists:
                    w.log += fut.values
                # (a topic Kafka no longer has: Tansu acknowledges and drops the records)
                fut.value = {tp: base for tp in fut.counts}
            else:
                fut.exception = ConnectionLost("connection reset by the restarted Kafka")
            fut.done = True
        self.inflight = []

    def close(self):
        pass


class Disk(MemorySource):
    """The spool and the forwarder's checkpoint.json: both survive a forwarder restart."""

    def __init__(self, clock: Clock):
        super().__init__(1 << 30, clock=clock.time)
        self.saved = "{}"

    def load(self) -> Checkpoint:
        ck = json.loads(self.saved)
        pos, seq = int(ck.get("pos", 0)), int(ck.get("seq", 0))
        self.seek(min(pos, int(ck.get("resume", pos))))
        return Checkpoint(pos, seq, ck.get("kafka") or {})

    def commit(self, pos, seq, kafka_state, resume, force=False, committed=None):
        data = {"pos": pos, "seq": seq, "resume": resume, "kafka": kafka_state}
        if committed is not None:
            data["committed_pos"], data["committed_seq"] = committed
        self.saved = json.dumps(data)

    def committed(self):
        ck = json.loads(self.saved)
        if "committed_pos" not in ck:
            return None
        return fw.SpoolPosition(ck["committed_pos"], ck["committed_seq"])


class Rig:
    def __init__(self, clock: Clock, tmp_path):
        self.clock = clock
        tmp = tempfile.mkdtemp(dir=tmp_path)   # hypothesis runs many examples in one tmp_path
        self.world = Producer.world = World(clock, os.path.join(tmp, commits.FILE_NAME))
        self.disk = Disk(clock)
        self.added = 0
        self.f = None
        self.start_forwarder()

    def start_forwarder(self, history_stale_seconds: float = 120.0, **rt) -> None:
        """A (re)started forwarder process: loads the checkpoint (run() until its first turn).
        rt: fields of its Runtime."""
        rt.setdefault("data_dir", "")
        f = make(self.clock, self.disk, Runtime(spool_dir="", bootstrap="127.0.0.1:1",
                                                committed_file=self.world.committed, **rt),
                 chunk=3, keep_until="history", replay_window_seconds=0,
                 history_stale_seconds=history_stale_seconds)
        f.control.command("stop")
        f.run()
        self.f, self.last_ckpt, self.last_house = f, -1.0, -1.0

    def add(self, n: int) -> None:
        for i in range(self.added, self.added + n):
            self.disk.append(encode_message(TOPIC, "t/x", str(i).encode(), 1, False, "c", None, 5,
                                            int(self.clock.time() * 1000), f"id-{i}"))
        self.added += n

    def turn(self, dt: float = 0.05) -> None:
        """One turn of the forwarder's loop (Forwarder.run after the control channel)."""
        self.clock.advance(dt)
        now = self.clock.monotonic()
        f = self.f
        f.step(now)
        if now - self.last_ckpt >= 0.5:
            self.last_ckpt = now
            f.checkpoint()
        if now - self.last_house >= 1.0:
            self.last_house = now
            f.housekeeping()

    def run(self, seconds: float, job_every: float = 1.0) -> None:
        next_job = self.clock.monotonic() + job_every
        end = self.clock.monotonic() + seconds
        while self.clock.monotonic() < end:
            self.turn()
            if self.clock.monotonic() >= next_job:
                next_job += job_every
                self.world.job_commits()

    def drained(self) -> bool:
        f = self.f
        return (not f.commits.pending and not f.inflight and f.acked_seq == self.added
                and f.commits.committed_seq == self.added and f.retained().seq == self.added)

    def settle(self, limit: float = 120.0) -> None:
        """Kafka up, nothing killed: within `limit` fake seconds the spool must drain."""
        self.world.up = True
        for _ in range(int(limit)):
            self.run(1.0)
            if self.drained():
                self.run(2.0)               # housekeeping's next turn
                break
        f = self.f
        missing = set(range(self.added)) - self.world.table
        assert not missing, f"{len(missing)} records never reached the table: {sorted(missing)[:10]}"
        assert self.drained(), (f"the spool does not drain: committed seq {f.commits.committed_seq} of "
                                f"{self.added}, pending {[(c.next_seq, c.topic_ids) for c in f.commits.pending]}, "
                                f"topic ids {f.loss.topic_ids}, Kafka {self.world.tid()}, state {f.state}")
        assert not self.disk._items                 # housekeeping deleted every committed record


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    for module in (fw, commit_watch, sources):
        monkeypatch.setattr(module, "time", NoRealClock())
    monkeypatch.setattr(fw, "BatchSender", Producer)
    return c


KILLS = ["forwarder", "kafka"]


@pytest.mark.parametrize("order", [p for n in (1, 2, 3) for p in itertools.product(KILLS, repeat=n)],
                         ids=lambda o: "-then-".join(o))
@pytest.mark.parametrize("gap", [0.0, 0.05, 0.3, 2.0])
def test_spool_drains_after_forwarder_and_kafka_are_killed_in_any_order(clock, tmp_path, order, gap):
    """The forwarder and then the embedded Kafka (or the other way round, or repeatedly) are
    killed while records flow and the job commits; with `gap` fake seconds between the kills."""
    rig = Rig(clock, tmp_path)
    rig.add(20)
    rig.run(3.0)
    for what in order:
        rig.add(7)
        rig.run(0.2, job_every=0.1)
        if what == "kafka":
            rig.world.restart_kafka()
        else:
            rig.start_forwarder()
        rig.add(5)
        rig.run(gap, job_every=0.1)
    rig.add(10)
    rig.settle()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["forwarder", "kafka", "kafka_down", "job", "add", "wait"]),
                          st.sampled_from([0.0, 0.05, 0.1, 0.5, 1.0, 3.0, 20.0])),
                min_size=1, max_size=25))
def test_spool_drains_whatever_happens_in_between(clock, tmp_path, events):
    """Any interleaving of kills, a Kafka that stays down a while, job commits, new records and
    waits: once both run again, the spool drains and the table has every record."""
    rig = Rig(clock, tmp_path)
    rig.add(10)
    for what, dt in events:
        if what == "forwarder":
            rig.start_forwarder()
        elif what == "kafka":
            rig.world.restart_kafka()
        elif what == "kafka_down":
            rig.world.up = False
            rig.run(dt)
            rig.world.restart_kafka()
            rig.world.up = True
        elif what == "job":
            rig.world.job_commits()
        elif what == "add":
            rig.add(1 + int(dt * 10))
        rig.run(dt, job_every=0.7)
    rig.add(3)
    rig.settle()


def test_a_head_chunk_saved_without_topic_id_is_sent_again_not_kept_for_ever(clock, tmp_path):
    """A checkpoint from before this fix holds an acknowledged chunk whose topic id is null; the
    job commits the topic under its real id: the chunk is sent again and the spool drains."""
    rig = Rig(clock, tmp_path)
    rig.add(6)
    rig.run(3.0, job_every=100)             # acknowledged, not committed
    ck = json.loads(rig.disk.saved)
    assert ck["kafka"]["pending"]
    for chunk in ck["kafka"]["pending"]:
        chunk[3] = {TOPIC: None}
    rig.disk.saved = json.dumps(ck)
    rig.world.restart_kafka()               # ... and the records it names are gone
    rig.start_forwarder()
    rig.settle()


# ---- saying what keeps records in the spool ----------------------------------------------------

def watched(clock, tmp_path, **rt) -> Rig:
    """A rig whose forwarder has history_stale_seconds = 60; rt: fields of its Runtime."""
    rig = Rig(clock, tmp_path)
    rig.start_forwarder(history_stale_seconds=60, **rt)
    rig.add(9)
    return rig


def test_a_missing_committed_file_is_said_at_once(clock, tmp_path, caplog):
    caplog.set_level(logging.INFO, "sink.forward")
    rig = watched(clock, tmp_path)
    rig.run(2.0, job_every=1000)                 # acknowledged by Kafka; the job never wrote
    st = rig.f.status()
    assert st["commit_status"] == "missing" and rig.world.committed in st["commit_problem"]
    assert "9 records kept in the spool" in st["commit_problem"]
    assert caplog.text.count("records wait for the history table") == 1
    rig.world.job_commits()
    rig.run(2.0, job_every=1000)
    assert rig.f.status()["commit_status"] == "ok" and rig.drained()
    assert "commits release spooled records again" in caplog.text


def test_a_job_that_stopped_committing_is_said_after_stale_seconds(clock, tmp_path):
    rig = watched(clock, tmp_path)
    rig.run(2.0)                                 # committed: ok
    rig.add(5)
    rig.run(59, job_every=1000)
    assert rig.f.status()["commit_status"] == "ok"
    rig.run(3, job_every=1000)
    st = rig.f.status()
    assert st["commit_status"] == "stale" and "committed nothing for" in st["commit_problem"]
    assert st["commit_waiting_seconds"] > 60


def test_the_history_lag_is_how_long_records_waited_since_the_jobs_last_commit(clock, tmp_path):
    """The sink's history_lag_seconds (the dashboard's "history job: since last commit" line):
    the forwarder's commit wait with keep_until = "history", 0 once the table has everything;
    None with keep_until = "kafka", where the job's commits are not followed."""
    from types import SimpleNamespace

    from sink.forward.service import Sink

    def lag(keep_until: str, st: dict):
        stub = SimpleNamespace(cfg=SimpleNamespace(keep_until=keep_until))
        return Sink._commit_stats(stub, st)["history_lag_seconds"]  # type: ignore[arg-type]
    rig = watched(clock, tmp_path)
    rig.run(2.0)                                 # committed: nothing waits
    assert lag("history", rig.f.status()) == 0.0
    rig.add(5)
    rig.run(30, job_every=1000)                  # acknowledged by Kafka, the job commits nothing
    assert 25 <= lag("history", rig.f.status()) <= 32
    rig.world.job_commits()
    rig.run(2.0, job_every=1000)
    assert lag("history", rig.f.status()) == 0.0 and rig.drained()
    assert lag("kafka", rig.f.status()) is None


def test_a_job_that_commits_without_covering_the_oldest_records_is_an_alarm(clock, tmp_path):
    """The job commits batch after batch, but of another Kafka topic: the spool position stays
    put, which is said once it lasted stale_after seconds."""
    rig = watched(clock, tmp_path)
    rig.run(2.0, job_every=1000)
    for batch in range(70):
        commits.write_committed(rig.world.committed, batch, {"other.topic": {"topic_id": "x",
                                                                                "offsets": {0: batch}}})
        os.utime(rig.world.committed, ns=(batch * 10**9, batch * 10**9))
        rig.run(1.0, job_every=1000)
    st = rig.f.status()
    assert st["commit_status"] == "stalled"
    assert "does not report Kafka topic mqtt.messages" in st["commit_problem"]


def test_an_unsigned_or_foreign_committed_file_releases_nothing(clock, tmp_path):
    """With the broker's key, a committed file anyone could have written (unsigned) or signed
    with another key is ignored: the records stay, and the status says why."""
    rig = watched(clock, tmp_path, sink_key=b"k" * 32)
    rig.run(2.0, job_every=1000)
    rig.world.job_commits()                      # the fake job does not sign
    rig.run(2.0, job_every=1000)
    st = rig.f.status()
    assert st["commit_status"] == "unsigned" and rig.f.commits.committed_seq == 0
    from settings import secrets
    for key, status in ((b"o" * 32, "bad_signature"), (b"k" * 32, "ok")):
        commits.write_committed(rig.world.committed, 99, {TOPIC: {"topic_id": rig.world.tid(),
                                                                   "offsets": {0: 9}}},
                                 key=secrets.derive(key, secrets.COMMITTED))
        os.utime(rig.world.committed, ns=(len(status) * 10**9,) * 2)
        rig.run(1.0, job_every=1000)
        assert rig.f.status()["commit_status"] == status
    assert rig.f.commits.committed_seq == 9


def test_a_job_writing_another_table_is_named(clock, tmp_path):
    """The job announces in the data directory where it reports its commits (sink.job --table
    elsewhere): the broker, finding no committed file of its own, says where the job's is."""
    job_file = tmp_path / commits.JOB_FILE
    job_file.write_text(json.dumps({"pid": os.getpid(), "table": "/elsewhere/history",
                                    "committed_file": "/elsewhere/history_checkpoint/x.json"}))
    rig = watched(clock, tmp_path, data_dir=str(tmp_path))
    rig.run(2.0, job_every=1000)
    st = rig.f.status()
    assert st["commit_status"] == "other_table"
    assert "/elsewhere/history_checkpoint/x.json" in st["commit_problem"]
    assert f"pid {os.getpid()}" in st["commit_problem"]


def test_a_job_that_is_starting_is_given_time_to_commit(clock, tmp_path, caplog):
    """No committed file yet, but a job runs and will write it (it announced itself): a normal
    start, nothing to warn about until stale_after seconds pass without a commit."""
    job_file = tmp_path / commits.JOB_FILE
    rig = watched(clock, tmp_path, data_dir=str(tmp_path))
    job_file.write_text(json.dumps({"pid": os.getpid(), "table": "/t",
                                    "committed_file": rig.world.committed}))
    rig.run(30, job_every=1000)
    assert rig.f.status()["commit_status"] == "ok" and "records wait" not in caplog.text
    rig.run(31, job_every=1000)
    st = rig.f.status()
    assert st["commit_status"] == "stale" and "has not committed anything yet" in st["commit_problem"]


# ---- what a normal restart logs ----------------------------------------------------------------

@pytest.mark.parametrize("embedded", [True, False])
def test_an_embedded_kafka_restart_is_one_info_line_another_kafka_losing_data_a_warning(
        clock, tmp_path, caplog, embedded):
    """The embedded Kafka keeps nothing across a restart by design: the re-sending is routine
    and said in one INFO line; a Kafka of one's own that loses a topic is a WARNING."""
    caplog.set_level(logging.INFO, "sink.forward")
    rig = watched(clock, tmp_path, embedded=embedded)
    rig.run(2.0, job_every=1000)
    rig.world.restart_kafka()
    rig.start_forwarder()                          # a broker restart: both start again
    rig.f.embedded = embedded
    rig.settle()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if "the embedded Kafka started empty" in r.getMessage()]
    if embedded:
        assert len(infos) == 1 and "records not yet committed by the history job" in infos[0]
        assert not [w for w in warnings if "history table" not in w], warnings
    else:
        assert not infos and any("Kafka lost data" in w for w in warnings)


def test_a_topic_kafka_is_still_creating_is_not_kafka_unavailable(clock, tmp_path, caplog):
    """The first records of a new topic find no leader for a moment (Kafka creates it): that
    is not "Kafka unavailable" unless it lasts unreachable_after seconds."""
    rig = watched(clock, tmp_path)
    real_send = Producer.send
    refusals = [3]

    def send(self, groups):
        if refusals[0]:
            refusals[0] -= 1
            raise NotReady("no leader for mqtt.messages/0")
        return real_send(self, groups)
    Producer.send = send
    try:
        rig.run(2.0)
    finally:
        Producer.send = real_send
    assert rig.f.kafka_up is True and "unavailable" not in caplog.text
    assert rig.f.acked_seq == 9
