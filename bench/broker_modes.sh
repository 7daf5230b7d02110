#!/usr/bin/env bash
# Broker throughput with the Kafka sink off / on (spool, async) and with persistence on / off.
# Starts an embedded Kafka (Tansu) for the sink runs. Figures go to stdout.
#   bash bench/broker_modes.sh [extra bench.py args, e.g. --repeats 3]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
KPORT=${KPORT:-19095}
"$PY" -c "
import signal, sys, time
sys.path.insert(0, '.')
from sink.forward.kafka_embedded import EmbeddedKafka
k = EmbeddedKafka(port=$KPORT).start()
signal.signal(signal.SIGTERM, lambda *a: (k.stop(), sys.exit(0)))
time.sleep(3600)
" &
KPID=$!
trap 'kill $KPID 2>/dev/null || true' EXIT
sleep 2
BASE="{python} -m broker --host {host} --port {port} --data-dir {datadir}"
run() {  # title, broker command, bench.py args...
  local title=$1 cmd=$2; shift 2
  echo "=== $title"
  "$PY" bench/bench.py --only ours --duration 5 --repeats 2 --broker-cmd "$cmd" "$@" 2>&1 \
    | grep -E "^(QoS|Latency)" || true
}
run "sink off" "$BASE" --scenarios qos0_fanin,qos1_fanin "$@"
for mode in spool async; do
  # the forwarder process runs on core 1 (the broker is pinned to core 0)
  run "sink $mode" "$BASE --kafka-bootstrap 127.0.0.1:$KPORT --set sink.stats_interval=0 --set sink.forwarder_cpus=1 --set sink.durability=$mode" \
    --scenarios qos0_fanin,qos1_fanin "$@"
done
run "persistence on, persistent sessions" "$BASE" --scenarios qos1_fanin,qos2 --persistent "$@"
run "persistence off, persistent sessions" "$BASE --set persistence.enabled=false" --scenarios qos1_fanin,qos2 --persistent "$@"
