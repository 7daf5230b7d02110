"""The Kafka record contract's header names (docs/history.md "Kafka record schema" lists them with their
values): encoded by kafka_client/record.py for the broker's forwarder (sink/forward/forwarder.py)
and the cluster, read by the history job (sink/history/schema.py, source.py, verify.py). A leaf
module."""
import hmac

H_MESSAGE_ID = "mqtt.message_id"
H_CLIENT_ID = "mqtt.client_id"
H_USERNAME = "mqtt.username"
H_QOS = "mqtt.qos"
H_RETAIN = "mqtt.retain"
H_PROTOCOL = "mqtt.protocol"
H_PAYLOAD_FORMAT = "mqtt.payload_format"
H_CONTENT_TYPE = "mqtt.content_type"
H_RESPONSE_TOPIC = "mqtt.response_topic"
H_CORRELATION_DATA = "mqtt.correlation_data"
H_MESSAGE_EXPIRY = "mqtt.message_expiry"
H_USER_PREFIX = "mqtt.user."

#: The last header of every record the forwarder sends (kafka_client/record.py sign_body): the
#: broker's signature, 20 bytes = key id (4, settings.secrets.key_id) + HMAC-SHA256 (first 16 bytes)
#: keyed by settings.secrets.derive(key, RECORDS) over
#:     u16 len(kafka topic) | kafka topic | i64 timestamp ms | the record from its keyLength
#:     varint up to this header (the header count includes it)
#: all big-endian. The history job drops records without a valid one (sink/history/verify.py),
#: so a process that can reach Kafka cannot add rows to the history.
H_SIG = "mqtt.sig"
SIG_LEN = 20


def signature_mac(key: bytes) -> hmac.HMAC:
    """HMAC-SHA256 with the key already set up: the signer and the checker copy it for each
    record, about 0.6 us less a record than hmac.digest, which sets the key up every time
    (bench/signatures.py prints both sides' cost)."""
    return hmac.new(key, digestmod="sha256")
