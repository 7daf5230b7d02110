"""Persistent QoS 1 and QoS 2 publishers and subscribers that keep going across node deaths,
and the per-message account of what they saw: the load of the cluster's fault-injecting test
(tests/integration/test_cluster_faults.py) and benchmark (bench/cluster_faults.py).

Each client is a device given every node's address: when its connection breaks it reconnects
to the next live node with its persistent session (Clean Start 0) and goes on as MQTT says:

* a publisher sends one message at a time, numbered; a QoS 1 one is acknowledged by PUBACK, a
  QoS 2 one by PUBREC (then PUBREL / PUBCOMP). After a reconnection it sends again what was not
  acknowledged, with DUP 1 and the same packet id, or the PUBREL [MQTT-4.4.0-1].
* a subscriber delivers a QoS 2 message when its PUBLISH comes with a packet id it does not hold
  (it holds the id until the PUBREL: MQTT's Method B, the strictest for the broker: a message
  sent again as new is seen as delivered twice); a QoS 1 message at each PUBLISH.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable

from broker.protocol import packets as P
from broker.protocol import properties as PR
from tests.mqtt_raw import RawClient

EXPIRY = {PR.SESSION_EXPIRY_INTERVAL: 600}


class Device(threading.Thread):
    def __init__(self, cid: str, qos: int, ports: Callable[[], list[int]]) -> None:
        super().__init__(daemon=True, name=cid)
        self.cid, self.qos, self.ports = cid, qos, ports
        self.stopping = False
        self.error: BaseException | None = None
        self.reconnects: list[tuple[float, float]] = []  # (broken at, served again at)
        self.sessions_lost = 0
        self.c: RawClient | None = None

    def connect(self) -> RawClient:
        broke = time.monotonic()
        for _ in range(600):
            for port in self.ports():
                try:
                    c = RawClient(port, timeout=3)
                    ack = c.connect(self.cid, clean_start=False, properties=EXPIRY)
                    if ack.reason_code == 0:
                        if self.c is not None:
                            self.reconnects.append((broke, time.monotonic()))
                            if not ack.session_present:
                                self.sessions_lost += 1
                        self.c = c
                        self.resumed(bool(ack.session_present))
                        return c
                    c.close()
                except (OSError, TimeoutError, AssertionError, ValueError):
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.cid}: no node took the connection")

    def resumed(self, present: bool) -> None:
        pass

    def drop(self) -> None:
        """Its connection broken from outside (the device reconnects, to the first of ports())."""
        c = self.c
        if c is not None:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def run(self) -> None:
        try:
            self.connect()
            self.loop()
        except Exception as exc:  # reported by the caller
            self.error = exc
        finally:
            if self.c is not None:
                self.c.close()

    def loop(self) -> None:
        raise NotImplementedError


class Publisher(Device):
    """Publishes `topic`/<client id> messages numbered 1, 2, ... at about `rate` a second."""

    def __init__(self, cid: str, qos: int, ports: Callable[[], list[int]], topic: str,
                 rate: float) -> None:
        super().__init__(cid, qos, ports)
        self.topic = f"{topic}/{cid}"
        self.interval = 1.0 / rate
        self.sent_at: dict[int, float] = {}   # number -> first sent (monotonic)
        self.acked: dict[int, float] = {}     # number -> acknowledged (PUBACK / PUBREC)
        self.i = 0
        self.stage = ""                       # "pub": awaiting PUBACK/PUBREC, "rel": PUBCOMP

    def pid(self) -> int:
        return self.i % 65535 + 1

    def send(self, dup: bool) -> None:
        assert self.c is not None
        self.c.publish(self.topic, b"%d" % self.i, qos=self.qos, pid=self.pid(), dup=dup)

    def resumed(self, present: bool) -> None:
        if self.stage == "pub":
            self.send(dup=True)
        elif self.stage == "rel":
            assert self.c is not None
            self.c.send(P.Ack(P.PUBREL, self.pid()))

    def loop(self) -> None:
        nxt = time.monotonic()
        while not self.stopping or self.stage:
            try:
                if not self.stage:
                    now = time.monotonic()
                    if now < nxt:
                        time.sleep(nxt - now)
                    nxt = max(nxt + self.interval, time.monotonic() - 1.0)
                    self.i += 1
                    self.sent_at[self.i] = time.monotonic()
                    self.stage = "pub"
                    self.send(dup=False)
                assert self.c is not None
                p = self.c.recv(5)
                if p.packet_id != self.pid():
                    continue
                if self.stage == "pub" and p.type in (P.PUBACK, P.PUBREC):
                    if p.reason_code >= 0x80:  # refused: sent again as a new message
                        self.stage = ""
                        self.i -= 1
                        continue
                    self.acked[self.i] = time.monotonic()
                    if p.type == P.PUBACK:
                        self.stage = ""
                    else:
                        self.stage = "rel"
                        self.c.send(P.Ack(P.PUBREL, self.pid()))
                elif self.stage == "rel" and p.type == P.PUBCOMP:
                    self.stage = ""
            except (OSError, TimeoutError, ValueError):
                if self.c is not None:
                    self.c.close()
                self.connect()


class Subscriber(Device):
    """Subscribes to `topic`/# and records each delivery: (publisher, number, when)."""

    def __init__(self, cid: str, qos: int, ports: Callable[[], list[int]], topic: str) -> None:
        super().__init__(cid, qos, ports)
        self.filter = f"{topic}/#"
        self.got: list[tuple[str, int, float]] = []
        self.holding: set[int] = set()  # QoS 2 packet ids received, PUBREL not yet
        self.dup_resends = 0            # PUBLISHes of a held id (not delivered again)
        self.subscribed = False

    def resumed(self, present: bool) -> None:
        assert self.c is not None
        if not present:
            self.holding.clear()
        if not present or not self.subscribed:
            self.c.send(P.Subscribe(1, [(self.filter, P.SubscriptionOptions(self.qos))]))
            self.subscribed = True

    def loop(self) -> None:
        while not self.stopping:
            try:
                assert self.c is not None
                p = self.c.recv(0.5)
                if p.type == P.PUBLISH:
                    if p.qos == 2:
                        if p.packet_id in self.holding:
                            self.dup_resends += 1
                        else:
                            self.holding.add(p.packet_id)
                            self.deliver(p)
                        self.c.send(P.Ack(P.PUBREC, p.packet_id))
                    else:
                        self.deliver(p)
                        if p.qos == 1:
                            self.c.send(P.Ack(P.PUBACK, p.packet_id))
                elif p.type == P.PUBREL:
                    self.holding.discard(p.packet_id)
                    self.c.send(P.Ack(P.PUBCOMP, p.packet_id))
            except TimeoutError:
                continue
            except (OSError, ValueError):
                if self.c is not None:
                    self.c.close()
                self.connect()

    def deliver(self, p: P.Publish) -> None:
        self.got.append((p.topic.rsplit("/", 1)[1], int(p.payload), time.monotonic()))


def account(pubs: list[Publisher], subs: list[Subscriber]) -> dict:
    """Per message, at every subscriber of the publisher's QoS: acknowledged and never
    delivered, QoS 2 delivered more than once, QoS 1 duplicates, order per publisher broken
    (a first delivery numbered below an earlier one), and the delivery latencies (first send,
    first delivery - first send in s, QoS)."""
    out = {"acked": 0, "lost": 0, "qos2_twice": 0, "qos1_dups": 0, "out_of_order": 0,
           "dup_resends": sum(s.dup_resends for s in subs),
           "sessions_lost": sum(d.sessions_lost for d in pubs + subs), "lost_ids": [],
           "latencies": []}
    for s in subs:
        seen: dict[tuple[str, int], int] = {}
        last: dict[str, int] = {}
        for pub, i, _t in s.got:
            k = (pub, i)
            seen[k] = seen.get(k, 0) + 1
            if seen[k] > 1:
                continue
            if i < last.get(pub, 0):
                out["out_of_order"] += 1
            last[pub] = max(last.get(pub, 0), i)
        first = {}
        for pub, i, t in s.got:
            first.setdefault((pub, i), t)
        for pub in pubs:
            if pub.qos != s.qos:
                continue
            for i in pub.acked:
                out["acked"] += 1
                n = seen.get((pub.cid, i), 0)
                if n == 0:
                    out["lost"] += 1
                    if len(out["lost_ids"]) < 10:
                        out["lost_ids"].append((s.cid, pub.cid, i))
                elif n > 1:
                    out["qos2_twice" if s.qos == 2 else "qos1_dups"] += n - 1
            for i, t0 in pub.sent_at.items():
                t = first.get((pub.cid, i))
                if t is not None:
                    out["latencies"].append((t0, t - t0, pub.qos))
    return out


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * 0.99))]


def gap_after(devices: list[Device], at: float) -> float:
    """Failover: the longest time, over the devices whose connection broke after `at`, until
    one was served again (a new CONNACK)."""
    gaps = [back - at for d in devices for broke, back in d.reconnects if broke >= at - 0.5]
    return max(gaps, default=0.0)
