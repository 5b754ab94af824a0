#!/usr/bin/env bash
# A private MariaDB server for the dbbench task (Debian's mariadb-server, no systemd).
#
#   scripts/mariadb.sh install   # apt-get install mariadb-server when mariadbd is missing (root)
#   scripts/mariadb.sh start     # idempotent; prints the URL the dbbench worker takes (mariadb_url)
#   scripts/mariadb.sh stop      # stops only the server this script started (by its pid file)
#   scripts/mariadb.sh status    # exit 0 when the server answers
#   scripts/mariadb.sh url       # unix:///<run dir>/mysqld.sock
#
# The server listens on a unix socket only; set AGENTRL_MARIADB_PORT to also listen on
# 127.0.0.1:PORT (never another address). The administrator is root over the socket (socket
# authentication; the account that runs this script). Data is throwaway (each dbbench episode
# creates and drops its own database), so durability is traded for speed: no doublewrite, redo
# log flushed once a second.
#   AGENTRL_MARIADB_DIR  (default /var/lib/agentrl-mariadb)  data directory, mariadbd.log
#   AGENTRL_MARIADB_RUN  (default /run/agentrl-mariadb)      mysqld.sock, mariadbd.pid
set -euo pipefail

DATA_ROOT="${AGENTRL_MARIADB_DIR:-/var/lib/agentrl-mariadb}"
RUN_ROOT="${AGENTRL_MARIADB_RUN:-/run/agentrl-mariadb}"
PORT="${AGENTRL_MARIADB_PORT:-}"
SOCKET="${RUN_ROOT}/mysqld.sock"
PIDFILE="${RUN_ROOT}/mariadbd.pid"
LOGFILE="${DATA_ROOT}/mariadbd.log"
START_TIMEOUT_S="${AGENTRL_MARIADB_START_TIMEOUT_S:-60}"

ping_server() {
    [ -S "${SOCKET}" ] || return 1
    mariadb-admin --no-defaults --socket="${SOCKET}" --user=root --connect-timeout=2 ping >/dev/null 2>&1
}

# A pid that runs (a killed server whose parent has not reaped it yet is a zombie: not running).
running() {
    kill -0 "$1" 2>/dev/null || return 1
    local state
    state="$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null || true)"
    [ "${state}" != "Z" ]
}

install() {
    if command -v mariadbd >/dev/null 2>&1; then
        return 0
    fi
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "mariadbd not found; install Debian's mariadb-server (apt-get install -y mariadb-server)" >&2
        return 2
    fi
    echo "installing mariadb-server"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server) >/dev/null
}

start() {
    if ping_server; then
        echo "unix://${SOCKET}"
        return 0
    fi
    if ! command -v mariadbd >/dev/null 2>&1; then
        echo "mariadbd not found; run: $0 install (or apt-get install -y mariadb-server)" >&2
        return 2
    fi
    mkdir -p "${DATA_ROOT}" "${RUN_ROOT}"
    if [ -f "${PIDFILE}" ] && running "$(cat "${PIDFILE}")"; then
        echo "mariadbd pid $(cat "${PIDFILE}") exists but does not answer on ${SOCKET}; see ${LOGFILE}" >&2
        return 1
    fi
    local as_user=()
    if [ "$(id -u)" = 0 ]; then as_user=(--user=root); fi
    if [ ! -d "${DATA_ROOT}/data/mysql" ]; then
        mariadb-install-db --no-defaults --datadir="${DATA_ROOT}/data" "${as_user[@]}" \
            --auth-root-authentication-method=socket --skip-test-db --innodb-log-file-size=16M \
            >"${DATA_ROOT}/install.log" 2>&1 || { tail -n 20 "${DATA_ROOT}/install.log" >&2; return 1; }
    fi
    local network=(--skip-networking)
    if [ -n "${PORT}" ]; then network=(--bind-address=127.0.0.1 --port="${PORT}"); fi
    rm -f "${SOCKET}"
    nohup mariadbd --no-defaults "${as_user[@]}" \
        --datadir="${DATA_ROOT}/data" \
        --socket="${SOCKET}" \
        --pid-file="${PIDFILE}" \
        --log-error="${LOGFILE}" \
        "${network[@]}" \
        --skip-name-resolve \
        --character-set-server=utf8mb4 \
        --collation-server=utf8mb4_unicode_520_ci \
        --max-connections=2000 \
        --innodb-buffer-pool-size=128M \
        --innodb-log-file-size=16M \
        --innodb-flush-log-at-trx-commit=0 \
        --innodb-doublewrite=0 \
        >/dev/null 2>&1 </dev/null &
    local waited=0
    until ping_server; do
        sleep 0.25
        waited=$((waited + 1))
        if [ "${waited}" -ge $((START_TIMEOUT_S * 4)) ]; then
            echo "mariadbd did not answer on ${SOCKET} within ${START_TIMEOUT_S}s; last log lines:" >&2
            tail -n 20 "${LOGFILE}" >&2 || true
            return 1
        fi
    done
    echo "unix://${SOCKET}"
}

stop() {
    if [ ! -f "${PIDFILE}" ]; then
        echo "no ${PIDFILE}: nothing to stop"
        return 0
    fi
    local pid
    pid="$(cat "${PIDFILE}")"
    if running "${pid}"; then
        kill -TERM "${pid}"
        for _ in $(seq 1 120); do
            running "${pid}" || break
            sleep 0.25
        done
        if running "${pid}"; then
            echo "mariadbd pid ${pid} did not stop within 30s" >&2
            return 1
        fi
    fi
    rm -f "${PIDFILE}"
    echo "mariadbd stopped"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) ping_server && echo "running: unix://${SOCKET}" || { echo "not running"; exit 1; } ;;
    url) echo "unix://${SOCKET}" ;;
    *)
        echo "usage: $0 install|start|stop|status|url" >&2
        exit 2
        ;;
esac
