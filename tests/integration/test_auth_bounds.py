"""Password checks cannot stall the loop or grow memory: through real sockets, broker in-process.

The scrypt function is wrapped (monkeypatch) to record which thread ran each hash, how many
checks were pending at that moment, and, where a test needs it, to hold the checks until the
test opens a gate: assertions are about where and how often checks run, never wall times.
"""
from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from broker.auth import AccessControl, hash_password
from broker.auth import passwords as pwmod
from broker.auth.checks import THREAD_NAME
from broker.protocol.codec import encode
from broker.server import Server
from settings import AuthConfig, Config, MetricsConfig
from tests.integration.helpers import P, RawClient, bye
from tests.integration.test_auth import InProcessBroker


class Broker(InProcessBroker):
    def __init__(self, hook, **cfg):
        """hook: the auth hook; cfg: sections of the Config (auth=AuthConfig(...): the bounds)."""
        super().__init__(hook)
        self.server = Server(Config(host="127.0.0.1", port=0, **cfg), auth=hook)


class Recorder:
    """Wraps passwords._scrypt: who ran it, with how many checks pending; optionally gated."""

    def __init__(self, monkeypatch, gated: bool = False):
        self.calls: list[tuple[str, int]] = []
        self.server = None
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        real = pwmod._scrypt

        def scrypt(*a, **kw):
            q = getattr(self.server, "auth_checks", None)
            self.calls.append((threading.current_thread().name, q.pending if q else -1))
            self.gate.wait(60)
            return real(*a, **kw)

        monkeypatch.setattr(pwmod, "_scrypt", scrypt)


def wait_for(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def pwfile(tmp_path):
    pw = tmp_path / "passwd"
    pw.write_text(f"alice:{hash_password('secret')}\n")  # default (production) scrypt cost
    return pw


def test_connect_with_user_name_and_no_password_is_hashed_off_the_loop(pwfile, monkeypatch):
    """A user name without a password (and an unknown user without one) costs a (dummy) scrypt:
    it must run on the check threads, not on the event loop thread."""
    rec = Recorder(monkeypatch)
    b = Broker(AccessControl(password_file=str(pwfile), cache_seconds=0)).start()
    try:
        other = RawClient(b.port)
        assert other.connect("other", username="alice", password=b"secret").reason_code == 0
        for level, user in ((P.MQTT_5, "alice"), (P.MQTT_311, "alice"), (P.MQTT_5, "nobody")):
            c = RawClient(b.port, level=level)
            ack = c.connect(f"np-{user}-{level}", username=user)  # no password
            assert ack.reason_code == (0x86 if level == P.MQTT_5 else 4)
            c.close()
        other.send(P.PingReq())
        assert other.recv_type(P.PINGRESP, timeout=10)
        threads = {name for name, _ in rec.calls}
        assert len(rec.calls) == 4, rec.calls
        assert all(name.startswith(THREAD_NAME) for name in threads), threads
        bye(other)
    finally:
        b.stop()


def test_flood_of_wrong_passwords_is_bounded_and_a_good_connect_is_answered(pwfile, monkeypatch):
    """400 wrong-password CONNECTs at once, then a good one: at most max_pending_checks checks
    are ever pending, the rest get Server busy at once (0x89 / 3.1.1 code 3), and the good
    CONNECT is answered after at most that many checks, not after the whole flood."""
    bound = 16
    rec = Recorder(monkeypatch)
    auth = AccessControl(password_file=str(pwfile), cache_seconds=0)
    b = Broker(auth, auth=AuthConfig(max_pending_checks=bound, check_threads=2),
               metrics=MetricsConfig(enabled=True, host="127.0.0.1", port=0, sys_interval=0))
    rec.server = b.server
    b.start()
    flood = []
    try:
        for i in range(400):
            level = P.MQTT_311 if i % 4 == 0 else P.MQTT_5
            c = RawClient(b.port, level=level, timeout=60)
            c.send(P.Connect(f"bad{i}", level, username="alice", password=b"wrong%d" % i))
            flood.append(c)
        good = RawClient(b.port, timeout=60)
        code = good.connect("good", username="alice", password=b"secret").reason_code
        checks_before_good = len(rec.calls)
        assert code in (0, 0x89), hex(code)
        # without the bound the good CONNECT waits behind all 400 checks; with it, behind at
        # most `bound` (plus what the other thread starts meanwhile)
        assert checks_before_good <= bound + 2, checks_before_good
        codes = []
        for c in flood:
            ack = c.recv_type(P.CONNACK)
            v5 = c.level == P.MQTT_5
            busy, bad = (0x89, 0x86) if v5 else (3, 4)
            assert ack.reason_code in (busy, bad), ack
            codes.append(ack.reason_code == busy)
            assert c.expect_closed(30) == []
            c.close()
        refused_busy = sum(codes)
        print(f"\n400 wrong passwords: {400 - refused_busy} checked, {refused_busy} refused busy; "
              f"good CONNECT got 0x{code:02X} after {checks_before_good} checks")
        assert refused_busy > 0
        assert max(pending for _, pending in rec.calls) <= bound
        assert all(name.startswith(THREAD_NAME) for name, _ in rec.calls)
        # the flood is over: a good CONNECT is accepted
        wait_for(lambda: b.server.auth_checks.pending == 0, "the checks to finish")
        ok = RawClient(b.port, timeout=60)
        assert ok.connect("good2", username="alice", password=b"secret").reason_code == 0
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{b.server.ports['metrics']}/metrics", timeout=10).read().decode()
        values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                  if line.startswith("mqtt_auth_")}
        assert values["mqtt_auth_pending"] == 0
        assert values["mqtt_auth_refused_busy_total"] == refused_busy + (code == 0x89)
        # one hash per CONNECT that was checked (the flood's, the good ones), none for the refused
        assert len(rec.calls) == (400 - refused_busy) + (code == 0) + 1
        bye(ok, good)
    finally:
        for c in flood:
            c.close()
        b.stop()


def test_checks_of_clients_that_left_are_not_run(pwfile, monkeypatch):
    """Checks wait for a free thread; a client that closes its socket meanwhile costs no hash."""
    rec = Recorder(monkeypatch, gated=True)
    auth = AccessControl(password_file=str(pwfile), cache_seconds=0)
    b = Broker(auth, auth=AuthConfig(check_threads=2))
    rec.server = b.server
    b.start()
    try:
        socks = []
        for i in range(20):
            s = socket.create_connection(("127.0.0.1", b.port), timeout=30)
            s.sendall(encode(P.Connect(f"gone{i}", 5, username="alice", password=b"x%d" % i), 5))
            socks.append(s)
        wait_for(lambda: b.server.auth_checks.pending == 20, "20 pending checks")
        assert len(rec.calls) == 2  # two threads, both held at the gate
        for s in socks:
            s.close()
        wait_for(lambda: not b.server.broker.connections, "the broker to see the closes")
        rec.gate.set()
        c = RawClient(b.port, timeout=30)
        assert c.connect("after", username="alice", password=b"secret").reason_code == 0
        assert len(rec.calls) == 3, rec.calls   # the two running ones and this one
        assert b.server.auth_checks.skipped == 18
        bye(c)
    finally:
        rec.gate.set()
        b.stop()


@pytest.mark.parametrize("level", [P.MQTT_5, P.MQTT_311])
def test_bytes_sent_while_the_password_is_checked_are_capped(pwfile, monkeypatch, level):
    """Packets behind a CONNECT wait for its check in memory: past max_deferred_bytes the
    client gets CONNACK 0x97 Quota exceeded (3.1.1: 3) and is closed, before the check ends."""
    rec = Recorder(monkeypatch, gated=True)
    auth = AccessControl(password_file=str(pwfile), cache_seconds=0)
    b = Broker(auth, auth=AuthConfig(max_deferred_bytes=256 * 1024))
    rec.server = b.server
    b.start()
    try:
        c = RawClient(b.port, level=level, timeout=30)
        c.send(P.Connect("big", level, username="alice", password=b"secret"))
        wait_for(lambda: len(rec.calls) == 1, "the check to start")
        chunk = encode(P.Publish("t/x", b"x" * 100_000, 1, packet_id=1), level)

        def flood():
            try:
                for _ in range(30):     # 3 MB; the broker holds at most 256 KiB of it
                    c.sock.sendall(chunk)
            except OSError:
                pass
        t = threading.Thread(target=flood, daemon=True)
        t.start()
        ack = c.recv_type(P.CONNACK, timeout=20)   # while the check is still held
        assert ack.reason_code == (0x97 if level == P.MQTT_5 else 3), ack
        assert c.expect_closed(20) == []
        assert not rec.gate.is_set()
        t.join(20)
    finally:
        rec.gate.set()
        b.stop()


def test_cached_results_skip_the_queue_so_a_reconnect_storm_is_not_refused(pwfile, monkeypatch):
    """With a warm result cache no hash is needed: 50 reconnects at once are all accepted even
    with room for a single pending check, and cost no further hash."""
    rec = Recorder(monkeypatch)
    auth = AccessControl(password_file=str(pwfile))
    b = Broker(auth, auth=AuthConfig(max_pending_checks=1, check_threads=1))
    rec.server = b.server
    b.start()
    try:
        first = RawClient(b.port, timeout=30)
        assert first.connect("warm", username="alice", password=b"secret").reason_code == 0
        storm = [RawClient(b.port, timeout=30) for _ in range(50)]
        for i, c in enumerate(storm):
            c.send(P.Connect(f"storm{i}", 5, username="alice", password=b"secret"))
        assert [c.recv_type(P.CONNACK).reason_code for c in storm] == [0] * 50
        assert len(rec.calls) == 1
        assert b.server.auth_checks.refused == 0
        bye(first, *storm)
    finally:
        b.stop()
