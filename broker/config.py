"""Configuration: defaults < TOML file (--config) < environment (MQTT_BROKER_*) < command line."""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field

from .config_check import DOC, LISTENER, ConfigError, check, did_you_mean, sections

__all__ = ["Config", "ConfigError", "MQTTConfig", "load", "read_toml"]


@dataclass
class MQTTConfig:
    """Protocol limits and the capabilities advertised in CONNACK ([mqtt] in the TOML file)."""
    receive_maximum: int = 1024          # QoS 1/2 PUBLISHes a client may have unacknowledged towards us
    maximum_qos: int = 2
    retain_available: bool = True
    maximum_packet_size: int = 268435455  # bytes; larger inbound packets get DISCONNECT 0x95
    topic_alias_maximum: int = 10        # inbound aliases a v5 client may use (Mosquitto's default)
    outbound_topic_aliases: bool = True  # assign aliases towards clients that allow them
    wildcard_subscription_available: bool = True
    subscription_identifiers_available: bool = True
    shared_subscription_available: bool = True
    server_keep_alive: int = 0           # 0: accept the client's keep alive
    max_keep_alive: int = 65535
    session_expiry_maximum: int = 604800  # seconds (7 days) an offline session is kept at most; 0xFFFFFFFF: no cap
    persistent_client_expiration: int = 604800  # seconds a 3.1.x clean-session-0 session is kept offline
    max_queued_messages: int = 1000      # per session; when full the newest message is dropped
    queue_qos0_messages: bool = False    # queue QoS 0 for offline persistent sessions
    validate_payload_format: bool = True  # 0x99 when Payload Format Indicator=1 and payload isn't UTF-8
    max_client_id_length: int = 65535
    max_topic_levels: int = 128
    max_topic_length: int = 65535        # bytes of a topic name or filter
    publish_will_on_shutdown: bool = False
    session_owner_check: bool = True     # a session's client id is refused (0x87) to other users
    connect_timeout: float = 10.0        # seconds to receive CONNECT after the TCP connection
    close_linger_seconds: float = 2.0    # after a server DISCONNECT: input dropped this long at most...
    close_linger_bytes: int = 1048576    # ...and this much at most, before the socket is closed
    max_connections: int = 0             # 0: unlimited
    max_connect_packet_size: int = 131072  # bytes a packet may have before CONNECT is accepted (0x95)
    max_subscriptions_per_client: int = 1000  # filters a session may hold; more get SUBACK 0x97
    max_filters_per_subscribe: int = 10000  # more in one SUBSCRIBE: DISCONNECT 0x97
    max_retained_replay: int = 100000    # retained messages waiting to be sent to one session
    match_cache_entries: int = 100000    # topics remembered by the subscription match cache
    match_cache_bytes: int = 16777216    # total topic length the match cache may hold
    max_topic_alias_bytes: int = 65536   # topic length held by one connection's inbound aliases (0x97)
    max_sessions: int = 100000           # sessions held, connected + offline; a new one beyond: 0x97; 0: unlimited


@dataclass
class Config:
    host: str = "0.0.0.0"
    port: int = 1883
    data_dir: str = "./data"
    log_level: str = "INFO"
    log_format: str = "text"
    mqtt: MQTTConfig = field(default_factory=MQTTConfig)
    listeners: list = field(default_factory=list)  # [[listeners]]: extra TLS / WebSocket listeners
    metrics: dict = field(default_factory=dict)   # [metrics]: Prometheus /metrics, /health, $SYS
    persistence: dict = field(default_factory=dict)  # [persistence]: sessions/retained in SQLite
    sink: dict = field(default_factory=dict)      # [sink]: see config/broker.toml
    history: dict = field(default_factory=dict)   # [history]: the Spark job
    extra: dict = field(default_factory=dict)     # [auth] and [dashboard], read by those modules


SECTIONS_IN_CONFIG = ("sink", "history", "metrics", "persistence")  # dict fields of Config


def apply_setting(cfg: Config, section: str, key: str, value, source: str = "",
                  text: bool = False) -> None:
    """Check section.key (ConfigError naming it) and store it; text: a string from --set / env."""
    if section == "listeners":
        raise ConfigError(f"listeners.{key}", "listeners are [[listeners]] tables in the config "
                          "file; they cannot be set from --set or the environment", value, source)
    value = check(section, key, value, source, text)
    if section == "broker":
        setattr(cfg, key, value)
    elif section == "mqtt":
        setattr(cfg.mqtt, key, value)
    elif section in SECTIONS_IN_CONFIG:
        getattr(cfg, section)[key] = value
    else:  # auth, dashboard
        cfg.extra.setdefault(section, {})[key] = value


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


def check_listeners(value, source: str = "") -> list:
    if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
        raise ConfigError("listeners", "must be [[listeners]] tables (see the end of "
                          f"{DOC})", value, source)
    schema = {"listeners": LISTENER}
    for i, spec in enumerate(value):
        for key, v in spec.items():
            check("listeners", key, v, source, schema=schema, name=f"listeners[{i}].{key}")
    return value


def listener_specs(cfg: Config) -> list[dict]:
    """The plain TCP listener, then [[listeners]] with their defaults; ConfigError for a bad one."""
    specs = [{"type": "tcp", "host": cfg.host, "port": cfg.port, "name": "mqtt"}]
    for i, spec in enumerate(check_listeners(cfg.listeners)):
        spec = dict(spec)
        spec.setdefault("type", "tcp")
        spec.setdefault("host", cfg.host)
        spec.setdefault("name", f"{spec['type']}{i}")
        where = f"listeners[{i}]"
        if "port" not in spec:
            raise ConfigError(f"{where}.port", f"missing: a {spec['type']} listener needs a port "
                              "(1-65535, or 0 for any free port)")
        if spec["type"] in ("tls", "wss") and not spec.get("certfile"):
            raise ConfigError(f"{where}.certfile", f"missing: a {spec['type']} listener needs "
                              "certfile (PEM certificate chain; keyfile if the key is apart)")
        if spec.get("use_identity_as_username") and (spec["type"] not in ("tls", "wss")
                                                    or not spec.get("cafile")):
            raise ConfigError(f"{where}.use_identity_as_username", "needs type tls or wss and "
                              "a cafile to verify client certificates with", True)
        specs.append(spec)
    return specs


def check_tls_files(cfg: Config) -> None:
    """Load every TLS listener's certificate once, so a bad file stops the broker before it starts."""
    from .transport import tls
    for i, spec in enumerate(listener_specs(cfg)[1:]):
        if spec["type"] in ("tls", "wss"):
            try:
                tls.make_context(spec)
            except ValueError as exc:
                raise ConfigError(f"listeners[{i}].certfile", str(exc), spec["certfile"]) from None


def read_toml(path: str) -> dict:
    """The TOML file at path; ConfigError saying what is wrong (shared with sink.job)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("--config", "the file does not exist", path) from None
    except OSError as exc:
        raise ConfigError("--config", f"cannot read the file: {exc.strerror or exc}", path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"not valid TOML: {exc}", path) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("--config", f"not valid TOML (not UTF-8): {exc.reason}", path) from None


def load(path: str | None = None, env: dict | None = None, sets=(), flags=()) -> Config:
    """Defaults < the TOML file < MQTT_BROKER_* environment < --set SECTION.KEY=VALUE < flags
    ((section, key, value, flag) tuples); every key checked, ConfigError for the first bad one."""
    cfg = Config()
    if path:
        apply_file(cfg, read_toml(path), os.path.basename(path))
    env = os.environ if env is None else env
    # Containers: MQTT_BROKER_PORT=1884, MQTT_BROKER_MQTT__RECEIVE_MAXIMUM=100, MQTT_BROKER_SINK__TOPIC=x,
    # MQTT_BROKER_AUTH__PASSWORD_FILE=/etc/broker/passwd, MQTT_BROKER_METRICS__ENABLED=true
    for var in sorted(env):
        if not var.startswith("MQTT_BROKER_"):
            continue
        parts = var[len("MQTT_BROKER_"):].lower().split("__")
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
