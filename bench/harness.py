"""What the broker-against-Mosquitto benchmarks share (bench/bench.py, bench/storm.py,
bench/idle_devices.py): the checkout's Python, a free port, a broker process started, waited
for and stopped, the figures /proc gives of a process, and the orchestrator's command line,
file limit and loop over repeats and brokers.

The scripts run as ``.venv/bin/python bench/SCRIPT.py``: Python puts bench/ first on sys.path, so
they ``import harness`` (this file) as it is.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VENV_PY = os.path.join(REPO, ".venv", "bin", "python")
PY = VENV_PY if os.path.exists(VENV_PY) else sys.executable


# ----------------------------------------------------------------- a process and its figures

def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def pin(cpu) -> list[str]:
    """The taskset prefix that keeps a command on core `cpu` ([] without one or without taskset)."""
    return ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []


def schedstat_s(pid: int) -> float | None:
    """CPU seconds of a process, all its threads (schedstat, ns)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:
                pass
    except OSError:
        return None
    return total / 1e9


def status_kib(pid: int, key: str) -> int | None:
    """A KiB figure of /proc/PID/status (VmRSS, VmHWM...), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def terminate(proc: subprocess.Popen | None, wait: float) -> None:
    """SIGTERM, then SIGKILL when the process has not ended after `wait` seconds."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def log_tail(path: str, n: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode(errors="replace").strip()
    except OSError:
        return ""


class BrokerProc:
    """A broker command in its own session, its output appended to a log file."""

    def __init__(self, name: str, argv: list[str], cwd: str, log: str):
        self.name, self.argv, self.cwd, self.logpath = name, argv, cwd, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> int:
        self.logf = open(self.logpath, "ab")
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, stdout=self.logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        return self.proc.pid

    def wait_port(self, host: str, port: int, timeout: float = 120.0) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if port_open(host, port):
                return True
            time.sleep(0.005)
        return False

    def stop(self) -> None:
        terminate(self.proc, 60)
        if self.proc is not None:
            self.logf.close()
        self.proc = None

    def tail(self, n: int = 600) -> str:
        return log_tail(self.logpath, n)


def run_dir(tmp: str, name: str, rep: int) -> str:
    """A fresh data directory for one run of a broker, below `tmp`."""
    datadir = os.path.join(tmp, f"{name}-{rep}")
    os.makedirs(datadir)
    # Mosquitto started as root runs as the user `mosquitto`: it must be able to write here
    os.chmod(tmp, 0o755)
    os.chmod(datadir, 0o777)
    return datadir


def broker_proc(a, name: str, port: int, datadir: str, mosquitto_conf: str) -> BrokerProc:
    """Broker `name` (not started) on a.host:port, pinned to --broker-cpu, its log in datadir:
    "ours" runs --broker-cmd, "mosquitto" --mosquitto-bin with a config of a listener,
    anonymous clients and the lines `mosquitto_conf`."""
    if name == "ours":
        argv = shlex.split(a.broker_cmd.format(python=PY, host=a.host, port=port, datadir=datadir))
    else:
        conf = os.path.join(datadir, "mosquitto.conf")
        with open(conf, "w") as f:
            f.write(f"listener {port} {a.host}\nallow_anonymous true\n{mosquitto_conf}")
        argv = [a.mosquitto_bin, "-c", conf]
    return BrokerProc(name, pin(a.broker_cpu) + argv, REPO, os.path.join(datadir, "broker.log"))


# ----------------------------------------------------------------- the orchestrator

def add_broker_args(p: argparse.ArgumentParser, repeats: int, broker_cmd_note: str = "") -> None:
    """The options of a comparison of our broker with Mosquitto, one core each side."""
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--only", choices=["ours", "mosquitto"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--broker-cpu", type=int, default=0)
    p.add_argument("--loadgen-cpu", type=int, default=1)
    p.add_argument("--broker-cmd", default="{python} -m broker --host {host} --port {port} "
                                           "--data-dir {datadir}",
                   help="our broker ({python} {host} {port} {datadir} substituted)" + broker_cmd_note)
    p.add_argument("--mosquitto-bin", default=shutil.which("mosquitto") or "/usr/sbin/mosquitto")
    p.add_argument("--json", metavar="FILE")


def raise_file_limit() -> tuple[int, int]:
    """The open-file limit raised to its hard limit: (soft, hard) after."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard


def print_command() -> None:
    print("command: " + " ".join(shlex.quote(x) for x in [sys.executable] + sys.argv), flush=True)


def broker_names(a) -> list[str]:
    """ours, mosquitto, as --only asks and when --mosquitto-bin exists."""
    names = [n for n in ("ours", "mosquitto") if a.only in (None, n)]
    if "mosquitto" in names and not os.path.exists(a.mosquitto_bin):
        print("NOTE: mosquitto not found: skipped")
        names.remove("mosquitto")
    return names


def run_repeats(a, names: list[str], tmp: str, run_one: Callable[[Any, str, str, int], dict],
                show: Callable[[dict], str]) -> list[dict]:
    """run_one(a, name, tmp, repeat) of every broker, --repeats times, each run's dict (an
    "error" for one that raised) printed to stderr with show(run) as it ends."""
    runs = []
    for rep in range(a.repeats):
        for name in names:
            print(f"[{datetime.datetime.now():%H:%M:%S}] {name} #{rep + 1} ...", file=sys.stderr,
                  flush=True)
            try:
                r = run_one(a, name, tmp, rep)
            except Exception as exc:
                r = {"broker": name, "error": f"{type(exc).__name__}: {exc}"}
            r["repeat"] = rep
            runs.append(r)
            print(f"    {show(r)}", file=sys.stderr, flush=True)
    return runs


def show_json(r: dict) -> str:
    return json.dumps(r)
