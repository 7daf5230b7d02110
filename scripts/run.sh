#!/usr/bin/env bash
# Run the whole thing on defaults: embedded Kafka (Tansu), the MQTT broker with its sink,
# and the Spark history job (with the same arguments, e.g. --data-dir DIR, --set history.jdbc=true).
# Ctrl-C stops all three.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
CONFIG=${CONFIG:-config/broker.toml}
PY=.venv/bin/python

# The dashboard is on by default here (bound to localhost; DASHBOARD=0 turns it off).
DASHBOARD=${DASHBOARD:-1}
DASHBOARD_PORT=${DASHBOARD_PORT:-18083}
dash=()
if [ "$DASHBOARD" != 0 ]; then
  dash=(--set dashboard.enabled=true --set "dashboard.port=$DASHBOARD_PORT")
fi

# Every part reads one tree (settings/parts.py), built from the same arguments and environment:
# the broker (with its sink, forwarders, replay and dashboard) and the history job get the same
# --config, --set, --data-dir and flags, so a setting reaches the part that reads it.
args=(--config "$CONFIG" --sink --set sink.keep_until=history "${dash[@]}" "$@")

# A bad setting stops everything here, before anything starts: one line naming the key, exit 2
# (also a --set that no part reads, naming the part that would).
"$PY" -m broker "${args[@]}" --with-job --check-config
"$PY" -m sink.job "${args[@]}" --with-broker --check-config

# Each part in a process group of its own: a terminal's Ctrl-C reaches this script only, which
# asks every part to stop once (SIGTERM); Ctrl-C again passes it on (the job's third signal ends
# it at once, its last commit reported). Same session: the job's niceness is its own only.
own_group=(-c 'import os, sys; os.setpgid(0, 0); os.execv(sys.argv[1], sys.argv[1:])')
pids=()
stop() {
  trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' INT TERM HUP
  trap - EXIT
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null; do wait "$p" 2>/dev/null || true; done
  done
}
trap stop INT TERM HUP EXIT

# The spool keeps every record until the job has it in the table (an embedded Kafka restart
# loses nothing); the broker finds the job's committed file from the same [history].
"$PY" "${own_group[@]}" "$PY" -m broker "${args[@]}" --with-job &
broker_pid=$!
pids+=("$broker_pid")

# The Spark job reads the Kafka the broker's sink forwards to (embedded on 127.0.0.1:9092 by default),
# and serves Spark Connect (sc://127.0.0.1:15002 by default) for sink.query and the dashboard.
"$PY" "${own_group[@]}" "$PY" -m sink.job "${args[@]}" --with-broker &
job_pid=$!
pids+=("$job_pid")
if [ "$DASHBOARD" != 0 ]; then
  # where the broker keeps the first administrator's password: its data dir, from the same tree
  data_dir=$("$PY" -c 'import sys; from broker.__main__ import build_config, parse_args
print(build_config(parse_args(sys.argv[1:])).data_dir)' "${args[@]}" --with-job)
  for _ in $(seq 50); do [ -e "$data_dir/dashboard-users" ] && break; sleep 0.2; done
  echo "run.sh: dashboard on http://127.0.0.1:$DASHBOARD_PORT/ (history charts once the Spark job is up)"
  if [ -e "$data_dir/dashboard-admin-password" ]; then
    echo "run.sh: log in as admin with the password in $data_dir/dashboard-admin-password" \
         "(change it: $PY -m broker.admin --data-dir $data_dir users passwd admin)"
  else
    echo "run.sh: log in with an operator account of $data_dir/dashboard-users" \
         "($PY -m broker.admin --data-dir $data_dir users list)"
  fi
  echo "run.sh: more operators: $PY -m broker.admin --data-dir $data_dir users add NAME --role viewer|admin"
fi
# The broker listens on this machine only unless told otherwise (--host); say how to open it.
case " $* " in
  *" --host "*) ;;
  *) cat <<'EOF'
run.sh: MQTT listens on 127.0.0.1 (this machine only; anonymous clients allowed here). To let
        devices on the network in, give them users and open the listener:
          .venv/bin/python -m broker.auth passwd data/passwd add DEVICE      # asks the password
          bash scripts/run.sh --host 0.0.0.0 --set auth.password_file=data/passwd
        (mosquitto_passwd files work too; anonymous access from anywhere: --set auth.allow_anonymous=true)
EOF
  ;;
esac
wait -n "$broker_pid" "$job_pid"
