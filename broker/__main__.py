"""python -m broker: run the MQTT broker in the foreground."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import settings
from settings import one_line
from settings import report as report_config_error

from . import config as config_mod
from .server import serve
from .transport.eventloop import install_uvloop

log = logging.getLogger("broker")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m broker",
        description="MQTT 3.1/3.1.1/5.0 broker. Settings: defaults < --config FILE < "
                    "MQTT_BROKER_* environment < command-line flags.")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1: this machine only; "
                                  "0.0.0.0 for every interface, then see [auth] in the README)")
    p.add_argument("--port", type=int, help="MQTT TCP port (default 1883)")
    p.add_argument("--config", metavar="FILE", help="TOML configuration file (see config/broker.toml)")
    p.add_argument("--data-dir", metavar="DIR", help="where state on disk goes (default ./data)")
    p.add_argument("--kafka-bootstrap", metavar="HOST:PORT",
                   help="forward accepted messages to this Kafka (enables the sink)")
    p.add_argument("--sink", action="store_true",
                   help="enable the Kafka sink; with no bootstrap servers an embedded Kafka starts")
    p.add_argument("--no-sink", action="store_true", help="disable the Kafka sink even if configured")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    p.add_argument("--log-format", choices=["text", "json"], help="log line format (default text)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one setting, e.g. --set mqtt.receive_maximum=100 (repeatable)")
    p.add_argument("--check-config", action="store_true",
                   help="check the settings and exit: 0 when valid, else 2 with one line saying "
                        "which key is wrong")
    return p.parse_args(argv)


def build_config(args) -> settings.Config:
    """Every setting checked: ConfigError (one line, naming the key) for the first bad one."""
    flags = [("broker", name, getattr(args, name), "--" + name.replace("_", "-"))
             for name in ("host", "port", "data_dir", "log_level", "log_format")
             if getattr(args, name) is not None]
    if args.kafka_bootstrap:
        flags += [("sink", "bootstrap_servers", args.kafka_bootstrap, "--kafka-bootstrap"),
                  ("sink", "enabled", True, "--kafka-bootstrap")]
    if args.sink:
        flags.append(("sink", "enabled", True, "--sink"))
    if args.no_sink:
        flags.append(("sink", "enabled", False, "--no-sink"))
    return settings.load(args.config, sets=args.set, flags=flags)


def setup_logging(level: str, fmt: str) -> None:
    if fmt == "json":
        import json

        class JSONFormatter(logging.Formatter):
            def format(self, r):
                return json.dumps({"time": self.formatTime(r), "level": r.levelname,
                                   "logger": r.name, "message": r.getMessage()})
        h = logging.StreamHandler()
        h.setFormatter(JSONFormatter())
        logging.basicConfig(level=level.upper(), handlers=[h])
    else:
        logging.basicConfig(level=level.upper(), stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kafka-python narrates every connection and offset reset at INFO (DEBUG: every request):
    # its warnings and errors are what an operator needs
    logging.getLogger("kafka").setLevel(logging.WARNING)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = build_config(args)
        from .auth import from_config as auth_from_config
        auth = auth_from_config(cfg.auth)   # reads the password and ACL files: errors stop here
        config_mod.check_tls_files(cfg)
    except ValueError as exc:  # ConfigError, and what auth/dashboard find (files, ...)
        return report_config_error(exc)
    if args.check_config:
        return 0
    setup_logging(cfg.log_level, cfg.log_format)
    uv = install_uvloop()  # before the sink starts threads (transport/eventloop.py swaps a class)
    sink = store = None
    try:  # directories that cannot be created, a spool locked by another broker: one line
        if cfg.sink.enabled:
            from sink.forward.service import Sink
            sink = Sink.from_config(cfg.sink, cfg.data_dir, history=cfg.history)
            sink.start()
        cluster = None
        if cfg.cluster.enabled:
            from cluster.node import ClusterNode
            cluster = ClusterNode(cfg.cluster, cfg.cluster.bootstrap_servers or cfg.sink.bootstrap_servers)
        p = cfg.persistence
        if cluster is not None and p.enabled:
            log.info("cluster: sessions and retained messages live in Kafka; the local state "
                     "store (persistence) is not used")
        elif p.enabled:
            import os

            from .store.sqlite import Store
            store = Store(p.path or os.path.join(cfg.data_dir, "state.db"),
                          synchronous=p.synchronous, max_pending=p.max_pending_changes)
    except (OSError, RuntimeError, ValueError) as exc:
        log.error("cannot start: %s (check --data-dir, sink.spool_dir, persistence.path, "
                  "[cluster])", one_line(exc))
        if sink is not None:
            sink.close()
            if sink.embedded is not None:  # started before the failure: not left running
                sink.embedded.stop()
        return 1
    log.info("starting broker (event loop: %s)", "uvloop" if uv else "asyncio")
    try:
        hooks = [h for h in (store, cluster, sink) if h is not None]
        asyncio.run(serve(cfg, auth=auth, hooks=hooks))
    except OSError as exc:
        from .server import ListenError
        if isinstance(exc, ListenError):  # names the listener that failed
            log.error("%s (is another broker running? choose another port)", exc.strerror)
        else:
            log.error("cannot listen on %s:%s: %s (is another broker running? use --port)",
                      cfg.host, cfg.port, exc)
        return 1
    except RuntimeError as exc:  # a hook that could not start (the cluster's Kafka)
        log.error("cannot start: %s", one_line(exc))
        return 1
    finally:
        if sink is not None:
            sink.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
