"""The job's command line and settings: the arguments (those it shares with the broker are
settings/parts.py's), the run's tree, and :class:`Job`, what one run of the history job reads."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from settings import HistoryConfig, SinkConfig

Flag = tuple[str, str, Any, str]   # (section, key, value, the flag that set it)

_HISTORY, _SINK = HistoryConfig(), SinkConfig()   # the defaults --help names: the tree's
SOURCES = ("auto", "kafka", "python")

class UsageError(Exception):
    """A problem the person running the job must fix (bad flag, config, path...)."""


@dataclass
class Job:
    """One run of the history job: its [history] section as the tree loaded and checked it
    (settings/tree.py: table, trigger_seconds, source, connect_*, the upkeep and catalog keys...),
    and what the rest of the config file and the command line add."""
    history: HistoryConfig = field(default_factory=HistoryConfig)
    # Kafka: [sink] bootstrap_servers (or --kafka-bootstrap); none: the broker's embedded Kafka
    bootstrap: str = f"127.0.0.1:{_SINK.embedded_port}"
    # [history] kafka_topics (or --kafka-topic); none: the topics [sink] forwards to
    topics: list[str] = field(default_factory=lambda: [_SINK.topic])
    # the broker's data directory: its secrets (settings/secrets.py: the Spark Connect token, the
    # key that signs records and the committed file). None (tests): no token, nothing checked
    data_dir: str | None = None
    available_now: bool = False   # --available-now: what Kafka holds now, then exit
    embedded_kafka: bool = False  # the broker's embedded Kafka (empty after each restart: routine)
    log_level: str = "INFO"       # [broker] log_level (the job's own: --log-level, $SINK_LOG_LEVEL)
    # the broker's MQTT listener ([broker] host and port): the rules publish through it
    broker_host: str = "127.0.0.1"
    broker_port: int = 1883

    @classmethod
    def of(cls, **values: Any) -> Job:
        """A Job from keywords: its own fields, the rest [history] keys (tests, benchmarks)."""
        own = {k: values.pop(k) for k in list(values) if k in cls.__dataclass_fields__}
        return cls(history=HistoryConfig(**values), **own)

    def kafka_options(self) -> dict[str, str]:
        """Options understood by both Spark's kafka source and sink.history.source (same names):
        Kafka client properties of [history.kafka] (security.protocol, sasl.mechanism,
        ssl.cafile, ...) as kafka.<name>."""
        h = self.history
        opts = {"kafka.bootstrap.servers": self.bootstrap, "startingOffsets": h.starting_offsets}
        if len(self.topics) == 1 and self.topics[0].startswith("re:"):
            opts["subscribePattern"] = self.topics[0][3:]
        else:
            opts["subscribe"] = ",".join(self.topics)
        if h.max_records_per_trigger:   # 0: no cap
            opts["maxOffsetsPerTrigger"] = str(h.max_records_per_trigger)
        for name, value in h.kafka.items():
            opts[f"kafka.{name}"] = str(value).lower() if isinstance(value, bool) else str(value)
        return opts

    def validate(self) -> "Job":
        """What no single key says (each key was checked when the tree loaded it)."""
        if not self.topics or any(not t for t in self.topics):
            raise UsageError("no Kafka topic given: use --kafka-topic T or [history] kafka_topics")
        if any(t.startswith("re:") for t in self.topics) and len(self.topics) > 1:
            raise UsageError("a topic pattern (re:<regex>) cannot be combined with other topics")
        if self.history.jdbc and not self.history.jdbc_password_file:
            raise UsageError("[history] jdbc = true needs operators' accounts: set [history] "
                             "jdbc_password_file to a password file of their own (python -m "
                             "broker.auth passwd FILE add USER), not the devices' [auth] "
                             "password_file")
        return self


def load_job(path: str | None, flags: Iterable[Flag] = (), available_now: bool = False,
             sets: Iterable[str] = (), shared: Iterable[Flag] = (),
             with_broker: bool = False) -> tuple[Job, list[str]]:
    """The job from the run's tree (settings/parts.py): the config file (none: the tree's
    defaults), the MQTT_BROKER_* environment, --set items and the flags the broker shares
    (`shared`), as the broker builds it from the same arguments, then the job's own flags
    (--table, --trigger-seconds...: (section, key, value, flag) tuples); and notes to log.
    Every key is checked the way the broker checks it (settings.ConfigError: one line naming
    the key), and a --set or flag that nothing running reads is refused (with_broker: the
    broker runs beside, scripts/run.sh)."""
    from settings import ConfigError, load, parts
    from settings.load import apply_setting
    sets, shared, flags = list(sets), list(shared), list(flags)
    cfg = load(path, sets=sets, flags=shared)
    file_history = dataclasses.replace(cfg.history)   # what a broker given the same arguments reads
    for section, key, value, flag in flags:
        apply_setting(cfg, section, key, value, flag)
    commands = [parts.JOB] + ([parts.BROKER] if with_broker else [])
    parts.check_used(cfg, parts.set_keys(sets) + [(f[0], f[1], f[3]) for f in shared + flags],
                     commands, "the history job" + (" and the broker" if with_broker else ""))
    sink, hist = cfg.sink, cfg.history
    notes = table_notes(file_history, hist, sink.keep_until, path)
    # [sink] is the broker's section (config/broker.toml): read Kafka from where it forwards to
    bootstrap, embedded = sink.bootstrap_servers, not sink.bootstrap_servers
    if embedded:   # empty = the broker starts an embedded Kafka on this port
        if sink.embedded_port <= 0:
            raise ConfigError("sink.embedded_port", "an embedded Kafka on a random port cannot "
                              "be found by the history job: give its address with "
                              "--kafka-bootstrap", sink.embedded_port, os.path.basename(path or ""))
        bootstrap = f"127.0.0.1:{sink.embedded_port}"
    topics = [sink.topic]
    for rule in sink.rules:
        if rule.topic not in topics:
            topics.append(rule.topic)
    # [history] kafka_topics (() means: the topics [sink] forwards to), or --kafka-topic
    topics = list(hist.kafka_topics) or topics
    if hist.jdbc and same_file(hist.jdbc_password_file, cfg.auth.password_file):
        raise UsageError(f"[history] jdbc_password_file is the devices' password file ([auth] "
                         f"password_file {cfg.auth.password_file}): an MQTT login must not open "
                         "the whole history over JDBC. Give the operators a file of their own "
                         "(python -m broker.auth passwd FILE add USER)")
    job = Job(hist, bootstrap, topics, data_dir=cfg.data_dir, available_now=available_now,
              embedded_kafka=embedded, log_level=cfg.log_level,
              broker_host=cfg.host, broker_port=cfg.port)
    return job.validate(), notes


def same_file(a: str, b: str) -> bool:
    """Both name one file (by path, or as hard/symbolic links of one file)."""
    if not a or not b:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def build_parser() -> argparse.ArgumentParser:
    from settings import environment, parts
    p = argparse.ArgumentParser(
        prog="python -m sink.job",
        description="Copy MQTT messages from Kafka into the Parquet history table "
                    "(Spark Structured Streaming, exactly once, duplicate message ids dropped).",
        formatter_class=environment.HelpFormatter,
        epilog="Flags override the config file, which overrides the defaults. "
               "Query the table with: python -m sink.query \"SELECT ... FROM messages\"\n\n"
               + environment.epilog(environment.JOB))
    parts.add_arguments(p, log_level_help="the job's log level: DEBUG, INFO, WARNING or ERROR "
                                          f"(default ${environment.SINK_LOG_LEVEL.name}, else "
                                          "log_level of the settings: INFO)")
    p.add_argument("--with-broker", action="store_true",
                   help="the broker runs beside this job with the same arguments "
                        "(scripts/run.sh): settings only the broker reads are accepted here")
    p.add_argument("--table", metavar="DIR", help=f"history table directory (default {_HISTORY.table})")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="checkpoint directory (default: <table>_checkpoint beside the table)")
    p.add_argument("--kafka-topic", metavar="T", action="append",
                   help=f"Kafka topic to read (repeat or comma-separate for several; "
                        f"re:<regex> for a pattern; default {_SINK.topic})")
    p.add_argument("--trigger-seconds", metavar="N", type=float,
                   help=f"micro-batch interval in seconds (default {_HISTORY.trigger_seconds:g})")
    p.add_argument("--source", choices=SOURCES,
                   help="Kafka reader: Spark's connector (kafka), our Python source (python), or "
                        "auto: the connector when it is on the classpath (default auto)")
    p.add_argument("--available-now", action="store_true",
                   help="process the records that are in Kafka now, then exit")
    p.add_argument("--connect-port", metavar="N", type=int,
                   help=f"serve Spark Connect on this port while the job runs (default "
                        f"{_HISTORY.connect_port}, or [history] connect_port)")
    p.add_argument("--no-verify-records", action="store_true",
                   help="keep Kafka records that do not carry the broker's signature (other "
                        "producers); [history] verify_records = false")
    p.add_argument("--no-connect", action="store_true",
                   help="do not serve Spark Connect (sink.query then starts its own session)")
    p.add_argument("--nice", metavar="N", type=int,
                   help=f"run at this niceness (0-19; default {_HISTORY.nice}, or [history] nice): "
                        "on a machine shared with the broker, the broker's CPU comes first")
    return p


#: flag (its argparse dest) -> the key it sets
FLAG_KEYS = {"table": ("history", "table"), "checkpoint": ("history", "checkpoint"),
             "trigger_seconds": ("history", "trigger_seconds"), "source": ("history", "source"),
             "connect_port": ("history", "connect_port"), "nice": ("history", "nice")}


def flags_of(args: argparse.Namespace) -> list[Flag]:
    """The keys the job's own flags set, as (section, key, value, flag) for the tree to check
    (the flags it shares with the broker: settings.parts.flags_of)."""
    flags = [(*key, getattr(args, dest), "--" + dest.replace("_", "-"))
             for dest, key in FLAG_KEYS.items() if getattr(args, dest, None) is not None]
    if getattr(args, "kafka_topic", None):
        flags.append(("history", "kafka_topics", ",".join(args.kafka_topic), "--kafka-topic"))
    if getattr(args, "no_connect", False):
        flags.append(("history", "connect", False, "--no-connect"))
    if getattr(args, "no_verify_records", False):
        flags.append(("history", "verify_records", False, "--no-verify-records"))
    return flags


def config_from_args(argv: Sequence[str] | None = None) -> tuple[Job, argparse.Namespace]:
    from settings import environment, parts
    args = build_parser().parse_args(argv)
    job, args.notes = load_job(args.config, flags_of(args), args.available_now, sets=args.set,
                               shared=parts.flags_of(args), with_broker=args.with_broker)
    # the job's own level: --log-level, else $SINK_LOG_LEVEL, else the tree's log_level
    if args.log_level is None:
        args.log_level = environment.SINK_LOG_LEVEL.get() or job.log_level
    if not isinstance(logging.getLevelName(args.log_level.upper()), int):
        raise UsageError(f"${environment.SINK_LOG_LEVEL.name} must be DEBUG, INFO, WARNING or "
                         f"ERROR, not {args.log_level!r}")
    return job, args


def table_notes(configured: HistoryConfig, used: HistoryConfig, keep_until: str,
                path: str | None) -> list[str]:
    """A warning when the broker keeps records until the table has them ([sink] keep_until =
    "history") and --table / --checkpoint make the job report its commits somewhere else than
    the config's [history] says, which is where the broker looks for them."""
    from sink.history.commits import committed_path
    mine = committed_path(used.table, used.checkpoint or None)
    theirs = committed_path(configured.table, configured.checkpoint or None)
    if keep_until != "history" or os.path.abspath(mine) == os.path.abspath(theirs):
        return []
    flags = " ".join(f"{f} {v}" for f, v, was in (("--table", used.table, configured.table),
                                                  ("--checkpoint", used.checkpoint,
                                                   configured.checkpoint)) if v != was)
    return [f"{flags}: this job reports what the table committed in {mine}, but the broker reads "
            f"{theirs} ([history] of {path or 'the default config'}): with [sink] "
            "keep_until = \"history\" its spool keeps every record until spool_max_bytes, then "
            "refuses publishers. Set [history] table/checkpoint in the config both use instead "
            "of the flags"]

