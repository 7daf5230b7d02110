"""The history job's Python processes: the daemons Spark keeps for planning a Python data source
are stopped once a query is planned (sink/history/spark.py release_planner_workers), and Spark
starts them again when a later query is planned."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, DataSourceReader

from sink.history.spark import PLANNER_MODULES, release_planner_workers
from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e]


class _Numbers(DataSource):
    """Three rows, read by a Python worker."""

    @classmethod
    def name(cls) -> str:
        return "test_numbers"

    def schema(self) -> str:
        return "n int"

    def reader(self, schema: object) -> DataSourceReader:
        return _NumbersReader()


class _NumbersReader(DataSourceReader):
    def read(self, partition: object):  # type: ignore[no-untyped-def]
        yield from ((1,), (2,), (3,))


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _planner_processes(jvm_pid: int) -> list[str]:
    found = []
    for p in _descendants(jvm_pid):
        try:
            with open(f"/proc/{p}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:
            continue
        found += [m for m in PLANNER_MODULES if m in cmd]
    return found


def test_planning_daemons_are_stopped_after_planning_and_started_again_when_needed(spark):
    jvm_pid = spark.sparkContext._gateway.proc.pid
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import a test module
    spark.dataSource.register(_Numbers)
    assert sorted(r.n for r in spark.read.format("test_numbers").load().collect()) == [1, 2, 3]
    assert _planner_processes(jvm_pid), "planning a Python data source starts Spark's daemons"

    assert release_planner_workers(spark) >= 1
    deadline = time.monotonic() + 10  # stopped with SIGTERM: gone once they have exited
    while _planner_processes(jvm_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _planner_processes(jvm_pid) == []

    # planned again: the daemons come back, and the read works as before
    assert sorted(r.n for r in spark.read.format("test_numbers").load().collect()) == [1, 2, 3]
    assert _planner_processes(jvm_pid)


def test_the_driver_loads_no_pandas_unless_asked_and_still_passes_numpy_values():
    """PySpark's py4j converters for NumPy values imported pandas, pyarrow and NumPy (84 MB) at the
    first call into the JVM; they are now asked only about NumPy objects, and convert them as
    before."""
    code = """
import sys
from sink.history.spark import get_spark
spark = get_spark("numpy-converters")
assert spark.range(3).count() == 3
loaded = sorted(m for m in ("pandas", "pyarrow", "numpy") if m in sys.modules)
import numpy as np
jvm = spark.sparkContext._jvm
print(loaded, jvm.java.lang.Math.abs(np.int64(-5)), jvm.java.util.Arrays.toString(np.array([1, 2])))
spark.stop()
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[] 5 [1, 2]"


def test_a_batch_without_sparkplug_topics_loads_no_pyarrow_and_one_with_them_is_decoded(tmp_path):
    """The job's writer counts a batch's Sparkplug B rows (spBv1.0/...) while it writes them: a
    batch with none leaves sparkplug_metrics alone without reading its files back, so the
    driver never loads pyarrow, pandas or NumPy for it (about 95 MB resident); a batch with one
    is read and decoded as before (here a payload that is not Sparkplug B: kept in messages,
    counted as malformed, the batch committed in sparkplug_metrics)."""
    code = """
import sys
from pathlib import Path
from sink.history.manifest import Table
from sink.history.schema import HISTORY_SCHEMA
from sink.history.sparkplug.table import SparkplugWriter, malformed_total
from sink.history.spark import get_spark
from sink.history.writer import BatchWriter
spark = get_spark("sparkplug-count")
d = Path(sys.argv[1])
sparkplug = SparkplugWriter(str(d / "sparkplug"))
write = BatchWriter(Table(str(d / "messages")), str(d / "checkpoint"), sparkplug=sparkplug)

from pyspark.sql import functions as F

def batch(topic, off):  # SQL literals: createDataFrame imports pandas, lit() NumPy
    given = {"message_id": f"'m{off}'", "topic": f"'{topic}'", "qos": "1",
             "payload": "X'00AB'", "accepted_at": "TIMESTAMP'2026-11-28 12:00:00'",
             "kafka_partition": "0", "kafka_offset": str(off), "date": "DATE'2026-11-28'"}
    return spark.range(1).select(*[
        F.expr(f"CAST({given.get(f.name, 'NULL')} AS {f.dataType.simpleString()})").alias(f.name)
        for f in HISTORY_SCHEMA])
write(batch("sensors/1", 0), 0)
loaded = sorted(m for m in ("pandas", "pyarrow", "numpy") if m in sys.modules)
after_plain = sparkplug.table.snapshot().stream_batch(write.stream_id)
write(batch("spBv1.0/g/NDATA/edge", 1), 1)
snap = sparkplug.table.snapshot()
print(loaded, after_plain, snap.stream_batch(write.stream_id), malformed_total(snap),
      write.last.detail["rows"] if write.last else None)
spark.stop()
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[] -1 1 1 1"
