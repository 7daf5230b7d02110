#!/usr/bin/env bash
# Set up everything on a fresh machine: system packages (when root), .venv with pinned deps.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  need=()
  command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
  command -v mosquitto_pub >/dev/null 2>&1 || need+=(mosquitto-clients)
  command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need+=(mosquitto)
  # the dashboard's browser test drives Debian's Chromium through chromedriver (selenium)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
  # the cluster's load balancer (scripts/cluster.sh and its test)
  command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
  # MQTT.js, a client the interop tests drive (tests/clients/mqttjs: scripts/test.sh runs npm ci)
  command -v node >/dev/null 2>&1 || need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]}"
    # (no service starts during the install: Debian's mosquitto would take port 1883)
    if ! bash scripts/mosquitto_service.sh install "${need[@]}"; then
      echo "setup: ERROR: apt-get could not install ${need[*]} (its error is above)." >&2
      echo "setup: fix that first (often: apt-get update, or a proxy or mirror setting), or" \
           "install them by hand: apt-get install ${need[*]}; then run this again." >&2
      exit 1
    fi
  fi
  # the benchmarks need the mosquitto binary, not its service (which takes port 1883)
  bash scripts/mosquitto_service.sh disable
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$(cat requirements-broker.txt requirements.txt requirements-dev.txt requirements-build.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing pinned Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  echo "$want" > "$stamp"
fi
# Spark's commands in .venv/bin that work without activating the venv (scripts/spark_command.sh
# sets SPARK_HOME and finds Java); pip's own, which need the venv's python3 first on PATH, are
# replaced every time pip has put them back.
for name in beeline spark-sql spark-submit pyspark; do
  if ! cmp -s scripts/spark_command.sh ".venv/bin/$name"; then
    cp scripts/spark_command.sh ".venv/bin/$name.tmp" && mv -f ".venv/bin/$name.tmp" ".venv/bin/$name"
  fi
done
# The codec and core compiled with mypyc (broker/native.py); rebuilt only when their sources changed.
.venv/bin/python scripts/build_native.py
# The history job's read-only guard (Scala, sink/history/guard.py), compiled now rather than at
# the job's first start (about 40 s of JVM work); rebuilt only when its sources changed.
# The history job JVM's class-data archive (sink/history/job/class_archive.py): its start-up
# classes parsed once, mapped at every start (a third of the JVM's start-up CPU); made now, once
# (about a minute of one job start), again only for another JVM, Spark or guard. (One Python
# start for both: this runs at every scripts/run.sh.)
.venv/bin/python -m sink.history.job.class_archive --with-guard
