#!/usr/bin/env bash
# The deployment files, run: builds the images (deploy/Dockerfile) on a local Debian base, starts
# compose.yaml + compose.tansu.yaml with podman-compose, and checks through the published ports:
# anonymous clients refused and a user added to the running broker let in; a message published
# with mosquitto_pub comes back as a row through the job's Spark Connect port; the broker
# container restarted keeps its retained message and a persistent session's queued QoS 1 message
# and forwards again; every container's health check passes; the dashboard answers. Then the
# cluster profile next to it (three nodes behind HAProxy): a persistent subscriber whose node is
# killed gets its session and every QoS 1 message published meanwhile back through HAProxy. Then
# it tears everything down (containers, network, volumes; the images stay as a cache).
#
#   bash deploy/test.sh          as root (rootful podman, apt-get); needs Debian's package archive
#                                and PyPI, nothing else: no image registry
#
# DEPLOY_TEST_DIR=/tmp/mqtt-deploy-test   work files: podman-compose's venv, containers.conf, logs
# DEPLOY_TEST_BASE=IMAGE  build on this base (e.g. python:3.11-slim-bookworm where a registry is
#                         reachable) instead of localhost/debian:bookworm made with debootstrap
# DEPLOY_TEST_FRESH=1     make the base again and build without the cache
# DEPLOY_TEST_KEEP=1      leave the stack running at the end (tear down: the `down -v` it prints)
# Exit status: 0 passed, 1 failed, 2 not root, 77 containers cannot run on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
W=${DEPLOY_TEST_DIR:-/tmp/mqtt-deploy-test}
PROJECT=mqtt-deploy-test
START=$SECONDS
RUN=$(date +%s)-$$          # makes this run's messages unique in the table
CHECKS=0
BUILD_SECONDS=0
CLUSTER_SECONDS=0

say() { printf 'deploy/test.sh [%4ds] %s\n' $((SECONDS - START)) "$*"; }
ok() { CHECKS=$((CHECKS + 1)); say "ok: $*"; }
fail() { say "FAILED: $*"; exit 1; }
# retry CMD until it succeeds, at most $1 seconds
within() { local t=$1; shift; local end=$((SECONDS + t)); until "$@"; do
  [ $SECONDS -lt $end ] || return 1; sleep 1; done; }

[ "$(id -u)" = 0 ] || { echo "deploy/test.sh: run it as root (rootful podman, apt-get)" >&2; exit 2; }
mkdir -p "$W"

# ---- tools ----------------------------------------------------------------------------------
PKGS="podman buildah debootstrap runc iptables netavark aardvark-dns mosquitto-clients curl"
# shellcheck disable=SC2086
if ! dpkg -s $PKGS >/dev/null 2>&1; then
  say "installing $PKGS (apt)"
  apt-get update -q >"$W/apt.log" 2>&1
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS \
    >>"$W/apt.log" 2>&1 || { tail -20 "$W/apt.log"; fail "apt-get install (log: $W/apt.log)"; }
fi
want=$(sha256sum deploy/requirements-test.txt | cut -d' ' -f1)
if [ "$(cat "$W/venv/.requirements.sha" 2>/dev/null)" != "$want" ]; then
  say "installing podman-compose into $W/venv (deploy/requirements-test.txt)"
  rm -rf "$W/venv"
  python3 -m venv "$W/venv"
  "$W/venv/bin/pip" install -q -r deploy/requirements-test.txt
  echo "$want" >"$W/venv/.requirements.sha"
fi
if [ ! -x .venv/bin/python ]; then
  say "no .venv: bash scripts/setup.sh (sink.query runs from it)"
  bash scripts/setup.sh
fi

# ---- what this machine needs (not the user-facing files) ------------------------------------
# Containers may not raise their limits above the session's hard limits (the default 1048576
# open files fails: "setrlimit RLIMIT_NOFILE: Operation not permitted"), crun needs cgroups v2
# here (runc does not), and pip in the builds must trust the CA that PyPI's answers are signed
# with on this network: the host's CA bundle, mounted into every build and run step. Its pip.conf
# also retries longer than pip's default (5 tries in ~8 s): a CI build once failed on a name
# lookup that failed for longer than that.
nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
nproc=10000
mounts=""
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  printf '[global]\ncert = /etc/ssl/host-ca.pem\nretries = 10\ntimeout = 60\n' >"$W/pip.conf"
  mounts="\"/etc/ssl/certs/ca-certificates.crt:/etc/ssl/host-ca.pem:ro\", \"$W/pip.conf:/etc/pip.conf:ro\""
fi
cat >"$W/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
volumes = [$mounts]
[engine]
runtime = "runc"
EOF
cat >"$W/compose.machine.yaml" <<EOF
services:
  broker: &limits
    ulimits:
      nofile: {soft: $nofile, hard: $nofile}
      nproc: {soft: $nproc, hard: $nproc}
  node1: *limits
  node2: *limits
  node3: *limits
  haproxy: *limits
EOF
export CONTAINERS_CONF=$W/containers.conf
export BUILDAH_FORMAT=docker                  # keep the images' HEALTHCHECK (OCI has none)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export MQTT_PORT=${MQTT_PORT:-$(free_port)} METRICS_PORT=${METRICS_PORT:-$(free_port)}
export DASHBOARD_PORT=${DASHBOARD_PORT:-$(free_port)} CONNECT_PORT=${CONNECT_PORT:-$(free_port)}
# one key for the broker, the cluster's nodes and the job (README "Deployment", cluster profile)
export MQTT_SINK_KEY=${MQTT_SINK_KEY:-$(python3 -c 'import secrets; print(secrets.token_hex(32))')}
export MQTT_CLUSTER_KEY=${MQTT_CLUSTER_KEY:-$(python3 -c 'import secrets; print(secrets.token_hex(32))')}
export CLUSTER_MQTT_PORT=${CLUSTER_MQTT_PORT:-$(free_port)}
compose() {  # compose [--profile cluster] COMMAND ...
  "$W/venv/bin/podman-compose" -p "$PROJECT" -f deploy/compose.yaml -f deploy/compose.tansu.yaml \
    -f "$W/compose.machine.yaml" "$@"
}
quiet() { grep -v 'systemd connection\|failed to connect to syslog' || true; }

# ---- the base image --------------------------------------------------------------------------
if [ -n "${DEPLOY_TEST_BASE:-}" ]; then
  export BASE_IMAGE=$DEPLOY_TEST_BASE
else
  export BASE_IMAGE=localhost/debian:bookworm
  if [ -n "${DEPLOY_TEST_FRESH:-}" ] || ! podman image exists "$BASE_IMAGE"; then
    say "making $BASE_IMAGE: debootstrap --variant=minbase bookworm"
    rm -rf "$W/rootfs"
    debootstrap --variant=minbase bookworm "$W/rootfs" http://deb.debian.org/debian \
      >"$W/debootstrap.log" 2>&1 || { tail -20 "$W/debootstrap.log"; fail "debootstrap"; }
    # as Debian's -slim images: no documentation, manual pages or translations
    cat >"$W/rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
    find "$W/rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    rm -rf "$W"/rootfs/usr/share/{man,info,locale}/* "$W"/rootfs/var/lib/apt/lists/* \
      "$W"/rootfs/var/cache/apt/*.bin "$W"/rootfs/var/cache/apt/archives/*.deb
    tar -C "$W/rootfs" -c . | podman import -q - "$BASE_IMAGE" >/dev/null
    rm -rf "$W/rootfs"
  fi
fi
say "base image $BASE_IMAGE"
# exit status 77: this machine cannot run containers at all (scripts/test.sh reports a skip)
if ! out=$(podman run --rm --network=none "$BASE_IMAGE" true 2>&1); then
  say "SKIPPED: containers cannot run on this machine: $(echo "$out" | quiet | tail -1)"
  exit 77
fi

# ---- images ----------------------------------------------------------------------------------
compose --profile cluster down -v >/dev/null 2>&1 || true    # what an interrupted run left
say "building the images (log: $W/build.log)"
t0=$SECONDS
: >"$W/build.log"
if [ -n "${DEPLOY_TEST_FRESH:-}" ]; then  # every stage once without the cache (the job's target
  # needs them all); the compose build then takes them from the cache, as on a new machine
  podman build --no-cache -f deploy/Dockerfile --target job --build-arg "BASE=$BASE_IMAGE" \
    -t localhost/mqtt-job:latest . >>"$W/build.log" 2>&1 || { tail -30 "$W/build.log"; fail "build"; }
fi
compose --profile cluster build >>"$W/build.log" 2>&1 || { tail -30 "$W/build.log"; fail "build"; }
BUILD_SECONDS=$((SECONDS - t0))
for image in mqtt-broker mqtt-job mqtt-haproxy; do
  size=$(podman image inspect --format '{{.Size}}' "localhost/$image:latest")
  hc=$(podman image inspect --format '{{.Config.Healthcheck}}' "localhost/$image:latest")
  say "image localhost/$image:latest: $((size / 1000000)) MB"
  case "$hc" in *healthcheck.py*) ;; *) fail "$image has no HEALTHCHECK ($hc)";; esac
done
ok "images built in ${BUILD_SECONDS}s, each with its HEALTHCHECK"
podman run --rm --network=none localhost/mqtt-broker:latest python -c 'import pyspark' 2>/dev/null \
  && fail "the broker image has PySpark in it"
[ "$(podman run --rm --network=none localhost/mqtt-broker:latest id -u 2>/dev/null)" = 10001 ] \
  || fail "the broker image does not run as uid 10001"
[ "$(podman run --rm --network=none localhost/mqtt-job:latest id -u 2>/dev/null)" = 10001 ] \
  || fail "the job image does not run as uid 10001"
[ "$(podman run --rm --network=none localhost/mqtt-haproxy:latest id -un 2>/dev/null)" = haproxy ] \
  || fail "the haproxy image does not run as the user haproxy"
# without --target (the README's first build command): the broker, not the last stage's job
podman build -q -f deploy/Dockerfile --build-arg "BASE=$BASE_IMAGE" -t localhost/mqtt-default-target:test . \
  >>"$W/build.log" 2>&1 || { tail -30 "$W/build.log"; fail "build without --target"; }
cmd=$(podman image inspect --format '{{.Config.Cmd}}' localhost/mqtt-default-target:test)
podman rmi localhost/mqtt-default-target:test >/dev/null 2>&1 || true
case "$cmd" in *"-m broker "*) ;; *) fail "a build without --target is not the broker image (CMD $cmd)";; esac
ok "the broker image has no PySpark; broker and job run as the user mqtt, haproxy as haproxy; no --target builds the broker"

# ---- the systemd unit, started by systemd --------------------------------------------------
# systemd as PID 1 in a container made from the broker image (its /opt/venv as the unit's
# /opt/broker/.venv). Privileged, so that systemd can build the unit's sandbox (mount namespace,
# seccomp, no capabilities): without that it skips them silently. No network.
UNIT_CT=mqtt-deploy-test-systemd
podman rm -f "$UNIT_CT" >/dev/null 2>&1 || true
trap 'podman rm -f "$UNIT_CT" >/dev/null 2>&1' EXIT
podman build -q -t localhost/mqtt-broker-systemd:latest -f - "$W" >"$W/build-systemd.log" 2>&1 \
  <<'CONTAINERFILE' || { tail -20 "$W/build-systemd.log"; fail "build of the systemd test image"; }
FROM localhost/mqtt-broker:latest
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends systemd systemd-sysv procps mosquitto-clients \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && ln -s /opt/venv /opt/broker/.venv && usermod --home /var/lib/broker mqtt
CMD ["/sbin/init"]
CONTAINERFILE
podman run -d --name "$UNIT_CT" --systemd=always --privileged --network=none \
  -v "$ROOT/deploy/broker.service:/etc/systemd/system/broker.service:ro" \
  localhost/mqtt-broker-systemd:latest >/dev/null 2>"$W/systemd-run.log" \
  || { cat "$W/systemd-run.log"; fail "systemd container"; }
unit() { podman exec "$UNIT_CT" sh -c "$1"; }
unit_log() { unit 'journalctl -u broker -o cat --no-pager' | tail -"${1:-20}"; }
within 30 unit 'case "$(systemctl is-system-running)" in running|degraded) ;; *) exit 1;; esac' \
  || fail "systemd did not come up in the container"
unit 'systemd-analyze verify broker.service' || fail "systemd-analyze verify broker.service"
ok "systemd-analyze verify deploy/broker.service"
# the layout the unit is written for: state and spool in /var/lib/broker; the sink on, with the
# embedded Kafka (Tansu) started by the broker inside the unit's sandbox
unit 'mkdir -p /etc/systemd/system/broker.service.d && printf "[Service]\nEnvironment=MQTT_BROKER_SINK__ENABLED=true MQTT_BROKER_SINK__BOOTSTRAP_SERVERS= MQTT_BROKER_SINK__SPOOL_DIR=\n" >/etc/systemd/system/broker.service.d/test.conf && systemctl daemon-reload'
unit 'runuser -u mqtt -- python -m broker.auth passwd /etc/broker/auth/passwd add alice --password pw' \
  >/dev/null || fail "password file in the systemd container"
unit 'systemctl start broker' || { unit_log; fail "systemctl start broker"; }
# Type=notify: `systemctl start` has returned, so the broker listens now (no retry)
unit 'python /opt/broker/deploy/healthcheck.py' || fail "systemctl start returned before the broker listened"
unit 'P=$(systemctl show -p MainPID --value broker)
      awk "\$5 == \"/\" {print \$6}" /proc/$P/mountinfo | grep -q "^ro," &&
      awk "\$5 == \"/var/lib/broker\" {print \$6}" /proc/$P/mountinfo | grep -q "^rw," &&
      grep -q "^NoNewPrivs:.1" /proc/$P/status && grep -q "^Seccomp:.2" /proc/$P/status &&
      grep -q "^CapEff:.0000000000000000" /proc/$P/status' \
  || fail "the broker runs without its sandbox (read-only /, writable /var/lib/broker, no new privileges, seccomp, no capabilities)"
unit 'mosquitto_pub -u alice -P pw -q 1 -t unit/test -m hello' || fail "QoS 1 publish to the unit's broker"
unit 'systemctl reload broker' || { unit_log; fail "systemctl reload broker"; }
unit 'systemctl stop broker' || { unit_log; fail "systemctl stop broker"; }
[ "$(unit 'systemctl show -p Result --value broker')" = success ] || { unit_log; fail "the unit's stop"; }
unit_log 100 | grep -q "forwarded=1, 0 records left in the spool" \
  || { unit_log; fail "the unit's broker did not forward the message to its embedded Kafka"; }
unit 'printf "[Service]\nEnvironment=MQTT_BROKER_PORT=1\n" >/etc/systemd/system/broker.service.d/port.conf && systemctl daemon-reload'
unit 'systemctl start broker' 2>/dev/null && fail "systemctl start succeeded though the broker cannot listen on port 1"
exposure=$(unit "systemd-analyze security broker --no-pager" 2>/dev/null | tail -1)
podman rm -f "$UNIT_CT" >/dev/null 2>&1
ok "the unit under systemd: start returns once MQTT listens; sandboxed; QoS 1 forwarded to its embedded Kafka; reload; clean stop; a broker that cannot listen fails the start; ${exposure#→ }"

# ---- the stack -------------------------------------------------------------------------------
teardown() {
  rc=$?
  podman rm -f "$UNIT_CT" >/dev/null 2>&1 || true
  [ -z "${SUB_PID:-}" ] || kill "$SUB_PID" 2>/dev/null || true
  if [ $rc -ne 0 ]; then
    for c in kafka broker history node1 node2 node3 haproxy; do
      podman container exists "${PROJECT}_${c}_1" || continue
      echo "---- last lines of $c's log"; podman logs --tail 25 "${PROJECT}_${c}_1" 2>&1 | quiet
    done
  fi
  if [ -n "${DEPLOY_TEST_KEEP:-}" ]; then
    say "left running; tear down with: CONTAINERS_CONF=$W/containers.conf $W/venv/bin/podman-compose -p $PROJECT -f deploy/compose.yaml -f deploy/compose.tansu.yaml -f $W/compose.machine.yaml --profile cluster down -v"
  else
    compose --profile cluster down -v >"$W/down.log" 2>&1 || true
    left=$(podman ps -a --filter "name=^${PROJECT}_" --format '{{.Names}}'; \
           podman volume ls --filter "name=^${PROJECT}_" --format '{{.Name}}')
    [ -z "$left" ] || { say "FAILED: not torn down: $left"; rc=1; }
  fi
  [ $rc -eq 0 ] && say "passed in $((SECONDS - START))s (images built in ${BUILD_SECONDS}s, the cluster part ${CLUSTER_SECONDS}s)"
  echo "deploy/test.sh: $CHECKS passed, $((rc == 0 ? 0 : 1)) failed"
  exit $rc
}
trap teardown EXIT
say "starting the stack (project $PROJECT; MQTT on :$MQTT_PORT, Spark Connect on 127.0.0.1:$CONNECT_PORT)"
compose up -d >"$W/up.log" 2>&1 || { quiet <"$W/up.log" | tail -20; fail "compose up"; }

within 120 python3 deploy/healthcheck.py 127.0.0.1 "$MQTT_PORT" 2>/dev/null \
  || fail "the broker does not answer CONNECT on :$MQTT_PORT"
ok "the broker answers on the published port $MQTT_PORT"

PW="pw-$RUN"
MQ=(-h 127.0.0.1 -p "$MQTT_PORT")
AUTH=("${MQ[@]}" -u alice -P "$PW")
if mosquitto_pub "${MQ[@]}" -q 1 -t deploy/test/anonymous -m x 2>/dev/null; then
  fail "an anonymous client was let in (secure default: a password file)"
fi
out=$(compose exec broker python -m broker.auth passwd /etc/broker/auth/passwd add alice \
      --password "$PW" 2>&1) || { echo "$out"; fail "could not add a user to the running broker"; }
within 30 mosquitto_pub "${AUTH[@]}" -q 1 -t deploy/test/hello -m hi 2>/dev/null \
  || fail "the user added to the running broker cannot publish"
ok "anonymous refused; a user added by broker.auth passwd in the running container gets in"

# a persistent session (MQTT 5, session expiry 1 h) subscribed at QoS 1, then offline
mosquitto_sub "${AUTH[@]}" -V mqttv5 -c -x 3600 -i deploy-test-sub -q 1 -t deploy/test/queued -E \
  || fail "persistent subscriber"
mosquitto_pub "${AUTH[@]}" -q 1 -r -t deploy/test/retained -m "kept-$RUN" || fail "publish retained"
mosquitto_pub "${AUTH[@]}" -q 1 -t deploy/test/queued -m "queued-$RUN" || fail "publish queued"
mosquitto_pub "${AUTH[@]}" -q 1 -t deploy/test/history -m "row-$RUN" || fail "publish row"
ok "published a retained message, one for the offline session and a row, QoS 1"

query() {  # rows of the history table whose payload is $1, through the job's Spark Connect port
  # (with the job's token, from the broker's data directory the job shares: README "Deployment")
  local token
  token=$(podman exec "${PROJECT}_history_1" cat /var/lib/broker/secrets/spark_connect.token 2>/dev/null) \
    || return 1
  SPARK_CONNECT_AUTHENTICATE_TOKEN=$token PYTHONPATH=$ROOT .venv/bin/python -m sink.query \
    --connect "sc://127.0.0.1:$CONNECT_PORT" \
    --format csv "SELECT payload_text, username FROM messages WHERE payload_text = '$1'" 2>/dev/null
}
has_row() { query "$1" | tr -d '\r' | grep -qx "$1,alice"; }  # csv lines end in CRLF
within 300 python3 deploy/healthcheck.py --tcp 127.0.0.1 "$CONNECT_PORT" 2>/dev/null \
  || fail "the job's Spark Connect port $CONNECT_PORT does not listen"
within 240 has_row "row-$RUN" || fail "row-$RUN did not reach the history table"
ok "the row came back through Spark Connect on 127.0.0.1:$CONNECT_PORT (sink.query)"

started() { podman inspect --format '{{.State.StartedAt}}' "${PROJECT}_broker_1"; }
before=$(started)
compose restart broker >"$W/restart.log" 2>&1 || { quiet <"$W/restart.log"; fail "restart"; }
[ "$(started)" != "$before" ] || fail "the broker container was not restarted"
within 120 python3 deploy/healthcheck.py 127.0.0.1 "$MQTT_PORT" 2>/dev/null \
  || fail "the broker did not come back after its restart"
got=$(mosquitto_sub "${AUTH[@]}" -t deploy/test/retained -C 1 -W 20 || true)
[ "$got" = "kept-$RUN" ] || fail "retained message after the restart: '$got', not kept-$RUN"
got=$(mosquitto_sub "${AUTH[@]}" -V mqttv5 -c -x 3600 -i deploy-test-sub -q 1 \
      -t deploy/test/queued -C 1 -W 20 || true)
[ "$got" = "queued-$RUN" ] || fail "queued message after the restart: '$got', not queued-$RUN"
ok "after a restart of the broker container: the retained message and the session's queued message"
mosquitto_pub "${AUTH[@]}" -q 1 -t deploy/test/history -m "after-$RUN" || fail "publish after restart"
within 120 has_row "after-$RUN" || fail "after-$RUN (published after the restart) not in the table"
ok "a message published after the restart reached the table"

for c in kafka broker history; do
  podman healthcheck run "${PROJECT}_${c}_1" >/dev/null 2>&1 || fail "$c is unhealthy"
  [ "$(podman inspect --format '{{.State.Health.Status}}' "${PROJECT}_${c}_1")" = healthy ] \
    || fail "$c's health check did not pass"
done
ok "the health checks of kafka (Tansu), broker and history pass"

DASH=http://127.0.0.1:$DASHBOARD_PORT
[ "$(curl -s -o /dev/null -w '%{http_code}' "$DASH/api/live")" = 401 ] \
  || fail "the dashboard answered without a login"
# a device's credentials do not open the dashboard; its own first administrator does
[ "$(curl -s -o /dev/null -w '%{http_code}' -u "alice:$PW" "$DASH/api/live")" = 401 ] \
  || fail "a device's credentials (alice) opened the dashboard"
ADMIN_PW=$(podman exec "${PROJECT}_broker_1" cat /var/lib/broker/dashboard-admin-password) \
  || fail "no first administrator's password in the broker's data directory"
[ "$(curl -s -o /dev/null -w '%{http_code}' -u "admin:$ADMIN_PW" "$DASH/api/live")" = 200 ] \
  || fail "the dashboard refused its first administrator"
now=$(date -u +%s)
code=$(curl -s -o "$W/history.json" -w '%{http_code}' -u "admin:$ADMIN_PW" \
       "$DASH/api/history?filter=deploy/test/%23&from=$((now - 3600))&to=$((now + 60))")
# 200 (answered) or 503 saying what is missing (the broker image has no Spark client); never 500
case "$code" in 200|503) ;; *) fail "dashboard history: HTTP $code $(head -c 300 "$W/history.json")";; esac
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$METRICS_PORT/health")" = 200 ] \
  || fail "/health on the metrics port"
ok "dashboard: its own accounts (not the devices'), live data; history: HTTP $code $(head -c 160 "$W/history.json")"

# ---- the cluster profile ---------------------------------------------------------------------
# Three nodes (cluster.enabled, n1..n3) on the stack's Kafka (Tansu) behind HAProxy, started next
# to the stack (the same password file, where alice is, and the same history job). A persistent
# subscriber connected through HAProxy loses its node to `podman kill` (SIGKILL: no hand-over);
# while that node is down, QoS 1 messages are published through HAProxy; the subscriber comes
# back through HAProxy to another node and must find its session and every one of them.
t0=$SECONDS
say "starting the cluster profile: nodes n1..n3 and HAProxy on :$CLUSTER_MQTT_PORT"
compose --profile cluster up -d haproxy >"$W/up-cluster.log" 2>&1 \
  || { quiet <"$W/up-cluster.log" | tail -20; fail "compose --profile cluster up -d haproxy"; }
node_health() {  # a node's /health (JSON), from inside its container: its ports are not published
  podman exec "${PROJECT}_node$1_1" python -c 'import urllib.request as u
print(u.urlopen("http://127.0.0.1:9100/health", timeout=5).read().decode())' 2>/dev/null
}
node_field() { node_health "$1" | python3 -c "import json, sys; h = json.load(sys.stdin); print($2)" 2>/dev/null; }
all_members() { for i in 1 2 3; do [ "$(node_field $i 'h["cluster"]["members"]')" = 3 ] || return 1; done; }
within 180 all_members || fail "the three nodes did not each see a cluster of 3 members"
within 30 python3 deploy/healthcheck.py 127.0.0.1 "$CLUSTER_MQTT_PORT" 2>/dev/null \
  || fail "no node answers CONNECT through HAProxy on :$CLUSTER_MQTT_PORT"
for c in node1 node2 node3 haproxy; do
  podman inspect --format '{{range $p, $b := .NetworkSettings.Ports}}{{if $b}}{{$p}} {{end}}{{end}}' \
    "${PROJECT}_${c}_1" >"$W/ports.txt"
  expect=""; [ $c = haproxy ] && expect="1883/tcp "
  [ "$(cat "$W/ports.txt")" = "$expect" ] || fail "$c publishes '$(cat "$W/ports.txt")', not '$expect'"
done
ok "cluster profile: 3 nodes see 3 members; only HAProxy's MQTT port is published (:$CLUSTER_MQTT_PORT)"

# the subscriber (paho-mqtt from .venv): `first` subscribes and waits for its connection's end,
# `resume` comes back with clean start 0 and waits for the payloads it is given
cat >"$W/cluster_sub.py" <<'PY'
import sys
import threading

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

mode, host, port, user, password, cid, topic, *wanted = sys.argv[1:]
missing, done, result = set(wanted), threading.Event(), {"ok": False}
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5,
                reconnect_on_failure=False)
c.username_pw_set(user, password)


def on_connect(c, _u, flags, rc, _p):
    print(f"connected: {rc}, session present {int(flags.session_present)}", flush=True)
    if rc.is_failure or (mode == "resume" and not flags.session_present):
        done.set()
    elif mode == "first":
        c.subscribe(topic, qos=1)


def on_subscribe(_c, _u, _mid, codes, _p):
    print(f"subscribed: {codes[0].value}", flush=True)


def on_message(_c, _u, m):
    print(f"got {m.payload.decode()} (dup {m.dup})", flush=True)
    missing.discard(m.payload.decode())
    if mode == "resume" and not missing:
        result["ok"] = True
        done.set()


def on_disconnect(_c, _u, _flags, rc, _p):
    print(f"lost: {rc}", flush=True)
    if not done.is_set():  # not our own DISCONNECT at the end
        result["ok"] = mode == "first"
        done.set()


c.on_connect, c.on_subscribe, c.on_message, c.on_disconnect = (
    on_connect, on_subscribe, on_message, on_disconnect)
expiry = Properties(PacketTypes.CONNECT)
expiry.SessionExpiryInterval = 3600
c.connect(host, int(port), keepalive=30, clean_start=mode == "first", properties=expiry)
c.loop_start()
done.wait(120 if mode == "first" else 60)
if missing and mode == "resume":
    print(f"missing {len(missing)}: {sorted(missing)}", flush=True)
c.disconnect()
c.loop_stop()
sys.exit(0 if result["ok"] else 1)
PY
LBQ=(-h 127.0.0.1 -p "$CLUSTER_MQTT_PORT" -u alice -P "$PW" -q 1)
CT=deploy/test/cluster
sub() { "$ROOT/.venv/bin/python" "$W/cluster_sub.py" "$1" 127.0.0.1 "$CLUSTER_MQTT_PORT" alice "$PW" \
          deploy-test-cluster-sub "$CT" "${@:2}"; }
sub first >"$W/sub-first.out" 2>&1 &
SUB_PID=$!
within 60 grep -q '^subscribed: 1$' "$W/sub-first.out" \
  || { cat "$W/sub-first.out"; fail "the persistent subscriber through HAProxy"; }
mosquitto_pub "${LBQ[@]}" -t "$CT" -m "live-$RUN" || fail "publish through HAProxy"
within 30 grep -q "^got live-$RUN " "$W/sub-first.out" \
  || { cat "$W/sub-first.out"; fail "live-$RUN published through HAProxy did not reach the subscriber"; }
# its node: the one with one connection (HAProxy's checks open and close some: look until one
# node holds exactly one and the others none)
serving() { local i n; VICTIM=""; for i in 1 2 3; do n=$(node_field $i 'h["connections"]') || return 1
  case $n in 0) ;; 1) [ -z "$VICTIM" ] || return 1; VICTIM=$i;; *) return 1;; esac; done
  [ -n "$VICTIM" ]; }
within 30 serving || fail "could not tell which node serves the subscriber"
ok "a persistent session through HAProxy gets a message published through it (its node: n$VICTIM)"

podman kill "${PROJECT}_node${VICTIM}_1" >/dev/null || fail "podman kill node$VICTIM"
wait "$SUB_PID" || { cat "$W/sub-first.out"; fail "the subscriber's connection did not end with its node"; }
SUB_PID=""
N=20
want=()
for k in $(seq 1 $N); do
  want+=("down-$RUN-$k")
  # until HAProxy has marked n$VICTIM down (2 failed checks a second apart) a connection may still
  # go there and fail: retried
  within 60 timeout 20 mosquitto_pub "${LBQ[@]}" -t "$CT" -m "down-$RUN-$k" 2>/dev/null \
    || fail "down-$RUN-$k: no PUBACK through HAProxy while n$VICTIM is down"
done
[ "$(podman inspect --format '{{.State.Running}}' "${PROJECT}_node${VICTIM}_1")" = false ] \
  || fail "node$VICTIM was running again before the publishes were done"
ok "node$VICTIM killed (SIGKILL); $N QoS 1 messages published through HAProxy, each acknowledged"
sub resume "${want[@]}" >"$W/sub-resume.out" 2>&1 \
  || { cat "$W/sub-resume.out"; fail "the subscriber did not get its session and the $N messages back"; }
grep -q '^connected: Success, session present 1$' "$W/sub-resume.out" \
  || { cat "$W/sub-resume.out"; fail "no session present on the reconnect"; }
ok "the subscriber reconnected through HAProxy: session present, all $N messages published while n$VICTIM was down"

compose --profile cluster start "node$VICTIM" >"$W/start.log" 2>&1 \
  || { quiet <"$W/start.log"; fail "compose --profile cluster start node$VICTIM"; }
within 120 all_members || fail "node$VICTIM did not rejoin the cluster"
for c in node1 node2 node3 haproxy; do
  within 30 podman healthcheck run "${PROJECT}_${c}_1" >/dev/null 2>&1 || fail "$c is unhealthy"
done
within 120 has_row "live-$RUN" || fail "live-$RUN (published through the cluster) not in the history table"
CLUSTER_SECONDS=$((SECONDS - t0))
ok "node$VICTIM restarted rejoins (3 members on every node); the health checks of the nodes and HAProxy pass; the cluster's messages reach the history table (${CLUSTER_SECONDS}s for the cluster part)"
