#!/usr/bin/env bash
# Loads a small PostgreSQL shop into a bronze/silver/gold strata pipeline with SCD2
# dimensions, in one command: starts a throwaway PostgreSQL (scripts/services/postgres.sh,
# wal_level=logical, in a temp dir on a free port), creates the shop, runs the pipeline,
# changes the shop, runs it again, and shows the history it kept. Stops the server at the end.
#
#   examples/postgres_shop/run.sh [WAREHOUSE_DIR]     (default: a temp dir)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}"
(cd "$root" && cargo build --workspace --all-targets --locked --quiet)
strata="$CARGO_TARGET_DIR/debug/strata"

work="$(mktemp -d)"
warehouse="${1:-$work/warehouse}"
cleanup() { "$root/scripts/services/postgres.sh" stop "$work" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
eval "$("$root/scripts/services/postgres.sh" start "$work")"
psql() { command psql -X -q -v ON_ERROR_STOP=1 "$@"; }

# The password goes to strata through SHOP_PW only; libpq's own variable is not needed.
export SHOP_PW="$PGPASSWORD"
conf=(--conf "pg_host=$PGHOST" --conf "pg_port=$PGPORT" --conf "pg_database=$PGDATABASE" --conf "pg_user=$PGUSER")
run() { env -u PGPASSWORD "$strata" run "$here/pipeline.sql" --warehouse "$warehouse" "${conf[@]}"; }
query() { echo "\$ strata query \"$1\""; "$strata" query --warehouse "$warehouse" "$1"; }

psql -f "$here/schema.sql"
echo "== first run: the tables as they are (CDC sources copy them through their slot's snapshot)"
run
psql -f "$here/changes.sql"
echo "== second run: only what changed"
run
query "SELECT id, name, city, tier, __END_AT IS NULL AS current FROM dim_customers ORDER BY id, __START_AT"
query "SELECT sku, price, __END_AT IS NULL AS current FROM dim_products ORDER BY sku, __START_AT"
query "SELECT id, status FROM orders ORDER BY id"
query "SELECT * FROM revenue_by_tier ORDER BY tier"
"$strata" validate --warehouse "$warehouse" dim_customers
