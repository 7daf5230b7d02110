"""Loading: defaults < TOML file (--config) < environment (MQTT_BROKER_*) < --set < flags.

Every key is checked once, here, into the typed tree (settings/tree.py); the first bad one is a
ConfigError (one line naming it). Cross-key rules (a listener's port, certfile...) too.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .checks import DOC, ConfigError, check, did_you_mean
from .environment import SETTINGS_PREFIX
from .tree import Config, ListenerConfig, sections

if TYPE_CHECKING:
    import tomllib


def apply_setting(cfg: Config, section: str, key: str, value: Any, source: str = "",
                  text: bool = False) -> None:
    """Check section.key (ConfigError naming it) and store it; text: a string from --set / env."""
    if section == "listeners":
        raise ConfigError(f"listeners.{key}", "listeners are [[listeners]] tables in the config "
                          "file; they cannot be set from --set or the environment", value, source)
    value = check(section, key, value, sections(), source, text)
    setattr(cfg if section == "broker" else getattr(cfg, section), key, value)


def apply_file(cfg: Config, data: dict, source: str) -> None:
    schema = sections()
    for section, table in data.items():
        if section == "listeners":
            cfg.listeners = check_listeners(table, source)
        elif not isinstance(table, dict):
            homes = [s for s in schema if section in schema[s]]
            hint = f" (did you mean {homes[0]}.{section} under [{homes[0]}]?)" if homes else ""
            raise ConfigError(section, f"a setting outside any table{hint}; settings belong in "
                              f"[{'], ['.join(schema)}]", table, source)
        elif section not in schema:
            raise ConfigError(f"[{section}]", f"unknown section{did_you_mean(section, schema)}; "
                              f"sections: {', '.join(schema)}, listeners", source=source)
        else:
            for key, value in table.items():
                apply_setting(cfg, section, key, value, source)


def check_listeners(value: Any, source: str = "") -> list[ListenerConfig]:
    """[[listeners]] tables (or ListenerConfigs) as ListenerConfigs, every key checked."""
    if not isinstance(value, list) or not all(isinstance(x, (dict, ListenerConfig))
                                              for x in value):
        raise ConfigError("listeners", "must be [[listeners]] tables (see the end of "
                          f"{DOC})", value, source)
    return [spec if isinstance(spec, ListenerConfig) else
            ListenerConfig.from_table(spec, source, name=f"listeners[{i}]")
            for i, spec in enumerate(value)]


def listener_specs(cfg: Config) -> list[ListenerConfig]:
    """The plain TCP listener, then [[listeners]] with host and name filled in; ConfigError for
    a bad one."""
    specs = [ListenerConfig(type="tcp", host=cfg.host, port=cfg.port, name="mqtt")]
    for i, spec in enumerate(check_listeners(cfg.listeners)):
        spec = dataclasses.replace(spec, host=spec.host or cfg.host,
                                   name=spec.name or f"{spec.type}{i}")
        where = f"listeners[{i}]"
        if spec.port is None:
            raise ConfigError(f"{where}.port", f"missing: a {spec.type} listener needs a port "
                              "(1-65535, or 0 for any free port)")
        if spec.type in ("tls", "wss") and not spec.certfile:
            raise ConfigError(f"{where}.certfile", f"missing: a {spec.type} listener needs "
                              "certfile (PEM certificate chain; keyfile if the key is apart)")
        if spec.use_identity_as_username and (spec.type not in ("tls", "wss") or not spec.cafile):
            raise ConfigError(f"{where}.use_identity_as_username", "needs type tls or wss and "
                              "a cafile to verify client certificates with", True)
        specs.append(spec)
    return specs


def read_toml(path: str) -> dict:
    """The TOML file at path; ConfigError saying what is wrong."""
    import tomllib  # only with a file: a broker started without --config does not load it
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("--config", "the file does not exist", path) from None
    except OSError as exc:
        raise ConfigError("--config", f"cannot read the file: {exc.strerror or exc}", path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"{path}:{_toml_line(exc)}: not valid TOML: {exc}",
                          path) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("--config", f"not valid TOML (not UTF-8): {exc.reason}", path) from None


def _toml_line(exc: tomllib.TOMLDecodeError) -> int:
    """The line a TOML syntax error is on (tomllib says it in its message: "(at line 3, column
    9)", or "(at end of document)")."""
    line = getattr(exc, "lineno", None)  # Python 3.14+
    if line is None:
        m = re.search(r"at line (\d+)", str(exc))
        line = int(m.group(1)) if m else len(getattr(exc, "doc", "").splitlines()) or 1
    return line


def load(path: str | None = None, env: Mapping[str, str] | None = None, sets: Iterable[str] = (),
         flags: Iterable[tuple[str, str, Any, str]] = ()) -> Config:
    """Defaults < the TOML file < MQTT_BROKER_* environment < --set SECTION.KEY=VALUE < flags
    ((section, key, value, flag) tuples); every key checked, ConfigError for the first bad one."""
    cfg = Config()
    if path:
        apply_file(cfg, read_toml(path), os.path.basename(path))
    env = os.environ if env is None else env
    # Containers: MQTT_BROKER_PORT=1884, MQTT_BROKER_MQTT__RECEIVE_MAXIMUM=100, MQTT_BROKER_SINK__TOPIC=x,
    # MQTT_BROKER_AUTH__PASSWORD_FILE=/etc/broker/passwd, MQTT_BROKER_METRICS__ENABLED=true
    for var in sorted(env):
        if not var.startswith(SETTINGS_PREFIX):
            continue
        parts = var[len(SETTINGS_PREFIX):].lower().split("__")
        if len(parts) == 1:
            parts = ["broker", parts[0]]
        if len(parts) != 2 or not all(parts):
            raise ConfigError(".".join(parts), "not a setting: use MQTT_BROKER_<KEY> for [broker] "
                              "keys and MQTT_BROKER_<SECTION>__<KEY> for others (nested tables "
                              "only in the config file)", env[var], var)
        apply_setting(cfg, parts[0], parts[1], env[var], var, text=True)
    for item in sets:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name:
            raise ConfigError("--set", "expected SECTION.KEY=VALUE, e.g. --set "
                              "mqtt.maximum_qos=1", item)
        apply_setting(cfg, section, name, raw, "--set", text=True)
    for section, key, value, flag in flags:
        apply_setting(cfg, section, key, value, flag)
    listener_specs(cfg)
    return cfg
