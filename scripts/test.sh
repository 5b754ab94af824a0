#!/usr/bin/env bash
# The whole test suite, set-up included: venv, Docker engine and base image, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow").
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh || exit 1
# shellcheck disable=SC1091
. "${AGENTRL_VENV:-.venv}/bin/activate"

started_dockerd=0
if [ -f scripts/dockerd.sh ]; then
  if bash scripts/dockerd.sh start; then
    started_dockerd=1
    [ -f scripts/build_base_image.sh ] && bash scripts/build_base_image.sh
  else
    echo "[test] no Docker engine could start: docker-marked tests will be skipped"
  fi
fi
cleanup() { [ "$started_dockerd" = 1 ] && bash scripts/dockerd.sh stop; }
trap cleanup EXIT

start=$(date +%s)
python -m pytest "$@"
rc=$?
echo "[test] pytest finished in $(( $(date +%s) - start ))s with exit code $rc"
# pytest exits 5 when no test was collected: that is a failure of the suite, say so.
if [ "$rc" = 5 ]; then echo "[test] no tests were collected"; fi
exit $rc
