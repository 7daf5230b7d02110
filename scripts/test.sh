#!/usr/bin/env bash
# Install everything and run the whole test suite. Extra arguments go to pytest.
# With no arguments the unit tests run a second time on the pure-Python codec
# (MQTT_PURE_PYTHON=1), the one a machine without a C compiler runs; setup.sh compiles it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 0 ] && [ $# -eq 0 ]; then
  echo "test.sh: the unit tests again, on the pure-Python codec"
  MQTT_PURE_PYTHON=1 .venv/bin/python -m pytest -q tests/unit
  rc=$?
fi
set -e
if [ $rc -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit $rc
