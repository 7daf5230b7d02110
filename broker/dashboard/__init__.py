"""The broker's web dashboard: live state, clients, topics, and history charts.

Configured by the ``[dashboard]`` table (config/broker.toml); ``start(server)`` is called by the
server when ``enabled = true``. See api.py for the HTTP paths.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from settings import DashboardConfig, HistoryConfig

if TYPE_CHECKING:
    from ..transport.state import ServerState
    from .api import Dashboard

log = logging.getLogger(__name__)

JOB_HINT = "python -m sink.job --config <your broker.toml>, or scripts/run.sh"


def settings(dash: DashboardConfig | None = None,
             history: HistoryConfig | None = None) -> DashboardConfig:
    """[dashboard] (checked when the config was loaded) with connect_url resolved: "" means the
    history job's Spark Connect server ([history] connect_host / connect_port)."""
    dash, history = dash or DashboardConfig(), history or HistoryConfig()
    return dataclasses.replace(dash, connect_url=dash.connect_url or history.connect_url)


def rules_account(auth: Any) -> Any:
    """The rules' MQTT client (broker/auth/rules.py) of the broker's auth hook(s), or None."""
    for h in (auth, *getattr(auth, "hooks", ())):
        account = getattr(h, "rules", None)
        if account is not None:
            return account
    return None


async def start(server: ServerState) -> Dashboard:
    """Start the dashboard of a running server (its shared state); returns the Dashboard (``.port``, ``.stop()``).

    Operators' accounts come from [dashboard] users_file; with none there, the first
    administrator is created (broker/admin/accounts.py) and the log says where its password is.
    """
    from ..admin.accounts import Accounts, users_file
    from ..admin.rules import RulesAdmin
    from ..admin.service import AdminService
    from .api import Dashboard, _url_host
    cfg = server.config
    s = settings(cfg.dashboard, cfg.history)
    accounts = Accounts(users_file(cfg.data_dir, s.users_file))
    where = accounts.ensure_first_admin(s.initial_admin, s.initial_admin_password, cfg.data_dir)
    rules = RulesAdmin(cfg.data_dir, cfg.history.rules, rules_account(server.broker.auth))
    d = Dashboard(server, s, accounts, AdminService(server.broker, server.bans, accounts, rules))
    await d.start()
    url = f"http://{_url_host(s.host)}:{d.port}/"
    if where:   # the first start's routine (scripts/run.sh says it too): not a warning
        log.info("dashboard: created the first administrator %r; log in at %s with the "
                 "password in %s (change it: python -m broker.admin users passwd %s)",
                 s.initial_admin, url, where, s.initial_admin)
    elif where == "":
        log.warning("dashboard: created the first administrator %r with [dashboard] "
                    "initial_admin_password; log in at %s", s.initial_admin, url)
    return d
