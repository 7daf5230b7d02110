"""The configuration tree: one slotted dataclass per TOML table, one field per key.

Each field is the key's only default and carries what the key accepts (its Spec, in the field's
metadata; without one it follows from the default: bool, a whole number >= 0, a number >= 0, a
string). The loader (settings/load.py) checks every key through these Specs, so the tree holds
typed values only; components take their section (``cfg.sink``, ``cfg.metrics``...) and read
attributes. The TOML keys are the field names; config/broker.toml documents each one.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import MISSING, dataclass, field
from typing import Any, Self

from .checks import (
    COUNT,
    DOC,
    PORT,
    SECONDS,
    Bool,
    Check,
    ConfigError,
    Enum,
    HistoryRules,
    HostPorts,
    Int,
    IntList,
    Num,
    Pattern,
    Rules,
    Spec,
    Str,
    StrList,
    Table,
    check,
    connect_address,
    did_you_mean,
    duration_ms,
    starting_offsets,
)


def key(default: Any = MISSING, spec: Spec | None = None, *, factory: Any = MISSING) -> Any:
    """A field: its default (or factory, for a table) and, when the default's type does not say
    it all, what it accepts."""
    meta = {"check": spec} if spec is not None else {}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _inferred(default: object) -> Spec:
    if isinstance(default, bool):
        return Bool()
    if isinstance(default, int):
        return Int(0)
    if isinstance(default, float):
        return SECONDS
    if isinstance(default, str):
        return Str()
    raise TypeError(f"no Spec for default {default!r}: give one with key()")


class Section:
    """A TOML table as a dataclass (subclasses are slotted dataclasses)."""
    __slots__ = ()
    TABLE = ""   # its name in the config file

    @classmethod
    def specs(cls) -> dict[str, Spec]:
        return _specs(cls)  # type: ignore[arg-type]  # a class is hashable; mypy reads Section.__hash__

    @classmethod
    def from_table(cls, table: dict[str, Any] | None, source: str = "", name: str = "") -> Self:
        """The section with table's keys checked (ConfigError naming the first bad one)."""
        section = cls()
        specs = {cls.TABLE: cls.specs()}
        for k, value in dict(table or {}).items():
            setattr(section, k, check(cls.TABLE, k, value, specs, source,
                                      name=f"{name}.{k}" if name else ""))
        return section

    def to_table(self) -> dict:
        """The TOML table that loads back into this section (None: key left out)."""
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]  # its subclasses are dataclasses
            value = getattr(self, f.name)
            if "section" in f.metadata or value is None:
                continue
            if isinstance(value, tuple):
                value = [v._asdict() if hasattr(v, "_asdict") else v for v in value]
            out[f.name] = value
        return out


@functools.cache
def _specs(cls: Any) -> dict[str, Spec]:
    """{key: Spec} of a Section subclass (a dataclass)."""
    out = {}
    for f in dataclasses.fields(cls):
        if "section" in f.metadata:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[operator]  # one or the other
        out[f.name] = f.metadata.get("check") or _inferred(default)
    return out


def section(cls: type[Section]) -> Any:
    return field(default_factory=cls, metadata={"section": cls})


@dataclass(slots=True)
class MQTTConfig(Section):
    """Protocol limits and the capabilities advertised in CONNACK ([mqtt] in the TOML file)."""
    TABLE = "mqtt"
    # QoS 1/2 PUBLISHes a client may have unacknowledged towards us; 0 is a Protocol Error (3.2.2.3.3)
    receive_maximum: int = key(1024, Int(1, 65535))
    maximum_qos: int = key(2, Int(0, 2))
    retain_available: bool = True
    maximum_packet_size: int = key(1048576, Int(1, 268435455))  # larger inbound: DISCONNECT 0x95
    topic_alias_maximum: int = key(10, Int(0, 65535))  # inbound aliases a v5 client may use (Mosquitto's)
    outbound_topic_aliases: bool = True  # assign aliases towards clients that allow them
    wildcard_subscription_available: bool = True
    subscription_identifiers_available: bool = True
    shared_subscription_available: bool = True
    server_keep_alive: int = key(0, Int(0, 65535))  # 0: accept the client's keep alive
    max_keep_alive: int = key(65535, Int(0, 65535))
    # seconds (7 days) an offline session is kept at most; 0xFFFFFFFF: no cap
    session_expiry_maximum: int = key(604800, Int(0, 0xFFFFFFFF))
    persistent_client_expiration: int = 604800  # seconds a 3.1.x clean-session-0 session is kept offline
    max_queued_messages: int = 1000      # per session; when full the newest message is dropped
    max_queued_bytes: int = 67108864     # per session (payload + topic); when full likewise; 0: no bound
    max_queued_bytes_total: int = 536870912  # all sessions' queues together; likewise; 0: no bound
    queue_qos0_messages: bool = False    # queue QoS 0 for offline persistent sessions
    validate_payload_format: bool = True  # 0x99 when Payload Format Indicator=1 and payload isn't UTF-8
    max_client_id_length: int = key(65535, Int(1, 65535))
    max_topic_levels: int = key(128, Int(1))
    max_topic_length: int = key(65535, Int(1, 65535))  # bytes of a topic name or filter
    publish_will_on_shutdown: bool = False
    session_owner_check: bool = True     # a session's client id is refused (0x87) to other users
    connect_timeout: float = key(10.0, Num(0, lo_open=True))  # seconds to receive CONNECT
    close_linger_seconds: float = 2.0    # after a server DISCONNECT: input dropped this long at most...
    close_linger_bytes: int = 1048576    # ...and this much at most, before the socket is closed
    max_connections: int = 0             # 0: unlimited
    max_connect_packet_size: int = 131072  # bytes a packet may have before CONNECT is accepted (0x95)
    max_subscriptions_per_client: int = 1000  # filters a session may hold; more get SUBACK 0x97
    max_filters_per_subscribe: int = 1000  # more in one SUBSCRIBE / UNSUBSCRIBE: DISCONNECT 0x97
    # bytes of topic filter a session holds, and all sessions together; a filter beyond: SUBACK
    # 0x97 (also when read back from the store); 0: no bound
    max_subscription_bytes: int = key(65536, COUNT)
    max_subscription_bytes_total: int = key(67108864, COUNT)
    # wildcard levels of a session's distinct filter shapes (levels from the first '+' on, a last
    # '#' aside; literals alike: 1,000 filters 'site/<n>/+/cmd' count 2), and of all sessions'
    # distinct shapes: they bound the subscription trie's nodes one PUBLISH visits (README
    # "Subscription limits"); a filter beyond: SUBACK 0x97; 0: no bound
    max_wildcard_levels: int = key(256, COUNT)
    max_wildcard_levels_total: int = key(2048, COUNT)
    max_retained_replay: int = 100000    # retained messages waiting to be sent to one session
    match_cache_entries: int = 100000    # topics remembered by the subscription match cache
    match_cache_bytes: int = 16777216    # total topic length the match cache may hold
    max_topic_alias_bytes: int = 65536   # topic length held by one connection's inbound aliases (0x97)
    max_sessions: int = 100000           # sessions held, connected + offline; a new one beyond: 0x97; 0: unlimited
    max_user_properties: int = 128       # User Properties in one packet; more: DISCONNECT 0x97; 0: any number
    max_user_property_bytes: int = 65536  # their bytes on the wire in one packet; likewise
    max_retained_messages: int = 100000  # retained messages held; one more: PUBACK 0x97 / not retained; 0: any
    max_retained_bytes: int = 268435456  # their payload + topic bytes together; likewise; 0: any
    max_retained_message_size: int = 1048576  # payload bytes of one retained message; likewise; 0: any
    # log lines about clients, all together (bursts of 10 s); 0: any
    client_log_lines_per_second: float = key(20.0, Num(0))


@dataclass(slots=True)
class SinkConfig(Section):
    """[sink]: the broker's Kafka sink (sink/forward/service.py, sink/forward/forwarder.py)."""
    TABLE = "sink"
    enabled: bool = False
    bootstrap_servers: str = key("", HostPorts())   # "" = an embedded Kafka on embedded_port
    topic: str = key("mqtt.messages", Pattern(r".+", "a Kafka topic name"))
    rules: tuple = key((), Rules())                 # Rule(filter, topic) pairs; first match wins
    exclude: tuple = key((), StrList())             # MQTT topic filters never forwarded
    durability: str = key("spool", Enum("spool", "async", "none"))
    spool_dir: str = ""                             # "" = <data_dir>/spool
    spool_max_bytes: int = key(1 << 30, Int(1))
    spool_segment_bytes: int = key(16 << 20, Int(4096))
    spool_group_commit_ms: float = key(2.0, Num(0, 1000))  # at most one fdatasync per this long, under load
    keep_until: str = key("kafka", Enum("kafka", "history"))
    committed_file: str = ""                        # "" = the history job's (from [history])
    # keep_until = "history": records waiting this long, no commit: warn
    history_stale_seconds: float = key(120.0, Num(0, lo_open=True))
    replay_window_seconds: float = 3600.0
    replay_window_messages: int = 1_000_000
    embedded_port: int = key(9092, PORT)
    embedded_max_mb: int = key(512, Int(0))         # keep_until = "history": restart it empty past this; 0 = no bound
    embedded_log_file: str = ""
    stats_interval: float = 60.0
    forwarder: str = key("process", Enum("process", "thread"))
    forwarder_cpus: tuple = key((), IntList())
    forwarders: int = key(1, Int(1, 256))
    max_inflight: int = key(10000, Int(1))
    drain_timeout_seconds: float = 5.0
    kafka: dict = key(factory=dict, spec=Table("[sink.kafka]"))  # KafkaProducer options


@dataclass(slots=True)
class HistoryConfig(Section):
    """[history]: the Spark history job (sink/history/job/) and where its queries are served."""
    TABLE = "history"
    table: str = "./data/history"
    checkpoint: str = ""                            # "" = <table>_checkpoint
    kafka_topics: tuple = key((), StrList())        # () = [sink] topic + the topics of its rules
    trigger_seconds: float = key(5.0, Num(0, lo_open=True))
    source: str = key("auto", Enum("auto", "kafka", "python"))
    max_records_per_trigger: int = key(0, COUNT)    # 0 = no cap
    read_tasks: int = key(1, Int(0, 4096))          # Spark tasks reading Kafka per micro-batch (0 = one per core)
    dedup_window: str = key("24 hours", Pattern(r"\s*\d+\s+(second|minute|hour|day|week)s?\s*",
                                                "a duration like '24 hours' or '30 minutes'"))
    dedup_max_prefixes: int = key(100_000, Int(1))  # id prefixes the de-duplication remembers
    sparkplug_max_nodes: int = key(100_000, Int(1))  # Sparkplug B edge nodes + devices whose aliases are kept
    # continuous rules (settings/rules.py, docs/rules.md); more are added at run time (broker.admin rules)
    rules: tuple = key((), HistoryRules())
    # the rules' watermark on accepted_at: a window is published once this long after its end
    rules_watermark: str = key("10 seconds", Pattern(r"\s*\d+\s+(second|minute|hour|day|week)s?\s*",
                                                     "a duration like '10 seconds' or '2 minutes'"))
    starting_offsets: str = key("earliest", Check(
        starting_offsets, "'earliest', 'latest' or a JSON offsets object", empty_ok=False))
    connect: bool = True
    connect_host: str = "127.0.0.1"
    connect_port: int = key(15002, Int(1, 65535))
    nice: int = key(10, Int(0, 19))                 # the job's niceness: the broker's CPU comes first
    verify_records: bool = True                     # drop Kafka records without the broker's signature
    kafka: dict = key(factory=dict, spec=Table("[history.kafka]"))
    # the table's upkeep (sink/history/maintenance.py): retention, compaction, deletion
    retention: str = key("", Check(duration_ms, "a duration like '400d' or '12h' (\"\" = keep all)"))
    compact: bool = True
    compact_target_mb: int = key(128, Int(1, 1 << 20))
    compact_grace_seconds: float = 300.0             # a day/hour is closed this long after its end
    compact_open_files: int = key(120, Int(2))       # small files an open hour may have before a merge
    compact_check_seconds: float = key(60.0, Num(0, lo_open=True))
    delete_delay_seconds: float = 600.0             # removed files stay this long for running queries
    # the catalog (sink/history/catalog.py) and the JDBC/ODBC endpoint (sink/history/thrift.py)
    database: str = key("default", Pattern(r"[A-Za-z_][A-Za-z0-9_]*", "a database name"))
    metastore_uri: str = key("", Pattern(r"(thrift://\S+)?", '"thrift://HOST:PORT" ("" = embedded Derby)'))
    metastore_dir: str = ""                         # "" = <table>_metastore
    jdbc: bool = False
    jdbc_host: str = "127.0.0.1"
    jdbc_port: int = key(10000, Int(1, 65535))
    jdbc_password_file: str = ""                    # operators' own (required with jdbc; never [auth] password_file)

    @property
    def connect_url(self) -> str:
        """The job's Spark Connect server as a client reaches it."""
        host = "127.0.0.1" if self.connect_host in ("", "0.0.0.0", "::") else self.connect_host
        return f"sc://{host}:{self.connect_port}"

    @property
    def checkpoint_dir(self) -> str:
        """The job's checkpoint: checkpoint, or <table>_checkpoint (by string: hdfs:// and s3a://
        tables too)."""
        return self.checkpoint or self.table.rstrip("/") + "_checkpoint"

    @property
    def dedup_window_ms(self) -> int:
        n, unit = self.dedup_window.split()
        return int(n) * _UNIT_MS[unit.rstrip("s")]


_UNIT_MS = {"second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
            "week": 7 * 86_400_000}


@dataclass(slots=True)
class ReplayConfig(Section):
    """[replay]: history replay over MQTT (SUBSCRIBE "$replay/<from>[..<to>]/<filter>"; needs the
    sink and the history job's table)."""
    TABLE = "replay"
    enabled: bool = True
    max_replays: int = key(4, Int(1, 1000))           # replays at once (a worker process each)
    max_per_client: int = key(2, Int(1, 1000))        # replays one client may run at once
    max_per_user: int = key(2, Int(1, 1000))          # ...one user name (anonymous: all as one)
    idle_seconds: float = key(120.0, Num(0, 86400))   # a client taking no replayed message: ended; 0 = never
    live_buffer_messages: int = key(10000, Int(1))    # live messages held per replay until the switch
    live_buffer_bytes: int = key(16 << 20, Int(1))    # ...and their payload + topic bytes
    kafka_buffer_bytes: int = key(64 << 20, Int(1 << 20))  # Kafka records a worker reads ahead
    table_buffer_bytes: int = key(64 << 20, Int(1 << 20))  # the table's matching rows a worker holds at once
    nice: int = key(10, Int(0, 19))                   # the worker processes' niceness


@dataclass(slots=True)
class PersistenceConfig(Section):
    """[persistence]: sessions and retained messages in SQLite (broker/store/sqlite.py)."""
    TABLE = "persistence"
    enabled: bool = True
    path: str = ""                                  # "" = <data_dir>/state.db
    synchronous: str = key("NORMAL", Enum("OFF", "NORMAL", "FULL", "EXTRA", any_case=True))
    max_pending_changes: int = key(1_000_000, Int(1))


@dataclass(slots=True)
class MetricsConfig(Section):
    """[metrics]: Prometheus /metrics and /health, and $SYS topics."""
    TABLE = "metrics"
    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = key(9100, PORT)
    sys_interval: float = 10.0                      # seconds between $SYS updates; 0 = off


@dataclass(slots=True)
class DashboardConfig(Section):
    """[dashboard]: the web dashboard (broker/dashboard/)."""
    TABLE = "dashboard"
    enabled: bool = False
    host: str = "127.0.0.1"                         # localhost unless you mean to expose it
    port: int = key(18083, PORT)
    sample_seconds: float = key(2.0, Num(0.2, 3600))  # live charts: one point every N seconds...
    keep_points: int = key(900, Int(10, 100000))      # ...keeping this many (30 minutes at 2 s)
    max_topics: int = key(10000, Int(0, 10_000_000))  # topics with a per-topic rate counter
    max_field_charts: int = key(8, Int(0, 1000))      # (topic filter, JSON field) pairs charted live...
    field_payload_bytes: int = key(65536, Int(16, 16 << 20))  # ...parsing payloads up to this size
    max_topics_listed: int = key(2000, Int(1, 100000))
    max_clients_listed: int = key(500, Int(1, 100000))
    connect_url: str = key("", Check(connect_address, '"sc://HOST:PORT" ("" = the history job\'s)'))
    history_timeout_seconds: float = key(30.0, Num(1, 3600))
    history_max_days: float = key(31.0, Num(0.001, 36600))  # longest range of a history chart
    # operators' accounts (not the MQTT password file): python -m broker.admin users add NAME
    users_file: str = ""                            # "" = <data_dir>/dashboard-users
    initial_admin: str = "admin"                    # created at first start when users_file has no account...
    # ...with this password; "" = random, in <data_dir>/dashboard-admin-password
    initial_admin_password: str = ""
    allowed_hosts: tuple = key((), StrList())       # Host names besides localhost, 127.0.0.1, [::1], host
    session_seconds: float = key(28800.0, Num(60, 31 * 86400))  # a login lasts this long
    max_login_sessions: int = key(1000, Int(1, 1_000_000))  # sessions held; beyond: the oldest ends
    login_threads: int = key(1, Int(1, 16))         # password checks of logins run on these threads...
    max_pending_logins: int = key(8, Int(1, 10000))  # ...at most this many waiting or running (more: 503)
    # wrong passwords for one account from one address before that pair's checks take turns
    # 1 s apart; an attempt waits for its turn at most login_lockout_seconds (else 429)
    login_failures: int = key(5, Int(1, 1000))
    login_lockout_seconds: float = key(60.0, Num(1, 86400))
    max_waiting_logins: int = key(1000, Int(1, 1_000_000))  # attempts waiting for their turn at once (more: 429)
    # the history worker process exits when idle this long
    history_worker_idle_seconds: float = key(120.0, Num(1, 86400))


@dataclass(slots=True)
class AuthConfig(Section):
    """[auth]: password file, ACL file and the bounds of password checks (broker/auth/)."""
    TABLE = "auth"
    # None: false with a password_file, else only for clients on this machine (loopback addresses)
    allow_anonymous: bool | None = key(None, Bool())
    password_file: str = ""
    acl_file: str = ""
    cache_seconds: float = 120.0                    # password-check results remembered; 0 = off
    reload_interval: float = 2.0                    # seconds between checks whether the files changed
    decision_cache_size: int = 100_000              # ACL decisions remembered; 0 = off
    client_id_pattern: str = ""                     # "%u-*": client ids a user may choose; "" = any
    max_pending_checks: int = key(64, Int(1))       # more CONNECTs waiting: 0x89 Server busy
    check_threads: int = 0                          # 0 = CPUs, at most 4
    max_deferred_bytes: int = 1 << 20               # sent behind a CONNECT while it is checked


@dataclass(slots=True)
class ListenerConfig(Section):
    """One [[listeners]] table: an extra TLS / WebSocket listener."""
    TABLE = "listeners"
    type: str = key("tcp", Enum("tcp", "tls", "ws", "wss"))
    port: int | None = key(None, PORT)              # required
    host: str = ""                                  # "" = [broker] host
    name: str = ""                                  # "" = <type><index>
    path: str = key("/mqtt", Pattern(r"/.*", 'a URL path starting with "/"'))
    certfile: str = ""                              # tls/wss: certificate chain (PEM)
    keyfile: str = ""                               # "" = in certfile
    cafile: str = ""                                # verify client certificates against this CA
    require_client_cert: bool = False
    use_identity_as_username: bool = False
    # ws/wss: web pages (Origin) allowed besides the listener's own host:port, e.g.
    # ["https://app.example.com"]; "*" = any. Requests without Origin (not browsers) are allowed
    allowed_origins: tuple = key((), StrList())


@dataclass(slots=True)
class ClusterConfig(Section):
    """[cluster]: one broker on many nodes, its shared state in Kafka (cluster/)."""
    TABLE = "cluster"
    enabled: bool = False
    node_id: str = key("", Pattern(r"[A-Za-z0-9_.-]{0,64}", "letters, digits, '_', '.', '-' "
                                   "(at most 64); unique in the cluster"))
    bootstrap_servers: str = key("", HostPorts())   # "" = [sink] bootstrap_servers
    topic_prefix: str = key("mqtt.cluster", Pattern(r"[A-Za-z0-9_.-]+", "a Kafka topic name prefix"))
    partitions: int = key(8, Int(1, 1024))          # of the messages topic (created if missing)
    replication_factor: int = key(1, Int(1, 16))    # of the topics it creates
    heartbeat_seconds: float = key(1.0, Num(0.05, 60))
    node_timeout: float = key(5.0, Num(0.5, 3600))  # a node not heard from this long is gone
    handoff_timeout: float = key(3.0, Num(0, 600))  # wait for a live previous owner's last word
    connect_timeout: float = key(10.0, Num(0.1, 600))  # a claim not applied by then: 0x88
    checkpoint_seconds: float = key(1.0, Num(0.05, 3600))  # persistent sessions' progress
    # Kafka fetch wait. Apache Kafka answers a fetch as soon as it has records, whatever the wait;
    # Tansu, the embedded Kafka, holds it to the end, and with 5 ms its partitions answered empty
    # for up to 8 s while several nodes fetched (bench/tansu_fetch_stall.py)
    fetch_wait_ms: int = key(20, Int(1, 10000))
    max_backlog: int = key(20000, Int(100))        # records not yet in Kafka; beyond, QoS 0 is dropped
    # each node keeps the QoS 1/2 messages it wrote until every live node has read them, to
    # write them again if Kafka loses its data (cluster/keep.py); beyond either bound the
    # oldest are dropped (counted: mqtt_cluster_kept_dropped); 0 bytes: none kept
    keep_bytes: int = key(64 << 20, Int(0))
    keep_seconds: float = key(600.0, Num(1, 86400))
    max_held: int = key(50000, Int(0))              # delivered at once, not read back yet; beyond: when read
    server_reference: str = ""                      # sent with DISCONNECT 0x9C on SIGTERM
    # the key the nodes sign their records with: the same file on every node ("" =
    # <data_dir>/secrets/cluster.key; made when missing); $MQTT_CLUSTER_KEY overrides it
    key_file: str = ""
    kafka: dict = key(factory=dict, spec=Table("[cluster.kafka]"))  # KafkaProducer/Consumer options


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(slots=True)
class Config(Section):
    """The whole file: [broker] keys as attributes, then one attribute per table."""
    TABLE = "broker"
    host: str = "127.0.0.1"                        # other addresses: set explicitly (and see [auth])
    port: int = key(1883, PORT)
    data_dir: str = "./data"
    log_level: str = key("INFO", Enum(*LOG_LEVELS, any_case=True))
    log_format: str = key("text", Enum("text", "json"))
    mqtt: MQTTConfig = section(MQTTConfig)
    sink: SinkConfig = section(SinkConfig)
    history: HistoryConfig = section(HistoryConfig)
    replay: ReplayConfig = section(ReplayConfig)
    persistence: PersistenceConfig = section(PersistenceConfig)
    metrics: MetricsConfig = section(MetricsConfig)
    dashboard: DashboardConfig = section(DashboardConfig)
    auth: AuthConfig = section(AuthConfig)
    cluster: ClusterConfig = section(ClusterConfig)
    listeners: list = field(default_factory=list, metadata={"section": ListenerConfig})


SECTIONS = {f.name: f.metadata["section"] for f in dataclasses.fields(Config)
            if "section" in f.metadata and f.name != "listeners"}


@functools.cache
def sections() -> dict[str, dict[str, Spec]]:
    """{table: {key: Spec}} for every table the file may have but [[listeners]]."""
    return {"broker": Config.specs(), **{name: cls.specs() for name, cls in SECTIONS.items()}}


__all__ = ["DOC", "SECTIONS", "AuthConfig", "ClusterConfig", "Config", "ConfigError", "DashboardConfig",
           "HistoryConfig", "ListenerConfig", "MQTTConfig", "MetricsConfig", "PersistenceConfig",
           "ReplayConfig", "Section", "SinkConfig", "did_you_mean", "key", "sections"]
