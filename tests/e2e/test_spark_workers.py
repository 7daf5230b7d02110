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
