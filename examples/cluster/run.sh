#!/usr/bin/env bash
# A backfill on a local Ballista cluster: starts a strata cluster scheduler and two executors
# (scripts/services/cluster.sh, loopback ports), generates change events, runs the pipeline
# with --cluster (the history's first load runs on the executors, the commits here), checks
# the history with `strata validate`, compares it with a run without the cluster, then does
# the same for a later delivery (a batch folded on the executors with the stored events of
# its keys), and stops the processes.
#
#   examples/cluster/run.sh [EVENTS]     (default 1000000 events over 100000 keys)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}"
(cd "$root" && cargo build -p strata-cli --bin strata --locked --quiet)
export STRATA_BIN="$CARGO_TARGET_DIR/debug/strata"
strata="$STRATA_BIN"
events="${1:-1000000}"

work="$(mktemp -d)"
cleanup() { "$root/scripts/services/cluster.sh" stop "$work" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

mkdir -p "$work/project"
cp "$here/pipeline.sql" "$work/project/"
echo "== generating $events change events"
python3 "$here/gen_events.py" "$work/project/data/events" --events "$events" --keys $((events / 10 > 0 ? events / 10 : 1))

echo "== starting a scheduler and two executors"
eval "$("$root/scripts/services/cluster.sh" start "$work")"
echo "cluster at $STRATA_TEST_CLUSTER_URL"

cd "$work/project"
echo "\$ strata run pipeline.sql --cluster $STRATA_TEST_CLUSTER_URL --cluster-min-events 1"
out="$("$strata" run pipeline.sql --warehouse "$work/on_cluster" \
  --cluster "$STRATA_TEST_CLUSTER_URL" --cluster-min-events 1 2>&1)"
echo "$out"
if ! grep -q "bulk load on the cluster" <<<"$out"; then
  echo "run.sh: the first load did not run on the cluster" >&2
  exit 1
fi
echo "\$ strata validate customers_history   (its last line)"
"$strata" validate --warehouse "$work/on_cluster" customers_history | tail -1

echo "== the same without the cluster, to compare"
"$strata" run pipeline.sql --warehouse "$work/local" > /dev/null 2>&1
compare() {
  local rows="SELECT id, city, tier, __START_AT, __END_AT FROM customers_history ORDER BY id, __START_AT"
  local a b versions
  a="$("$strata" query --warehouse "$work/on_cluster" --format csv "$rows" | sha256sum | cut -c1-16)"
  b="$("$strata" query --warehouse "$work/local" --format csv "$rows" | sha256sum | cut -c1-16)"
  versions="$("$strata" query --warehouse "$work/local" --format csv "SELECT count(*) AS n FROM customers_history" | tail -1)"
  echo "$versions versions; sha256 of the ordered history: on the cluster $a, locally $b"
  if [ "$a" != "$b" ]; then
    echo "run.sh: the cluster's history differs from the local one" >&2
    exit 1
  fi
}
compare

later=$((events / 10 > 0 ? events / 10 : 1))
echo "== a later delivery of $later events (late ones among them): a batch on the cluster"
python3 "$here/gen_events.py" data/events --events "$later" --keys $((events / 10 > 0 ? events / 10 : 1)) \
  --files 1 --seed 11 --prefix later- --seq-from "$events"
echo "\$ strata run pipeline.sql --cluster $STRATA_TEST_CLUSTER_URL --cluster-min-events 1"
out="$("$strata" run pipeline.sql --warehouse "$work/on_cluster" \
  --cluster "$STRATA_TEST_CLUSTER_URL" --cluster-min-events 1 2>&1)"
echo "$out"
if ! grep -q "batch on the cluster" <<<"$out"; then
  echo "run.sh: the later batch did not run on the cluster" >&2
  exit 1
fi
"$strata" run pipeline.sql --warehouse "$work/local" > /dev/null 2>&1
compare
echo "== equal; stopping the cluster"
