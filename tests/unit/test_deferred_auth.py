"""The core's side of deferred password checks, without sockets: which CONNECTs are deferred
(an AuthRequested event), Server busy when the check queue is full, and the byte cap on what
waits for the CONNACK."""
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.broker import Broker
from broker.core.events import AuthRequested
from broker.core.hooks import AllowAll
from broker.protocol import packets as P
from broker.protocol.codec import Decoder, encode
from settings import MQTTConfig
from tests.unit.test_core import Client as CoreClient
from tests.unit.test_core import Clock


class Auth(AllowAll):
    pass


# per broker: the checks the fake caller queued, and whether it accepts more (the Broker may be
# compiled: it takes no attributes of a test's own)
CHECKS: dict[Broker, list] = {}
ACCEPT: dict[Broker, bool] = {}


class Client(CoreClient):
    """With a fake caller for AuthRequested: the check is queued (CHECKS[b]), or refused at once
    with Server busy when ACCEPT[b] is false (a full CheckQueue)."""

    def send(self, pkt):
        self.feed(encode(pkt, self.level))

    def feed(self, data):
        for ev in self.conn.data_received(data):
            assert type(ev) is AuthRequested
            b = self.conn.broker
            if ACCEPT[b]:
                CHECKS[b].append((self.conn, *ev))
            else:
                assert self.conn.auth_done(*ev, 0x89, "busy") == ()


def make(accept=True, cap=1 << 20):
    clock = Clock()
    b = Broker(MQTTConfig(), clock=clock, wall=clock, auth=Auth())
    CHECKS[b], ACCEPT[b] = [], accept
    b.defer_auth = True
    b.max_deferred_bytes = cap
    return b


def out(client, level=5):
    pkts, err = Decoder(level).feed(b"".join(bytes(x) for x in client.conn.take_output()))
    assert err is None
    return pkts


def test_user_name_without_password_is_deferred_anonymous_is_not():
    b = make()
    c = Client(b)
    c.send(P.Connect("u", 5, username="alice"))          # no password: still hashed
    assert len(CHECKS[b]) == 1 and out(c) == []
    anon = Client(b)
    anon.send(P.Connect("anon", 5))                      # no user name: no hash, inline
    assert len(CHECKS[b]) == 1 and out(anon)[0].reason_code == 0


def test_full_check_queue_refuses_with_server_busy():
    for level, code in ((5, 0x89), (4, 3)):
        b = make(accept=False)
        c = Client(b, level)
        c.send(P.Connect("u", level, username="alice", password=b"pw"))
        (ack,) = out(c, level)
        assert ack.type == P.CONNACK and ack.reason_code == code
        assert c.conn.close_requested and not c.conn.awaiting_auth()


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(50, 20_000), sizes=st.lists(st.integers(0, 3000), max_size=40),
       level=st.sampled_from([4, 5]))
def test_bytes_waiting_for_connack_are_capped(cap, sizes, level):
    """Refused with 0x97 (3.1.1: 3) exactly when the bytes received from the read carrying the
    CONNECT on exceed the cap; otherwise everything waits and runs after the CONNACK, in order."""
    b = make(cap=cap)
    c = Client(b, level)
    connect = encode(P.Connect("u", level, username="alice", password=b"pw"), level)
    c.feed(connect)
    total = len(connect)
    refused_at = None if total <= cap else 0
    if refused_at is None:
        for i, n in enumerate(sizes):
            data = encode(P.Publish("t", b"x" * n), level)
            c.feed(data)
            total += len(data)
            if total > cap:
                refused_at = i
                break
    pkts = out(c, level)
    if refused_at is not None:
        assert [(p.type, p.reason_code) for p in pkts] == [(P.CONNACK, 0x97 if level == 5 else 3)]
        assert c.conn.close_requested and c.conn.deferred is None
        CHECKS[b][0][0].auth_done(*CHECKS[b][0][1:], 0)  # the check ends after the close: ignored
        assert out(c, level) == []
    else:
        assert pkts == [] and len(c.conn.deferred) == len(sizes)
        conn, *args = CHECKS[b][0]
        conn.auth_done(*args, 0)
        assert [p.type for p in out(c, level)] == [P.CONNACK]
        assert c.conn.deferred is None


def test_too_many_packets_before_connack_get_quota_exceeded():
    from broker.core.connection import MAX_DEFERRED
    b = make()
    c = Client(b)
    c.send(P.Connect("u", 5, username="alice", password=b"pw"))
    c.feed(encode(P.PingReq(), 5) * (MAX_DEFERRED + 5))
    assert [(p.type, p.reason_code) for p in out(c)] == [(P.CONNACK, 0x97)]
    assert c.conn.close_requested
