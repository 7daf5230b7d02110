"""``python -m sink.maintain --table DIR [--as-of TIME]``: compact the history table's closed
partitions and apply its retention now, and the same to sparkplug_metrics beside it (the upkeep
itself: sink/history/maintenance.py)."""
from __future__ import annotations

import logging
import sys

from settings import ConfigError
from settings import report as report_config_error
from sink.history.maintenance import describe, maintain_once, open_table, parse_time, settings_of


def main(argv: list[str] | None = None) -> int:
    import argparse

    from settings import environment
    p = argparse.ArgumentParser(
        prog="python -m sink.maintain", formatter_class=environment.HelpFormatter,
        epilog=environment.epilog(environment.MAINTAIN),
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
        from sink.history.job import UsageError, flags_of, load_job
        flags = flags_of(args)   # --table, --checkpoint: the job's flags, checked by the tree
        if args.retention is not None:
            flags.append(("history", "retention", args.retention, "--retention"))
        hist = load_job(args.config, flags)[0].history
        settings = settings_of(hist)
        as_of = parse_time(args.as_of)
    except ConfigError as exc:
        return report_config_error(exc)
    except (UsageError, ValueError) as exc:
        print(f"sink.maintain: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from sink.history.job import PARQUET_OPTIONS
    from sink.history.paths import is_local_path
    if not is_local_path(hist.table):
        print(f"sink.maintain: error: {hist.table} is not a local directory; only tables the job "
              "writes through its own log (local paths) are maintained", file=sys.stderr)
        return 2
    from pathlib import Path
    root = Path(hist.table)
    if not (root / "_manifest").is_dir() and not (root / "_spark_metadata").is_dir():
        print(f"sink.maintain: error: no history table at {hist.table} (no _manifest or "
              "_spark_metadata): give the directory the job writes with --table", file=sys.stderr)
        return 2
    from sink.history.spark import get_spark
    spark = get_spark("mqtt-history-maintain", log_level="ERROR")
    try:
        table = open_table(spark, hist.table, hist.checkpoint_dir,
                           int(hist.delete_delay_seconds * 1000))
        result = maintain_once(spark, table, settings, as_of, PARQUET_OPTIONS)
        print(describe(result, settings.policy))
        from sink.history.manifest import Table
        from sink.history.sparkplug.table import file_layout, table_path
        sparkplug = Table(table_path(hist.table), int(hist.delete_delay_seconds * 1000))
        if sparkplug.exists():   # sparkplug_metrics beside it: the same upkeep
            done = maintain_once(spark, sparkplug, settings, as_of, layout=file_layout())
            print(f"{sparkplug.root.name}: {describe(done, settings.policy)}")
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
