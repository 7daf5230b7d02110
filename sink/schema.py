"""The history table schema and the Kafka-record -> history-row decoding.

Both Kafka readers (Spark's native ``kafka`` source and our Python source in sink/source.py)
produce the same *Kafka-shaped* rows (``KAFKA_SCHEMA``, identical to the native source with
``includeHeaders=true``); ``to_history`` turns those into the history columns. So the two paths
cannot drift apart: the decoding exists once, as Spark SQL expressions.

Header contract (written by the broker's forwarder, names fixed, values UTF-8 unless noted):
``mqtt.message_id``, ``mqtt.client_id``, ``mqtt.username`` (absent if none), ``mqtt.qos``,
``mqtt.retain`` (0/1), ``mqtt.protocol`` (3/4/5), optional ``mqtt.payload_format``,
``mqtt.content_type``, ``mqtt.response_topic``, ``mqtt.correlation_data`` (raw bytes),
``mqtt.message_expiry`` (seconds), and one ``mqtt.user.<name>`` per User Property, in order.
"""
from __future__ import annotations

from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DateType, IntegerType,
                               LongType, StringType, StructField, StructType, TimestampType)

# The header names are the record contract, defined once in sink/record.py.
from .record import (H_CLIENT_ID, H_CONTENT_TYPE, H_CORRELATION_DATA,  # noqa: F401
                     H_MESSAGE_EXPIRY, H_MESSAGE_ID, H_PAYLOAD_FORMAT, H_PROTOCOL, H_QOS,
                     H_RESPONSE_TOPIC, H_RETAIN, H_USER_PREFIX, H_USERNAME)

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

USER_PROPERTY = StructType([StructField("key", StringType()), StructField("value", StringType())])

#: The history table (``date`` is the partition column: the UTC day of accepted_at).
HISTORY_SCHEMA = StructType([
    StructField("message_id", StringType()),
    StructField("topic", StringType()),
    StructField("payload", BinaryType()),
    StructField("payload_text", StringType()),
    StructField("qos", IntegerType()),
    StructField("retain", BooleanType()),
    StructField("client_id", StringType()),
    StructField("username", StringType()),
    StructField("protocol", IntegerType()),
    StructField("accepted_at", TimestampType()),
    StructField("kafka_topic", StringType()),
    StructField("kafka_partition", IntegerType()),
    StructField("kafka_offset", LongType()),
    StructField("ingested_at", TimestampType()),
    StructField("content_type", StringType()),
    StructField("payload_format", IntegerType()),
    StructField("response_topic", StringType()),
    StructField("correlation_data", BinaryType()),
    StructField("message_expiry", LongType()),
    StructField("user_properties", ArrayType(USER_PROPERTY)),
    StructField("date", DateType()),
])

HISTORY_COLUMNS = [f.name for f in HISTORY_SCHEMA.fields]
PARTITION_COLUMN = "date"


def _header_bytes(name: str) -> str:
    """SQL for the first header called ``name`` (binary), NULL when absent."""
    return f"try_element_at(filter(headers, h -> h.key = '{name}'), 1).value"


def _header_text(name: str) -> str:
    return f"CAST({_header_bytes(name)} AS STRING)"


def history_select_exprs() -> list[str]:
    """Spark SQL expressions (in HISTORY_SCHEMA order) over KAFKA_SCHEMA rows.

    Malformed numbers in headers become NULL (try_cast) instead of failing the stream.
    A record without ``mqtt.message_id`` (not written by our forwarder) gets a stable id
    derived from its Kafka coordinates, so replays of it still deduplicate.
    """
    n = len(H_USER_PREFIX)
    return [
        f"coalesce({_header_text(H_MESSAGE_ID)}, "
        f"concat('kafka:', topic, ':', partition, ':', offset)) AS message_id",
        "CAST(key AS STRING) AS topic",
        "value AS payload",
        "try_validate_utf8(CAST(value AS STRING)) AS payload_text",
        f"try_cast({_header_text(H_QOS)} AS INT) AS qos",
        f"({_header_text(H_RETAIN)} IN ('1', 'true')) AS retain",
        f"{_header_text(H_CLIENT_ID)} AS client_id",
        f"{_header_text(H_USERNAME)} AS username",
        f"try_cast({_header_text(H_PROTOCOL)} AS INT) AS protocol",
        "timestamp AS accepted_at",
        "topic AS kafka_topic",
        "partition AS kafka_partition",
        "offset AS kafka_offset",
        "current_timestamp() AS ingested_at",
        f"{_header_text(H_CONTENT_TYPE)} AS content_type",
        f"try_cast({_header_text(H_PAYLOAD_FORMAT)} AS INT) AS payload_format",
        f"{_header_text(H_RESPONSE_TOPIC)} AS response_topic",
        f"{_header_bytes(H_CORRELATION_DATA)} AS correlation_data",
        f"try_cast({_header_text(H_MESSAGE_EXPIRY)} AS BIGINT) AS message_expiry",
        f"transform(filter(headers, h -> startswith(h.key, '{H_USER_PREFIX}')), "
        f"h -> named_struct('key', substring(h.key, {n + 1}), 'value', CAST(h.value AS STRING))) "
        "AS user_properties",
        "to_date(timestamp) AS date",  # session time zone is UTC (sink.spark)
    ]


def to_history(kafka_df):
    """Kafka-shaped DataFrame (batch or streaming) -> history rows, in HISTORY_SCHEMA order."""
    return kafka_df.selectExpr(*history_select_exprs())
