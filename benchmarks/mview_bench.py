#!/usr/bin/env python3
"""Materialized views after a 1% change of a 10M-row source: strata's incremental refresh
against a full recompute of the same view by strata and against DuckDB computing the view's
query over the source table's files (issue 39).

    python3 benchmarks/mview_bench.py --strata target/release/strata     # 10M rows, 3 rounds
    python3 benchmarks/mview_bench.py --small --strata target/debug/strata   # correctness only

The workload of run.py (gen.py: --events events over --keys keys in --files files) and
run.py's pipeline (read_files -> the bronze streaming table events_raw, 10M rows; AUTO CDC
INTO target ... STORED AS SCD TYPE 2), plus three materialized views, one per kind of
incremental refresh (docs/pipeline-sql.md, "Incremental refresh"):

  mv_filter   projection and filter of events_raw (append-only):
              SELECT id, upper(city) AS city, amount, seq FROM events_raw
              WHERE op = 'U' AND amount % 4 = 0                  -> new rows appended
  mv_combine  GROUP BY of events_raw with count/sum/min/max:
              SELECT city, count(*), sum(amount), min(amount), max(amount)
              FROM events_raw GROUP BY city                       -> combined with the view's rows
  mv_regroup  GROUP BY of the SCD2 target (rows updated and deleted) with avg:
              SELECT id, count(*) AS versions, avg(amount), max("__START_AT")
              FROM target GROUP BY id                             -> touched groups recomputed

One `strata run` builds everything. Then, --rounds times:

1. a batch file of --change-pct percent of --events events (gen.py batch: over
   --change-pct percent of the keys, late events included) is added; `strata run --select
   events_raw` and `strata run --select target` take it into the bronze table (1% more
   rows) and the SCD2 target (the touched keys' rows replaced, closed, added): untimed;
2. for each view, in turn:
   - incremental: `strata run --select VIEW`, timed (process wall clock, peak RSS; the time
     the run prints for the view is kept too); its output must say the refresh was
     incremental (exit 1 otherwise);
   - full: `strata run --select VIEW --full-refresh VIEW`, timed, on the same source version
     (the view is recomputed whole from the source; the set-aside old content under
     _strata/full_refresh/ is deleted after the run, untimed);
   - DuckDB: a fresh process with the delta extension (the pinned duckdb-ext-delta wheel)
     runs the view's query over `delta_scan('<source table>')` and writes the result with
     `COPY ... TO '<file>.parquet'` (timed inside the process, after the extension is
     loaded; process wall clock and peak RSS as well);
   - the three results are compared: row count and an order-independent hash of every row
     (averages rounded to 6 decimals), read by DuckDB from the view's Delta table after
     each strata run and from DuckDB's parquet file.

Reported: per view and method the median over the rounds of the time and the peak RSS, the
ratios incremental/full and incremental/DuckDB, and the view's rows. --small (20k events
over 2k keys, 1 round) is a correctness check and prints no timings;
benchmarks/selftest.sh runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
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
from _bench import FAILURES, R, fail, log, sql_str  # noqa: E402

SMALL = dict(events=20_000, keys=2_000, files=2, rounds=1)
FULL = dict(events=10_000_000, keys=1_000_000, files=10, rounds=3)

# name -> (source table, the query with {src} for the source, the row fingerprint's columns
# with the casts that make DataFusion's and DuckDB's results hash alike, the incremental
# refresh kind its run must print).
VIEWS = {
    "mv_filter": ("events_raw",
                  "SELECT id, upper(city) AS city, amount, seq FROM {src} "
                  "WHERE op = 'U' AND amount % 4 = 0",
                  "id::BIGINT, city::VARCHAR, amount::BIGINT, seq::BIGINT",
                  "appended"),
    "mv_combine": ("events_raw",
                   "SELECT city, count(*) AS n, sum(amount) AS total, min(amount) AS lo, "
                   "max(amount) AS hi FROM {src} GROUP BY city",
                   "city::VARCHAR, n::BIGINT, total::BIGINT, lo::BIGINT, hi::BIGINT",
                   "combined"),
    "mv_regroup": ("target",
                   'SELECT id, count(*) AS versions, avg(amount) AS mean_amount, '
                   'max("__START_AT") AS last_start FROM {src} GROUP BY id',
                   "id::BIGINT, versions::BIGINT, round(mean_amount, 6)::DOUBLE, last_start::BIGINT",
                   "recomputed"),
}
METHODS = ("incremental", "full", "duckdb")
METHOD_TITLE = {"incremental": "strata incremental", "full": "strata full recompute",
                "duckdb": "DuckDB delta_scan"}
# What `strata run` prints for a view (stdout): "materialized view default.NAME: incremental: ..."
# or "... : recomputed, N row(s)".
VIEW_LINE = re.compile(r"^materialized view default\.(?P<name>\w+): (?P<what>.*)$")
# Its progress line on stderr ends with the view's own time: "... (incremental) (0.09 s)".
VIEW_TIME = re.compile(r"materialized view default\.(?P<name>\w+): .*\((?P<secs>[\d.]+) s\)\s*$")


def pipeline_sql() -> str:
    """run.py's pipeline and the three views."""
    views = "".join(f"CREATE OR REFRESH MATERIALIZED VIEW {name}\nAS {strata_sql(q.format(src=src))};\n"
                    for name, (src, q, _cols, _kind) in VIEWS.items())
    return R().PIPELINE + views


def strata_sql(query: str) -> str:
    """A view's query in the pipeline's dialect (Spark's), where "..." is a string and
    identifiers are quoted with backticks; DuckDB takes the double quotes."""
    return query.replace('"__START_AT"', "`__START_AT`")


def view_outcome(stdout: str, name: str) -> str | None:
    """What the run printed for view NAME (stdout), e.g. 'incremental: 42 row(s) ... appended'."""
    for line in stdout.splitlines():
        m = VIEW_LINE.match(line.strip())
        if m and m.group("name") == name:
            return m.group("what")
    return None


def view_seconds(stderr: str, name: str) -> float | None:
    """The view's own time, from the run's progress line (stderr)."""
    for line in stderr.splitlines():
        m = VIEW_TIME.search(line)
        if m and m.group("name") == name:
            return float(m.group("secs"))
    return None


# --------------------------------------------------------------------------- DuckDB

def duckdb_delta_connect(install: bool = False):
    """upkeep_bench.py's connection: the delta extension from the pinned wheel."""
    import upkeep_bench

    return upkeep_bench.duckdb_delta_connect(install)


def fingerprint(relation: str, cols: str) -> tuple[int, str]:
    """Row count and an order-independent hash of every row of RELATION (a delta_scan or a
    read_parquet), over COLS."""
    con = duckdb_delta_connect()
    n, h = con.execute(f"SELECT count(*), coalesce(sum(hash({cols})::HUGEINT), 0)::VARCHAR "
                       f"FROM {relation}").fetchone()
    con.close()
    return int(n), str(h)


def _duckdb_view_child(spec_path: str) -> None:
    """Child process: the view's query over delta_scan(source), written to a parquet file;
    prints its time (after the extension is loaded) and the rows."""
    spec = json.loads(Path(spec_path).read_text())
    con = duckdb_delta_connect()
    sql = spec["query"].format(src=f"delta_scan({sql_str(spec['source'])})")
    t0 = time.perf_counter()
    con.execute(f"COPY ({sql}) TO {sql_str(spec['out'])} (FORMAT parquet)")
    secs = time.perf_counter() - t0
    rows = con.execute(f"SELECT count(*) FROM read_parquet({sql_str(spec['out'])})").fetchone()[0]
    print(json.dumps({"query_seconds": secs, "rows": rows}))


def duckdb_view(wl: Path, name: str, label: str) -> dict:
    src, query, _cols, _kind = VIEWS[name]
    logs = wl / "logs"
    out = wl / "duckdb" / f"{name}.parquet"
    out.parent.mkdir(exist_ok=True)
    out.unlink(missing_ok=True)
    spec = logs / f"{label}.duckdb.json"
    spec.write_text(json.dumps({"query": query, "out": str(out),
                                "source": str(wl / "warehouse" / "default" / src)}))
    cmd = [sys.executable, str(Path(__file__).resolve()), "_duckdb_view", str(spec)]
    r = R().timed(cmd, logs / f"{label}.duckdb.stdout", logs / f"{label}.duckdb.stderr")
    r["cmd"] = shlex.join(cmd)
    if r["rc"] != 0:
        fail(f"DuckDB's {name} failed: exit {r['rc']}\n$ {r['cmd']}\n"
             f"{R().tail(logs / f'{label}.duckdb.stderr')}")
        return r
    r.update(json.loads((logs / f"{label}.duckdb.stdout").read_text().strip().splitlines()[-1]))
    r["fingerprint"] = fingerprint(f"read_parquet({sql_str(out)})", VIEWS[name][2])
    return r


# --------------------------------------------------------------------------- strata

class StrataCli:
    def __init__(self, binary: str, wl: Path):
        self.bin = binary
        self.wl = wl
        self.wh = wl / "warehouse"
        self.logs = wl / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def run(self, extra: list[str], label: str) -> dict:
        """`strata run pipeline.sql --warehouse WH EXTRA`, timed with peak RSS."""
        cmd = [self.bin, "run", str(self.wl / "pipeline.sql"), "--warehouse", str(self.wh), *extra]
        log(f"$ {shlex.join(cmd)}")
        r = R().timed(cmd, self.logs / f"{label}.stdout", self.logs / f"{label}.stderr")
        r["cmd"] = shlex.join(cmd)
        r["stdout"] = (self.logs / f"{label}.stdout").read_text(errors="replace")
        r["stderr"] = (self.logs / f"{label}.stderr").read_text(errors="replace")
        if r["rc"] != 0:
            fail(f"strata run failed ({label}): exit {r['rc']}\n$ {r['cmd']}\n"
                 f"{R().tail(self.logs / f'{label}.stderr')}")
        return r

    def view_fingerprint(self, name: str) -> tuple[int, str]:
        return fingerprint(f"delta_scan({sql_str(self.wh / 'default' / name)})", VIEWS[name][2])


def refresh(cli: StrataCli, name: str, method: str, label: str) -> dict:
    """One strata refresh of view NAME (incremental or full), checked and fingerprinted."""
    extra = ["--select", name] + (["--full-refresh", name] if method == "full" else [])
    r = cli.run(extra, label)
    out = {k: r[k] for k in ("rc", "seconds", "maxrss_kib", "cmd")}
    if r["rc"] != 0:
        return out
    what = view_outcome(r["stdout"], name) or ""
    out["outcome"] = what
    out["view_seconds"] = view_seconds(r["stderr"], name)
    log(f"  -> {what}" + (f" ({r['seconds']:.2f} s)" if SHOW_TIMES else ""))
    expected = VIEWS[name][3]
    if method == "incremental" and not (what.startswith("incremental:") and expected in what):
        fail(f"{name}: the refresh after the batch was not the incremental one expected "
             f"('{expected}'): {what or 'no line for the view'}\n$ {r['cmd']}")
    if method == "full" and not what.startswith("recomputed"):
        fail(f"{name}: --full-refresh did not recompute the view: {what or 'no line'}\n$ {r['cmd']}")
    if method == "full":
        shutil.rmtree(cli.wh / "_strata" / "full_refresh", ignore_errors=True)
    out["fingerprint"] = cli.view_fingerprint(name)
    return out


SHOW_TIMES = True


# --------------------------------------------------------------------------- the benchmark

def main(argv=None) -> int:
    global SHOW_TIMES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--small", action="store_true",
                    help="20k events over 2k keys, 1 round: a correctness check, no timings printed")
    ap.add_argument("--strata", default=None,
                    help="strata binary (default as run.py: $STRATA_BIN, else "
                         "$CARGO_TARGET_DIR or target/, release/strata)")
    ap.add_argument("--events", type=int, help="events, the bronze table's rows (default 10000000)")
    ap.add_argument("--keys", type=int, help="keys (default 1000000)")
    ap.add_argument("--files", type=int, help="files the events are split into (default 10)")
    ap.add_argument("--change-pct", type=float, default=1.0,
                    help="each round's batch: this percent of --events events over this percent "
                         "of the keys (default 1)")
    ap.add_argument("--rounds", type=int, help="batches, each refreshed three ways; medians (default 3)")
    ap.add_argument("--views", default=",".join(VIEWS),
                    help=f"the views measured, comma-separated (default {','.join(VIEWS)})")
    ap.add_argument("--noop-share", type=float, default=0.15)
    ap.add_argument("--delete-share", type=float, default=0.05)
    ap.add_argument("--late-share", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--workdir", type=Path, default=BENCH_DIR / "data")
    ap.add_argument("--regenerate", action="store_true", help="regenerate the base data even if cached")
    ap.add_argument("--json", type=Path, help="write all measurements to this JSON file")
    a = ap.parse_args(argv)

    run = R()
    import gen

    preset = SMALL if a.small else FULL
    for k in ("events", "keys", "files", "rounds"):
        if getattr(a, k) is None:
            setattr(a, k, preset[k])
    views = [v for v in a.views.split(",") if v]
    unknown = [v for v in views if v not in VIEWS]
    if unknown:
        raise SystemExit(f"--views: unknown view(s) {unknown}; known: {', '.join(VIEWS)}")
    a.threads = None
    a.deletion_vectors = None  # strata's default target (deletion vectors on)
    SHOW_TIMES = not a.small
    strata_bin = a.strata or run.default_strata()
    run.Strata(strata_bin).check()
    duckdb_delta_connect(install=True).close()  # once; the children only LOAD it
    a.workdir.mkdir(parents=True, exist_ok=True)
    a.workdir = a.workdir.resolve()
    batch_events = max(1, round(a.events * a.change_pct / 100))
    log(f"$ {shlex.join([sys.executable, *sys.argv])}")
    log(f"\n=== mview: views over a {a.events:,}-row bronze table and its SCD2 target, after "
        f"batches of {batch_events:,} events ({a.change_pct:g}%): incremental refresh, full "
        f"recompute, DuckDB ===")

    wl, st = run.prepare_workload(f"mview-e{a.events}-k{a.keys}-f{a.files}-s{a.seed}",
                                  a.workdir, a.events, a.keys, a.files, a)
    (wl / "pipeline.sql").write_text(pipeline_sql())
    shutil.rmtree(wl / "duckdb", ignore_errors=True)
    cli = StrataCli(strata_bin, wl)
    res: dict = {"benchmark": "mview", "small": a.small, "params": {
        k: getattr(a, k) for k in ("events", "keys", "files", "change_pct", "rounds", "noop_share",
                                   "delete_share", "late_share", "seed")},
        "views": {v: VIEWS[v][1].format(src=VIEWS[v][0]) for v in views},
        "dir": str(wl), "strata_bin": strata_bin, "strata_version": run.Strata(strata_bin).version(),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}", "generator": st,
        "load_before": os.getloadavg()}
    first = cli.run([], "initial")
    res["initial_run"] = {k: first[k] for k in ("rc", "seconds", "maxrss_kib", "cmd")}
    if first["rc"] != 0:
        return finish(res, a)
    for line in first["stdout"].splitlines():
        log(f"     | {line}")

    rounds = []
    for i in range(1, a.rounds + 1):
        log(f"\n--- round {i} of {a.rounds} ---")
        bst = gen.gen_batch(wl, batch_events, a.change_pct, a.noop_share, a.delete_share,
                            a.late_share, a.seed, threads=a.threads)
        log(f"$ python3 {BENCH_DIR / 'gen.py'} batch --out {wl} --events {batch_events} "
            f"--keys-pct {a.change_pct:g}: {bst['keys_touched']:,} keys, {bst['late_events']:,} late")
        rnd = {"batch": {k: bst.get(k) for k in ("events", "keys_touched", "kinds", "late_events")},
               "views": {}}
        rounds.append(rnd)
        for sel in ("events_raw", "target"):
            up = cli.run(["--select", sel], f"r{i}-{sel}")
            if up["rc"] != 0:
                return finish(res | {"rounds": rounds}, a)
            for line in up["stdout"].splitlines():
                log(f"     | {line}")
        for name in views:
            v = {}
            for method in ("incremental", "full"):
                v[method] = refresh(cli, name, method, f"r{i}-{name}-{method}")
            log(f"DuckDB: {VIEWS[name][1].format(src='delta_scan(...)')}")
            d = duckdb_view(wl, name, f"r{i}-{name}")
            v["duckdb"] = {k: d.get(k) for k in ("rc", "seconds", "maxrss_kib", "cmd",
                                                 "query_seconds", "rows", "fingerprint")}
            compare_round(name, i, v)
            rnd["views"][name] = v
    res["rounds"] = rounds
    res["summary"] = summarize(rounds, views)
    res["load_after"] = os.getloadavg()
    report(res, views)
    return finish(res, a)


def compare_round(name: str, i: int, v: dict) -> None:
    fps = {m: v[m].get("fingerprint") for m in METHODS}
    if any(fp is None for fp in fps.values()):
        return  # a failed step, already recorded
    rows = fps["duckdb"][0]
    same = len(set(fps.values())) == 1
    log(f"  {name}, round {i}: {rows:,} rows; incremental, full recompute and DuckDB "
        + ("give the same rows" if same else f"DIFFER: {fps}"))
    if not same:
        fail(f"{name}, round {i}: the results differ (rows, hash): " + ", ".join(
            f"{METHOD_TITLE[m]} {fps[m]}" for m in METHODS))
    if rows == 0:
        fail(f"{name}, round {i}: the view is empty, so the comparison checks nothing")


def summarize(rounds: list[dict], views: list[str]) -> dict:
    out = {}
    for name in views:
        per = {}
        for m in METHODS:
            runs = [r["views"][name][m] for r in rounds if name in r["views"]]
            secs = [x.get("query_seconds" if m == "duckdb" else "seconds") for x in runs]
            secs = [s for s in secs if s is not None and all(x.get("rc") == 0 for x in runs)]
            rss = [x["maxrss_kib"] for x in runs if x.get("maxrss_kib")]
            per[m] = {"median_seconds": statistics.median(secs) if secs else None, "all": secs,
                      "peak_rss_kib": max(rss) if rss else None}
            if m == "duckdb":
                ps = [x["seconds"] for x in runs if x.get("rc") == 0]
                per[m]["median_process_seconds"] = statistics.median(ps) if ps else None
            else:
                vs = [x.get("view_seconds") for x in runs if x.get("view_seconds") is not None]
                per[m]["median_view_seconds"] = statistics.median(vs) if vs else None
        fp = rounds[-1]["views"].get(name, {}).get("duckdb", {}).get("fingerprint")
        per["rows"] = fp[0] if fp else None
        out[name] = per
    return out


# --------------------------------------------------------------------------- report

def report(res: dict, views: list[str]) -> None:
    p = res["params"]
    log("\n" + "=" * 100)
    log("REPORT")
    log(f"machine: {res['machine']}; strata {res['strata_version']} ({res['strata_bin']})")
    log(f"workload: bronze events_raw from {p['events']:,} events over {p['keys']:,} keys, its "
        f"SCD2 target; {p['rounds']} round(s) of a {p['change_pct']:g}% batch "
        f"({res['rounds'][0]['batch']['events']:,} events over "
        f"{res['rounds'][0]['batch']['keys_touched']:,} keys)")
    s = res["summary"]
    if not SHOW_TIMES:
        for name in views:
            log(f"{name}: {s[name]['rows']:,} rows, the same from all three "
                f"({', '.join(r['views'][name]['incremental'].get('outcome', '?') for r in res['rounds'])})")
        log("(--small: a correctness check; timings of such runs are not reported)")
        log("=" * 100)
        return

    def num(x):
        return "n/a" if x is None else f"{x:.2f} s"

    def ratio(x, y):
        return f"{x / y:.2f}x" if x and y else "n/a"

    fmt_mem = R().fmt_mem
    head = ("view", "rows", "incremental", "full recompute", "DuckDB", "incr/full", "incr/DuckDB",
            "full/DuckDB", "peak RSS incr / full / DuckDB")
    rows = []
    for name in views:
        v = s[name]
        inc, full, duck = (v[m]["median_seconds"] for m in METHODS)
        rows.append((name, f"{v['rows']:,}" if v["rows"] is not None else "n/a",
                     f"{num(inc)} ({num(v['incremental']['median_view_seconds'])})",
                     f"{num(full)} ({num(v['full']['median_view_seconds'])})",
                     f"{num(duck)} ({num(v['duckdb']['median_process_seconds'])})",
                     ratio(inc, full), ratio(inc, duck), ratio(full, duck),
                     " / ".join(fmt_mem(v[m]["peak_rss_kib"]) for m in METHODS)))
    widths = [max(len(str(r[i])) for r in rows + [head]) + 2 for i in range(len(head))]
    log("")
    log("".join(f"{h:<{w}}" for h, w in zip(head, widths)))
    for r in rows:
        log("".join(f"{c:<{w}}" for c, w in zip(r, widths)))
    log(f"(medians of {p['rounds']} round(s). strata: the `strata run --select VIEW` process, "
        "in parentheses the time the run prints for the view; DuckDB: the query and its COPY "
        "to parquet after loading the extension, in parentheses the whole process)")
    for name in views:
        log(f"  {name}: " + "; ".join(
            f"round {i}: {r['views'][name]['incremental'].get('outcome', '?')}"
            for i, r in enumerate(res["rounds"], 1)))
    log("=" * 100)


def finish(res: dict, a) -> int:
    res["failures"] = FAILURES
    out = a.json or (a.workdir / f"mview-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return R().finish(res, out, FAILURES)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_duckdb_view":
        _duckdb_view_child(sys.argv[2])
        sys.exit(0)
    ensure_venv()
    sys.exit(main())
