#!/usr/bin/env python3
"""The same pipeline with its warehouse on local disk and on an S3-compatible server.

Workload: JSON change events (upserts, some deletes, some late) over K keys, ingested by
read_files into a streaming table and applied by AUTO CDC into an SCD2 target, plus a
materialized view; a bulk run over F files, then B incremental runs of one small file each.
The warehouse is a temp folder, then a prefix on moto (scripts/services/s3.sh, started and
stopped here on a free port). Reported: wall time of the bulk run and of each incremental
run on both, their ratio (object storage over local disk), and the requests the S3 server
received per incremental run (counted from its request log), which should not grow with
the table's age. Both warehouses must end with the same rows (compared; exit 1 if not).

    python3 benchmarks/objstore_bench.py --strata target/release/strata [--small] [--batches N]

Needs python3 and PyPI (moto's venv is made by s3.sh); nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
S3_SH = ROOT / "scripts" / "services" / "s3.sh"

PIPELINE = """
CREATE OR REFRESH STREAMING TABLE events_raw
AS SELECT * FROM STREAM read_files('data', format => 'json',
  schema => 'id BIGINT, name STRING, city STRING, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE people;
CREATE FLOW people_flow AS AUTO CDC INTO people FROM STREAM(events_raw)
KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2;
CREATE OR REFRESH MATERIALIZED VIEW cities AS
SELECT city, count(*) AS n FROM people WHERE __END_AT IS NULL GROUP BY city;
"""


def write_file(path: Path, rng: random.Random, keys: int, rows: int, seq0: int) -> int:
    lines = []
    for i in range(rows):
        seq = seq0 + i
        if rng.random() < 0.05:
            seq = max(0, seq - rng.randrange(1000))  # late
        seq = seq * 1_000_000 + (seq0 + i) % 1_000_000  # unique per key
        op = "D" if rng.random() < 0.05 else "U"
        lines.append(json.dumps({"id": rng.randrange(keys), "name": f"n{rng.randrange(100)}",
                                 "city": f"c{rng.randrange(20)}", "op": op, "seq": seq}))
    path.write_text("\n".join(lines) + "\n")
    return seq0 + rows


def run(strata: str, project: Path, env: dict, *args: str) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run([strata, *args], cwd=project, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"strata {' '.join(args)} failed ({out.returncode}): {out.stderr}")
    return took, out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", required=True)
    ap.add_argument("--small", action="store_true", help="a quick run (the self-test's size)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--batches", type=int, help="incremental runs (default 10; --small: 3)")
    a = ap.parse_args()
    keys, files, rows, batches, batch_rows = (
        (500, 4, 2_000, 3, 200) if a.small else (50_000, 20, 50_000, 10, 5_000))
    batches = a.batches or batches
    work = Path(tempfile.mkdtemp(prefix="strata-objbench-"))
    svc = work / "svc"
    try:
        facts = subprocess.run([str(S3_SH), "start", str(svc)], capture_output=True, text=True)
        if facts.returncode != 0:
            sys.exit(f"s3.sh failed: {facts.stderr}")
        s3 = dict(line.removeprefix("export ").split("=", 1)
                  for line in facts.stdout.splitlines())
        base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        base.pop("STRATA_WAREHOUSE", None)
        envs = {
            "local": dict(base, STRATA_WAREHOUSE=str(work / "local" / "warehouse")),
            "s3": dict(base, STRATA_WAREHOUSE=f"s3://{s3['STRATA_TEST_S3_BUCKET']}/bench/wh",
                       AWS_ACCESS_KEY_ID=s3["STRATA_TEST_S3_ACCESS_KEY_ID"],
                       AWS_SECRET_ACCESS_KEY=s3["STRATA_TEST_S3_SECRET_ACCESS_KEY"],
                       AWS_REGION=s3["STRATA_TEST_S3_REGION"],
                       AWS_ENDPOINT_URL=s3["STRATA_TEST_S3_ENDPOINT"], AWS_ALLOW_HTTP="true"),
        }
        projects = {}
        for name in envs:
            p = work / name
            (p / "data").mkdir(parents=True)
            (p / "pipeline.sql").write_text(PIPELINE)
            projects[name] = p
        log = svc / "s3" / "moto.log"

        def requests() -> int:
            return sum(1 for line in log.read_text(errors="replace").splitlines()
                       if '" 2' in line or '" 3' in line or '" 4' in line)

        def deliver(fname: str, n: int, seed: int, seq0: int) -> int:
            for p in projects.values():
                end = write_file(p / "data" / fname, random.Random(seed), keys, n, seq0)
            return end

        seq = 0
        for f in range(files):
            seq = deliver(f"bulk_{f:03}.json", rows, f, seq)
        times: dict[str, list[float]] = {"local": [], "s3": []}
        reqs: list[int] = []
        spans: list[tuple[int, int]] = []  # each S3 batch's lines of the request log

        def log_lines() -> int:
            return len(log.read_text(errors="replace").splitlines())
        for step in range(batches + 1):
            if step > 0:
                seq = deliver(f"inc_{step:03}.json", batch_rows, 1000 + step, seq)
            for name, env in envs.items():
                before, first_line = requests(), log_lines()
                took, _ = run(a.strata, projects[name], env, "run", "pipeline.sql")
                times[name].append(took)
                if name == "s3" and step > 0:
                    reqs.append(requests() - before)
                    spans.append((first_line, log_lines()))
        for sql in ("SELECT * FROM people ORDER BY id, __START_AT", "SELECT * FROM cities ORDER BY city"):
            got = {n: run(a.strata, projects[n], e, "query", "--format", "csv", sql)[1]
                   for n, e in envs.items()}
            if got["local"] != got["s3"]:
                print(f"DIFFERENT rows on S3 and local disk: {sql}", file=sys.stderr)
                return 1
        inc_local = sum(times["local"][1:]) / batches
        inc_s3 = sum(times["s3"][1:]) / batches
        print(f"workload: {files} x {rows} events bulk, {batches} x {batch_rows} incremental, "
              f"{keys} keys (same rows on both: yes)")
        print(f"{'':12} {'local s':>9} {'s3 s':>9} {'s3/local':>9}")
        print(f"{'bulk':12} {times['local'][0]:9.2f} {times['s3'][0]:9.2f} "
              f"{times['s3'][0] / times['local'][0]:9.2f}")
        print(f"{'incremental':12} {inc_local:9.2f} {inc_s3:9.2f} {inc_s3 / inc_local:9.2f}"
              "   (mean per batch)")
        print(f"S3 requests per incremental batch, in order: {reqs}")
        if len(reqs) >= 8:
            half = len(reqs) // 2
            first, last = sorted(reqs[:half]), sorted(reqs[half:])
            print(f"median requests per batch: first {half} batches {first[len(first) // 2]}, "
                  f"last {len(last)} batches {last[len(last) // 2]}")
        if a.keep:
            (work / "batch_log_lines.json").write_text(json.dumps(spans))
            print(f"kept {work}: the request log is {log}, each batch's lines of it in "
                  f"{work / 'batch_log_lines.json'}")
        return 0
    finally:
        subprocess.run([str(S3_SH), "stop", str(svc)], capture_output=True)
        if not a.keep:
            subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    sys.exit(main())
