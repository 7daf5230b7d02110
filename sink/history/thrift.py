"""JDBC/ODBC for BI tools: the job serves Spark's Thrift server (HiveServer2 protocol) from its
own Spark session, beside Spark Connect. Off by default ([history] jdbc = false).

    beeline -u jdbc:hive2://127.0.0.1:10000/default -n alice -p secret -e "SELECT count(*) FROM messages"

Authentication: HiveServer2's CUSTOM mode with ``mqtthistory.PasswordFileAuthenticator``
(jvm/PasswordFileAuthenticator.scala, compiled with the guard: sink/history/guard.py), which asks
this process: user names and passwords are checked against the operators' password file
``[history] jdbc_password_file``, in the broker's format (``python -m broker.auth passwd FILE
add USER``: scrypt, which the JDK lacks). It is never the devices' file (``[auth] password_file``):
an MQTT login is not a login to the history of every device. The alternatives Spark's Thrift
server knows do not fit: NONE/NOSASL check nothing, LDAP and Kerberos need servers, PAM needs
the JPam native library (not packaged).

The queries run in sessions of the job's SparkContext, so they see the table ``messages`` (and
its newest committed version at each query) exactly as Spark Connect clients do, and are
read-only like theirs (sink/history/guard.py): queries of the catalog's tables, SHOW, DESCRIBE,
USE; no writes, no DDL, no settings, no file paths, no user code.
"""
from __future__ import annotations

import logging
from typing import Any

from settings import HistoryConfig

log = logging.getLogger(__name__)

AUTH_CLASS = "mqtthistory.PasswordFileAuthenticator"


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
