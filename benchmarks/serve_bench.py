#!/usr/bin/env python3
"""Serving under load: 16 PostgreSQL clients against `strata serve --pg` while `strata run
--continuous` commits new batches into the same warehouse, against DuckDB answering the same
queries through its delta extension (issue 36).

    python3 benchmarks/serve_bench.py --strata target/release/strata     # 1M events, 60 s per side
    python3 benchmarks/serve_bench.py --small --strata target/debug/strata   # correctness only

1. The workload of run.py (gen.py: --events events over --keys keys in --files files, late
   events included) and run.py's pipeline (read_files -> AUTO CDC INTO target ... STORED AS
   SCD TYPE 2); one `strata run` builds the SCD2 target.
2. `strata run --continuous --interval 1s` on the same pipeline, and a feeder thread writing
   one more batch file (gen.py batch: --batch-events events over 1% of the keys, late events
   included) every --batch-every seconds into the input folder, for the whole benchmark.
3. `strata serve --pg 127.0.0.1:0` on the warehouse (a random password through
   STRATA_SERVE_PASSWORD, never printed; --max-queries at its default of 16).
4. strata's side: a child process runs --clients threads, one psycopg connection each, for
   --seconds. Each query is a prepared statement with bound parameters, half of them (by
   --as-of-share) a lookup of a random key's current version
       SELECT id, name, city, amount, "__START_AT" FROM target WHERE id = $1 AND "__END_AT" IS NULL
   and the others the version valid at a random time of the base data
       SELECT id, name, city, amount, "__START_AT" FROM as_of('target', $1) WHERE id = $2
   Every answer is checked (at most one row, of the key asked for); a wrong answer counts as
   an error. Latency is measured per query in the client (execute and fetch).
5. DuckDB's side, right after, the feeder and the continuous run still going: a child
   process with one DuckDB connection (the delta extension from the pinned duckdb-ext-delta
   wheel) and --clients threads, one cursor each, running the same two queries through
   `delta_scan('<warehouse>/default/target')` (the as_of one as its definition:
   "__START_AT" <= t AND ("__END_AT" IS NULL OR t < "__END_AT")), prepared with bound
   parameters, for --seconds.
6. Then the feeder stops, the continuous run is stopped with SIGTERM (it must exit 0) and one
   triggered `strata run` takes what is left. Checks (exit 1 on any failure): no client
   error on either side; the target equals DuckDB's SCD2 fold (duckdb_scd2.sql, as run.py
   compares) of every file generated, and `strata validate target` passes; the bronze table
   holds every generated event once; and --sample lookups of both kinds (random keys and
   times) give the same rows through the server, through DuckDB's delta_scan and from the
   DuckDB fold, on that final version.

Reported per side: queries per second, p50 / p99 latency (all queries, and per kind),
errors, peak RSS (VmHWM in /proc/PID/status: of the `strata serve` process; of DuckDB's
process, a Python interpreter holding DuckDB), the batches committed meanwhile; and the
ratios strata/DuckDB. --small (20k events over 2k keys, 5 s per side) is a correctness
check and prints no timings; benchmarks/selftest.sh runs it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from _venv import ensure_venv  # noqa: E402
from _bench import FAILURES, R, fail, log, sql_str  # noqa: E402

SMALL = dict(events=20_000, keys=2_000, files=2, seconds=5, batch_events=200, batch_every=1.0,
             sample=100)
FULL = dict(events=1_000_000, keys=100_000, files=4, seconds=60, batch_events=10_000,
            batch_every=5.0, sample=400)
TARGET = "target"  # run.PIPELINE's SCD2 target, default.target
COLS = 'id, name, city, amount, "__START_AT"'
# strata serve (PostgreSQL wire protocol, psycopg's %s placeholders become $1, $2).
PG_CURRENT = f'SELECT {COLS} FROM {TARGET} WHERE id = %s AND "__END_AT" IS NULL'
PG_AS_OF = f"SELECT {COLS} FROM as_of('{TARGET}', %s) WHERE id = %s"
# DuckDB over the same Delta table; {table} is delta_scan('<path>') or a parquet file.
DUCK_CURRENT = 'SELECT ' + COLS + ' FROM {table} WHERE id = ? AND "__END_AT" IS NULL'
DUCK_AS_OF = ('SELECT ' + COLS + ' FROM {table} WHERE id = ? AND "__START_AT" <= ? '
              'AND ("__END_AT" IS NULL OR ? < "__END_AT")')
SIDES = ("strata", "duckdb")
SIDE_TITLE = {"strata": "strata serve --pg", "duckdb": "DuckDB delta_scan"}


def vm_hwm_kib(pid: int | str = "self") -> int | None:
    """Peak resident set size (VmHWM) of a running process, in KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def percentile(sorted_xs: list[float], p: float) -> float | None:
    """The nearest-rank P-th percentile of an ascending list."""
    if not sorted_xs:
        return None
    k = max(0, min(len(sorted_xs) - 1, math.ceil(p / 100.0 * len(sorted_xs)) - 1))
    return sorted_xs[k]


def table_version(table: Path) -> int:
    """The latest commit version of a Delta table, from its log's file names."""
    versions = [int(p.stem) for p in (table / "_delta_log").glob("*.json") if p.stem.isdigit()]
    return max(versions, default=-1)


# --------------------------------------------------------------------------- the query mix

def query_plan(rng: random.Random, keys: int, max_t: int, as_of_share: float) -> tuple[str, int, int]:
    """One query of the mix: (kind, key, time); time is used by as_of lookups only."""
    kind = "as_of" if rng.random() < as_of_share else "current"
    return kind, rng.randrange(keys), rng.randint(1, max_t)


def check_answer(rows: list, key: int) -> str | None:
    """What is wrong with a lookup's answer (at most one version of the key asked for)."""
    if len(rows) > 1:
        return f"{len(rows)} rows for key {key}: {rows[:3]}"
    if rows and rows[0][0] != key:
        return f"a row of key {rows[0][0]} for key {key}"
    return None


class PgExecutor:
    """One psycopg connection; prepared statements with bound parameters."""

    def __init__(self, spec: dict):
        import psycopg

        self.con = psycopg.connect(host="127.0.0.1", port=spec["port"], user="strata",
                                   password=os.environ["STRATA_SERVE_PASSWORD"], dbname="main",
                                   autocommit=True)
        self.cur = self.con.cursor()

    def __call__(self, kind: str, key: int, t: int) -> list:
        if kind == "current":
            self.cur.execute(PG_CURRENT, (key,), prepare=True)
        else:
            self.cur.execute(PG_AS_OF, (t, key), prepare=True)
        return [tuple(r) for r in self.cur.fetchall()]

    def close(self) -> None:
        self.con.close()


class DuckExecutor:
    """One cursor of a shared DuckDB connection; prepared statements over TABLE."""

    def __init__(self, con, table: str):
        self.cur = con.cursor()
        self.current = DUCK_CURRENT.format(table=table)
        self.as_of = DUCK_AS_OF.format(table=table)

    def __call__(self, kind: str, key: int, t: int) -> list:
        if kind == "current":
            return [tuple(r) for r in self.cur.execute(self.current, [key]).fetchall()]
        return [tuple(r) for r in self.cur.execute(self.as_of, [key, t, t]).fetchall()]

    def close(self) -> None:
        self.cur.close()


def client_loop(make, spec: dict, idx: int, start: threading.Barrier, out: dict) -> None:
    """One client: queries until the deadline; latencies per kind, errors with a sample."""
    rng = random.Random(spec["seed"] * 1000 + idx)
    lat: dict[str, list[float]] = {"current": [], "as_of": []}
    errors: list[str] = []
    n_err = 0
    ex = None
    try:
        ex = make()
    except Exception as e:  # noqa: BLE001 - counted and reported
        n_err += 1
        errors.append(f"client {idx}: connect: {type(e).__name__}: {e}")
    start.wait()
    deadline = spec["deadline"]
    while ex is not None and time.monotonic() < deadline:
        kind, key, t = query_plan(rng, spec["keys"], spec["max_t"], spec["as_of_share"])
        t0 = time.perf_counter()
        try:
            rows = ex(kind, key, t)
        except Exception as e:  # noqa: BLE001 - counted and reported
            n_err += 1
            if len(errors) < 5:
                errors.append(f"client {idx}: {kind} key {key}: {type(e).__name__}: {e}")
            continue
        lat[kind].append(time.perf_counter() - t0)
        wrong = check_answer(rows, key)
        if wrong:
            n_err += 1
            if len(errors) < 5:
                errors.append(f"client {idx}: {kind} key {key} t {t}: wrong answer: {wrong}")
    if ex is not None:
        ex.close()
    out[idx] = {"lat": lat, "errors": n_err, "error_samples": errors}


def _clients_child(spec_path: str) -> None:
    """Child process: --clients threads against strata serve (kind pg) or DuckDB (kind
    duckdb) for the given seconds; prints a JSON summary (latency percentiles, errors, VmHWM)."""
    spec = json.loads(Path(spec_path).read_text())
    if spec["kind"] == "pg":
        def make():
            return PgExecutor(spec)
    else:
        con = duckdb_delta_connect()
        table = f"delta_scan({sql_str(spec['table'])})"

        def make():
            return DuckExecutor(con, table)
    n = spec["clients"]
    start = threading.Barrier(n + 1)
    out: dict = {}
    threads = [threading.Thread(target=client_loop, args=(make, spec, i, start, out)) for i in range(n)]
    for th in threads:
        th.start()
    # The clients read the deadline when the barrier releases them (all connected).
    spec["deadline"] = time.monotonic() + spec["seconds"]
    start.wait()
    start_t = time.monotonic()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - start_t
    print(json.dumps(summarize(out, elapsed, vm_hwm_kib())))


def summarize(out: dict, elapsed: float, hwm: int | None) -> dict:
    every: list[float] = []
    kinds = {}
    for kind in ("current", "as_of"):
        xs = sorted(x for c in out.values() for x in c["lat"][kind])
        every.extend(xs)
        kinds[kind] = {"queries": len(xs), "p50_ms": ms(percentile(xs, 50)),
                       "p99_ms": ms(percentile(xs, 99))}
    every.sort()
    return {"seconds": elapsed, "queries": len(every), "qps": len(every) / elapsed if elapsed else None,
            "p50_ms": ms(percentile(every, 50)), "p99_ms": ms(percentile(every, 99)),
            "kinds": kinds, "errors": sum(c["errors"] for c in out.values()),
            "error_samples": [e for c in out.values() for e in c["error_samples"]][:10],
            "client_vmhwm_kib": hwm}


def ms(secs: float | None) -> float | None:
    return None if secs is None else secs * 1000.0


# --------------------------------------------------------------------------- DuckDB's delta extension

def duckdb_delta_connect(install: bool = False):
    """A DuckDB connection with the delta extension loaded (upkeep_bench.py's way: the pinned
    duckdb-ext-delta wheel installed with INSTALL '<file>', else DuckDB's repository)."""
    import upkeep_bench

    return upkeep_bench.duckdb_delta_connect(install)


# --------------------------------------------------------------------------- processes

class Feeder(threading.Thread):
    """Writes one batch file into the workload's input folder every EVERY seconds."""

    def __init__(self, wl: Path, a):
        super().__init__(daemon=True)
        self.wl, self.a = wl, a
        self.stop = threading.Event()
        self.batches = 0
        self.error: str | None = None

    def run(self) -> None:
        import gen

        while not self.stop.wait(self.a.batch_every):
            try:
                gen.gen_batch(self.wl, self.a.batch_events, 1.0, self.a.noop_share,
                              self.a.delete_share, self.a.late_share, self.a.seed, threads=1,
                              stats=False)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                self.error = f"{type(e).__name__}: {e}"
                return
            self.batches += 1


def start_server(strata_bin: str, wh: Path, logs: Path, env: dict) -> tuple[subprocess.Popen, int]:
    """`strata serve --pg 127.0.0.1:0`; the port from the line it prints when it listens."""
    cmd = [strata_bin, "serve", "--warehouse", str(wh), "--pg", "127.0.0.1:0"]
    log(f"$ STRATA_SERVE_PASSWORD=... {shlex.join(cmd)}")
    out = open(logs / "serve.stdout", "wb")
    err = open(logs / "serve.stderr", "wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = "\n".join((logs / f"serve.{x}").read_text(errors="replace") for x in ("stdout", "stderr"))
        for line in text.splitlines():
            if "PostgreSQL clients on 127.0.0.1:" in line:
                port = int(line.split("PostgreSQL clients on 127.0.0.1:")[1].split()[0])
                log(f"  -> listening on port {port}")
                return proc, port
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"strata serve did not start listening (exit {proc.poll()}):\n"
                     f"{R().tail(logs / 'serve.stderr')}")


def stop(proc: subprocess.Popen, what: str, timeout: float = 120) -> int | None:
    """SIGTERM, then wait; a process that does not end is killed and recorded as a failure."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        fail(f"{what} did not stop within {timeout:.0f} s of SIGTERM (killed)")
        return None


def run_clients(kind: str, spec: dict, logs: Path, env: dict) -> dict:
    path = logs / f"clients-{kind}.json"
    path.write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), "_clients", str(path)]
    log(f"$ {shlex.join(cmd)}   # {spec['clients']} clients, {spec['seconds']} s")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    (logs / f"clients-{kind}.stderr").write_text(r.stderr)
    if r.returncode != 0:
        raise SystemExit(f"the {kind} clients failed: exit {r.returncode}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the benchmark

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--small", action="store_true",
                    help="20k events over 2k keys, 5 s per side: a correctness check, no timings printed")
    ap.add_argument("--strata", default=None,
                    help="strata binary (default as run.py: $STRATA_BIN, else "
                         "$CARGO_TARGET_DIR or target/, release/strata)")
    ap.add_argument("--events", type=int, help="events of the base table (default 1000000)")
    ap.add_argument("--keys", type=int, help="keys of the base table (default 100000)")
    ap.add_argument("--files", type=int, help="files the base events are split into (default 4)")
    ap.add_argument("--seconds", type=float, help="how long each side is queried (default 60)")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients per side (default 16)")
    ap.add_argument("--as-of-share", type=float, default=0.5,
                    help="share of as_of lookups in the mix, the rest current-version lookups (default 0.5)")
    ap.add_argument("--batch-events", type=int, help="events per fed batch (default 10000)")
    ap.add_argument("--batch-every", type=float, help="seconds between fed batches (default 5)")
    ap.add_argument("--interval", default="1s", help="strata run --continuous --interval (default 1s)")
    ap.add_argument("--sample", type=int, help="lookups compared on the final version (default 400)")
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
    for k in ("events", "keys", "files", "seconds", "batch_events", "batch_every", "sample"):
        if getattr(a, k) is None:
            setattr(a, k, preset[k])
    a.threads = None
    a.deletion_vectors = None  # strata's default target (deletion vectors on)
    show_times = not a.small
    strata_bin = a.strata or run.default_strata()
    strata = run.Strata(strata_bin)
    strata.check()
    duckdb_delta_connect(install=True).close()  # once; the children only LOAD it
    a.workdir.mkdir(parents=True, exist_ok=True)
    a.workdir = a.workdir.resolve()
    log(f"$ {shlex.join([sys.executable, *sys.argv])}")
    log(f"\n=== serve: {a.clients} clients x {a.seconds:g} s per side over an SCD2 target from "
        f"{a.events:,} events over {a.keys:,} keys, a batch of {a.batch_events:,} events every "
        f"{a.batch_every:g} s committed by strata run --continuous ===")

    # 1. The workload and the initial run.
    wl, st = run.prepare_workload(f"serve-e{a.events}-k{a.keys}-f{a.files}-s{a.seed}",
                                  a.workdir, a.events, a.keys, a.files, a)
    wh = wl / "warehouse"
    logs = wl / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    res: dict = {"benchmark": "serve", "small": a.small, "params": {
        k: getattr(a, k) for k in ("events", "keys", "files", "seconds", "clients", "as_of_share",
                                   "batch_events", "batch_every", "interval", "sample", "seed")},
        "dir": str(wl), "strata_bin": strata_bin, "strata_version": strata.version(),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}", "generator": st,
        "load_before": os.getloadavg()}
    initial = strata.run(wl, "initial")
    res["initial_run"] = {k: initial[k] for k in ("rc", "seconds", "maxrss_kib", "cmd")}
    if initial["rc"] != 0:
        return finish(res, a)
    max_t = max_seq(gen.existing_files(wl))
    target = wh / "default" / TARGET

    # 2. The continuous run and the feeder; 3. the server.
    env = dict(os.environ, STRATA_SERVE_PASSWORD=secrets.token_urlsafe(18))
    cont_cmd = [strata_bin, "run", str(wl / "pipeline.sql"), "--warehouse", str(wh),
                "--continuous", "--interval", a.interval]
    log(f"$ {shlex.join(cont_cmd)} &")
    cont = subprocess.Popen(cont_cmd, stdout=open(logs / "continuous.stdout", "wb"),
                            stderr=open(logs / "continuous.stderr", "wb"))
    feeder = Feeder(wl, a)
    feeder.start()
    log(f"feeder: python3 {BENCH_DIR / 'gen.py'} batch --out {wl} --events {a.batch_events} "
        f"--keys-pct 1 every {a.batch_every:g} s")
    sides: dict = {}
    server = None
    try:
        server, port = start_server(strata_bin, wh, logs, env)
        # 4. strata's side, 5. DuckDB's side, the batches going on.
        base = {"clients": a.clients, "seconds": a.seconds, "keys": a.keys, "max_t": max_t,
                "as_of_share": a.as_of_share, "seed": a.seed}
        for side in SIDES:
            b0, v0 = feeder.batches, table_version(target)
            load0 = os.getloadavg()
            if side == "strata":
                out = run_clients("pg", dict(base, kind="pg", port=port), logs, env)
                out["peak_rss_kib"] = vm_hwm_kib(server.pid)
                out["process"] = "strata serve"
            else:
                out = run_clients("duckdb", dict(base, kind="duckdb", table=str(target)), logs, env)
                out["peak_rss_kib"] = out["client_vmhwm_kib"]
                out["process"] = "the DuckDB client process (Python + DuckDB)"
            out["batches_fed"] = feeder.batches - b0
            out["target_commits"] = table_version(target) - v0
            out["loadavg_before"] = load0
            out["loadavg_after"] = os.getloadavg()
            sides[side] = out
            log_side(side, out, show_times)
            if out["errors"]:
                fail(f"{SIDE_TITLE[side]}: {out['errors']} error(s) under load:\n  "
                     + "\n  ".join(out["error_samples"]))
            if cont.poll() is not None:
                fail(f"strata run --continuous ended early (exit {cont.returncode}):\n"
                     f"{run.tail(logs / 'continuous.stderr')}")
                break
            if feeder.error:
                fail(f"the feeder failed: {feeder.error}")
                break
        res["sides"] = sides
        if not sides.get("strata", {}).get("target_commits") and "strata" in sides:
            fail("no batch was committed while strata's side was queried (the load had no writer)")

        # 6. Stop the writers, catch up, check the final version.
        feeder.stop.set()
        feeder.join()
        rc = stop(cont, "strata run --continuous")
        res["continuous_exit"] = rc
        if rc != 0:
            fail(f"strata run --continuous exited {rc} after SIGTERM:\n{run.tail(logs / 'continuous.stderr')}")
        last = strata.run(wl, "catch-up")
        if last["rc"] != 0:
            return finish(res, a)
        files = gen.existing_files(wl)
        events_total = a.events + feeder.batches * a.batch_events
        res["batches_fed"] = feeder.batches
        log(f"\n--- checks on the final version: {len(files)} files, {events_total:,} events ---")
        check_bronze(strata_bin, wh, events_total)
        duck = run.run_duckdb(wl, files, "final", None)
        cmp = run.compare(wl, strata, "final", "auto")
        res["final"] = {"rows_duckdb_fold": duck["rows"], "compare": cmp}
        if not cmp.get("match"):
            fail("the final target differs from DuckDB's fold of the same files (see above)")
        res["sample"] = check_sample(port, env, target, wl / "expected.parquet", a, max_t)
    finally:
        feeder.stop.set()
        if cont.poll() is None:
            stop(cont, "strata run --continuous")
        if server is not None:
            res["serve_exit"] = stop(server, "strata serve")
    if server is not None and res["serve_exit"] != 0:
        fail(f"strata serve exited {res['serve_exit']} after SIGTERM:\n{run.tail(logs / 'serve.stderr')}")
    res["load_after"] = os.getloadavg()
    if len(sides) == 2:
        report(res, show_times)
    return finish(res, a)


def max_seq(files: list[Path]) -> int:
    import duckdb

    flist = "[" + ", ".join(sql_str(f) for f in files) + "]"
    return int(duckdb.connect().execute(f"SELECT max(seq) FROM read_parquet({flist})").fetchone()[0])


def check_bronze(strata_bin: str, wh: Path, expected: int) -> None:
    cmd = [strata_bin, "query", "--warehouse", str(wh), "--format", "json",
           "SELECT count(*) AS n FROM events_raw"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"cannot count events_raw:\n$ {shlex.join(cmd)}\n{r.stderr[-2000:]}")
        return
    n = int(json.loads(r.stdout.strip().splitlines()[0])["n"])
    log(f"  events_raw: {n:,} rows (expected {expected:,})")
    if n != expected:
        fail(f"events_raw holds {n:,} rows, expected every generated event once: {expected:,}")


def check_sample(port: int, env: dict, target: Path, fold: Path, a, max_t: int) -> dict:
    """SAMPLE lookups of both kinds on the final version: strata serve, DuckDB's delta_scan
    and DuckDB's fold (expected.parquet) must give the same rows."""
    import duckdb

    rng = random.Random(a.seed + 7)
    queries = [query_plan(rng, a.keys, max_t, a.as_of_share) for _ in range(a.sample)]
    old = os.environ.get("STRATA_SERVE_PASSWORD")
    os.environ["STRATA_SERVE_PASSWORD"] = env["STRATA_SERVE_PASSWORD"]
    try:
        pg = PgExecutor({"port": port})
    finally:
        if old is None:
            os.environ.pop("STRATA_SERVE_PASSWORD", None)
        else:
            os.environ["STRATA_SERVE_PASSWORD"] = old
    con = duckdb_delta_connect()
    dscan = DuckExecutor(con, f"delta_scan({sql_str(target)})")
    dfold = DuckExecutor(duckdb.connect(), f"read_parquet({sql_str(fold)})")
    found = {"current": 0, "as_of": 0}
    mismatches = []
    for kind, key, t in queries:
        answers = {"strata serve": sorted(pg(kind, key, t)),
                   "DuckDB delta_scan": sorted(dscan(kind, key, t)),
                   "DuckDB fold": sorted(dfold(kind, key, t))}
        if len({repr(v) for v in answers.values()}) != 1:
            mismatches.append(f"{kind} key {key} t {t}: {answers}")
        found[kind] += bool(answers["DuckDB fold"])
    pg.close()
    log(f"  sample: {len(queries)} lookups ({found['current']} current and {found['as_of']} as_of "
        f"answers with a row), {len(mismatches)} mismatch(es) between strata serve, DuckDB "
        "delta_scan and DuckDB's fold")
    if mismatches:
        fail(f"{len(mismatches)} sample lookup(s) differ:\n  " + "\n  ".join(mismatches[:5]))
    if not found["current"] or not found["as_of"]:
        fail(f"the sample found no row for a kind of lookup ({found}): it checks nothing")
    return {"lookups": len(queries), "with_rows": found, "mismatches": len(mismatches)}


# --------------------------------------------------------------------------- report

def log_side(side: str, o: dict, show_times: bool) -> None:
    if show_times:
        log(f"  -> {SIDE_TITLE[side]}: {o['queries']:,} queries, {o['qps']:.0f} q/s, p50 "
            f"{o['p50_ms']:.1f} ms, p99 {o['p99_ms']:.1f} ms, {o['errors']} error(s), peak RSS "
            f"{R().fmt_mem(o['peak_rss_kib'])}; {o['batches_fed']} batches fed, "
            f"{o['target_commits']} target commits meanwhile")
    else:
        log(f"  -> {SIDE_TITLE[side]}: {o['queries']:,} queries ({o['kinds']['current']['queries']:,} "
            f"current, {o['kinds']['as_of']['queries']:,} as_of), {o['errors']} error(s); "
            f"{o['batches_fed']} batches fed, {o['target_commits']} target commits meanwhile")


def report(res: dict, show_times: bool) -> None:
    s = res["sides"]
    p = res["params"]
    log("\n" + "=" * 100)
    log("REPORT")
    log(f"machine: {res['machine']}; strata {res['strata_version']} ({res['strata_bin']})")
    log(f"workload: SCD2 target from {p['events']:,} events over {p['keys']:,} keys; "
        f"{p['clients']} clients x {p['seconds']:g} s per side, {p['as_of_share']:.0%} as_of "
        f"lookups; a batch of {p['batch_events']:,} events every {p['batch_every']:g} s "
        f"(strata run --continuous --interval {p['interval']}); {res['batches_fed']} batches in all")
    if not show_times:
        for side in SIDES:
            o = s[side]
            log(f"{SIDE_TITLE[side]}: {o['queries']:,} queries, {o['errors']} error(s)")
        log("(--small: a correctness check; timings of such runs are not reported)")
        log("=" * 100)
        return

    def num(x, fmt="{:.1f}"):
        return "n/a" if x is None else fmt.format(x)

    def ratio(x, y):
        return f"{x / y:.2f}x" if x and y else "n/a"

    rows = [("queries per second", num(s["strata"]["qps"], "{:.0f}"), num(s["duckdb"]["qps"], "{:.0f}"),
             ratio(s["strata"]["qps"], s["duckdb"]["qps"]))]
    for label, sub in (("all", None), ("current", "current"), ("as_of", "as_of")):
        for q in ("p50_ms", "p99_ms"):
            xs = [(s[x] if sub is None else s[x]["kinds"][sub])[q] for x in SIDES]
            rows.append((f"{q[:3]} latency ({label}), ms", num(xs[0]), num(xs[1]), ratio(xs[0], xs[1])))
    rows.append(("queries (current / as_of)",
                 *(f"{s[x]['kinds']['current']['queries']:,} / {s[x]['kinds']['as_of']['queries']:,}"
                   for x in SIDES), ""))
    rows.append(("errors", str(s["strata"]["errors"]), str(s["duckdb"]["errors"]), ""))
    rows.append(("peak RSS", R().fmt_mem(s["strata"]["peak_rss_kib"]),
                 R().fmt_mem(s["duckdb"]["peak_rss_kib"]),
                 ratio(s["strata"]["peak_rss_kib"], s["duckdb"]["peak_rss_kib"])))
    rows.append(("batches fed / target commits", *(f"{s[x]['batches_fed']} / {s[x]['target_commits']}"
                                                   for x in SIDES), ""))
    rows.append(("load average before / after", *(
        f"{s[x]['loadavg_before'][0]:.2f} / {s[x]['loadavg_after'][0]:.2f}" for x in SIDES), ""))
    w0 = max(len(r[0]) for r in rows) + 2
    w1 = max(len(r[1]) for r in rows + [("", SIDE_TITLE["strata"])]) + 2
    w2 = max(len(r[2]) for r in rows + [("", "", SIDE_TITLE["duckdb"])]) + 2
    log("")
    log(f"{'':<{w0}}{SIDE_TITLE['strata']:<{w1}}{SIDE_TITLE['duckdb']:<{w2}}strata/DuckDB")
    for r in rows:
        log(f"{r[0]:<{w0}}{r[1]:<{w1}}{r[2]:<{w2}}{r[3]}")
    log("(latency: execute and fetch, measured in the clients; peak RSS: VmHWM of the strata "
        "serve process, and of DuckDB's process, a Python interpreter with DuckDB and the "
        "delta extension; the sides ran one after the other, each while batches were committed)")
    log("=" * 100)


def finish(res: dict, a) -> int:
    res["failures"] = FAILURES
    out = a.json or (a.workdir / f"serve-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return R().finish(res, out, FAILURES)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_clients":
        _clients_child(sys.argv[2])
        sys.exit(0)
    ensure_venv()
    sys.exit(main())
