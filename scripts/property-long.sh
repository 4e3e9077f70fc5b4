#!/usr/bin/env bash
# The property tests at nightly length.
#
#   scripts/property-long.sh [SECONDS] [CASES]
#
# Runs crates/strata-engine/tests/property.rs twice, each property with a wall-clock budget of
# SECONDS (default 1800) and at most CASES cases (default 100000, i.e. the budget decides):
#
#   1. with STRATA_PARALLEL_MIN_ROWS=1: every fold, write and digest takes its parallel path
#      (the engine reads the variable once per process, so it is set for the whole binary);
#   2. with the default threshold (single-threaded paths; the child process that CI uses to
#      reach the parallel paths is skipped, pass 1 covered them).
#
# The two properties of a pass run side by side, so a pass takes about SECONDS (plus the last
# case and, on a failure, shrinking, which is capped at 10 minutes). Then strata-core's
# reference-model properties with 50x their default cases. A failure's seed is appended to
# crates/strata-engine/tests/property.regressions: commit that line (CI then replays it).
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${1:-1800}"
CASES="${2:-100000}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step() { printf '\n==> %s\n' "$*"; }

cargo test -p strata-engine --test property --locked --no-run

step "pass 1: STRATA_PARALLEL_MIN_ROWS=1, ${SECS}s and at most ${CASES} cases per property"
STRATA_PARALLEL_MIN_ROWS=1 PROPTEST_CASES="$CASES" STRATA_PROPERTY_SECS="$SECS" \
  cargo test -p strata-engine --test property --locked -- --nocapture

step "pass 2: default parallel threshold, ${SECS}s and at most ${CASES} cases per property"
PROPTEST_CASES="$CASES" STRATA_PROPERTY_SECS="$SECS" \
  cargo test -p strata-engine --test property --locked -- --nocapture \
  --skip parallel_paths_equal_the_reference

step "strata-core: reference model and generic fold, 12800 cases each"
PROPTEST_CASES=12800 cargo test -p strata-core --locked

step "done"
