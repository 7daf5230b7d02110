"""Sparkplug B through Kafka and the history job: sparkplug_metrics beside messages, aliases
resolved across a restart of the job and a rebirth, the online state, a malformed payload kept in
messages and counted. Payloads: Eclipse Tahu's Node encoder (tests/fixtures/sparkplug/)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest

from sink.history.job import run
from sink.history.query import run_sql
from tests.e2e.test_spark_history import history_job, produce

pytestmark = [pytest.mark.timeout(600), pytest.mark.e2e, pytest.mark.kafka]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sparkplug"
TOPICS = {m["name"]: m["topic"] for m in json.loads((FIXTURES / "messages.json").read_text())}
T0 = int(dt.datetime(2024, 5, 2, 10, 0, tzinfo=dt.timezone.utc).timestamp() * 1000)


def message(name: str, i: int, payload: bytes | None = None) -> dict:
    return {"message_id": f"m{i:02d}-{name}", "topic": TOPICS.get(name, "spBv1.0/plant1/NDATA/edge1"),
            "payload": payload if payload is not None else (FIXTURES / f"{name}.bin").read_bytes(),
            "client_id": "edge1", "username": None, "qos": 0, "retain": False, "protocol": 5,
            "accepted_ms": T0 + i * 1000}


def test_sparkplug_metrics_through_the_job_with_a_restart_between_birth_and_data(spark, kafka,
                                                                                 tmp_path,
                                                                                 monkeypatch):
    """Also: the job stopped between the batch's sparkplug_metrics commit and its messages
    commit runs the batch again and writes each table's rows once; compaction of the table
    keeps its rows and its count of malformed payloads."""
    from sink.history import catalog, writer
    from sink.history.compaction import Policy
    from sink.history.maintenance import Settings, maintain_once
    from sink.history.manifest import Table
    from sink.history.sparkplug.table import file_layout, malformed_total, table_path
    job = history_job(kafka.bootstrap, tmp_path, available_now=True)
    produce(kafka.bootstrap, [message("nbirth", 0), message("dbirth", 1), message("ndata", 2),
                              message("garbage", 3, b"\xff\xff\xff\xff")])

    def crash(name: str) -> None:
        if name == "append:after-sparkplug":
            raise RuntimeError("stopped between the two commits")
    monkeypatch.setattr(writer, "crash_point", crash)
    assert run(spark, job) != 0
    assert Table(table_path(job.history.table)).snapshot().rows > 0
    assert not Table(job.history.table).exists()
    monkeypatch.undo()
    assert run(spark, job) == 0   # the same batch again: messages written, sparkplug skipped
    # a new run (the job restarted): the births are only in the table now
    produce(kafka.bootstrap, [message("ddata", 4), message("ddeath", 5), message("nbirth2", 6),
                              message("ndata2", 7), message("orphan", 8)])
    assert run(spark, job) == 0

    table = job.history.table
    assert run_sql(spark, table, "SELECT count(*) AS n, count(DISTINCT message_id) AS ids "
                   "FROM messages")[0].asDict() == {"n": 9, "ids": 9}
    assert run_sql(spark, table, "SELECT count(*) AS n FROM sparkplug_metrics WHERE "
                   "message_id = 'm00-nbirth'")[0].n == 20   # once, not twice
    rows = run_sql(spark, table, "SELECT message_id, message_type, device_id, metric, alias, "
                   "datatype, value::string AS v, schema_of_variant(value) AS vt, seq "
                   "FROM sparkplug_metrics WHERE message_type IN ('NDATA', 'DDATA') "
                   "ORDER BY accepted_at, alias")
    got = [(r.message_id, r.device_id, r.metric, r.alias, r.datatype, r.v, r.vt, r.seq) for r in rows]
    assert got == [
        ("m02-ndata", None, "temp", 2, "Int32", "-7", "BIGINT", 2),
        ("m02-ndata", None, "pressure", 3, "Double", "990.5", "DOUBLE", 2),
        ("m02-ndata", None, None, 99, "Int64", "42", "BIGINT", 2),
        ("m04-ddata", "dev1", "ready", 30, "Boolean", "false", "BOOLEAN", 3),   # after the restart
        ("m04-ddata", "dev1", "level", 31, "Float", "3.5", "DOUBLE", 3),
        ("m07-ndata2", None, "pressure", 2, "Double", "999.0", "DOUBLE", 1),    # after the rebirth
        ("m07-ndata2", None, "temp", 50, "Int32", "22", "BIGINT", 1),
        ("m08-orphan", None, None, 5, "Int32", "1", "BIGINT", 5)]
    # typed values in SQL, a DataSet as an object, and every row's message in messages
    assert run_sql(spark, table, "SELECT value:rows[1][1]::string AS s FROM sparkplug_metrics "
                   "WHERE metric = 'table'")[0].s == "two"
    assert run_sql(spark, table, "SELECT count(*) AS n FROM sparkplug_metrics s LEFT ANTI JOIN "
                   "messages m USING (message_id)")[0].n == 0
    # the malformed payload: in messages, counted, no row
    assert run_sql(spark, table, "SELECT count(*) AS n FROM messages WHERE message_id = "
                   "'m03-garbage'")[0].n == 1
    assert malformed_total(Table(table_path(table))) == 1
    # online state: edge1 reborn (bdSeq 8); dev1 dead
    state = run_sql(spark, table, "SELECT edge_node_id, device_id, online, last_message_type, "
                    "bdseq FROM sparkplug_state ORDER BY edge_node_id, device_id NULLS FIRST")
    assert [tuple(r) for r in state] == [("edge1", None, True, "NBIRTH", 8),
                                         ("edge1", "dev1", False, "DDEATH", 8)]
    # compaction merges the day's files; rows, views and the count stay
    sp = Table(table_path(table))
    before = run_sql(spark, table, "SELECT * FROM sparkplug_metrics ORDER BY message_id, alias")
    assert len(sp.snapshot().files) > 1
    done = maintain_once(spark, sp, Settings(policy=Policy(grace_ms=0)), now_ms=T0 + 86_400_000 * 2,
                         layout=file_layout())
    assert done["compaction"]["tasks"] == 1 and len(sp.snapshot().files) == 1
    after = run_sql(spark, table, "SELECT * FROM sparkplug_metrics ORDER BY message_id, alias")
    def plain(rows: list) -> list[dict]:
        return [r.asDict() | {"value": r.value and r.value.toJson()} for r in rows]
    assert plain(after) == plain(before)
    assert malformed_total(sp) == 1
    # the catalog: the table and the view beside messages
    hist = dataclasses.replace(job.history, database="sparkplug_e2e")
    catalog.register_in_session(spark, hist)
    assert spark.sql("SELECT count(*) AS n FROM sparkplug_e2e.sparkplug_metrics").collect()[0].n \
        == run_sql(spark, table, "SELECT count(*) AS n FROM sparkplug_metrics")[0].n
    assert spark.sql("SELECT count(*) AS n FROM sparkplug_e2e.sparkplug_state "
                     "WHERE online").collect()[0].n == 1
