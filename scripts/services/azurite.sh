#!/usr/bin/env bash
# A throwaway Azure Blob Storage / ADLS emulator for tests: Azurite, from the npm registry.
#
#   scripts/services/azurite.sh start  DIR   # install (first time), start, prepare; print the facts
#   scripts/services/azurite.sh stop   DIR   # stop it; no process left behind
#   scripts/services/azurite.sh status DIR   # print the facts if running, exit 1 if not
#
# `start` installs the pinned Azurite (scripts/services/azurite/package.json and its
# package-lock.json) into scripts/services/azurite/node_modules when missing or when the pins
# changed, starts its Blob service on 127.0.0.1 on a free port (data in DIR/azurite/data, log
# in DIR/azurite/azurite.log, no telemetry), creates the container `strata-test` of the
# emulator's well-known account devstoreaccount1 (azurite/bootstrap.py), then prints shell
# lines on stdout and writes them to DIR/azurite.env:
#
#   export STRATA_TEST_AZURE_BLOB_URL=http://127.0.0.1:PORT
#   export STRATA_TEST_AZURE_ACCOUNT=devstoreaccount1 STRATA_TEST_AZURE_CONTAINER=strata-test
#
# (the tests hand object_store's AZURE_STORAGE_USE_EMULATOR=true and
# AZURITE_BLOB_STORAGE_URL to the processes that should see them; the account key is
# Azurite's documented default, which object_store uses in emulator mode). All progress and
# error messages go to stderr; stdout carries only those lines.
set -Eeuo pipefail

ME="azurite.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PKG="$HERE/azurite"
BIN="$PKG/node_modules/.bin/azurite-blob"
STAMP="$PKG/node_modules/.package-lock-installed"
CONTAINER="strata-test"
ACCOUNT="devstoreaccount1"
START_TIMEOUT="${STRATA_AZURITE_START_TIMEOUT:-60}"
LOG=""

USAGE_LINES="2,6"
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_installed() {
  if [ -x "$BIN" ] && cmp -s "$PKG/package-lock.json" "$STAMP"; then
    return 0
  fi
  command -v npm >/dev/null || fail "npm is not installed (Azurite comes from the npm registry)"
  note "installing the pinned Azurite (package-lock.json) into $PKG/node_modules"
  (cd "$PKG" && npm ci --no-audit --no-fund --loglevel=error >&2) ||
    fail "cannot install Azurite into $PKG/node_modules (npm ci)"
  cp "$PKG/package-lock.json" "$STAMP"
}

running() {
  local pid
  [ -f "$1/azurite/azurite.pid" ] && pid="$(cat "$1/azurite/azurite.pid")" &&
    kill -0 "$pid" 2>/dev/null
}

start() {
  local dir="$1" port i
  mkdir -p "$dir/azurite/data"
  LOG="$dir/azurite/azurite.log"
  if running "$dir" && [ -f "$dir/azurite.env" ]; then
    cat "$dir/azurite.env"
    return 0
  fi
  ensure_installed
  for i in 1 2 3; do
    port="$(free_port)"
    nohup "$BIN" --blobHost 127.0.0.1 --blobPort "$port" --location "$dir/azurite/data" \
      --silent --loose --skipApiVersionCheck --disableTelemetry >"$LOG" 2>&1 </dev/null &
    echo $! >"$dir/azurite/azurite.pid"
    local waited=0
    while ! grep -q "successfully listens" "$LOG" 2>/dev/null; do
      if ! running "$dir"; then
        break
      fi
      sleep 0.3
      waited=$((waited + 1))
      [ "$waited" -lt $((START_TIMEOUT * 3)) ] || fail "Azurite did not listen on port $port within ${START_TIMEOUT}s"
    done
    running "$dir" && break
    note "Azurite exited (port $port taken?); trying another port"
  done
  running "$dir" || fail "Azurite did not start"
  python3 "$PKG/bootstrap.py" "http://127.0.0.1:$port" "$CONTAINER" 2>>"$LOG" ||
    fail "cannot create the container $CONTAINER (azurite/bootstrap.py)"
  {
    echo "export STRATA_TEST_AZURE_BLOB_URL=http://127.0.0.1:$port"
    echo "export STRATA_TEST_AZURE_ACCOUNT=$ACCOUNT"
    echo "export STRATA_TEST_AZURE_CONTAINER=$CONTAINER"
  } >"$dir/azurite.env"
  note "Azurite (Azure Blob Storage) up on 127.0.0.1:$port, container $CONTAINER"
  cat "$dir/azurite.env"
}

stop() {
  stop_pidfile "$1/azurite/azurite.pid"
}

[ $# -eq 2 ] || usage
case "$1" in
  start) start "$2" ;;
  stop) stop "$2" ;;
  status) running "$2" && cat "$2/azurite.env" ;;
  *) usage ;;
esac
