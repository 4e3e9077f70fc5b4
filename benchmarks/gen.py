#!/usr/bin/env python3
"""Deterministic CDC workload generator for the strata benchmarks.

Writes parquet files with the columns

    id BIGINT, name VARCHAR, city VARCHAR, amount BIGINT, op VARCHAR, seq BIGINT

where ``op`` is 'U' (upsert) or 'D' (delete) and ``seq`` is unique per key.
Everything is computed inside DuckDB from ``range(N)`` with a hand-rolled
integer hash, so the output depends only on the parameters and the seed
(10M events take a few seconds).

Three modes:

``bulk``   -- a fresh workload of ``--events`` events over ``--keys`` keys in
              ``--files`` files (part-00000.parquet ...), in time order.
``batch``  -- one more file appended to an existing workload: ``--events``
              events over ``--keys-pct`` percent of the existing keys, with
              seqs after all existing ones, except a ``--late-share`` of
              them, which get seqs *older* than the key's latest delivered
              event (late data).
``snapshot`` -- two full snapshots of a table (``key, name, city, amount`` plus
              the version column ``v`` = 1 and 2): version 2 differs from
              version 1 in ``--change-pct`` percent of the keys, a third each
              changed, removed and new (see ``gen_snapshot``).

Model
-----
Event ``i`` happens at time ``i+1`` (bulk) and belongs to key
``hash(i) % keys``.  Per key, the events in time order get a kind:

* first event of a key: insert (upsert with fresh values);
* otherwise, by a uniform draw: delete with ``--delete-share``, no-op update
  (exactly the values of the key's previous event) with ``--noop-share``,
  otherwise a value-changing update.  An upsert right after a delete is a
  re-insert (and a no-op-kind upsert after a delete re-inserts the values the
  row had before the delete: a delete row carries the before-image).

The values are a function of (key, number of value changes so far), so a
no-op update repeats the previous values exactly and a change always differs.

``seq = time * 1024 + slot``: bulk files use slot 0, the batch written as file
number n uses slot n, so late seqs never collide with existing ones.

Late events in bulk mode: a ``--late-share`` of the non-first events are
moved 1-3 files later than their time says (same seq); they are late whenever
the key has a newer event in the files in between.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _venv import ensure_venv  # noqa: E402

SLOT_BITS = 1024  # seq = time * SLOT_BITS + slot
CITIES = [
    "Amsterdam", "Berlin", "Bogota", "Cairo", "Chicago", "Delhi", "Dublin", "Helsinki",
    "Istanbul", "Jakarta", "Lagos", "Lima", "Lisbon", "London", "Madrid", "Manila",
    "Montreal", "Nairobi", "Osaka", "Oslo", "Paris", "Prague", "Rome", "Santiago",
    "Seoul", "Sydney", "Taipei", "Tokyo", "Toronto", "Vienna", "Warsaw", "Zurich",
]

COLUMNS = "id, name, city, amount, op, seq"


def _setup(con, seed: int) -> None:
    """Hash macros.  DuckDB's hash() is deterministic for a given DuckDB version
    (pinned in requirements.txt); a different version may generate other data."""
    con.execute(f"""
        CREATE OR REPLACE MACRO h2(a, b) AS hash(a::BIGINT, b::BIGINT, {int(seed)}::BIGINT);
        CREATE OR REPLACE MACRO h3(a, b, c) AS hash(a::BIGINT, b::BIGINT, c::BIGINT, {int(seed)}::BIGINT);
        CREATE OR REPLACE MACRO unit(x) AS (x / 18446744073709551616.0);
        CREATE OR REPLACE MACRO city_of(x) AS ({CITIES!r}::VARCHAR[])[1 + (x % {len(CITIES)})::BIGINT];
    """)


def _connect(seed: int, threads: int | None = None):
    import duckdb

    con = duckdb.connect()
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    con.execute("SET preserve_insertion_order = false")
    _setup(con, seed)
    return con


def _check_shares(a) -> None:
    for name in ("noop_share", "delete_share", "late_share"):
        v = getattr(a, name)
        if not 0.0 <= v <= 1.0:
            raise SystemExit(f"--{name.replace('_', '-')} must be within [0, 1]")
    if a.noop_share + a.delete_share > 1.0:
        raise SystemExit("--noop-share + --delete-share must be <= 1")


def events_dir(workload: Path) -> Path:
    return workload / "data" / "events"


def existing_files(workload: Path) -> list[Path]:
    return sorted(events_dir(workload).glob("part-*.parquet"))


def _write_files(con, table: str, out: Path, file_col: str, first_index: int, nfiles: int) -> list[Path]:
    """One parquet file per value of FILE_COL; TABLE is already sorted by (file, seq)."""
    con.execute("SET preserve_insertion_order = true")
    paths = []
    for f in range(nfiles):
        p = out / f"part-{first_index + f:05d}.parquet"
        tmp = p.with_name("." + p.name + ".tmp")
        con.execute(
            f"COPY (SELECT {COLUMNS} FROM {table} WHERE {file_col} = {f}) "
            f"TO '{tmp}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)"
        )
        tmp.rename(p)  # appear atomically: strata may be listing the folder
        paths.append(p)
    return paths


def gen_bulk(workload: Path, events: int, keys: int, files: int, noop_share: float,
             delete_share: float, late_share: float, seed: int, threads: int | None = None,
             stats: bool = True) -> dict:
    """Write a fresh workload into WORKLOAD/data/events. Returns a stats dict."""
    if keys < 1 or events < 1 or files < 1:
        raise ValueError("events, keys and files must be >= 1")
    out = events_dir(workload)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.parquet"):
        old.unlink()
    t0 = time.perf_counter()
    con = _connect(seed, threads)
    d, n = delete_share, noop_share
    con.execute(f"""
        CREATE TEMP TABLE raw AS
        SELECT range AS i,
               (h2(range, 1) % {keys})::BIGINT AS k,
               unit(h2(range, 2)) AS u_kind,
               unit(h2(range, 3)) AS u_late,
               (h2(range, 4) % 1000)::BIGINT AS r_late
        FROM range({events})
    """)
    # Window over the narrow table, then sort it by (file, time); the strings are
    # built afterwards, in that order (preserve_insertion_order keeps it).
    con.execute(f"""
        CREATE TEMP TABLE w AS
        SELECT *, CASE WHEN p > 0 AND u_late < {late_share} AND f0 < {files - 1}
                       THEN f0 + 1 + r_late % least(3, {files - 1} - f0)
                       ELSE f0 END AS f
        FROM (
            SELECT k, i, u_kind, u_late, r_late,
                   row_number() OVER k_time - 1 AS p,
                   sum(CASE WHEN u_kind >= {d + n} THEN 1 ELSE 0 END) OVER k_time AS v,
                   lag(u_kind) OVER k_time < {d} AND row_number() OVER k_time > 2 AS after_delete,
                   (i * {files}) // {events} AS f0
            FROM raw
            WINDOW k_time AS (PARTITION BY k ORDER BY i ROWS UNBOUNDED PRECEDING))
        ORDER BY f, i
    """)
    con.execute("DROP TABLE raw")
    con.execute("SET preserve_insertion_order = true")
    con.execute(f"""
        CREATE TEMP TABLE ev AS
        SELECT k AS id,
               'name_' || k || '_' || v AS name,
               city_of(h3(k, v, 5)) AS city,
               (h3(k, v, 6) % 100000)::BIGINT AS amount,
               CASE WHEN p > 0 AND u_kind < {d} THEN 'D' ELSE 'U' END AS op,
               (i + 1) * {SLOT_BITS} AS seq,
               f,
               CASE WHEN p = 0 THEN 'insert'
                    WHEN u_kind < {d} THEN 'delete'
                    WHEN u_kind < {d + n} THEN 'noop'
                    ELSE 'change' END AS kind,
               after_delete AND NOT (p > 0 AND u_kind < {d}) AS reinsert,
               f <> f0 AS moved
        FROM w
    """)
    con.execute("DROP TABLE w")
    paths = _write_files(con, "ev", out, "f", 0, files)
    gen_s = time.perf_counter() - t0
    st = {"mode": "bulk", "events": events, "keys_param": keys, "files": files, "seed": seed,
          "noop_share": noop_share, "delete_share": delete_share, "late_share": late_share,
          "paths": [str(p) for p in paths], "generate_seconds": round(gen_s, 2)}
    if stats:
        st.update(_stats(con, "ev", "f"))
    con.close()
    return st


def _stats(con, table: str, file_col: str) -> dict:
    kinds = dict(con.execute(f"SELECT kind, count(*) FROM {table} GROUP BY ALL").fetchall())
    keys = con.execute(f"SELECT count(DISTINCT id) FROM {table}").fetchone()[0]
    # A moved event is late if an earlier file already delivered a newer event of its key.
    late = con.execute(f"""
        WITH m AS (SELECT id, seq, {file_col} AS f FROM {table} WHERE moved)
        SELECT count(*) FROM m WHERE EXISTS (
            SELECT 1 FROM {table} e WHERE e.id = m.id AND e.seq > m.seq AND e.{file_col} < m.f)
    """).fetchone()[0]
    reinserts = con.execute(f"SELECT count(*) FROM {table} WHERE reinsert").fetchone()[0]
    return {"keys": keys, "kinds": kinds, "late_events": late, "reinserts_after_delete": reinserts}


def gen_batch(workload: Path, events: int, keys_pct: float, noop_share: float, delete_share: float,
              late_share: float, seed: int, threads: int | None = None, stats: bool = True) -> dict:
    """Append one file with EVENTS events over KEYS_PCT % of the existing keys."""
    out = events_dir(workload)
    files = existing_files(workload)
    if not files:
        raise SystemExit(f"no existing part-*.parquet in {out}: run `gen.py bulk` first")
    slot = len(files)
    if slot >= SLOT_BITS:
        raise SystemExit(f"at most {SLOT_BITS - 1} files per workload")
    t0 = time.perf_counter()
    # Each batch has its own random stream, derived from the seed and its slot.
    con = _connect(seed * 7919 + slot, threads)
    file_list = "[" + ", ".join(f"'{p}'" for p in files) + "]"
    max_time = con.execute(f"SELECT max(seq) // {SLOT_BITS} FROM read_parquet({file_list})").fetchone()[0]
    frac = keys_pct / 100.0
    # Current last event per selected key (its values, and its time).
    con.execute(f"""
        CREATE TEMP TABLE cur AS
        SELECT row_number() OVER (ORDER BY id) - 1 AS kidx, * FROM (
            SELECT id, arg_max(name, seq) AS name, arg_max(city, seq) AS city,
                   arg_max(amount, seq) AS amount, max(seq) // {SLOT_BITS} AS maxt
            FROM read_parquet({file_list})
            WHERE unit(h2(id, 11)) < {frac}
            GROUP BY id)
    """)
    nkeys = con.execute("SELECT count(*) FROM cur").fetchone()[0]
    if nkeys == 0:  # tiny workloads: take at least one key
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE cur AS
            SELECT 0::BIGINT AS kidx, id, arg_max(name, seq) AS name, arg_max(city, seq) AS city,
                   arg_max(amount, seq) AS amount, max(seq) // {SLOT_BITS} AS maxt
            FROM read_parquet({file_list})
            WHERE id = (SELECT min(id) FROM read_parquet({file_list}))
            GROUP BY id
        """)
        nkeys = 1
    d, n = delete_share, noop_share
    con.execute("SET preserve_insertion_order = true")
    con.execute(f"""
        CREATE TEMP TABLE raw AS
        SELECT range AS j,
               (h2(range, 21) % {nkeys})::BIGINT AS kidx,
               unit(h2(range, 22)) AS u_kind,
               unit(h2(range, 23)) AS u_late
        FROM range({events})
    """)
    con.execute(f"""
        CREATE TEMP TABLE ev AS
        WITH r AS (
            SELECT raw.*, cur.id, cur.maxt,
                   (u_late < {late_share}) AS want_late,
                   (h2(cur.id, {slot}) % 1000000007)::BIGINT % greatest(1, cur.maxt // 2) AS lag_k
            FROM raw JOIN cur USING (kidx)
        ), lt AS (
            SELECT *,
                   row_number() OVER (PARTITION BY id, want_late ORDER BY j) - 1 AS jl
            FROM r
        ), r2 AS (
            SELECT *,
                   want_late AND (maxt - 1 - lag_k - jl) >= 1 AS late
            FROM lt
        ), w AS (
            SELECT *,
                   sum(CASE WHEN NOT late AND u_kind >= {d + n} THEN 1 ELSE 0 END)
                       OVER (PARTITION BY id ORDER BY j ROWS UNBOUNDED PRECEDING) AS v
            FROM r2
        )
        SELECT w.id,
               CASE WHEN late THEN 'name_' || w.id || '_L' || {slot} || '_' || j
                    WHEN v = 0 THEN cur.name
                    ELSE 'name_' || w.id || '_b' || {slot} || '_' || v END AS name,
               CASE WHEN late THEN city_of(h3(w.id, j, 5))
                    WHEN v = 0 THEN cur.city
                    ELSE city_of(h3(w.id, v + 1000000 * {slot}, 5)) END AS city,
               CASE WHEN late THEN (h3(w.id, j, 6) % 100000)::BIGINT
                    WHEN v = 0 THEN cur.amount
                    ELSE (h3(w.id, v + 1000000 * {slot}, 6) % 100000)::BIGINT END AS amount,
               CASE WHEN u_kind < {d} THEN 'D' ELSE 'U' END AS op,
               CASE WHEN late THEN (w.maxt - 1 - lag_k - jl) * {SLOT_BITS} + {slot}
                    ELSE ({max_time} + 1 + j) * {SLOT_BITS} END AS seq,
               0 AS f,
               CASE WHEN u_kind < {d} THEN 'delete'
                    WHEN late THEN 'late-change'
                    WHEN u_kind < {d + n} THEN 'noop'
                    ELSE 'change' END AS kind
        FROM w JOIN cur USING (kidx)
        ORDER BY j  -- arrival order: late events sit among the others
    """)
    paths = _write_files(con, "ev", out, "f", slot, 1)
    gen_s = time.perf_counter() - t0
    st = {"mode": "batch", "events": events, "keys_pct": keys_pct, "keys_touched": nkeys,
          "slot": slot, "seed": seed, "noop_share": noop_share, "delete_share": delete_share,
          "late_share": late_share, "paths": [str(p) for p in paths],
          "generate_seconds": round(gen_s, 2)}
    if stats:
        st["kinds"] = dict(con.execute("SELECT kind, count(*) FROM ev GROUP BY ALL").fetchall())
        st["late_events"] = con.execute(
            f"SELECT count(*) FROM ev WHERE seq % {SLOT_BITS} <> 0").fetchone()[0]
    con.close()
    return st


# --------------------------------------------------------------------------- snapshots

SNAPSHOT_COLUMNS = "key, name, city, amount, v"
KEY_MULT = 2654435761  # odd: i -> (i * KEY_MULT) % 2^40 is a bijection, so keys are unique


def snapshot_dir(workload: Path, version: int) -> Path:
    """Where gen_snapshot writes version V's files (run.py links them into the pipeline's folder)."""
    return workload / "versions" / f"v{version}"


def snapshot_files(workload: Path, version: int) -> list[Path]:
    return sorted(snapshot_dir(workload, version).glob("part-*.parquet"))


def gen_snapshot(workload: Path, rows: int, change_pct: float, seed: int, files: int = 1,
                 threads: int | None = None) -> dict:
    """Two full snapshots of a table ``key BIGINT, name VARCHAR, city VARCHAR, amount BIGINT``
    with a version column ``v BIGINT``: v = 1 has ROWS rows; v = 2 differs in CHANGE_PCT percent
    of the keys, a third each changed, removed and new.  Each version is split into FILES
    parquet files under WORKLOAD/versions/v1 and .../v2.

    Row i of the key universe has key (i * KEY_MULT) mod 2^40, so keys are unique, and neither
    the key order nor the key ranges say which rows are old, new, changed or removed.  Rows are
    written in i order (not sorted by key); the new keys come last in v2, the removed rows are
    missing from it.  A changed key always gets a new amount, and its city is drawn again (it
    may stay the same, become NULL or stop being NULL); 5% of the cities are NULL.
    """
    if rows < 1 or files < 1:
        raise ValueError("rows and files must be >= 1")
    if not 0.0 <= change_pct <= 100.0:
        raise ValueError("change_pct must be within [0, 100]")
    for v in (1, 2):
        d = snapshot_dir(workload, v)
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("*.parquet"):
            old.unlink()
    t0 = time.perf_counter()
    con = _connect(seed, threads)
    third = change_pct / 100.0 / 3.0
    n_new = round(rows * third)
    # kind: 0 unchanged, 1 changed, 2 removed (i < rows); 3 new (i >= rows).
    con.execute(f"""
        CREATE TEMP TABLE u AS
        SELECT range AS i,
               (range * {KEY_MULT}) % {1 << 40} AS key,
               CASE WHEN range >= {rows} THEN 3
                    WHEN unit(h2(range, 31)) < {third} THEN 1
                    WHEN unit(h2(range, 31)) < {2 * third} THEN 2
                    ELSE 0 END AS kind
        FROM range({rows + n_new})
    """)
    con.execute("""
        CREATE OR REPLACE MACRO snap_city(k, ver) AS
            CASE WHEN unit(h3(k, ver, 8)) < 0.05 THEN NULL ELSE city_of(h3(k, ver, 5)) END;
        CREATE OR REPLACE MACRO snap_amount0(k) AS (h3(k, 0, 6) % 100000)::BIGINT;
    """)
    paths = {}
    con.execute("SET preserve_insertion_order = true")
    for v, where in ((1, "kind <> 3"), (2, "kind <> 2")):
        ver = "0" if v == 1 else "CASE WHEN kind = 1 THEN 1 ELSE 0 END"
        amount = ("snap_amount0(key)" if v == 1 else
                  "CASE WHEN kind = 1 THEN ((snap_amount0(key) + 1 + h3(key, 1, 6) % 99999) "
                  "% 100000)::BIGINT ELSE snap_amount0(key) END")
        con.execute(f"""
            CREATE OR REPLACE TEMP TABLE s AS
            SELECT key, 'name_' || key AS name, snap_city(key, {ver}) AS city,
                   {amount} AS amount, {v}::BIGINT AS v,
                   ((row_number() OVER (ORDER BY i) - 1) * {files}) // count(*) OVER () AS f
            FROM u WHERE {where}
            ORDER BY i
        """)
        out = snapshot_dir(workload, v)
        paths[v] = []
        for f in range(files):
            p = out / f"part-{f:05d}.parquet"
            tmp = p.with_name("." + p.name + ".tmp")
            con.execute(f"COPY (SELECT {SNAPSHOT_COLUMNS} FROM s WHERE f = {f}) TO '{tmp}' "
                        "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)")
            tmp.rename(p)
            paths[v].append(str(p))
    counts = dict(con.execute("SELECT kind, count(*) FROM u GROUP BY ALL").fetchall())
    con.close()
    changed, removed, new = counts.get(1, 0), counts.get(2, 0), counts.get(3, 0)
    return {"mode": "snapshot", "rows": rows, "change_pct": change_pct, "files": files, "seed": seed,
            "rows_v1": rows, "rows_v2": rows - removed + new, "changed": changed, "removed": removed,
            "new": new, "unchanged": rows - changed - removed,
            "scd2_rows": rows + changed + new,  # closed old versions stay
            "paths": paths, "generate_seconds": round(time.perf_counter() - t0, 2)}


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True,
                   help="workload directory; files go to OUT/data/events/part-NNNNN.parquet")
    p.add_argument("--events", type=int, required=True, help="number of events to write")
    p.add_argument("--noop-share", type=float, default=0.15,
                   help="share of updates that repeat the previous values (default 0.15)")
    p.add_argument("--delete-share", type=float, default=0.05,
                   help="share of deletes (the key's next upsert is a re-insert) (default 0.05)")
    p.add_argument("--late-share", type=float, default=0.02,
                   help="share of events delivered late (default 0.02)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("bulk", help="write a fresh workload")
    add_common(b)
    b.add_argument("--keys", type=int, required=True)
    b.add_argument("--files", type=int, default=10)
    i = sub.add_parser("batch", help="append one incremental file to an existing workload")
    add_common(i)
    i.add_argument("--keys-pct", type=float, default=1.0, help="percent of existing keys touched")
    s = sub.add_parser("snapshot", help="write snapshot versions 1 and 2 (a full extract and its successor)")
    s.add_argument("--out", type=Path, required=True,
                   help="workload directory; files go to OUT/versions/v1/ and OUT/versions/v2/")
    s.add_argument("--rows", type=int, required=True, help="rows of version 1")
    s.add_argument("--change-pct", type=float, default=1.0,
                   help="percent of keys that differ in version 2: a third each changed, removed, new")
    s.add_argument("--files", type=int, default=1, help="files per version (default 1)")
    s.add_argument("--seed", type=int, default=42)
    s.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: all)")
    a = ap.parse_args(argv)
    if a.mode == "snapshot":
        print(json.dumps(gen_snapshot(a.out, a.rows, a.change_pct, a.seed, a.files, a.threads), indent=2))
        return
    _check_shares(a)
    if a.mode == "bulk":
        st = gen_bulk(a.out, a.events, a.keys, a.files, a.noop_share, a.delete_share,
                      a.late_share, a.seed, a.threads)
    else:
        st = gen_batch(a.out, a.events, a.keys_pct, a.noop_share, a.delete_share,
                       a.late_share, a.seed, a.threads)
    print(json.dumps(st, indent=2))


if __name__ == "__main__":
    ensure_venv()
    main()
