"""The history table schema and the Kafka-record -> history-row decoding.

Spark's native ``kafka`` source produces *Kafka-shaped* rows (``KAFKA_SCHEMA``, with
``includeHeaders=true``); our Python source (sink/history/source.py) produces the same rows or, cheaper
for the job, *header columns* (``HEADER_COLUMNS_SCHEMA``: the Kafka columns with, instead of the
``headers`` array, one column per contract header - the value of its first occurrence - and the
``mqtt.user.*`` headers). Two steps, both Spark SQL here:

1. ``header_columns_exprs``: Kafka rows -> header columns (the Python source does this step
   itself, vectorised; tests/e2e/test_spark_history.py checks both give the same rows);
2. ``history_select_exprs``: header columns -> history columns (casts, defaults), the same for
   both sources. ``to_history`` applies whichever steps its input needs.

Header contract (written by the broker's forwarder, names fixed, values UTF-8 unless noted):
``mqtt.message_id``, ``mqtt.client_id``, ``mqtt.username`` (absent if none), ``mqtt.qos``,
``mqtt.retain`` (0/1), ``mqtt.protocol`` (3/4/5), optional ``mqtt.payload_format``,
``mqtt.content_type``, ``mqtt.response_topic``, ``mqtt.correlation_data`` (raw bytes),
``mqtt.message_expiry`` (seconds), and one ``mqtt.user.<name>`` per User Property, in order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
    VariantType,
)

# The header names are the record contract, defined once in kafka_client/headers.py.
from kafka_client import headers as hdr

# The column names the broker's dashboard queries, spelled once (settings/history_columns.py).
from settings import history_columns as col

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Rows as Spark's native Kafka source returns them with includeHeaders=true.
KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
])

#: The contract headers as columns: (header name, column name); value = first occurrence.
HEADER_COLUMNS = [(hdr.H_MESSAGE_ID, "h_message_id"), (hdr.H_CLIENT_ID, "h_client_id"),
                  (hdr.H_USERNAME, "h_username"), (hdr.H_QOS, "h_qos"), (hdr.H_RETAIN, "h_retain"),
                  (hdr.H_PROTOCOL, "h_protocol"), (hdr.H_PAYLOAD_FORMAT, "h_payload_format"),
                  (hdr.H_CONTENT_TYPE, "h_content_type"), (hdr.H_RESPONSE_TOPIC, "h_response_topic"),
                  (hdr.H_CORRELATION_DATA, "h_correlation_data"),
                  (hdr.H_MESSAGE_EXPIRY, "h_message_expiry")]

#: Kafka rows with the headers as columns: KAFKA_SCHEMA without ``headers``, then one binary
#: column per HEADER_COLUMNS entry, then ``user_headers``: every ``mqtt.user.<name>`` header in
#: order, as (name without the prefix, value), then ``ingested_at``: the micro-batch's time
#: (the Python source keeps it in the batch's end offset, so a replayed batch has the same).
HEADER_COLUMNS_SCHEMA = StructType(
    [f for f in KAFKA_SCHEMA.fields if f.name != "headers"]
    + [StructField(col, BinaryType()) for _, col in HEADER_COLUMNS]
    + [StructField("user_headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))), StructField("ingested_at", TimestampType())])

USER_PROPERTY = StructType([StructField("key", StringType()), StructField("value", StringType())])

#: The history table (``date`` is the partition column: the UTC day of accepted_at).
HISTORY_SCHEMA = StructType([
    StructField("message_id", StringType()),
    StructField(col.TOPIC, StringType()),
    StructField(col.PAYLOAD, BinaryType()),
    StructField(col.PAYLOAD_TEXT, StringType()),
    StructField(col.QOS, IntegerType()),
    StructField(col.RETAIN, BooleanType()),
    StructField(col.CLIENT_ID, StringType()),
    StructField("username", StringType()),
    StructField("protocol", IntegerType()),
    StructField(col.ACCEPTED_AT, TimestampType()),
    StructField("kafka_topic", StringType()),
    StructField("kafka_partition", IntegerType()),
    StructField(col.KAFKA_OFFSET, LongType()),
    StructField("ingested_at", TimestampType()),
    StructField("content_type", StringType()),
    StructField("payload_format", IntegerType()),
    StructField("response_topic", StringType()),
    StructField("correlation_data", BinaryType()),
    StructField("message_expiry", LongType()),
    StructField("user_properties", ArrayType(USER_PROPERTY)),
    # added after the others (DESIGN.md's "Plus"): `SELECT *` keeps the columns before it in place
    StructField(col.PAYLOAD_JSON, VariantType()),
    StructField(col.DATE, DateType()),
])

#: ``payload_json``: the payload parsed as JSON (any JSON value: object, array, string, number,
#: true/false, null) when it is UTF-8 JSON, else NULL (non-JSON text, non-UTF-8 bytes, no
#: payload). Written by the job; files written before the column existed read it as NULL, until
#: compaction merges them (``PAYLOAD_JSON_FILL_SQL``).
PAYLOAD_JSON_SQL = "try_parse_json(try_validate_utf8(CAST(value AS STRING)))"
#: The column as compaction writes it: kept where the input has it, parsed from ``payload_text``
#: where the input file predates the column (a JSON payload's value is never NULL, so only old
#: rows and non-JSON payloads are parsed again).
PAYLOAD_JSON_FILL_SQL = "coalesce(payload_json, try_parse_json(payload_text))"

HISTORY_COLUMNS = [f.name for f in HISTORY_SCHEMA.fields]
PARTITION_COLUMN = col.DATE
#: The columns inside a data file (the partition column is in its directory name).
FILE_SCHEMA = StructType([f for f in HISTORY_SCHEMA.fields if f.name != PARTITION_COLUMN])


def _header_bytes(name: str) -> str:
    """SQL for the first header called ``name`` (binary), NULL when absent."""
    return f"try_element_at(filter(headers, h -> h.key = '{name}'), 1).value"


def header_columns_exprs() -> list[str]:
    """Spark SQL expressions: KAFKA_SCHEMA rows -> HEADER_COLUMNS_SCHEMA rows."""
    n = len(hdr.H_USER_PREFIX)
    kafka = [f.name for f in KAFKA_SCHEMA.fields if f.name != "headers"]
    return kafka + [f"{_header_bytes(name)} AS {col}" for name, col in HEADER_COLUMNS] + [
        f"transform(filter(headers, h -> startswith(h.key, '{hdr.H_USER_PREFIX}')), "
        f"h -> named_struct('key', substring(h.key, {n + 1}), 'value', h.value)) AS user_headers",
        # The micro-batch's timestamp (kept in the offset log: a replayed batch gets the same).
        "current_timestamp() AS ingested_at"]


def history_select_exprs() -> list[str]:
    """Spark SQL expressions (in HISTORY_SCHEMA order) over HEADER_COLUMNS_SCHEMA rows.

    Malformed numbers in headers become NULL (try_cast) instead of failing the stream.
    A record without ``mqtt.message_id`` (not written by our forwarder) gets a stable id
    derived from its Kafka coordinates, so replays of it still deduplicate.
    """
    return [
        "coalesce(CAST(h_message_id AS STRING), "
        "concat('kafka:', topic, ':', partition, ':', offset)) AS message_id",
        "CAST(key AS STRING) AS topic",
        "value AS payload",
        "try_validate_utf8(CAST(value AS STRING)) AS payload_text",
        "try_cast(CAST(h_qos AS STRING) AS INT) AS qos",
        "(CAST(h_retain AS STRING) IN ('1', 'true')) AS retain",
        "CAST(h_client_id AS STRING) AS client_id",
        "CAST(h_username AS STRING) AS username",
        "try_cast(CAST(h_protocol AS STRING) AS INT) AS protocol",
        "timestamp AS accepted_at",
        "topic AS kafka_topic",
        "partition AS kafka_partition",
        "offset AS kafka_offset",
        "ingested_at",
        "CAST(h_content_type AS STRING) AS content_type",
        "try_cast(CAST(h_payload_format AS STRING) AS INT) AS payload_format",
        "CAST(h_response_topic AS STRING) AS response_topic",
        "h_correlation_data AS correlation_data",
        "try_cast(CAST(h_message_expiry AS STRING) AS BIGINT) AS message_expiry",
        "transform(user_headers, h -> named_struct('key', h.key, 'value', CAST(h.value AS STRING)))"
        " AS user_properties",
        f"{PAYLOAD_JSON_SQL} AS payload_json",
        "to_date(timestamp) AS date",  # session time zone is UTC (sink.history.spark)
    ]


def to_header_columns(kafka_df: DataFrame) -> DataFrame:
    """Kafka-shaped or header-column DataFrame -> HEADER_COLUMNS_SCHEMA rows."""
    if "headers" in kafka_df.columns:
        return kafka_df.selectExpr(*header_columns_exprs())
    return kafka_df


def to_history(kafka_df: DataFrame) -> DataFrame:
    """Kafka-shaped (or header-column) DataFrame, batch or streaming -> history rows, in
    HISTORY_SCHEMA order."""
    return to_header_columns(kafka_df).selectExpr(*history_select_exprs())
