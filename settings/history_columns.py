"""Names of the history table's columns, as plain strings with no imports: a leaf that the
broker's dashboard (which never loads pyspark, and may not import sink/) and
sink/history/schema.py both use, so the names are spelled once."""

TABLE = "messages"
TOPIC = "topic"
PAYLOAD = "payload"
PAYLOAD_TEXT = "payload_text"
PAYLOAD_JSON = "payload_json"
QOS = "qos"
RETAIN = "retain"
CLIENT_ID = "client_id"
ACCEPTED_AT = "accepted_at"
KAFKA_OFFSET = "kafka_offset"
DATE = "date"   # the partition column: the UTC day of accepted_at

#: The table's columns and their Spark SQL types, in order (sink/history/schema.py's
#: HISTORY_SCHEMA, which tests/unit/test_rules_admin.py compares with this): what the admin API
#: gives the SQL of a continuous rule to check it against (an empty ``messages``).
COLUMN_TYPES = (
    ("message_id", "STRING"), (TOPIC, "STRING"), (PAYLOAD, "BINARY"), (PAYLOAD_TEXT, "STRING"),
    (QOS, "INT"), (RETAIN, "BOOLEAN"), (CLIENT_ID, "STRING"), ("username", "STRING"),
    ("protocol", "INT"), (ACCEPTED_AT, "TIMESTAMP"), ("kafka_topic", "STRING"),
    ("kafka_partition", "INT"), (KAFKA_OFFSET, "BIGINT"), ("ingested_at", "TIMESTAMP"),
    ("content_type", "STRING"), ("payload_format", "INT"), ("response_topic", "STRING"),
    ("correlation_data", "BINARY"), ("message_expiry", "BIGINT"),
    ("user_properties", "ARRAY<STRUCT<key: STRING, value: STRING>>"),
    (PAYLOAD_JSON, "VARIANT"), (DATE, "DATE"),
)
