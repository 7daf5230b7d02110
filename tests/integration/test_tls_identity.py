"""use_identity_as_username on TLS and WSS listeners: the user name comes from the verified
client certificate, and a client without one is refused (never trusted with a claimed name)."""
from __future__ import annotations

import socket
import ssl
import time

import pytest
from websockets.sync.client import connect as ws_connect

from broker.protocol import packets as P
from broker.protocol.codec import Decoder, encode
from tests.conftest import BrokerProcess, free_port
from tests.integration.test_listeners import certs  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def identity_broker(tmp_path_factory, certs):  # noqa: F811
    tmp = tmp_path_factory.mktemp("identity")
    tls_port, wss_port = free_port(), free_port()
    acl = tmp / "acl"
    acl.write_text("pattern readwrite devices/%u/#\n")
    cfg = tmp / "b.toml"
    cfg.write_text(f"""
[auth]
acl_file = "{acl}"

[[listeners]]
type = "tls"
port = {tls_port}
certfile = "{certs / 'server.pem'}"
cafile = "{certs / 'ca.pem'}"
require_client_cert = false
use_identity_as_username = true

[[listeners]]
type = "wss"
port = {wss_port}
certfile = "{certs / 'server.pem'}"
cafile = "{certs / 'ca.pem'}"
use_identity_as_username = true
""")
    b = BrokerProcess(tmp, args=["--config", str(cfg)]).start()
    time.sleep(0.3)
    b.tls_port, b.wss_port = tls_port, wss_port
    yield b
    b.stop()


def client_ctx(certs, with_cert: bool) -> ssl.SSLContext:  # noqa: F811
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    if with_cert:
        ctx.load_cert_chain(str(certs / "client.pem"))
    return ctx


def exchange(send, recv, level: int, user: str) -> list:
    """CONNECT claiming `user`, then SUBSCRIBE; the packets back until 2 or closed."""
    send(encode(P.Connect("idtest", level, username=user, password=b"x"), level)
         + encode(P.Subscribe(1, [("devices/device-7/x", P.SubscriptionOptions(1)),
                                  ("devices/other/x", P.SubscriptionOptions(1))]), level))
    d = Decoder(level)
    pkts = []
    while len(pkts) < 2:
        data = recv()
        if not data:
            break
        got, err = d.feed(data)
        assert err is None
        pkts += got
    return pkts


def over_tls(port, ctx, level, user):
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    s = ctx.wrap_socket(raw, server_hostname="localhost")
    try:
        def recv():
            try:
                return s.recv(4096)
            except (ConnectionError, ssl.SSLError):
                return b""
        return exchange(s.sendall, recv, level, user)
    finally:
        s.close()


def over_wss(port, ctx, level, user):
    with ws_connect(f"wss://localhost:{port}/mqtt", ssl=ctx, subprotocols=["mqtt"],
                    open_timeout=10) as ws:
        def recv():
            try:
                return ws.recv(timeout=10)
            except Exception:  # closed by the broker
                return b""
        return exchange(ws.send, recv, level, user)


@pytest.mark.parametrize("over", [over_tls, over_wss], ids=["tls", "wss"])
def test_certificate_name_is_the_user_name(identity_broker, certs, over):  # noqa: F811
    port = identity_broker.tls_port if over is over_tls else identity_broker.wss_port
    # the certificate says device-7 whatever user name the client claims
    pkts = over(port, client_ctx(certs, True), P.MQTT_5, "someone-else")
    assert pkts[0].type == P.CONNACK and pkts[0].reason_code == 0
    assert pkts[1].reason_codes == [1, 0x87]  # %u = the certificate's CN "device-7"


@pytest.mark.parametrize("over", [over_tls, over_wss], ids=["tls", "wss"])
def test_no_certificate_is_refused_not_trusted(identity_broker, certs, over):  # noqa: F811
    port = identity_broker.tls_port if over is over_tls else identity_broker.wss_port
    for level, code in ((P.MQTT_5, 0x87), (P.MQTT_311, 5)):
        # no certificate: claiming the certificate's name must not be enough
        pkts = over(port, client_ctx(certs, False), level, "device-7")
        assert [p.type for p in pkts] == [P.CONNACK], pkts   # no SUBACK: closed after CONNACK
        assert pkts[0].reason_code == code


def test_only_plain_tls_listeners_give_tls_session_tickets(certs):  # noqa: F811
    """broker/transport/tls.py: with TLS 1.3 session tickets on the wss listener, a client's
    upgrade request after the handshake was now and then never read (this file's wss tests
    timed out in 4 of 30 runs, in 0 of 35 without them)."""
    from broker.transport.tls import make_context
    from settings import ListenerConfig
    pem = str(certs / "server.pem")
    assert make_context(ListenerConfig(type="wss", port=1, certfile=pem)).num_tickets == 0
    assert make_context(ListenerConfig(type="tls", port=1, certfile=pem)).num_tickets > 0
