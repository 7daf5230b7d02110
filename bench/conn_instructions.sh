#!/bin/bash
# User-space machine instructions per connection of the whole broker process (Python, uvloop,
# libc; not the kernel) under the `conns` load, counted by valgrind's callgrind: the broker runs
# under callgrind twice, for N1 and N2 connections (connect, hold, DISCONNECT, close), and the
# difference per connection is printed. The same on every run within a few percent (how many
# connections one loop turn serves still varies), so it shows what timings on a busy machine hide;
# unlike bench/conn_cycle.py it includes uvloop, the event loop's turns and the garbage collector.
#
#   bash bench/conn_instructions.sh [ours|floor] [N1] [N2]     # defaults: ours 1000 6000
#
# `floor` is bench/uvloop_floor.py (a bare uvloop server). Needs valgrind (apt-get install
# valgrind); takes a minute. 2026-11-23: ours 108,900 -> 103,000-104,000 (tune_gc), floor 30,100.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-ours}; n1=${2:-1000}; n2=${3:-6000}
py=.venv/bin/python
command -v valgrind >/dev/null || { echo "valgrind is not installed: apt-get install valgrind" >&2; exit 2; }

count() {  # count N: instructions of a broker process that served N connections
  local n=$1 port=$((20000 + RANDOM % 10000)) dir
  dir=$(mktemp -d)
  local vg=(valgrind --tool=callgrind "--callgrind-out-file=$dir/cg.out")
  case $which in
    ours) taskset -c 0 "${vg[@]}" $py -m broker --host 127.0.0.1 --port $port --data-dir "$dir" >"$dir/log" 2>&1 & ;;
    floor) taskset -c 0 "${vg[@]}" $py bench/uvloop_floor.py $port >"$dir/log" 2>&1 & ;;
    *) echo "usage: $0 [ours|floor] [N1] [N2]" >&2; exit 2 ;;
  esac
  local pid=$!
  for _ in $(seq 240); do ss -ltn | grep -q ":$port " && break; sleep 0.5; done
  sleep 1
  echo go | taskset -c 1 $py bench/loadgen.py --scenario conns --conn-warmup 0 --host 127.0.0.1 --port $port \
      --conns "$n" >/dev/null 2>&1
  sleep 1
  callgrind_control -d "$pid" >/dev/null 2>&1 || true  # dump now: the totals so far
  sleep 2
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  grep -h -E "^(summary|totals):" "$dir"/cg.out.* | head -1 | awk '{print $2}'
  rm -rf "$dir"
}

a=$(count "$n1"); b=$(count "$n2")
echo "$which: $(( (b - a) / (n2 - n1) )) user-space instructions per connection (N $n1 -> $n2)"
