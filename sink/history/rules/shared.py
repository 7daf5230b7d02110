"""Stateless rules on the history query's micro-batches: one read of Kafka for the table and for
every such rule.

A rule whose plan is only projections and filters of the stream (``is_stateless``: no
aggregation, join, de-duplication, limit or sort) gives, batch by batch, the rows its own
streaming query would give. Its own query would read Kafka again (the Python source decodes
every record once per query: 5 rules cost 2.7 times the job's CPU per message alone). So such
a rule runs on the batch the history query has just written: ``BatchRules`` is called by
sink/history/writer.py after it has staged the batch's files, shows those files to the rules
as ``messages`` (without each rule's own messages; each rule reads the columns it uses) and
runs every rule's SQL over them as one statement, one Spark job: the rules of the form
``SELECT ... FROM messages [WHERE ...]`` as one pass over the batch (merge.py), the others each
a subquery beside it. Rules with state
(windows, aggregations, joins) keep their own streaming query (sink/history/rules/query.py).

Nothing a rule does can fail or stall the history batch: its SQL errors end only the rule (the
rules thread starts it again after a pause), and its rows go to the broker from a thread of its
own (``Outbox``). That thread retries while the broker is away; it holds at most
``MAX_BACKLOG_ROWS`` rows, and rows beyond that are dropped, counted and said in the rule's
``last_error``. A table rule's rows are one file per history batch (``hbatch-<id>.parquet``):
exactly once, as the history's own rows.
"""
from __future__ import annotations

import collections
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

from settings.rules import RuleSpec, client_id
from sink.history.job.config import Job
from sink.history.rules import merge
from sink.history.rules.merge import sql_string
from sink.history.rules.publish import Publisher, PublishError

log = logging.getLogger(__name__)

VIEW = "messages"
#: the batch's rows as the stream's session shows them to the rules: each rule's SQL reads
#: ``messages`` from it, without the rule's own messages (rule_sql)
BATCH_VIEW = "_rules_batch"
#: a row as the JSON object published (as sink/history/rules/rowjson.py writes a rule query's
#: rows: nulls kept, timestamps ISO-8601 UTC with milliseconds; the stream's session is in UTC)
ROW_JSON = {"ignoreNullFields": "false", "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"}
MAX_BACKLOG_ROWS = 100_000
_UNKNOWN = object()   # BatchRule.arm before the rule's first batch
#: the logical plan nodes of a rule that needs no state: anything else runs as its own query
STATELESS_NODES = frozenset({
    "Project", "Filter", "SubqueryAlias", "View", "EventTimeWatermark", "Generate",
    "StreamingRelation", "StreamingRelationV2", "StreamingDataSourceV2Relation",
    "StreamingDataSourceV2ScanRelation", "StreamingExecutionRelation", "LogicalRDD",
})
#: a plan line: tree drawing, then Spark's markers (``~`` a streaming node, ``!`` unresolved)
_NODE = re.compile(r"^[\s:|+\-]*[~!]?([A-Z][A-Za-z0-9]*)")


def plan_nodes(plan_text: str) -> set[str]:
    """The node names of a plan as Spark prints it (one node per line, subqueries included)."""
    out = set()
    for line in plan_text.splitlines():
        m = _NODE.match(line)
        if m:
            out.add(m.group(1))
    return out


def is_stateless(df: Any) -> bool:
    """Whether a rule's streaming DataFrame is only projections and filters of the stream."""
    try:
        text = df._jdf.queryExecution().analyzed().toString()
    except Exception:   # not a classic session (Spark Connect): its own query
        return False
    nodes = plan_nodes(text)
    return bool(nodes) and nodes <= STATELESS_NODES


class Outbox(threading.Thread):
    """A rule's rows on their way to the broker: publish_all per batch, in order, retried every
    ``retry_seconds`` while the broker does not take them."""

    def __init__(self, name: str, topic: str, publisher: Publisher, retry_seconds: float = 2.0,
                 max_rows: int = MAX_BACKLOG_ROWS) -> None:
        super().__init__(name=f"rule-{name}", daemon=True)
        self.topic, self.publisher, self.retry_seconds = topic, publisher, retry_seconds
        self.max_rows = max_rows
        self.queue: collections.deque[list[bytes]] = collections.deque()
        self.queued = 0
        self.dropped = 0
        self.publish_error = ""   # why the broker did not take the last try ("": it did)
        self.cond = threading.Condition()
        self.stopping = False

    def put(self, payloads: list[bytes]) -> None:
        with self.cond:
            if self.queued + len(payloads) > self.max_rows:
                self.dropped += len(payloads)
                log.error("rule %s: %d rows dropped (%d waiting for the broker)", self.name,
                          len(payloads), self.queued)
                return
            self.queue.append(payloads)
            self.queued += len(payloads)
            self.cond.notify()

    def run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                if not self.queue:
                    return
                batch = self.queue[0]
            try:
                self.publisher.publish_all(self.topic, batch)
            except Exception as exc:   # PublishError, or the client's own: tried again
                why = str(exc) if isinstance(exc, PublishError) else f"{type(exc).__name__}: {exc}"
                if self.publish_error != why:
                    log.error("%s: %s (retried every %g s)", self.name, why, self.retry_seconds)
                self.publish_error = why
                with self.cond:
                    if self.stopping:
                        return
                    self.cond.wait(self.retry_seconds)
                continue
            with self.cond:
                self.queue.popleft()
                self.queued -= len(batch)
                self.publish_error = ""

    @property
    def error(self) -> str:
        """What the rule's status says: the rows dropped, and why the broker does not take them."""
        dropped = (f"{self.dropped} rows dropped: the broker did not take them and at most "
                   f"{self.max_rows} wait" if self.dropped else "")
        return "; ".join(x for x in (dropped, self.publish_error) if x)

    def stop(self, timeout: float = 10.0) -> None:
        """Publish what waits (up to ``timeout``), then end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.cond:
                if not self.queue or self.publish_error:
                    break
            time.sleep(0.05)
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.join(max(deadline - time.monotonic(), 0.1))
        self.publisher.close()


class BatchRule:
    """A running stateless rule: the handle the rules thread keeps (as query.RuleQuery)."""

    def __init__(self, job: Job, spec: RuleSpec, publisher: Publisher | None,
                 batches: BatchRules) -> None:
        self.spec, self.job, self.batches = spec, job, batches
        self.rows = 0
        self.input_rows = 0
        self.last_row_at: float | None = None
        self.started = time.monotonic()
        self._exception: BaseException | None = None
        self.outbox = Outbox(spec.name, spec.publish, publisher) if publisher and spec.publish else None
        if self.outbox is not None:
            self.outbox.start()
        self.query = self   # the rules thread asks query.isActive and query.exception()
        #: its CASE WHEN arm in the batch's one pass (merge.py), None if it runs as a subquery
        self.arm: str | None | object = _UNKNOWN
        batches.add(self)

    @property
    def isActive(self) -> bool:   # noqa: N802 (PySpark's StreamingQuery's name)
        return self._exception is None

    def exception(self) -> BaseException | None:
        return self._exception

    @property
    def error(self) -> str:
        return self.outbox.error if self.outbox is not None else ""

    def input_rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.input_rows / elapsed if elapsed > 0 else 0.0

    def frame(self, session: Any) -> Any:
        """The rule's rows over the batch (``BATCH_VIEW``) as (rule, row): its name and the row
        as its JSON object (``ROW_JSON``)."""
        return session.sql(union_sql([self]))

    def take(self, session: Any, batch_id: int, rows: list[str], input_rows: int) -> None:
        """The rule's rows of a batch: its table first, then its outbox."""
        self.input_rows += input_rows
        if not rows:
            return
        if self.spec.table:
            from sink.history.rules.query import append_once
            append_once(session, self.job, self.spec.table, session.sql(rule_sql(self.spec)),
                        batch_id, prefix="hbatch")
        if self.outbox is not None:
            self.outbox.put([r.encode() for r in rows])
        self.rows += len(rows)
        self.last_row_at = time.time()

    def fail(self, exc: BaseException) -> None:
        self._exception = exc
        self.batches.remove(self)

    def stop(self) -> None:
        self.batches.remove(self)
        if self.outbox is not None:
            self.outbox.stop()


class BatchRules:
    """The stateless rules running now; called by the history's batch writer after it wrote a
    batch's files (before it commits them)."""

    def __init__(self) -> None:
        self._rules: dict[str, BatchRule] = {}
        self._lock = threading.Lock()

    def add(self, rule: BatchRule) -> None:
        with self._lock:
            self._rules[rule.spec.name] = rule

    def remove(self, rule: BatchRule) -> None:
        with self._lock:
            if self._rules.get(rule.spec.name) is rule:
                del self._rules[rule.spec.name]

    def __len__(self) -> int:
        return len(self._rules)

    def wanted(self) -> bool:
        """Whether a rule runs (else the batch writer does not call them)."""
        return bool(self._rules)

    def __call__(self, df: Any, batch_id: int, staged: Path) -> None:
        """Run every rule over the batch ``df`` the history query has just written into
        ``staged``: read back from those files (staged_batch), whose footers count its rows."""
        with self._lock:
            rules = list(self._rules.values())
        if not rules:
            return
        from sink.history.parquet_rows import parquet_rows
        started = time.monotonic()
        session = df.sparkSession   # the stream's own session (a clone): its views are its own
        try:
            input_rows = sum(parquet_rows(p) for p in staged.rglob("*.parquet"))
            staged_batch(session, staged).createOrReplaceTempView(BATCH_VIEW)
        except Exception as exc:   # never the history batch's failure
            log.error("rules: batch %d not read for the rules: %s", batch_id, exc)
            return
        # every rule in one Spark job (a job per rule cost ~0.2 s each per batch here), planned
        # from one statement: a DataFrame per rule and their union took the analyser 6 times
        try:
            got = session.sql(batch_sql(session, rules)).collect()
        except Exception:   # a rule's SQL or one of its rows failed: each rule alone, and the
            got = []        # failing one ends (inactive from then on)
            for rule in rules:
                try:
                    got.extend(rule.frame(session).collect())
                except Exception as exc:
                    _failed(rule, batch_id, exc)
        by_rule: dict[str, list[str]] = {}
        for r in got:
            by_rule.setdefault(r[0], []).append(r[1])
        for rule in rules:
            if rule.isActive:
                try:
                    rule.take(session, batch_id, by_rule.get(rule.spec.name, []), input_rows)
                except Exception as exc:
                    _failed(rule, batch_id, exc)
        log.debug("rules: batch %d: %d rules over %d rows in %.0f ms", batch_id, len(rules),
                  input_rows, (time.monotonic() - started) * 1000)


def staged_batch(session: Any, staged: Path) -> Any:
    """A batch as the writer staged it (partitioned by ``date`` and the hour): the columns of
    the table, in its order. A rule's query reads only the columns it uses, and the JSON fields
    it casts as typed values from the scan (nothing between the scan and the rule's query: a
    ``coalesce(1)`` here kept the field extractions above it, and each rule read and rebuilt
    whole variants; Spark packs a batch's small files into one task without it)."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    from sink.history.schema import HISTORY_SCHEMA
    from sink.history.writer import HOUR_COLUMN
    schema = StructType([*HISTORY_SCHEMA.fields, StructField(HOUR_COLUMN, IntegerType())])
    return session.read.schema(schema).parquet(str(staged)).drop(HOUR_COLUMN)


#: to_json's options (ROW_JSON) as SQL
_ROW_JSON_SQL = "map(" + ", ".join(f"{sql_string(k)}, {sql_string(v)}"
                                   for k, v in ROW_JSON.items()) + ")"


def own_messages(spec: RuleSpec) -> str:
    """The CTE that shows the batch to the rule as ``messages``, without the rule's own messages
    (settings.rules.client_id): a rule never reads what it published."""
    return (f"WITH {VIEW} AS (SELECT * FROM {BATCH_VIEW} WHERE client_id IS DISTINCT FROM "
            f"{sql_string(client_id(spec.name))})")


def rule_sql(spec: RuleSpec) -> str:
    """The rule's SQL over the batch (own_messages). The rule's SQL is a subquery, on lines of
    its own (a closing comment cannot swallow the parenthesis), without its final semicolons."""
    sql = spec.sql.strip().rstrip(";").rstrip()
    return f"{own_messages(spec)}\nSELECT * FROM (\n{sql}\n)"


def union_sql(rules: list[BatchRule]) -> str:
    """Every rule's rows as (rule, row), one statement: each rule's ``rule_sql`` as a subquery,
    its rows as JSON objects, united."""
    parts = []
    for i, rule in enumerate(rules):
        parts.append(f"SELECT {sql_string(rule.spec.name)} AS rule, "
                     f"to_json(struct(*), {_ROW_JSON_SQL}) AS row FROM (\n"
                     f"{rule_sql(rule.spec)}\n) AS `rule_{i}`")
    return "\nUNION ALL\n".join(parts)


def batch_sql(session: Any, rules: list[BatchRule]) -> str:
    """The statement of a batch's rules: the rules that can be one pass over the batch
    (sink/history/rules/merge.py) as one, the others each a subquery (union_sql)."""
    for rule in rules:
        if rule.arm is _UNKNOWN:
            rule.arm = merge.arm(session, rule.spec, rule_sql(rule.spec), own_messages(rule.spec),
                                 _ROW_JSON_SQL, BATCH_VIEW)
    arms = [r.arm for r in rules if isinstance(r.arm, str)]
    rest = [r for r in rules if not isinstance(r.arm, str)]
    return "\nUNION ALL\n".join(([merge.merged_sql(arms, BATCH_VIEW)] if arms else [])
                                 + ([union_sql(rest)] if rest else []))


def _failed(rule: BatchRule, batch_id: int, exc: BaseException) -> None:
    from sink.history.rules.query import short_error
    log.error("rule %s failed on batch %d: %s", rule.spec.name, batch_id, short_error(exc))
    rule.fail(exc)
