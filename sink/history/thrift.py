"""JDBC/ODBC for BI tools: the job serves Spark's Thrift server (HiveServer2 protocol) from its
own Spark session, beside Spark Connect. Off by default ([history] jdbc = false).

    beeline -u jdbc:hive2://127.0.0.1:10000/default -n alice -p secret -e "SELECT count(*) FROM messages"

Authentication: HiveServer2's CUSTOM mode with ``mqtthistory.PasswordFileAuthenticator`` (the
Scala source beside this file, compiled on first use with the Scala compiler inside pyspark, so
a JRE is enough), which asks this process: user names and passwords are checked against a
password file in the broker's format (``python -m broker.auth add FILE USER``: scrypt, which the
JDK lacks). The alternatives Spark's Thrift server knows do not fit: NONE/NOSASL check nothing,
LDAP and Kerberos need servers, PAM needs the JPam native library (not packaged).

The queries run in sessions of the job's SparkContext, so they see the table ``messages`` (and
its newest committed version at each query) exactly as Spark Connect clients do.
"""
from __future__ import annotations

import hashlib
import logging
import subprocess
from pathlib import Path
from typing import Any

from settings import HistoryConfig

log = logging.getLogger("sink.thrift")

SOURCE = Path(__file__).with_name("jvm") / "PasswordFileAuthenticator.scala"
AUTH_CLASS = "mqtthistory.PasswordFileAuthenticator"


def spark_jars() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent / "jars"


def auth_classes_dir(build_root: Path) -> Path:
    """The compiled authenticator (built when missing or older than its source): a directory
    to put on the driver's class path. Takes a few seconds the first time."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = build_root / f"hive-auth-{digest}"
    if (out / "mqtthistory" / "PasswordFileAuthenticator.class").is_file():
        return out
    jars = spark_jars()

    def jar(prefix: str) -> str:
        found = sorted(jars.glob(f"{prefix}*.jar"))
        if not found:
            raise RuntimeError(f"no {prefix}*.jar in {jars}: pyspark is incomplete")
        return str(found[-1])
    tmp = build_root / f".hive-auth-{digest}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    compiler_cp = ":".join(jar(p) for p in ("scala-compiler", "scala-library", "scala-reflect"))
    cmd = ["java", "-cp", compiler_cp, "scala.tools.nsc.Main", "-usejavacp", "-nowarn",
           "-cp", jar("spark-hive-thriftserver"), "-d", str(tmp), str(SOURCE)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"cannot compile {SOURCE.name}: {res.stderr.strip()[-1000:]}")
    tmp.rename(out)
    return out


def thrift_conf(build_root: Path) -> dict[str, str]:
    """Spark settings the JVM needs at launch for the endpoint (the authenticator's class
    path)."""
    return {"spark.driver.extraClassPath": str(auth_classes_dir(build_root))}


class _Checker:
    """py4j: the JVM's mqtthistory.PasswordCheck, answered from the password file."""

    class Java:
        implements = ["mqtthistory.PasswordCheck"]

    def __init__(self, path: str) -> None:
        from broker.auth.passwords import PasswordFile
        self.passwords = PasswordFile(path)

    def check(self, user: str, password: str) -> bool:
        ok = self.passwords.check(user, password.encode("utf-8", "surrogatepass"))
        if not ok:
            log.warning("JDBC: refused user %r (wrong user name or password)", user)
        return ok


def serve_thrift(spark: Any, h: HistoryConfig) -> None:  # a SparkSession (its JVM gateway is used)
    """Start the Thrift server in the job's SparkContext (HiveThriftServer2.startWithContext):
    on [history] jdbc_host:jdbc_port, users of jdbc_password_file."""
    from pyspark.java_gateway import ensure_callback_server_started
    sc = spark.sparkContext
    gw = sc._gateway
    ensure_callback_server_started(gw)
    checker = _Checker(h.jdbc_password_file)
    sc._mqtt_thrift_checker = checker  # keep the Python object alive
    gw.jvm.mqtthistory.PasswordCheckHolder.set(checker)
    for k, v in {"hive.server2.thrift.bind.host": h.jdbc_host,
                 "hive.server2.thrift.port": str(h.jdbc_port),
                 "hive.server2.transport.mode": "binary",
                 "hive.server2.authentication": "CUSTOM",
                 "hive.server2.custom.authentication.class": AUTH_CLASS,
                 "hive.server2.enable.doAs": "false"}.items():
        spark.conf.set(k, v)
        sc._jsc.hadoopConfiguration().set(k, v)
        # the authenticator is looked up in a fresh HiveConf, which reads system properties
        gw.jvm.java.lang.System.setProperty(k, v)
    gw.jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(
        spark._jsparkSession.sqlContext())
    log.info("JDBC/ODBC (HiveServer2) on %s:%d, users of %s: e.g. beeline -u "
             "jdbc:hive2://%s:%d/default -n USER -p PASSWORD -e \"SELECT count(*) FROM messages\"",
             h.jdbc_host, h.jdbc_port, h.jdbc_password_file,
             "127.0.0.1" if h.jdbc_host in ("0.0.0.0", "::", "") else h.jdbc_host, h.jdbc_port)
