"""Continuous rules at run time (docs/rules.md): what the admin API's /api/v1/rules and
``python -m broker.admin rules ...`` do on the broker's side.

Rules come from the config (``[[history.rules]]``, changed by editing the file) and from the
store ``<data_dir>/rules/rules.json`` (settings/rules.py), which this module alone writes, each
time whole and atomically; the history job watches it and starts, pauses or stops rules without
restarting. Every change also updates which topics the rules' MQTT client may publish to
(broker/auth/rules.py). The SQL of a rule to add is checked by the job's Spark before ``add``
is called (broker/dashboard/history.py check_sql): here only its shape, its name and the bound.
"""
from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Callable

from settings import rules as spec

from .service import AdminError

if TYPE_CHECKING:
    from ..auth.rules import RulesAccount

#: a rule's SQL is a query: SELECT, WITH ... SELECT, FROM ... SELECT, VALUES, or one in brackets
QUERY_START = re.compile(r"(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*(?:(?:SELECT|WITH|FROM|VALUES)\b|\()",
                         re.IGNORECASE | re.DOTALL)
#: the job's status of a rule older than this (seconds): the job may not be running
STALE_STATUS = 60.0


class RulesAdmin:
    def __init__(self, data_dir: str, config_rules: tuple | list = (),
                 account: RulesAccount | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.data_dir = data_dir
        self.config_rules = tuple(config_rules)
        self.account = account   # the rules' MQTT client: told the topics after each change
        self.clock = clock

    def _store(self) -> spec.Store:
        try:
            return spec.read_store(self.data_dir)
        except spec.RuleError as exc:
            raise AdminError(str(exc)) from None

    def _write(self, store: spec.Store) -> None:
        spec.write_store(self.data_dir, store)
        if self.account is not None:
            self.account.refresh(store)

    # ------------------------------------------------------------ reading
    def list(self) -> dict[str, Any]:
        """Every rule (config first, then the store's) with the job's status of it."""
        rules = spec.effective(self.config_rules, self._store())
        status = spec.read_status(self.data_dir)
        written = status.get("written_at")
        age = round(self.clock() - written, 1) if isinstance(written, (int, float)) else None
        out = []
        for r in rules:
            st = status["rules"].get(r.name)
            st = st if isinstance(st, dict) else {}
            state = st.get("state") or "not started"
            if r.paused and state != "paused":
                state = "pausing" if st else "paused"     # until the job says it paused
            elif not r.paused and state == "paused":
                state = "resuming"
            out.append({**r.as_dict(), "state": state, "rows": st.get("rows"),
                        "rows_per_second": st.get("rows_per_second"),
                        "last_error": st.get("last_error") or None,
                        "last_row_at": st.get("last_row_at")})
        return {"rules": out, "status_age_seconds": age,
                "status_stale": age is None or age > STALE_STATUS, "max_rules": spec.MAX_RULES}

    # ------------------------------------------------------------ changing
    def prepare(self, body: Any) -> spec.RuleSpec:
        """The rule to add, checked but for its SQL (AdminError says what is wrong)."""
        try:
            rule = spec.check(body, spec.STORE)
        except spec.RuleError as exc:
            raise AdminError(str(exc)) from None
        if not QUERY_START.match(rule.sql):
            raise AdminError(f"rule {rule.name}: sql must be a query (SELECT ... FROM messages "
                             f"...), not {rule.sql[:40]!r}")
        self._name_free(rule.name, self._store())
        return rule

    def _name_free(self, name: str, store: spec.Store) -> None:
        if any(r.name == name for r in self.config_rules):
            raise AdminError(f"a rule named {name!r} is defined in the config file "
                             f"([[history.rules]]): pick another name")
        if any(r.name == name for r in store.rules):
            raise AdminError(f"a rule named {name!r} exists already: remove it first, or pick "
                             f"another name")
        if len(store.rules) >= spec.MAX_RULES:
            raise AdminError(f"there are {len(store.rules)} rules in the store, at most "
                             f"{spec.MAX_RULES}: remove one first")

    def add(self, rule: spec.RuleSpec) -> dict[str, Any]:
        """Store a prepared rule whose SQL was checked (names checked again: time passed)."""
        store = self._store()
        self._name_free(rule.name, store)
        store.rules.append(rule)
        if rule.paused:   # added paused: the job starts it on resume
            store.paused.add(rule.name)
        else:
            store.paused.discard(rule.name)
        self._write(store)
        return rule.as_dict()

    def _find(self, name: str, store: spec.Store) -> spec.RuleSpec:
        for r in spec.effective(self.config_rules, store):
            if r.name == name:
                return r
        raise KeyError(name)

    def pause(self, name: str, paused: bool = True) -> bool:
        """Pause (or resume) a rule of either source. False: no such rule. Whether it changed
        anything is in the audit line only: pausing a paused rule is not an error."""
        store = self._store()
        try:
            rule = self._find(name, store)
        except KeyError:
            return False
        if paused:
            store.paused.add(name)
        else:
            if rule.source == spec.CONFIG and any(r.name == name and r.paused
                                                  for r in self.config_rules):
                raise AdminError(f"rule {name!r} is paused in the config file (paused = true): "
                                 f"resume it there")
            store.paused.discard(name)
        self._write(store)
        return True

    def remove(self, name: str) -> bool:
        """Remove a store rule. False: no such rule; AdminError for a config rule."""
        if any(r.name == name for r in self.config_rules):
            raise AdminError(f"rule {name!r} is defined in the config file: remove it there "
                             f"(and restart the job); pause works: rules pause {name}")
        store = self._store()
        kept = [r for r in store.rules if r.name != name]
        if len(kept) == len(store.rules):
            return False
        store.rules = kept
        store.paused.discard(name)
        self._write(store)
        return True
