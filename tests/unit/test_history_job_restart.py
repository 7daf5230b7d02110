"""The history job starts its query again after a failure that only says the machine was too
busy (Spark's fixed 10 s for a Python process to connect back), and not after any other."""
from __future__ import annotations

import threading

import sink.history.job as job


class NoWait(threading.Event):
    def wait(self, timeout=None):
        return self.is_set()


def test_a_transient_failure_restarts_the_query_a_bounded_number_of_times(monkeypatch):
    answers = [job.RESTART, job.RESTART, 0]
    calls = []
    monkeypatch.setattr(job, "run", lambda spark, cfg, stop: calls.append(1) or answers.pop(0))
    assert job.run_restarting(None, None, NoWait()) == 0 and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(job, "run", lambda spark, cfg, stop: calls.append(1) or job.RESTART)
    assert job.run_restarting(None, None, NoWait()) == 1 and len(calls) == job.RESTARTS
    calls.clear()
    monkeypatch.setattr(job, "run", lambda spark, cfg, stop: calls.append(1) or 1)
    assert job.run_restarting(None, None, NoWait()) == 1 and len(calls) == 1  # a real failure
    stop = NoWait()
    stop.set()
    monkeypatch.setattr(job, "run", lambda spark, cfg, stop: job.RESTART)
    assert job.run_restarting(None, None, stop) == 0   # stopping: no restart
