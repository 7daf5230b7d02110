"""What a configuration key accepts (a Spec), and the one error every bad setting raises.

A ConfigError reads as one line: which key, the value given (and where from: the file, --set or
an MQTT_BROKER_* variable), what is wrong and what is allowed. Each field of the typed tree
(settings/tree.py) carries its Spec; Spec.check returns the value in the field's type (a tuple
for a list, "a,b" from --set split), so the tree holds only checked, typed values.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, NoReturn

_NO_VALUE = object()
DOC = "config/broker.toml"


class ConfigError(ValueError):
    """A setting the person running the broker must fix: str() is one line."""

    def __init__(self, key: str, problem: str, value: Any = _NO_VALUE, source: str = "") -> None:
        self.key, self.problem, self.value, self.source = key, problem, value, source
        text = key if value is _NO_VALUE else f"{key} = {show(value)}"
        if source:
            text += f" ({source})"
        super().__init__(one_line(f"{text}: {problem}"))


def show(value: object) -> str:
    """A value as the config file would spell it (true, not True)."""
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)


def one_line(text: object) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def did_you_mean(name: str, known: Iterable[str], prefix: str = "") -> str:
    import difflib  # only for a mistake: not loaded into a broker that starts
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _num_range(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"from {lo} to {hi}"
    if lo is not None:
        return f"> {lo}" if lo_open else f">= {lo}"
    return ""


# ---- what a key accepts: check(value, text) returns the value to keep or raises ValueError
# with the allowed values; `text` is True for strings from --set / the environment.
class Spec:
    allowed = ""

    def check(self, value: Any, text: bool) -> Any:
        raise NotImplementedError

    def bad(self) -> NoReturn:
        raise ValueError(f"must be {self.allowed}")


class Bool(Spec):
    allowed = "true or false"

    def check(self, value: Any, text: bool) -> Any:
        if text and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            self.bad()
        return value


class Num(Spec):
    """A number (int or float); Int below: a whole number. lo/hi inclusive unless lo_open."""
    whole = False

    def __init__(self, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open
        kind = "a whole number" if self.whole else "a number"
        self.allowed = f"{kind} {_num_range(lo, hi, lo_open)}".strip()

    def check(self, value: Any, text: bool) -> Any:
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
        return int(value) if self.whole else float(value)


class Int(Num):
    whole = True


class Str(Spec):
    allowed = "a string"

    def check(self, value: Any, text: bool) -> Any:
        if not isinstance(value, str):
            self.bad()
        return value


class Enum(Spec):
    def __init__(self, *choices: str, any_case: bool = False) -> None:
        self.choices, self.any_case = choices, any_case
        self.allowed = "one of " + ", ".join(repr(c) for c in choices)

    def check(self, value: Any, text: bool) -> Any:
        if not isinstance(value, str):
            self.bad()
        if self.any_case:
            value = value.upper()
        if value not in self.choices:
            self.bad()
        return value


class Pattern(Str):
    def __init__(self, regex: str, allowed: str) -> None:
        self.regex, self.allowed = re.compile(regex), allowed

    def check(self, value: Any, text: bool) -> Any:
        if not isinstance(value, str) or not self.regex.fullmatch(value):
            self.bad()
        return value


class StrList(Spec):
    """A list of strings; a comma-separated string too (what --set and the environment give)."""
    allowed = 'a list of strings, e.g. ["a", "b"] (or "a,b")'

    def check(self, value: Any, text: bool) -> Any:
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            self.bad()
        return tuple(value)


class IntList(Spec):
    allowed = "a list of whole numbers >= 0, e.g. [1, 2] (or \"1,2\")"

    def check(self, value: Any, text: bool) -> Any:
        items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else \
            value if isinstance(value, (list, tuple)) else [value]
        for v in items:
            if not (v.strip().isdigit() if isinstance(v, str) else
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                self.bad()
        return tuple(int(v) for v in items)


class Table(Spec):
    """A free-form table passed on as is ([sink.kafka], [history.kafka])."""

    def __init__(self, where: str) -> None:
        self.allowed = f"a table ({where} in the config file)"

    def check(self, value: Any, text: bool) -> Any:
        if text or not isinstance(value, dict):
            self.bad()
        return dict(value)


class HostPorts(Spec):
    allowed = '"HOST:PORT[,HOST:PORT...]" ("" = an embedded Kafka)'

    def check(self, value: Any, text: bool) -> Any:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            self.bad()
        for hp in items:
            if not isinstance(hp, str):
                self.bad()
            host, _, port = hp.strip().rpartition(":")
            if hp.strip() and (not host or not port.isdigit() or not 0 < int(port) < 65536):
                self.bad()
        return ",".join(hp.strip() for hp in items if hp.strip())  # "" = the embedded Kafka


class Rule(NamedTuple):
    """One [sink] rules entry: MQTT topic filter -> Kafka topic."""
    filter: str
    topic: str


class Rules(Spec):
    allowed = 'a list of { filter = "a/#", topic = "kafka.topic" } tables'

    def check(self, value: Any, text: bool) -> Any:
        rules = [{"filter": f, "topic": t} for f, t in value.items()] \
            if isinstance(value, dict) else value
        rules = [r._asdict() if isinstance(r, Rule) else r for r in rules] \
            if isinstance(rules, (list, tuple)) else rules
        if not isinstance(rules, list) or not all(
                isinstance(r, dict) and isinstance(r.get("filter"), str) and r["filter"]
                and isinstance(r.get("topic"), str) and r["topic"] and len(r) == 2
                for r in rules):
            self.bad()
        return tuple(Rule(r["filter"], r["topic"]) for r in rules)


class HistoryRules(Spec):
    """[[history.rules]]: continuous rules (settings/rules.py); not settable with --set."""
    allowed = 'a list of [[history.rules]] tables with name, sql and publish and/or table'

    def check(self, value: Any, text: bool) -> Any:
        from . import rules
        if text or not isinstance(value, (list, tuple)):
            self.bad()
        out = tuple(r if isinstance(r, rules.RuleSpec) else rules.check(r, rules.CONFIG)
                    for r in value)
        names = [r.name for r in out]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rule names must differ: {', '.join(dup)} given more than once")
        return out


class Check(Str):
    """A string checked by fn (raises ValueError); "" allowed when empty_ok."""

    def __init__(self, fn: Callable[[str], object], allowed: str, empty_ok: bool = True) -> None:
        self.fn, self.allowed, self.empty_ok = fn, allowed, empty_ok

    def check(self, value: Any, text: bool) -> Any:
        if not isinstance(value, str):
            self.bad()
        if value or not self.empty_ok:
            try:
                self.fn(value)
            except ValueError:
                self.bad()
        return value


def connect_address(url: str) -> tuple[str, int]:
    """(host, port) of an sc://host:port[/;params] URL; ValueError when it is not one."""
    if not url.startswith("sc://"):
        raise ValueError(f"a Spark Connect URL looks like sc://HOST:PORT, not {url!r}")
    hostport = url[len("sc://"):].split("/")[0].split(";")[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a Spark Connect URL looks like sc://HOST:PORT, not {url!r}")
    return host.strip("[]"), int(port)


def starting_offsets(v: str) -> None:
    if v not in ("earliest", "latest") and not v.lstrip().startswith("{"):
        raise ValueError(v)


_DURATION_UNITS = {"s": 1000, "sec": 1000, "second": 1000, "m": 60_000, "min": 60_000,
                   "minute": 60_000, "h": 3_600_000, "hour": 3_600_000, "d": 86_400_000,
                   "day": 86_400_000, "w": 604_800_000, "week": 604_800_000}


def duration_ms(text: str) -> int | None:
    """'400d', '12h', '30 days', '2 weeks' -> milliseconds; '' -> None (off); ValueError else."""
    import re
    if text is None or not str(text).strip():
        return None
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]+?)s?\s*", str(text).lower())
    if not m or m.group(2) not in _DURATION_UNITS or int(m.group(1)) <= 0:
        raise ValueError(f"not a duration: {text!r} (e.g. '400d', '12h', '30 days')")
    return int(m.group(1)) * _DURATION_UNITS[m.group(2)]


PORT = Int(0, 65535)
SECONDS = Num(0)
COUNT = Int(0)


def check(section: str, key: str, value: Any, schema: dict[str, dict[str, Spec]], source: str = "",
          text: bool = False,
          name: str = "") -> Any:
    """The value to keep for section.key, or ConfigError naming the key and what it accepts;
    schema: {table: {key: Spec}} (settings.tree.sections() for the whole file)."""
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
