"""The broker's web dashboard: live state, clients, topics, and history charts.

Configured by the ``[dashboard]`` table (config/broker.toml); ``start(server)`` is called by the
server when ``enabled = true``. See api.py for the HTTP paths.
"""
from __future__ import annotations

DEFAULTS = {
    "enabled": False,
    "host": "127.0.0.1",             # bind to localhost unless you mean to expose it
    "port": 18083,
    "sample_seconds": 2.0,           # live charts: one point every N seconds...
    "keep_points": 900,              # ...keeping this many (30 minutes at 2 s)
    "max_topics": 10000,             # topics with a per-topic rate counter (bounded)
    "max_topics_listed": 2000,       # topics returned by one /api/topics
    "max_clients_listed": 500,       # clients returned by one /api/clients
    "connect_url": "",               # "" = sc://<[history] connect_host>:<connect_port>
    "history_timeout_seconds": 30.0,
    "history_max_days": 31.0,        # longest time range of a history chart
    "users": [],                     # password-file users allowed in; [] = every user in the file
}

def settings(table: dict | None, history: dict | None = None) -> dict:
    """[dashboard] with defaults, checked; ValueError says which key is wrong and how."""
    from ..config_check import check
    s = {**DEFAULTS, **{key: check("dashboard", key, v) for key, v in dict(table or {}).items()}}
    for key in ("port", "keep_points", "max_topics", "max_topics_listed", "max_clients_listed"):
        s[key] = int(s[key])
    if isinstance(s["users"], str):
        s["users"] = [u.strip() for u in s["users"].split(",") if u.strip()]
    history = history or {}
    if not s["connect_url"]:
        host = str(history.get("connect_host") or "127.0.0.1")
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        s["connect_url"] = f"sc://{host}:{int(history.get('connect_port') or 15002)}"
    from sink.progress import committed_path
    table_dir = str(history.get("table") or "./data/history")
    s["committed_file"] = committed_path(table_dir, history.get("checkpoint") or None) \
        if "://" not in table_dir else None
    s["job_hint"] = "python -m sink.job --config <your broker.toml>, or scripts/run.sh"
    return s


async def start(server):
    """Start the dashboard of a running Server; returns the Dashboard (``.port``, ``.stop()``)."""
    from .api import Dashboard
    s = settings(server.config.extra.get("dashboard"), server.config.history)
    auth = server.broker.auth
    d = Dashboard(server, s, passwords=getattr(auth, "passwords", None))
    await d.start()
    return d
