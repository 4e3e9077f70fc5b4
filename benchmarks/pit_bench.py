#!/usr/bin/env python3
"""Point-in-time benchmark: strata's POINT IN TIME TABLE against DuckDB's ASOF JOIN, and the
point-in-time join of facts to an SCD type 2 dimension.

    python3 benchmarks/pit_bench.py --strata /work/target/release/strata            # 100k keys, 365 days, 1M facts
    python3 benchmarks/pit_bench.py --strata /work/target/release/strata --small    # smoke test, seconds

Workload (generated with DuckDB into benchmarks/data/pit-.../data/, reused when the parameters
are unchanged):

* data/events/*.parquet: change events (id, name, city, amount, op, day DATE). Every key gets
  an initial upsert on day 0 (2024-01-01) and on average --changes more events on random days
  (at most one per key and day, so `day` orders a key's events); about 8% of the keys end with
  a delete and about 3% are deleted in the middle of their history and come back later. A few
  changes repeat the previous values (no-ops for the fold).
* data/facts/*.parquet: --facts rows (fact_id, id, day DATE, amount), id uniform over the keys,
  day uniform over the --days as-of days.

strata pipeline (pit_pipeline(), in the workload folder as pipeline.sql), built up over runs:

  run 1 "flow":   events -> AUTO CDC INTO dim ... SEQUENCE BY day STORED AS SCD TYPE 2
  run 2 "pit":    + CREATE OR REFRESH POINT IN TIME TABLE pit KEYS (id)
                      AS OF RANGE (DATE '2024-01-01', DATE '2024-12-30', INTERVAL 1 DAY) FROM dim
                  (the flow has nothing new, so this run is the PIT build; repeated --pit-repeat
                  times with the pit folder removed, best and median reported)
  run 3 "facts":  + a streaming table `facts` over data/facts
  run 4 "noop":   nothing new (PIT refresh finds nothing to do)

DuckDB (a separate process, same parquet input): the SCD2 table with benchmarks/duckdb_scd2.sql
(the same fold run.py checks strata against), then the PIT table as
`(spine x keys) ASOF JOIN dim ON id AND d >= __START_AT`, dropping rows past __END_AT (timed),
(--pit-repeat times, best and median), the same table as a plain range join of the spine to dim
for reference, then the fact joins (ASOF JOIN, plain range join and PIT equi-join, timed).

--spine query uses `AS OF (SELECT CAST(value AS DATE) AS d FROM generate_series(...))` instead:
DataFusion's generate_series over dates yields TIMESTAMP values, so the RANGE form makes as_of
a TIMESTAMP column (the DATE form keeps it a DATE).

Checks: strata's dim equals DuckDB's (multiset, via `strata query --format csv`); strata's PIT
table equals DuckDB's per as-of value (row count, sum of ids, sum of starts, sum of a
key*start hash), and at --small (or --full-compare) as a whole multiset; the fact joins give
the same count and sums on both engines and both formulations.

Fact joins timed with `strata query` (one process per query, so the time includes start-up
and opening the Delta tables; `SELECT count(*) FROM facts` is timed as the baseline):

  range:  facts f JOIN dim d ON d.id = f.id AND d.__START_AT <= f.day
                             AND (d.__END_AT IS NULL OR f.day < d.__END_AT)
  pit:    facts f JOIN pit p ON p.as_of = f.day AND p.id = f.id
                  JOIN dim d ON d.id = p.id AND d.__START_AT = p.dim_start
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from _venv import ensure_venv  # noqa: E402

SCD2_SQL = BENCH_DIR / "duckdb_scd2.sql"
START = dt.date(2024, 1, 1)
FAILURES: list[str] = []


def log(msg: str = "") -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- pipeline text

def pit_pipeline(stage: int, spine: str, start: dt.date, stop: dt.date) -> str:
    """Pipeline text for run STAGE (1: flow only, 2: + PIT table, 3: + facts)."""
    sql = """\
CREATE OR REFRESH STREAMING TABLE dim_events
AS SELECT * FROM STREAM read_files('data/events', format => 'parquet');
CREATE OR REFRESH STREAMING TABLE dim;
CREATE FLOW dim_flow AS AUTO CDC INTO dim
FROM STREAM(dim_events)
KEYS (id)
APPLY AS DELETE WHEN op = 'D'
SEQUENCE BY day
COLUMNS * EXCEPT (op, day)
STORED AS SCD TYPE 2;
"""
    if stage >= 2:
        if spine == "range":
            as_of = f"AS OF RANGE (DATE '{start}', DATE '{stop}', INTERVAL 1 DAY)"
        else:  # a DATE spine (RANGE over dates yields TIMESTAMPs in DataFusion)
            as_of = (f"AS OF (SELECT CAST(value AS DATE) AS d FROM generate_series("
                     f"DATE '{start}', DATE '{stop}', INTERVAL 1 DAY))")
        sql += f"""\
CREATE OR REFRESH POINT IN TIME TABLE pit
KEYS (id)
{as_of}
FROM dim;
"""
    if stage >= 3:
        sql += """\
CREATE OR REFRESH STREAMING TABLE facts
AS SELECT * FROM STREAM read_files('data/facts', format => 'parquet');
"""
    return sql


# --------------------------------------------------------------------------- SQL (both engines)

RANGE_JOIN = """\
SELECT count(*) AS n, sum(f.amount) AS s_fact, sum(d.amount) AS s_dim, {start_sum} AS s_start
FROM facts f JOIN dim d ON d.id = f.id AND d.__START_AT <= f.day
                        AND (d.__END_AT IS NULL OR f.day < d.__END_AT)"""
PIT_JOIN = """\
SELECT count(*) AS n, sum(f.amount) AS s_fact, sum(d.amount) AS s_dim, {start_sum} AS s_start
FROM facts f JOIN pit p ON p.as_of = f.day AND p.id = f.id
JOIN dim d ON d.id = p.id AND d.__START_AT = p.dim_start"""
ASOF_JOIN = """\
SELECT count(*) AS n, sum(f.amount) AS s_fact, sum(d.amount) AS s_dim, {start_sum} AS s_start
FROM facts f ASOF JOIN dim d ON d.id = f.id AND f.day >= d.__START_AT
WHERE d.__END_AT IS NULL OR f.day < d.__END_AT"""
STRATA_START_SUM = "sum(CAST(d.__START_AT AS BIGINT))"
DUCK_START_SUM = "sum(d.__START_AT - DATE '1970-01-01')"

# Per as-of value: rows, sum of ids, sum of starts (days since 1970) and a key*start hash.
STRATA_PIT_AGG = """\
SELECT CAST(CAST(as_of AS DATE) AS BIGINT) AS d, count(*) AS n, sum(id) AS s_id,
       sum(CAST(dim_start AS BIGINT)) AS s_start,
       sum((id * 100003 + CAST(dim_start AS BIGINT)) % 1000000007) AS h
FROM pit GROUP BY 1 ORDER BY 1"""
DUCK_PIT_AGG = """\
SELECT (as_of - DATE '1970-01-01')::BIGINT AS d, count(*) AS n, sum(id)::BIGINT AS s_id,
       sum(dim_start - DATE '1970-01-01')::BIGINT AS s_start,
       sum((id * 100003 + (dim_start - DATE '1970-01-01')) % 1000000007)::BIGINT AS h
FROM pit GROUP BY 1 ORDER BY 1"""


# --------------------------------------------------------------------------- generation

def generate(wl: Path, keys: int, days: int, changes: int, facts: int, files: int, seed: int) -> dict:
    """Events and facts as parquet, with DuckDB; deterministic (hash-based) for the parameters."""
    import duckdb

    t0 = time.perf_counter()
    ev_dir, f_dir = wl / "data" / "events", wl / "data" / "facts"
    for d in (ev_dir, f_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    con = duckdb.connect()
    s = int(seed)
    con.execute(f"""
CREATE TEMP TABLE ev AS
WITH k AS (SELECT range AS id FROM range(1, {keys} + 1)),
n AS (SELECT id, (hash(id, {s}, 'n') % {2 * changes + 1})::INT AS n FROM k),
ch AS (SELECT id, unnest(range(1, n + 1)) AS j FROM n WHERE n > 0),
raw AS (
    SELECT id, 0::BIGINT AS j, 0 AS dayoff FROM k
    UNION ALL
    SELECT id, j, (1 + hash(id, j, {s}, 'd') % {days})::INT AS dayoff FROM ch
),
dedup AS (
    SELECT * FROM raw QUALIFY row_number() OVER (PARTITION BY id, dayoff ORDER BY j) = 1
),
ord AS (
    SELECT *, row_number() OVER (PARTITION BY id ORDER BY dayoff) AS pos,
           count(*) OVER (PARTITION BY id) AS cnt
    FROM dedup
)
SELECT id::BIGINT AS id,
       CASE WHEN hash(id, j, {s}, 'nm') % 10 = 0 THEN 'cust-' || id || '-' || j
            ELSE 'cust-' || id END AS name,
       (['Berlin', 'Paris', 'Rome', 'Oslo'])[1 + (hash(id, j, {s}, 'c') % 4)::INT] AS city,
       (hash(id, j, {s}, 'a') % 50)::BIGINT AS amount,
       CASE WHEN (pos = cnt AND cnt > 1 AND hash(id, {s}, 'del') % 100 < 8)
              OR (pos = 2 AND cnt >= 4 AND hash(id, {s}, 'mid') % 100 < 3)
            THEN 'D' ELSE 'U' END AS op,
       DATE '{START}' + dayoff AS day
FROM ord
ORDER BY hash(id, dayoff, {s}, 'order')
""")
    for f in range(files):
        con.execute(f"COPY (SELECT * FROM ev WHERE id % {files} = {f}) TO "
                    f"'{ev_dir / f'part-{f:03d}.parquet'}' (FORMAT parquet)")
    con.execute(f"""
COPY (SELECT range::BIGINT AS fact_id,
             (1 + hash(range, {s}, 'k') % {keys})::BIGINT AS id,
             DATE '{START}' + (hash(range, {s}, 'd') % {days})::INT AS day,
             (hash(range, {s}, 'a') % 1000)::BIGINT AS amount
      FROM range({facts}))
TO '{f_dir / 'facts.parquet'}' (FORMAT parquet)""")
    st = dict(zip(
        ["events", "deletes", "keys"],
        con.execute("SELECT count(*), count(*) FILTER (op = 'D'), count(DISTINCT id) FROM ev").fetchone()))
    st["facts"] = facts
    st["generate_seconds"] = round(time.perf_counter() - t0, 2)
    return st


# --------------------------------------------------------------------------- DuckDB side

def _duckdb_child(spec_path: str) -> None:
    import duckdb

    spec = json.loads(Path(spec_path).read_text())
    con = duckdb.connect()
    if spec.get("threads"):
        con.execute(f"SET threads = {int(spec['threads'])}")
    out = {"duckdb_version": duckdb.__version__}

    def timed_sql(label, sql, fetch=False):
        t0 = time.perf_counter()
        r = con.execute(sql)
        res = r.fetchall() if fetch else None
        out[label + "_seconds"] = time.perf_counter() - t0
        return res

    ev = spec["events"]
    con.execute(f"CREATE VIEW events AS SELECT id, name, city, amount, op, day AS seq "
                f"FROM read_parquet('{ev}/*.parquet')")
    timed_sql("dim", f"CREATE TABLE dim AS {SCD2_SQL.read_text()}")
    out["dim_rows"] = con.execute("SELECT count(*) FROM dim").fetchone()[0]
    con.execute(f"COPY dim TO '{spec['dim_out']}' (FORMAT parquet)")

    # The PIT table: every (as-of day, key) pair, ASOF-joined to the latest version started on
    # or before the day; rows whose version ended on or before the day are dropped.
    pit_times = []
    for i in range(spec.get("pit_repeat", 1)):
        con.execute("DROP TABLE IF EXISTS pit")
        timed_sql("pit", f"""
CREATE TABLE pit AS
WITH spine AS (SELECT CAST(range AS DATE) AS as_of
               FROM range(DATE '{spec['start']}', DATE '{spec['stop']}' + INTERVAL 1 DAY, INTERVAL 1 DAY)),
     keys AS (SELECT DISTINCT id FROM dim),
     grid AS (SELECT as_of, id FROM spine CROSS JOIN keys)
SELECT g.as_of, g.id, d.__START_AT AS dim_start
FROM grid g ASOF JOIN dim d ON g.id = d.id AND g.as_of >= d.__START_AT
WHERE d.__END_AT IS NULL OR g.as_of < d.__END_AT""")
        pit_times.append(out["pit_seconds"])
    out["pit_seconds"], out["pit_all_seconds"] = min(pit_times), pit_times
    out["pit_median_seconds"] = statistics.median(pit_times)
    out["pit_rows"] = con.execute("SELECT count(*) FROM pit").fetchone()[0]
    # For reference: the same table as a plain range join of the spine to dim (one source, so
    # no key grid is needed: a key has at most one version valid at a time).
    # DuckDB plans it as an IEJoin; it is timed as often as the ASOF build.
    range_times = []
    for i in range(spec.get("pit_repeat", 1)):
        con.execute("DROP TABLE IF EXISTS pit_range")
        timed_sql("pit_range", f"""
CREATE TABLE pit_range AS
WITH spine AS (SELECT CAST(range AS DATE) AS as_of
               FROM range(DATE '{spec['start']}', DATE '{spec['stop']}' + INTERVAL 1 DAY, INTERVAL 1 DAY))
SELECT s.as_of, d.id, d.__START_AT AS dim_start
FROM spine s JOIN dim d ON d.__START_AT <= s.as_of AND s.as_of < coalesce(d.__END_AT, DATE '9999-12-31')""")
        range_times.append(out["pit_range_seconds"])
    out["pit_range_seconds"], out["pit_range_all_seconds"] = min(range_times), range_times
    out["pit_range_median_seconds"] = statistics.median(range_times)
    out["pit_range_diff"] = con.execute(
        "SELECT (SELECT count(*) FROM (SELECT * FROM pit EXCEPT ALL SELECT * FROM pit_range)) + "
        "(SELECT count(*) FROM (SELECT * FROM pit_range EXCEPT ALL SELECT * FROM pit))").fetchone()[0]
    con.execute("DROP TABLE pit_range")
    timed_sql("pit_copy", f"COPY pit TO '{spec['pit_out']}' (FORMAT parquet)")
    out["pit_agg"] = [list(r) for r in con.execute(DUCK_PIT_AGG).fetchall()]

    con.execute(f"CREATE TABLE facts AS SELECT * FROM read_parquet('{spec['facts']}/*.parquet')")
    for label, sql in (("asof_join", ASOF_JOIN), ("range_join", RANGE_JOIN), ("pit_join", PIT_JOIN)):
        best = None
        for _ in range(spec.get("repeat", 1)):
            res = timed_sql(label, sql.format(start_sum=DUCK_START_SUM), fetch=True)
            best = out[label + "_seconds"] if best is None else min(best, out[label + "_seconds"])
        out[label + "_seconds"] = best
        out[label + "_result"] = [int(x) if x is not None else None for x in res[0]]
    print(json.dumps(out, default=str))


# --------------------------------------------------------------------------- main

def main(argv=None) -> int:
    import duckdb

    import run as bench  # timed(), fmt_*, tail(), default_strata(): reused, not copied

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=bench.default_strata())
    ap.add_argument("--keys", type=int, help="keys (default 100000; --small 2000)")
    ap.add_argument("--days", type=int, default=365, help="as-of days from 2024-01-01 (default 365)")
    ap.add_argument("--changes", type=int, default=5, help="mean events per key after the first")
    ap.add_argument("--facts", type=int, help="fact rows (default 1000000; --small 20000)")
    ap.add_argument("--files", type=int, default=4, help="event files")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--spine", choices=["range", "query"], default="range",
                    help="range: AS OF RANGE (DATE, DATE, INTERVAL 1 DAY) (TIMESTAMP as-of values); "
                         "query: AS OF (SELECT CAST(value AS DATE) ...) (DATE as-of values)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per timed fact-join query (best kept)")
    ap.add_argument("--pit-repeat", type=int, default=3,
                    help="PIT builds per engine (strata: the pit folder removed and run 2 repeated; "
                         "best and median reported)")
    ap.add_argument("--full-compare", action="store_true",
                    help="also export strata's whole PIT table as CSV and compare it row by row "
                         "(always done with --small)")
    ap.add_argument("--threads", type=int, help="DuckDB threads (default: all cores)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--workdir", type=Path, default=BENCH_DIR / "data")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    keys = a.keys or (2_000 if a.small else 100_000)
    facts = a.facts or (20_000 if a.small else 1_000_000)
    full_compare = a.full_compare or a.small
    strata = bench.Strata(a.strata)
    strata.check()
    start, stop = START, START + dt.timedelta(days=a.days - 1)
    wl = (a.workdir / f"pit-k{keys}-d{a.days}-c{a.changes}-f{facts}-s{a.seed}").resolve()
    wl.mkdir(parents=True, exist_ok=True)
    logs = wl / "logs"
    log(f"$ {shlex.join([sys.executable, *sys.argv])}")
    log(f"machine: {os.cpu_count()} cores, {platform.platform()}; strata {strata.version()} "
        f"({strata.bin}); duckdb {duckdb.__version__}; load average {os.getloadavg()}")

    # ---- generate (or reuse)
    params = {"keys": keys, "days": a.days, "changes": a.changes, "facts": facts, "files": a.files,
              "seed": a.seed, "generator": Path(__file__).stat().st_mtime_ns}
    meta = wl / "gen.json"
    st = None
    if meta.exists():
        m = json.loads(meta.read_text())
        if m.get("params") == params:
            st = m["stats"]
            log(f"reusing generated workload {wl}")
    if st is None:
        st = generate(wl, keys, a.days, a.changes, facts, a.files, a.seed)
        meta.write_text(json.dumps({"params": params, "stats": st}, indent=2))
    log(f"workload: {st['events']:,} events ({st['deletes']:,} deletes) over {st['keys']:,} keys, "
        f"{st['facts']:,} facts; generated in {st['generate_seconds']} s")
    for d in ("warehouse", "logs"):
        shutil.rmtree(wl / d, ignore_errors=True)
    logs.mkdir()
    res: dict = {"workload": st, "dir": str(wl), "params": params, "spine": a.spine}

    # ---- strata runs
    def strata_run(stage: int, label: str) -> dict:
        (wl / "pipeline.sql").write_text(pit_pipeline(stage, a.spine, start, stop))
        r = strata.run(wl, label)
        if r["rc"] != 0:
            raise SystemExit(f"strata run {label} failed:\n{bench.tail(logs / f'{label}.stderr')}")
        return r

    for stage, label in ((1, "flow"), (2, "pit"), (3, "facts"), (3, "noop")):
        res[label] = strata_run(stage, label)
        if label == "pit" and a.pit_repeat > 1:
            # Rebuild the PIT table from scratch (its folder removed) to see the spread.
            builds = [res["pit"]]
            for i in range(1, a.pit_repeat):
                shutil.rmtree(wl / "warehouse" / "default" / "pit")
                builds.append(strata_run(2, f"pit_rebuild{i}"))
            res["pit_builds"] = [{"seconds": b["seconds"], "maxrss_kib": b["maxrss_kib"]} for b in builds]
            best = min(builds, key=lambda b: b["seconds"])
            res["pit"] = dict(best, median_seconds=statistics.median(b["seconds"] for b in builds),
                              all_seconds=[b["seconds"] for b in builds],
                              maxrss_kib=max(b["maxrss_kib"] or 0 for b in builds))
    log(f"pipeline (final):\n{pit_pipeline(3, a.spine, start, stop)}")
    r = subprocess.run([strata.bin, "validate", "dim", "--warehouse", str(wl / "warehouse")],
                       capture_output=True, text=True)
    res["validate_dim"] = r.returncode == 0
    if r.returncode != 0:
        FAILURES.append(f"strata validate dim: exit {r.returncode}\n{r.stdout}{r.stderr}")

    def squery(sql: str, label: str, out: Path | None = None) -> dict:
        cmd = [strata.bin, "query", "--warehouse", str(wl / "warehouse"), "--format", "csv", sql]
        out = out or logs / f"{label}.csv"
        r = bench.timed(cmd, out, logs / f"{label}.query.stderr")
        r["cmd"] = shlex.join(cmd)
        if r["rc"] != 0:
            msg = f"strata query {label} failed: exit {r['rc']}\n{bench.tail(logs / f'{label}.query.stderr')}"
            FAILURES.append(msg)
            log(msg)
        r["out"] = str(out)
        return r

    def rows_of(path: str) -> list[list[str]]:
        with open(path, newline="") as f:
            return list(csv.reader(f))[1:]

    q = squery("SELECT arrow_typeof(as_of) AS t, arrow_typeof(dim_start) AS s FROM pit LIMIT 1", "types")
    res["pit_types"] = rows_of(q["out"]) if q["rc"] == 0 else None
    log(f"strata pit column types (as_of, dim_start): {res['pit_types']}")

    # ---- DuckDB
    spec = logs / "duckdb.json"
    spec.write_text(json.dumps({
        "events": str(wl / "data" / "events"), "facts": str(wl / "data" / "facts"),
        "start": str(start), "stop": str(stop), "threads": a.threads, "repeat": a.repeat, "pit_repeat": a.pit_repeat,
        "dim_out": str(wl / "duckdb_dim.parquet"), "pit_out": str(wl / "duckdb_pit.parquet")}))
    cmd = [sys.executable, str(Path(__file__).resolve()), "_duckdb", str(spec)]
    log(f"$ {shlex.join(cmd)}")
    d = bench.timed(cmd, logs / "duckdb.stdout", logs / "duckdb.stderr")
    if d["rc"] != 0:
        raise SystemExit(f"DuckDB side failed:\n{bench.tail(logs / 'duckdb.stderr')}")
    d.update(json.loads((logs / "duckdb.stdout").read_text().strip().splitlines()[-1]))
    res["duckdb"] = d
    if d.get("pit_range_diff"):
        FAILURES.append(f"DuckDB's range-join PIT differs from its ASOF PIT in {d['pit_range_diff']} rows")
    log(f"  -> DuckDB: dim {d['dim_seconds']:.2f} s ({d['dim_rows']:,} rows), PIT ASOF "
        f"{d['pit_seconds']:.2f} s ({d['pit_rows']:,} rows), + COPY to parquet "
        f"{d['pit_copy_seconds']:.2f} s; process peak RSS {bench.fmt_mem(d['maxrss_kib'])}")

    # ---- compare dim (multiset)
    con = duckdb.connect()
    q = squery("SELECT id, name, city, amount, __START_AT, __END_AT FROM dim", "dim_export")
    cols = "id, name, city, amount, __START_AT, __END_AT"
    if q["rc"] == 0:
        con.execute(f"CREATE TABLE sdim AS SELECT * FROM read_csv('{q['out']}', header=true, "
                    "columns={'id':'BIGINT','name':'VARCHAR','city':'VARCHAR','amount':'BIGINT',"
                    "'__START_AT':'DATE','__END_AT':'DATE'})")
        con.execute(f"CREATE VIEW ddim AS SELECT {cols} FROM read_parquet('{wl / 'duckdb_dim.parquet'}')")
        n_s = con.execute("SELECT count(*) FROM sdim").fetchone()[0]
        diff = con.execute(f"SELECT (SELECT count(*) FROM (SELECT {cols} FROM sdim EXCEPT ALL SELECT {cols} FROM ddim)),"
                           f" (SELECT count(*) FROM (SELECT {cols} FROM ddim EXCEPT ALL SELECT {cols} FROM sdim))").fetchone()
        res["dim_compare"] = {"strata_rows": n_s, "duckdb_rows": d["dim_rows"], "only_strata": diff[0],
                              "only_duckdb": diff[1], "match": diff == (0, 0) and n_s == d["dim_rows"]}
        if not res["dim_compare"]["match"]:
            FAILURES.append(f"dim differs: {res['dim_compare']}")
        log(f"dim compare: {res['dim_compare']}")

    # ---- compare PIT (per as-of aggregates; whole table when asked)
    q = squery(STRATA_PIT_AGG, "pit_agg")
    res["pit_agg_query"] = q
    if q["rc"] == 0:
        got = [[int(x) for x in r] for r in rows_of(q["out"])]
        exp = [[int(x) for x in r] for r in d["pit_agg"]]
        n_got = sum(r[1] for r in got)
        bad = [(e, g) for e, g in zip(exp, got) if e != g]
        res["pit_compare"] = {"strata_rows": n_got, "duckdb_rows": d["pit_rows"],
                              "strata_as_of_values": len(got), "duckdb_as_of_values": len(exp),
                              "checksum_strata": sum(r[4] for r in got) % 1000000007,
                              "checksum_duckdb": sum(r[4] for r in exp) % 1000000007,
                              "match": got == exp, "first_differences": bad[:3]}
        if got != exp:
            FAILURES.append(f"PIT table differs from DuckDB's: {res['pit_compare']}")
        log(f"PIT compare (per as-of: rows, sum id, sum start, hash): {res['pit_compare']}")
    if full_compare:
        q = squery("SELECT CAST(as_of AS DATE) AS as_of, id, dim_start FROM pit", "pit_export")
        if q["rc"] == 0:
            con.execute(f"CREATE TABLE spit AS SELECT * FROM read_csv('{q['out']}', header=true, "
                        "columns={'as_of':'DATE','id':'BIGINT','dim_start':'DATE'})")
            con.execute(f"CREATE VIEW dpit AS SELECT * FROM read_parquet('{wl / 'duckdb_pit.parquet'}')")
            diff = con.execute("SELECT (SELECT count(*) FROM (SELECT * FROM spit EXCEPT ALL SELECT * FROM dpit)),"
                               " (SELECT count(*) FROM (SELECT * FROM dpit EXCEPT ALL SELECT * FROM spit))").fetchone()
            res["pit_full_compare"] = {"only_strata": diff[0], "only_duckdb": diff[1], "match": diff == (0, 0)}
            if diff != (0, 0):
                FAILURES.append(f"PIT table differs row by row: {res['pit_full_compare']}")
            log(f"PIT full compare: {res['pit_full_compare']}")

    # ---- fact joins with strata query
    fj = {}
    for label, sql in (("baseline", "SELECT count(*) AS n FROM facts"),
                       ("range_join", RANGE_JOIN.format(start_sum=STRATA_START_SUM)),
                       ("pit_join", PIT_JOIN.format(start_sum=STRATA_START_SUM))):
        runs = [squery(sql, f"{label}_{i}") for i in range(a.repeat)]
        ok = [r for r in runs if r["rc"] == 0]
        if not ok:
            fj[label] = {"failed": True, "error": bench.tail(logs / f"{label}_0.query.stderr")}
            continue
        best = min(ok, key=lambda r: r["seconds"])
        fj[label] = {"seconds": best["seconds"], "all_seconds": [r["seconds"] for r in ok],
                     "maxrss_kib": max(r["maxrss_kib"] or 0 for r in ok),
                     "result": [int(x) if x else None for x in rows_of(best["out"])[0]], "cmd": best["cmd"]}
        log(f"strata query {label}: best {fj[label]['seconds']:.2f} s of {[round(x, 2) for x in fj[label]['all_seconds']]}, "
            f"peak RSS {bench.fmt_mem(fj[label]['maxrss_kib'])}, result {fj[label]['result']}")
    res["fact_joins"] = fj
    results = {"strata range": fj.get("range_join", {}).get("result"),
               "strata pit": fj.get("pit_join", {}).get("result"),
               "duckdb asof": d["asof_join_result"], "duckdb range": d["range_join_result"],
               "duckdb pit": d["pit_join_result"]}
    same = len({json.dumps(v) for v in results.values()}) == 1
    res["fact_join_results"] = results
    res["fact_join_match"] = same
    if not same:
        FAILURES.append(f"fact join results differ: {results}")

    # ---- report
    B = bench
    log("\n" + "=" * 78)
    log("REPORT (point in time)")
    log(f"machine: {os.cpu_count()} cores; strata {strata.version()}; duckdb {d['duckdb_version']}; "
        f"load average now {os.getloadavg()} (other processes on the machine skew the times)")
    log(f"workload: {keys:,} keys, {st['events']:,} events ({st['deletes']:,} deletes), {a.days} as-of days "
        f"{start}..{stop}, {facts:,} facts; spine: {a.spine}; dir {wl}")
    if "pit_builds" in res:
        log(f"  strata PIT builds (run 2, repeated from scratch): "
            f"{[round(x, 2) for x in res['pit']['all_seconds']]} s; best {B.fmt_s(res['pit']['seconds'])}, "
            f"median {B.fmt_s(res['pit']['median_seconds'])}")
        log(f"  duckdb PIT ASOF builds: {[round(x, 2) for x in d['pit_all_seconds']]} s; best "
            f"{B.fmt_s(d['pit_seconds'])}, median {B.fmt_s(d['pit_median_seconds'])}; ratio of medians "
            f"{res['pit']['median_seconds'] / d['pit_median_seconds']:.2f}x")
    for label, what in (("flow", "run 1: AUTO CDC flow (SCD2 dim)"), ("pit", "run 2: PIT table build (best)"),
                        ("facts", "run 3: facts streaming table"), ("noop", "run 4: nothing new")):
        r = res[label]
        log(f"  strata {what:34s} {B.fmt_s(r['seconds'])}   peak RSS {B.fmt_mem(r['maxrss_kib'])}")
    log(f"  duckdb dim (duckdb_scd2.sql)            {B.fmt_s(d['dim_seconds'])}")
    log(f"  duckdb PIT (spine x keys ASOF, best)    {B.fmt_s(d['pit_seconds'])}   "
        f"(+ COPY to parquet {B.fmt_s(d['pit_copy_seconds'])}; process peak RSS {B.fmt_mem(d['maxrss_kib'])})")
    log(f"  duckdb PIT as plain range join          {[round(x, 2) for x in d['pit_range_all_seconds']]} s; "
        f"best {B.fmt_s(d['pit_range_seconds'])}, median {B.fmt_s(d['pit_range_median_seconds'])} "
        f"(rows differing from the ASOF result: {d['pit_range_diff']})")
    log(f"  ratio PIT build: strata run 2 / duckdb ASOF = {res['pit']['seconds'] / d['pit_seconds']:.2f}x; "
        f"/ (ASOF + COPY) = {res['pit']['seconds'] / (d['pit_seconds'] + d['pit_copy_seconds']):.2f}x")
    if "pit_builds" in res:
        sm, rm = res['pit']['median_seconds'], d['pit_range_median_seconds']
        log(f"  ratio PIT build, medians: strata run 2 (a whole process that reads the Delta dim and "
            f"commits a Delta table) / duckdb range join in memory = {sm / rm:.2f}x; / (range join + "
            f"COPY to parquet) = {sm / (rm + d['pit_copy_seconds']):.2f}x")
    log(f"  ratio flow: strata run 1 / duckdb dim = {res['flow']['seconds'] / d['dim_seconds']:.2f}x")
    pc = res.get("pit_compare", {})
    log(f"  PIT rows: strata {B.fmt_int(pc.get('strata_rows'))}, duckdb {B.fmt_int(d['pit_rows'])}; "
        f"as-of values {pc.get('strata_as_of_values')}/{pc.get('duckdb_as_of_values')}; "
        f"checksum {pc.get('checksum_strata')} / {pc.get('checksum_duckdb')}; match: {'yes' if pc.get('match') else 'NO'}"
        + (f"; row-by-row: {'yes' if res['pit_full_compare']['match'] else 'NO'}" if "pit_full_compare" in res else ""))
    dc = res.get("dim_compare", {})
    log(f"  dim rows: strata {B.fmt_int(dc.get('strata_rows'))}, duckdb {B.fmt_int(d['dim_rows'])}; match: "
        f"{'yes' if dc.get('match') else 'NO'}; strata validate dim: {'ok' if res['validate_dim'] else 'FAILED'}")
    log(f"  fact join ({facts:,} facts), best of {a.repeat}:")
    for label, what in (("baseline", "strata query count(*) FROM facts"),
                        ("range_join", "strata query range join"), ("pit_join", "strata query PIT equi-join")):
        r = fj.get(label, {})
        if r.get("failed"):
            log(f"    {what:36s} FAILED: {r['error'][-300:]}")
        elif r:
            log(f"    {what:36s} {B.fmt_s(r['seconds'])}   peak RSS {B.fmt_mem(r['maxrss_kib'])}")
    for label, what in (("asof_join", "duckdb ASOF JOIN"), ("range_join", "duckdb range join"),
                        ("pit_join", "duckdb PIT equi-join")):
        log(f"    {what:36s} {B.fmt_s(d[label + '_seconds'])}   (in-process, tables in memory)")
    log(f"    results (count, sum fact.amount, sum dim.amount, sum start): {results}; "
        f"all equal: {'yes' if same else 'NO'}")
    log("=" * 78)
    out_json = a.json or (wl / f"pit-results-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return bench.finish(res, out_json, FAILURES)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_duckdb":
        _duckdb_child(sys.argv[2])
        sys.exit(0)
    ensure_venv()
    sys.exit(main())
