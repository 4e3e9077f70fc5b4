#!/usr/bin/env python3
"""`strata optimize` on an SCD2 target grown by many small batches, against deltalake for
Python's `optimize.compact()` on the same table in the same run (issue 22).

    python3 benchmarks/upkeep_bench.py --strata target/release/strata            # 10M events, 100 batches
    python3 benchmarks/upkeep_bench.py --small --strata target/debug/strata      # correctness only

1. The workload of run.py's `incremental` benchmark (gen.py: a base of --events events over
   --keys keys in --files files, then --batches batch files of --batch-events events over
   --batch-keys-pct percent of the keys, late events included). strata's SCD2 target is
   built from the base by one `strata run`, then each batch is applied by one more run.
2. One more batch file is generated (the "next batch"), not yet run. The warehouse is copied
   twice (shutil.copytree): `wh-strata` and `wh-deltalake`.
3. Before: live files and bytes of the target and of its event store
   (`_strata/default/target/events`), from their Delta logs (deltalake's add actions); the
   full-scan query (an aggregate over every column, below) through `strata query` and through
   DuckDB's `delta_scan` (the delta extension from the pinned duckdb-ext-delta wheel), each a
   fresh process, --rounds times, median; the next batch's `strata run` on a throwaway copy
   of the warehouse (so both copies stay as they were).
4. Optimize: `strata optimize target` on wh-strata (it also compacts the target's event store
   once that is implemented; its output lines are parsed, an event-store line is optional)
   and `DeltaTable(target).optimize.compact()` in a child process on wh-deltalake; wall time
   and peak RSS of each process (/usr/bin/time -v, else getrusage in a wrapper).
5. After: files again, the full-scan query again, and the next batch on a throwaway copy of
   each side. Checks (exit 1 on any failure): each side's target holds exactly the rows it
   held before (count and an order-independent hash of every column, read by DuckDB; the
   scan aggregate through `strata query` and DuckDB agree), the next batch gives the same
   rows on both sides and on the un-optimized copy, `strata validate target` passes, the
   bronze table holds every generated event once, the optimize lines agree with the Delta
   logs, and the original warehouse was not touched by the copies' runs.
6. A table per side (text, and all measurements with --json FILE) and the ratios
   strata/deltalake.

--small (20k events over 2k keys, 5 batches) is a correctness check: it prints no timings
(debug builds' timings mean nothing). benchmarks/selftest.sh runs it.
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

SMALL = dict(events=20_000, keys=2_000, files=2, batches=5, rounds=1)
FULL = dict(events=10_000_000, keys=1_000_000, files=10, batches=100, rounds=3)
TARGET = "target"  # run.PIPELINE's SCD2 target, default.target
# The full-scan query: every column of the SCD2 target read and aggregated (a distinct count
# over the key so that the key column is hashed, sums and lengths over the rest). Written
# so that DataFusion (`strata query`) and DuckDB accept it alike and return the same numbers.
SCAN_SQL = ('SELECT count(*) AS n_rows, count(DISTINCT id) AS n_keys, sum(id) AS sum_id, '
            'sum(amount) AS sum_amount, sum(length(name)) AS len_name, '
            'sum(length(city)) AS len_city, sum("__START_AT") AS sum_start, '
            'sum("__END_AT") AS sum_end, count("__END_AT") AS n_closed FROM {table}')
# The exact content check (DuckDB): the row count and an order-independent hash of all rows.
FINGERPRINT_SQL = ('SELECT count(*), sum(hash(id, name, city, amount, "__START_AT", '
                   '"__END_AT")::HUGEINT)::VARCHAR FROM delta_scan({path})')
SIDES = ("strata", "deltalake")
SIDE_TITLE = {"strata": "strata optimize", "deltalake": "deltalake compact"}


def target_path(wh: Path) -> Path:
    return wh / "default" / TARGET


def store_path(wh: Path) -> Path:
    return wh / "_strata" / "default" / TARGET / "events"


def hms(secs: float) -> str:
    m, s = divmod(int(secs), 60)
    return f"{m}m{s:02d}s"


# --------------------------------------------------------------------------- strata

class StrataCli:
    def __init__(self, binary: str, wl: Path):
        self.bin = binary
        self.wl = wl
        self.logs = wl / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def timed(self, args: list[str], label: str, quiet: bool = False) -> dict:
        """`strata ARGS`, timed with peak RSS (run.timed). Records a failure on a non-zero exit."""
        cmd = [self.bin, *args]
        if not quiet:
            log(f"$ {shlex.join(cmd)}")
        r = R().timed(cmd, self.logs / f"{label}.stdout", self.logs / f"{label}.stderr")
        r["cmd"] = shlex.join(cmd)
        r["stdout"] = (self.logs / f"{label}.stdout").read_text(errors="replace")
        if r["rc"] != 0:
            fail(f"strata failed ({label}): exit {r['rc']}\n$ {r['cmd']}\n"
                 f"{R().tail(self.logs / f'{label}.stderr')}")
        return r

    def run(self, wh: Path, label: str, quiet: bool = False) -> dict:
        return self.timed(["run", str(self.wl / "pipeline.sql"), "--warehouse", str(wh)], label, quiet)

    def query_json(self, wh: Path, sql: str) -> tuple[list[dict], float]:
        cmd = [self.bin, "query", "--warehouse", str(wh), "--format", "json", sql]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        secs = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"$ {shlex.join(cmd)}\nexit {r.returncode}\n{r.stderr[-3000:]}")
        return [json.loads(line) for line in r.stdout.splitlines() if line.strip()], secs

    def validate(self, wh: Path, label: str) -> bool:
        cmd = [self.bin, "validate", TARGET, "--warehouse", str(wh)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            out = (r.stdout + r.stderr).strip().splitlines()
            fail(f"strata validate failed ({label}): exit {r.returncode}\n$ {shlex.join(cmd)}\n"
                 + "\n".join(out[-20:]))
        return r.returncode == 0


# --------------------------------------------------------------------------- strata optimize's output

_SIZE = r"(?P<fb>\d+) file\(s\) \((?P<mb>[\d.]+) MiB\) -> (?P<fa>\d+) file\(s\) \((?P<ma>[\d.]+) MiB\)"
OPT_DONE = re.compile(r"^(?P<table>\S+?)(?P<store> \(event store\))?: " + _SIZE
                      + r"(?P<rest>.*), version (?P<version>\d+), (?P<secs>[\d.]+) s$")
OPT_NOTHING = re.compile(r"^(?P<table>\S+?)(?P<store> \(event store\))?: (?P<fb>\d+) file\(s\), "
                         r"nothing to compact")
OPT_SKIPPED = re.compile(r"^(?P<table>\S+?)(?P<store> \(event store\))?: skipped \((?P<why>.*)\)$")
OPT_EVENTS = re.compile(r"(?P<eb>\d+) -> (?P<ea>\d+) event\(s\)")


def parse_optimize(stdout: str) -> dict:
    """strata optimize's lines (docs/operations.md, "Upkeep"), by part: {"table": {...},
    "store": {...}} for the target and its event store; either may be missing (an event-store
    line is printed only by builds that compact event stores). Unknown lines are kept."""
    out: dict = {"unparsed": []}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        m = OPT_DONE.match(line) or OPT_NOTHING.match(line) or OPT_SKIPPED.match(line)
        if not m or not m.group("table").endswith(TARGET):
            out["unparsed"].append(line)
            continue
        part = "store" if m.group("store") else "table"
        d = {"line": line}
        g = m.groupdict()
        if "why" in g:
            d["skipped"] = g["why"]
        else:
            d["files_before"] = int(g["fb"])
            if g.get("fa") is not None:
                d.update(files_after=int(g["fa"]), mib_before=float(g["mb"]),
                         mib_after=float(g["ma"]), version=int(g["version"]),
                         seconds=float(g["secs"]))
                ev = OPT_EVENTS.search(g["rest"])
                if ev:
                    d.update(events_before=int(ev.group("eb")), events_after=int(ev.group("ea")))
            else:
                d["files_after"] = d["files_before"]
        out[part] = d
    return out


# --------------------------------------------------------------------------- Delta logs (deltalake)

def delta_stats(path: Path) -> dict | None:
    """Live files, bytes, files with a deletion vector, version and record count (from the
    files' statistics) of the Delta table at PATH; None if there is none."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    if not (path / "_delta_log").is_dir():
        return None
    dt = DeltaTable(str(path))
    acts = pa.table(dt.get_add_actions(flatten=True))
    cols = acts.column_names

    def total(c):
        return int(pc.sum(acts.column(c)).as_py() or 0) if c in cols and acts.num_rows else 0

    # deltalake's add actions leave out the deletion vectors: those come from the log itself.
    live = live_files_dv(path)
    if len(live) != acts.num_rows:
        fail(f"{path}: deltalake lists {acts.num_rows} live file(s), the log replay {len(live)}")
    return {"files": acts.num_rows, "bytes": total("size_bytes"),
            "files_with_dv": sum(live.values()), "records": total("num_records"),
            "version": dt.version()}


def live_files_dv(table: Path) -> dict[tuple, bool]:
    """{(path, deletion vector id): has a deletion vector} of the live files (run.live_adds).
    A file is named by its path and deletion vector, as the Delta protocol does: a commit
    that changes a file's deletion vector removes (path, old) and adds (path, new)."""
    def key(action: dict) -> tuple:
        dv = action.get("deletionVector")
        if not dv:
            return (action["path"], None)
        return (action["path"], dv.get("storageType"), dv.get("pathOrInlineDv"), dv.get("offset"))

    return {k: bool(add.get("deletionVector")) for k, add in R().live_adds(table, key).items()}


def tree_listing(path: Path) -> dict:
    """{relative path: size} of every file under PATH (to see that a copy's runs left the
    original alone)."""
    out = {}
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = Path(root) / f
            out[str(p.relative_to(path))] = p.stat().st_size
    return out


# --------------------------------------------------------------------------- DuckDB's delta_scan

def duckdb_ext_dir() -> Path:
    return BENCH_DIR / ".venv" / "duckdb_extensions"


def duckdb_delta_connect(install: bool = False):
    """A DuckDB connection with the delta extension loaded: from the pinned duckdb-ext-delta
    wheel (INSTALL '<file>'), else DuckDB's extension repository."""
    import duckdb

    con = duckdb.connect()
    ext = duckdb_ext_dir()
    ext.mkdir(parents=True, exist_ok=True)
    con.execute(f"SET extension_directory = {sql_str(ext)}")
    if install:
        hits = sorted((Path(p) for site in sys.path for p in
                       Path(site).glob(f"duckdb_ext/extensions/v{duckdb.__version__}/*/delta.duckdb_extension")))
        con.execute(f"INSTALL {sql_str(hits[0])}" if hits else "INSTALL delta")
    con.execute("LOAD delta")
    return con


def _duckdb_scan_child(path: str) -> None:
    """Child process: the full-scan query over delta_scan(PATH); prints its result and time
    (the query alone: connecting and loading the extension are not counted)."""
    con = duckdb_delta_connect()
    t0 = time.perf_counter()
    cur = con.execute(SCAN_SQL.format(table=f"delta_scan({sql_str(path)})"))
    row = cur.fetchone()
    secs = time.perf_counter() - t0
    names = [d[0] for d in cur.description]
    print(json.dumps({"seconds": secs, "result": {k: (int(v) if v is not None else None)
                                                   for k, v in zip(names, row)}}))


def duckdb_scan(path: Path) -> tuple[dict, float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "_duckdb_scan", str(path)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"$ {shlex.join(cmd)}\nexit {r.returncode}\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return out["result"], out["seconds"]


def fingerprint(path: Path) -> tuple[int, str]:
    con = duckdb_delta_connect()
    n, h = con.execute(FINGERPRINT_SQL.format(path=sql_str(path))).fetchone()
    con.close()
    return int(n), str(h)


# --------------------------------------------------------------------------- deltalake compact

def _compact_child(path: str, target_size: str) -> None:
    """Child process: DeltaTable(PATH).optimize.compact(); prints its metrics and time."""
    from deltalake import DeltaTable

    t0 = time.perf_counter()
    dt = DeltaTable(path)
    kw = {"target_size": int(target_size)} if target_size != "-" else {}
    metrics = dt.optimize.compact(**kw)
    secs = time.perf_counter() - t0
    print(json.dumps({"seconds": secs, "metrics": metrics, "version": dt.version()}, default=str))


# --------------------------------------------------------------------------- the benchmark

def scan_all(cli: StrataCli, whs: dict[str, Path], rounds: int, stage: str, reference: dict) -> dict:
    """The full-scan query on each side's warehouse through strata query and DuckDB, ROUNDS
    times, the sides interleaved; every result must equal REFERENCE (set by the first one)."""
    times = {side: {"strata_query": [], "duckdb": []} for side in whs}
    for _ in range(rounds):
        for reader in ("strata_query", "duckdb"):
            for side, wh in whs.items():
                try:
                    if reader == "strata_query":
                        rows, secs = cli.query_json(wh, SCAN_SQL.format(table=TARGET))
                        res = {k: (int(v) if v is not None else None) for k, v in rows[0].items()}
                    else:
                        res, secs = duckdb_scan(target_path(wh))
                except RuntimeError as e:
                    fail(f"full-scan query failed ({stage}, {side}, {reader}):\n{e}")
                    continue
                times[side][reader].append(secs)
                if not reference:
                    reference.update(res)
                elif res != reference:
                    fail(f"full-scan aggregate differs ({stage}, {side}, {reader}): {res} "
                         f"!= {reference}")
    return {side: {reader: {"median": statistics.median(ts) if ts else None, "all": ts}
                   for reader, ts in t.items()} for side, t in times.items()}


def next_batch(cli: StrataCli, wh: Path, label: str) -> tuple[dict, Path]:
    """The next batch's `strata run` on a fresh copy of WH (WH itself stays as it is)."""
    dst = wh.parent / f"{wh.name}-next"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(wh, dst)
    r = cli.run(dst, label)
    return r, dst


def check_bronze(cli: StrataCli, wh: Path, expected: int, label: str) -> None:
    try:
        rows, _ = cli.query_json(wh, "SELECT count(*) AS n FROM events_raw")
        n = int(rows[0]["n"])
    except (RuntimeError, KeyError, IndexError) as e:
        fail(f"cannot count events_raw ({label}): {e}")
        return
    if n != expected:
        fail(f"events_raw holds {n:,} rows ({label}), expected every generated event once: "
             f"{expected:,}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--small", action="store_true",
                    help="20k events over 2k keys, 5 batches: a correctness check, no timings printed")
    ap.add_argument("--strata", default=None,
                    help="strata binary (default as run.py: $STRATA_BIN, else "
                         "$CARGO_TARGET_DIR or target/, release/strata)")
    ap.add_argument("--events", type=int, help="events in the base table (default 10000000)")
    ap.add_argument("--keys", type=int, help="keys in the base table (default 1000000)")
    ap.add_argument("--files", type=int, help="files the base events are split into (default 10)")
    ap.add_argument("--batches", type=int, help="incremental batches before the optimize (default 100)")
    ap.add_argument("--batch-events", type=int,
                    help="events per batch (default: 1%% of --events, as run.py's 100k on 10M)")
    ap.add_argument("--batch-keys-pct", type=float, default=1.0,
                    help="percent of the keys each batch touches (default 1)")
    ap.add_argument("--target-size-mib", type=int,
                    help="file size both sides compact to (default: each side's own default, "
                         "the table's delta.targetFileSize, else 100 MiB)")
    dv = ap.add_mutually_exclusive_group()
    dv.add_argument("--deletion-vectors", dest="deletion_vectors", action="store_true", default=None,
                    help="spell out 'delta.enableDeletionVectors' = 'true' on the target (the default)")
    dv.add_argument("--no-deletion-vectors", dest="deletion_vectors", action="store_false",
                    default=None, help="a copy-on-write target ('delta.enableDeletionVectors' = 'false')")
    ap.add_argument("--rounds", type=int,
                    help="rounds of each full-scan query, median reported (default 3; --small: 1)")
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
    for k in ("events", "keys", "files", "batches", "rounds"):
        if getattr(a, k) is None:
            setattr(a, k, preset[k])
    if a.batch_events is None:
        a.batch_events = max(1, a.events // 100)
    a.threads = None
    show_times = not a.small
    strata_bin = a.strata or run.default_strata()
    run.Strata(strata_bin).check()
    duckdb_delta_connect(install=True).close()  # once; the children only LOAD it
    a.workdir.mkdir(parents=True, exist_ok=True)
    a.workdir = a.workdir.resolve()
    t_start = time.monotonic()
    log(f"$ {shlex.join([sys.executable, *sys.argv])}")
    log(f"\n=== upkeep: SCD2 target from {a.events:,} events over {a.keys:,} keys, then "
        f"{a.batches} batches of {a.batch_events:,} events over {a.batch_keys_pct:g}% of keys; "
        f"strata optimize against deltalake compact ===")

    # 1. The workload, the base run and the batches, on one warehouse.
    wl, st = run.prepare_workload(f"upkeep-e{a.events}-k{a.keys}-f{a.files}-s{a.seed}",
                                  a.workdir, a.events, a.keys, a.files, a)
    for old in wl.glob("wh-*"):
        shutil.rmtree(old)
    wh = wl / "warehouse"
    cli = StrataCli(strata_bin, wl)
    res: dict = {"benchmark": "upkeep", "small": a.small, "params": {
        k: getattr(a, k) for k in ("events", "keys", "files", "batches", "batch_events",
                                   "batch_keys_pct", "target_size_mib", "deletion_vectors",
                                   "rounds", "noop_share", "delete_share", "late_share", "seed")},
        "dir": str(wl), "strata_bin": strata_bin, "strata_version": run.Strata(strata_bin).version(),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}", "generator": st}
    base = cli.run(wh, "base")
    res["base_run"] = {k: base[k] for k in ("rc", "seconds", "maxrss_kib", "cmd")}
    if base["rc"] != 0:
        return finish(res, a)
    events_total = a.events
    batch_secs, gen_secs = [], 0.0
    gen_cmd = (f"python3 {BENCH_DIR / 'gen.py'} batch --out {wl} --events {a.batch_events} "
               f"--keys-pct {a.batch_keys_pct:g} --noop-share {a.noop_share} "
               f"--delete-share {a.delete_share} --late-share {a.late_share} --seed {a.seed}")
    log(f"batches: {gen_cmd}, then strata run, {a.batches} times")
    t_batches = time.monotonic()
    for b in range(1, a.batches + 1):
        t0 = time.perf_counter()
        gen.gen_batch(wl, a.batch_events, a.batch_keys_pct, a.noop_share, a.delete_share,
                      a.late_share, a.seed, stats=False)
        gen_secs += time.perf_counter() - t0
        events_total += a.batch_events
        r = cli.run(wh, f"batch{b}", quiet=b > 1)
        if r["rc"] != 0:
            return finish(res, a)
        batch_secs.append(r["seconds"])
        if b % 10 == 0 or b == a.batches:
            last = batch_secs[-10:]
            log(f"  batch {b}/{a.batches} done, elapsed {hms(time.monotonic() - t_batches)}"
                + (f" (last {len(last)} runs: median {statistics.median(last):.2f} s; "
                   f"generating so far {gen_secs:.0f} s)" if show_times else ""))
    res["batches"] = {"seconds": batch_secs, "generate_seconds": gen_secs}

    # 2. The next batch's file (run later on throwaway copies), and the two copies.
    nb = gen.gen_batch(wl, a.batch_events, a.batch_keys_pct, a.noop_share, a.delete_share,
                       a.late_share, a.seed, stats=True)
    events_next = events_total + a.batch_events
    res["next_batch_generator"] = {k: nb.get(k) for k in ("events", "keys_touched", "kinds", "late_events")}
    log(f"next batch generated (not run yet): {nb['events']:,} events over "
        f"{nb['keys_touched']:,} keys, {nb['late_events']:,} late")
    orig_listing = tree_listing(wh)
    whs = {side: wl / f"wh-{side}" for side in SIDES}
    for side, dst in whs.items():
        t0 = time.perf_counter()
        shutil.copytree(wh, dst)
        log(f"copied {wh} -> {dst}" + (f" ({time.perf_counter() - t0:.1f} s)" if show_times else ""))

    # 3. Before.
    log("\n--- before ---")
    sides = {side: {} for side in SIDES}
    for side, w in whs.items():
        sides[side]["table_before"] = delta_stats(target_path(w))
        sides[side]["store_before"] = delta_stats(store_path(w))
    if sides["strata"]["table_before"] != sides["deltalake"]["table_before"]:
        fail("the two copies differ before the optimize (Delta logs of the target)")
    fp_before = fingerprint(target_path(wh))
    log(f"target: {fp_before[0]:,} rows; {describe(sides['strata']['table_before'])}; "
        f"event store: {describe(sides['strata']['store_before'])}")
    scan_ref: dict = {}
    scan_before = scan_all(cli, whs, a.rounds, "before", scan_ref)
    res["scan_result"] = scan_ref
    if scan_ref and scan_ref.get("n_rows") != fp_before[0]:
        fail(f"strata query counts {scan_ref.get('n_rows')} rows, DuckDB {fp_before[0]}")
    log("next batch on a copy of the un-optimized warehouse:")
    nb_before, nb_before_wh = next_batch(cli, wh, "next-before")
    if nb_before["rc"] != 0:
        return finish(res, a)
    fp_next = fingerprint(target_path(nb_before_wh))
    check_bronze(cli, nb_before_wh, events_next, "next batch, un-optimized copy")
    cli.validate(nb_before_wh, "next batch, un-optimized copy")
    shutil.rmtree(nb_before_wh)
    res["next_batch_before"] = {k: nb_before[k] for k in ("rc", "seconds", "maxrss_kib", "cmd")}

    # 4. Optimize each copy.
    log("\n--- optimize ---")
    size_args = [] if a.target_size_mib is None else ["--target-size-mib", str(a.target_size_mib)]
    opt = cli.timed(["optimize", TARGET, "--warehouse", str(whs["strata"]), *size_args], "optimize-strata")
    parsed = parse_optimize(opt["stdout"])
    for line in opt["stdout"].splitlines():
        log(f"     | {line}")
    sides["strata"]["optimize"] = {k: opt[k] for k in ("rc", "seconds", "maxrss_kib", "cmd")}
    sides["strata"]["optimize"]["output"] = parsed
    if opt["rc"] == 0 and "table" not in parsed:
        fail(f"no line for default.{TARGET} in strata optimize's output:\n{opt['stdout']}")
    if "store" not in parsed:
        log("  (no event-store line: this build of strata optimize does not compact event stores)")
    cmd = [sys.executable, str(Path(__file__).resolve()), "_compact", str(target_path(whs["deltalake"])),
           "-" if a.target_size_mib is None else str(a.target_size_mib << 20)]
    log(f"$ {shlex.join(cmd)}   # DeltaTable(path).optimize.compact()")
    dl = run.timed(cmd, cli.logs / "optimize-deltalake.stdout", cli.logs / "optimize-deltalake.stderr")
    dl["cmd"] = shlex.join(cmd)
    sides["deltalake"]["optimize"] = {k: dl[k] for k in ("rc", "seconds", "maxrss_kib", "cmd")}
    if dl["rc"] != 0:
        fail(f"deltalake compact failed: exit {dl['rc']}\n"
             f"{run.tail(cli.logs / 'optimize-deltalake.stderr')}")
    else:
        inner = json.loads((cli.logs / "optimize-deltalake.stdout").read_text().strip().splitlines()[-1])
        sides["deltalake"]["optimize"].update(inner_seconds=inner["seconds"], metrics=inner["metrics"])
        m = inner["metrics"]
        log(f"     | files removed {m.get('numFilesRemoved')}, added {m.get('numFilesAdded')}, "
            f"version {inner['version']}")

    # 5. After.
    log("\n--- after ---")
    for side, w in whs.items():
        s = sides[side]
        s["table_after"] = delta_stats(target_path(w))
        s["store_after"] = delta_stats(store_path(w))
        log(f"{side}: target {describe(s['table_before'])} -> {describe(s['table_after'])}; "
            f"event store {describe(s['store_before'])} -> {describe(s['store_after'])}")
        fp = fingerprint(target_path(w))
        if fp != fp_before:
            fail(f"{side}: the target's rows changed in the optimize: {fp[0]:,} rows, hash {fp[1]} "
                 f"(before: {fp_before[0]:,} rows, hash {fp_before[1]})")
        cli.validate(w, f"{side} after the optimize")
    check_optimize_lines(parsed, sides["strata"])
    scan_after = scan_all(cli, whs, a.rounds, "after", scan_ref)
    for side, w in whs.items():
        log(f"next batch on a copy of the {side}-compacted warehouse:")
        r, dst = next_batch(cli, w, f"next-{side}")
        sides[side]["next_batch"] = {k: r[k] for k in ("rc", "seconds", "maxrss_kib", "cmd")}
        if r["rc"] != 0:
            continue
        fp = fingerprint(target_path(dst))
        if fp != fp_next:
            fail(f"{side}: the next batch gives other rows than on the un-optimized copy: "
                 f"{fp[0]:,} rows, hash {fp[1]} (un-optimized: {fp_next[0]:,} rows, hash {fp_next[1]})")
        check_bronze(cli, dst, events_next, f"next batch, {side} copy")
        cli.validate(dst, f"next batch, {side} copy")
        shutil.rmtree(dst)
    if tree_listing(wh) != orig_listing:
        fail(f"the original warehouse {wh} changed while its copies ran")
    for side in SIDES:
        sides[side]["scan_before"] = scan_before[side]
        sides[side]["scan_after"] = scan_after[side]
    res["sides"] = sides
    res["checks"] = {"rows_before": fp_before[0], "rows_after_next_batch": fp_next[0],
                     "events_total": events_next}
    report(res, show_times)
    return finish(res, a)


def describe(s: dict | None) -> str:
    if s is None:
        return "no Delta table"
    dv = f", {s['files_with_dv']} with a deletion vector" if s["files_with_dv"] else ""
    return f"{s['files']} file(s), {s['bytes'] / 2**20:.2f} MiB{dv}"


def check_optimize_lines(parsed: dict, side: dict) -> None:
    """strata optimize's printed file counts against the Delta logs."""
    for part, key in (("table", "table"), ("store", "store")):
        line = parsed.get(part)
        before, after = side.get(f"{key}_before"), side.get(f"{key}_after")
        if not line or "skipped" in line or before is None or after is None:
            continue
        if line["files_before"] != before["files"] or line["files_after"] != after["files"]:
            fail(f"strata optimize says {part} {line['files_before']} -> {line['files_after']} "
                 f"file(s); the Delta log says {before['files']} -> {after['files']}:\n  {line['line']}")
        if "events_before" in line:
            # An SCD2 target's store keeps every event (no tombstone is forgotten).
            stats = [x["records"] for x in (before, after) if x["records"] and not x["files_with_dv"]]
            if line["events_before"] != line["events_after"] or any(
                    n != line["events_before"] for n in stats):
                fail(f"event store: strata optimize says {line['events_before']} -> "
                     f"{line['events_after']} event(s); the files' statistics say "
                     f"{before['records']} -> {after['records']}:\n  {line['line']}")


# --------------------------------------------------------------------------- report

def report(res: dict, show_times: bool) -> None:
    s = res["sides"]
    p = res["params"]
    log("\n" + "=" * 100)
    log("REPORT")
    log(f"machine: {res['machine']}; strata {res['strata_version']} ({res['strata_bin']})")
    log(f"workload: {p['events']:,} events over {p['keys']:,} keys in {p['files']} files, then "
        f"{p['batches']} batches of {p['batch_events']:,} events over {p['batch_keys_pct']:g}% of "
        f"keys; target: {res['checks']['rows_before']:,} rows")
    if show_times:
        bs = res["batches"]["seconds"]
        log(f"build: base run {res['base_run']['seconds']:.2f} s; batches: first "
            f"{bs[0]:.2f} s, median {statistics.median(bs):.2f} s, last {bs[-1]:.2f} s")

    def files(side, part, when):
        st = s[side].get(f"{part}_{when}")
        if st is None:
            return "n/a"
        return f"{st['files']} ({st['bytes'] / 2**20:.1f} MiB, {st['files_with_dv']} DV)"

    def num(x, unit=" s"):
        return "n/a" if x is None else f"{x:.2f}{unit}"

    def mem(k):
        return R().fmt_mem(k)

    def ratio(x, y):
        return f"{x / y:.2f}x" if x and y else "n/a"

    def med(side, when, reader):
        return s[side][f"scan_{when}"][reader]["median"]

    rows = []  # (label, strata, deltalake, ratio)
    for part, name in (("table", "target"), ("store", "event store")):
        rows.append((f"{name} files before", files("strata", part, "before"),
                     files("deltalake", part, "before"), ""))
        fa = [s[x].get(f"{part}_after") for x in SIDES]
        rows.append((f"{name} files after", files("strata", part, "after"),
                     files("deltalake", part, "after"),
                     ratio(fa[0]["files"], fa[1]["files"]) if all(fa) else "n/a"))
    if show_times:
        o = [s[x]["optimize"] for x in SIDES]
        rows.append(("optimize time (process)", num(o[0]["seconds"]), num(o[1]["seconds"]),
                     ratio(o[0]["seconds"], o[1]["seconds"])))
        parsed = o[0].get("output", {})
        parts = [f"{k} {parsed[k]['seconds']:.2f} s" for k in ("table", "store")
                 if k in parsed and "seconds" in parsed[k]]
        rows.append(("  as printed / in-process", ", ".join(parts) or "n/a",
                     num(o[1].get("inner_seconds")), ""))
        rows.append(("optimize peak RSS", mem(o[0]["maxrss_kib"]), mem(o[1]["maxrss_kib"]),
                     ratio(o[0]["maxrss_kib"], o[1]["maxrss_kib"])))
        for reader, title in (("strata_query", "strata query"), ("duckdb", "DuckDB delta_scan")):
            for when in ("before", "after"):
                rows.append((f"full scan, {title}, {when}", num(med("strata", when, reader)),
                             num(med("deltalake", when, reader)),
                             ratio(med("strata", when, reader), med("deltalake", when, reader))))
        nb_before = res["next_batch_before"]["seconds"]
        rows.append(("next batch, before", num(nb_before), num(nb_before), "(same run)"))
        nba = [s[x].get("next_batch", {}).get("seconds") for x in SIDES]
        rows.append(("next batch, after", num(nba[0]), num(nba[1]), ratio(nba[0], nba[1])))
        rss_before = mem(res["next_batch_before"]["maxrss_kib"])
        rows.append(("next batch peak RSS, before", rss_before, rss_before, "(same run)"))
        rows.append(("next batch peak RSS, after", mem(s["strata"]["next_batch"].get("maxrss_kib")),
                     mem(s["deltalake"]["next_batch"].get("maxrss_kib")), ""))
    w0 = max(len(r[0]) for r in rows) + 2
    w1 = max(len(r[1]) for r in rows + [("", SIDE_TITLE["strata"])]) + 2
    w2 = max(len(r[2]) for r in rows + [("", "", SIDE_TITLE["deltalake"])]) + 2
    log("")
    log(f"{'':<{w0}}{SIDE_TITLE['strata']:<{w1}}{SIDE_TITLE['deltalake']:<{w2}}strata/deltalake")
    for r in rows:
        log(f"{r[0]:<{w0}}{r[1]:<{w1}}{r[2]:<{w2}}{r[3]}")
    if show_times:
        log(f"(full scans: median of {p['rounds']} on each copy; before the optimize both copies "
            "are the same table, so their ratio shows the run-to-run noise; strata query is the "
            "whole process, DuckDB the query in a fresh process after loading the extension. "
            "Next batch: one run each, on a copy; 'before' is one run on the un-optimized "
            "warehouse)")
    else:
        log("(--small: a correctness check; timings of such runs are not reported)")
    log("=" * 100)


def finish(res: dict, a) -> int:
    res["failures"] = FAILURES
    out = a.json or (a.workdir / f"upkeep-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return R().finish(res, out, FAILURES)

if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_duckdb_scan":
        _duckdb_scan_child(sys.argv[2])
        sys.exit(0)
    if len(sys.argv) >= 4 and sys.argv[1] == "_compact":
        _compact_child(sys.argv[2], sys.argv[3])
        sys.exit(0)
    ensure_venv()
    sys.exit(main())
