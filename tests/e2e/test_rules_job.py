"""Continuous rules in the history job (docs/rules.md "How the job runs rules"): records in Kafka
-> each rule's streaming query -> its rows published QoS 1 through a running broker and appended
to a derived table; a rule added to the store at run time starts without a restart."""
from __future__ import annotations

import datetime as dt
import json
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from settings import rules as R
from settings.rules import RuleSpec
from tests.e2e.test_spark_history import history_job, produce

pytestmark = [pytest.mark.timeout(600), pytest.mark.e2e, pytest.mark.kafka]

T0 = int(dt.datetime(2024, 5, 2, 10, 0, tzinfo=dt.timezone.utc).timestamp() * 1000)
HOT = "SELECT topic, payload_json:temp::double AS temp FROM messages WHERE payload_json:temp::double > 30"
COUNT = ("SELECT window.start AS start, topic, count(*) AS n FROM messages "
         "GROUP BY window(accepted_at, '1 minute'), topic")


def reading(i: int, temp: float, at_ms: int, topic: str = "plant/t1", client_id: str = "dev") -> dict:
    return {"message_id": f"r-{i:04d}", "topic": topic, "payload": json.dumps({"temp": temp}).encode(),
            "client_id": client_id, "username": None, "qos": 1, "retain": False, "protocol": 5,
            "accepted_ms": at_ms}


#: messages the rules published themselves, as the broker puts them in Kafka: an alert of the
#: rule "hot" (hot again, but a rule never reads its own messages; the others do) and one of
#: the rule "per_minute" (not counted by itself)
OWN = [reading(7, 50.0, T0 + 1500, "alerts/hot", client_id="$rules-hot"),
       reading(8, 1.0, T0 + 1600, "plant/t2", client_id="$rules-per_minute")]
OWN_COUNTS = [("2024-05-02T10:00:00.000Z", "alerts/hot", 1),
              ("2024-05-02T10:00:00.000Z", "plant/t1", 2), ("2024-05-02T10:00:00.000Z", "plant/t2", 1)]


class Alerts:
    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        self.got: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        subscribed = threading.Event()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="alerts-sub", protocol=mqtt.MQTTv5)
        self.c.on_message = lambda c, u, m: self._add(m.topic, json.loads(m.payload))
        self.c.on_subscribe = lambda *a: subscribed.set()
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.c.subscribe("alerts/#", qos=1)
        assert subscribed.wait(10)

    def _add(self, topic: str, doc: dict) -> None:
        with self.lock:
            self.got.append((topic, doc))

    def on(self, topic: str) -> list[dict]:
        with self.lock:
            return [d for t, d in self.got if t == topic]


def wait_for(what, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.5)
    return what()


def test_rules_publish_through_the_broker_append_to_a_table_and_start_at_run_time(
        spark, kafka, tmp_path, make_broker):
    from sink.history.rules.query import derived_dir
    from sink.history.rules.runner import RulesRunner
    rules = (RuleSpec("hot", HOT, publish="alerts/hot", table="hot_rows"),
             RuleSpec("per_minute", COUNT, publish="alerts/count"))
    # the broker and the job share the config's rules and the data directory, as run.sh starts
    # them: the broker lets the $rules client in with the password the job reads there, and
    # publish to the rules' topics only
    config = tmp_path / "rules.toml"
    config.write_text("".join(f'[[history.rules]]\nname = "{r.name}"\nsql = "{r.sql}"\n'
                              f'publish = "{r.publish}"\n' for r in rules))
    broker = make_broker(args=["--config", str(config)])
    data = tmp_path
    job = history_job(kafka.bootstrap, tmp_path, data_dir=str(data), broker_port=broker.port,
                      verify_records=False, rules=rules, rules_watermark="10 seconds")
    produce(kafka.bootstrap, [reading(0, 99.0, T0)])   # makes the topic; before the rules: not seen
    alerts = Alerts(broker.port)
    runner = RulesRunner(spark, job, poll_seconds=1.0)
    runner.start()
    try:
        def all_running(names):
            st = R.read_status(str(data))["rules"]
            return all(st.get(n, {}).get("state") == "running" for n in names) and all(
                h.query.lastProgress for h in runner.sup.running().values())
        assert wait_for(lambda: all_running(["hot", "per_minute"])), R.read_status(str(data))
        produce(kafka.bootstrap, [reading(1, 35.5, T0 + 1000), reading(2, 20.0, T0 + 2000),
                                  reading(3, 31.0, T0 + 3000, "plant/t2"), *OWN])
        hot = wait_for(lambda: len(alerts.on("alerts/hot")) >= 2 and alerts.on("alerts/hot"))
        assert sorted((d["topic"], d["temp"]) for d in hot) == [("plant/t1", 35.5), ("plant/t2", 31.0)]
        # the window [T0, T0+1 min) closes when a message 10 s past its end moves the watermark
        produce(kafka.bootstrap, [reading(4, 1.0, T0 + 75_000)])
        counts = wait_for(lambda: len(alerts.on("alerts/count")) >= 3 and alerts.on("alerts/count"))
        assert sorted((d["start"], d["topic"], d["n"]) for d in counts) == OWN_COUNTS
        # a rule added to the store starts without a restart; the job's other rules go on
        R.write_store(str(data), R.Store([RuleSpec("cold", "SELECT topic, payload_json:temp::double AS "
                                                   "temp FROM messages WHERE payload_json:temp::double < 0",
                                                   publish="alerts/cold", source=R.STORE)], set()))
        broker.proc.send_signal(signal.SIGHUP)   # the broker re-reads the store (the admin API
        # writes it in the broker's own process; a store written by another process needs this)
        assert wait_for(lambda: all_running(["cold"])), R.read_status(str(data))
        produce(kafka.bootstrap, [reading(5, -4.0, T0 + 80_000), reading(6, 40.0, T0 + 81_000)])
        assert wait_for(lambda: alerts.on("alerts/cold")) == [{"topic": "plant/t1", "temp": -4.0}]
        assert wait_for(lambda: len(alerts.on("alerts/hot")) >= 3)
        time.sleep(3)   # every window once: nothing more arrives for the closed window
        assert len(alerts.on("alerts/count")) == 3
        assert len(alerts.on("alerts/hot")) == 3 and len(alerts.on("alerts/cold")) == 1
        rows = spark.read.parquet(str(derived_dir(job, "hot_rows"))).collect()
        assert sorted(r.temp for r in rows) == [31.0, 35.5, 40.0]   # each row once
        st = R.read_status(str(data))["rules"]
        assert st["hot"]["rows"] >= 1 and st["hot"]["last_error"] == "" and st["cold"]["source"] == "store"
    finally:
        runner.stop()
        alerts.c.loop_stop()
    assert R.read_status(str(data))["rules"]["hot"]["state"] == "stopped"   # the job's last word


def test_a_stateless_rule_runs_on_the_historys_batches_and_a_windowed_one_as_its_own_query(
        spark, kafka, tmp_path, make_broker):
    """One read of Kafka for the table and every stateless rule: the filter rule runs on the
    batches the history query writes (its table rows once each, in hbatch-<id> files), the
    windowed rule, which needs state, as its own streaming query."""
    from sink.history.job.runner import run
    from sink.history.rules.query import RuleQuery, derived_dir
    from sink.history.rules.runner import RulesRunner
    from sink.history.rules.shared import BatchRule, BatchRules
    from tests.e2e.test_spark_history import ids_and_count
    rules = (RuleSpec("hot", HOT, publish="alerts/hot", table="hot_rows"),
             RuleSpec("per_minute", COUNT, publish="alerts/count"))
    config = tmp_path / "rules.toml"
    config.write_text("".join(f'[[history.rules]]\nname = "{r.name}"\nsql = "{r.sql}"\n'
                              f'publish = "{r.publish}"\n' for r in rules))
    broker = make_broker(args=["--config", str(config)])
    job = history_job(kafka.bootstrap, tmp_path, data_dir=str(tmp_path), broker_port=broker.port,
                      verify_records=False, rules=rules, rules_watermark="10 seconds")
    produce(kafka.bootstrap, [reading(0, 99.0, T0)])   # before the rules: in the table only
    alerts = Alerts(broker.port)
    batch_rules, stop = BatchRules(), threading.Event()
    history = threading.Thread(target=run, args=(spark, job, stop), kwargs={"batch_rules": batch_rules},
                               daemon=True)
    history.start()

    def in_table() -> int:
        from sink.history.query import TableMissing
        try:
            return ids_and_count(spark, job.history.table)[0]
        except TableMissing:   # before the first commit
            return 0
    assert wait_for(lambda: in_table() == 1), "the history query wrote nothing"
    runner = RulesRunner(spark, job, poll_seconds=1.0, batch_rules=batch_rules)
    runner.start()
    try:
        def started():
            running = runner.sup.running()
            return len(running) == 2 and running
        running = wait_for(started)
        assert running, R.read_status(str(tmp_path))
        assert isinstance(running["hot"], BatchRule) and isinstance(running["per_minute"], RuleQuery)
        assert len(batch_rules) == 1
        assert wait_for(lambda: running["per_minute"].query.lastProgress)
        produce(kafka.bootstrap, [reading(1, 35.5, T0 + 1000), reading(2, 20.0, T0 + 2000),
                                  reading(3, 31.0, T0 + 3000, "plant/t2"), *OWN])
        hot = wait_for(lambda: len(alerts.on("alerts/hot")) >= 2 and alerts.on("alerts/hot"))
        assert sorted((d["topic"], d["temp"]) for d in hot) == [("plant/t1", 35.5), ("plant/t2", 31.0)]
        produce(kafka.bootstrap, [reading(4, 1.0, T0 + 75_000)])
        counts = wait_for(lambda: len(alerts.on("alerts/count")) >= 3 and alerts.on("alerts/count"))
        assert sorted((d["start"], d["topic"], d["n"]) for d in counts) == OWN_COUNTS
        time.sleep(3)
        assert len(alerts.on("alerts/hot")) == 2   # each row once; 99.0 came before the rule
        files = sorted(p.name for p in derived_dir(job, "hot_rows").glob("*.parquet"))
        assert files and all(f.startswith("hbatch-") for f in files)
        rows = spark.read.parquet(str(derived_dir(job, "hot_rows"))).collect()
        assert sorted(r.temp for r in rows) == [31.0, 35.5]
        st = R.read_status(str(tmp_path))["rules"]
        assert st["hot"]["state"] == "running" and st["hot"]["rows"] == 2
        assert st["hot"]["input_rows_per_second"] > 0 and st["hot"]["last_error"] == ""
    finally:
        runner.stop()
        stop.set()
        history.join(120)
        alerts.c.loop_stop()
    assert not history.is_alive()


def test_the_one_statement_of_a_batchs_rules_gives_each_rule_the_rows_of_its_own_query(spark):
    """union_sql (every stateless rule of a batch in one statement) against each rule's own
    frame: the same JSON objects, nulls, timestamps and variants included, per rule; a rule's
    own messages (its client id) are not in its input."""
    from sink.history.rules.shared import BATCH_VIEW, BatchRule, BatchRules, union_sql
    batches = BatchRules()
    specs = [RuleSpec("hot", HOT + ";"),
             RuleSpec("all-fields", "SELECT topic, accepted_at, payload_json, qos, "
                                    "payload_json:missing::string AS gone FROM messages -- every row"),
             RuleSpec("none", "SELECT topic FROM messages WHERE qos > 2")]
    rules = [BatchRule(None, s, None, batches) for s in specs]
    (spark.createDataFrame(
        [("plant/t1", '{"temp": 35.5, "tags": ["a"]}', 1, "2024-05-02 10:00:00.25", "dev"),
         ("plant/t2", '{"temp": 20}', 0, "2024-05-02 10:00:01", None),
         ("plant/t3", "not json", 2, "2024-05-02 10:00:02.5", "dev"),
         ("alerts/hot", '{"temp": 35.5}', 1, "2024-05-02 10:00:03", "$rules-hot")],  # hot's own
        "topic string, s string, qos int, t string, client_id string")
     .selectExpr("topic", "try_parse_json(s) AS payload_json", "qos",
                 "CAST(t AS TIMESTAMP) AS accepted_at", "client_id")
     .createOrReplaceTempView(BATCH_VIEW))
    one = sorted(map(tuple, spark.sql(union_sql(rules)).collect()))
    each = sorted(tuple(r) for rule in rules for r in rule.frame(spark).collect())
    assert one == each
    got = {}
    for name, row in one:
        got.setdefault(name, []).append(json.loads(row))
    assert got["hot"] == [{"topic": "plant/t1", "temp": 35.5}]
    first = min(got["all-fields"], key=lambda d: d["accepted_at"])
    assert first == {"topic": "plant/t1", "accepted_at": "2024-05-02T10:00:00.250Z",
                     "payload_json": {"tags": ["a"], "temp": 35.5}, "qos": 1, "gone": None}
    # the rule "hot" never reads its own message; another rule does
    assert len(got["all-fields"]) == 4 and "none" not in got


def stage(spark, out, payloads: list[str]):
    """A batch of these payloads staged as the history writer stages it (the job's own
    expressions, partitioned by date and hour) in ``out``; returns the batch."""
    from sink.history.schema import HEADER_COLUMNS, to_history
    from sink.history.writer import HOUR_COLUMN
    batch = to_history(spark.createDataFrame(list(enumerate(payloads)), "id bigint, p string")
                       .selectExpr("CAST(concat('t/', id) AS BINARY) AS key",
                                   "CAST(p AS BINARY) AS value", "'mqtt.messages' AS topic",
                                   "0 AS partition", "id AS offset",
                                   f"timestamp_millis({T0} + id) AS timestamp", "0 AS timestampType",
                                   *[f"CAST(NULL AS BINARY) AS {c}" for _, c in HEADER_COLUMNS],
                                   "CAST(array() AS ARRAY<STRUCT<key: STRING, value: BINARY>>) "
                                   "AS user_headers", f"timestamp_millis({T0} + id) AS ingested_at"))
    (batch.selectExpr("*", f"hour(accepted_at) AS {HOUR_COLUMN}")
     .write.partitionBy("date", HOUR_COLUMN).parquet(str(out)))
    return batch


def test_a_batchs_rules_read_their_json_fields_typed_from_the_staged_files(spark, tmp_path):
    """BatchRules shows the staged files as ``messages`` with nothing between the scan and the
    rules: each rule's casts of JSON fields are read in the scan as typed values (the plan's
    read schema asks for the fields, not the whole variant), with the rows its SQL gives over
    the batch itself."""
    from sink.history.rules.shared import BATCH_VIEW, BatchRule, BatchRules, union_sql
    batch = stage(spark, tmp_path / "out",
                  ['{"temp": 35.5, "hot": true}', '{"temp": 20}', "not json", '{"temp": "abc"}'])
    batches = BatchRules()
    rules = [BatchRule(None, RuleSpec("hot", "SELECT topic, payload_json:temp::double AS temp "
                                             "FROM messages WHERE payload_json:hot::boolean"),
                       None, batches),
             BatchRule(None, RuleSpec("warm", "SELECT topic FROM messages WHERE "
                                              "try_cast(payload_json:temp AS double) > 30"),
                       None, batches)]
    batches(SimpleNamespace(sparkSession=spark), 1, tmp_path / "out")   # as the writer calls it
    assert [(r.rows, r.input_rows) for r in rules] == [(1, 4), (1, 4)]
    stmt = spark.sql(union_sql(rules))   # over the view of the staged files the call made
    plan = stmt._jdf.queryExecution().executedPlan().toString()
    scans = [ln for ln in plan.splitlines() if "ReadSchema" in ln]
    assert len(scans) == 2 and all("payload_json:struct<0:" in s for s in scans), plan
    assert not any("0:variant" in s for s in scans), plan   # the fields, not the whole variant
    got = sorted(tuple(r) for r in stmt.collect())
    batch.createOrReplaceTempView(BATCH_VIEW)
    assert got == sorted(tuple(r) for r in spark.sql(union_sql(rules)).collect())
    assert [(n, json.loads(r)) for n, r in got] == [("hot", {"topic": "t/0", "temp": 35.5}),
                                                  ("warm", {"topic": "t/0"})]


#: rules that are one pass over the batch (merge.py), with what each tries: names Spark gives,
#: an alias of its own, an IN (whose parsed position starts at IN), comments, quotes, qualified
#: columns, no WHERE
MERGED = {"hot": HOT,
          "named": "SELECT upper(topic), payload_json:temp::int + 1 AS `we``ird`, "
                   "qos IN (0, 1) FROM messages WHERE client_id IN ('dev') /* trailing */",
          "commented": "SELECT topic -- the topic\n, 'x''s' AS q FROM messages -- rows\n"
                       "WHERE messages.qos >= 1;",
          "every": "SELECT topic, accepted_at, payload_json FROM messages"}
#: rules that keep a subquery of their own: all columns, an alias for messages, a generator,
#: a subquery
APART = {"star": "SELECT * FROM messages WHERE qos = 2",
         "aliased": "SELECT m.topic FROM messages m WHERE m.qos = 1",
         "exploded": "SELECT explode(array(1, 2)) AS x, topic FROM messages WHERE qos = 2",
         "subquery": "SELECT topic FROM messages WHERE topic IN "
                     "(SELECT topic FROM messages WHERE qos = 2)"}


def test_simple_rules_are_one_pass_over_the_batch_with_the_rows_of_their_own_queries(spark):
    """batch_sql: every rule that is SELECT ... FROM messages [WHERE ...] becomes one arm of one
    pass over the batch, the others subqueries beside it; each rule gets exactly the JSON
    objects of its own query, without its own messages (the rule "hot" and the alert it
    published itself)."""
    from sink.history.rules.shared import BATCH_VIEW, BatchRule, BatchRules, batch_sql
    batches = BatchRules()
    rules = [BatchRule(None, RuleSpec(n, s), None, batches) for n, s in {**MERGED, **APART}.items()]
    (spark.createDataFrame(
        [("plant/t1", '{"temp": 35.5, "tags": ["a"]}', 1, "2024-05-02 10:00:00.25", "dev"),
         ("plant/t2", '{"temp": 20}', 0, "2024-05-02 10:00:01", None),
         ("plant/t3", "not json", 2, "2024-05-02 10:00:02.5", "dev"),
         ("alerts/hot", '{"temp": 35.5}', 1, "2024-05-02 10:00:03", "$rules-hot")],
        "topic string, s string, qos int, t string, client_id string")
     .selectExpr("topic", "try_parse_json(s) AS payload_json", "qos",
                 "CAST(t AS TIMESTAMP) AS accepted_at", "client_id")
     .createOrReplaceTempView(BATCH_VIEW))
    sql = batch_sql(spark, rules)
    assert {r.spec.name for r in rules if isinstance(r.arm, str)} == set(MERGED)
    assert sql.count(") AS m FROM messages)") == 1 and sql.count("UNION ALL") == len(APART)
    one = sorted(map(tuple, spark.sql(sql).collect()))
    each = sorted(tuple(r) for rule in rules for r in rule.frame(spark).collect())
    assert one == each
    got: dict[str, list] = {}
    for name, row in one:
        got.setdefault(name, []).append(json.loads(row))
    assert got["hot"] == [{"topic": "plant/t1", "temp": 35.5}]      # not its own alert
    assert sorted(got["named"], key=str) == [
        {"upper(topic)": "PLANT/T1", "we`ird": 36, "(qos IN (0, 1))": True},
        {"upper(topic)": "PLANT/T3", "we`ird": None, "(qos IN (0, 1))": False}]
    assert sorted(d["topic"] for d in got["commented"]) == ["alerts/hot", "plant/t1", "plant/t3"]
    assert got["commented"][0]["q"] == "x's" and len(got["every"]) == 4


def test_a_rule_that_fails_in_the_one_pass_ends_alone_and_the_others_get_their_rows(spark, tmp_path):
    """A run-time error of one rule's arm fails the batch's one pass; the batch then runs each
    rule alone: the failing rule ends (its error kept), the others get their rows."""
    from sink.history.rules.shared import BatchRule, BatchRules
    stage(spark, tmp_path / "out", ['{"temp": 35.5}', '{"temp": 20}'])
    batches = BatchRules()
    good = BatchRule(None, RuleSpec("good", HOT), None, batches)
    bad = BatchRule(None, RuleSpec("bad", "SELECT topic FROM messages "
                                          "WHERE 1 / (payload_json:temp::int - 20) > 0"), None, batches)
    batches(SimpleNamespace(sparkSession=spark), 1, tmp_path / "out")
    assert isinstance(good.arm, str) and isinstance(bad.arm, str)     # both were in the pass
    assert good.rows == 1 and good.query.isActive
    assert not bad.query.isActive and "DIVIDE_BY_ZERO" in str(bad.query.exception())
    assert len(batches) == 1
