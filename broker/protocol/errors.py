"""Errors raised by the codec and the session core; each carries its MQTT 5 reason code."""
from . import reason_codes as rc


class MQTTError(Exception):
    """A violation that ends the connection with `reason_code` (DISCONNECT in v5, close in 3.1.1)."""
    reason_code = rc.UNSPECIFIED_ERROR

    def __init__(self, message: str, reason_code: int | None = None):
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code


class MalformedPacket(MQTTError):
    reason_code = rc.MALFORMED_PACKET


class ProtocolError(MQTTError):
    reason_code = rc.PROTOCOL_ERROR
