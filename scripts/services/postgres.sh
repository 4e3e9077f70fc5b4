#!/usr/bin/env bash
# A throwaway PostgreSQL for tests: its own cluster, port and socket, nothing shared with a
# system-wide server.
#
#   scripts/services/postgres.sh start  DIR   # init (first time) and start; print the facts
#   scripts/services/postgres.sh stop   DIR   # fast shutdown; no process left behind
#   scripts/services/postgres.sh status DIR   # print the facts if running, exit 1 if not
#
# `start` initialises a cluster in DIR/pg/data (first time only), configures it for logical
# decoding (wal_level=logical, 20 replication slots and WAL senders), listens on 127.0.0.1
# only, on a free port it picks itself, with its unix socket in DIR/pg/sock, and trades
# durability for speed (fsync=off, synchronous_commit=off, full_page_writes=off). The
# superuser `strata_test` (password `strata_test_pw`, checked with scram-sha-256 on TCP; may
# also replicate) owns the database `strata_test`. TLS is on (ssl = on) with a certificate
# for `localhost` signed by a test CA made at the first start (DIR/pg/tls, see make_test_certs
# in common.sh); `strata_test` may connect with or without it, the superuser `strata_tls`
# (same password, may replicate) only with it (pg_hba rejects it in plain, so a test that
# logs in as it proves TLS was used), and the superuser `strata_cert` (may replicate) only
# over TLS with the client certificate the test CA signed for it (pg_hba `cert`, ssl_ca_file
# the test CA; no password). It waits until the server accepts a password login
# over TCP, then prints shell lines on stdout and writes them to DIR/pg.env:
#
#   export PGHOST=127.0.0.1 ... export STRATA_TEST_PG_URL=postgres://strata_test:...@127.0.0.1:PORT/strata_test
#   export STRATA_TEST_PG_TLS_USER=strata_tls STRATA_TEST_PG_SSLROOTCERT=DIR/pg/tls/ca.crt
#   export STRATA_TEST_PG_OTHER_CA=DIR/pg/tls/other-ca.crt   (a CA that signed nothing here)
#   export STRATA_TEST_PG_CERT_USER=strata_cert STRATA_TEST_PG_SSLCERT=DIR/pg/tls/client.crt
#   export STRATA_TEST_PG_SSLKEY=DIR/pg/tls/client.key
#
# Use them with `eval "$(scripts/services/postgres.sh start DIR)"` or `. DIR/pg.env`.
# All progress and error messages go to stderr; stdout carries only those lines.
# Starting a running cluster prints the same facts again; stopping a stopped one is a no-op.
#
# PostgreSQL refuses to run as root. Run as root, the script runs initdb/pg_ctl as the
# unprivileged OS user `postgres` (created if missing; override with STRATA_PG_OS_USER), which
# must be able to reach DIR: if it cannot, the script adds o+x to DIR itself (never to its
# parents) and says so. The server binaries are taken from STRATA_PG_BINDIR, else from the
# directory the `initdb` on PATH resolves to, else from the newest /usr/lib/postgresql/*/bin.
set -Eeuo pipefail

ME="postgres.sh"
PG_USER="strata_test"
PG_TLS_USER="strata_tls"
PG_CERT_USER="strata_cert"
PG_PASSWORD="strata_test_pw"
PG_DATABASE="strata_test"
PG_HOST="127.0.0.1"
START_TIMEOUT="${STRATA_PG_START_TIMEOUT:-60}"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

LOG=""  # set once DIR is known; fail() shows its tail
USAGE_LINES="2,8"
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

find_bindir() {
  local d p
  if [ -n "${STRATA_PG_BINDIR:-}" ]; then
    d="$STRATA_PG_BINDIR"
  elif p="$(command -v initdb 2>/dev/null)"; then
    d="$(dirname "$(readlink -f "$p")")"
  else
    d="$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  fi
  if [ -z "$d" ] || [ ! -x "$d/initdb" ] || [ ! -x "$d/pg_ctl" ] || [ ! -x "$d/postgres" ]; then
    fail "PostgreSQL server binaries not found (looked at STRATA_PG_BINDIR, the initdb on PATH, /usr/lib/postgresql/*/bin); install postgresql-15 or set STRATA_PG_BINDIR"
  fi
  BINDIR="$d"
  PSQL="$BINDIR/psql"
  [ -x "$PSQL" ] || PSQL="$(command -v psql 2>/dev/null)" || fail "psql not found"
  PG_ISREADY="$BINDIR/pg_isready"
  [ -x "$PG_ISREADY" ] || PG_ISREADY="$(command -v pg_isready 2>/dev/null)" || fail "pg_isready not found"
}

# Run a PostgreSQL tool as the OS user that owns the cluster, from a directory it may enter.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    (cd / && runuser -u "$OS_USER" -- "$@")
  else
    (cd / && "$@")
  fi
}

setup_os_user() {
  if [ "$(id -u)" -ne 0 ]; then
    OS_USER="$(id -un)"
    return
  fi
  OS_USER="${STRATA_PG_OS_USER:-postgres}"
  # An existing cluster is run by whoever owns it.
  if [ -d "$DATA" ]; then
    OS_USER="$(stat -c %U "$DATA")"
    if [ "$OS_USER" = UNKNOWN ] || [ "$OS_USER" = root ]; then
      fail "$DATA is owned by $(stat -c '%U (uid %u)' "$DATA"); cannot run PostgreSQL as that user"
    fi
  fi
  command -v runuser >/dev/null 2>&1 || fail "running as root needs runuser (util-linux) to drop to the '$OS_USER' user"
  if ! id -u "$OS_USER" >/dev/null 2>&1; then
    note "PostgreSQL refuses to run as root; creating the unprivileged system user '$OS_USER' for it"
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin "$OS_USER" ||
      fail "could not create the OS user '$OS_USER' (useradd failed)"
  fi
}

# Can $OS_USER reach and write DIR's pg folder? Only DIR's own mode is ever changed.
check_reachable() {
  [ "$(id -u)" -eq 0 ] || return 0
  if ! runuser -u "$OS_USER" -- test -x "$DIR" 2>/dev/null; then
    note "the '$OS_USER' user cannot enter $DIR; adding o+x to it"
    chmod o+x "$DIR"
    runuser -u "$OS_USER" -- test -x "$DIR" 2>/dev/null ||
      fail "the '$OS_USER' user cannot reach $DIR (a parent directory is not searchable by others); use a DIR under /tmp"
  fi
}

# pg_ctl status: 0 running, 3 not running, 4 data directory not readable.
is_running() {
  [ -f "$DATA/PG_VERSION" ] || return 1
  local rc=0
  as_pg "$BINDIR/pg_ctl" status -D "$DATA" >/dev/null 2>&1 || rc=$?
  case "$rc" in
    0) return 0 ;;
    3) return 1 ;;
    *) fail "cannot tell whether PostgreSQL runs on $DATA (pg_ctl status as '$OS_USER' exited $rc)" ;;
  esac
}

psql_tcp() {
  PGPASSWORD="$PG_PASSWORD" PGCONNECT_TIMEOUT=5 "$PSQL" -X -q -v ON_ERROR_STOP=1 \
    -h "$PG_HOST" -p "$PORT" -U "$PG_USER" "$@"
}

facts() {
  cat <<EOF
export PGHOST=$PG_HOST
export PGPORT=$PORT
export PGUSER=$PG_USER
export PGPASSWORD=$PG_PASSWORD
export PGDATABASE=$PG_DATABASE
export STRATA_TEST_PG_HOST=$PG_HOST
export STRATA_TEST_PG_PORT=$PORT
export STRATA_TEST_PG_USER=$PG_USER
export STRATA_TEST_PG_PASSWORD=$PG_PASSWORD
export STRATA_TEST_PG_DATABASE=$PG_DATABASE
export STRATA_TEST_PG_SOCKET_DIR=$SOCK
export STRATA_TEST_PG_URL=postgres://$PG_USER:$PG_PASSWORD@$PG_HOST:$PORT/$PG_DATABASE
export STRATA_TEST_PG_TLS_USER=$PG_TLS_USER
export STRATA_TEST_PG_SSLROOTCERT=$TLS/ca.crt
export STRATA_TEST_PG_OTHER_CA=$TLS/other-ca.crt
export STRATA_TEST_PG_CERT_USER=$PG_CERT_USER
export STRATA_TEST_PG_SSLCERT=$TLS/client.crt
export STRATA_TEST_PG_SSLKEY=$TLS/client.key
EOF
}

emit_facts() {
  facts >"$ENV_FILE.tmp.$$"
  mv -f "$ENV_FILE.tmp.$$" "$ENV_FILE"
  cat "$ENV_FILE"
}

write_conf() {
  # Rewritten on every start (only the port changes); postgresql.conf includes it.
  cat >"$DATA/strata.conf" <<EOF
# Written by scripts/services/postgres.sh on each start; edits are lost.
listen_addresses = '$PG_HOST'
port = $PORT
unix_socket_directories = '$SOCK'
unix_socket_permissions = 0777
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_connections = 100
fsync = off
synchronous_commit = off
full_page_writes = off
password_encryption = 'scram-sha-256'
timezone = 'UTC'
log_timezone = 'UTC'
logging_collector = off
log_line_prefix = '%m [%p] '
ssl = on
ssl_cert_file = '$TLS/server.crt'
ssl_key_file = '$TLS/server.key'
ssl_ca_file = '$TLS/ca.crt'
EOF
  if [ "$(id -u)" -eq 0 ]; then chown "$OS_USER:" "$DATA/strata.conf"; fi
}

write_hba() {
  # Rewritten on every start, so that a cluster made by an older version of this script gets
  # the TLS-only user's lines too. TCP needs the password (scram); the private unix socket in
  # DIR trusts local users; strata_tls is rejected without TLS; strata_cert needs TLS and the
  # client certificate (CN=strata_cert) the test CA signed.
  cat >"$DATA/pg_hba.conf" <<EOF
# Written by scripts/services/postgres.sh on each start; edits are lost.
# TYPE     DATABASE     USER        ADDRESS        METHOD
local      all          all                        trust
local      replication  all                        trust
hostnossl  all          $PG_TLS_USER  127.0.0.1/32   reject
hostnossl  replication  $PG_TLS_USER  127.0.0.1/32   reject
hostnossl  all          $PG_CERT_USER 127.0.0.1/32   reject
hostnossl  replication  $PG_CERT_USER 127.0.0.1/32   reject
hostssl    all          $PG_CERT_USER 127.0.0.1/32   cert
hostssl    replication  $PG_CERT_USER 127.0.0.1/32   cert
host       all          all         127.0.0.1/32   scram-sha-256
host       replication  all         127.0.0.1/32   scram-sha-256
EOF
  if [ "$(id -u)" -eq 0 ]; then chown "$OS_USER:" "$DATA/pg_hba.conf"; fi
}

# The test CA and server certificate (made once); the server wants its key owned by it, 0600.
setup_tls() {
  make_test_certs "$TLS"
  if [ "$(id -u)" -eq 0 ]; then chown -R "$OS_USER:" "$TLS"; fi
}

init_cluster() {
  if [ -e "$DATA" ] && [ -n "$(ls -A "$DATA" 2>/dev/null)" ]; then
    fail "$DATA exists but holds no PostgreSQL cluster (no PG_VERSION); remove it or use another DIR"
  fi
  note "initdb: new cluster in $DATA ($("$BINDIR/postgres" --version))"
  mkdir -p "$PGROOT" "$SOCK"
  if [ "$(id -u)" -eq 0 ]; then chown "$OS_USER:" "$PGROOT" "$SOCK"; fi
  chmod 711 "$PGROOT"
  local pwfile="$PGROOT/.pwfile"
  (umask 077 && printf '%s\n' "$PG_PASSWORD" >"$pwfile")
  if [ "$(id -u)" -eq 0 ]; then chown "$OS_USER:" "$pwfile"; fi
  if ! as_pg "$BINDIR/initdb" -D "$DATA" -U "$PG_USER" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C --no-sync \
    >"$PGROOT/initdb.log" 2>&1; then
    rm -f "$pwfile"
    LOG="$PGROOT/initdb.log"
    fail "initdb failed"
  fi
  rm -f "$pwfile"
  printf "\n# Settings for strata's tests\ninclude = 'strata.conf'\n" >>"$DATA/postgresql.conf"
}

# --- commands --------------------------------------------------------------------------------

do_start() {
  mkdir -p "$DIR"
  DIR="$(cd "$DIR" && pwd -P)"
  set_paths
  setup_os_user
  check_reachable

  if is_running; then
    PORT="$(cat "$PGROOT/port" 2>/dev/null)" || fail "a server runs on $DATA but $PGROOT/port is missing"
    "$PG_ISREADY" -q -h "$PG_HOST" -p "$PORT" -t 10 ||
      fail "a server runs on $DATA but does not answer on $PG_HOST:$PORT"
    note "already running on $PG_HOST:$PORT"
    emit_facts
    return 0
  fi

  [ -f "$DATA/PG_VERSION" ] || init_cluster
  mkdir -p "$SOCK"
  if [ "$(id -u)" -eq 0 ]; then chown "$OS_USER:" "$SOCK"; fi
  setup_tls
  write_hba

  # Reuse the previous port if it is still free, else pick one; retry if another process
  # binds the chosen port before the server does.
  PORT="$(cat "$PGROOT/port" 2>/dev/null || true)"
  if [ -z "$PORT" ] || ! port_free "$PORT"; then
    PORT="$(free_port)" || fail "could not find a free TCP port"
  fi
  local attempt before started=""
  for attempt in 1 2 3 4 5; do
    write_conf
    before=0
    [ -f "$LOG" ] && before="$(stat -c %s "$LOG")"
    if as_pg "$BINDIR/pg_ctl" start -D "$DATA" -l "$LOG" -w -t "$START_TIMEOUT" -s >/dev/null 2>&1; then
      started=1
      break
    fi
    # pg_ctl gave up; make sure no half-started postmaster survives before deciding.
    as_pg "$BINDIR/pg_ctl" stop -D "$DATA" -m immediate -w -t 30 -s >/dev/null 2>&1 || true
    if tail -c +"$((before + 1))" "$LOG" 2>/dev/null |
      grep -E 'could not bind|Address already in use|could not create any TCP/IP sockets' >/dev/null; then
      note "port $PORT was taken before the server could bind it; trying another (attempt $attempt)"
      PORT="$(free_port)" || fail "could not find a free TCP port"
      continue
    fi
    break
  done
  [ -n "$started" ] || fail "PostgreSQL did not start (data: $DATA, log: $LOG)"
  printf '%s\n' "$PORT" >"$PGROOT/port"

  # pg_ctl -w already waited for "ready"; also wait for a password login over TCP, which is
  # what the tests do.
  local i
  for i in $(seq 1 100); do
    if psql_tcp -d postgres -c 'SELECT 1' >/dev/null 2>&1; then break; fi
    [ "$i" -lt 100 ] || fail "server started but a password login over TCP on $PG_HOST:$PORT fails"
    sleep 0.1
  done
  if [ "$(psql_tcp -d postgres -At -c "SELECT count(*) FROM pg_database WHERE datname = '$PG_DATABASE'")" = 0 ]; then
    psql_tcp -d postgres -c "CREATE DATABASE $PG_DATABASE OWNER $PG_USER" >/dev/null ||
      fail "could not create database $PG_DATABASE"
  fi
  psql_tcp -d postgres -c "DO \$\$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_TLS_USER') THEN
        CREATE ROLE $PG_TLS_USER LOGIN SUPERUSER REPLICATION PASSWORD '$PG_PASSWORD';
      END IF;
    END \$\$" >/dev/null || fail "could not create the role $PG_TLS_USER"
  psql_tcp -d postgres -c "DO \$\$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_CERT_USER') THEN
        CREATE ROLE $PG_CERT_USER LOGIN SUPERUSER REPLICATION;
      END IF;
    END \$\$" >/dev/null || fail "could not create the role $PG_CERT_USER"
  [ "$(psql_tcp -d postgres -At -c 'SHOW ssl')" = on ] || fail "PostgreSQL started without TLS"
  note "PostgreSQL ready on $PG_HOST:$PORT (data $DATA, log $LOG)"
  emit_facts
}

do_stop() {
  if [ ! -d "$DIR" ]; then
    note "$DIR does not exist; nothing to stop"
    return 0
  fi
  DIR="$(cd "$DIR" && pwd -P)"
  set_paths
  setup_os_user
  rm -f "$ENV_FILE"
  if [ ! -f "$DATA/PG_VERSION" ]; then
    note "no cluster in $DATA; nothing to stop"
    return 0
  fi
  if ! is_running; then
    note "not running ($DATA)"
    return 0
  fi
  local pid pids p i alive
  pid="$(head -n 1 "$DATA/postmaster.pid" 2>/dev/null || true)"
  # The postmaster and its children (backends, checkpointer, walsenders...), to make sure
  # every one of them is gone afterwards.
  pids="$pid $(pgrep -P "$pid" 2>/dev/null | tr '\n' ' ' || true)"
  if ! as_pg "$BINDIR/pg_ctl" stop -D "$DATA" -m fast -w -t 60 -s >&2; then
    note "fast shutdown did not finish; trying immediate shutdown"
    as_pg "$BINDIR/pg_ctl" stop -D "$DATA" -m immediate -w -t 30 -s >&2 || true
  fi
  for i in $(seq 1 100); do
    alive=""
    for p in $pids; do
      if kill -0 "$p" 2>/dev/null && grep -q postgres "/proc/$p/cmdline" 2>/dev/null; then
        alive="$alive $p"
      fi
    done
    [ -n "$alive" ] || break
    if [ "$i" -eq 100 ]; then
      note "killing leftover PostgreSQL processes:$alive"
      # shellcheck disable=SC2086 # a list of pids
      kill -KILL $alive 2>/dev/null || true
    fi
    sleep 0.1
  done
  note "stopped ($DATA)"
}

do_status() {
  [ -d "$DIR" ] || { note "$DIR does not exist"; trap - ERR; exit 1; }
  DIR="$(cd "$DIR" && pwd -P)"
  set_paths
  setup_os_user
  if is_running && PORT="$(cat "$PGROOT/port" 2>/dev/null)"; then
    facts
    return 0
  fi
  note "not running ($DATA)"
  trap - ERR
  exit 1
}

set_paths() {
  PGROOT="$DIR/pg"
  DATA="$PGROOT/data"
  SOCK="$PGROOT/sock"
  LOG="$PGROOT/postgres.log"
  TLS="$PGROOT/tls"
  ENV_FILE="$DIR/pg.env"
  # A unix socket path must fit in sun_path (107 bytes).
  [ "${#SOCK}" -le 90 ] ||
    fail "DIR is too long for a unix socket path ($SOCK is ${#SOCK} bytes, at most 90); use a shorter DIR"
}

[ $# -eq 2 ] || usage
CMD="$1"
DIR="$2"
[ -n "$DIR" ] || usage
find_bindir
case "$CMD" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  *) usage ;;
esac
