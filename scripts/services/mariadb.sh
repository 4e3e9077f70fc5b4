#!/usr/bin/env bash
# A throwaway MariaDB for tests: its own datadir, port, socket and pid file, nothing shared
# with a system-wide server (the system option files in /etc/mysql are not read).
#
#   scripts/services/mariadb.sh start  DIR   # install if missing, init (first time), start; print the facts
#   scripts/services/mariadb.sh stop   DIR   # clean shutdown; no process left behind
#   scripts/services/mariadb.sh status DIR   # print the facts if running, exit 1 if not
#
# If neither `mariadbd` nor `mysqld` is installed, `start` installs Debian's mariadb-server
# with apt-get (as root only; about 30 s; `apt-get update` only if the first attempt fails;
# a lock keeps parallel runs from installing twice; the package's own system service is kept
# from starting). It initialises DIR/mariadb/data (first time only), starts mariadbd in the
# background listening on 127.0.0.1 only, on a free port it picks itself, with socket, pid
# file, option file and log in DIR/mariadb, and creates the database `strata_test` and the
# user `strata_test` (password `strata_test_pw`) at '%', '127.0.0.1' and 'localhost', with all
# privileges (on every database, WITH GRANT OPTION, so tests can create their own databases
# and users). The server's root account has no password and is reachable only through the
# socket in DIR. TLS is on, with a certificate for `localhost` signed by a test CA made at the
# first start (DIR/mariadb/tls, see make_test_certs in common.sh); the user `strata_tls` (same
# password and privileges as `strata_test`) is created REQUIRE SSL, so a test that logs in as
# it proves TLS was used; the user `strata_cert` (same password and privileges) is created
# REQUIRE X509: it logs in only with the client certificate the test CA signed. It waits until `strata_test` can log in over TCP, then prints shell
# lines on stdout and writes them to DIR/mariadb.env:
#
#   export STRATA_TEST_MYSQL_HOST=127.0.0.1 ... export STRATA_TEST_MYSQL_URL=mysql://strata_test:...@127.0.0.1:PORT/strata_test
#   export STRATA_TEST_MYSQL_TLS_USER=strata_tls STRATA_TEST_MYSQL_SSL_CA=DIR/mariadb/tls/ca.crt
#   export STRATA_TEST_MYSQL_OTHER_CA=DIR/mariadb/tls/other-ca.crt   (a CA that signed nothing here)
#   export STRATA_TEST_MYSQL_CERT_USER=strata_cert STRATA_TEST_MYSQL_SSL_CERT=DIR/mariadb/tls/client.crt
#   export STRATA_TEST_MYSQL_SSL_KEY=DIR/mariadb/tls/client.key
#
# Use them with `eval "$(scripts/services/mariadb.sh start DIR)"` or `. DIR/mariadb.env`.
# All progress and error messages go to stderr; stdout carries only those lines.
# Starting a running server prints the same facts again; stopping a stopped one is a no-op.
# As root, mariadbd runs as root (--user=root), so DIR's permissions do not matter.
# The binary log is on, row-based with full row images (log-bin in DIR/mariadb, server-id 1,
# binlog_format=ROW, binlog_row_image=FULL), as binlog CDC needs; STRATA_TEST_MYSQL_BINLOG=0
# starts the server without it (to see CDC refuse such a server).
set -Eeuo pipefail

ME="mariadb.sh"
M_USER="strata_test"
M_TLS_USER="strata_tls"
M_CERT_USER="strata_cert"
M_PASSWORD="strata_test_pw"
M_DATABASE="strata_test"
M_HOST="127.0.0.1"
START_TIMEOUT="${STRATA_MYSQL_START_TIMEOUT:-90}"
INSTALL_LOCK="/var/lock/strata-mariadb-install.lock"
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

LOG=""  # set once DIR is known; fail() shows its tail
USAGE_LINES="2,8"
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

first_cmd() {
  local c
  for c in "$@"; do
    if command -v "$c" >/dev/null 2>&1; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

find_server() {
  SERVER="$(first_cmd mariadbd mysqld)" || return 1
}

# Install mariadb-server from the distribution's packages. Runs under $INSTALL_LOCK.
install_server() {
  if find_server; then
    return 0 # a parallel run installed it while we waited for the lock
  fi
  command -v apt-get >/dev/null 2>&1 ||
    fail "MariaDB is not installed and there is no apt-get; install mariadb-server (mariadbd) yourself"
  local t0 apt_log policy_created=""
  t0="$(date +%s)"
  apt_log="$(mktemp /tmp/strata-mariadb-apt.XXXXXX)"
  LOG="$apt_log"
  note "mariadbd/mysqld not found; installing mariadb-server with apt-get (Debian packages, ~30 s; log $apt_log)"
  # Keep the package from starting its own system-wide server on port 3306 (no-op where
  # there is systemd or a policy-rc.d already).
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# temporary, written by strata scripts/services/mariadb.sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    policy_created=1
  fi
  local apt_opts=(-y -q --no-install-recommends -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=600
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
  local ok=""
  if DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" mariadb-server >"$apt_log" 2>&1; then
    ok=1
  else
    note "apt-get install failed; running apt-get update and trying again"
    if DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$apt_log" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" mariadb-server >>"$apt_log" 2>&1; then
      ok=1
    fi
  fi
  if [ -n "$policy_created" ]; then rm -f /usr/sbin/policy-rc.d; fi
  [ -n "$ok" ] || fail "apt-get install mariadb-server failed (full log: $apt_log)"
  find_server || fail "mariadb-server installed but neither mariadbd nor mysqld is on PATH"
  rm -f "$apt_log"
  LOG=""
  note "installed $("$SERVER" --version | head -n 1) in $(($(date +%s) - t0)) s"
}

ensure_installed() {
  if find_server; then return 0; fi
  [ "$(id -u)" -eq 0 ] ||
    fail "MariaDB is not installed (no mariadbd/mysqld on PATH) and only root can install it; run: sudo apt-get install -y mariadb-server"
  if command -v flock >/dev/null 2>&1; then
    # Serialise parallel runs: the second waits and then finds the server installed.
    flock -w 1200 "$INSTALL_LOCK" "$BASH" "$0" __install "$DIR" ||
      fail "installing mariadb-server failed (see above)"
  else
    install_server
  fi
  find_server || fail "mariadb-server is still not installed"
}

find_tools() {
  INSTALL_DB="$(first_cmd mariadb-install-db mysql_install_db)" || fail "mariadb-install-db not found"
  CLIENT="$(first_cmd mariadb mysql)" || fail "the mariadb client not found (package mariadb-client)"
  ADMIN="$(first_cmd mariadb-admin mysqladmin)" || fail "mariadb-admin not found (package mariadb-client)"
  USER_ARGS=()
  if [ "$(id -u)" -eq 0 ]; then USER_ARGS=(--user=root); fi
}

pid_alive() {
  local pid="$1"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
    grep -q -E 'mariadbd|mysqld' "/proc/$pid/cmdline" 2>/dev/null
}

server_pid() { cat "$PIDF" 2>/dev/null || true; }

root_sql() {
  "$CLIENT" --no-defaults --protocol=socket --socket="$SOCK" -uroot --connect-timeout=5 "$@"
}

tcp_sql() {
  MYSQL_PWD="$M_PASSWORD" "$CLIENT" --no-defaults --protocol=tcp -h "$M_HOST" -P "$PORT" \
    -u "$M_USER" --connect-timeout=5 "$@"
}

facts() {
  cat <<EOF
export STRATA_TEST_MYSQL_HOST=$M_HOST
export STRATA_TEST_MYSQL_PORT=$PORT
export STRATA_TEST_MYSQL_USER=$M_USER
export STRATA_TEST_MYSQL_PASSWORD=$M_PASSWORD
export STRATA_TEST_MYSQL_DATABASE=$M_DATABASE
export STRATA_TEST_MYSQL_SOCKET=$SOCK
export STRATA_TEST_MYSQL_URL=mysql://$M_USER:$M_PASSWORD@$M_HOST:$PORT/$M_DATABASE
export STRATA_TEST_MYSQL_TLS_USER=$M_TLS_USER
export STRATA_TEST_MYSQL_SSL_CA=$TLS/ca.crt
export STRATA_TEST_MYSQL_OTHER_CA=$TLS/other-ca.crt
export STRATA_TEST_MYSQL_CERT_USER=$M_CERT_USER
export STRATA_TEST_MYSQL_SSL_CERT=$TLS/client.crt
export STRATA_TEST_MYSQL_SSL_KEY=$TLS/client.key
EOF
}

emit_facts() {
  facts >"$ENV_FILE.tmp.$$"
  mv -f "$ENV_FILE.tmp.$$" "$ENV_FILE"
  cat "$ENV_FILE"
}

write_cnf() {
  local binlog="skip-log-bin"
  if [ "${STRATA_TEST_MYSQL_BINLOG:-1}" = 1 ]; then
    binlog="log-bin=$MROOT/binlog
server-id=1
binlog-format=ROW
binlog-row-image=FULL"
  fi
  cat >"$CNF" <<EOF
# Written by scripts/services/mariadb.sh on each start; edits are lost.
[client]
socket=$SOCK
port=$PORT

[mysqld]
datadir=$DATA
socket=$SOCK
pid-file=$PIDF
log-error=$LOG
# Own temporary directory: nothing shared with other servers (or /tmp cleaners).
tmpdir=$MROOT/tmp
port=$PORT
bind-address=$M_HOST
skip-networking=0
skip-name-resolve
# TLS with the test CA's certificate for localhost (MariaDB 10.11 makes none of its own).
ssl-ca=$TLS/ca.crt
ssl-cert=$TLS/server.crt
ssl-key=$TLS/server.key
$binlog
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
default-time-zone=+00:00
max_connections=200
performance_schema=OFF
# Speed over durability: a test server is thrown away.
innodb_buffer_pool_size=64M
innodb_log_file_size=48M
innodb_flush_log_at_trx_commit=0
innodb_doublewrite=0
sync_binlog=0
# No native AIO: io_setup() fails when many servers share a CI machine.
innodb_use_native_aio=0
EOF
}

init_datadir() {
  if [ -e "$DATA" ] && [ -n "$(ls -A "$DATA" 2>/dev/null)" ]; then
    fail "$DATA exists but holds no MariaDB data directory (no mysql/ folder); remove it or use another DIR"
  fi
  note "mariadb-install-db: new datadir in $DATA ($("$SERVER" --version | head -n 1))"
  mkdir -p "$DATA" "$MROOT/tmp"
  write_cnf
  if ! (cd / && "$INSTALL_DB" --defaults-file="$CNF" "${USER_ARGS[@]}" \
    --auth-root-authentication-method=normal --skip-test-db --skip-name-resolve \
    >"$MROOT/install-db.log" 2>&1); then
    LOG="$MROOT/install-db.log"
    fail "mariadb-install-db failed"
  fi
}

# Start mariadbd detached (own session, stdio away from the caller) and wait until root can
# talk to it over the socket. Returns 3 if the port turned out to be taken.
launch() {
  local before pid i p
  before=0
  [ -f "$LOG" ] && before="$(stat -c %s "$LOG")"
  rm -f "$PIDF"
  (cd / && exec setsid "$SERVER" --defaults-file="$CNF" "${USER_ARGS[@]}" </dev/null >>"$LOG" 2>&1) &
  pid=$!
  for i in $(seq 1 $((START_TIMEOUT * 5))); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null || true
      p="$(server_pid)"
      if pid_alive "$p"; then pid="$p"; continue; fi # setsid forked: follow the pid file
      if tail -c +"$((before + 1))" "$LOG" 2>/dev/null | grep -E 'Address already in use|Bind on TCP/IP port' >/dev/null; then
        return 3
      fi
      fail "mariadbd exited during startup (log: $LOG)"
    fi
    if "$ADMIN" --no-defaults --protocol=socket --socket="$SOCK" -uroot --connect-timeout=2 ping >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  note "mariadbd did not answer within $START_TIMEOUT s; killing it"
  kill -TERM "$pid" 2>/dev/null || true
  sleep 2
  kill -KILL "$pid" 2>/dev/null || true
  fail "MariaDB did not start within $START_TIMEOUT s (log: $LOG)"
}

# --- commands --------------------------------------------------------------------------------

do_start() {
  mkdir -p "$DIR"
  DIR="$(cd "$DIR" && pwd -P)"
  set_paths
  ensure_installed
  find_tools

  if pid_alive "$(server_pid)"; then
    PORT="$(cat "$PORTF" 2>/dev/null)" || fail "a server runs on $DATA but $PORTF is missing"
    tcp_sql -e 'SELECT 1' "$M_DATABASE" >/dev/null 2>&1 ||
      fail "a server runs on $DATA (pid $(server_pid)) but $M_USER cannot log in on $M_HOST:$PORT"
    note "already running on $M_HOST:$PORT"
    emit_facts
    return 0
  fi

  mkdir -p "$MROOT/tmp"
  make_test_certs "$TLS"
  PORT="$(cat "$PORTF" 2>/dev/null || true)"
  if [ -z "$PORT" ] || ! port_free "$PORT"; then
    PORT="$(free_port)" || fail "could not find a free TCP port"
  fi
  [ -d "$DATA/mysql" ] || init_datadir

  local attempt rc started=""
  for attempt in 1 2 3 4 5; do
    write_cnf
    rc=0
    launch || rc=$?
    if [ "$rc" -eq 0 ]; then
      started=1
      break
    fi
    note "port $PORT was taken before the server could bind it; trying another (attempt $attempt)"
    PORT="$(free_port)" || fail "could not find a free TCP port"
  done
  [ -n "$started" ] || fail "MariaDB did not start (data: $DATA, log: $LOG)"
  printf '%s\n' "$PORT" >"$PORTF"

  # root keeps only root@localhost (the socket in DIR): mariadb-install-db also made
  # password-less root@127.0.0.1, root@::1 and root@<hostname>.
  root_sql <<EOF || fail "could not create the database and user"
DELETE FROM mysql.global_priv WHERE User = 'root' AND Host <> 'localhost';
DELETE FROM mysql.proxies_priv WHERE Host <> 'localhost';
FLUSH PRIVILEGES;
CREATE DATABASE IF NOT EXISTS \`$M_DATABASE\` CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS '$M_USER'@'%' IDENTIFIED BY '$M_PASSWORD';
CREATE USER IF NOT EXISTS '$M_USER'@'127.0.0.1' IDENTIFIED BY '$M_PASSWORD';
CREATE USER IF NOT EXISTS '$M_USER'@'localhost' IDENTIFIED BY '$M_PASSWORD';
GRANT ALL PRIVILEGES ON *.* TO '$M_USER'@'%' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$M_USER'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$M_USER'@'localhost' WITH GRANT OPTION;
CREATE USER IF NOT EXISTS '$M_TLS_USER'@'%' IDENTIFIED BY '$M_PASSWORD' REQUIRE SSL;
CREATE USER IF NOT EXISTS '$M_TLS_USER'@'127.0.0.1' IDENTIFIED BY '$M_PASSWORD' REQUIRE SSL;
GRANT ALL PRIVILEGES ON *.* TO '$M_TLS_USER'@'%' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$M_TLS_USER'@'127.0.0.1' WITH GRANT OPTION;
CREATE USER IF NOT EXISTS '$M_CERT_USER'@'%' IDENTIFIED BY '$M_PASSWORD' REQUIRE X509;
CREATE USER IF NOT EXISTS '$M_CERT_USER'@'127.0.0.1' IDENTIFIED BY '$M_PASSWORD' REQUIRE X509;
GRANT ALL PRIVILEGES ON *.* TO '$M_CERT_USER'@'%' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$M_CERT_USER'@'127.0.0.1' WITH GRANT OPTION;
EOF
  [ "$(root_sql -N -e 'SELECT @@have_ssl' </dev/null)" = YES ] || fail "MariaDB started without TLS (have_ssl is not YES)"
  tcp_sql -e 'SELECT 1' "$M_DATABASE" >/dev/null ||
    fail "server started but $M_USER cannot log in over TCP on $M_HOST:$PORT"
  note "MariaDB ready on $M_HOST:$PORT (data $DATA, log $LOG)"
  emit_facts
}

do_stop() {
  if [ ! -d "$DIR" ]; then
    note "$DIR does not exist; nothing to stop"
    return 0
  fi
  DIR="$(cd "$DIR" && pwd -P)"
  set_paths
  rm -f "$ENV_FILE"
  local pid i
  pid="$(server_pid)"
  if ! pid_alive "$pid"; then
    note "not running ($DATA)"
    return 0
  fi
  ADMIN="$(first_cmd mariadb-admin mysqladmin || true)"
  if [ -n "$ADMIN" ]; then
    "$ADMIN" --no-defaults --protocol=socket --socket="$SOCK" -uroot --connect-timeout=5 \
      shutdown >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
  else
    kill -TERM "$pid" 2>/dev/null || true
  fi
  for i in $(seq 1 300); do
    pid_alive "$pid" || break
    if [ "$i" -eq 150 ]; then
      note "mariadbd $pid still running after 30 s; sending SIGTERM"
      kill -TERM "$pid" 2>/dev/null || true
    fi
    sleep 0.2
  done
  if pid_alive "$pid"; then
    note "mariadbd $pid did not stop; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$PIDF"
  note "stopped ($DATA)"
}

do_status() {
  [ -d "$DIR" ] || { note "$DIR does not exist"; trap - ERR; exit 1; }
  DIR="$(cd "$DIR" && pwd -P)"
  set_paths
  if pid_alive "$(server_pid)" && PORT="$(cat "$PORTF" 2>/dev/null)"; then
    facts
    return 0
  fi
  note "not running ($DATA)"
  trap - ERR
  exit 1
}

set_paths() {
  MROOT="$DIR/mariadb"
  DATA="$MROOT/data"
  SOCK="$MROOT/mysqld.sock"
  PIDF="$MROOT/mariadbd.pid"
  CNF="$MROOT/my.cnf"
  PORTF="$MROOT/port"
  LOG="$MROOT/mariadb.log"
  TLS="$MROOT/tls"
  ENV_FILE="$DIR/mariadb.env"
  # A unix socket path must fit in sun_path (107 bytes).
  [ "${#SOCK}" -le 100 ] ||
    fail "DIR is too long for a unix socket path ($SOCK is ${#SOCK} bytes, at most 100); use a shorter DIR"
}

[ $# -eq 2 ] || usage
CMD="$1"
DIR="$2"
[ -n "$DIR" ] || usage
case "$CMD" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  __install) install_server ;; # internal: run by ensure_installed under the install lock
  *) usage ;;
esac
