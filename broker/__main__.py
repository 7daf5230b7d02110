"""python -m broker: run the MQTT broker in the foreground."""
from __future__ import annotations

import argparse
import asyncio
import errno
import fcntl
import logging
import os
import re
import sys

import settings
from settings import environment, one_line, parts
from settings import report as report_config_error

from .server import serve
from .transport.eventloop import install_uvloop

log = logging.getLogger("broker")  # (python -m broker: the package it starts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m broker",
        description="MQTT 3.1/3.1.1/5.0 broker. Settings: defaults < --config FILE < "
                    "MQTT_BROKER_* environment < command-line flags.",
        formatter_class=environment.HelpFormatter, epilog=environment.epilog(environment.BROKER))
    parts.add_arguments(p)
    p.add_argument("--with-job", action="store_true",
                   help="the history job runs beside this broker with the same arguments "
                        "(scripts/run.sh): settings only the job reads are accepted here")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> settings.Config:
    """Every setting checked: ConfigError (one line, naming the key) for the first bad one, or
    for a --set or flag that nothing this broker (and, --with-job, the job) runs reads."""
    flags = parts.flags_of(args)
    cfg = settings.load(args.config, sets=args.set, flags=flags)
    commands = [parts.BROKER] + ([parts.JOB] if getattr(args, "with_job", False) else [])
    parts.check_used(cfg, parts.set_keys(args.set) + [f[:2] + (f[3],) for f in flags],
                     commands, "this broker" + (" and the history job" if len(commands) > 1 else ""))
    return cfg


def check_tls_files(cfg: settings.Config) -> None:
    """Load every TLS listener's certificate once, so a bad file stops the broker before it
    starts (ConfigError naming the listener's certfile)."""
    from .transport import tls
    for i, spec in enumerate(settings.listener_specs(cfg)[1:]):
        if spec.type in ("tls", "wss"):
            try:
                tls.make_context(spec)
            except ValueError as exc:
                raise settings.ConfigError(f"listeners[{i}].certfile", str(exc), spec.certfile) from None


def setup_logging(level: str, fmt: str) -> None:
    if fmt == "json":
        import json

        class JSONFormatter(logging.Formatter):
            def format(self, r: logging.LogRecord) -> str:
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


LOCK_FILE = "broker.lock"


def lock_data_dir(data_dir: str) -> int:
    """An exclusive lock on <data_dir>/broker.lock for the broker's lifetime (released when the
    process ends, however): a second broker on the same data directory would open the same
    state.db and spool. -> the file descriptor; RuntimeError naming the holder."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        raise RuntimeError(f"another broker{f' (pid {holder})' if holder else ''} uses the data "
                           f"directory {os.path.abspath(data_dir)}: stop it first, or give this "
                           "one its own --data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def bind_error(exc: OSError, host: str, port: int) -> str:
    """What to say when a listener cannot bind: which address (from the error: it may be
    another listener than the MQTT port), and which process holds it."""
    from .server import ListenError
    msg: str
    if isinstance(exc, ListenError):  # names the listener: MQTT, the dashboard, metrics
        # (a ListenError's strerror is the message it was made with)
        host, port, msg = exc.host, exc.port, exc.strerror  # type: ignore[assignment]
    else:
        m = re.search(r"address \('([^']*)', (\d+)", str(exc))
        if m:
            host, port = m.group(1), int(m.group(2))
        msg = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    if exc.errno == errno.EADDRINUSE:
        from kafka_client import ports
        held = ports.describe(port)
        msg += f"{held or ''}"
        if "mosquitto" in held:
            msg += (" - Debian's mosquitto service: stop it with `systemctl disable --now "
                    "mosquitto`, or start this broker with --port")
        else:
            msg += " (is another broker running? use --port)"
    return msg


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = build_config(args)
        from .auth import from_config as auth_from_config
        auth = auth_from_config(cfg.auth)   # reads the password and ACL files: errors stop here
        check_tls_files(cfg)
    except ValueError as exc:  # ConfigError, and what auth/dashboard find (files, ...)
        return report_config_error(exc)
    if args.check_config:
        return 0
    setup_logging(cfg.log_level, cfg.log_format)
    uv = install_uvloop()  # before the sink starts threads (transport/eventloop.py swaps a class)
    sink = store = None
    try:  # directories that cannot be created, a spool locked by another broker: one line
        lock_data_dir(cfg.data_dir)
        # the continuous rules' MQTT client ($rules): its password (made here when missing, so
        # the history job finds it) and the topics its rules publish to (broker/auth/rules.py)
        from .auth.rules import RulesAccount
        rules_account = RulesAccount.from_files(cfg.data_dir, cfg.history.rules,
                                                job_may_run=cfg.sink.enabled)
        if auth is None:
            auth = auth_from_config(cfg.auth, rules_account)
        else:
            auth.rules = rules_account
        if cfg.sink.enabled:
            from sink.forward.service import Sink
            sink = Sink.from_config(cfg.sink, cfg.data_dir, history=cfg.history)
            sink.start()
        cluster = None
        if cfg.cluster.enabled:
            from cluster.node import ClusterNode
            from settings import secrets
            key_path = cfg.cluster.key_file or secrets.secret_path(cfg.data_dir,
                                                                   secrets.CLUSTER_KEY_FILE)
            made = not environment.CLUSTER_KEY.is_set() and not os.path.exists(key_path)
            key = secrets.cluster_key(key_path)
            cluster = ClusterNode(cfg.cluster, cfg.cluster.bootstrap_servers or cfg.sink.bootstrap_servers,
                                  key=key, key_made=key_path if made else None)
        p = cfg.persistence
        if cluster is not None and p.enabled:
            log.info("cluster: sessions and retained messages live in Kafka; the local state "
                     "store (persistence) is not used")
        elif p.enabled:
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
        hooks: list[object] = [h for h in (store, cluster, sink) if h is not None]
        if sink is not None:  # SUBSCRIBE "$replay/...": the history, then live (sink/replay)
            from sink.replay.hook import ReplayHook
            hooks.append(ReplayHook.from_config(cfg, sink))
        asyncio.run(serve(cfg, auth=auth, hooks=hooks))
    except OSError as exc:
        log.error("%s", bind_error(exc, cfg.host, cfg.port))
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
