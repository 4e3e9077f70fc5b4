#!/usr/bin/env bash
# A throwaway cluster for tests: a strata cluster scheduler and two executors (Apache
# DataFusion Ballista with strata's plans), as separate processes on loopback ports.
#
#   scripts/services/cluster.sh start  DIR   # start them; print the facts
#   scripts/services/cluster.sh stop   DIR   # stop them; no process left behind
#   scripts/services/cluster.sh status DIR   # print the facts if running, exit 1 if not
#
# The processes are the binary $STRATA_BIN (default: $CARGO_TARGET_DIR/debug/strata), run
# with the caller's environment (AWS_* for the warehouse's bucket: every process of a
# cluster reads the warehouse with its own credentials). Logs are in DIR/cluster/*.log, pids
# in DIR/cluster/{scheduler,executor-1,executor-2}.pid. `start` prints shell lines on stdout
# and writes them to DIR/cluster.env:
#
#   export STRATA_TEST_CLUSTER_URL=df://127.0.0.1:PORT
#
# CLUSTER_EXECUTORS=N starts N executors instead of two; CLUSTER_SLOTS=N gives each N task
# slots (default 2). Shuffle files go to DIR/cluster/work-N. The processes log Ballista's task
# lines (RUST_LOG=ballista_scheduler=info,ballista_executor=info unless RUST_LOG is set). All
# progress and error messages go to stderr.
set -Eeuo pipefail

ME="cluster.sh"
START_TIMEOUT="${STRATA_CLUSTER_START_TIMEOUT:-60}"
LOG=""

USAGE_LINES="2,6"
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export RUST_LOG="${RUST_LOG:-ballista_scheduler=info,ballista_executor=info}"
BIN="${STRATA_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}/debug/strata}"

running() {
  local pid
  [ -f "$1/cluster/scheduler.pid" ] && pid="$(cat "$1/cluster/scheduler.pid")" && kill -0 "$pid" 2>/dev/null
}

# Waits until 127.0.0.1:$1 accepts connections, while the process of pid file $2 lives.
wait_port() {
  local port="$1" pidfile="$2" waited=0
  until python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), timeout=1).close()" 2>/dev/null; do
    kill -0 "$(cat "$pidfile")" 2>/dev/null || fail "the process of $pidfile exited"
    sleep 0.2
    waited=$((waited + 1))
    [ "$waited" -lt $((START_TIMEOUT * 5)) ] || fail "nothing answered on port $port within ${START_TIMEOUT}s"
  done
}

start() {
  local dir="$1" port i n="${CLUSTER_EXECUTORS:-2}"
  mkdir -p "$dir/cluster"
  if running "$dir" && [ -f "$dir/cluster.env" ]; then
    cat "$dir/cluster.env"
    return 0
  fi
  [ -x "$BIN" ] || fail "no strata binary at $BIN (build it first, or set STRATA_BIN)"
  port="$(free_port)"
  LOG="$dir/cluster/scheduler.log"
  nohup "$BIN" cluster scheduler --bind "127.0.0.1:$port" >"$LOG" 2>&1 </dev/null &
  echo $! >"$dir/cluster/scheduler.pid"
  wait_port "$port" "$dir/cluster/scheduler.pid"
  for i in $(seq 1 "$n"); do
    local flight grpc
    flight="$(free_port)"
    grpc="$(free_port)"
    LOG="$dir/cluster/executor-$i.log"
    mkdir -p "$dir/cluster/work-$i"
    nohup "$BIN" cluster executor --scheduler "127.0.0.1:$port" --host 127.0.0.1 \
      --port "$flight" --grpc-port "$grpc" --slots "${CLUSTER_SLOTS:-2}" --work-dir "$dir/cluster/work-$i" \
      >"$LOG" 2>&1 </dev/null &
    echo $! >"$dir/cluster/executor-$i.pid"
    wait_port "$grpc" "$dir/cluster/executor-$i.pid"
  done
  echo "export STRATA_TEST_CLUSTER_URL=df://127.0.0.1:$port" >"$dir/cluster.env"
  note "cluster up: scheduler on 127.0.0.1:$port, $n executor(s)"
  cat "$dir/cluster.env"
}

stop() {
  local f
  for f in "$1"/cluster/executor-*.pid "$1/cluster/scheduler.pid"; do
    [ -f "$f" ] && stop_pidfile "$f"
  done
  return 0
}

[ $# -eq 2 ] || usage
case "$1" in
  start) start "$2" ;;
  stop) stop "$2" ;;
  status) running "$2" && cat "$2/cluster.env" ;;
  *) usage ;;
esac
