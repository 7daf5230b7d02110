#!/usr/bin/env bash
# Install everything and run the whole test suite. Extra arguments go to pytest.
# With no arguments the unit tests run a second time on the pure-Python codec and core
# (MQTT_PURE_PYTHON=1), the one a machine without a C compiler runs; setup.sh compiles it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# MQTT.js for tests/integration/test_interop_clients.py (a test's client, not needed to run the
# broker: here rather than in setup.sh): the versions its package-lock.json pins (npm ci), again
# only when the lock changed.
js=tests/clients/mqttjs
jsstamp=$js/node_modules/.lock.sha
jswant=$(sha256sum "$js/package-lock.json" | cut -d' ' -f1)
if [ ! -f "$jsstamp" ] || [ "$(cat "$jsstamp")" != "$jswant" ]; then
  echo "test.sh: installing MQTT.js into $js/node_modules (npm ci)"
  if ! command -v npm >/dev/null 2>&1 || ! npm ci --prefix "$js" --no-audit --no-fund --loglevel=error >/dev/null; then
    echo "test.sh: ERROR: could not install MQTT.js (npm's error, if any, is above)." >&2
    echo "test.sh: it needs node and npm (as root: apt-get install nodejs npm, or run scripts/setup.sh" \
         "as root) and the npm registry; then run: npm ci --prefix $js" >&2
    exit 1
  fi
  echo "$jswant" > "$jsstamp"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "test.sh: ruff check and mypy (their settings in pyproject.toml)"
.venv/bin/ruff check .
.venv/bin/mypy
set +e
.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 0 ] && [ $# -eq 0 ]; then
  echo "test.sh: the unit tests again, on the pure-Python codec and core"
  MQTT_PURE_PYTHON=1 .venv/bin/python -m pytest -q tests/unit
  rc=$?
fi
# The deployment files in containers (deploy/test.sh: 1.5-4 min with its images cached, up to 9
# building them): DEPLOY_TEST=1 always, DEPLOY_TEST=0 never; unset: in CI (CI=true) as root.
if [ $rc -eq 0 ] && [ $# -eq 0 ]; then
  deploy=${DEPLOY_TEST:-}
  [ -z "$deploy" ] && { [ "${CI:-}" = true ] && [ "$(id -u)" = 0 ] && deploy=1 || deploy=0; }
  if [ "$deploy" = 1 ]; then
    echo "test.sh: the deployment files in containers (bash deploy/test.sh)"
    bash deploy/test.sh
    rc=$?
    if [ $rc -eq 77 ] && [ -z "${DEPLOY_TEST:-}" ]; then
      echo "test.sh: deploy/test.sh skipped: this machine cannot run containers (see above)"
      rc=0
    fi
  else
    echo "test.sh: deploy/test.sh not run (DEPLOY_TEST=1 runs it; CI runs it as root)"
  fi
fi
set -e
if [ $rc -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit $rc
