#!/usr/bin/env bash
# A throwaway S3-compatible server for tests: moto in server mode, from PyPI.
#
#   scripts/services/s3.sh start  DIR   # install (first time), start, prepare; print the facts
#   scripts/services/s3.sh stop   DIR   # stop it; no process left behind
#   scripts/services/s3.sh status DIR   # print the facts if running, exit 1 if not
#
# `start` installs the pinned moto (scripts/services/s3/requirements.txt) into
# scripts/services/s3/.venv when missing or when the pins changed, starts `moto_server` on
# 127.0.0.1 on a free port it picks itself (state in memory, log in DIR/s3/moto.log), makes
# it check credentials as S3 does (IAM enforced after the bootstrap's three requests), creates
# a user with its keys and the bucket `strata-test` (s3/bootstrap.py), then prints shell lines
# on stdout and writes them to DIR/s3.env:
#
#   export STRATA_TEST_S3_ENDPOINT=http://127.0.0.1:PORT STRATA_TEST_S3_BUCKET=strata-test
#   export STRATA_TEST_S3_ACCESS_KEY_ID=... STRATA_TEST_S3_SECRET_ACCESS_KEY=...
#   export STRATA_TEST_S3_REGION=us-east-1
#
# (not AWS_* themselves: the tests hand them to the processes that should see them). All
# progress and error messages go to stderr; stdout carries only those lines.
set -Eeuo pipefail

ME="s3.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/s3/.venv"
REQ="$HERE/s3/requirements.txt"
BUCKET="strata-test"
START_TIMEOUT="${STRATA_S3_START_TIMEOUT:-60}"
LOG=""

USAGE_LINES="2,6"
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ensure_venv() {
  if [ -x "$VENV/bin/moto_server" ] && cmp -s "$REQ" "$VENV/.requirements-installed"; then
    return 0
  fi
  note "installing $(grep -c '^[a-zA-Z]' "$REQ") pinned packages (moto) into $VENV"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" || fail "cannot create $VENV (python3 -m venv)"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ" >&2 ||
    fail "cannot install $REQ into $VENV"
  cp "$REQ" "$VENV/.requirements-installed"
}

running() {
  local pid
  [ -f "$1/s3/moto.pid" ] && pid="$(cat "$1/s3/moto.pid")" && kill -0 "$pid" 2>/dev/null
}

start() {
  local dir="$1" port i
  mkdir -p "$dir/s3"
  LOG="$dir/s3/moto.log"
  if running "$dir" && [ -f "$dir/s3.env" ]; then
    cat "$dir/s3.env"
    return 0
  fi
  ensure_venv
  for i in 1 2 3; do
    port="$(free_port)"
    INITIAL_NO_AUTH_ACTION_COUNT=3 nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" \
      >"$LOG" 2>&1 </dev/null &
    echo $! >"$dir/s3/moto.pid"
    local waited=0
    while ! python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/moto-api/data.json', timeout=1)" 2>/dev/null; do
      if ! running "$dir"; then
        break
      fi
      sleep 0.3
      waited=$((waited + 1))
      [ "$waited" -lt $((START_TIMEOUT * 3)) ] || fail "moto did not answer on port $port within ${START_TIMEOUT}s"
    done
    running "$dir" && break
    note "moto exited (port $port taken?); trying another port"
  done
  running "$dir" || fail "moto did not start"
  local keys
  keys="$("$VENV/bin/python" "$HERE/s3/bootstrap.py" "http://127.0.0.1:$port" "$BUCKET" 2>>"$LOG")" ||
    fail "cannot prepare the bucket and keys (s3/bootstrap.py)"
  {
    echo "export STRATA_TEST_S3_ENDPOINT=http://127.0.0.1:$port"
    echo "export STRATA_TEST_S3_BUCKET=$BUCKET"
    echo "export STRATA_TEST_S3_ACCESS_KEY_ID=${keys% *}"
    echo "export STRATA_TEST_S3_SECRET_ACCESS_KEY=${keys#* }"
    echo "export STRATA_TEST_S3_REGION=us-east-1"
  } >"$dir/s3.env"
  note "moto (S3) up on 127.0.0.1:$port, bucket $BUCKET"
  cat "$dir/s3.env"
}

stop() {
  stop_pidfile "$1/s3/moto.pid"
}

[ $# -eq 2 ] || usage
case "$1" in
  start) start "$2" ;;
  stop) stop "$2" ;;
  status) running "$2" && cat "$2/s3.env" ;;
  *) usage ;;
esac
