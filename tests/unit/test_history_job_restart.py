"""The history job starts its query again after a failure that only says the machine was too
busy (Spark's fixed 10 s for a Python process to connect back), and not after any other; a
failed wait does not end a running query, and a streaming query that ended unasked is started
again instead of the job exiting as if stopped."""
from __future__ import annotations

import threading

from sink.history.job import command, process, runner


class NoWait(threading.Event):
    def wait(self, timeout=None):
        return self.is_set()


def test_a_transient_failure_restarts_the_query_a_bounded_number_of_times(monkeypatch):
    answers = [runner.RESTART, runner.RESTART, 0]
    calls = []
    monkeypatch.setattr(runner, "run", lambda spark, cfg, stop, batch_rules=None: calls.append(1) or answers.pop(0))
    assert runner.run_restarting(None, None, NoWait()) == 0 and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(runner, "run", lambda spark, cfg, stop, batch_rules=None: calls.append(1) or runner.RESTART)
    assert runner.run_restarting(None, None, NoWait()) == 1 and len(calls) == runner.RESTARTS
    calls.clear()
    monkeypatch.setattr(runner, "run", lambda spark, cfg, stop, batch_rules=None: calls.append(1) or 1)
    assert runner.run_restarting(None, None, NoWait()) == 1 and len(calls) == 1  # a real failure
    stop = NoWait()
    stop.set()
    monkeypatch.setattr(runner, "run", lambda spark, cfg, stop, batch_rules=None: runner.RESTART)
    assert runner.run_restarting(None, None, stop) == 0   # stopping: no restart


class FakeQuery:
    """A streaming query as run() sees it: its waits can fail without the query failing."""

    def __init__(self, wait_errors: int = 0, ends_alone_after: int | None = None) -> None:
        self.active, self.stopped, self.waits = True, False, 0
        self.wait_errors, self.ends_alone_after = wait_errors, ends_alone_after
        self.recentProgress: list = []   # no _jsq: read as Spark Connect's query is

    @property
    def isActive(self) -> bool:
        return self.active

    def awaitTermination(self, timeout: float) -> None:
        self.waits += 1
        if self.ends_alone_after is not None and self.waits >= self.ends_alone_after:
            self.active = False
            return
        if self.waits <= self.wait_errors:
            raise RuntimeError("py4j: the wait was interrupted")

    def exception(self):
        return None

    def stop(self) -> None:
        self.active, self.stopped = False, True


class StopAfter(threading.Event):
    """A stop event set by the n-th check of the loop (a SIGTERM arriving then)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        if self.n <= 0:
            self.set()
        return super().is_set()

    def wait(self, timeout=None):
        return self.is_set()


def run_with(monkeypatch, query: FakeQuery, stop: threading.Event, available_now: bool = False) -> int:
    from types import SimpleNamespace

    import sink.history.catalog as catalog
    import sink.history.maintenance as maintenance
    import sink.history.spark as spark
    monkeypatch.setattr(runner, "start_query", lambda s, j, rules=None: (query, "python"))
    monkeypatch.setattr(runner, "report_commits", lambda j: None)
    monkeypatch.setattr(maintenance, "start_maintainer", lambda *a: None)
    monkeypatch.setattr(catalog, "start_registration", lambda *a: None)
    monkeypatch.setattr(spark, "launched_by_spark_submit", lambda: True)
    cfg = SimpleNamespace(history=None, available_now=available_now)
    return runner.run(None, cfg, stop, poll_seconds=0)


def test_a_failed_wait_on_a_running_query_does_not_stop_it(monkeypatch):
    """A wait that raises while the query still runs (not the query's failure, which ends it)
    is logged and waited again: the query runs on until asked to stop."""
    q = FakeQuery(wait_errors=3)
    assert run_with(monkeypatch, q, StopAfter(12)) == 0
    assert q.waits > 3, "the job stopped waiting after a failed wait"
    assert q.stopped    # stopped because the stop event asked, at the end


def test_a_streaming_query_that_ends_unasked_is_started_again(monkeypatch):
    """Nobody asked the streaming query to stop and it ended without an error: run() asks for
    a restart instead of reporting a clean stop (exit 0 with no history being written)."""
    assert run_with(monkeypatch, FakeQuery(ends_alone_after=2), StopAfter(100)) == runner.RESTART
    # an available-now run ends by itself when Kafka is drained: that is its clean end
    assert run_with(monkeypatch, FakeQuery(ends_alone_after=2), StopAfter(100), available_now=True) == 0


def test_a_signal_during_the_exit_after_a_clean_stop_is_ignored(monkeypatch):
    """The interpreter's exit drops Python's signal handlers: after main() returned, a
    supervisor's SIGTERM (or a second Ctrl-C) must not turn the clean stop into exit -15."""
    import signal
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(command, "main", lambda argv=None: 0)
    try:
        assert command.cli([]) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_the_guard_is_compiled_in_the_data_directory_where_the_checkout_cannot_be_written(
        tmp_path, monkeypatch):
    """An image installed read-only (deploy/Dockerfile: the job runs as another user than the
    files' owner) still gets its read-only guard: compiled under the data directory."""
    import sink.history.spark as spark_mod
    from sink.history.job import guard_build_root
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr(spark_mod, "PROJECT_ROOT", str(blocked))  # build/ cannot be made in it
    assert guard_build_root(str(tmp_path / "data")) == tmp_path / "data" / "build"
    monkeypatch.setattr(spark_mod, "PROJECT_ROOT", str(tmp_path))
    assert guard_build_root(str(tmp_path / "data")) == tmp_path / "build"


def test_a_restarted_query_replaces_its_hard_exit_hook_rather_than_adding_one(tmp_path, monkeypatch):
    """A third signal reports the last commit before the job exits at once: each start of the
    query registers that report, and a restart replaces the earlier run's rather than adding
    one more (the job kept every run's, one more per restart, all run at the exit)."""
    import sink.history.catalog as catalog
    import sink.history.maintenance as maintenance
    import sink.history.spark as spark
    from sink.history.job import Job
    monkeypatch.setattr(process, "hard_exit_hooks", {})
    starts = []
    monkeypatch.setattr(runner, "start_query",
                        lambda s, j, rules=None: starts.append(1) or (FakeQuery(ends_alone_after=1), "python"))
    monkeypatch.setattr(maintenance, "start_maintainer", lambda *a: None)
    monkeypatch.setattr(catalog, "start_registration", lambda *a: None)
    monkeypatch.setattr(spark, "launched_by_spark_submit", lambda: True)
    monkeypatch.setattr(runner, "RESTARTS", 3)
    job = Job.of(table=str(tmp_path / "history"), checkpoint=str(tmp_path / "ck"))
    assert runner.run_restarting(None, job, NoWait()) == 1   # ended unasked each time
    assert len(starts) == 3, "the query was started, then restarted twice"
    assert len(process.hard_exit_hooks) == 1
