#!/usr/bin/env bash
# Builds the strata binary (the debug build scripts/test.sh uses, so the test command
# afterwards reuses it and only adds the test binaries) and runs the bundled example
# pipeline on a local warehouse, then shows the result.
#
#   examples/run.sh [WAREHOUSE_DIR]     (default /tmp/strata-users)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}"
strata="$CARGO_TARGET_DIR/debug/strata"
if [ ! -x "$strata" ]; then
  echo "building strata (the CLI only, about 10 minutes on a fresh 2-core machine, seconds" \
    "once built; $CARGO_TARGET_DIR keeps the build)" >&2
fi
# Only the binary: the test binaries, the Python module and the fuzz targets are left to
# scripts/test.sh. Same profile and features as the workspace build, so nothing is built twice.
cargo build -p strata-cli --bin strata --locked --quiet
warehouse="${1:-/tmp/strata-users}"
echo "\$ strata run examples/users/pipeline.sql --warehouse $warehouse"
"$strata" run examples/users/pipeline.sql --warehouse "$warehouse"
echo "\$ strata query --warehouse $warehouse \"SELECT * FROM users ORDER BY userId, __START_AT\""
"$strata" query --warehouse "$warehouse" "SELECT * FROM users ORDER BY userId, __START_AT"
echo "\$ strata validate --warehouse $warehouse users"
"$strata" validate --warehouse "$warehouse" users
