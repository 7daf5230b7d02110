"""TLS and WebSocket listeners carry QoS 0/1/2; metrics, health and $SYS match the traffic."""
import json
import ssl
import threading
import time
import urllib.request

import paho.mqtt.client as mqtt
import pytest
import trustme

from tests.conftest import BrokerProcess, free_port


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    server_cert = ca.issue_cert("localhost", "127.0.0.1")
    server_cert.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    client = ca.issue_cert("device-7")
    client.private_key_and_cert_chain_pem.write_to_path(str(d / "client.pem"))
    return d


@pytest.fixture(scope="module")
def multi(tmp_path_factory, certs):
    tmp = tmp_path_factory.mktemp("multi")
    tls_port, ws_port, wss_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    cfg = tmp / "broker.toml"
    cfg.write_text(f"""
[metrics]
enabled = true
host = "127.0.0.1"
port = {metrics_port}
sys_interval = 1

[[listeners]]
type = "tls"
port = {tls_port}
certfile = "{certs / 'server.pem'}"
cafile = "{certs / 'ca.pem'}"

[[listeners]]
type = "ws"
port = {ws_port}
path = "/mqtt"

[[listeners]]
type = "wss"
port = {wss_port}
certfile = "{certs / 'server.pem'}"
""")
    b = BrokerProcess(tmp, args=["--config", str(cfg)]).start()
    time.sleep(0.5)
    b.tls_port, b.ws_port, b.wss_port, b.metrics_port = tls_port, ws_port, wss_port, metrics_port
    yield b
    b.stop()


def paho_client(cid, transport="tcp", protocol=mqtt.MQTTv5):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=protocol,
                    transport=transport)
    got = []
    done = threading.Event()

    def on_message(client, userdata, msg):
        got.append((msg.topic, msg.payload, msg.qos))
        done.set()
    c.on_message = on_message
    c.got = got
    return c


def roundtrip(make, port, certs_dir=None):
    """Subscriber and publisher over the same kind of listener, QoS 0, 1 and 2."""
    sub = make("sub")
    pub = make("pub")
    for c in (sub, pub):
        c.connect("127.0.0.1" if certs_dir is None else "localhost", port)
        c.loop_start()
    try:
        sub.subscribe("t/#", qos=2)
        time.sleep(0.3)
        for q in (0, 1, 2):
            pub.publish(f"t/{q}", f"m{q}".encode(), qos=q).wait_for_publish(5)
        deadline = time.time() + 5
        while len(sub.got) < 3 and time.time() < deadline:
            time.sleep(0.05)
        return sorted(sub.got)
    finally:
        for c in (sub, pub):
            c.loop_stop()
            c.disconnect()


EXPECTED = [("t/0", b"m0", 0), ("t/1", b"m1", 1), ("t/2", b"m2", 2)]


def test_tls_listener_carries_qos_0_1_2(multi, certs):
    def make(cid):
        c = paho_client(cid)
        c.tls_set(ca_certs=str(certs / "ca.pem"))
        return c
    assert roundtrip(make, multi.tls_port, certs) == EXPECTED


def test_tls_rejects_untrusted_client_handshake(multi, certs):
    ctx = ssl.create_default_context()  # does not trust our test CA
    import socket
    with socket.create_connection(("127.0.0.1", multi.tls_port)) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            ctx.wrap_socket(raw, server_hostname="localhost")


def test_websocket_listener_carries_qos_0_1_2(multi):
    def make(cid):
        c = paho_client(cid, transport="websockets")
        c.ws_set_options(path="/mqtt")
        return c
    assert roundtrip(make, multi.ws_port) == EXPECTED


def test_secure_websocket_and_311(multi, certs):
    def make(cid):
        c = paho_client(cid, transport="websockets", protocol=mqtt.MQTTv311)
        c.ws_set_options(path="/mqtt")
        c.tls_set(ca_certs=str(certs / "ca.pem"))
        return c
    assert roundtrip(make, multi.wss_port, certs) == EXPECTED


def test_websocket_wrong_path_is_404(multi):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", multi.ws_port, timeout=5)
    conn.request("GET", "/other", headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                           "Sec-WebSocket-Version": "13"})
    assert conn.getresponse().status == 404


def test_metrics_health_and_sys_match_traffic(multi):
    def scrape():
        body = urllib.request.urlopen(f"http://127.0.0.1:{multi.metrics_port}/metrics", timeout=5).read()
        vals = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                vals[k] = float(v)
        return vals
    before = scrape()
    sub = paho_client("m-sub")
    sub.connect("127.0.0.1", multi.port)
    sub.loop_start()
    sub.subscribe("$SYS/broker/messages/received")
    sub.subscribe("metrics/t", qos=1)
    time.sleep(0.3)
    pub = paho_client("m-pub")
    pub.connect("127.0.0.1", multi.port)
    pub.loop_start()
    for _ in range(7):
        pub.publish("metrics/t", b"x", qos=1).wait_for_publish(5)
    time.sleep(2.5)  # let a $SYS interval pass
    after = scrape()
    assert after['mqtt_messages_received_total{qos="1"}'] - before.get('mqtt_messages_received_total{qos="1"}', 0) == 7
    assert after['mqtt_messages_sent_total{qos="1"}'] - before.get('mqtt_messages_sent_total{qos="1"}', 0) == 7
    assert after["mqtt_connections"] >= 2
    sys_vals = [int(p) for t, p, q in sub.got if t == "$SYS/broker/messages/received"]
    assert sys_vals and max(sys_vals) >= 7
    health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{multi.metrics_port}/health",
                                               timeout=5).read())
    assert health["status"] == "ok" and health["connections"] >= 2
    for c in (sub, pub):
        c.loop_stop()
        c.disconnect()


def _tls_connect_raw(port, ctx):
    import socket
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def test_client_certificate_required_and_used_as_username(tmp_path, certs):
    """require_client_cert: no certificate, no handshake; with use_identity_as_username the
    certificate's CN is the user name, so an ACL on %u applies to it."""
    from broker.protocol import packets as P
    from broker.protocol.codec import Decoder, encode
    port = free_port()
    acl = tmp_path / "acl"
    acl.write_text("pattern readwrite devices/%u/#\n")
    cfg = tmp_path / "b.toml"
    cfg.write_text(f"""
[auth]
acl_file = "{acl}"

[[listeners]]
type = "tls"
port = {port}
certfile = "{certs / 'server.pem'}"
cafile = "{certs / 'ca.pem'}"
require_client_cert = true
use_identity_as_username = true
""")
    b = BrokerProcess(tmp_path, args=["--config", str(cfg)]).start()
    try:
        time.sleep(0.3)
        anon = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        try:  # TLS 1.2 fails the handshake; TLS 1.3 reports it on the first read
            s = _tls_connect_raw(port, anon)
            s.sendall(encode(P.Connect("nocert", 5), 5))
            data = s.recv(10)
        except (ssl.SSLError, OSError):
            data = b""
        assert data == b"", "a client without a certificate must get no CONNACK"
        ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        ctx.load_cert_chain(str(certs / "client.pem"))
        s = _tls_connect_raw(port, ctx)
        s.sendall(encode(P.Connect("dev", 5), 5)
                  + encode(P.Subscribe(1, [("devices/device-7/x", P.SubscriptionOptions(1)),
                                          ("devices/other/x", P.SubscriptionOptions(1))]), 5))
        d = Decoder(5)
        pkts = []
        while len(pkts) < 2:
            got, err = d.feed(s.recv(4096))
            assert err is None
            pkts += got
        assert pkts[0].type == P.CONNACK and pkts[0].reason_code == 0
        assert pkts[1].reason_codes == [1, 0x87]  # %u = the certificate's CN "device-7"
        s.close()
    finally:
        b.stop()


def test_sighup_reloads_certificate_without_dropping_connections(tmp_path):
    """SIGHUP: new handshakes get the new certificate; open connections keep working."""
    import signal

    from broker.protocol import packets as P
    ca1, ca2 = trustme.CA(), trustme.CA()
    pem = tmp_path / "server.pem"
    ca1.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(pem))
    port = free_port()
    cfg = tmp_path / "b.toml"
    cfg.write_text(f'[[listeners]]\ntype = "tls"\nport = {port}\ncertfile = "{pem}"\n')
    b = BrokerProcess(tmp_path, args=["--config", str(cfg)]).start()
    try:
        time.sleep(0.3)
        ctx1 = ssl.create_default_context()
        ca1.configure_trust(ctx1)
        ctx2 = ssl.create_default_context()
        ca2.configure_trust(ctx2)
        from broker.protocol.codec import encode
        old = _tls_connect_raw(port, ctx1)
        old.sendall(encode(P.Connect("old", 5), 5))
        assert old.recv(100)[:1] == b"\x20"
        ca2.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(pem))
        b.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        with pytest.raises(ssl.SSLCertVerificationError):
            _tls_connect_raw(port, ctx1)  # the old CA no longer matches
        new = _tls_connect_raw(port, ctx2)
        new.sendall(encode(P.Connect("new", 5), 5))
        assert new.recv(100)[:1] == b"\x20"
        old.sendall(encode(P.PingReq(), 5))
        assert old.recv(10) == b"\xd0\x00"  # the connection opened before the reload still works
        assert "reloaded TLS certificate" in b.logs()
    finally:
        b.stop()
