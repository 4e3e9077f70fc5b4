#!/usr/bin/env bash
# The benchmark harness checking itself and strata at a small size (part of scripts/test.sh):
# 1. DuckDB's SQL formulation of the SCD2 fold against a pure-Python fold, and DuckDB's
#    snapshot diff-and-apply against a pure-Python diff;
# 2. `run.py --small`: strata and DuckDB on the same generated workloads (updates, no-ops,
#    deletes, re-inserts, late events, an incremental batch; and a 20k-row snapshot followed by
#    its successor with 1% of keys changed, removed or new, through AUTO CDC FROM SNAPSHOT);
#    exits non-zero unless both give the same rows; then the incremental and snapshot
#    workloads again with deletion vectors enabled on strata's target;
# 3. `pit_bench.py --small`: a point-in-time table over 2k keys and 365 days against DuckDB's
#    ASOF JOIN, and fact joins (range, PIT, ASOF), all compared.
# Timings of a debug build mean nothing and are not reported anywhere.
# Needs python3 and PyPI (the scripts create benchmarks/.venv themselves).
set -euo pipefail
cd "$(dirname "$0")"
: "${STRATA_BIN:?set STRATA_BIN to the strata binary}"
python3 test_duckdb_formulation.py
python3 test_bench_helpers.py  # serve_bench.py and mview_bench.py: percentiles, parsing, as_of in DuckDB
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 run.py --small --strata "$STRATA_BIN" --workdir "$work" --json "$work/results.json"
# The same with deletion vectors on strata's target: three batches, each compared.
python3 run.py incremental --small --deletion-vectors --batches 3 --check-every-batch \
  --strata "$STRATA_BIN" --workdir "$work/dv" --json "$work/dv-incremental.json"
python3 run.py snapshot --small --deletion-vectors \
  --strata "$STRATA_BIN" --workdir "$work/dv" --json "$work/dv-snapshot.json"
python3 pit_bench.py --small --strata "$STRATA_BIN" --workdir "$work/pit"
# 4. `db_bench.py --small --check-only`: strata's database sources on a real PostgreSQL (the
#    STRATA_TEST_PG_* server of with-services.sh, else one it starts itself): a 50k-row
#    watermark load (and DuckDB's postgres extension copying the same table), then a 20k-row
#    CDC copy and 20k changes in one run into an SCD2 target; every value compared with the
#    source. Correctness only: no timings are printed.
python3 db_bench.py --small --check-only --strata "$STRATA_BIN" --workdir "$work/db" \
  --json "$work/db.json"
#    The same CDC workload from MariaDB's binlog (`--source mariadb`: the STRATA_TEST_MYSQL_*
#    server of with-services.sh, else one it starts itself with scripts/services/mariadb.sh):
#    a 20k-row copy and 20k changes in one run into an SCD2 target, every value compared with
#    the MariaDB table. Correctness only.
python3 db_bench.py cdc --source mariadb --small --check-only --strata "$STRATA_BIN" \
  --workdir "$work/db-mariadb" --json "$work/db-mariadb.json"
# 5. `objstore_bench.py --small`: the same pipeline with its warehouse on local disk and on
#    an S3-compatible server (moto, started on a free port by scripts/services/s3.sh); the
#    rows must be the same on both. Correctness only here: debug timings mean nothing.
python3 objstore_bench.py --small --strata "$STRATA_BIN" > /dev/null
# 6. `upkeep_bench.py --small`: an SCD2 target from 20k events and 5 incremental batches,
#    copied twice; `strata optimize target` on one copy, deltalake's optimize.compact() on the
#    other. Checks that each target holds the same rows before and after (row count and a hash
#    of every row, read by DuckDB's delta_scan; the scan aggregate of `strata query` equal to
#    DuckDB's), that one more batch then gives the same rows on both copies and on the
#    un-optimized one, `strata validate`, and that optimize's printed file counts match the
#    Delta logs. Correctness only: no timings are printed.
python3 upkeep_bench.py --small --strata "$STRATA_BIN" --workdir "$work/upkeep" \
  --json "$work/upkeep.json"
# 7. `python_run.py --small`: the bulk workload (20k events) run by the CLI and by
#    `strata.run()` from Python (the debug build's native module beside the binary); both
#    targets must hold the same rows. Correctness only: no timings are printed.
python3 python_run.py --small --strata "$STRATA_BIN" \
  --lib "$(dirname "$STRATA_BIN")/libstrata_python.so" --workdir "$work/pyrun"
# 8. `serve_bench.py --small`: an SCD2 target from 20k events served by `strata serve --pg`
#    to 16 psycopg clients (current-version and as_of lookups, prepared) for 5 s while
#    `strata run --continuous` commits a batch fed every second, then DuckDB's delta_scan
#    with 16 cursors on the same table. Checks: no client error on either side, every answer
#    one version of the key asked for, the final target equal to DuckDB's fold of every file
#    (and `strata validate`), the bronze table holding every event once, and 100 lookups
#    giving the same rows through the server, delta_scan and the fold. No timings printed.
python3 serve_bench.py --small --strata "$STRATA_BIN" --workdir "$work/serve" \
  --json "$work/serve.json"
# 9. `mview_bench.py --small`: three materialized views (a filter and a count/sum/min/max
#    GROUP BY over the bronze table, an avg GROUP BY over the SCD2 target) after a 1% batch:
#    the run must refresh each incrementally, and its rows must equal a --full-refresh of the
#    view and DuckDB's query over delta_scan of the source. No timings printed.
python3 mview_bench.py --small --strata "$STRATA_BIN" --workdir "$work/mview" \
  --json "$work/mview.json"
# 10. `cluster_bench.py --small`: the bulk workload (200k events) run by `strata run` alone and
#     with `--cluster` on a scheduler and two `--slots 1` executors it starts (and stops) on
#     loopback ports; the run must say it loaded on the cluster and both SCD2 targets must
#     hold the same rows (DuckDB, EXCEPT ALL both ways); then a later batch of 20k events into
#     both (on the cluster for B: "batch on the cluster"), compared again. Correctness only: no
#     timings printed.
python3 cluster_bench.py --small --batch-events 20000 --strata "$STRATA_BIN" \
  --workdir "$work/cluster" --json "$work/cluster.json" > /dev/null
