"""Continuous rules (docs/rules.md): what the history job runs and the broker manages.

A rule is Spark SQL over the live stream ``messages`` (the history table's columns,
``payload_json`` included) whose result rows are published as JSON objects to an MQTT topic
(``publish``, QoS 1, through the broker as the client ``RULES_USER``), appended to a catalog
table (``table``, exactly once), or both.

Rules come from two places, merged by ``effective``:
* the config: ``[[history.rules]]`` tables (``name``, ``sql``, ``publish``, ``table``); changed by
  editing the file and restarting;
* the store: ``<data_dir>/rules/rules.json``, written by the broker's admin API
  (``python -m broker.admin rules add|list|pause|resume|remove``): rules added at run time, and
  which rules (of either source) are paused. The history job watches the file and starts or
  stops rules without restarting. A config rule cannot be removed through the store (its name is
  refused), only paused.

The job writes each rule's state to ``<data_dir>/rules/status.json`` (``write_status``): rows
out, rate, last error, running or paused; the admin API and the dashboard read it.

The job's MQTT client logs in as ``RULES_USER`` with the password in
``<data_dir>/secrets/rules.password`` (``password``; made by whoever needs it first). The broker
knows that account by itself: it may publish to the topics the rules name in ``publish``, and
nothing else (no subscribe). The name is reserved: a password file's entry of that name is
ignored.

A leaf module: the standard library only (json and secrets imported when used: a plain broker,
with no rules, loads neither).
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

RULES_USER = "$rules"
PASSWORD_FILE = "rules.password"
DIR_NAME = "rules"
STORE_FILE = "rules.json"
STATUS_FILE = "status.json"
CONFIG, STORE = "config", "store"
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_SQL = 16_384            # characters of one rule's SQL
MAX_RULES = 100             # rules in the store (the job runs each as a streaming query)


class RuleError(ValueError):
    """A rule definition that cannot be used; the message says what to change."""


@dataclass(frozen=True)
class RuleSpec:
    name: str
    sql: str
    publish: str = ""       # MQTT topic (no wildcards) the rows go to; "" = none
    table: str = ""         # catalog table the rows are appended to; "" = none
    paused: bool = False
    source: str = CONFIG    # CONFIG or STORE

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check(d: Any, source: str = STORE) -> RuleSpec:
    """A RuleSpec from a dict (config table or admin request); RuleError says what is wrong.
    Only the shape is checked here: the SQL is checked by Spark (the job, or the admin API
    through the job's Spark Connect server)."""
    if not isinstance(d, dict):
        raise RuleError("a rule is a table with name, sql and publish and/or table")
    unknown = set(d) - {"name", "sql", "publish", "table", "paused"}
    if unknown:
        raise RuleError(f"unknown rule keys {sorted(unknown)}: a rule has name, sql, publish, "
                        f"table (and paused)")
    name, sql = d.get("name"), d.get("sql")
    publish, table = d.get("publish", ""), d.get("table", "")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RuleError(f"rule name {name!r}: a letter then up to 63 letters, digits, '_' or '-'")
    if not isinstance(sql, str) or not sql.strip():
        raise RuleError(f"rule {name}: sql is missing (a SELECT over the stream `messages`)")
    if len(sql) > MAX_SQL:
        raise RuleError(f"rule {name}: sql is {len(sql)} characters, at most {MAX_SQL}")
    if not isinstance(publish, str) or not isinstance(table, str):
        raise RuleError(f"rule {name}: publish and table are strings")
    if not publish and not table:
        raise RuleError(f"rule {name}: give publish (an MQTT topic) and/or table (a table name)")
    if publish and (any(c in publish for c in "+#\0") or publish.startswith("$")
                    or len(publish.encode()) > 65535):
        raise RuleError(f"rule {name}: publish {publish!r} must be a topic name: no wildcards "
                        f"(+ #), not starting with $")
    if table and not TABLE.fullmatch(table):
        raise RuleError(f"rule {name}: table {table!r}: letters, digits and '_', not starting "
                        f"with a digit")
    paused = d.get("paused", False)
    if not isinstance(paused, bool):
        raise RuleError(f"rule {name}: paused is true or false")
    return RuleSpec(name, sql.strip(), publish, table, paused, source)


def client_id(name: str) -> str:
    """The MQTT client id rule ``name`` publishes with (as ``RULES_USER``): the rule's input
    leaves out its own messages by it (a rule whose rows match its own SQL would otherwise read
    its alerts again, batch after batch, without end)."""
    return f"{RULES_USER}-{name}"


def rules_dir(data_dir: str) -> str:
    return os.path.join(data_dir or ".", DIR_NAME)


def store_path(data_dir: str) -> str:
    return os.path.join(rules_dir(data_dir), STORE_FILE)


def status_path(data_dir: str) -> str:
    return os.path.join(rules_dir(data_dir), STATUS_FILE)


@dataclass
class Store:
    """What ``rules.json`` holds: the rules added at run time and the paused names."""
    rules: list[RuleSpec] = field(default_factory=list)
    paused: set[str] = field(default_factory=set)


def read_store(data_dir: str) -> Store:
    """The store; empty when there is no file. A file that is not a store raises RuleError
    naming it (the job keeps its running rules and logs it; the admin API refuses changes)."""
    path = store_path(data_dir)
    try:
        with open(path, encoding="utf-8") as f:
            doc = _json().load(f)
    except FileNotFoundError:
        return Store()
    except (OSError, ValueError) as exc:
        raise RuleError(f"{path} cannot be read ({exc}): fix or remove it") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("rules", []), list) \
            or not isinstance(doc.get("paused", []), list):
        raise RuleError(f"{path} is not a rules store ({{\"rules\": [...], \"paused\": [...]}})")
    try:
        rules = [check(r, STORE) for r in doc.get("rules", [])]
    except RuleError as exc:
        raise RuleError(f"{path}: {exc}") from exc
    return Store(rules, {p for p in doc.get("paused", []) if isinstance(p, str)})


def write_store(data_dir: str, store: Store) -> None:
    """Atomically replace ``rules.json`` (the job sees a whole file or the old one)."""
    doc = {"rules": [{k: v for k, v in r.as_dict().items() if k not in ("source", "paused")}
                     for r in store.rules],
           "paused": sorted(store.paused)}
    _write_json(store_path(data_dir), doc)


def effective(config_rules: tuple | list, store: Store) -> list[RuleSpec]:
    """Config rules first (in file order), then the store's; paused as the store says. A store
    rule named like a config rule is left out (the admin API refuses to add one)."""
    out = [RuleSpec(r.name, r.sql, r.publish, r.table, r.name in store.paused or r.paused, CONFIG)
           for r in config_rules]
    names = {r.name for r in out}
    out += [RuleSpec(r.name, r.sql, r.publish, r.table, r.name in store.paused, STORE)
            for r in store.rules if r.name not in names]
    return out


def publish_topics(rules: list[RuleSpec]) -> set[str]:
    """The topics ``RULES_USER`` may publish to."""
    return {r.publish for r in rules if r.publish}


def password(data_dir: str, create: bool = True) -> str | None:
    """The rules client's MQTT password (``<data_dir>/secrets/rules.password``)."""
    import secrets as _random

    from . import secrets
    return secrets.read_or_create(secrets.secret_path(data_dir, PASSWORD_FILE),
                                  lambda: _random.token_urlsafe(32), create)


def write_status(data_dir: str, status: dict[str, dict[str, Any]]) -> None:
    """The job's view of each rule, by name: {"state": "running"|"paused"|"failed"|"starting",
    "rows": int, "rows_per_second": float, "last_error": str, "last_row_at": float|None, ...}.
    Stamped with the time written (``written_at``)."""
    _write_json(status_path(data_dir), {"written_at": time.time(), "rules": status})


def read_status(data_dir: str) -> dict[str, Any]:
    """{"written_at": ..., "rules": {name: {...}}}; empty rules when the job wrote none."""
    try:
        with open(status_path(data_dir), encoding="utf-8") as f:
            doc = _json().load(f)
        if isinstance(doc, dict) and isinstance(doc.get("rules"), dict):
            return doc
    except (OSError, ValueError):
        pass
    return {"written_at": None, "rules": {}}


def _write_json(path: str, doc: Any) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.new{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        _json().dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _json() -> Any:
    import json
    return json
