"""``python -m sink.job`` (and ``python -m sink.history.job``): main() sets up the process,
the Spark session and its endpoints, then runs the query until asked to stop."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from sink.history.job.config import UsageError, config_from_args
from sink.history.job.connect import (
    check_connect_port,
    connect_conf,
    connect_enabled,
    jdbc_enabled,
    serve_connect,
    stop_connect,
)
from sink.history.job.probe import check_kafka
from sink.history.job.process import guard_build_root, lower_priority, quiet_py4j_retry, stop_on_signals
from sink.history.job.report import announce
from sink.history.job.runner import run_restarting

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    from settings import ConfigError
    from settings import report as report_config_error
    try:
        job, args = config_from_args(argv)
    except ConfigError as exc:
        return report_config_error(exc)
    except UsageError as exc:
        print(f"sink.job: error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        return 0
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the source says what it recovers from (a Kafka restart) in one line; the client's own
    # warnings about each dropped connection read like data loss and add nothing
    logging.getLogger("kafka").setLevel(logging.ERROR)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet_py4j_retry)
    for note in args.notes:
        log.warning("%s", note)
    announce(job)
    stop = threading.Event()
    on_signal = stop_on_signals(stop)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    lower_priority(job.history.nice)
    try:
        # A broker starting beside the job may need a moment to bring its (embedded) Kafka up.
        check_kafka(job.bootstrap, timeout=10.0 if job.available_now else 120.0, stop=stop)
        if stop.is_set():
            log.info("history job stopped before it started")
            return 0
        from sink.history import catalog, guard, thrift
        from sink.history.job import class_archive
        from sink.history.spark import (
            JOB_LOCAL_CONF,
            JOB_LOCAL_ENV,
            get_spark,
            launched_by_spark_submit,
        )
        check_connect_port(job)
        for k, v in JOB_LOCAL_ENV.items():
            os.environ.setdefault(k, v)
        conf = connect_conf(job)
        if conf and job.data_dir:
            # the token file first: a sink.query or dashboard started meanwhile reads it while
            # it waits for the server (given to the JVM only once it runs: serve_connect)
            from settings import secrets
            secrets.connect_token(job.data_dir, create=True)
        serving = connect_enabled(job) or jdbc_enabled(job)
        guard_conf: dict[str, str] = {}
        if serving:
            try:
                guard_conf = guard.launch_conf(guard_build_root(job.data_dir))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                # the table is still written; check_active below then serves no endpoint
                log.error("cannot build the read-only guard of Spark Connect and JDBC: %s", exc)
        local_conf: dict[str, str] = {}
        if not launched_by_spark_submit():
            local_conf = dict(JOB_LOCAL_CONF)
            archive = class_archive.java_options(guard_build_root(job.data_dir),
                                                 guard_conf.get("spark.driver.extraClassPath", ""))
            if archive:   # the classes of a start mapped from a file (scripts/setup.sh made it)
                local_conf["spark.driver.extraJavaOptions"] += " " + archive
        started = time.monotonic()
        spark = get_spark("mqtt-history-job", quiet_start=True, conf={
            **local_conf, **conf, **catalog.session_conf(job.history), **guard_conf})
        log.info("Spark session ready in %.1f s (JVM and SparkContext)", time.monotonic() - started)
        if serving:
            guard.trust(spark)   # first: its clients' sessions are read-only, not the job's
        catalog.register_in_session(spark, job.history)  # `messages` for Spark Connect and JDBC
        try:
            if serving:
                guard.check_active(spark)
            serve_connect(spark, job)
            if jdbc_enabled(job):
                thrift.serve_thrift(spark, job.history)
        except guard.GuardMissing as exc:   # the history is still written; nobody reads it here
            log.error("%s", exc)
        # SparkContext installs its own SIGINT handler (cancel jobs + KeyboardInterrupt): ours
        # must win so that Ctrl-C stops the query cleanly.
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        from sink.history.paths import is_local_path
        from sink.history.rules.runner import start_rules
        from sink.history.rules.shared import BatchRules
        # stateless rules run on the history's batches, the others as their own queries; a
        # rule's failure is never the job's end
        batch_rules = BatchRules() if is_local_path(job.history.table) else None
        rules = start_rules(spark, job, batch_rules)
        try:
            return run_restarting(spark, job, stop, batch_rules)
        finally:
            if rules:
                rules.stop()
            stop_connect(spark, job)
            spark.stop()
    except UsageError as exc:
        log.error("%s", exc)
        return 2
    except ConnectionError as exc:
        log.error("%s", exc)
        return 1


def cli(argv: Sequence[str] | None = None) -> int:
    """The command: main(), then SIGINT and SIGTERM ignored for the interpreter's exit, which
    drops the Python handlers (SIG_DFL): a supervisor's SIGTERM arriving then (scripts/run.sh
    sends one after Ctrl-C) would end a clean stop with -15. SIGKILL still ends a stuck exit."""
    code = main(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code

