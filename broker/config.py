"""Configuration: defaults < TOML file (--config) < environment (MQTT_BROKER_*) < command line."""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields


@dataclass
class MQTTConfig:
    """Protocol limits and the capabilities advertised in CONNACK ([mqtt] in the TOML file)."""
    receive_maximum: int = 1024          # QoS 1/2 PUBLISHes a client may have unacknowledged towards us
    maximum_qos: int = 2
    retain_available: bool = True
    maximum_packet_size: int = 268435455  # bytes; larger inbound packets get DISCONNECT 0x95
    topic_alias_maximum: int = 65535     # inbound aliases a v5 client may use
    outbound_topic_aliases: bool = True  # assign aliases towards clients that allow them
    wildcard_subscription_available: bool = True
    subscription_identifiers_available: bool = True
    shared_subscription_available: bool = True
    server_keep_alive: int = 0           # 0: accept the client's keep alive
    max_keep_alive: int = 65535
    session_expiry_maximum: int = 0xFFFFFFFF
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
    extra: dict = field(default_factory=dict)     # other tables, kept for optional components


def _apply(obj, table: dict, where: str) -> None:
    known = {f.name: f for f in fields(obj)}
    for key, value in table.items():
        if key not in known:
            raise ValueError(f"unknown setting {where}{key!r}: see config/broker.toml for the keys")
        current = getattr(obj, key)
        if isinstance(current, MQTTConfig):
            _apply(current, value, f"{where}{key}.")
        elif isinstance(current, bool) and not isinstance(value, bool):
            raise ValueError(f"setting {where}{key} must be true or false, not {value!r}")
        elif isinstance(current, (int, float)) and not isinstance(current, bool) and \
                not isinstance(value, (int, float)):
            raise ValueError(f"setting {where}{key} must be a number, not {value!r}")
        else:
            setattr(obj, key, value)


def read_toml(path: str) -> dict:
    """The TOML file at path; ValueError saying what is wrong (shared with sink.job)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file {path} does not exist (check --config)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None


def load(path: str | None = None, env: dict | None = None) -> Config:
    cfg = Config()
    if path:
        data = read_toml(path)
        broker = dict(data.pop("broker", {}))
        _apply(cfg, broker, "broker.")
        if "mqtt" in data:
            _apply(cfg.mqtt, data.pop("mqtt"), "mqtt.")
        cfg.listeners = data.pop("listeners", [])
        cfg.metrics = data.pop("metrics", {})
        cfg.persistence = data.pop("persistence", {})
        cfg.sink = data.pop("sink", {})
        cfg.history = data.pop("history", {})
        cfg.extra = data
    env = os.environ if env is None else env
    # Containers: MQTT_BROKER_PORT=1884, MQTT_BROKER_MQTT__RECEIVE_MAXIMUM=100, MQTT_BROKER_SINK__TOPIC=x,
    # MQTT_BROKER_AUTH__PASSWORD_FILE=/etc/broker/passwd, MQTT_BROKER_METRICS__ENABLED=true
    for key, raw in env.items():
        if not key.startswith("MQTT_BROKER_"):
            continue
        path_ = key[len("MQTT_BROKER_"):].lower().split("__")
        value = _parse_env(raw)
        if path_[0] in ("sink", "history", "metrics", "persistence") and len(path_) == 2:
            getattr(cfg, path_[0])[path_[1]] = value
        elif path_[0] in ("auth", "dashboard") and len(path_) == 2:
            cfg.extra.setdefault(path_[0], {})[path_[1]] = value
        elif path_[0] == "mqtt" and len(path_) == 2:
            _apply(cfg.mqtt, {path_[1]: value}, "mqtt.")
        elif len(path_) == 1:
            _apply(cfg, {path_[0]: value}, "broker.")
    return cfg


def _parse_env(raw: str):
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(raw)
    except ValueError:
        try:
            return float(raw)
        except ValueError:
            return raw
