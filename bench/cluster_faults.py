"""Faults injected into a running cluster, counted per message (docs/cluster.md "Cluster").

    .venv/bin/python bench/cluster_faults.py                       # about 2 minutes
    .venv/bin/python bench/cluster_faults.py --phase 10 --rate 100 --clients 2
    .venv/bin/python bench/cluster_faults.py --kafka-kill           # also SIGKILL Kafka

Three broker nodes on one embedded Tansu; persistent QoS 1 and QoS 2 publishers on n1 and
subscribers on n2 (tests/faultload.py: each reconnects to the next live node with its session,
resends what was not acknowledged with DUP 1, and a QoS 2 subscriber holds each packet id until
its PUBREL, so a message sent to it again as new counts as delivered twice). One fault per
phase, the load running throughout:

1. SIGKILL of the subscribers' node (n2): they move to n3;
2. SIGKILL of the publishers' node (n1): they move to n3;
3. (--kafka-kill, off by default) SIGKILL of Kafka, started again on the same port. The
   embedded Tansu keeps its data in memory: it comes back empty, and the acknowledged messages
   not yet delivered when it died are lost (docs/cluster.md "Cluster", a Kafka that lost its data; a run
   of 30 msg/s lost 10 of 1,259), which is work of its own: not part of the default run.

Prints per message, over the whole run: acknowledged and never delivered, QoS 2 delivered twice,
QoS 1 duplicates, order per publisher and topic broken, sessions lost; per fault: failover (the
longest time until a moved client was served again) and the delivery latency p99 of the
messages first sent in the phase before the fault and in the 5 s after it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from cluster_bench import Node  # noqa: E402  (bench/, the script's directory)

from kafka_client.embedded import EmbeddedKafka  # noqa: E402
from tests.faultload import Publisher, Subscriber, account, gap_after, p99  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phase", type=float, default=20.0, help="seconds between faults")
    ap.add_argument("--rate", type=float, default=50.0, help="messages a second per publisher")
    ap.add_argument("--clients", type=int, default=2, help="publishers and subscribers per QoS")
    ap.add_argument("--node-timeout", type=float, default=3.0)
    ap.add_argument("--kafka-kill", action="store_true", help="also SIGKILL Kafka (restarted)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for every node (repeatable), e.g. cluster.fetch_wait_ms=20")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cluster-faults-")
    kafka = EmbeddedKafka(log_file=os.path.join(tmp, "tansu.log")).start()
    prefix = f"faults{uuid.uuid4().hex[:6]}"
    Node.extra = ["--set", "cluster.handoff_timeout=1.0"] + [x for kv in args.set for x in ("--set", kv)]
    nodes = {n: Node(n, kafka.bootstrap, tmp, prefix, args.node_timeout) for n in ("n1", "n2", "n3")}

    def ports(*order):
        return lambda: [nodes[n].port for n in order if nodes[n].proc.poll() is None]

    tag = uuid.uuid4().hex[:6]
    topic = f"faults/{tag}"
    subs = [Subscriber(f"s{q}.{k}-{tag}", q, ports("n2", "n3"), topic)
            for q in (1, 2) for k in range(args.clients)]
    pubs = [Publisher(f"p{q}.{k}-{tag}", q, ports("n1", "n3"), topic, args.rate)
            for q in (1, 2) for k in range(args.clients)]
    faults: list[tuple[str, float, list]] = []
    try:
        for d in subs:
            d.start()
        time.sleep(1.0)
        for d in pubs:
            d.start()
        t_start = time.monotonic()
        time.sleep(args.phase)
        faults.append(("SIGKILL n2 (subscribers' node)", time.monotonic(), subs))
        nodes["n2"].stop(kill=True)
        time.sleep(args.phase)
        faults.append(("SIGKILL n1 (publishers' node)", time.monotonic(), pubs))
        nodes["n1"].stop(kill=True)
        time.sleep(args.phase)
        if args.kafka_kill:
            faults.append(("SIGKILL Kafka, restarted (empty)", time.monotonic(), pubs + subs))
            kafka.restart(kill=True)
            time.sleep(args.phase)
        t_end = time.monotonic()
        for d in pubs:
            d.stopping = True
        for d in pubs:
            d.join(60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = {(pub, i) for s in subs for pub, i, _ in s.got}
            if all((p.cid, i) in got for p in pubs for i in p.acked):
                break
            time.sleep(0.5)
        time.sleep(2.0)
        for d in subs:
            d.stopping = True
        for d in subs:
            d.join(10)
    finally:
        for n in nodes.values():
            n.stop()
        kafka.stop()
    errors = [(d.cid, repr(d.error)) for d in pubs + subs if d.error is not None]
    a = account(pubs, subs)
    lat = a.pop("latencies")
    print(f"\n## faults injected into a 3-node cluster ({len(pubs)} publishers at {args.rate:g} "
          f"msg/s, {len(subs)} subscribers, QoS 1 and 2, {t_end - t_start:.0f} s; "
          f"cluster.node_timeout = {args.node_timeout:g} s)")
    print("| counted per message | |")
    print("|---|---|")
    for k, what in (("acked", "acknowledged (QoS 1 PUBACK / QoS 2 PUBREC), x subscribers"),
                    ("lost", "acknowledged and never delivered"),
                    ("qos2_twice", "QoS 2 delivered twice"),
                    ("qos1_dups", "QoS 1 duplicates"),
                    ("out_of_order", "order per publisher and topic broken"),
                    ("sessions_lost", "sessions lost (CONNACK session present 0)"),
                    ("dup_resends", "QoS 2 resends of a held packet id (not delivered again)")):
        print(f"| {what} | {a[k]} |")
    if a["lost_ids"]:
        print(f"\nfirst lost (subscriber, publisher, number): {a['lost_ids']}")
    print("\n| fault | failover, s | delivery p99 before, ms (QoS 1 / 2) | "
          "p99 in the 5 s after, ms (QoS 1 / 2) |")
    print("|---|---|---|---|")
    prev = t_start

    def ms(lo: float, hi: float, q: int) -> str:
        return f"{p99([d for t0, d, qos in lat if lo <= t0 < hi and qos == q]) * 1000:.0f}"
    for name, at, moved in faults:
        print(f"| {name} | {gap_after(moved, at):.2f} | {ms(prev, at, 1)} / {ms(prev, at, 2)} | "
              f"{ms(at, at + 5, 1)} / {ms(at, at + 5, 2)} |")
        prev = at + 5
    twice = twice_by_phase(subs, t_start, faults)
    if any(twice.values()):
        print("\nQoS 2 delivered twice, by when the repeat came: "
              + ", ".join(f"{k}: {v}" for k, v in twice.items()))
    lost = lost_by_phase(pubs, subs, t_start, faults)
    if any(v[1] or v[2] for v in lost.values()):
        print("\nacknowledged and never delivered, by when first sent (QoS 1 / QoS 2): "
              + ", ".join(f"{k}: {v[1]} / {v[2]}" for k, v in lost.items()))
    if errors:
        print(f"\nclients that failed: {errors}")


def phase_names(faults: list) -> list[str]:
    return ["before the faults"] + [f"after {name.split(' (')[0]}" for name, _, _ in faults]


def lost_by_phase(pubs: list, subs: list, t_start: float, faults: list) -> dict[str, dict]:
    """The acknowledged messages a subscriber never got, per QoS, by the phase they were first
    sent in."""
    names = phase_names(faults)
    starts = [at for _, at, _ in faults]
    out: dict[str, dict] = {n: {1: 0, 2: 0} for n in names}
    for s in subs:
        got = {(pub, i) for pub, i, _ in s.got}
        for p in pubs:
            if p.qos != s.qos:
                continue
            for i in p.acked:
                if (p.cid, i) not in got:
                    out[names[sum(1 for at in starts if p.sent_at[i] >= at)]][p.qos] += 1
    return out


def twice_by_phase(subs: list, t_start: float, faults: list) -> dict[str, int]:
    """The QoS 2 repeats counted by the phase their second delivery came in (before the first
    fault, or after which fault)."""
    names = phase_names(faults)
    starts = [t_start] + [at for _, at, _ in faults]
    out = dict.fromkeys(names, 0)
    for s in subs:
        if s.qos != 2:
            continue
        seen: set = set()
        for pub, i, t in s.got:
            if (pub, i) in seen and pub.startswith("p2."):   # a QoS 2 publisher's message
                phase = sum(1 for at in starts[1:] if t >= at)
                out[names[phase]] += 1
            seen.add((pub, i))
    return out


if __name__ == "__main__":
    main()
