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
