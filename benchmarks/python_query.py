#!/usr/bin/env python3
"""strata.query of a large table into a pyarrow Table, against deltalake and Polars on the
same Delta table in the same run.

    python3 benchmarks/python_query.py --lib target/release/libstrata_python.so [--rows 10000000]

Builds (once per warehouse) a materialized view ``big`` of ``--rows`` rows (a BIGINT key,
a DOUBLE, a short STRING and a TIMESTAMP) with strata, then reads the whole table into
Arrow three ways, each in its own child process so that each peak RSS is its own:

  * strata     ``strata.query("SELECT * FROM big")`` (the engine's batches handed over
               through the Arrow C stream interface)
  * deltalake  ``DeltaTable(path).to_pyarrow_table()``
  * polars     ``polars.read_delta(path)`` (then ``.to_arrow()`` is not taken: Polars' own frame)

and prints, per reader, the median time over ``--repeat`` rounds, peak RSS, and the ratio
to strata. Runs in python/tests/.venv (the test suite's pins). ``--lib`` is the native
module to use (a release build for real numbers: ``cargo build --release --workspace``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
reader, wh, path = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
if reader == "strata":
    import strata
    n = strata.query("SELECT * FROM big", warehouse=wh).num_rows
elif reader == "deltalake":
    import deltalake
    n = deltalake.DeltaTable(path).to_pyarrow_table().num_rows
else:
    import polars
    n = polars.read_delta(path).height
secs = time.perf_counter() - t0
print(json.dumps({"rows": n, "secs": secs,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", required=True, help="libstrata_python.so to use")
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warehouse", help="reuse this warehouse (default: a temp dir)")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _venv

    _venv.ensure_venv(ROOT / "python" / "tests")
    stage = Path(tempfile.mkdtemp(prefix="strata-pkg-"))
    shutil.copytree(ROOT / "python" / "strata", stage / "strata",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy2(args.lib, stage / "strata" / "_native.abi3.so")
    env = dict(os.environ, PYTHONPATH=str(stage))
    wh = args.warehouse or tempfile.mkdtemp(prefix="strata-bench-wh-")
    table = Path(wh) / "default" / "big"
    if not table.exists():
        pipeline = Path(wh + "-pipeline.sql")
        pipeline.write_text(
            "CREATE OR REFRESH MATERIALIZED VIEW big AS SELECT value AS id, "
            "CAST(value AS DOUBLE) * 0.5 AS amount, concat('c', CAST(value % 1000 AS STRING)) "
            "AS city, to_timestamp(1700000000 + value) AS ts "
            f"FROM generate_series(1, {args.rows})")
        subprocess.check_call([sys.executable, "-c",
                               f"import strata; strata.run({str(pipeline)!r}, warehouse={wh!r})"],
                              env=env)
    results = {}
    for reader in ("strata", "deltalake", "polars"):
        runs = []
        for _ in range(args.repeat):
            out = subprocess.run([sys.executable, "-c", CHILD, reader, wh, str(table)],
                                 env=env, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{reader}: failed: {out.stderr.strip().splitlines()[-1:]}")
                break
            runs.append(json.loads(out.stdout))
        if runs:
            results[reader] = {"secs": statistics.median(r["secs"] for r in runs),
                               "peak_mib": max(r["peak_mib"] for r in runs),
                               "rows": runs[0]["rows"]}
    base = results.get("strata", {}).get("secs")
    print(f"{args.rows} rows, median of {args.repeat}, each reader in its own process")
    for reader, r in results.items():
        ratio = f"{r['secs'] / base:.2f}x strata" if base else ""
        print(f"  {reader:<10} {r['secs']:7.2f} s  peak {r['peak_mib']:7.0f} MiB  "
              f"{r['rows']} rows  {ratio}")
    shutil.rmtree(stage)
    if not args.warehouse:
        shutil.rmtree(wh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
