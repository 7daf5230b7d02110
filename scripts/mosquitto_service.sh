#!/usr/bin/env bash
# Debian's mosquitto package starts a mosquitto service on port 1883 when it is installed (and
# at every boot), which then keeps this project's broker (scripts/run.sh) from binding 1883. The
# project needs only the mosquitto binary (bench/bench.py runs it side by side, on its own
# ports) and the client tools, so setup.sh installs the package with this script:
#   mosquitto_service.sh install PACKAGES...   apt-get install with service starts refused
#                                              (policy-rc.d, for the install only)
#   mosquitto_service.sh disable               stop and disable the service if it runs or is enabled
set -euo pipefail
SYSTEMD_DIR=${SYSTEMD_DIR:-/run/systemd/system}   # present when systemd is the init system
POLICY=${POLICY_RC_D:-/usr/sbin/policy-rc.d}

case "${1:-}" in
install)
  shift
  made=
  if [ ! -e "$POLICY" ]; then       # "101: action not allowed" for every service, during the install
    printf '#!/bin/sh\nexit 101\n' > "$POLICY"
    chmod 755 "$POLICY"
    made=1
  fi
  rc=0
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null) || rc=$?
  [ -n "$made" ] && rm -f "$POLICY"
  exit $rc
  ;;
disable)
  if [ -d "$SYSTEMD_DIR" ] && command -v systemctl >/dev/null 2>&1; then
    if systemctl is-enabled --quiet mosquitto 2>/dev/null || systemctl is-active --quiet mosquitto 2>/dev/null; then
      systemctl disable --now mosquitto >/dev/null 2>&1 || true
      echo "setup: stopped and disabled the mosquitto service (it takes port 1883; the project needs only its binary)"
    fi
  elif command -v service >/dev/null 2>&1 && [ -x /etc/init.d/mosquitto ]; then
    if service mosquitto status >/dev/null 2>&1; then
      service mosquitto stop >/dev/null 2>&1 || true
      echo "setup: stopped the mosquitto service (it takes port 1883; the project needs only its binary)"
    fi
    command -v update-rc.d >/dev/null 2>&1 && update-rc.d mosquitto disable >/dev/null 2>&1 || true
  fi
  ;;
*)
  echo "usage: $0 install PACKAGES... | disable" >&2
  exit 2
  ;;
esac
