"""The history job's JVM options (sink/history/spark.py JOB_LOCAL_CONF) as this machine's Java
reads them: every one known (the job's -XX:+IgnoreUnrecognizedVMOptions, there for an older Java,
would hide one this Java does not know), and the C heap given back every 5 s."""
from __future__ import annotations

import subprocess

import pytest

pytestmark = [pytest.mark.e2e]


def test_the_jobs_java_knows_each_of_its_options_and_trims_its_native_heap():
    from sink.history.spark import JOB_LOCAL_CONF
    opts = [o for o in JOB_LOCAL_CONF["spark.driver.extraJavaOptions"].split()
            if o.startswith(("-X", "-XX:")) and o != "-XX:+IgnoreUnrecognizedVMOptions"]
    done = subprocess.run(["java", *opts, "-XX:+PrintFlagsFinal", "-version"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]   # an unknown option stops the JVM here
    flags = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("=", ":="):
            flags[parts[1]] = parts[3]
    assert flags["TrimNativeHeapInterval"] == "5000"
    assert flags["UseSerialGC"] == "true" and flags["MaxHeapFreeRatio"] == "30"
