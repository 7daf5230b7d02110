"""Cluster figures (docs/cluster.md "Cluster"): one Tansu, broker nodes in cluster mode, bench/loadgen.py.

    .venv/bin/python bench/cluster_bench.py                      # everything
    .venv/bin/python bench/cluster_bench.py --only latency,failover
    .venv/bin/python bench/cluster_bench.py --only samenode,fanin --duration 5 \
        --set cluster.node_timeout=15

Prints, side by side where it applies:
* latency: a QoS 0 publisher on node 1 and a subscriber on node 2 at 1,000 and 5,000 msg/s:
  p50 / p99 / p99.9, and the CPU per message of the sending node, the receiving node and Kafka
  (from /proc, over the measured seconds);
* samenode: the same latency with publisher and subscriber on one node: the broker without the
  cluster against a 1-node cluster (delivered as accepted, not through Kafka), with the node's
  and Kafka's CPU per message;
* filter: what a node costs for the records it reads: idle (no traffic) in % of a core, and at
  each rate the CPU per message of a bystander node whose subscriber's filter matches none of
  the records (publisher and subscriber on node 1, a subscriber on `elsewhere/#` on node 2)
  against node 2 with the matching subscriber (publisher on node 1, subscriber on node 2), with
  node 1's and Kafka's CPU per message (a node none of whose sessions wants the records reads
  them only every 0.5 s: cluster/interest.py); `--filter-nodes 2,4` measures a cluster of each size
  (nodes 3.. are bystanders with an `elsewhere/#` subscriber each: what every node pays for
  every message, whatever it wants);
* sparse: a QoS 1 message every 3 s from node 1 to a subscriber on node 2, each the first after
  a quiet spell (node 2 not reading the messages topic in between: cluster/interest.py, woken by
  a bell): its latency, p50 and max;
* fanin: 8 QoS 0 and QoS 1 publishers into one wildcard subscriber: a 1-node cluster (everything
  on n1) against 2 nodes (publishers spread over n1 and n2, the subscriber on n1), and the same
  broker without the cluster; each scenario starts once the nodes and Kafka are quiet (the QoS 0
  run leaves a backlog the nodes still work through after its publishers left);
* takeover: a client id connected on node 1 connects on node 2: time until the new CONNACK and
  until the old connection's DISCONNECT 0x8E;
* failover: a node with a connected persistent client and a client with a will is killed with
  SIGKILL: time until the client, reconnecting to node 2 in a loop, has its session back
  (CONNACK, session present), and until the will is published (the node noticed gone).
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
from kafka_client.embedded import EmbeddedKafka  # noqa: E402
from tests.mqtt_raw import RawClient  # noqa: E402

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass
    return total / 1e9


def cluster_key(tmp: str) -> str:
    """The nodes' shared key file (docs/cluster.md "Cluster"), made once in `tmp`."""
    path = os.path.join(tmp, "cluster.key")
    if not os.path.exists(path):
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(os.urandom(32).hex())
    return path


class Node:
    extra: list = []  # more --set items for every node (--fetch-wait)

    def __init__(self, node_id: str | None, kafka: str | None, tmp: str, prefix: str,
                 node_timeout: float = 3.0):
        self.port = free_port()
        self.node_id = node_id
        d = os.path.join(tmp, node_id or f"single-{self.port}")
        os.makedirs(d, exist_ok=True)
        cmd = [PY, "-m", "broker", "--host", "127.0.0.1", "--port", str(self.port),
               "--data-dir", d, "--set", "persistence.enabled=false", "--set", "metrics.sys_interval=0"]
        if node_id:
            cmd += ["--set", "cluster.enabled=true", "--set", f"cluster.node_id={node_id}",
                    "--set", f"cluster.bootstrap_servers={kafka}",
                    "--set", f"cluster.topic_prefix={prefix}",
                    "--set", f"cluster.node_timeout={node_timeout}",
                    "--set", "cluster.heartbeat_seconds=0.5",
                    "--set", f"cluster.key_file={cluster_key(tmp)}", *Node.extra]
        self.log = open(os.path.join(d, "broker.log"), "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": ROOT})
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"node {node_id} did not start (see {d}/broker.log)") from None
                time.sleep(0.1)

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            (self.proc.kill if kill else self.proc.terminate)()
            self.proc.wait(15)
        self.log.close()


def loadgen(*args) -> dict:
    out = subprocess.run([PY, os.path.join(ROOT, "bench", "loadgen.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measured(pids: dict, fn):
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    res = fn()
    after = {k: cpu_seconds(p) for k, p in pids.items()}
    return res, {k: after[k] - before[k] for k in pids}


def bench_latency(kafka, tmp, rates, duration):
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    n1, n2 = Node("n1", kafka.bootstrap, tmp, prefix), Node("n2", kafka.bootstrap, tmp, prefix)
    rows = []
    try:
        for rate in rates:
            pids = {"sending node": n1.proc.pid, "receiving node": n2.proc.pid,
                    "Kafka": kafka.proc.pid}
            res, cpu = measured(pids, lambda: loadgen(
                "--scenario", "latency", "--port", n1.port, "--sub-port", n2.port,
                "--rate", rate, "--duration", duration, "--warmup", 1, "--mqtt", 5))
            n = res["sent_total"] or 1
            lat = res["lat_ms"]
            rows.append({"rate": rate, "p50_ms": lat["p50"], "p99_ms": lat["p99"],
                         "p99.9_ms": lat["p99.9"], "delivered": res["delivered_total"],
                         "sent": res["sent_total"],
                         **{f"{k} us/msg": round(v / n * 1e6, 1) for k, v in cpu.items()}})
    finally:
        n1.stop()
        n2.stop()
    print("\n## cross-node latency (QoS 0, publisher on n1, subscriber on n2)")
    print("| msg/s | p50 ms | p99 ms | p99.9 ms | sending node us/msg | receiving node us/msg | Kafka us/msg |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rate']:,} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['p99.9_ms']:.2f} | "
              f"{r['sending node us/msg']} | {r['receiving node us/msg']} | {r['Kafka us/msg']} |")
    return rows


def bench_samenode(kafka, tmp, rates, duration):
    rows = []
    for label, cluster in (("no cluster", False), ("cluster, 1 node", True)):
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        n = Node("n1", kafka.bootstrap, tmp, prefix) if cluster else Node(None, None, tmp, prefix)
        try:
            for rate in rates:
                pids = {"node": n.proc.pid, **({"Kafka": kafka.proc.pid} if cluster else {})}
                res, cpu = measured(pids, lambda: loadgen(
                    "--scenario", "latency", "--port", n.port, "--sub-port", n.port,
                    "--rate", rate, "--duration", duration, "--warmup", 1, "--mqtt", 5))
                lat = res["lat_ms"]
                sent = res["sent_total"] or 1
                rows.append({"setup": label, "rate": rate, "p50_ms": lat["p50"],
                             "p99_ms": lat["p99"], "p99.9_ms": lat["p99.9"],
                             "delivered": res["delivered_total"], "sent": res["sent_total"],
                             "node us/msg": round(cpu["node"] / sent * 1e6, 1),
                             "Kafka us/msg": round(cpu["Kafka"] / sent * 1e6, 1) if cluster else None})
        finally:
            n.stop()
    print("\n## same-node latency (QoS 0, publisher and subscriber on one node)")
    print("| setup | msg/s | p50 ms | p99 ms | p99.9 ms | delivered / sent | node us/msg | Kafka us/msg |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setup']} | {r['rate']:,} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['p99.9_ms']:.2f} | {r['delivered']} / {r['sent']} | {r['node us/msg']} | "
              f"{r['Kafka us/msg'] if r['Kafka us/msg'] is not None else '-'} |")
    return rows


def settle_cpu(pids: dict, share: float = 0.25, window: float = 0.5, limit: float = 60.0) -> float:
    """Wait until every process in `pids` uses under `share` of a core over `window` seconds
    (at most `limit`): the seconds waited. QoS 0 publishers are not flow controlled, so a node
    may still be reading and writing to Kafka what they sent after they left; a scenario
    started before that is done measures its acknowledgements queued behind that backlog."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        _, cpu = measured(pids, lambda: time.sleep(window))
        if all(v < share * window for v in cpu.values()):
            break
    return time.monotonic() - t0


def idle_cpu(pids: dict, seconds: float) -> dict:
    """% of a core each process used over `seconds` with no traffic."""
    _, cpu = measured(pids, lambda: time.sleep(seconds))
    return {k: round(v / seconds * 100, 1) for k, v in cpu.items()}


def bench_filter(kafka, tmp, rates, duration, nodes=2):
    """Node 1 publishes; nodes 2..N each have a subscriber on topics nobody publishes to. Node 2
    is measured with records for nobody on it (the subscriber of the load on node 1) and with
    records for its own subscriber; nodes 3..N stay bystanders throughout."""
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    ns = [Node(f"n{i + 1}", kafka.bootstrap, tmp, prefix) for i in range(nodes)]
    n1, n2 = ns[0], ns[1]
    rows = []
    others = []
    try:
        for n in ns[1:]:  # a subscriber on each node but the publishing one, matching nothing
            other = RawClient(n.port)
            assert other.connect(f"elsewhere-{uuid.uuid4().hex[:6]}", keep_alive=0).reason_code == 0
            other.subscribe("elsewhere/#", qos=1)
            others.append(other)
        time.sleep(2)  # the nodes' fetch wait becomes the idle one
        pids = {f"n{i + 1}": n.proc.pid for i, n in enumerate(ns)}
        idle = idle_cpu({**pids, "Kafka": kafka.proc.pid}, max(duration, 5))
        for rate in rates:
            for case, sub_port in (("non-matching", n1.port), ("matching", n2.port)):
                t0 = time.monotonic()
                res, cpu = measured({**pids, "Kafka": kafka.proc.pid}, lambda: loadgen(
                    "--scenario", "latency", "--port", n1.port, "--sub-port", sub_port,
                    "--rate", rate, "--duration", duration, "--warmup", 1, "--mqtt", 5))
                took = time.monotonic() - t0
                n = res["sent_total"] or 1
                rest = [cpu[f"n{i + 1}"] for i in range(2, nodes)]
                # what node 2 and the bystanders spent beyond their idle polling over those seconds
                above = [cpu[f"n{i + 1}"] - idle[f"n{i + 1}"] / 100 * took for i in range(1, nodes)]
                rows.append({"rate": rate, "case": case,
                             "n1 us/msg": round(cpu["n1"] / n * 1e6, 1),
                             "n2 us/msg": round(cpu["n2"] / n * 1e6, 1),
                             "bystanders us/msg": round(sum(rest) / len(rest) / n * 1e6, 1) if rest else None,
                             "Kafka us/msg": round(cpu["Kafka"] / n * 1e6, 1),
                             "n2 above idle us/msg": round(above[0] / n * 1e6, 1),
                             "bystanders above idle us/msg":
                                 round(sum(above[1:]) / len(above[1:]) / n * 1e6, 1) if rest else None,
                             "p50_ms": res["lat_ms"]["p50"], "p99_ms": res["lat_ms"]["p99"]})
    finally:
        for other in others:
            other.close()
        for n in ns:
            n.stop()
    print(f"\n## reading cost of a node ({nodes} nodes; node 2): records for nobody on it vs for its "
          f"subscriber; nodes 3..{nodes}: bystanders")
    print(f"idle, % of a core: {idle}")
    print("| msg/s | node 2's records | node 1 us/msg | node 2 us/msg (above idle) | nodes 3.. us/msg "
          "(mean; above idle) | Kafka us/msg | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        by = "-" if r["bystanders us/msg"] is None else \
            f"{r['bystanders us/msg']} ({r['bystanders above idle us/msg']})"
        print(f"| {r['rate']:,} | {r['case']} | {r['n1 us/msg']} | {r['n2 us/msg']} "
              f"({r['n2 above idle us/msg']}) | {by} | {r['Kafka us/msg']} | {r['p50_ms']:.2f} | "
              f"{r['p99_ms']:.2f} |")
    return {"nodes": nodes, "idle_pct": idle, "rows": rows}


def bench_fanin(kafka, tmp, duration):
    rows = []
    for label, nodes in (("no cluster", 0), ("cluster, 1 node", 1), ("cluster, 2 nodes", 2)):
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        ns = [Node(None, None, tmp, prefix)] if nodes == 0 else \
            [Node(f"n{i + 1}", kafka.bootstrap, tmp, prefix) for i in range(nodes)]
        try:
            for scen in ("qos0_fanin", "qos1_fanin"):
                pids = {f"node{i + 1}": n.proc.pid for i, n in enumerate(ns)}
                if nodes:
                    pids["Kafka"] = kafka.proc.pid
                settle_cpu(pids)  # the previous scenario's QoS 0 backlog drained first
                res, cpu = measured(pids, lambda: loadgen(
                    "--scenario", scen, "--port", ns[0].port,
                    "--pub-ports", ",".join(str(n.port) for n in ns),
                    "--publishers", 8, "--subscribers", 1, "--duration", duration, "--warmup", 1,
                    "--window", 32, "--max-lag", 5000))
                rows.append({"setup": label, "scenario": scen, "msgs_per_s": res["msgs_per_s"],
                             "complete": res["drain_complete"],
                             "cpu_s": {k: round(v, 2) for k, v in cpu.items()}})
        finally:
            for n in ns:
                n.stop()
    print("\n## fan-in (8 publishers -> 1 wildcard subscriber on node 1; publishers spread over the nodes)")
    print("| setup | scenario | msg/s | all delivered | CPU seconds |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setup']} | {r['scenario']} | {r['msgs_per_s']:,.0f} | {r['complete']} | {r['cpu_s']} |")
    return rows


def bench_sparse(kafka, tmp, count, gap):
    """A QoS 1 message every `gap` seconds from node 1 to a subscriber on node 2, which does
    not read the messages topic in between (cluster/interest.py: asleep once AWAKE_FOR has
    passed): each is the first after a quiet spell, brought by a bell."""
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    n1, n2 = Node("n1", kafka.bootstrap, tmp, prefix), Node("n2", kafka.bootstrap, tmp, prefix)
    lat = []
    try:
        sub, pub = RawClient(n2.port), RawClient(n1.port)
        assert sub.connect(f"sparse-sub-{uuid.uuid4().hex[:6]}", keep_alive=0).reason_code == 0
        assert pub.connect(f"sparse-pub-{uuid.uuid4().hex[:6]}", keep_alive=0).reason_code == 0
        topic = f"sparse/{uuid.uuid4().hex[:6]}"
        sub.subscribe(topic, qos=1)
        time.sleep(gap)
        for i in range(count):
            t0 = time.perf_counter()
            pub.publish(topic, b"%d" % i, qos=1, pid=i + 1)
            while True:
                p = sub.recv(10)
                if p.type == P.PUBLISH:
                    lat.append((time.perf_counter() - t0) * 1000)
                    sub.send(P.Ack(P.PUBACK, p.packet_id))
                    break
            pub.recv_type(P.PUBACK)
            time.sleep(gap)
        sub.close()
        pub.close()
    finally:
        n1.stop()
        n2.stop()
    lat.sort()
    row = {"messages": count, "gap_s": gap, "p50_ms": round(lat[len(lat) // 2], 1),
           "max_ms": round(lat[-1], 1)}
    print(f"\n## a message after a quiet spell (node 1 -> node 2, one every {gap:g} s)")
    print("| messages | p50 ms | max ms |")
    print("|---|---|---|")
    print(f"| {count} | {row['p50_ms']} | {row['max_ms']} |")
    return row


def bench_takeover(kafka, tmp, rounds):
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    n1, n2 = Node("n1", kafka.bootstrap, tmp, prefix), Node("n2", kafka.bootstrap, tmp, prefix)
    connack, disconnect = [], []
    try:
        for i in range(rounds):
            cid = f"take-{i}-{uuid.uuid4().hex[:6]}"
            old = RawClient(n1.port)
            assert old.connect(cid).reason_code == 0
            t0 = time.perf_counter()
            new = RawClient(n2.port)
            assert new.connect(cid).reason_code == 0
            connack.append(time.perf_counter() - t0)
            while True:
                p = old.recv(10)
                if p.type == P.DISCONNECT:
                    assert p.reason_code == 0x8E
                    disconnect.append(time.perf_counter() - t0)
                    break
            old.close()
            new.close()
    finally:
        n1.stop()
        n2.stop()
    ms = lambda xs, q: sorted(xs)[min(len(xs) - 1, int(len(xs) * q))] * 1000  # noqa: E731
    print(f"\n## takeover across nodes ({rounds} rounds)")
    print("| | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|")
    print(f"| new CONNACK on node 2 | {ms(connack, .5):.1f} | {ms(connack, .99):.1f} | {max(connack) * 1000:.1f} |")
    print(f"| DISCONNECT 0x8E on node 1 | {ms(disconnect, .5):.1f} | {ms(disconnect, .99):.1f} "
          f"| {max(disconnect) * 1000:.1f} |")
    return {"connack_ms": [round(x * 1000, 2) for x in connack],
            "disconnect_ms": [round(x * 1000, 2) for x in disconnect]}


def bench_failover(kafka, tmp, node_timeout, rounds):
    results = []
    for _ in range(rounds):
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        n1 = Node("n1", kafka.bootstrap, tmp, prefix, node_timeout)
        n2 = Node("n2", kafka.bootstrap, tmp, prefix, node_timeout)
        try:
            cid = f"dev-{uuid.uuid4().hex[:6]}"
            dev = RawClient(n1.port)
            dev.connect(cid, clean_start=False, properties={PR.SESSION_EXPIRY_INTERVAL: 600})
            dev.subscribe("fo/#", qos=1)
            willer = RawClient(n1.port)
            willer.connect(f"w-{cid}", will=P.Will("fo/will", b"gone", 1, False))
            watcher = RawClient(n2.port)
            watcher.connect(f"watch-{cid}")
            watcher.subscribe("fo/will", qos=1)
            time.sleep(1.5)
            t0 = time.perf_counter()
            n1.stop(kill=True)
            back = None
            while back is None:  # a device reconnecting to another address at once, in a loop
                try:
                    c = RawClient(n2.port)
                    ack = c.connect(cid, clean_start=False,
                                    properties={PR.SESSION_EXPIRY_INTERVAL: 600})
                    if ack.reason_code == 0 and ack.session_present:
                        back = time.perf_counter() - t0
                except (OSError, AssertionError, TimeoutError):
                    time.sleep(0.05)
            will = None
            while will is None:
                p = watcher.recv(node_timeout + 15)
                if p.type == P.PUBLISH and p.payload == b"gone":
                    will = time.perf_counter() - t0
            results.append((back, will))
        finally:
            n1.stop()
            n2.stop()
    print(f"\n## failover after SIGKILL of a node (cluster.node_timeout = {node_timeout} s, {rounds} rounds)")
    print("| | each round, s |")
    print("|---|---|")
    print(f"| client served on node 2 with its session | {', '.join(f'{b:.2f}' for b, _ in results)} |")
    print(f"| will published (the node noticed gone) | {', '.join(f'{w:.2f}' for _, w in results)} |")
    return [{"session_back_s": b, "will_s": w} for b, w in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="latency,samenode,filter,sparse,fanin,takeover,failover")
    ap.add_argument("--rates", default="1000,5000")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--node-timeout", type=float, default=3.0)
    ap.add_argument("--filter-nodes", default="2",
                    help="filter: cluster sizes to measure, e.g. 2,4 (nodes 3.. are bystanders)")
    ap.add_argument("--fetch-wait", type=int, help="cluster.fetch_wait_ms of the nodes")
    ap.add_argument("--partitions", type=int, help="cluster.partitions (of the messages topic)")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting of every cluster node (e.g. cluster.node_timeout=15 on a loaded "
                         "machine, where heartbeats come late)")
    a = ap.parse_args()
    only = set(a.only.split(","))
    if a.fetch_wait:
        Node.extra += ["--set", f"cluster.fetch_wait_ms={a.fetch_wait}"]
    if a.partitions:
        Node.extra += ["--set", f"cluster.partitions={a.partitions}"]
    for item in a.set:
        Node.extra += ["--set", item]
    tmp = tempfile.mkdtemp(prefix="cluster-bench-")
    kafka = EmbeddedKafka(log_file=os.path.join(tmp, "tansu.log")).start()
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count()}
    try:
        if "latency" in only:
            out["latency"] = bench_latency(kafka, tmp, [int(r) for r in a.rates.split(",")], a.duration)
        if "samenode" in only:
            out["samenode"] = bench_samenode(kafka, tmp, [int(r) for r in a.rates.split(",")],
                                             a.duration)
        if "filter" in only:
            out["filter"] = [bench_filter(kafka, tmp, [int(r) for r in a.rates.split(",")], a.duration, n)
                             for n in (int(x) for x in a.filter_nodes.split(","))]
        if "sparse" in only:
            out["sparse"] = bench_sparse(kafka, tmp, 12, 3.0)
        if "fanin" in only:
            out["fanin"] = bench_fanin(kafka, tmp, a.duration)
        if "takeover" in only:
            out["takeover"] = bench_takeover(kafka, tmp, a.rounds)
        if "failover" in only:
            out["failover"] = bench_failover(kafka, tmp, a.node_timeout, 3)
    finally:
        kafka.stop()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
