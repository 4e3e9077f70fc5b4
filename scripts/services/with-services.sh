#!/usr/bin/env bash
# Run a command with a throwaway PostgreSQL, MariaDB, S3-compatible server (moto) and Azure
# Storage emulator (Azurite):
#
#   scripts/services/with-services.sh CMD [ARGS...]
#   e.g. scripts/services/with-services.sh cargo test --workspace
#
# Starts the servers (in parallel) in a fresh temporary directory, exports their connection
# facts (PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE STRATA_TEST_PG_* STRATA_TEST_PG_URL,
# STRATA_TEST_MYSQL_* STRATA_TEST_MYSQL_URL, STRATA_TEST_S3_*, STRATA_TEST_AZURE_*; see
# postgres.sh, mariadb.sh, s3.sh and azurite.sh), runs CMD, then stops them and removes the directory, whatever happens (also on
# Ctrl-C). Exits with CMD's exit code; if a server fails to start, prints why and exits 1
# without running CMD.
#
# STRATA_SERVICES="postgres" (or "mariadb s3", ...) starts only those; the default is all four
# (postgres mariadb s3 azurite).
# STRATA_SERVICES_KEEP=1 keeps the temporary directory (logs, data) for a post-mortem.
set -euo pipefail

ME="with-services.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SERVICES="${STRATA_SERVICES:-postgres mariadb s3 azurite}"

note() { printf '%s: %s\n' "$ME" "$*" >&2; }

if [ $# -eq 0 ]; then
  sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi

for s in $SERVICES; do
  case "$s" in
    postgres | mariadb | s3 | azurite) ;;
    *) note "error: unknown service '$s' in STRATA_SERVICES (known: postgres mariadb s3 azurite)"; exit 2 ;;
  esac
done

# Unix socket paths live in the directory and must stay short: ignore a long TMPDIR.
base="${TMPDIR:-/tmp}"
[ "${#base}" -le 40 ] && [ -d "$base" ] && [ -w "$base" ] || base=/tmp
WORK="$(mktemp -d "$base/strata-svc.XXXXXX")"
# Run as root, PostgreSQL runs as the unprivileged `postgres` user, which must enter WORK.
chmod 711 "$WORK"

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  # A start still under way (Ctrl-C or TERM came early) finishes first, so that stop finds
  # its pid file; then stop everything.
  wait 2>/dev/null
  local s
  for s in $SERVICES; do
    "$HERE/$s.sh" stop "$WORK" >/dev/null
  done
  if [ "${STRATA_SERVICES_KEEP:-0}" = 1 ]; then
    note "kept $WORK"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Start all services at once; each prints its facts on stdout (kept in a file) and its
# progress and errors on stderr (shown as they come).
declare -A pids
for s in $SERVICES; do
  "$HERE/$s.sh" start "$WORK" >"$WORK/$s.out" &
  pids[$s]=$!
done
failed=""
for s in $SERVICES; do
  if ! wait "${pids[$s]}"; then
    failed="$failed $s"
  fi
done
if [ -n "$failed" ]; then
  for s in $failed; do
    case "$s" in
      postgres) log="$WORK/pg/postgres.log" ;;
      mariadb) log="$WORK/mariadb/mariadb.log" ;;
      s3) log="$WORK/s3/moto.log" ;;
      azurite) log="$WORK/azurite/azurite.log" ;;
    esac
    note "error: $s failed to start; its messages and the tail of its log ($log) are above"
  done
  [ "${STRATA_SERVICES_KEEP:-0}" = 1 ] || note "rerun with STRATA_SERVICES_KEEP=1 to keep $WORK for a look"
  exit 1
fi

for s in $SERVICES; do
  set -a
  # shellcheck disable=SC1090
  . "$WORK/$s.out"
  set +a
done
note "up: $SERVICES (in $WORK); running: $*"

# CMD runs in the background because bash runs traps only between commands: this way a
# TERM or INT sent to this script is passed on to CMD at once, and the servers are stopped
# as soon as CMD is gone. It keeps our stdin and process group (so Ctrl-C reaches it as
# usual), and gets back the default SIGINT/SIGQUIT handling that bash takes away from
# background commands.
( trap - INT QUIT; exec "$@" ) <&0 &
cmd_pid=$!
trap 'kill -TERM "$cmd_pid" 2>/dev/null || true' TERM
trap 'kill -INT "$cmd_pid" 2>/dev/null || true' INT
rc=0
while :; do
  rc=0
  wait "$cmd_pid" || rc=$?
  kill -0 "$cmd_pid" 2>/dev/null || break # else wait was cut short by a signal
done
exit "$rc"
