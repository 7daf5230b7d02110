"""Which part of a run reads which setting, and the command line the parts share.

A run (scripts/run.sh) is two commands: the broker (``python -m broker``: its MQTT server and,
as configured, its Kafka sink and forwarders, history replay, the dashboard, the cluster mode)
and the history job (``python -m sink.job``). Both take the same arguments (``add_arguments``:
--config, --set, --data-dir and the broker's flags) and read the same environment, so they build
the same tree (settings/load.py) and a setting reaches the part that reads it.

A setting given on the command line (--set, a flag) that no running part reads is refused,
naming the part that would (``check_used``): ``--set history.jdbc=true`` to a broker started
alone reaches nothing. A command started beside the other (run.sh: ``--with-job``,
``--with-broker``) counts the other's parts as running. The config file and the environment are
not checked this way: one file or environment commonly serves several commands.

A leaf module: the standard library only.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from .checks import ConfigError
from .tree import Config

BROKER, SINK, REPLAY, DASHBOARD, CLUSTER, JOB = (
    "broker", "sink", "replay", "dashboard", "cluster", "job")

#: what each part is, and how it runs (said when a setting of a part that does not run is given)
PARTS = {
    BROKER: "the broker (python -m broker)",
    SINK: "the broker's Kafka sink (python -m broker --sink, or [sink] enabled = true)",
    REPLAY: "history replay (with the broker's Kafka sink and [replay] enabled = true)",
    DASHBOARD: "the dashboard (--set dashboard.enabled=true; scripts/run.sh starts it unless "
               "DASHBOARD=0)",
    CLUSTER: "the cluster mode (--set cluster.enabled=true)",
    JOB: "the history job (python -m sink.job)",
}

#: the part a section belongs to
SECTION_PART = {"broker": BROKER, "mqtt": BROKER, "persistence": BROKER, "auth": BROKER,
                "metrics": BROKER, "sink": SINK, "history": JOB, "replay": REPLAY,
                "dashboard": DASHBOARD, "cluster": CLUSTER}

#: keys read by other parts too than their section's
ALSO = {
    ("broker", "data_dir"): {JOB},       # the secrets, the job's status file
    ("broker", "log_level"): {JOB},
    ("sink", "bootstrap_servers"): {JOB, REPLAY, CLUSTER},   # where the job reads Kafka
    ("sink", "embedded_port"): {JOB},
    ("sink", "topic"): {JOB, REPLAY},
    ("sink", "rules"): {JOB, REPLAY},
    ("sink", "keep_until"): {JOB},
    ("sink", "kafka"): {REPLAY},
    ("history", "table"): {SINK, REPLAY},    # the committed file (keep_until = "history")
    ("history", "checkpoint"): {SINK, REPLAY},
    ("history", "kafka_topics"): {REPLAY},
    ("history", "verify_records"): {REPLAY},
    ("history", "connect_host"): {DASHBOARD},  # where the dashboard's history charts ask
    ("history", "connect_port"): {DASHBOARD},
    # the rules' MQTT client may publish to their topics; the admin API lists them
    ("history", "rules"): {BROKER},
}


def readers(section: str, key: str) -> set[str]:
    """The parts that read section.key."""
    return {SECTION_PART.get(section, BROKER)} | ALSO.get((section, key), set())


def running(cfg: Config, commands: Iterable[str]) -> set[str]:
    """The parts that run when `commands` ("broker", "job") start with the tree cfg."""
    out = set()
    if BROKER in commands:
        out.add(BROKER)
        if cfg.sink.enabled:
            out.add(SINK)
            if cfg.replay.enabled:
                out.add(REPLAY)
        if cfg.dashboard.enabled:
            out.add(DASHBOARD)
        if cfg.cluster.enabled:
            out.add(CLUSTER)
    if JOB in commands:
        out.add(JOB)
    return out


def set_keys(sets: Iterable[str]) -> list[tuple[str, str, str]]:
    """(section, key, "--set") of each SECTION.KEY=VALUE item (load() has checked them)."""
    out = []
    for item in sets:
        section, _, name = item.partition("=")[0].strip().partition(".")
        out.append((section, name, "--set"))
    return out


def check_used(cfg: Config, given: Iterable[tuple[str, str, str]], commands: Iterable[str],
               command: str) -> None:
    """ConfigError for the first (section, key, source) given that no running part reads,
    naming the part that would. A part's `enabled` switch is never refused (turning off a part
    that does not run is harmless; turning one on starts it)."""
    commands = list(commands)
    now = running(cfg, commands)
    for section, key, source in given:
        if key == "enabled" or section == "listeners":
            continue
        parts = readers(section, key)
        if parts & now:
            continue
        who = sorted(parts, key=list(PARTS).index)
        value = getattr(cfg if section == "broker" else getattr(cfg, section), key)
        off = [p for p in who if (JOB if p == JOB else BROKER) in commands]
        if off:   # a part of this command, switched off
            problem = (f"not used: it is read by {PARTS[off[0]]}, which is off here; turn it "
                       "on or leave the setting out")
        else:
            problem = (f"not used by {command}: it is read by "
                       f"{' and '.join(PARTS[p] for p in who)}, which this command does not "
                       "start; give it to that command (scripts/run.sh starts the broker and "
                       "the job with the same arguments)")
        raise ConfigError(f"{section}.{key}", problem, value, source)


# ---- the command line the broker and the history job share ---------------------------------

def add_arguments(p: argparse.ArgumentParser,
                  log_level_help: str = "DEBUG, INFO, WARNING or ERROR (default INFO)") -> None:
    """--config, --set, --data-dir and the broker's flags, each setting one key of the tree."""
    p.add_argument("--config", metavar="FILE", help="TOML configuration file (see config/broker.toml)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one setting, e.g. --set mqtt.receive_maximum=100 (repeatable)")
    p.add_argument("--data-dir", metavar="DIR", help="where state on disk goes, and the secrets "
                                                     "the broker and the job share (default ./data)")
    p.add_argument("--host", help="address the broker listens on (default 127.0.0.1: this "
                                  "machine only; 0.0.0.0 for every interface, then see [auth] "
                                  "in docs/security.md)")
    p.add_argument("--port", type=int, help="the broker's MQTT TCP port (default 1883)")
    p.add_argument("--kafka-bootstrap", metavar="HOST:PORT",
                   help="the Kafka the broker forwards accepted messages to (enables the sink) "
                        "and the job reads (default: the broker's embedded Kafka)")
    p.add_argument("--sink", action="store_true",
                   help="enable the Kafka sink; with no bootstrap servers an embedded Kafka starts")
    p.add_argument("--no-sink", action="store_true", help="disable the Kafka sink even if configured")
    p.add_argument("--log-level", help=log_level_help)
    p.add_argument("--log-format", choices=["text", "json"], help="log line format (default text)")
    p.add_argument("--check-config", action="store_true",
                   help="check the settings and exit: 0 when valid, else 2 with one line saying "
                        "which key is wrong")


FlagTuple = tuple[str, str, Any, str]


def flags_of(args: argparse.Namespace) -> list[FlagTuple]:
    """The keys add_arguments' flags set, as (section, key, value, flag) for load()."""
    flags: list[FlagTuple] = [
        ("broker", name, getattr(args, name), "--" + name.replace("_", "-"))
        for name in ("host", "port", "data_dir", "log_level", "log_format")
        if getattr(args, name, None) is not None]
    if getattr(args, "kafka_bootstrap", None):
        flags += [("sink", "bootstrap_servers", args.kafka_bootstrap, "--kafka-bootstrap"),
                  ("sink", "enabled", True, "--kafka-bootstrap")]
    if getattr(args, "sink", False):
        flags.append(("sink", "enabled", True, "--sink"))
    if getattr(args, "no_sink", False):
        flags.append(("sink", "enabled", False, "--no-sink"))
    return flags
