"""`payload_json:field::type` in the job's Spark: read as the typed (shredded) field, and giving
exactly what the cast gives, value, NULL or error
(sink/history/jvm/VariantCastPushdown.scala, the rule mqtthistory.CastOfVariantField)."""
from __future__ import annotations

import pytest

RULE = "mqtthistory.CastOfVariantField"

PAYLOADS = ['{"t": 31.5}', '{"t": "12.25"}', '{"t": 7}', '{"t": -0.5e2}', '{"t": null}', '{"u": 1}',
            '{"t": true}', '{"t": {"a": 1}}', '{"t": [1]}', '{"t": "abc"}', '{"t": 1e300}',
            '{"t": "2024-05-01"}', '[1, 2]', '"text"', None]


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("variant") / "t")
    (spark.createDataFrame([(i, p) for i, p in enumerate(PAYLOADS)], "id int, s string")
     .selectExpr("id", "try_parse_json(s) AS payload_json").coalesce(1)
     .write.parquet(path))
    spark.read.parquet(path).createOrReplaceTempView("vt")
    yield "vt"
    spark.conf.unset("spark.sql.optimizer.excludedRules")


def answer(spark, sql: str, rule: bool):
    """The rows of sql, or the error class Spark raised, with the rule on or off."""
    if rule:
        spark.conf.unset("spark.sql.optimizer.excludedRules")
    else:
        spark.conf.set("spark.sql.optimizer.excludedRules", RULE)
    try:
        return sorted(map(tuple, spark.sql(sql).collect()), key=repr)
    except Exception as exc:   # ANSI: an invalid variant cast fails the query, with or without
        # (with the rule the cast runs in the scan: Spark reports FAILED_READ_FILE caused by it)
        text = str(exc)
        return [c for c in ("INVALID_VARIANT_CAST", "CAST_INVALID_INPUT", "CAST_OVERFLOW")
                if c in text] or text[:300]


def read_schema(spark, sql: str) -> str:
    spark.conf.unset("spark.sql.optimizer.excludedRules")
    return spark.sql(sql)._jdf.queryExecution().executedPlan().toString()


@pytest.mark.parametrize("expr", [
    "payload_json:t::double", "payload_json:t::int", "payload_json:t::decimal(10, 2)",
    "payload_json:t::string", "payload_json:t::boolean", "payload_json:t::date",
    "try_cast(payload_json:t AS double)", "try_cast(payload_json:t AS int)",
    "try_cast(payload_json:t AS boolean)", "try_cast(payload_json:t AS date)",
    "try_cast(payload_json:t AS timestamp)", "cast(payload_json:t AS string)",
    "try_cast(payload_json[0] AS bigint)", "payload_json::string",
    "try_cast(payload_json:t AS array<int>)", "try_cast(payload_json:t AS struct<a: int>)",
    "try_cast(payload_json:t AS map<string, int>)", "try_cast(payload_json:t AS string)",
])
def test_a_cast_of_a_variant_field_gives_the_same_with_the_rule_as_without(spark, table, expr):
    for where in ("", " WHERE id IN (0, 1, 2, 3, 4, 5)"):
        sql = f"SELECT id, {expr} FROM {table}{where}"
        with_rule, without = answer(spark, sql, True), answer(spark, sql, False)
        assert with_rule == without, sql


def plan_without_rule(spark, sql: str) -> str:
    spark.conf.set("spark.sql.optimizer.excludedRules", RULE)   # (what Spark does alone)
    try:
        return spark.sql(sql)._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.unset("spark.sql.optimizer.excludedRules")


def test_a_filter_on_a_try_cast_json_field_reads_the_typed_field_with_the_filter_pushed(spark, table):
    sql = f"SELECT count(*) FROM {table} WHERE try_cast(payload_json:t AS double) > 30"
    plan = read_schema(spark, sql)
    assert "ReadSchema: struct<payload_json:struct<0:double>>" in plan, plan
    assert "GreaterThan(payload_json.`0`,30.0)" in plan, plan
    assert "struct<0:variant>" in plan_without_rule(spark, sql)
    assert spark.sql(sql).collect()[0][0] == 2        # 31.5 and 1e300


DEFER = "spark.sql.variant.pushVariantIntoScan.deferCastError"


def test_an_ansi_cast_of_a_json_field_is_read_typed_and_fails_only_on_a_row_the_query_uses(
        spark, table):
    """`payload_json:t::double` reads the typed field with each row's cast error beside it: rows
    the filter drops ("abc", an object) do not fail the query; a row it keeps does, as the cast
    would (ANSI)."""
    assert spark.conf.get(DEFER) == "true"       # the sessions' default (sink/history/spark.py)
    where = "WHERE id IN (0, 1, 2, 3, 4, 5)"
    sql = f"SELECT id, payload_json:t::double FROM {table} {where}"
    plan = read_schema(spark, sql)
    assert "struct<0:double,1:string>" in plan, plan
    assert "struct<0:variant>" in plan_without_rule(spark, sql)
    assert answer(spark, sql, True) == answer(spark, sql, False)
    assert len(answer(spark, sql, True)) == 6
    assert answer(spark, f"SELECT id, payload_json:t::double FROM {table} WHERE id = 9",
                  True) == ["INVALID_VARIANT_CAST"]          # "abc"
    count = (f"SELECT count(*) FROM {table} WHERE id IN (0, 1, 2, 3, 4, 5) AND "
             "payload_json:t::double > 30")
    assert answer(spark, count, True) == [(1,)]


def test_with_deferred_cast_errors_off_an_ansi_cast_is_left_to_run_after_the_filter(spark, table):
    """Moved into the scan without the deferred error, a cast that fails would run for rows the
    query filters out: Spark's own typed variant_get does, and fails where `::double` answers."""
    where = "WHERE id IN (0, 1, 2, 3, 4, 5)"
    sql = f"SELECT id, payload_json:t::double FROM {table} {where}"
    spark.conf.set(DEFER, "false")
    try:
        assert "struct<0:variant>" in read_schema(spark, sql)
        assert len(answer(spark, sql, True)) == 6
        pushed = answer(spark, f"SELECT id, variant_get(payload_json, '$.t', 'double') FROM "
                               f"{table} {where}", True)
        assert pushed == ["INVALID_VARIANT_CAST"], pushed
    finally:
        spark.conf.set(DEFER, "true")
