"""Does a cluster keep acknowledged messages across a Kafka (Tansu) SIGKILL and restart, and what
does Tansu's storage engine cost? (docs/cluster.md "Cluster", the cluster's Kafka.)

    .venv/bin/python bench/cluster_storage.py                        # memory://tansu/ (the default)
    .venv/bin/python bench/cluster_storage.py --storage s3://tansu/  # AWS_ENDPOINT=... in the env
    .venv/bin/python bench/cluster_storage.py --storage postgres://user:pass@host/db

Starts Tansu with the storage engine given (its environment passed on: S3's AWS_* variables)
and two broker nodes on it, then:
* throughput: a QoS 1 publisher on n1 (a window of --window unacknowledged PUBLISHes), a
  subscriber on n2: messages acknowledged per second, and until the last is received;
* restart: a subscriber with a persistent session (QoS 1) goes away; --messages QoS 1 messages
  are published and acknowledged; Tansu is killed (SIGKILL) and started again on the same port
  and storage; the subscriber comes back (on n2) and counts what it gets within --wait seconds.
Prints one JSON line; exit 1 when an acknowledged message was lost.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from broker.protocol import packets as P  # noqa: E402
from broker.protocol import properties as PR  # noqa: E402
from kafka_client.embedded import tansu_binary  # noqa: E402
from tests.mqtt_raw import RawClient  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with code {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port} within {timeout} s")


class Tansu:
    def __init__(self, storage: str, log: str) -> None:
        self.storage, self.port, self.log = storage, free_port(), log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", self.storage], stdout=open(self.log, "ab"),
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")})
        try:
            wait_port(self.port, 15, self.proc, f"Tansu ({self.log})")
        except SystemExit as e:  # e.g. a storage engine this Tansu was built without
            with open(self.log, errors="replace") as f:
                last = [line for line in f.read().splitlines() if line.strip()][-1:]
            raise SystemExit(f"{e}: {' '.join(last)}") from None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


def node(tmp: str, name: str, kafka: str, key: str, prefix: str) -> tuple[subprocess.Popen, int]:
    """A broker node; it must listen within 180 s (it reads the cluster's topics first)."""
    port = free_port()
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    cmd = [sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", str(port),
           "--data-dir", d, "--log-level", os.environ.get("LOG_LEVEL", "INFO")]
    for k, v in {"cluster.enabled": "true", "cluster.node_id": name,
                 "cluster.bootstrap_servers": kafka, "cluster.topic_prefix": prefix,
                 "cluster.key_file": key}.items():
        cmd += ["--set", f"{k}={v}"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=open(os.path.join(tmp, f"{name}.log"), "ab"),
                         stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        wait_port(port, 180, p, f"node {name} ({os.path.join(tmp, name + '.log')})")
    except SystemExit:
        p.kill()
        raise
    return p, port


def connect(port: int, client_id: str, **kw) -> RawClient:
    deadline = time.monotonic() + 60
    while True:  # after a Kafka restart a CONNECT waits for the claim's round trip, or fails
        try:
            c = RawClient(port, timeout=10)
            ack = c.connect(client_id, **kw)
            if ack.reason_code == 0:
                c.connack = ack
                return c
            c.close()
        except (OSError, TimeoutError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"no CONNACK 0 on port {port} within 60 s")
        time.sleep(0.2)


def throughput(pub_port: int, sub_port: int, n: int, window: int) -> dict:
    topic = f"bench/{uuid.uuid4().hex[:8]}"
    sub = connect(sub_port, f"tsub-{uuid.uuid4().hex[:6]}")
    sub.subscribe(topic, qos=1)
    time.sleep(0.5)
    pub = connect(pub_port, f"tpub-{uuid.uuid4().hex[:6]}")
    payload = b"x" * 100
    t0 = time.monotonic()
    sent = acked = got = 0
    while acked < n:
        while sent < n and sent - acked < window:
            sent += 1
            pub.publish(topic, payload, qos=1, pid=(sent - 1) % 65000 + 1)
        p = pub.recv(30)
        if p.type == P.PUBACK:
            acked += 1
    t_ack = time.monotonic() - t0
    while got < n:
        p = sub.recv(30)
        if p.type == P.PUBLISH:
            got += 1
            sub.send(P.Ack(P.PUBACK, p.packet_id))
    t_all = time.monotonic() - t0
    pub.close()
    sub.close()
    return {"messages": n, "acked_per_s": round(n / t_ack), "delivered_per_s": round(n / t_all)}


def restart(tansu: Tansu, pub_port: int, sub_port: int, n: int, wait: float) -> dict:
    topic, me = f"keep/{uuid.uuid4().hex[:8]}", f"keep-{uuid.uuid4().hex[:6]}"
    sub = connect(pub_port, me, clean_start=False, properties={PR.SESSION_EXPIRY_INTERVAL: 3600})
    sub.subscribe(topic, qos=1)
    sub.send(P.Disconnect())
    sub.close()
    time.sleep(0.5)
    pub = connect(pub_port, f"kpub-{uuid.uuid4().hex[:6]}")
    for i in range(1, n + 1):
        pub.publish(topic, b"%d" % i, qos=1, pid=i)
        a = pub.recv_type(P.PUBACK, 30)
        assert a.packet_id == i and a.reason_code == 0, a
    pub.close()
    tansu.kill()
    t0 = time.monotonic()
    tansu.start()
    sub = connect(sub_port, me, clean_start=False, properties={PR.SESSION_EXPIRY_INTERVAL: 3600})
    t_back = time.monotonic() - t0
    got: set[int] = set()
    deadline = time.monotonic() + wait
    while len(got) < n and time.monotonic() < deadline:
        try:
            p = sub.recv(max(0.1, deadline - time.monotonic()))
        except (TimeoutError, OSError):
            break
        if p.type == P.PUBLISH:
            got.add(int(p.payload))
            sub.send(P.Ack(P.PUBACK, p.packet_id))
    sub.close()
    return {"acknowledged": n, "session_present": sub.connack.session_present,
            "received_after_restart": len(got), "lost": n - len(got),
            "seconds_to_connack_after_restart": round(t_back, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage", default="memory://tansu/", help="Tansu's --storage-engine URL")
    ap.add_argument("--messages", type=int, default=200, help="acknowledged before the restart")
    ap.add_argument("--bench", type=int, default=5000, help="messages of the throughput run")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--wait", type=float, default=30.0)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cluster-storage-")
    key = os.path.join(tmp, "cluster.key")
    with open(key, "w") as f:
        f.write(os.urandom(32).hex())
    os.chmod(key, 0o600)
    tansu = Tansu(a.storage, os.path.join(tmp, "tansu.log"))
    tansu.start()
    prefix = f"s{uuid.uuid4().hex[:8]}"
    nodes: list[tuple[subprocess.Popen, int]] = []
    try:  # whatever fails (a node that does not start), everything started is stopped
        for n in ("n1", "n2"):
            nodes.append(node(tmp, n, f"127.0.0.1:{tansu.port}", key, prefix))
        out = {"storage": a.storage.split("@")[-1], **throughput(nodes[0][1], nodes[1][1], a.bench, a.window),
               **restart(tansu, nodes[0][1], nodes[1][1], a.messages, a.wait), "logs": tmp}
    finally:
        for p, _ in nodes:
            p.terminate()
        for p, _ in nodes:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        if tansu.proc and tansu.proc.poll() is None:
            tansu.kill()
    print(json.dumps(out))
    return 1 if out["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
