#!/usr/bin/env python3
"""Benchmark our MQTT broker against Mosquitto, side by side.

Each run starts a fresh broker pinned to one core (``taskset -c 0``) and the
load generator (bench/loadgen.py, raw asyncio/uvloop MQTT 3.1.1 client) pinned
to another core (``taskset -c 1``).  Brokers alternate run by run
(ours, mosquitto, ours, mosquitto, ...); the median of the repeats is
reported.  See bench/README.md.

    .venv/bin/python bench/bench.py                       # everything, 3 repeats
    .venv/bin/python bench/bench.py --duration 2 --repeats 1 --scenarios qos0_fanin,latency
    .venv/bin/python bench/bench.py --only mosquitto --json /tmp/bench.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from harness import HERE, PY, REPO, free_port, log_tail, pin, status_kib, terminate

LOADGEN = os.path.join(HERE, "loadgen.py")

ALL_SCENARIOS = ["qos0_fanin", "qos0_fanout", "qos1_fanin", "qos2", "latency", "conns"]
THROUGHPUT = {"qos0_fanin", "qos0_fanout", "qos1_fanin", "qos2"}
TITLES = {
    "qos0_fanin": "QoS0 fan-in (8 pub -> 1 sub, bench/#)",
    "qos0_fanout": "QoS0 fan-out (1 pub -> 100 subs)",
    "qos1_fanin": "QoS1 fan-in (window 32/pub, sub QoS1)",
    "qos2": "QoS2 (window 32/pub, sub QoS2)",
    "latency": "Latency, QoS0 at fixed rate",
    "conns": "Memory per idle connection",
}
# goals, as ratios ours / Mosquitto measured in the same run: throughput at least (fan-in 2.5x,
# the rest ahead), latency percentiles and memory per connection at most; with Mosquitto not
# run, the absolute bounds (p99 under 1 ms, 10 KiB per connection) are checked instead
RATIO_TARGET = {"qos0_fanin": 2.5, "qos0_fanout": 1.0, "qos1_fanin": 2.5, "qos2": 1.0}
LATENCY_RATIO_TARGET = {"p50": 0.9, "p99": 1.0}
KIB_RATIO_TARGET = 1.0
P99_TARGET_MS = 1.0
KIB_PER_CONN_TARGET = 10.0
LOADGEN_CPU_WARN = 0.90

DEFAULT_BROKER_CMD = f"{shlex.quote(PY)} -m broker --host {{host}} --port {{port}} --data-dir {{datadir}}"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- helpers


def rss_kib(pid):
    return status_kib(pid, "VmRSS")


def mqtt_probe(host, port, timeout=0.5):
    """True when the broker answers CONNECT with a successful CONNACK."""
    pkt = b"\x10\x14\x00\x04MQTT\x04\x02\x00\x00\x00\x08benchprb"
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(pkt)
            data = s.recv(4)
            ok = len(data) >= 4 and data[0] == 0x20 and data[3] == 0
            if ok:
                s.sendall(b"\xe0\x00")
            return ok
    except OSError:
        return False


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt_num(x, digits=0):
    if x is None:
        return "-"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


# ----------------------------------------------------------------- brokers


class Broker:
    def __init__(self, name, argv_fn, workdir, env=None):
        self.name = name
        self.argv_fn = argv_fn  # (host, port, tmpdir) -> argv
        self.workdir = workdir
        self.env = env
        self.proc = None
        self.peak_rss = 0
        self.killed_for_rss = False
        self._stop_mon = None

    def start(self, host, port, cpu, tmpdir, rss_limit_kib):
        argv = pin(cpu) + self.argv_fn(host, port, tmpdir)
        self.logpath = os.path.join(tmpdir, f"{self.name}-{port}.log")
        self.logf = open(self.logpath, "wb")
        self.proc = subprocess.Popen(argv, cwd=self.workdir, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
        self.argv = argv
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
            if mqtt_probe(host, port):
                break
            time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError(f"{self.name} did not answer CONNECT on {host}:{port} within 30 s: {self.log_tail()}")
        # RSS guard: a broker without backpressure can balloon under QoS 0 overload
        self.peak_rss = rss_kib(self.proc.pid) or 0
        self.killed_for_rss = False
        self._stop_mon = threading.Event()

        def monitor():
            while not self._stop_mon.wait(0.2):
                r = rss_kib(self.proc.pid)
                if r is None:
                    return
                self.peak_rss = max(self.peak_rss, r)
                if rss_limit_kib and r > rss_limit_kib:
                    self.killed_for_rss = True
                    log(f"!! {self.name}: RSS {r // 1024} MiB > limit, killing it")
                    self.proc.kill()
                    return

        threading.Thread(target=monitor, daemon=True).start()
        return self.proc.pid

    def log_tail(self, n=800):
        self.logf.flush()
        return log_tail(self.logpath, n)

    def stop(self):
        if self._stop_mon is not None:
            self._stop_mon.set()
        terminate(self.proc, 5)
        if self.proc is not None:
            self.logf.close()
        self.proc = None


def mosquitto_broker(binary):
    def argv(host, port, tmpdir):
        conf = os.path.join(tmpdir, f"mosquitto-{port}.conf")
        with open(conf, "w") as f:
            f.write(f"listener {port} {host}\n"
                    "allow_anonymous true\n"
                    "persistence false\n"
                    "# large enough that QoS 1/2 runs never drop queued messages\n"
                    "max_queued_messages 1000000\n"
                    "# stock otherwise (max_connections -1 = unlimited, max_inflight_messages 20,\n"
                    "# set_tcp_nodelay false, default logging to stderr -> log file)\n")
        return [binary, "-c", conf]
    return Broker("mosquitto", argv, HERE)


def our_broker(cmd_template):
    def argv(host, port, tmpdir):
        datadir = os.path.join(tmpdir, f"ours-{port}")  # fresh state for every run
        return shlex.split(cmd_template.format(host=host, port=port, python=PY, datadir=datadir))
    return Broker("ours", argv, REPO)


def mosquitto_version(binary):
    try:
        out = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=5)
        return (out.stdout + out.stderr).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def our_broker_available(cmd_template):
    """`python -m broker --help` (or the --broker-cmd program with --help) exits 0."""
    argv = shlex.split(cmd_template.format(host="127.0.0.1", port=1883, python=PY, datadir="data"))
    # strip our own --host/--port arguments and ask for help instead
    base = []
    skip = False
    for tok in argv:
        if skip:
            skip = False
            continue
        if tok in ("--host", "--port"):
            skip = True
            continue
        base.append(tok)
    try:
        r = subprocess.run(base + ["--help"], cwd=REPO, capture_output=True, text=True, timeout=20)
        return r.returncode == 0, (r.stderr or r.stdout).strip()[-300:]
    except (OSError, subprocess.SubprocessError) as e:
        return False, str(e)


# ----------------------------------------------------------------- one run


def loadgen_args(a, scenario, port, broker_pid):
    args = ["--scenario", scenario, "--host", a.host, "--port", str(port), "--mqtt", str(a.mqtt),
            "--warmup", str(a.warmup), "--duration", str(a.duration), "--drain", str(a.drain),
            "--publishers", str(a.publishers), "--subscribers", str(a.subscribers),
            "--window", str(a.window), "--max-lag", str(a.max_lag), "--rcvlowat", str(a.rcvlowat),
            "--rate", str(a.rate), "--conns", str(a.conns), "--broker-pid", str(broker_pid)]
    if a.broker_cpu is not None:
        args += ["--broker-core", str(a.broker_cpu)]
    if a.persistent:
        args += ["--persistent"]
    if scenario == "latency":
        args[args.index("--duration") + 1] = str(a.latency_duration or a.duration)
    return args


def run_one(a, broker, scenario, tmpdir):
    port = free_port(a.host)
    pid = broker.start(a.host, port, a.broker_cpu, tmpdir, a.rss_limit_mb * 1024)
    res = {"broker": broker.name, "scenario": scenario}
    try:
        time.sleep(0.3)
        rss_before = rss_kib(pid)
        res["rss_start_kib"] = rss_before
        argv = pin(a.loadgen_cpu) + [PY, LOADGEN] + loadgen_args(a, scenario, port, pid)
        t0 = time.time()
        lg = subprocess.Popen(argv, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.PIPE, text=True)
        timeout = a.warmup + a.duration + a.drain + 120
        result_line = None
        if scenario == "conns":
            line = lg.stdout.readline()
            if line.startswith("READY"):
                time.sleep(1.0)  # let the broker settle
                rss_after = rss_kib(pid)
                res["rss_before_kib"] = rss_before
                res["rss_after_kib"] = rss_after
                n = int(line.split()[1])
                if rss_after is not None and rss_before is not None and n:
                    res["kib_per_conn"] = (rss_after - rss_before) / n
                lg.stdin.write("go\n")
                lg.stdin.flush()
            else:
                result_line = line
        try:
            out, err = lg.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            lg.kill()
            out, err = lg.communicate()
            res["error"] = "loadgen timed out"
        # whole-process CPU of the loadgen (setup included), for reference
        res["loadgen_wall_s"] = time.time() - t0
        lines = [ln for ln in ((result_line or "") + out).splitlines() if ln.startswith("{")]
        if lg.returncode == 0 and lines:
            res.update(json.loads(lines[-1]))
        else:
            res.setdefault("error", f"loadgen rc={lg.returncode}: {err.strip()[-600:]}")
        if err.strip() and "error" not in res:
            res["loadgen_stderr"] = err.strip()[-600:]
        if broker.proc is not None and broker.proc.poll() is not None:
            res["error"] = (res.get("error", "") + f" broker exited rc={broker.proc.returncode}"
                            f"{' (RSS limit)' if broker.killed_for_rss else ''}: {broker.log_tail(400)}").strip()
        res["rss_peak_kib"] = broker.peak_rss
        res["rss_end_kib"] = rss_kib(pid)
    finally:
        broker.stop()
    return res


# ----------------------------------------------------------------- report


def summarize(runs, names):
    """scenario -> broker -> aggregated figures (medians over repeats)."""
    out = {}
    for sc in dict.fromkeys(r["scenario"] for r in runs):
        out[sc] = {}
        for b in names:
            rs = [r for r in runs if r["scenario"] == sc and r["broker"] == b and "error" not in r]
            errs = [r["error"] for r in runs if r["scenario"] == sc and r["broker"] == b and "error" in r]
            agg = {"runs": len(rs), "errors": errs}
            if rs:
                agg["loadgen_cpu"] = median(r.get("loadgen_cpu") for r in rs)
                agg["loadgen_cpu_max"] = max((r.get("loadgen_cpu") or 0) for r in rs)
                agg["broker_cpu"] = median(r.get("broker_cpu") for r in rs)
                agg["steal"] = median(r.get("steal") for r in rs)
                agg["broker_core_other"] = median(r.get("broker_core_other") for r in rs)
                agg["disconnected"] = sum((r.get("subs_disconnected") or 0) + (r.get("pubs_disconnected") or 0)
                                          for r in rs)
                agg["rss_peak_kib"] = max(r.get("rss_peak_kib") or 0 for r in rs)
                if sc in THROUGHPUT:
                    agg["msgs_per_s"] = median(r["msgs_per_s"] for r in rs)
                    agg["sent_per_s"] = median(r["sent_per_s"] for r in rs)
                    agg["delivered_total"] = sum(r["delivered_total"] for r in rs)
                    if sc in ("qos1_fanin", "qos2"):
                        agg["expected_total"] = sum(r["acked_total"] for r in rs)
                    else:
                        agg["expected_total"] = sum(r["expected_total"] for r in rs)
                    agg["stall_kicks"] = sum(r.get("stall_kicks") or 0 for r in rs)
                    agg["fallback_parse"] = any(r.get("fallback_parse") for r in rs)
                elif sc == "latency":
                    agg["lat_ms"] = {k: median(r["lat_ms"][k] for r in rs)
                                     for k in ("p50", "p90", "p99", "p99.9", "max")}
                    agg["lat_runs"] = [r["lat_ms"] for r in rs]  # in run order, for paired ratios
                    agg["sent_per_s"] = median(r["sent_per_s"] for r in rs)
                    agg["delivered_total"] = sum(r["delivered_total"] for r in rs)
                    agg["expected_total"] = sum(r["sent_total"] for r in rs)
                elif sc == "conns":
                    agg["kib_per_conn"] = median(r.get("kib_per_conn") for r in rs)
                    agg["connections"] = median(r.get("connections") for r in rs)
                    agg["alive_at_measure"] = min(r.get("alive_at_measure", 0) for r in rs)
                    agg["connects_per_s"] = median(r.get("connects_per_s") for r in rs)
                    for k in ("broker_us_per_connect", "broker_us_per_close", "loadgen_us_per_conn"):
                        if all(r.get(k) is not None for r in rs):
                            agg[k] = median(r[k] for r in rs)
                    colds = [r["cold"] for r in rs if r.get("cold")]
                    if colds and len(colds) == len(rs):  # the loadgen's first round (--conn-warmup)
                        agg["cold"] = {k: median(c.get(k) for c in colds)
                                       for k in ("connects_per_s", "broker_us_per_connect",
                                                 "broker_us_per_close", "loadgen_us_per_conn")
                                       if all(c.get(k) is not None for c in colds)}
            out[sc][b] = agg
    return out


def print_report(summary, names, a):
    ours, mosq = "ours", "mosquitto"
    warnings = []
    W = 40
    print()
    print("=" * 100)
    print(f"{'scenario':<{W}} {'ours':>14} {'mosquitto':>14} {'ours/mosq':>10} {'target':>10}  ok")
    print("-" * 100)
    for sc, per in summary.items():
        if sc in THROUGHPUT:
            o = per.get(ours, {}).get("msgs_per_s")
            m = per.get(mosq, {}).get("msgs_per_s")
            ratio = o / m if o and m else None
            tgt = RATIO_TARGET[sc]
            ok = "" if ratio is None else ("yes" if ratio >= tgt else "NO")
            print(f"{TITLES[sc] + ' msg/s':<{W}} {fmt_num(o):>14} {fmt_num(m):>14} "
                  f"{fmt_num(ratio, 2):>10} {'>= ' + str(tgt):>10}  {ok}")
        elif sc == "latency":
            lo = per.get(ours, {}).get("lat_ms", {})
            lm = per.get(mosq, {}).get("lat_ms", {})
            title = f"Latency @ {a.rate:,.0f} msg/s QoS0, ms"
            print(f"{title:<{W}}")
            for k in ("p50", "p90", "p99", "p99.9", "max"):
                o, m = lo.get(k), lm.get(k)
                ratio = o / m if o and m else None
                tgt, ok = "", ""
                if k in LATENCY_RATIO_TARGET and ratio is not None:
                    tgt = f"<= {LATENCY_RATIO_TARGET[k]:g}x"
                    ok = "yes" if ratio <= LATENCY_RATIO_TARGET[k] else "NO"
                elif k == "p99" and o is not None:
                    tgt = f"< {P99_TARGET_MS:g} ms"
                    ok = "yes" if o < P99_TARGET_MS else "NO"
                print(f"{'  ' + k:<{W}} {fmt_num(o, 3):>14} {fmt_num(m, 3):>14} "
                      f"{fmt_num(ratio, 2):>10} {tgt:>10}  {ok}")
            # Each of our runs against the Mosquitto run right after it: on a shared host the
            # latency of both drifts from run to run far more than they differ, so the spread of
            # these ratios says how much the medians' ratio above can be trusted.
            ro, rm = per.get(ours, {}).get("lat_runs"), per.get(mosq, {}).get("lat_runs")
            if ro and rm and len(ro) == len(rm):
                for k in LATENCY_RATIO_TARGET:
                    pairs = sorted(x[k] / y[k] for x, y in zip(ro, rm) if x[k] and y[k])
                    if pairs:
                        print(f"{'  ' + k + ' ratio of paired runs':<{W}} {'':>14} {'':>14} "
                              f"{fmt_num(median(pairs), 2):>10}   range {pairs[0]:.2f}-{pairs[-1]:.2f}"
                              f" over {len(pairs)} pairs")
        elif sc == "conns":
            o = per.get(ours, {}).get("kib_per_conn")
            m = per.get(mosq, {}).get("kib_per_conn")
            ratio = o / m if o and m else None
            if ratio is not None:
                tgt, ok = f"<= {KIB_RATIO_TARGET:g}x", "yes" if ratio <= KIB_RATIO_TARGET else "NO"
            else:
                tgt, ok = f"<= {KIB_PER_CONN_TARGET:g}", "" if o is None else (
                    "yes" if o <= KIB_PER_CONN_TARGET else "NO")
            title = f"Memory, KiB per idle conn ({a.conns})"
            print(f"{title:<{W}} {fmt_num(o, 2):>14} {fmt_num(m, 2):>14} {fmt_num(ratio, 2):>10} "
                  f"{tgt:>10}  {ok}")
    print("=" * 100)

    # details: CPU utilisation, delivery, memory
    print()
    print(f"{'details (medians)':<26} {'broker':<10} {'brk CPU':>8} {'other':>6} {'lg CPU':>7} {'lg max':>7} "
          f"{'sent/s':>11} {'delivered/expected':>24} {'peak RSS':>10}")
    print("-" * 117)
    for sc, per in summary.items():
        for b in names:
            g = per.get(b)
            if not g:
                continue
            if not g["runs"]:
                print(f"{sc:<26} {b:<10} FAILED: {'; '.join(g['errors'])[:300]}")
                continue
            deliv = ""
            if "expected_total" in g:
                exp = g["expected_total"]
                pct = 100.0 * g["delivered_total"] / exp if exp else 0
                deliv = f"{g['delivered_total']:,}/{exp:,} ({pct:.1f}%)"
            elif sc == "conns":
                deliv = f"{g['alive_at_measure']:,} alive, {fmt_num(g['connects_per_s'])} conn/s"
            lg = g.get("loadgen_cpu")
            print(f"{sc:<26} {b:<10} {fmt_num((g.get('broker_cpu') or 0) * 100):>7}% "
                  f"{fmt_num((g.get('broker_core_other') or 0) * 100):>5}% {fmt_num((lg or 0) * 100):>6}% "
                  f"{fmt_num(g.get('loadgen_cpu_max', 0) * 100):>6}% "
                  f"{fmt_num(g.get('sent_per_s')):>11} {deliv:>24} {fmt_num(g['rss_peak_kib'] / 1024, 1):>8}MiB")
            if g.get("broker_us_per_connect") is not None:
                print(f"{'':<26} {'':<10} broker CPU {g['broker_us_per_connect']:.1f} us per connect (accept, "
                      f"CONNECT, CONNACK) + {g['broker_us_per_close']:.1f} us per close (DISCONNECT, close); "
                      f"load generator {g['loadgen_us_per_conn']:.1f} us per connect")
            c = g.get("cold") or {}
            if c.get("broker_us_per_connect") is not None:
                print(f"{'':<26} {'':<10} (its first round after start: {fmt_num(c['connects_per_s'])} conn/s, "
                      f"{c['broker_us_per_connect']:.1f} + {c['broker_us_per_close']:.1f} us; "
                      f"load generator {c['loadgen_us_per_conn']:.1f} us)")
            if g.get("loadgen_cpu_max", 0) > LOADGEN_CPU_WARN:
                warnings.append(f"{sc}/{b}: load generator used {g['loadgen_cpu_max'] * 100:.0f}% of its core "
                                f"-> it may be the bottleneck; this figure is a lower bound")
            if g.get("broker_cpu") is not None and sc in THROUGHPUT and g["broker_cpu"] < 0.8 \
                    and (g.get("loadgen_cpu_max") or 0) < LOADGEN_CPU_WARN:
                warnings.append(f"{sc}/{b}: neither broker ({g['broker_cpu'] * 100:.0f}%) nor loadgen is "
                                f"saturated -> latency/flow-control bound (or noisy host)")
            if (g.get("broker_core_other") or 0) > 0.10:
                warnings.append(f"{sc}/{b}: {g['broker_core_other'] * 100:.0f}% of the broker's core was used by "
                                f"something else (other processes / softirq) -> noisy figure")
            if g.get("disconnected"):
                warnings.append(f"{sc}/{b}: {g['disconnected']} client connection(s) were closed by the broker "
                                f"during the run")
            if sc in THROUGHPUT and g.get("msgs_per_s") == 0:
                warnings.append(f"{sc}/{b}: nothing was delivered during the measurement window "
                                f"({g['delivered_total']:,} before it) -> broker stalled")
            if (g.get("steal") or 0) > 0.05:
                warnings.append(f"{sc}/{b}: CPU steal {g['steal'] * 100:.0f}% of a core during the run (noisy host)")
            if sc in ("qos1_fanin", "qos2", "latency") and g.get("expected_total") \
                    and g["delivered_total"] < g["expected_total"]:
                warnings.append(f"{sc}/{b}: {g['expected_total'] - g['delivered_total']:,} acknowledged messages "
                                f"were not delivered to the subscriber by the end of the drain")
            if g.get("stall_kicks"):
                warnings.append(f"{sc}/{b}: broker stopped delivering while publishers were held back "
                                f"({g['stall_kicks']} stalls; queued messages stranded)")
            if g.get("fallback_parse"):
                warnings.append(f"{sc}/{b}: subscriber saw unexpected PUBLISH sizes; counted by parsing")
            if g["errors"]:
                warnings.append(f"{sc}/{b}: {len(g['errors'])} failed run(s): {g['errors'][0][:300]}")
    print("-" * 117)
    print("brk CPU = broker CPU time / wall time in the measurement window (1 core = 100%); other = rest of the "
          "broker's core\n(other processes, softirq); lg = load generator process (max over repeats in 'lg max').")
    print("QoS0 delivered/expected includes backlog still in flight when the run stopped (not necessarily loss).")
    if warnings:
        print()
        for w in warnings:
            print("WARNING: " + w)


# ----------------------------------------------------------------- main


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", default=",".join(ALL_SCENARIOS),
                   help=f"comma separated subset of {','.join(ALL_SCENARIOS)} (default: all)")
    p.add_argument("--only", choices=["ours", "mosquitto"], help="benchmark only one broker")
    p.add_argument("--duration", type=float, default=5.0, help="measurement window per run, s (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up before measuring, s (default 1)")
    p.add_argument("--drain", type=float, default=5.0, help="max wait for in-flight messages after a run, s")
    p.add_argument("--repeats", type=int, default=3, help="runs per broker and scenario; median reported")
    p.add_argument("--broker-cmd", default=DEFAULT_BROKER_CMD,
                   help="command for our broker; {host} {port} {python} are substituted "
                        f"(default: {DEFAULT_BROKER_CMD!r})")
    p.add_argument("--mosquitto-bin", default=shutil.which("mosquitto") or "/usr/sbin/mosquitto")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--broker-cpu", type=int, default=0, help="core for the broker (taskset)")
    p.add_argument("--loadgen-cpu", type=int, default=1, help="core for the load generator (taskset)")
    p.add_argument("--mqtt", type=int, choices=[4, 5], default=4, help="load protocol level (4 = MQTT 3.1.1)")
    p.add_argument("--publishers", type=int, default=8, help="publishers for fan-in / QoS1 / QoS2")
    p.add_argument("--subscribers", type=int, default=100, help="subscribers for QoS0 fan-out")
    p.add_argument("--window", type=int, default=32, help="QoS1/2 unacknowledged PUBLISHes per publisher")
    p.add_argument("--max-lag", type=int, default=1000,
                   help="QoS1/2: max messages published but not yet delivered (0 = unlimited)")
    p.add_argument("--rcvlowat", type=int, default=4096, help="SO_RCVLOWAT of QoS0 counting subscribers")
    p.add_argument("--rate", type=float, default=5000.0, help="latency scenario publish rate, msg/s")
    p.add_argument("--latency-duration", type=float, default=None,
                   help="measurement window for the latency scenario (default: --duration)")
    p.add_argument("--conns", type=int, default=5000, help="idle connections for the memory scenario")
    p.add_argument("--rss-limit-mb", type=int, default=4096, help="kill a broker whose RSS exceeds this")
    p.add_argument("--json", metavar="FILE", help="save all runs and the summary as JSON")
    p.add_argument("--persistent", action="store_true",
                   help="clients connect with clean session 0 (persistent sessions: measures the state store)")
    a = p.parse_args()

    print("command: " + " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv), flush=True)
    scenarios = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    bad = [s for s in scenarios if s not in ALL_SCENARIOS]
    if bad:
        p.error(f"unknown scenario(s) {bad}; choose from {ALL_SCENARIOS}")

    # fds: 5,000 connections need > 1024 on both sides; children inherit this
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as e:
        log(f"could not raise RLIMIT_NOFILE: {e}")
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if "conns" in scenarios and nofile < a.conns + 100:
        log(f"WARNING: RLIMIT_NOFILE={nofile} < {a.conns} connections; lower --conns or raise the hard limit")

    cpus = sorted(os.sched_getaffinity(0))
    if a.broker_cpu not in cpus or a.loadgen_cpu not in cpus or a.broker_cpu == a.loadgen_cpu:
        log(f"WARNING: cpus {cpus}: cannot pin broker to {a.broker_cpu} and loadgen to {a.loadgen_cpu}; not pinning")
        a.broker_cpu = a.loadgen_cpu = None
    elif not shutil.which("taskset"):
        log("WARNING: taskset not found; not pinning")
    else:
        # keep this orchestrator (RSS polling, etc.) off the broker's core
        os.sched_setaffinity(0, {a.loadgen_cpu})

    brokers = []
    notes = []
    if a.only in (None, "ours"):
        ok, why = our_broker_available(a.broker_cmd)
        if ok or a.broker_cmd != DEFAULT_BROKER_CMD:
            brokers.append(our_broker(a.broker_cmd))
        else:
            notes.append(f"our broker skipped: `{PY} -m broker --help` failed: {why.splitlines()[-1] if why else ''}")
    mosq_ver = None
    if a.only in (None, "mosquitto"):
        if a.mosquitto_bin and os.path.exists(a.mosquitto_bin):
            brokers.append(mosquitto_broker(a.mosquitto_bin))
            mosq_ver = mosquitto_version(a.mosquitto_bin)
        else:
            notes.append("mosquitto not found: skipped")
    for n in notes:
        print("NOTE: " + n, flush=True)
    if not brokers:
        print("nothing to benchmark", file=sys.stderr)
        return 2
    names = [b.name for b in brokers]
    print(f"brokers: {', '.join(names)}" + (f" ({mosq_ver})" if mosq_ver else "")
          + f"; broker core {a.broker_cpu}, loadgen core {a.loadgen_cpu}; MQTT {'3.1.1' if a.mqtt == 4 else '5'}"
          f" load with TCP_NODELAY; 64-byte payloads; warm-up {a.warmup}s, measure {a.duration}s, "
          f"{a.repeats} repeat(s), median", flush=True)

    runs = []
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="mqttbench-") as tmpdir:
        for sc in scenarios:
            for rep in range(a.repeats):
                for b in brokers:  # alternate: A B A B ...
                    log(f"[{time.time() - t_start:6.1f}s] {sc} #{rep + 1} {b.name} ...")
                    try:
                        r = run_one(a, b, sc, tmpdir)
                    except Exception as e:  # broker did not start, etc.
                        r = {"broker": b.name, "scenario": sc, "error": f"{type(e).__name__}: {e}"}
                    r["repeat"] = rep
                    runs.append(r)
                    if "error" in r:
                        log(f"    error: {r['error'][:500]}")
                    elif sc in THROUGHPUT:
                        log(f"    {r['msgs_per_s']:,.0f} msg/s  (broker CPU {100 * (r.get('broker_cpu') or 0):.0f}%,"
                            f" loadgen CPU {100 * r['loadgen_cpu']:.0f}%)")
                    elif sc == "latency":
                        log(f"    p50 {r['lat_ms']['p50']:.3f} ms  p99 {r['lat_ms']['p99']:.3f} ms")
                    elif sc == "conns":
                        log(f"    {r.get('kib_per_conn', float('nan')):.2f} KiB/conn")
    summary = summarize(runs, names)
    print_report(summary, names, a)
    if a.json:
        doc = {
            "command": [sys.executable] + sys.argv,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "host": {"platform": platform.platform(), "python": platform.python_version(),
                     "cpus": os.cpu_count(), "nofile": nofile},
            "mosquitto_version": mosq_ver,
            "args": vars(a),
            "notes": notes,
            "summary": summary,
            "runs": runs,
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"\nresults saved to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
