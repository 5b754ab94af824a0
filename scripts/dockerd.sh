#!/usr/bin/env bash
# Start, stop or query a private Docker engine for agentrl_ext tests and benchmarks.
#
#   scripts/dockerd.sh start    # idempotent: returns at once when the engine already answers
#   scripts/dockerd.sh stop     # stops only the dockerd this script started (by its pid file)
#   scripts/dockerd.sh status   # exit 0 when the engine answers
#   scripts/dockerd.sh host     # prints the DOCKER_HOST value (unix://...)
#
# The engine never touches the host network: no bridge, no iptables rules, no NAT. Containers
# must use network_mode "none" or "host" (agentrl_ext.env.providers enforces this).
# Everything lives under its own directories, so it does not disturb another engine:
#   AGENTRL_DOCKERD_DATA  (default /var/lib/agentrl-dockerd)  images, containers, dockerd.log
#   AGENTRL_DOCKERD_RUN   (default /run/agentrl-dockerd)      exec root, docker.sock, dockerd.pid
set -euo pipefail

DATA_ROOT="${AGENTRL_DOCKERD_DATA:-/var/lib/agentrl-dockerd}"
RUN_ROOT="${AGENTRL_DOCKERD_RUN:-/run/agentrl-dockerd}"
SOCKET="${RUN_ROOT}/docker.sock"
PIDFILE="${RUN_ROOT}/dockerd.pid"
LOGFILE="${DATA_ROOT}/dockerd.log"
START_TIMEOUT_S="${AGENTRL_DOCKERD_START_TIMEOUT_S:-60}"

ping_engine() {
    # The engine's /_ping answers "OK" once it serves the API.
    [ -S "${SOCKET}" ] || return 1
    if command -v curl >/dev/null 2>&1; then
        [ "$(curl -s --max-time 2 --unix-socket "${SOCKET}" http://localhost/_ping 2>/dev/null)" = "OK" ]
    else
        docker -H "unix://${SOCKET}" version >/dev/null 2>&1
    fi
}

start() {
    if ping_engine; then
        echo "dockerd already running: unix://${SOCKET}"
        return 0
    fi
    if ! command -v dockerd >/dev/null 2>&1; then
        echo "dockerd not found on PATH; install it with: apt-get update && apt-get install -y docker.io" >&2
        return 2
    fi
    mkdir -p "${DATA_ROOT}" "${RUN_ROOT}"
    if [ -f "${PIDFILE}" ] && kill -0 "$(cat "${PIDFILE}")" 2>/dev/null; then
        echo "dockerd pid $(cat "${PIDFILE}") exists but does not answer on ${SOCKET}; see ${LOGFILE}" >&2
        return 1
    fi
    rm -f "${PIDFILE}" "${SOCKET}"
    nohup dockerd \
        --bridge=none \
        --iptables=false \
        --ip-masq=false \
        --userland-proxy=false \
        --storage-driver=overlay2 \
        --data-root="${DATA_ROOT}/data" \
        --exec-root="${RUN_ROOT}/exec" \
        --pidfile="${PIDFILE}" \
        -H "unix://${SOCKET}" \
        >"${LOGFILE}" 2>&1 </dev/null &
    local waited=0
    until ping_engine; do
        sleep 0.25
        waited=$((waited + 1))
        if [ "${waited}" -ge $((START_TIMEOUT_S * 4)) ]; then
            echo "dockerd did not answer on ${SOCKET} within ${START_TIMEOUT_S}s; last log lines:" >&2
            tail -n 20 "${LOGFILE}" >&2 || true
            return 1
        fi
    done
    echo "dockerd started: unix://${SOCKET} (pid $(cat "${PIDFILE}" 2>/dev/null || echo '?'))"
}

stop() {
    if [ ! -f "${PIDFILE}" ]; then
        echo "no ${PIDFILE}: nothing to stop"
        return 0
    fi
    local pid
    pid="$(cat "${PIDFILE}")"
    if kill -0 "${pid}" 2>/dev/null; then
        kill -TERM "${pid}"
        for _ in $(seq 1 120); do
            kill -0 "${pid}" 2>/dev/null || break
            sleep 0.25
        done
        if kill -0 "${pid}" 2>/dev/null; then
            echo "dockerd pid ${pid} did not stop within 30s" >&2
            return 1
        fi
    fi
    rm -f "${PIDFILE}"
    echo "dockerd stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) ping_engine && echo "running: unix://${SOCKET}" || { echo "not running"; exit 1; } ;;
    host) echo "unix://${SOCKET}" ;;
    *)
        echo "usage: $0 start|stop|status|host" >&2
        exit 2
        ;;
esac
