#!/usr/bin/env bash
# Spark's command of this name (beeline, spark-sql, spark-submit, pyspark) from the PySpark
# of the virtualenv this file is in, runnable without activating it: scripts/setup.sh installs
# it as .venv/bin/<name>. pip's own scripts find Spark by running `python3` from PATH, which
# outside the venv has no pyspark ("Could not find valid SPARK_HOME").
# Shell builtins only: it runs with any PATH (env -i PATH=/usr/bin:/bin .venv/bin/beeline --help).
name=${0##*/}
bin=${0%/*}
[ "$bin" = "$0" ] && bin=.
bin=$(cd "$bin" && pwd)
home=
for d in "$bin"/../lib/python3*/site-packages/pyspark; do
  [ -x "$d/bin/$name" ] && home=$(cd "$d" && pwd)
done
if [ -z "$home" ]; then
  echo "$name: no PySpark with bin/$name in $bin/../lib/python3*/site-packages: run scripts/setup.sh" >&2
  exit 1
fi
export SPARK_HOME=$home
# the venv's Python for Spark's Python workers and the pyspark shell (not the system's python3)
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$bin/python}
if [ -n "${JAVA_HOME:-}" ]; then
  if [ ! -x "$JAVA_HOME/bin/java" ]; then
    echo "$name: JAVA_HOME=$JAVA_HOME has no bin/java: set JAVA_HOME to a Java 17 installation, or unset it to use the java on PATH" >&2
    exit 1
  fi
elif ! command -v java >/dev/null 2>&1; then
  for d in /usr/lib/jvm/java-17-openjdk-* /usr/lib/jvm/default-java; do
    if [ -x "$d/bin/java" ]; then export JAVA_HOME=$d; break; fi
  done
  if [ -z "${JAVA_HOME:-}" ]; then
    echo "$name: no Java found (no java on PATH, no JAVA_HOME): install Java 17 (as root: apt-get install openjdk-17-jre-headless, which scripts/setup.sh does) or set JAVA_HOME" >&2
    exit 1
  fi
fi
exec "$SPARK_HOME/bin/$name" "$@"
