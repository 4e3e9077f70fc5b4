#!/usr/bin/env python3
"""Two independent AUTO CDC flows in one pipeline against one: do datasets the scheduler
runs side by side stall each other?

Each flow reads its own folder of CSV change events (N keys, then an update of every key),
into its own SCD2 target. The second run (the updates: fold, comparison with the target,
rewrite) is timed for a pipeline with flow A alone and for one with A and B. With the CPU
work off the async scheduler, two flows on two cores take less than twice one flow.

    python3 benchmarks/two_flows.py --strata target/release/strata [--rows 300000] [--rounds 3]

Prints the median second-run time of each pipeline and their ratio.
"""
import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

SQL = """CREATE OR REFRESH STREAMING TABLE {n}_cdc AS SELECT * FROM STREAM read_files('{n}',
  format => 'csv', header => true, schema => 'id BIGINT, name STRING, city STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE {n}_dim;
CREATE FLOW {n}_flow AS AUTO CDC INTO {n}_dim FROM STREAM({n}_cdc) KEYS (id)
SEQUENCE BY seq COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;
"""


def write_batch(folder: Path, name: str, rows: int, seq: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "w") as f:
        f.write("id,name,city,seq\n")
        for i in range(rows):
            f.write(f"{i},n{i % 977}_{seq},c{i % 31},{seq}\n")


def second_run(strata: str, root: Path, flows: list[str], rows: int) -> float:
    work = Path(tempfile.mkdtemp(dir=root))
    (work / "p.sql").write_text("".join(SQL.format(n=n) for n in flows))
    for n in flows:
        write_batch(work / n, "001.csv", rows, 1)
    run = [strata, "run", "p.sql", "--warehouse", "wh"]
    subprocess.run(run, cwd=work, check=True, capture_output=True)
    for n in flows:
        write_batch(work / n, "002.csv", rows, 2)
    start = time.monotonic()
    subprocess.run(run, cwd=work, check=True, capture_output=True)
    took = time.monotonic() - start
    shutil.rmtree(work)
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="two_flows."))
    one, two = [], []
    for _ in range(a.rounds):
        one.append(second_run(a.strata, root, ["a"], a.rows))
        two.append(second_run(a.strata, root, ["a", "b"], a.rows))
    m1, m2 = statistics.median(one), statistics.median(two)
    print(f"{a.rows:,} keys per flow, second run (an update of every key), median of {a.rounds}:")
    print(f"  one flow  {m1:6.2f} s   ({', '.join(f'{t:.2f}' for t in one)})")
    print(f"  two flows {m2:6.2f} s   ({', '.join(f'{t:.2f}' for t in two)})")
    print(f"  ratio two/one: {m2 / m1:.2f} (2.00: the flows ran one after the other)")
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
