"""What a Connection asks its caller to do: returned by Connection.data_received() and
Connection.auth_done() (h11 / mqttproto style: bytes in, bytes + events out).

Output bytes accumulate in Connection.out (the caller writes them once per turn, see
take_output()); events are decisions the core cannot take alone because they need time or
I/O: a slow password hash, a message becoming durable, a cluster's claim on a client id. The
common paths (QoS 0, and QoS 1/2 when nothing waits on durability) produce no event object at
all, and acks that wait make one event per read, not one per message.
"""
from __future__ import annotations

from typing import NamedTuple, Union

from ..protocol.packets import Suback

NO_EVENTS: tuple[()] = ()  # what data_received returns on the fast path (shared, never mutated)


class AuthRequested(NamedTuple):
    """Check the CONNECT's user name and password off the event loop, then call
    conn.auth_done(connect, client_id, assigned, code[, why]). Until then the packets that
    follow wait inside the connection, bounded [MQTT-3.1.4-5]."""
    connect: object
    client_id: str
    assigned: str | None  # the client id the broker assigned, or None


# An acknowledgement held for durability, not yet encoded (Connection.acks_done encodes it once,
# as a success or as a failure): a PUBACK, PUBREC, PUBREL or PUBCOMP as one int holding its
# (packet type, packet id, reason code), held_ack() and ack_fields(): a tuple per message would
# cost the compiled core 5% more instructions per QoS 1 message (an object the garbage collector
# tracks); a SUBACK as its packet (packet id, a reason code per filter, a Reason String)
HeldAck = Union[int, Suback]


def held_ack(ptype: int, packet_id: int, code: int) -> int:
    """The int Connection holds for an ack (its compiled code writes the expression inline)."""
    return (ptype << 24) | (packet_id << 8) | code


def ack_fields(ack: int) -> tuple[int, int, int]:
    """(packet type, packet id, reason code) of a held_ack()."""
    return ack >> 24, (ack >> 8) & 0xFFFF, ack & 0xFF


class AcksHeld:
    """Acknowledgements that must wait until what they acknowledge is durable: PUBACK/PUBREC of
    accepted QoS 1/2 PUBLISHes, a persistent session's SUBACK, PUBREL and PUBCOMP (`acks`,
    HeldAck records, in order).
    One per read, however many messages it had: the caller asks the hooks providing barrier()
    for their tokens once (core/durability.py) and then calls conn.acks_done(acks, failure):
    failure None sends them as they are, a reason sends failures (v5 0x80, a SUBACK 0x80 per
    filter, 3.1.x closes)."""
    __slots__ = ("acks", "subacks")

    def __init__(self, ack: HeldAck):
        self.acks = [ack]
        self.subacks = 0  # SUBACKs, PUBRELs, PUBCOMPs among them (not counted against Receive Maximum)

    def __repr__(self) -> str:
        return f"AcksHeld({len(self.acks)} acks, {self.subacks} SUBACKs)"


class AdmitRequested(NamedTuple):
    """The CONNECT passed its checks; the hook providing admit() (the cluster: a claim on the
    client id through Kafka) holds it until `token` (core/durability.py) resolves. Then call
    conn.admit_done(connect, client_id, assigned, token.failure); packets that follow wait
    inside the connection meanwhile, as for AuthRequested."""
    token: object
    connect: object
    client_id: str
    assigned: str | None
