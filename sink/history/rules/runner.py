"""The rules thread of the history job: every ``poll_seconds`` it reads the store when its file
changed (mtime and size), starts, stops and retries rules (supervise.py), notices queries that
died, and writes each rule's state (settings.rules.write_status). A rule's failure, at start or
later, is its own: the job and the other rules go on."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from settings import rules as R
from sink.history.job.config import Job
from sink.history.rules.supervise import FAILED, RUNNING, STOPPED, Supervisor, definition

log = logging.getLogger(__name__)


class StoreWatch:
    """The store, read again only when its file changed; a bad file keeps the last good one."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir, self.store, self._seen = data_dir, R.Store(), None
        self.error = ""

    def poll(self) -> R.Store:
        try:
            st = os.stat(R.store_path(self.data_dir))
            key: Any = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            key = None
        if key != self._seen:
            self._seen = key
            try:
                self.store, self.error = R.read_store(self.data_dir), ""
            except R.RuleError as exc:
                self.error = str(exc)
                log.error("rules store not read, the rules running go on: %s", exc)
        return self.store


class RulesRunner(threading.Thread):
    def __init__(self, spark: Any, job: Job, poll_seconds: float = 2.0,
                 clock: Any = time.monotonic, batch_rules: Any = None) -> None:
        """``batch_rules``: shared.BatchRules, which the history query's batch writer calls
        (stateless rules run there); None: every rule its own query."""
        super().__init__(name="rules", daemon=True)
        self.spark, self.job, self.poll_seconds, self.clock = spark, job, poll_seconds, clock
        self.batch_rules = batch_rules
        self.data_dir = job.data_dir or "."
        self.watch = StoreWatch(self.data_dir)
        self.sup = Supervisor()
        self.stop_event = threading.Event()
        self._rates: dict[str, tuple[float, int]] = {}

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.tick()
            except Exception:   # never the job's end: logged, tried again
                log.exception("rules: a pass failed (tried again)")
            self.stop_event.wait(self.poll_seconds)
        for name, handle in self.sup.running().items():
            self._stop_rule(name, handle)
        for e in self.sup.entries.values():   # the job stops: so does every rule
            if e.state == RUNNING:
                e.state = STOPPED
        self.write_status()

    def stop(self, timeout: float = 60.0) -> None:
        self.stop_event.set()
        self.join(timeout)

    def tick(self) -> None:
        desired = R.effective(self.job.history.rules, self.watch.poll())
        now = self.clock()
        for name, handle in self.sup.running().items():   # queries that died
            if not handle.query.isActive:
                from sink.history.rules.query import short_error
                exc = handle.query.exception()
                err = short_error(exc) if exc is not None else "the query ended"
                log.error("rule %s failed: %s (started again after a pause)", name, err)
                self.sup.failed(name, err, now)
                self._stop_rule(name, handle)
        before = {n: definition(e.spec) for n, e in self.sup.entries.items()}
        handles = self.sup.running()
        stop, start = self.sup.step(desired, now)
        wanted = {r.name: definition(r) for r in desired}
        for name in stop:
            self._stop_rule(name, handles[name])
        for name, d in before.items():   # removed or redefined: its checkpoint goes
            if name not in wanted or wanted[name] != d:
                from sink.history.rules.query import remove_checkpoint
                remove_checkpoint(self.job, name)
        for spec in start:
            self._start(spec, now)
        self.write_status()

    def _start(self, spec: R.RuleSpec, now: float) -> None:
        from sink.history.rules.query import RuleQuery, RuleSQLError, rule_session, short_error
        from sink.history.rules.shared import BatchRule, is_stateless
        publisher = None
        if spec.publish:
            from sink.history.rules.publish import Publisher
            publisher = Publisher(*broker_address(self.job), R.RULES_USER,
                                  R.password(self.data_dir) or "", R.client_id(spec.name))
        handle: Any
        try:
            frame = rule_session(self.spark, self.job, spec, self.job.history.rules_watermark)
            if self.batch_rules is not None and is_stateless(frame[1]):
                handle = BatchRule(self.job, spec, publisher, self.batch_rules)
            else:
                handle = RuleQuery(self.spark, self.job, spec, publisher,
                                   self.job.history.rules_watermark,
                                   self.job.history.trigger_seconds, frame)
        except RuleSQLError as exc:
            log.error("rule %s not started: %s", spec.name, exc)
            self.sup.failed(spec.name, str(exc), now, permanent=True)
            return
        except Exception as exc:
            log.error("rule %s not started: %s", spec.name, short_error(exc))
            self.sup.failed(spec.name, short_error(exc), now)
            return
        log.info("rule %s started (%s; %s)", spec.name,
                 ", ".join(x for x in (spec.publish and f"publish {spec.publish}",
                                       spec.table and f"table {spec.table}") if x),
                 "on the history's batches" if isinstance(handle, BatchRule) else "its own query")
        self.sup.started(spec.name, handle, now)

    def _stop_rule(self, name: str, handle: Any) -> None:
        try:
            handle.stop()
        except Exception as exc:
            log.warning("rule %s: stopping its query: %s", name, exc)
        self.sup.stopped(name)

    def write_status(self) -> None:
        R.write_status(self.data_dir, self.status(time.time()))

    def status(self, wall: float) -> dict[str, dict[str, Any]]:
        return status_of(self.sup, wall, self._rates)


def status_of(sup: Supervisor, wall: float, rates: dict[str, tuple[float, int]]
              ) -> dict[str, dict[str, Any]]:
    """Each rule's line of status.json. ``rows_per_second``: rows out since the last status;
    ``input_rows_per_second``: the query's last progress (messages read)."""
    out: dict[str, dict[str, Any]] = {}
    for name, e in sup.entries.items():
        h = e.handle
        rows = h.rows if h is not None else 0
        last_t, last_rows = rates.get(name, (wall, rows))
        rate = (rows - last_rows) / (wall - last_t) if wall > last_t and rows >= last_rows else 0.0
        rates[name] = (wall, rows)
        out[name] = {
            "state": e.state if e.state != RUNNING or h is not None else FAILED,
            "source": e.spec.source, "publish": e.spec.publish, "table": e.spec.table,
            "rows": rows, "rows_per_second": round(rate, 3),
            "input_rows_per_second": round(h.input_rate(), 3) if h is not None else 0.0,
            "last_error": e.error or (getattr(h, "error", "") if h is not None else ""),
            "last_row_at": h.last_row_at if h is not None else None,
        }
    return out


def broker_address(job: Job) -> tuple[str, int]:
    host = job.broker_host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return host, job.broker_port


def start_rules(spark: Any, job: Job, batch_rules: Any = None) -> RulesRunner | None:
    """The rules thread (not with --available-now: rules are continuous)."""
    if job.available_now:
        return None
    runner = RulesRunner(spark, job, batch_rules=batch_rules)
    runner.start()
    return runner
