#!/usr/bin/env bash
# Run the whole thing on defaults: embedded Kafka (Tansu), the MQTT broker with its sink,
# and the Spark history job. Ctrl-C stops all three.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
CONFIG=${CONFIG:-config/broker.toml}
PY=.venv/bin/python

# The spool keeps every record until the job has it in the table (an embedded Kafka restart
# loses nothing); the broker finds the job's committed file from the same config's [history].
"$PY" -m broker --config "$CONFIG" --sink --set sink.keep_until=history "$@" &
broker_pid=$!
job_pid=
stop() {
  trap - INT TERM EXIT
  [ -n "$job_pid" ] && kill -TERM "$job_pid" 2>/dev/null || true
  kill -TERM "$broker_pid" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap stop INT TERM EXIT

# The Spark job reads the Kafka the broker's sink forwards to (embedded on 127.0.0.1:9092 by default).
"$PY" -m sink.job --config "$CONFIG" &
job_pid=$!
wait -n "$broker_pid" "$job_pid"
