"""The project's configuration: one typed tree, checked once when it is loaded.

    from settings import load
    cfg = load("config/broker.toml")      # + MQTT_BROKER_* environment, --set items, flags
    cfg.mqtt.receive_maximum, cfg.sink.spool_max_bytes, cfg.history.connect_url, ...

A leaf package (the standard library only), shared by the broker (broker/), the sink and the
history job (sink/): neither imports the other for its configuration. Layout: checks.py (what a
key accepts, ConfigError), tree.py (the sections and their defaults), load.py (file < env <
--set < flags), parts.py (the command line the broker and the job share; which part reads
which key).
"""
from .checks import ConfigError, Rule, connect_address, one_line, report
from .load import listener_specs, load, read_toml
from .tree import (
                   AuthConfig,
                   ClusterConfig,
                   Config,
                   DashboardConfig,
                   HistoryConfig,
                   ListenerConfig,
                   MetricsConfig,
                   MQTTConfig,
                   PersistenceConfig,
                   Section,
                   SinkConfig,
                   sections,
)

__all__ = ["AuthConfig", "ClusterConfig", "Config", "ConfigError", "DashboardConfig", "HistoryConfig",
           "ListenerConfig", "MQTTConfig", "MetricsConfig", "PersistenceConfig", "Rule", "Section",
           "SinkConfig", "connect_address", "listener_specs", "load", "one_line", "read_toml",
           "report", "sections"]
