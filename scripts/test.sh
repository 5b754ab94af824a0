#!/usr/bin/env bash
# The whole test suite, set-up included: venv, a private Docker engine and its base image,
# the interop venv (AgentRL's published packages), then pytest. Stops the engine it started.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not slow").
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh || exit 1
# shellcheck disable=SC1091
. "${AGENTRL_VENV:-.venv}/bin/activate"

# Docker engine + debootstrap for the provider tests (Debian packages; skipped tests say why if absent).
if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[test] installing docker.io and debootstrap"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap) >/dev/null \
      || echo "[test] could not install docker.io/debootstrap: docker tests will be skipped"
  fi
fi
dockerd_started=0
if command -v dockerd >/dev/null 2>&1; then
  if ! bash scripts/dockerd.sh status >/dev/null 2>&1; then
    if bash scripts/dockerd.sh start; then dockerd_started=1; else echo "[test] dockerd did not start: docker tests will be skipped"; fi
  fi
  if bash scripts/dockerd.sh status >/dev/null 2>&1; then
    DOCKER_HOST="$(bash scripts/dockerd.sh host)"
    export DOCKER_HOST
    bash scripts/build_base_image.sh || echo "[test] base image build failed: tests that need it will say so"
  fi
fi
# MariaDB for the dbbench tests (Debian's mariadb-server; each test session starts private servers).
bash scripts/mariadb.sh install || echo "[test] mariadb-server unavailable: MariaDB tests will be skipped"
cleanup() { if [ "$dockerd_started" = 1 ]; then bash scripts/dockerd.sh stop; fi; }
trap cleanup EXIT

python tests/env/interop_venv.py || echo "[test] interop venv unavailable: interop tests will be skipped"

start=$(date +%s)
python -m pytest "$@"
rc=$?
echo "[test] pytest finished in $(( $(date +%s) - start ))s with exit code $rc"
# pytest exits 5 when it collected no test: a failure of the suite, say so.
if [ "$rc" = 5 ]; then echo "[test] no tests were collected"; fi
exit $rc
