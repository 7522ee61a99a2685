#!/usr/bin/env bash
# Start or stop a Docker engine for development and CI. Installs nothing.
#
#   launch/docker_engine.sh start    # start dockerd if installed and not answering; wait for it
#   launch/docker_engine.sh stop     # stop the dockerd this script started (by its PID)
#   launch/docker_engine.sh status   # exit 0 when an engine answers
#
# The engine runs with --iptables=false --ip-forward=false --bridge=none, so it
# changes nothing in the host's network; sandbox containers use no network.
# WMRL_DOCKERD_STATE (default /tmp/wmrl-dockerd) holds the PID file and the log.
set -euo pipefail

STATE_DIR="${WMRL_DOCKERD_STATE:-/tmp/wmrl-dockerd}"
PID_FILE="$STATE_DIR/dockerd.pid"
LOG_FILE="$STATE_DIR/dockerd.log"
WAIT_S="${WMRL_DOCKERD_WAIT_S:-60}"

answers() {
  docker info >/dev/null 2>&1
}

start() {
  if answers; then
    echo "docker engine: already answering"
    return 0
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "docker engine: dockerd is not installed (Debian: apt-get install docker.io)" >&2
    return 1
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "docker engine: starting dockerd needs root" >&2
    return 1
  fi
  mkdir -p "$STATE_DIR"
  # Detached from this shell's session so that it outlives the caller.
  setsid dockerd --iptables=false --ip-forward=false --bridge=none \
    --pidfile "$PID_FILE" >"$LOG_FILE" 2>&1 </dev/null &
  local pid=$!
  for _ in $(seq 1 $((WAIT_S * 10))); do
    if answers; then
      echo "docker engine: started (pid $pid, log $LOG_FILE)"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "docker engine: dockerd exited; last lines of $LOG_FILE:" >&2
      tail -n 20 "$LOG_FILE" >&2 || true
      return 1
    fi
    sleep 0.1
  done
  echo "docker engine: no answer after ${WAIT_S}s; see $LOG_FILE" >&2
  return 1
}

stop() {
  if [ ! -f "$PID_FILE" ]; then
    echo "docker engine: no PID file at $PID_FILE; nothing this script started is running"
    return 0
  fi
  local pid
  pid="$(cat "$PID_FILE")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 300); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "docker engine: pid $pid ignored SIGTERM for 30s; sending SIGKILL" >&2
      kill -KILL "$pid" || true
    fi
  fi
  rm -f "$PID_FILE"
  echo "docker engine: stopped (pid $pid)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) answers && echo "docker engine: answering" || { echo "docker engine: not answering"; exit 1; } ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
