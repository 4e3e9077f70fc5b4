#!/usr/bin/env bash
# Runs everything CI runs: formatting, clippy with warnings denied, and every test (unit,
# golden scenarios on local disk, on S3 and on the Azure emulator, property tests, CLI tests
# on the real binary (warehouses on S3 and on the Azure emulator among them), the database
# sources against a real PostgreSQL and MariaDB, the web page in headless Chromium (Debian's
# package, installed when missing), the benchmark harness's own checks, the
# check that other Delta readers see what strata wrote on local disk and on S3, the Python
# package's pytest suite).
# One debug build serves all of them.
#
# The servers the tests need are started by this script itself, in a temp dir on free ports
# (scripts/services/with-services.sh: PostgreSQL from the image, MariaDB from Debian's
# packages, installed when missing, moto as an S3-compatible server for object-storage
# warehouses, from PyPI into scripts/services/s3/.venv, and Azurite as the Azure Storage
# emulator, from the npm registry into scripts/services/azurite/node_modules), and stopped
# when it ends.
#
# A persistent CARGO_TARGET_DIR outside the clone makes reruns on the same machine fast.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${STRATA_TEST_PG_URL:-}" ] || [ -z "${STRATA_TEST_MYSQL_URL:-}" ] ||
  [ -z "${STRATA_TEST_S3_ENDPOINT:-}" ] || [ -z "${STRATA_TEST_AZURE_BLOB_URL:-}" ]; then
  exec scripts/services/with-services.sh "$0" "$@"
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/strata-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Incremental compilation saves nothing on a clean CI clone and writes gigabytes of session
# caches beside the build; off unless asked for.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

# A full disk fails the build with a linker I/O error far from its cause; say how much room
# there is up front (a cold debug build and its test binaries take about 3 GiB).
mkdir -p "$CARGO_TARGET_DIR"
step "disk: $(df -h "$CARGO_TARGET_DIR" | awk 'NR==2 {print $4 " free"}') where $CARGO_TARGET_DIR is"

step "docs name only what exists (scripts/check_docs.py)"
python3 scripts/check_docs.py --self-test
python3 scripts/check_docs.py

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --locked -- -D warnings

# The web page's browser test (crates/strata-cli/tests/web.rs) loads the page in headless
# Chromium: Debian's package, installed here when missing (it fails without it, not skips).
step "chromium for the web page's browser test (scripts/services/chromium.sh)"
scripts/services/chromium.sh ensure

step "cargo test"
cargo test --workspace --locked

# The Python package's native module is the workspace's cdylib from this same debug build:
# `maturin develop` would run cargo on crates/strata-python alone, whose feature set differs
# (regex-automata, tracing-subscriber) and would rebuild DataFusion and deltalake a second time.
step "Python package: cargo build --workspace (the cdylib), then its pytest suite"
cargo build --workspace --locked
python3 python/tests/run.py

step "examples/postgres_shop (its own PostgreSQL, two runs, the history it keeps)"
examples/postgres_shop/run.sh > /dev/null

step "examples/cluster (a scheduler and two executors, a backfill on them, equal to a local run)"
examples/cluster/run.sh 100000 > /dev/null

if [ -x benchmarks/selftest.sh ]; then
  step "benchmark harness self-test (small workload, debug binary)"
  STRATA_BIN="$CARGO_TARGET_DIR/debug/strata" benchmarks/selftest.sh
fi

if [ -f tests/interop/check_readers.py ]; then
  step "Delta reader interop (deltalake, Polars, DuckDB read strata's tables; debug binary)"
  python3 tests/interop/check_readers.py --strata "$CARGO_TARGET_DIR/debug/strata"
  step "Delta reader interop on S3 (the same readers on the tables strata wrote to moto's bucket, every deletion vector in a deletion-vector file)"
  STRATA_DV_INLINE_MAX_BYTES=0 python3 tests/interop/check_readers.py --strata "$CARGO_TARGET_DIR/debug/strata" --s3
fi

step "done; $CARGO_TARGET_DIR holds $(du -sh "$CARGO_TARGET_DIR" | cut -f1)"
