#!/usr/bin/env bash
# Builds strata (the same debug build scripts/test.sh uses, so the two share one build) and
# runs the bundled example pipeline on a local warehouse, then shows the result.
#
#   examples/run.sh [WAREHOUSE_DIR]     (default /tmp/strata-users)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}"
cargo build --workspace --all-targets --locked --quiet
strata="$CARGO_TARGET_DIR/debug/strata"
warehouse="${1:-/tmp/strata-users}"
echo "\$ strata run examples/users/pipeline.sql --warehouse $warehouse"
"$strata" run examples/users/pipeline.sql --warehouse "$warehouse"
echo "\$ strata query --warehouse $warehouse \"SELECT * FROM users ORDER BY userId, __START_AT\""
"$strata" query --warehouse "$warehouse" "SELECT * FROM users ORDER BY userId, __START_AT"
echo "\$ strata validate --warehouse $warehouse users"
"$strata" validate --warehouse "$warehouse" users
