"""The broker's view of the configuration: the typed tree lives in the leaf package settings/
(shared with sink/); this module re-exports it and adds the one check that needs the broker
(TLS certificates load)."""
from __future__ import annotations

from settings import (AuthConfig, Config, ConfigError, DashboardConfig, HistoryConfig,  # noqa: F401
                      ListenerConfig, MetricsConfig, MQTTConfig, PersistenceConfig, SinkConfig,
                      listener_specs, load, read_toml)

__all__ = ["Config", "ConfigError", "MQTTConfig", "check_tls_files", "listener_specs", "load",
           "read_toml"]


def check_tls_files(cfg: Config) -> None:
    """Load every TLS listener's certificate once, so a bad file stops the broker before it starts."""
    from .transport import tls
    for i, spec in enumerate(listener_specs(cfg)[1:]):
        if spec.type in ("tls", "wss"):
            try:
                tls.make_context(spec)
            except ValueError as exc:
                raise ConfigError(f"listeners[{i}].certfile", str(exc), spec.certfile) from None
