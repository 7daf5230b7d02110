"""The job JVM's class-data archive (Java's AppCDS): the classes a start loads, parsed and
verified once, mapped from a file at every later start.

A job start loads some 20,000 classes (Spark, Hadoop, Parquet, Spark Connect); parsing and
verifying them was a third of the JVM's start-up CPU (measured with bench/cold_start.py and a
bare session start: 28 -> 18 CPU seconds of the JVM, its session ready in half the time).
scripts/setup.sh makes the archive once (``python -m sink.history.job.class_archive``: a job
session started, used and stopped with ``-XX:ArchiveClassesAtExit``, about a minute), and the
job starts with ``-XX:SharedArchiveFile`` when an archive made for its JVM, Spark's jars and
class path exists. Without one the job starts as before. The archive changes nothing the job
does, only where its classes come from (177 MB in build/, mapped read-only and shared).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path

from settings import environment

log = logging.getLogger(__spec__.name if __name__ == "__main__" else __name__)  # (python -m: its module path)

ARCHIVE_DIR = "jvm-class-archive"


def _java() -> Path | None:
    home = environment.JAVA_HOME.get()
    java = shutil.which("java", path=os.path.join(home, "bin") if home else None)
    return Path(java).resolve() if java else None


def _spark_jars() -> Path:
    """pyspark's jars/ (found without importing pyspark: setup.sh asks at every run)."""
    import importlib.util
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pyspark is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "jars"


def archive_path(build_root: Path, extra_classpath: str) -> Path | None:
    """Where the archive for this JVM, these Spark jars and this extra class path is (whether or
    not it exists); None without java. An archive is valid only for the JVM and the class path it
    was made with, so each gets a name of its own."""
    java = _java()
    if java is None:
        return None
    h = hashlib.sha256()
    for part in (str(java), str(java.stat().st_mtime_ns), extra_classpath,
                 *sorted(p.name for p in _spark_jars().glob("*.jar"))):
        h.update(part.encode() + b"\0")
    return build_root / ARCHIVE_DIR / f"job-{h.hexdigest()[:16]}.jsa"


def java_options(build_root: Path, extra_classpath: str) -> str:
    """The JVM option that maps the archive, when one was made for this class path ("" if not)."""
    path = archive_path(build_root, extra_classpath)
    if path is None or not path.is_file():
        log.info("no class archive for the job's JVM (scripts/setup.sh makes one: a faster start)")
        return ""
    return f"-XX:SharedArchiveFile={path}"


def make(build_root: Path) -> Path | None:
    """Start the job's session (its JVM options and class path, the guard's classes on it), run
    a little of what the job runs (Parquet written and read, SQL), stop it and let the JVM write
    the archive of the classes it loaded as it exits. Returns the archive, or None."""
    from sink.history import guard
    guard_conf = guard.launch_conf(build_root)
    path = archive_path(build_root, guard_conf["spark.driver.extraClassPath"])
    if path is None:
        return None
    if path.is_file():
        return path
    from pyspark import SparkContext

    from sink.history.spark import JOB_LOCAL_CONF, JOB_LOCAL_ENV, get_spark
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("*.jsa"):   # made for another JVM or class path
        old.unlink()
    tmp = path.with_name(path.name + ".tmp")
    for k, v in JOB_LOCAL_ENV.items():
        os.environ.setdefault(k, v)
    opts = (f"{JOB_LOCAL_CONF['spark.driver.extraJavaOptions']} -XX:ArchiveClassesAtExit={tmp} "
            "-Xlog:cds=off -Xlog:cds+dynamic=off")   # (its notes on classes it cannot archive)
    spark = get_spark("mqtt-history-class-archive", quiet_start=True, conf={
        **JOB_LOCAL_CONF, "spark.driver.extraJavaOptions": opts, **guard_conf})
    gateway = SparkContext._gateway
    try:
        guard.trust(spark)   # the job's own session writes (the guard refuses others' writes)
        work = str(build_root / ARCHIVE_DIR / "work")
        (spark.range(1000).selectExpr("id", "cast(id as string) AS s", "current_date() AS date")
         .write.mode("overwrite").partitionBy("date").parquet(work))
        spark.read.parquet(work).createOrReplaceTempView("t")
        spark.sql("SELECT date, count(*), max(s) FROM t GROUP BY date").collect()
    finally:
        spark.stop()
        proc = getattr(gateway, "proc", None)
        if gateway is not None:
            gateway.shutdown()
        if proc is not None:          # the JVM exits when its stdin closes, writing the archive
            proc.stdin.close()
            proc.wait(600)
        shutil.rmtree(build_root / ARCHIVE_DIR / "work", ignore_errors=True)
    if not tmp.is_file():
        return None
    tmp.rename(path)
    return path


def main() -> int:
    from sink.history.job.process import guard_build_root
    logging.basicConfig(level=logging.WARNING)
    if "--with-guard" in sys.argv[1:]:   # scripts/setup.sh: the guard's classes first
        from sink.history.guard import classes_dir
        print("history guard:", classes_dir(guard_build_root(None)), flush=True)
    try:
        path = make(guard_build_root(None))
    except Exception as exc:   # the job starts without it, only slower
        print(f"history job class archive: not made ({exc}); the job starts without it, slower",
              file=sys.stderr)
        return 0
    print("history job class archive:", path or "not made (no java?); the job starts without it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
