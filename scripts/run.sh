#!/usr/bin/env bash
# Run the whole thing on defaults: embedded Kafka (Tansu), the MQTT broker with its sink,
# and the Spark history job. Ctrl-C stops all three.
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

# A bad setting stops everything here, before anything starts: one line naming the key, exit 2.
"$PY" -m broker --config "$CONFIG" --sink --set sink.keep_until=history "${dash[@]}" "$@" --check-config

# The spool keeps every record until the job has it in the table (an embedded Kafka restart
# loses nothing); the broker finds the job's committed file from the same config's [history].
"$PY" -m broker --config "$CONFIG" --sink --set sink.keep_until=history "${dash[@]}" "$@" &
broker_pid=$!
job_pid=
stop() {
  trap - INT TERM EXIT
  [ -n "$job_pid" ] && kill -TERM "$job_pid" 2>/dev/null || true
  kill -TERM "$broker_pid" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap stop INT TERM EXIT

# The Spark job reads the Kafka the broker's sink forwards to (embedded on 127.0.0.1:9092 by default),
# and serves Spark Connect (sc://127.0.0.1:15002 by default) for sink.query and the dashboard.
"$PY" -m sink.job --config "$CONFIG" &
job_pid=$!
if [ "$DASHBOARD" != 0 ]; then
  # where the broker keeps the first administrator's password: its data dir (config, env, --data-dir)
  data_dir=$("$PY" -c 'import sys, settings; print(settings.load(sys.argv[1]).data_dir)' "$CONFIG")
  prev=
  for a in "$@"; do
    [ "$prev" = --data-dir ] && data_dir=$a
    case $a in --data-dir=*) data_dir=${a#--data-dir=} ;; esac
    prev=$a
  done
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
