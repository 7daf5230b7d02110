"""Every environment variable the project reads, declared once: its name, what it does, and the
commands whose ``--help`` lists it (``epilog``). Settings proper are keys of the tree
(settings/tree.py), which the broker also takes from ``MQTT_BROKER_*`` variables
(settings/load.py); the variables here are the rest: secrets kept out of files and command
lines, where the admin client finds the dashboard, switches for tests and benchmarks, and what
other programs set (systemd, spark-submit). The deployment's own variables (docker compose's,
deploy/compose.yaml) are declared here too, so one table lists them all (README
"Environment variables").

Code reads a variable through its declaration (``SINK_KEY.get()``); the few modules that may
not import settings (the leaf kafka_client, the codec's loader) name it, and
tests/unit/test_environment.py finds every name read anywhere and fails on one not declared here.

A leaf module: the standard library only.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    meaning: str
    commands: tuple[str, ...]   # the commands (python -m ...) whose --help lists it

    def get(self, default: str | None = None) -> str | None:
        """Its value now (read at each call: tests and child processes set it)."""
        return os.environ.get(self.name, default)

    def is_set(self) -> bool:
        return bool(os.environ.get(self.name))


BROKER, JOB, QUERY, MAINTAIN, ADMIN = "broker", "sink.job", "sink.query", "sink.maintain", "broker.admin"
COMPOSE = "deploy/compose.yaml"   # read by docker compose / podman-compose, not by Python

#: MQTT_BROKER_<KEY> ([broker] keys) and MQTT_BROKER_<SECTION>__<KEY>: any key of the tree
SETTINGS_PREFIX = "MQTT_BROKER_"
SETTINGS = EnvVar(SETTINGS_PREFIX + "*", "any setting: MQTT_BROKER_<KEY> for [broker] keys, "
                  "MQTT_BROKER_<SECTION>__<KEY> for the others (e.g. MQTT_BROKER_MQTT__MAXIMUM_QOS=1); "
                  "above the config file, below --set and flags", (BROKER, JOB, ADMIN, QUERY))

SPARK_CONNECT_TOKEN = EnvVar(
    "SPARK_CONNECT_AUTHENTICATE_TOKEN", "the history job's Spark Connect token, instead of "
    "<data_dir>/secrets/spark_connect.token (Spark's own variable)", (BROKER, JOB, QUERY))
SINK_KEY = EnvVar(
    "MQTT_SINK_KEY", "the broker's key (64 hex digits) that signs Kafka records and the job's "
    "committed file, instead of <data_dir>/secrets/sink.key; the same for the broker and the job "
    "(and every node of a cluster: deploy/compose.yaml passes it on)", (BROKER, JOB, COMPOSE))
CLUSTER_KEY = EnvVar(
    "MQTT_CLUSTER_KEY", "the key (64 hex digits) the nodes of a cluster sign their Kafka records "
    "with, instead of cluster.key_file; the same on every node (deploy/compose.yaml passes it on)",
    (BROKER, COMPOSE))
PURE_PYTHON = EnvVar(
    "MQTT_PURE_PYTHON", "1: run the pure-Python codec and core even where the compiled ones are built "
    "(broker/native.py)", (BROKER,))
NOTIFY_SOCKET = EnvVar(
    "NOTIFY_SOCKET", "set by systemd (Type=notify, deploy/broker.service): the broker says READY=1 "
    "there once it listens, and STOPPING=1", (BROKER,))
RUST_LOG = EnvVar(
    "RUST_LOG", "the embedded Kafka's (Tansu's) log level (default warn)", (BROKER,))
SINK_LOG_LEVEL = EnvVar(
    "SINK_LOG_LEVEL", "the history job's log level when --log-level is not given (default INFO)",
    (JOB,))
SINK_CONNECT_URL = EnvVar(
    "SINK_CONNECT_URL", "sc://HOST:PORT of a history job's Spark Connect server for sink.query "
    "(default: the config's [history] connect_host/connect_port); --connect overrides it", (QUERY,))
SPARK_MASTER = EnvVar(
    "SPARK_MASTER", "the Spark master of a local session (default local[2]); spark-submit's "
    "--master wins", (JOB, QUERY, MAINTAIN))
SPARK_SUBMIT = EnvVar(
    "SPARK_SUBMIT", "set by spark-submit: the job takes Spark's settings from its command line",
    (JOB,))
PYSPARK_GATEWAY_PORT = EnvVar(
    "PYSPARK_GATEWAY_PORT", "set by spark-submit (the JVM is there already); as SPARK_SUBMIT",
    (JOB,))
SINK_HISTORY_CRASH_AT = EnvVar(
    "SINK_HISTORY_CRASH_AT", "tests only: the table's writer exits at this step of a commit "
    "(sink/history/manifest.py), to check that a crash there loses nothing", ())
ADMIN_URL = EnvVar(
    "BROKER_ADMIN_URL", "the dashboard's address for broker.admin (default "
    "http://127.0.0.1:<[dashboard] port>); --url overrides it", (ADMIN,))
ADMIN_USER = EnvVar(
    "BROKER_ADMIN_USER", "the operator account broker.admin logs in as (default admin); --user "
    "overrides it", (ADMIN,))
ADMIN_PASSWORD = EnvVar(
    "BROKER_ADMIN_PASSWORD", "that account's password (else BROKER_ADMIN_PASSWORD_FILE)", (ADMIN,))
ADMIN_PASSWORD_FILE = EnvVar(
    "BROKER_ADMIN_PASSWORD_FILE", "a file whose first line is that password (default "
    "<data_dir>/dashboard-admin-password); --password-file overrides it", (ADMIN,))
JAVA_HOME = EnvVar(
    "JAVA_HOME", "Java's own: the JVM the history job runs (Spark's choice); its class-data archive "
    "is made for that JVM (sink/history/job/class_archive.py)", (JOB,))
PYTHONPATH = EnvVar(
    "PYTHONPATH", "Python's own: passed on, with the project's root first, to the processes the "
    "broker and the job start (forwarder, history worker, Spark's Python workers)", ())

# docker compose's variables in deploy/compose.yaml (and compose.tansu.yaml)
MQTT_ALLOW_ANONYMOUS = EnvVar(
    "MQTT_ALLOW_ANONYMOUS", "true: anonymous clients may connect from anywhere (sets "
    "MQTT_BROKER_AUTH__ALLOW_ANONYMOUS; default false)", (COMPOSE,))
MQTT_PORT = EnvVar("MQTT_PORT", "the host port of MQTT (default 1883)", (COMPOSE,))
METRICS_PORT = EnvVar("METRICS_PORT", "the host port of /metrics and /health on 127.0.0.1 "
                      "(default 9100)", (COMPOSE,))
DASHBOARD_PORT = EnvVar("DASHBOARD_PORT", "the host port of the dashboard on 127.0.0.1 "
                        "(default 18083)", (COMPOSE,))
CONNECT_PORT = EnvVar("CONNECT_PORT", "the host port of the job's Spark Connect on 127.0.0.1 "
                      "(default 15002)", (COMPOSE,))
CLUSTER_MQTT_PORT = EnvVar("CLUSTER_MQTT_PORT", "the host port of the cluster profile's HAProxy "
                           "(default 1884)", (COMPOSE,))
BASE_IMAGE = EnvVar("BASE_IMAGE", "the images' base (default python:3.11-slim-bookworm)",
                    (COMPOSE,))

ALL: tuple[EnvVar, ...] = tuple(v for v in list(globals().values()) if isinstance(v, EnvVar))
BY_NAME = {v.name: v for v in ALL}


def epilog(command: str, width: int = 100) -> str:
    """The --help paragraph listing the variables `command` reads (with HelpFormatter)."""
    mine = [v for v in ALL if command in v.commands]
    if not mine:
        return ""
    col = min(max(len(v.name) for v in mine) + 4, 38)
    lines = ["environment variables:"]
    for v in mine:
        head = f"  {v.name}".ljust(col)
        if len(head) > col:   # a long name: its meaning on the next line
            lines.append(head.rstrip())
            head = " " * col
        lines.append(textwrap.fill(v.meaning, width, initial_indent=head,
                                   subsequent_indent=" " * col))
    return "\n".join(lines)


def terminal_columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else the terminal's, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but a paragraph of the description or epilog that has line breaks
    of its own (the list of variables) is kept as written; the others are wrapped as usual."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:  # argparse's default, without importing shutil (and the compression
            width = terminal_columns() - 2  # modules it loads: 0.6 MiB) into every broker
        super().__init__(prog, indent_increment, max_help_position, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(
            "\n".join(indent + line for line in part.splitlines()) if "\n" in part
            else super(HelpFormatter, self)._fill_text(part, width, indent)
            for part in text.split("\n\n"))
