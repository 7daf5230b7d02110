"""Stateless rules on the history's micro-batches (sink/history/rules/shared.py, docs/rules.md
"How the job runs rules"): which rules qualify, the outbox that publishes their rows without
stalling the history batch, and a rule's failure kept to itself. No Spark here: the plans are
Spark's printed analysed plans, the session a stand-in for its read and SQL."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from settings.rules import RuleSpec
from sink.history.rules.publish import PublishError
from sink.history.rules.shared import BatchRule, BatchRules, Outbox, plan_nodes, union_sql

# Spark 4's analysed plans of rules over the job's stream (df._jdf.queryExecution().analyzed()),
# lines cut; ``~`` marks a streaming node
FILTER_PLAN = """~Project [topic#21, cast(variant_get(payload_json#39, $.temp, VariantType, true, Some(UTC)) as d
+- ~Filter (cast(variant_get(payload_json#39, $.temp, VariantType, true, Some(UTC)) as double) > cast(30 as double))
   +- ~SubqueryAlias messages
      +- View (`messages`, [message_id#20, topic#21, payload#22, payload_text#23, qos#24, retain#25
         +- ~EventTimeWatermark f2f8607a-021d-4900-a65b-a3609b2d98e2, accepted_at#29: timestamp, 10 seconds
            +- ~Project [coalesce(cast(h_message_id#7 as string), concat(kafka:, topic#2, :, cast(p
               +- ~StreamingRelationV2 org.apache.spark.sql.execution.datasources.v2.python.PythonDataSo
"""
WINDOW_PLAN = """~Aggregate [window#90-T10000ms, topic#66], [window#90-T10000ms.start AS start#87, topic#66, count(1
+- ~Project [named_struct(start, knownnullable(precisetimestampconversion(((precisetimestampconversion(
   +- ~Filter isnotnull(accepted_at#74-T10000ms)
      +- ~SubqueryAlias messages
         +- View (`messages`, [message_id#65, topic#66, payload#67, payload_text#68, qos#69, retain#70
            +- ~EventTimeWatermark abbf6fee-d816-4a09-9253-e43535005f7f, accepted_at#74: timestamp, 10 seconds
               +- ~StreamingRelationV2 org.apache.spark.sql.execution.datasources.v2.python.PythonData
"""
SUBQUERY_PLAN = """~Project [topic#3]
+- ~Filter topic#3 IN (list#60 [])
   :  +- Aggregate [max(topic#70) AS m#61]
   :     +- Relation spark_catalog.default.devices[topic#70] parquet
   +- ~SubqueryAlias messages
      +- ~StreamingRelationV2 sink_kafka, [key#0, value#1]
"""


def test_a_plan_of_projections_and_filters_over_the_stream_has_only_stateless_nodes():
    from sink.history.rules.shared import STATELESS_NODES
    assert plan_nodes(FILTER_PLAN) == {"Project", "Filter", "SubqueryAlias", "View", "EventTimeWatermark",
                                       "StreamingRelationV2"}
    assert plan_nodes(FILTER_PLAN) <= STATELESS_NODES


@pytest.mark.parametrize("plan, node", [(WINDOW_PLAN, "Aggregate"), (SUBQUERY_PLAN, "Aggregate")])
def test_an_aggregation_anywhere_in_the_plan_even_in_a_subquery_is_seen(plan, node):
    from sink.history.rules.shared import STATELESS_NODES
    nodes = plan_nodes(plan)
    assert node in nodes and not nodes <= STATELESS_NODES


class FlakyPublisher:
    def __init__(self, failures: int = 0) -> None:
        self.failures, self.sent, self.closed = failures, [], False
        self.calls = 0

    def publish_all(self, topic: str, payloads: list[bytes]) -> int:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise PublishError("cannot reach the broker at 127.0.0.1:1883")
        self.sent.extend((topic, p) for p in payloads)
        return len(payloads)

    def close(self) -> None:
        self.closed = True


def wait(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def test_the_outbox_retries_while_the_broker_is_away_and_keeps_the_order():
    pub = FlakyPublisher(failures=2)
    box = Outbox("hot", "alerts/hot", pub, retry_seconds=0.01)
    box.start()
    box.put([b"1", b"2"])
    box.put([b"3"])
    assert wait(lambda: len(pub.sent) == 3)
    assert [p for _, p in pub.sent] == [b"1", b"2", b"3"] and pub.calls == 4
    assert box.error == "" and box.queued == 0
    box.stop()
    assert pub.closed


def test_the_outbox_holds_a_bounded_backlog_and_says_what_it_dropped():
    pub = FlakyPublisher(failures=10**9)
    box = Outbox("hot", "alerts/hot", pub, retry_seconds=0.01, max_rows=3)
    box.start()
    box.put([b"1", b"2"])
    box.put([b"3", b"4"])      # 4 > 3: dropped, counted
    assert box.dropped == 2 and box.queued == 2
    box.put([b"5", b"6"])
    box.put([b"7", b"8"])
    assert box.dropped == 6 and box.queued == 2
    assert wait(lambda: "cannot reach the broker" in box.error)
    assert box.error == ("6 rows dropped: the broker did not take them and at most 3 wait; "
                         "cannot reach the broker at 127.0.0.1:1883")   # one line, not one per drop
    box.stop(timeout=0.05)


def test_an_error_the_client_raises_is_tried_again_not_the_threads_end():
    class Broken(FlakyPublisher):
        def publish_all(self, topic, payloads):
            if not self.calls:
                self.calls += 1
                raise OSError("[Errno 32] Broken pipe")
            return super().publish_all(topic, payloads)

    pub = Broken()
    box = Outbox("hot", "alerts/hot", pub, retry_seconds=0.01)
    box.start()
    box.put([b"1"])
    assert wait(lambda: pub.sent == [("alerts/hot", b"1")])
    assert box.error == "" and box.is_alive()
    box.stop()


def test_stopping_the_outbox_publishes_what_waits_first():
    release = threading.Event()

    class Slow(FlakyPublisher):
        def publish_all(self, topic, payloads):
            release.wait(5)
            return super().publish_all(topic, payloads)

    pub = Slow()
    box = Outbox("hot", "alerts/hot", pub, retry_seconds=0.01)
    box.start()
    box.put([b"a"])
    box.put([b"b"])
    threading.Timer(0.05, release.set).start()
    box.stop(timeout=5)
    assert [p for _, p in pub.sent] == [b"a", b"b"]


class FakeSession:
    """The stream's session: sql() answers union_sql's statement over the rules it names."""

    def __init__(self, batches: BatchRules | None = None) -> None:
        self.views: list[str] = []
        self.jobs = 0
        self.statements = 0
        self.read_paths: list[str] = []
        self.batches = batches

    @property
    def read(self):
        """session.read.schema(...).parquet(staged): the batch as staged."""
        session = self

        class Reader:
            def schema(self, schema):
                return self

            def parquet(self, path):
                session.read_paths.append(path)
                return FakeBatch(session)
        return Reader()

    def sql(self, text: str):
        import re
        self.statements += 1
        names = re.findall(r"^SELECT '([A-Za-z0-9_-]+)' AS rule, to_json\(struct\(\*\), map\(",
                           text, re.M)
        rules = [self.batches._rules[n] for n in names]
        parts = []
        for rule in rules:
            if rule.bad_sql:   # the statement does not analyse: none of it runs
                raise ValueError("[UNRESOLVED_COLUMN] tmep")
            parts.append((rule.spec.name, rule.rows_out, rule.error_at_run))
        return Rows(self, parts)


class FakeBatch:
    """The batch the writer hands over: a DataFrame of the stream's session."""

    def __init__(self, session) -> None:
        self.sparkSession = session

    def drop(self, column):
        return self

    def createOrReplaceTempView(self, name):   # noqa: N802 (PySpark's name)
        self.sparkSession.views.append(name)


class Rows:
    """A rule's (rule, row) frame: collect() gives its rows or raises its run-time error."""

    def __init__(self, session, parts) -> None:
        self.session, self.parts = session, parts

    def unionAll(self, other):   # noqa: N802 (PySpark's name)
        return Rows(self.session, self.parts + other.parts)

    def collect(self):
        self.session.jobs += 1
        out = []
        for name, rows, error in self.parts:
            if error:
                raise ValueError(error)
            out.extend((name, r) for r in rows)
        return out


class Rule(BatchRule):
    def __init__(self, name: str, batches: BatchRules, rows=(), error: str = "",
                 bad_sql: bool = False) -> None:
        self.taken: list[tuple[int, list[str]]] = []
        self.rows_out, self.error_at_run, self.bad_sql = list(rows), error, bad_sql
        from sink.history.job.config import Job
        super().__init__(Job.of(bootstrap="x:1", table="/tmp/t"), RuleSpec(name, "SELECT 1"), None,
                         batches)

    def frame(self, session):
        if self.bad_sql:
            raise ValueError("[UNRESOLVED_COLUMN] tmep")
        return Rows(session, [(self.spec.name, self.rows_out, self.error_at_run)])

    def take(self, session, batch_id, rows, input_rows):
        self.taken.append((batch_id, rows))


def test_every_rule_of_a_batch_runs_in_one_spark_job(tmp_path: Path):
    (tmp_path / "out").mkdir()
    batches = BatchRules()
    session = FakeSession(batches)
    a, b = Rule("a", batches, rows=['{"t":1}']), Rule("b", batches, rows=['{"t":2}', '{"t":3}'])
    batches(FakeBatch(session), 3, tmp_path / "out")
    assert session.views == ["_rules_batch"] and session.jobs == 1 and session.statements == 1
    assert session.read_paths == [str(tmp_path / "out")]   # the batch as staged
    assert a.taken == [(3, ['{"t":1}'])] and b.taken == [(3, ['{"t":2}', '{"t":3}'])]


def test_a_rule_that_fails_on_a_batch_ends_alone_and_the_batch_goes_on(tmp_path: Path):
    (tmp_path / "out").mkdir()
    batches = BatchRules()
    good = Rule("good", batches, rows=['{"t":1}'])
    bad = Rule("bad", batches, error="[DIVIDE_BY_ZERO] Division by zero")
    wrong = Rule("wrong", batches, bad_sql=True)
    session = FakeSession(batches)
    batches(FakeBatch(session), 7, tmp_path / "out")        # raises nothing
    assert good.taken == [(7, ['{"t":1}'])] and good.query.isActive
    assert not bad.query.isActive and "DIVIDE_BY_ZERO" in str(bad.query.exception())
    assert not wrong.query.isActive and "UNRESOLVED_COLUMN" in str(wrong.query.exception())
    assert len(batches) == 1                     # the failed rules are out until started again
    batches(FakeBatch(session), 8, tmp_path / "out")
    assert [b for b, _ in good.taken] == [7, 8]
    good.stop()
    assert len(batches) == 0


def test_without_rules_a_batch_is_not_read_again(tmp_path: Path):
    batches = BatchRules()
    session = FakeSession(batches)
    assert not batches.wanted()          # the writer keeps no batch in memory for nobody
    batches(FakeBatch(session), 1, tmp_path)
    assert session.views == [] and session.jobs == 0


def test_the_rules_of_a_batch_are_one_statement_each_rule_a_subquery_of_its_own():
    batches = BatchRules()
    a = Rule("a", batches)
    a.spec = RuleSpec("a", "SELECT topic FROM messages WHERE qos = 1;;  ")
    b = Rule("b-2", batches)
    b.spec = RuleSpec("b-2", "SELECT 'x''s' AS q FROM messages -- a closing comment")
    sql = union_sql([a, b])
    parts = sql.split("\nUNION ALL\n")
    assert len(parts) == 2
    # the rule's own text, its final semicolons cut, on lines of its own, over the batch
    # without its own messages
    assert ("FROM (\nWITH messages AS (SELECT * FROM _rules_batch WHERE client_id IS DISTINCT "
            "FROM '$rules-a')\nSELECT * FROM (\nSELECT topic FROM messages WHERE qos = 1\n)\n"
            ") AS `rule_0`") in parts[0]
    assert "WHERE client_id IS DISTINCT FROM '$rules-b-2')" in parts[1]
    assert parts[1].endswith("-- a closing comment\n)\n) AS `rule_1`")
    assert parts[0].startswith("SELECT 'a' AS rule, to_json(struct(*), map('ignoreNullFields', "
                               "'false', 'timestampFormat', 'yyyy-MM-dd\\'T\\'HH:mm:ss.SSS\\'Z\\'')) AS row")
    assert parts[1].startswith("SELECT 'b-2' AS rule")
