#!/usr/bin/env bash
# What the service scripts share (postgres.sh, mariadb.sh, s3.sh, azurite.sh): messages on
# stderr, failing with the tail of the service's log, the usage text, free TCP ports, test TLS
# certificates.
#
# Sourced after the script sets ME (its name in messages) and USAGE_LINES (the lines of its
# header comment that `usage` prints, e.g. 2,8); LOG names the log whose tail a failure shows
# (empty until the script knows it).

LOG="${LOG:-}"

note() { printf '%s: %s\n' "$ME" "$*" >&2; }

show_log_tail() {
  if [ -n "$LOG" ] && [ -s "$LOG" ]; then
    printf '%s: last lines of %s:\n' "$ME" "$LOG" >&2
    tail -n "${1:-30}" "$LOG" | sed 's/^/    /' >&2
  fi
}

fail() {
  trap - ERR
  printf '%s: error: %s\n' "$ME" "$*" >&2
  show_log_tail 30
  exit 1
}

trap 'fail "unexpected failure at line $LINENO: $BASH_COMMAND"' ERR

usage() {
  sed -n "${USAGE_LINES}p" "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --- helpers ---------------------------------------------------------------------------------

# A TCP port on 127.0.0.1 that nothing is bound to right now. The server binds it moments
# later; if something else grabbed it in between, start() notices the bind error and retries.
free_port() {
  local py p i
  for py in python3 python; do
    if command -v "$py" >/dev/null 2>&1 &&
      "$py" -c 'import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()' 2>/dev/null; then
      return 0
    fi
  done
  for i in $(seq 1 500); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 30000))
    if port_free "$p"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# True if nothing listens on 127.0.0.1:$1 (bind test with python, else a connect probe).
port_free() {
  local py
  for py in python3 python; do
    if command -v "$py" >/dev/null 2>&1; then
      "$py" -c 'import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no obstacle
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
s.close()' "$1" 2>/dev/null
      return
    fi
  done
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Stops the process whose pid the file $1 holds (TERM, then KILL after 5 s) and removes the
# file; nothing to do when there is no such file.
stop_pidfile() {
  local file="$1" pid
  [ -f "$file" ] || return 0
  pid="$(cat "$file")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

# make_test_certs DIR: the TLS files the database services use, made once per DIR with openssl:
# a CA (ca.crt), a server certificate it signed (server.crt, server.key; EC P-256) for the
# name `localhost` only, a client certificate it signed for the user `strata_cert`
# (client.crt, client.key: CN=strata_cert, for the users the servers accept only with it),
# and an unrelated CA (other-ca.crt), for tests that must see a certificate refused. The name is deliberately not 127.0.0.1: a client that checks the host
# name accepts the server as `localhost` and refuses it as `127.0.0.1`.
make_test_certs() {
  local d="$1" ca
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  command -v openssl >/dev/null 2>&1 || fail "openssl is needed to make the test TLS certificates (apt-get install openssl)"
  [ -s "$d/server.crt" ] && [ -s "$d/other-ca.crt" ] && [ -s "$d/client.crt" ] && return 0
  mkdir -p "$d"
  for ca in ca other-ca; do
    openssl req -x509 "${ec[@]}" -days 3650 -subj "/CN=strata test $ca" \
      -keyout "$d/$ca.key" -out "$d/$ca.crt" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null ||
      fail "openssl could not make the test CA $d/$ca.crt"
  done
  openssl req "${ec[@]}" -subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null ||
    fail "openssl could not make the test server key"
  printf '%s\n' "subjectAltName=DNS:localhost" "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" >"$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -out "$d/server.crt" -extfile "$d/server.ext" 2>/dev/null ||
    fail "openssl could not sign the test server certificate"
  openssl req "${ec[@]}" -subj "/CN=strata_cert" -keyout "$d/client.key" -out "$d/client.csr" 2>/dev/null ||
    fail "openssl could not make the test client key"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=clientAuth" >"$d/client.ext"
  openssl x509 -req -in "$d/client.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -out "$d/client.crt" -extfile "$d/client.ext" 2>/dev/null ||
    fail "openssl could not sign the test client certificate"
  chmod 600 "$d/server.key" "$d/client.key" "$d/ca.key" "$d/other-ca.key"
  chmod 644 "$d/ca.crt" "$d/other-ca.crt" "$d/server.crt" "$d/client.crt"
}
