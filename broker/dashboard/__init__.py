"""The broker's web dashboard: live state, clients, topics, and history charts.

Configured by the ``[dashboard]`` table (config/broker.toml); ``start(server)`` is called by the
server when ``enabled = true``. See api.py for the HTTP paths.
"""
from __future__ import annotations

import dataclasses

from settings import DashboardConfig, HistoryConfig

JOB_HINT = "python -m sink.job --config <your broker.toml>, or scripts/run.sh"


def settings(dash: DashboardConfig | None = None,
             history: HistoryConfig | None = None) -> DashboardConfig:
    """[dashboard] (checked when the config was loaded) with connect_url resolved: "" means the
    history job's Spark Connect server ([history] connect_host / connect_port)."""
    dash, history = dash or DashboardConfig(), history or HistoryConfig()
    return dataclasses.replace(dash, connect_url=dash.connect_url or history.connect_url)


def committed_file(history: HistoryConfig) -> str | None:
    """Where the history job reports what it committed (None: the table is not a local path)."""
    from sink.progress import committed_path
    return None if "://" in history.table else \
        committed_path(history.table, history.checkpoint or None)


async def start(server):
    """Start the dashboard of a running Server; returns the Dashboard (``.port``, ``.stop()``)."""
    from .api import Dashboard
    cfg = server.config
    d = Dashboard(server, settings(cfg.dashboard, cfg.history),
                  passwords=getattr(server.broker.auth, "passwords", None),
                  committed_file=committed_file(cfg.history))
    await d.start()
    return d
