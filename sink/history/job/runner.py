"""The run that owns its streaming query: started, watched (progress, commits reported), stopped
when asked; and started again after a failure that only says the machine was too busy."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sink.history.job.config import Job
from sink.history.job.process import on_hard_exit
from sink.history.job.progress import describe_progress, progress_since
from sink.history.job.report import report_commits
from sink.history.job.stream import PARQUET_OPTIONS, start_query

log = logging.getLogger(__name__)

Spark = Any   # a SparkSession (pyspark is imported only where Spark runs)

#: Failures that say the machine was too busy, not that anything is wrong: Spark gives a Python
#: process it starts a fixed 10 s to connect back (seen with other work overloading both cores)
TRANSIENT_FAILURES = ("Python worker failed to connect back",)
RESTART = 75      # run()'s answer to such a failure (EX_TEMPFAIL)
RESTARTS = 5


class QueryRun:
    """One start of the history query and its state: the query, the last batch reported, and
    the function that reports the table's commits to the broker (also run by a third signal
    before the job exits at once: sink/history/job/process.py)."""

    def __init__(self, spark: Spark, job: Job, stop_event: threading.Event,
                 poll_seconds: float = 1.0, batch_rules: Any = None) -> None:
        self.spark, self.job, self.stop_event, self.poll_seconds = spark, job, stop_event, poll_seconds
        self.query, _ = start_query(spark, job, batch_rules)
        self.commit_catch_up: Callable[[], None] | None = report_commits(job)
        if self.commit_catch_up:
            on_hard_exit("report commits", self.commit_catch_up)
        self.last_batch, self.last_idle_log = -1, time.monotonic()
        from sink.history.spark import launched_by_spark_submit
        self.planners_released = (launched_by_spark_submit()
                                  or getattr(self.query, "_jsq", None) is None)

    def report(self) -> None:
        """Log the batches after the last one reported."""
        from sink.history.spark import release_planner_workers
        for p in progress_since(self.query, self.last_batch):  # only batches after last_batch
            self.last_batch = p["batchId"]
            if not self.planners_released:  # planned by now: its planning workers are not needed
                self.planners_released = True
                log.info("stopped %d idle Python planning daemons (Spark starts them again when a query is planned)",
                         release_planner_workers(self.spark))
            if p.get("numInputRows", 0) or self.job.available_now:
                log.info("%s", describe_progress(p))
            elif time.monotonic() - self.last_idle_log > 60:
                self.last_idle_log = time.monotonic()
                log.info("idle: %s", describe_progress(p))

    def catch_up(self) -> None:
        if self.commit_catch_up:
            self.commit_catch_up()

    def run(self) -> int:
        """Run the query until it ends (available-now) or stop_event is set. Returns an exit code."""
        from sink.history import catalog
        from sink.history.maintenance import start_maintainer
        query, job, stop_event, poll_seconds = self.query, self.job, self.stop_event, self.poll_seconds
        maintainer = start_maintainer(self.spark, job.history, PARQUET_OPTIONS, job.available_now)
        # `messages` for spark-sql & co (embedded Derby): once, a minute after the query started
        registration = None if job.available_now else catalog.start_registration(job.history)
        try:
            while query.isActive and not stop_event.is_set():
                try:
                    query.awaitTermination(poll_seconds)
                except Exception as err:
                    if query.isActive:  # not the query's failure (that ends it): a failed wait
                        log.warning("waiting for the history query: %s (it goes on)", _short_error(err))
                        stop_event.wait(poll_seconds)
                        continue
                    break  # it failed: query.exception() below says why
                self.report()
                self.catch_up()
            if stop_event.is_set() and query.isActive:
                log.info("stopping: waiting for the query to stop (committed batches are kept; an "
                         "unfinished batch is redone on the next start)")
                query.stop()
            self.report()
            exc = query.exception()
            if exc is not None:
                log.error("the history query failed: %s", _short_error(exc))
                return RESTART if any(t in str(exc) for t in TRANSIENT_FAILURES) else 1
            if not stop_event.is_set() and not job.available_now:
                # a streaming query ends only when stopped: nobody asked, so start it again
                log.error("the history query ended without an error and without a stop (last batch "
                          "%s): starting it again", self.last_batch)
                return RESTART
            log.info("history job stopped (last batch %s)", self.last_batch)
            return 0
        finally:
            if registration:
                registration.stop()
            if maintainer:
                maintainer.stop()
            if query.isActive:
                query.stop()
            self.catch_up()


def run(spark: Spark, job: Job, stop_event: threading.Event | None = None,
        poll_seconds: float = 1.0, batch_rules: Any = None) -> int:
    """Run the query until it ends (available-now) or stop_event is set. Returns an exit code.
    ``batch_rules``: called with each batch's staged files (sink/history/rules/shared.py)."""
    return QueryRun(spark, job, stop_event or threading.Event(), poll_seconds, batch_rules).run()


def run_restarting(spark: Spark, job: Job, stop: threading.Event, batch_rules: Any = None) -> int:
    """run(), started again (with the same checkpoint: exactly once holds) after a failure in
    TRANSIENT_FAILURES, up to RESTARTS times in a row, waiting a little longer each time."""
    for attempt in range(1, RESTARTS + 1):
        rc = run(spark, job, stop, batch_rules=batch_rules)
        if rc != RESTART or stop.is_set():
            return 0 if rc == RESTART else rc
        log.warning("starting the history query again (%d/%d) in %d s", attempt, RESTARTS,
                    10 * attempt)
        if stop.wait(10 * attempt):
            return 0
    return 1


def _short_error(exc: object) -> str:
    """The useful lines of a StreamingQueryException (our own messages, not the JVM stack)."""
    text = str(exc)
    for marker in ("ConnectionError:", "TimeoutError:", "ValueError:", "RuntimeError:"):
        idx = text.find(marker)
        if idx >= 0:
            return text[idx:].splitlines()[0]
    return text.splitlines()[0] if text else repr(exc)
