"""Who may do what through the history job's query endpoints (Spark Connect, JDBC/ODBC).

Both serve sessions of the job's own SparkContext, which writes the table, so a client able to
run any SQL there could rewrite or empty the history (``INSERT OVERWRITE DIRECTORY``), read any
file the job can (``SELECT * FROM text.`<data_dir>/secrets/sink.key```) or run code as the job's
user (a Python UDF, ``TRANSFORM ... USING``). The guard makes their sessions read-only:
``mqtthistory.ReadOnlyGuardExtension`` (jvm/ReadOnlyGuard.scala, a Spark session extension
loaded at launch by ``spark.sql.extensions``) checks every analysed plan of every session except
the job's own (marked by ``trust``: a random value in its settings, which its clones copy and no
client can know) and refuses all but queries of the catalog's tables and SHOW/DESCRIBE/USE.

The Scala sources beside this file are compiled on first use with the Scala compiler inside
pyspark (a JRE is enough) into ``build/``: one class directory for the guard and the JDBC
authenticator (sink/history/thrift.py).
"""
from __future__ import annotations

import hashlib
import logging
import subprocess
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JVM_DIR = Path(__file__).with_name("jvm")
EXTENSION = "mqtthistory.ReadOnlyGuardExtension"
#: jvm/VariantCastPushdown.scala: `try_cast(payload_json:temp AS double)` read as the typed field
VARIANT_EXTENSION = "mqtthistory.VariantCastPushdownExtension"
GUARD = "mqtthistory.ReadOnlyGuard"
MARKER = "read-only session"   # in every refusal's message


class GuardMissing(RuntimeError):
    """The guard is not active in this SparkContext: the endpoints are not served."""


def spark_jars() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent / "jars"


def sources() -> list[Path]:
    return sorted(JVM_DIR.glob("*.scala"))


def classes_dir(build_root: Path) -> Path:
    """The compiled classes (built when missing or older than their sources): a directory to
    put on the driver's class path. Takes some seconds the first time."""
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources()))
    out = build_root / f"history-jvm-{digest.hexdigest()[:16]}"
    if (out / "mqtthistory" / "ReadOnlyGuard.class").is_file():
        return out
    jars = spark_jars()
    if not any(jars.glob("scala-compiler*.jar")):
        raise RuntimeError(f"no scala-compiler*.jar in {jars}: pyspark is incomplete")
    tmp = build_root / f".{out.name}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # the java launcher expands jars/* (every Spark jar: the compiler and what the sources use)
    cmd = ["java", "-cp", str(jars / "*"), "scala.tools.nsc.Main", "-usejavacp", "-nowarn",
           "-d", str(tmp), *map(str, sources())]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"cannot compile {JVM_DIR}/*.scala: {res.stderr.strip()[-1000:]}")
    tmp.rename(out)
    return out


def classes_jar(build_root: Path) -> Path:
    """classes_dir() as a jar beside it (made when missing): Java's class-data archive of the
    job's JVM (sink/history/job/class_archive.py) takes jars only, no class directories."""
    import zipfile
    classes = classes_dir(build_root)
    jar = classes.with_name(classes.name + ".jar")
    if not jar.is_file():
        tmp = jar.with_name(f".{jar.name}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        tmp.rename(jar)
    return jar


def variant_conf(build_root: Path) -> dict[str, str]:
    """Spark settings the JVM needs at launch for the variant field rule alone
    (jvm/VariantCastPushdown.scala): a session that writes tables, as tests and benchmarks do."""
    return {"spark.driver.extraClassPath": str(classes_jar(build_root)),
            "spark.sql.extensions": VARIANT_EXTENSION}


def launch_conf(build_root: Path) -> dict[str, str]:
    """Spark settings the JVM needs at launch for the guard (and the JDBC authenticator), and
    the variant field rule."""
    return {**variant_conf(build_root),
            "spark.sql.extensions": f"{EXTENSION},{VARIANT_EXTENSION}",
            # no `format`.`path` in SQL (the guard refuses it too; this stops it before the
            # analyser lists or samples the path)
            "spark.sql.runSQLOnFiles": "false"}


def trust(spark: Any) -> None:   # a SparkSession
    """Mark the job's own session (and the clones it makes later) as not guarded: call it
    right after the session is made, before anything else uses it."""
    try:
        spark.sparkContext._jvm.mqtthistory.ReadOnlyGuard.trust(spark._jsparkSession)
    except Exception as exc:   # not on the class path: check_active says so and serves nothing
        log.debug("no read-only guard in this JVM: %s", exc)


def check_active(spark: Any) -> None:   # a SparkSession
    """Fail (GuardMissing) unless a new session of this SparkContext, as a client gets, is
    refused a write: the endpoints are served only with the guard on."""
    try:
        probe = spark._jsparkSession.newSession()
        probe.sql("SET spark.mqtthistory.probe = 1")
    except Exception as exc:
        if MARKER in str(exc):
            return
        raise GuardMissing(f"the read-only guard did not answer as expected: {exc}") from None
    raise GuardMissing(
        "the read-only guard is not active, so Spark Connect and JDBC are not served: start "
        f"the job with spark.sql.extensions={EXTENSION} and the classes of sink/history/jvm on "
        "the driver's class path (the job does it itself unless launched by spark-submit: see "
        "deploy/spark-submit.md)")
