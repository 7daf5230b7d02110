"""``python -m sink.maintain --table DIR [--as-of TIME]``: compact the history table's closed
partitions and apply its retention now (the upkeep itself: sink/history/maintenance.py)."""
from __future__ import annotations

import logging
import sys

from settings import ConfigError
from settings import report as report_config_error
from sink.history.maintenance import describe, maintain_once, open_table, parse_time, settings_of


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(
        prog="python -m sink.maintain",
        description="Compact every closed partition of the history table and apply "
                    "[history] retention now. Safe while the history job runs (each change is "
                    "one commit of the table's log) or with it stopped; running it twice "
                    "changes nothing the second time.")
    p.add_argument("--table", metavar="DIR", help="history table directory (default: [history] "
                   "table of --config, else ./data/history)")
    p.add_argument("--as-of", metavar="TIME", default="now",
                   help="treat days and hours as closed, and apply the retention, as of this "
                        "UTC time (e.g. 2024-05-03 or 2024-05-03T10:00:00Z; default now): for "
                        "tests and back-fills")
    p.add_argument("--config", metavar="FILE", help="TOML config: [history] retention and compact_*")
    p.add_argument("--checkpoint", metavar="DIR", help="the job's checkpoint (default "
                   "<table>_checkpoint): read only when adopting a table of Spark's file sink")
    p.add_argument("--retention", metavar="DURATION",
                   help="override [history] retention, e.g. 400d ('' = keep everything)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    try:
        from sink.history.job import config_from_args
        job_argv = ["--config", args.config] if args.config else []
        if args.table:
            job_argv += ["--table", args.table]
        if args.checkpoint:
            job_argv += ["--checkpoint", args.checkpoint]
        cfg, _ = config_from_args(job_argv)
        if args.retention is not None:
            cfg.retention = args.retention
        settings = settings_of(cfg)
        as_of = parse_time(args.as_of)
    except ConfigError as exc:
        return report_config_error(exc)
    except ValueError as exc:
        print(f"sink.maintain: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from sink.history.job import PARQUET_OPTIONS, is_local_path
    if not is_local_path(cfg.table):
        print(f"sink.maintain: error: {cfg.table} is not a local directory; only tables the job "
              "writes through its own log (local paths) are maintained", file=sys.stderr)
        return 2
    from pathlib import Path
    root = Path(cfg.table)
    if not (root / "_manifest").is_dir() and not (root / "_spark_metadata").is_dir():
        print(f"sink.maintain: error: no history table at {cfg.table} (no _manifest or "
              "_spark_metadata): give the directory the job writes with --table", file=sys.stderr)
        return 2
    from sink.history.spark import get_spark
    spark = get_spark("mqtt-history-maintain", log_level="ERROR")
    try:
        table = open_table(spark, cfg.table, cfg.checkpoint_dir,
                           int(cfg.delete_delay_seconds * 1000))
        result = maintain_once(spark, table, settings, as_of, PARQUET_OPTIONS)
        print(describe(result))
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
