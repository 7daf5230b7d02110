"""The history job's Spark log configuration (sink/history/log4j2.properties), read by log4j
itself: the warnings Spark gives on every normal run are dropped, each by its own logger or
message, and every other warning and error is still printed."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]

EMIT = """
import org.apache.logging.log4j.LogManager;
public class Emit {
    public static void main(String[] a) {
        for (int i = 0; i + 2 < a.length; i += 3) {
            var log = LogManager.getLogger(a[i]);
            if (a[i + 1].equals("WARN")) log.warn(a[i + 2]); else log.error(a[i + 2]);
        }
    }
}
"""

QUIET = [   # (logger, message) of a normal start, run and stop
    ("org.apache.hadoop.util.NativeCodeLoader", "Unable to load native-hadoop library for your "
     "platform... using builtin-java classes where applicable"),
    ("org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream",
     "spark.sql.adaptive.enabled is not supported in streaming DataFrames/Datasets and will be disabled."),
    ("org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor",
     "Current batch is falling behind. The trigger interval is 5000 milliseconds, but spent 7074 milliseconds"),
    ("org.apache.spark.scheduler.DAGScheduler",
     "Failed to cancel job group 6c0dbc43. Cannot find active jobs for it."),
    ("org.apache.spark.sql.execution.command.CreateDataSourceTableCommand",
     "It is not recommended to create a table with overlapped data and partition columns, as "
     "Spark cannot store a valid table schema and has to infer it at runtime"),
]
KEPT = [
    ("org.apache.spark.scheduler.DAGScheduler", "WARN", "Broadcasting large task binary with size 9 MiB"),
    ("org.apache.spark.sql.execution.command.CreateDataSourceTableCommand", "ERROR", "something else"),
    ("org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution", "ERROR",
     "Query mqtt_history terminated with error"),
    ("org.apache.spark.storage.BlockManager", "WARN", "Putting block rdd_1 failed"),
]


def test_the_job_log_config_drops_the_routine_warnings_only(tmp_path):
    from sink.history.spark import JOB_LOCAL_CONF, JOB_LOG4J2
    assert f"-Dlog4j2.configurationFile={JOB_LOG4J2}" in JOB_LOCAL_CONF["spark.driver.extraJavaOptions"]
    import pyspark
    jars = Path(pyspark.__file__).parent / "jars"
    classpath = ":".join(str(p) for p in jars.glob("log4j-*.jar"))
    (tmp_path / "Emit.java").write_text(EMIT)
    args = [x for logger, msg in QUIET for x in (logger, "WARN", msg)]
    args += [x for logger, level, msg in KEPT for x in (logger, level, msg)]
    p = subprocess.run(["java", "-cp", classpath, f"-Dlog4j2.configurationFile={JOB_LOG4J2}",
                        str(tmp_path / "Emit.java"), *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    for _, msg in QUIET:
        assert not any(msg[:40] in line for line in lines), p.stderr
    for _, level, msg in KEPT:
        assert any(f" {level} " in line and msg in line for line in lines), p.stderr
