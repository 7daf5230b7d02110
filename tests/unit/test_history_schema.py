"""The history table's columns, as the job writes them, the catalog declares them and sink.query
prints them: ``payload_json`` (the payload parsed as JSON, a VARIANT) is in every one.

The values of the column (objects, arrays, scalars, non-JSON and non-UTF-8 payloads) are
checked with Spark in tests/e2e/test_spark_history.py."""
from __future__ import annotations

import io
import json

from pyspark.sql.types import VariantType, VariantVal

from sink.history import schema
from sink.history.catalog import create_table_sql
from sink.history.query import write_rows


def test_every_row_has_payload_json_a_variant_beside_the_payload():
    names = schema.HISTORY_COLUMNS
    # after the columns the table had before it (SELECT * keeps their positions), before `date`
    assert names[-3:] == ["user_properties", "payload_json", "date"]
    assert isinstance(schema.HISTORY_SCHEMA["payload_json"].dataType, VariantType)
    assert "payload_json" in schema.FILE_SCHEMA.fieldNames()  # inside the data files
    assert "payload" in names  # the bytes stay


def test_the_select_expressions_give_the_schema_columns_in_order():
    aliases = [e.rsplit(" AS ", 1)[-1] for e in schema.history_select_exprs()]
    assert aliases == schema.HISTORY_COLUMNS


def test_payload_json_parses_only_valid_utf8_with_try_semantics():
    expr = next(e for e in schema.history_select_exprs() if e.endswith(" AS payload_json"))
    # try_parse_json: a payload that is not JSON is NULL, not an error that stops the stream;
    # non-UTF-8 bytes are NULL (not parsed as text with replacement characters)
    assert expr.startswith("try_parse_json(try_validate_utf8(")
    # compaction keeps the column, and parses the payload of rows written before it existed
    assert schema.PAYLOAD_JSON_FILL_SQL == "coalesce(payload_json, try_parse_json(payload_text))"


def test_the_catalog_table_declares_payload_json_as_variant():
    sql = create_table_sql("/data/history")
    assert "`user_properties` array<struct<key:string,value:string>>, `payload_json` variant, " \
        "`date` date)" in sql


def test_sink_query_prints_a_variant_as_json():
    # {"temp":21.5,"h":3} as Spark returns it (VariantVal: value, metadata)
    v = VariantVal(bytearray(b'\x02\x02\x01\x00\x06\x00\x08 \x01\xd7\x00\x00\x00\x0c\x03'),
                   bytearray(b'\x01\x02\x00\x04\x05temph'))
    out = io.StringIO()
    write_rows(["topic", "payload_json"], [("s/1", v), ("s/2", None)], "json", out)
    lines = [json.loads(ln) for ln in out.getvalue().splitlines()]
    assert lines == [{"topic": "s/1", "payload_json": {"h": 3, "temp": 21.5}},
                     {"topic": "s/2", "payload_json": None}]
    out = io.StringIO()
    write_rows(["payload_json"], [(v,)], "csv", out)
    assert json.loads(out.getvalue().splitlines()[1].strip().strip('"').replace('""', '"')) == \
        {"h": 3, "temp": 21.5}


def test_the_schema_names_no_header_of_its_own_the_contract_module_defines_them():
    """The header names are defined once, in kafka_client/headers.py; the schema reads them from
    there and offers none itself, so a module that needs one imports it from where it is defined."""
    from kafka_client import headers
    defined = [n for n in vars(headers) if n.startswith("H_")]
    assert "H_MESSAGE_ID" in defined and "H_USER_PREFIX" in defined
    assert [n for n in defined if hasattr(schema, n)] == []
    assert dict(schema.HEADER_COLUMNS)[headers.H_MESSAGE_ID] == "h_message_id"
