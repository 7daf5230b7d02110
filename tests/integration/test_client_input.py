"""What a client chooses, through real sockets and a real broker process: its log cannot be
forged or flooded, anonymous clients from other machines are refused by default, the worst
packets within the limits are refused or served without stopping other clients, and a CONNACK
never exceeds the client's Maximum Packet Size."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from broker.protocol import packets as P
from broker.protocol import properties as PR
from broker.protocol import reason_codes as rc
from broker.protocol.codec import encode
from tests.conftest import BrokerProcess
from tests.integration.helpers import cid, connect, expect_disconnect
from tests.mqtt_raw import RawClient


def lean(tmp_path, settings=None, args=None, level="INFO") -> BrokerProcess:
    return BrokerProcess(tmp_path, settings={"persistence.enabled": False, "metrics.sys_interval": 0,
                                             **(settings or {})}, args=args, log_level=level).start()


def wait_log(b: BrokerProcess, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = b.logs()
        if text in logs:
            return logs
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in the broker's log:\n{b.logs()[-3000:]}")


# ---------------------------------------------------------------- the log

def test_log_cannot_be_forged_or_flooded_by_client_ids(tmp_path):
    """A client id with a newline and a forged log line is refused (0x85) and logged escaped on
    one line; 300 connections with 65,000-character ids, each closed for a malformed PUBLISH,
    add a bounded amount of log (before: 18.6 MiB in 1.1 s) and one line counting what was left
    out."""
    b = lean(tmp_path)
    try:
        forged = "x\n2030-01-01 00:00:00,000 INFO broker: FORGED admin logged in"
        c = RawClient(b.port)
        assert c.connect(forged).reason_code == rc.CLIENT_IDENTIFIER_NOT_VALID
        c.close()
        wait_log(b, "contains control characters")
        assert not any(line.startswith("2030-01-01") for line in b.logs().splitlines())
        before = b.log_path.stat().st_size
        for i in range(300):
            s = socket.create_connection(("127.0.0.1", b.port), timeout=10)
            s.sendall(encode(P.Connect(f"{i:03d}" + "z" * 64997, P.MQTT_5)))
            s.sendall(b"\x30\x02\x00\x05")  # PUBLISH whose topic runs past its end: malformed
            try:
                while s.recv(65536):
                    pass
            except OSError:
                pass
            s.close()
        connect(b.port).close()  # the broker still serves
        time.sleep(11)  # one summary every 10 s (clientlog.SUMMARY_INTERVAL), at a tick
        connect(b.port).close()
        logs = wait_log(b, "log lines about clients left out")
        added = b.log_path.stat().st_size - before
        assert added < 300 * 1000, f"{added} bytes of log for 300 connections"
        assert "z" * 300 not in logs and "...(+64,800 chars)" in logs
    finally:
        b.stop()


# ---------------------------------------------------------------- who may connect

def outside_address() -> str | None:
    """An address of this machine other than loopback (the source address towards a public
    one; no packet is sent), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def test_anonymous_clients_from_other_machines_need_allow_anonymous(tmp_path):
    """`python -m broker --host 0.0.0.0` without a password file: a client without a user name
    connecting to a non-loopback address of the machine gets CONNACK 0x87 (3.1.1: return code
    5); from 127.0.0.1 it connects; the start log says what is open to whom. With
    auth.allow_anonymous = true it connects from anywhere."""
    ip = outside_address()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect to")
    b = lean(tmp_path, args=["--host", "0.0.0.0"])
    try:
        logs = wait_log(b, "listening for MQTT (tcp) on 0.0.0.0")
        assert "reachable from other machines" in logs and \
            "anonymous clients from this machine only" in logs
        far = RawClient(b.port, host=ip)
        ack = far.connect(cid("far"))
        assert ack.reason_code == rc.NOT_AUTHORIZED
        assert "auth.allow_anonymous" in ack.properties[PR.REASON_STRING]
        old = RawClient(b.port, host=ip, level=P.MQTT_311)
        assert old.connect(cid("far4")).reason_code == rc.V4_NOT_AUTHORIZED
        connect(b.port).close()  # loopback: accepted
    finally:
        b.stop()
    b = lean(tmp_path, settings={"auth.allow_anonymous": True}, args=["--host", "0.0.0.0"])
    try:
        assert "anonymous clients from anywhere" in wait_log(b, "listening for MQTT (tcp)")
        far = RawClient(b.port, host=ip)
        assert far.connect(cid("far")).reason_code == 0
        far.close()
    finally:
        b.stop()


def test_default_broker_listens_on_loopback_only(tmp_path):
    """Without --host the MQTT listener is bound to 127.0.0.1 (Mosquitto 2's default)."""
    b = BrokerProcess(tmp_path, settings={"persistence.enabled": False})
    b.cmd[b.cmd.index("--host"):b.cmd.index("--host") + 2] = []
    b.start()
    try:
        logs = wait_log(b, "listening for MQTT (tcp) on 127.0.0.1")
        assert "this machine only" in logs
        ip = outside_address()
        if ip is not None:
            with pytest.raises(OSError):
                socket.create_connection((ip, b.port), timeout=2).close()
    finally:
        b.stop()


# ---------------------------------------------------------------- the worst packets

def test_user_property_flood_refused_while_others_are_served(tmp_path):
    """The hostile PUBLISH of 4,000,000 empty User Properties (19 MiB) is refused from its fixed
    header (DISCONNECT 0x95: over the 1 MiB default); the most that fits in 1 MiB is refused
    after max_user_properties (DISCONNECT 0x97). Another client's PINGREQs are answered
    throughout (the stall is measured by bench/stall.py, not asserted here)."""
    b = lean(tmp_path)
    try:
        pinger = connect(b.port, cid("pinger"))
        answered = []
        stop = threading.Event()

        def ping():
            while not stop.is_set():
                pinger.send(P.PingReq())
                answered.append(pinger.recv(10).type == P.PINGRESP)

        t = threading.Thread(target=ping, daemon=True)
        t.start()
        huge = encode(P.Publish("flood", b"", properties={PR.USER_PROPERTY: [("", "")] * 4_000_000}))
        c = connect(b.port)
        try:
            c.sock.sendall(huge)
        except OSError:
            pass  # closed once the header was read: expected
        expect_disconnect(c, rc.PACKET_TOO_LARGE)
        fits = encode(P.Publish("flood", b"", properties={PR.USER_PROPERTY: [("", "")] * 200_000}))
        assert len(fits) <= 1 << 20
        c = connect(b.port)
        try:
            c.sock.sendall(fits)
        except OSError:
            pass
        expect_disconnect(c, rc.QUOTA_EXCEEDED)
        stop.set()
        t.join(10)
        assert answered and all(answered)
    finally:
        b.stop()


def test_connack_never_exceeds_the_clients_maximum_packet_size(tmp_path):
    """Mosquitto's 12-max-packet-connect: a CONNECT with Maximum Packet Size 2 gets no CONNACK
    (no packet fits): the connection is closed; a client allowing the CONNACK's size gets it."""
    b = lean(tmp_path)
    try:
        s = socket.create_connection(("127.0.0.1", b.port), timeout=5)
        s.sendall(encode(P.Connect(cid("tiny"), P.MQTT_5, properties={PR.MAXIMUM_PACKET_SIZE: 2})))
        assert s.recv(100) == b""  # closed without a CONNACK (before: 11 bytes)
        s.close()
        c = RawClient(b.port)
        assert c.connect(cid("ok"), properties={PR.MAXIMUM_PACKET_SIZE: 16}).reason_code == 0
        c.close()
    finally:
        b.stop()
