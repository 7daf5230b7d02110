"""What every configuration key accepts, and the one error every bad setting raises.

A ConfigError reads as one line: which key, the value given (and where from: the file, --set or
an MQTT_BROKER_* variable), what is wrong and what is allowed. The loader (broker/config.py)
checks every key against sections() below, so each command that loads the config (python -m broker,
python -m sink.job) stops before starting anything and its main() prints the line and exits 2.
"""
from __future__ import annotations

import difflib
import functools
import math
import re
from dataclasses import MISSING, fields

_NO_VALUE = object()
DOC = "config/broker.toml"


class ConfigError(ValueError):
    """A setting the person running the broker must fix: str() is one line."""

    def __init__(self, key: str, problem: str, value=_NO_VALUE, source: str = ""):
        self.key, self.problem, self.value, self.source = key, problem, value, source
        text = key if value is _NO_VALUE else f"{key} = {show(value)}"
        if source:
            text += f" ({source})"
        super().__init__(one_line(f"{text}: {problem}"))


def show(value) -> str:
    """A value as the config file would spell it (true, not True)."""
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)


def one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def did_you_mean(name: str, known, prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _num_range(lo, hi, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"from {lo} to {hi}"
    if lo is not None:
        return f"> {lo}" if lo_open else f">= {lo}"
    return ""


# ---- what a key accepts: check(value, text) returns the value to keep or raises ValueError
# with the allowed values; `text` is True for strings from --set / the environment.
class Spec:
    allowed = ""

    def check(self, value, text: bool):
        raise NotImplementedError

    def bad(self):
        raise ValueError(f"must be {self.allowed}")


class Bool(Spec):
    allowed = "true or false"

    def check(self, value, text):
        if text and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            self.bad()
        return value


class Num(Spec):
    """A number (int or float); Int below: a whole number. lo/hi inclusive unless lo_open."""
    whole = False

    def __init__(self, lo=None, hi=None, lo_open: bool = False):
        self.lo, self.hi, self.lo_open = lo, hi, lo_open
        kind = "a whole number" if self.whole else "a number"
        self.allowed = f"{kind} {_num_range(lo, hi, lo_open)}".strip()

    def check(self, value, text):
        if text and isinstance(value, str):
            try:
                value = int(value) if self.whole else float(value)
            except ValueError:
                self.bad()
        if isinstance(value, bool) or not isinstance(value, int if self.whole else (int, float)):
            self.bad()
        lo, hi = self.lo, self.hi
        too_low = lo is not None and (value <= lo if self.lo_open else value < lo)
        if not math.isfinite(value) or too_low or (hi is not None and value > hi):
            self.bad()
        return value


class Int(Num):
    whole = True


class Str(Spec):
    allowed = "a string"

    def check(self, value, text):
        if not isinstance(value, str):
            self.bad()
        return value


class Enum(Spec):
    def __init__(self, *choices: str, any_case: bool = False):
        self.choices, self.any_case = choices, any_case
        self.allowed = "one of " + ", ".join(repr(c) for c in choices)

    def check(self, value, text):
        if not isinstance(value, str):
            self.bad()
        if (value.upper() if self.any_case else value) not in self.choices:
            self.bad()
        return value


class Pattern(Str):
    def __init__(self, regex: str, allowed: str):
        self.regex, self.allowed = re.compile(regex), allowed

    def check(self, value, text):
        if not isinstance(value, str) or not self.regex.fullmatch(value):
            self.bad()
        return value


class StrList(Spec):
    """A list of strings; a comma-separated string too (what --set and the environment give)."""
    allowed = 'a list of strings, e.g. ["a", "b"] (or "a,b")'

    def check(self, value, text):
        if isinstance(value, str):
            return value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.bad()
        return value


class IntList(Spec):
    allowed = "a list of whole numbers >= 0, e.g. [1, 2] (or \"1,2\")"

    def check(self, value, text):
        items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else \
            value if isinstance(value, list) else [value]
        for v in items:
            if not (v.strip().isdigit() if isinstance(v, str) else
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                self.bad()
        return value


class Table(Spec):
    """A free-form table passed on as is ([sink.kafka], [history.kafka])."""

    def __init__(self, where: str):
        self.allowed = f"a table ({where} in the config file)"

    def check(self, value, text):
        if text or not isinstance(value, dict):
            self.bad()
        return value


class HostPorts(Spec):
    allowed = '"HOST:PORT[,HOST:PORT...]" ("" = an embedded Kafka)'

    def check(self, value, text):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            self.bad()
        for hp in items:
            if not isinstance(hp, str):
                self.bad()
            host, _, port = hp.strip().rpartition(":")
            if hp.strip() and (not host or not port.isdigit() or not 0 < int(port) < 65536):
                self.bad()
        return value


class Rules(Spec):
    allowed = 'a list of { filter = "a/#", topic = "kafka.topic" } tables'

    def check(self, value, text):
        rules = [{"filter": f, "topic": t} for f, t in value.items()] \
            if isinstance(value, dict) else value
        if not isinstance(rules, list) or not all(
                isinstance(r, dict) and isinstance(r.get("filter"), str) and r["filter"]
                and isinstance(r.get("topic"), str) and r["topic"] for r in rules):
            self.bad()
        return value


class Check(Str):
    """A string checked by fn (raises ValueError); "" allowed when empty_ok."""

    def __init__(self, fn, allowed: str, empty_ok: bool = True):
        self.fn, self.allowed, self.empty_ok = fn, allowed, empty_ok

    def check(self, value, text):
        if not isinstance(value, str):
            self.bad()
        if value or not self.empty_ok:
            try:
                self.fn(value)
            except ValueError:
                self.bad()
        return value


def _connect_url(url: str) -> None:
    # stdlib-only module; one parser for sc:// URLs
    from sink.query import connect_address
    connect_address(url)


def _starting_offsets(v: str) -> None:
    if v not in ("earliest", "latest") and not v.lstrip().startswith("{"):
        raise ValueError(v)


PORT = Int(0, 65535)
SECONDS = Num(0)
COUNT = Int(0)

# ---- the keys ---------------------------------------------------------------------------------
BROKER = {
    "host": Str(), "port": PORT, "data_dir": Str(),
    "log_level": Enum("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", any_case=True),
    "log_format": Enum("text", "json"),
}

# [mqtt]: the type of each MQTTConfig field (int: whole number >= 0), with these bounds.
MQTT_BOUNDS = {
    "receive_maximum": Int(1, 65535),                  # [MQTT-3.2.2.3.3] 0 is a Protocol Error
    "maximum_qos": Int(0, 2),
    "maximum_packet_size": Int(1, 268435455),
    "topic_alias_maximum": Int(0, 65535),
    "server_keep_alive": Int(0, 65535),
    "max_keep_alive": Int(0, 65535),
    "session_expiry_maximum": Int(0, 0xFFFFFFFF),
    "max_client_id_length": Int(1, 65535),
    "max_topic_levels": Int(1),
    "max_topic_length": Int(1, 65535),
    "connect_timeout": Num(0, lo_open=True),
}


def _from_dataclass(cls, bounds: dict) -> dict:
    out = {}
    for f in fields(cls):
        default = f.default if f.default is not MISSING else None
        out[f.name] = bounds.get(f.name) or (
            Bool() if isinstance(default, bool) else Int(0) if isinstance(default, int)
            else SECONDS if isinstance(default, float) else Str())
    return out


SINK = {
    "enabled": Bool(), "bootstrap_servers": HostPorts(), "topic": Pattern(r".+", "a Kafka topic name"),
    "rules": Rules(), "exclude": StrList(),
    "durability": Enum("spool", "async", "none"),
    "spool_dir": Str(), "spool_max_bytes": Int(1), "spool_segment_bytes": Int(4096),
    "keep_until": Enum("kafka", "history"), "committed_file": Str(),
    "replay_window_seconds": SECONDS, "replay_window_messages": COUNT,
    "embedded_port": PORT, "embedded_log_file": Str(), "stats_interval": SECONDS,
    "forwarder": Enum("process", "thread"), "forwarder_cpus": IntList(), "forwarders": Int(1, 256),
    "max_inflight": Int(1), "drain_timeout_seconds": SECONDS, "kafka": Table("[sink.kafka]"),
}

HISTORY = {
    "table": Str(), "checkpoint": Str(), "kafka_topics": StrList(),
    "trigger_seconds": Num(0, lo_open=True),
    "source": Enum("auto", "kafka", "python"),
    "max_records_per_trigger": COUNT,
    "dedup_window": Pattern(r"\s*\d+\s+(second|minute|hour|day|week)s?\s*",
                            "a duration like '24 hours' or '30 minutes'"),
    "starting_offsets": Check(_starting_offsets, "'earliest', 'latest' or a JSON offsets object",
                              empty_ok=False),
    "connect": Bool(), "connect_host": Str(), "connect_port": Int(1, 65535),
    "kafka": Table("[history.kafka]"),
}

PERSISTENCE = {
    "enabled": Bool(), "path": Str(),
    "synchronous": Enum("OFF", "NORMAL", "FULL", "EXTRA", any_case=True),
    "max_pending_changes": Int(1),
}

METRICS = {"enabled": Bool(), "host": Str(), "port": PORT, "sys_interval": SECONDS}

DASHBOARD = {
    "enabled": Bool(), "host": Str(), "port": PORT,
    "sample_seconds": Num(0.2, 3600), "keep_points": Int(10, 100000),
    "max_topics": Int(0, 10_000_000), "max_topics_listed": Int(1, 100000),
    "max_clients_listed": Int(1, 100000),
    "connect_url": Check(_connect_url, '"sc://HOST:PORT" ("" = the history job\'s)'),
    "history_timeout_seconds": Num(1, 3600), "history_max_days": Num(0.001, 36600),
    "users": StrList(),
}

AUTH = {
    "allow_anonymous": Bool(), "password_file": Str(), "acl_file": Str(),
    "cache_seconds": SECONDS, "reload_interval": SECONDS, "decision_cache_size": COUNT,
    "client_id_pattern": Str(), "max_pending_checks": Int(1), "check_threads": COUNT,
    "max_deferred_bytes": COUNT,
}

LISTENER = {
    "type": Enum("tcp", "tls", "ws", "wss"), "port": PORT, "host": Str(), "name": Str(),
    "path": Pattern(r"/.*", 'a URL path starting with "/"'),
    "certfile": Str(), "keyfile": Str(), "cafile": Str(),
    "require_client_cert": Bool(), "use_identity_as_username": Bool(),
}


@functools.cache
def sections() -> dict:
    from .config import MQTTConfig  # the dataclass is the list of [mqtt] keys
    return {"broker": BROKER, "mqtt": _from_dataclass(MQTTConfig, MQTT_BOUNDS), "sink": SINK,
            "history": HISTORY, "persistence": PERSISTENCE, "metrics": METRICS,
            "dashboard": DASHBOARD, "auth": AUTH}


def check(section: str, key: str, value, source: str = "", text: bool = False, schema=None,
          name: str = ""):
    """The value to keep for section.key, or ConfigError naming the key and what it accepts."""
    schema = schema or sections()
    name = name or f"{section}.{key}"
    if section not in schema:
        raise ConfigError(name, f"unknown section [{section}]{did_you_mean(section, schema)}; "
                          f"sections: {', '.join(schema)}, listeners", value, source)
    spec = schema[section].get(key)
    if spec is None:
        raise ConfigError(name, "unknown setting" + did_you_mean(key, schema[section], f"{section}.")
                          + f"; the keys of [{section}] are listed in {DOC}", value, source)
    try:
        return spec.check(value, text)
    except ValueError as exc:
        raise ConfigError(name, str(exc), value, source) from None


def report(exc: Exception) -> int:
    """main()'s answer to a configuration error: one line on stderr, exit status 2."""
    import sys
    print(f"config error: {one_line(exc)}", file=sys.stderr)
    return 2
