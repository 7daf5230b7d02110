"""What a Connection asks its caller to do: returned by Connection.data_received() and
Connection.auth_done() (h11 / mqttproto style: bytes in, bytes + events out).

Output bytes accumulate in Connection.out (the caller writes them once per turn, see
take_output()); events are decisions the core cannot take alone because they need time or
I/O: a slow password hash, or a message becoming durable. The common paths (QoS 0, and
QoS 1/2 when nothing waits on durability) produce no event object at all.
"""
from __future__ import annotations

from typing import NamedTuple

NO_EVENTS: tuple = ()  # what data_received returns on the fast path (shared, never mutated)


class AuthRequested(NamedTuple):
    """Check the CONNECT's user name and password off the event loop, then call
    conn.auth_done(connect, client_id, assigned, code[, why]). Until then the packets that
    follow wait inside the connection, bounded [MQTT-3.1.4-5]."""
    connect: object
    client_id: str
    assigned: str | None  # the client id the broker assigned, or None


class MessageAccepted(NamedTuple):
    """A QoS 1/2 PUBLISH was routed; its PUBACK/PUBREC (`ack`, already encoded) must wait
    until the message is durable: until the tokens of the hooks providing barrier() resolve
    (core/durability.py). The caller then calls conn.acks_done([ack, ...], failure) once:
    failure None sends them as they are, a reason string sends failures (v5 0x80, 3.1.x
    closes). A persistent session's SUBACK waits the same way (its failure: 0x80 per filter)."""
    packet_id: int
    ack: bytes


class AdmitRequested(NamedTuple):
    """The CONNECT passed its checks; the hook providing admit() (the cluster: a claim on the
    client id through Kafka) holds it until `token` (core/durability.py) resolves. Then call
    conn.admit_done(connect, client_id, assigned, token.failure); packets that follow wait
    inside the connection meanwhile, as for AuthRequested."""
    token: object
    connect: object
    client_id: str
    assigned: str | None
