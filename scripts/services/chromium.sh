#!/usr/bin/env bash
# Makes sure a headless-capable Chromium is installed, for the web page's browser test
# (crates/strata-cli/tests/web.rs). Prints the browser's path.
#
#   scripts/services/chromium.sh ensure    # install Debian's chromium if missing (root)
#
# If neither `chromium` nor `chromium-browser` is on PATH, installs Debian's `chromium`
# package with apt-get (as root only; `apt-get update` only if the first attempt fails; a
# lock keeps parallel runs from installing twice).
set -euo pipefail
ME="chromium.sh"
INSTALL_LOCK="/var/lock/strata-chromium-install.lock"
LOG=""
USAGE_LINES="2,5"
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

find_browser() {
  BROWSER="$(command -v chromium || command -v chromium-browser)" || return 1
}

# Install Debian's chromium. Runs under $INSTALL_LOCK.
install_browser() {
  if find_browser; then
    return 0 # a parallel run installed it while we waited for the lock
  fi
  command -v apt-get >/dev/null 2>&1 ||
    fail "chromium is not installed and there is no apt-get; install chromium yourself"
  local t0 apt_log
  t0="$(date +%s)"
  apt_log="$(mktemp /tmp/strata-chromium-apt.XXXXXX)"
  LOG="$apt_log"
  note "chromium not found; installing Debian's chromium with apt-get (~1 min; log $apt_log)"
  local apt_opts=(-y -q --no-install-recommends -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=600)
  local ok=""
  if DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" chromium >"$apt_log" 2>&1; then
    ok=1
  else
    note "apt-get install failed; running apt-get update and trying again"
    if DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$apt_log" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" chromium >>"$apt_log" 2>&1; then
      ok=1
    fi
  fi
  [ -n "$ok" ] || fail "apt-get install chromium failed (full log: $apt_log)"
  find_browser || fail "chromium installed but not on PATH"
  rm -f "$apt_log"
  LOG=""
  note "installed $("$BROWSER" --version 2>/dev/null | head -n 1) in $(($(date +%s) - t0)) s"
}

ensure_installed() {
  if find_browser; then
    echo "$BROWSER"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] ||
    fail "chromium is not installed and only root can install it; run: sudo apt-get install -y chromium"
  if command -v flock >/dev/null 2>&1; then
    flock -w 1200 "$INSTALL_LOCK" "$BASH" "$0" __install ||
      fail "installing chromium failed (see above)"
  else
    install_browser
  fi
  find_browser || fail "chromium is still not installed"
  echo "$BROWSER"
}

case "${1:-}" in
  ensure) ensure_installed ;;
  __install) install_browser ;;
  *) usage ;;
esac
