"""Which rules run: the effective rules (config + store, settings.rules.effective) against what
runs now. No Spark here and the clock is given, so every decision is tested alone.

* a rule not in the effective list, or paused: stopped (its checkpoint is kept: resumed where it
  was when it comes back under the same name and SQL);
* a rule whose definition changed (sql, publish, table): stopped, then started again;
* a rule that failed to start (its SQL does not analyse: ``permanent``) stays failed until its
  definition changes; one that failed while running (the broker not reachable, a publish not
  acknowledged, a task error) is started again after a backoff (5 s, doubling up to 5 minutes,
  back to 5 s once it ran for a minute).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from settings.rules import RuleSpec

BACKOFF_FIRST, BACKOFF_MAX, HEALTHY_AFTER = 5.0, 300.0, 60.0
RUNNING, PAUSED, FAILED, STARTING = "running", "paused", "failed", "starting"
STOPPED = "stopped"   # written once as the job stops


def definition(spec: RuleSpec) -> tuple[str, str, str]:
    return (spec.sql, spec.publish, spec.table)


@dataclass
class Entry:
    spec: RuleSpec
    state: str = STARTING
    error: str = ""
    permanent: bool = False      # failed at analysis: not retried until the definition changes
    retry_at: float = 0.0
    backoff: float = BACKOFF_FIRST
    started_at: float = 0.0
    handle: Any = None           # the running query (query.RuleQuery), None when not running


class Supervisor:
    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def step(self, desired: list[RuleSpec], now: float) -> tuple[list[str], list[RuleSpec]]:
        """(names to stop, specs to start) to go from what runs to ``desired``."""
        stop: list[str] = []
        start: list[RuleSpec] = []
        want = {r.name: r for r in desired}
        for name, e in list(self.entries.items()):
            spec = want.get(name)
            if spec is None:
                if e.handle is not None:
                    stop.append(name)
                del self.entries[name]
            elif definition(spec) != definition(e.spec):
                if e.handle is not None:
                    stop.append(name)
                self.entries[name] = Entry(spec, state=PAUSED if spec.paused else STARTING)
            elif spec.paused and e.state != PAUSED:
                if e.handle is not None:
                    stop.append(name)
                self.entries[name] = Entry(spec, state=PAUSED)
            else:
                e.spec = spec
        for spec in desired:
            if spec.name not in self.entries:
                self.entries[spec.name] = Entry(spec, state=PAUSED if spec.paused else STARTING)
            e = self.entries[spec.name]
            if spec.paused or e.handle is not None:
                continue
            if e.state == PAUSED:     # resumed
                e.state, e.retry_at = STARTING, 0.0
            if e.state == FAILED and (e.permanent or now < e.retry_at):
                continue
            start.append(spec)
        return stop, start

    def started(self, name: str, handle: Any, now: float) -> None:
        e = self.entries[name]
        e.handle, e.state, e.started_at = handle, RUNNING, now

    def failed(self, name: str, error: str, now: float, permanent: bool = False) -> None:
        """The rule failed (at start: ``permanent`` when its SQL is wrong; or while running)."""
        e = self.entries.get(name)
        if e is None:
            return
        if e.handle is not None and now - e.started_at >= HEALTHY_AFTER:
            e.backoff = BACKOFF_FIRST   # it ran well for a while: a fresh failure
        e.handle, e.state, e.error, e.permanent = None, FAILED, error, permanent
        e.retry_at = now + e.backoff
        e.backoff = min(e.backoff * 2, BACKOFF_MAX)

    def stopped(self, name: str) -> None:
        e = self.entries.get(name)
        if e is not None:
            e.handle = None

    def running(self) -> dict[str, Any]:
        return {n: e.handle for n, e in self.entries.items() if e.handle is not None}
