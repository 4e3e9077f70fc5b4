#!/usr/bin/env python3
"""The bulk benchmark driven from Python (`strata.run`) against the CLI (`strata run`), on the
same workload in the same run.

    python3 benchmarks/python_run.py --lib LIB --strata BIN [--events 10000000 --keys 1000000
                                     --files 10] [--rounds 3]

LIB is the native module (`libstrata_python.so`) and BIN the binary of one build (for real
numbers both from `cargo build --release --workspace`). The workload is run.py's bulk one
(generated once by gen.py, reused while its parameters are unchanged). Each round builds
the SCD2 target on a fresh warehouse twice, back to back: with the CLI, then with
`strata.run("pipeline.sql", warehouse=...)` in a fresh Python process (interpreter start and
import included). It prints the median time of each, their ratio, peak RSS, and checks that
both targets hold the same rows (row, key, closed-row and distinct-name counts and column sums, through `strata query`).
`--small` is a correctness check (20k events) whose timings are not reported.
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

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
from _venv import ensure_venv  # noqa: E402

ensure_venv()
import run as bench  # noqa: E402

PY_RUN = ("import sys, strata\n"
          "strata.run(sys.argv[1], warehouse=sys.argv[2], progress=False)\n")

CHECK_SQL = ("SELECT count(*) AS n, count(DISTINCT id) AS keys, sum(amount) AS amount, "
             "count(__END_AT) AS closed, sum(CAST(__START_AT AS BIGINT)) AS starts, "
             "count(DISTINCT name) AS names FROM target")


def stage_package(lib: Path) -> Path:
    """The package's sources with `lib` as its native module, in a temp dir."""
    stage = Path(tempfile.mkdtemp(prefix="strata-pkg-"))
    shutil.copytree(ROOT / "python" / "strata", stage / "strata",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy2(lib, stage / "strata" / "_native.abi3.so")
    return stage


def content(strata: str, warehouse: Path) -> str:
    out = subprocess.run([strata, "query", "--warehouse", str(warehouse), "--format", "csv",
                          CHECK_SQL], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"strata query failed on {warehouse}: {out.stderr.strip()}")
    return out.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="libstrata_python.so of the same build")
    ap.add_argument("--strata", default=bench.default_strata(), help="strata binary")
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="20k events: a correctness check")
    ap.add_argument("--workdir", type=Path, default=BENCH_DIR / "data")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    a = ap.parse_args()
    if a.small:
        a.events, a.keys, a.files, a.rounds = 20_000, 2_000, 2, 1
    # What prepare_workload reads of run.py's options, at run.py's defaults.
    a.noop_share, a.delete_share, a.late_share, a.seed = 0.15, 0.05, 0.02, 42
    a.regenerate, a.threads, a.deletion_vectors = False, None, None
    a.workdir.mkdir(parents=True, exist_ok=True)
    wl, _ = bench.prepare_workload(f"bulk-e{a.events}-k{a.keys}-f{a.files}-s{a.seed}",
                                   a.workdir, a.events, a.keys, a.files, a)
    stage = stage_package(Path(a.lib))
    # bench.timed runs its commands in this process's environment.
    os.environ["PYTHONPATH"] = str(stage)
    logs = wl / "logs"
    logs.mkdir(exist_ok=True)
    pipeline = wl / "pipeline.sql"
    rounds = []
    try:
        for i in range(a.rounds):
            row = {}
            for side, cmd in (
                ("cli", [a.strata, "run", str(pipeline), "--warehouse", str(wl / "wh-cli")]),
                ("python", [sys.executable, "-c", PY_RUN, str(pipeline), str(wl / "wh-python")]),
            ):
                shutil.rmtree(wl / f"wh-{side}", ignore_errors=True)
                r = bench.timed(cmd, logs / f"py-{side}-{i}.stdout", logs / f"py-{side}-{i}.stderr")
                if r["rc"] != 0:
                    print(bench.tail(logs / f"py-{side}-{i}.stderr"))
                    raise SystemExit(f"{side} run failed (exit {r['rc']})")
                row[side] = r
            rounds.append(row)
        cli, py = content(a.strata, wl / "wh-cli"), content(a.strata, wl / "wh-python")
        if cli != py:
            print(f"MISMATCH: the CLI's target {cli!r}, Python's {py!r}")
            return 1
    finally:
        shutil.rmtree(stage)
    print(f"bulk: {a.events} events over {a.keys} keys in {a.files} files; both targets "
          f"hold the same rows ({cli.splitlines()[-1]})")
    if a.small:
        print("(--small: a correctness check; timings of such runs are not reported)")
        return 0
    med = {s: statistics.median(r[s]["seconds"] for r in rounds) for s in ("cli", "python")}
    rss = {s: max((r[s]["maxrss_kib"] or 0) for r in rounds) / 1024 for s in ("cli", "python")}
    for s in ("cli", "python"):
        each = ", ".join(f"{r[s]['seconds']:.2f}" for r in rounds)
        print(f"  {s:<7} median {med[s]:7.2f} s ({each})  peak RSS {rss[s]:7.0f} MiB")
    ratios = [r["python"]["seconds"] / r["cli"]["seconds"] for r in rounds]
    print(f"  python/cli: median of the rounds' ratios {statistics.median(ratios):.2f}x "
          f"({', '.join(f'{x:.2f}' for x in ratios)})")
    if a.json:
        a.json.write_text(json.dumps({"rounds": rounds, "median": med, "peak_mib": rss,
                                      "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
