#!/usr/bin/env python3
"""Checks duckdb_scd2.sql (and the generator) against a pure-Python SCD2 fold, and run.py's
DuckDB formulation of the snapshot workload (and its generator) against a pure-Python diff.

Run either way (both use benchmarks/.venv, creating it if needed):

    python3 benchmarks/test_duckdb_formulation.py
    python3 -m pytest benchmarks/test_duckdb_formulation.py
"""

from __future__ import annotations

import random
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from _venv import add_venv_to_path, ensure_venv  # noqa: E402

if __name__ == "__main__":
    ensure_venv()
else:
    add_venv_to_path()

import duckdb  # noqa: E402

VALUE_COLS = ("name", "city", "amount")
SQL = (BENCH_DIR / "duckdb_scd2.sql").read_text()


def fold(events):
    """The reference SCD2 fold.

    events: iterable of dicts with id, name, city, amount, op, seq.
    Returns a Counter (multiset) of (id, name, city, amount, start, end) tuples.
    """
    by_key = defaultdict(list)
    for e in events:
        by_key[e["id"]].append(e)
    out = Counter()
    for key, evs in by_key.items():
        evs.sort(key=lambda e: e["seq"])
        open_ = None  # (values, start)
        for e in evs:
            values = tuple(e[c] for c in VALUE_COLS)
            if e["op"] == "D":
                if open_ is not None:
                    out[(key, *open_[0], open_[1], e["seq"])] += 1
                    open_ = None
            else:
                if open_ is not None and values == open_[0]:
                    continue  # no-op update
                if open_ is not None:
                    out[(key, *open_[0], open_[1], e["seq"])] += 1
                open_ = (values, e["seq"])
        if open_ is not None:
            out[(key, *open_[0], open_[1], None)] += 1
    return out


def duckdb_fold(con, source_sql: str) -> Counter:
    con.execute(f"CREATE OR REPLACE TEMP VIEW events AS {source_sql}")
    return Counter(con.execute(SQL).fetchall())


def random_events(rng: random.Random, nkeys: int, nevents: int, null_p: float = 0.1):
    """Small value domains so that no-op updates, repeats and NULLs are frequent."""
    used = defaultdict(set)
    evs = []
    for _ in range(nevents):
        k = rng.randrange(nkeys)
        while True:
            seq = rng.randrange(1, 4 * nevents + 10)
            if seq not in used[k]:
                used[k].add(seq)
                break
        evs.append({
            "id": k,
            "name": None if rng.random() < null_p else rng.choice(["a", "b"]),
            "city": None if rng.random() < null_p else rng.choice(["x", "y"]),
            "amount": None if rng.random() < null_p else rng.choice([1, 2]),
            "op": "D" if rng.random() < 0.25 else "U",
            "seq": seq,
        })
    return evs


def _load(con, evs):
    con.execute("CREATE OR REPLACE TEMP TABLE src (id BIGINT, name VARCHAR, city VARCHAR, "
                "amount BIGINT, op VARCHAR, seq BIGINT)")
    if evs:
        con.executemany("INSERT INTO src VALUES (?, ?, ?, ?, ?, ?)",
                        [[e["id"], e["name"], e["city"], e["amount"], e["op"], e["seq"]] for e in evs])


def test_hand_written_cases():
    U, D = "U", "D"
    cases = [
        # (events as (id, name, op, seq), expected rows as (id, name, start, end))
        ([(1, "a", U, 1)], [(1, "a", 1, None)]),
        ([(1, "a", U, 1), (1, "a", U, 2)], [(1, "a", 1, None)]),                 # no-op
        ([(1, "a", U, 1), (1, "b", U, 2)], [(1, "a", 1, 2), (1, "b", 2, None)]),
        ([(1, "a", U, 1), (1, "a", D, 2)], [(1, "a", 1, 2)]),                    # delete closes
        ([(1, "a", U, 1), (1, "a", D, 2), (1, "a", U, 3)],                       # re-insert same values
         [(1, "a", 1, 2), (1, "a", 3, None)]),
        ([(1, "a", D, 1), (1, "a", D, 2)], []),                                  # deletes of nothing
        ([(1, "a", U, 5), (1, "b", U, 1)], [(1, "b", 1, 5), (1, "a", 5, None)]),  # late event
        ([(1, "a", U, 1), (1, "b", U, 2), (1, "a", U, 3), (1, "a", U, 4), (1, "x", D, 6)],
         [(1, "a", 1, 2), (1, "b", 2, 3), (1, "a", 3, 6)]),
    ]
    con = duckdb.connect()
    for evs, expected in cases:
        rows = [{"id": i, "name": n, "city": "c", "amount": 0, "op": o, "seq": s} for i, n, o, s in evs]
        exp = Counter((i, n, "c", 0, s, e) for i, n, s, e in expected)
        assert fold(rows) == exp, (evs, fold(rows))
        _load(con, rows)
        assert duckdb_fold(con, "SELECT * FROM src") == exp, evs


def test_random_small_inputs():
    con = duckdb.connect()
    rng = random.Random(1234)
    for trial in range(300):
        nkeys = rng.randint(1, 6)
        nevents = rng.randint(0, 40)
        evs = random_events(rng, nkeys, nevents, null_p=rng.choice([0.0, 0.1, 0.4]))
        _load(con, evs)
        expected = fold(evs)
        got = duckdb_fold(con, "SELECT * FROM src")
        assert got == expected, f"trial {trial}: events={evs}\nexpected={expected}\ngot={got}"


def test_generator_workload_matches_fold():
    """The generated parquet (bulk + incremental batches with late events) folds the
    same in DuckDB and in Python, and the generator's knobs do what they say."""
    import gen

    with tempfile.TemporaryDirectory() as tmp:
        wl = Path(tmp) / "wl"
        st = gen.gen_bulk(wl, events=3000, keys=200, files=4, noop_share=0.2, delete_share=0.1,
                          late_share=0.1, seed=7)
        assert st["late_events"] > 0 and st["reinserts_after_delete"] > 0
        assert st["kinds"]["noop"] > 0 and st["kinds"]["delete"] > 0
        for _ in range(2):
            b = gen.gen_batch(wl, events=500, keys_pct=20, noop_share=0.2, delete_share=0.1,
                              late_share=0.1, seed=7)
            assert b["late_events"] > 0
        files = gen.existing_files(wl)
        assert len(files) == 6
        con = duckdb.connect()
        src = "SELECT * FROM read_parquet([" + ", ".join(f"'{f}'" for f in files) + "])"
        rows = con.execute(src).fetchall()
        assert len(rows) == 4000
        cols = [d[0] for d in con.description]
        evs = [dict(zip(cols, r)) for r in rows]
        # seq unique per key
        assert len({(e["id"], e["seq"]) for e in evs}) == len(evs)
        # determinism: same parameters give the same bytes of data
        wl2 = Path(tmp) / "wl2"
        gen.gen_bulk(wl2, events=3000, keys=200, files=4, noop_share=0.2, delete_share=0.1,
                     late_share=0.1, seed=7, stats=False)
        a = con.execute(f"SELECT * FROM read_parquet('{files[0]}')").fetchall()
        b2 = con.execute(f"SELECT * FROM read_parquet('{gen.existing_files(wl2)[0]}')").fetchall()
        assert a == b2
        # no-op updates really repeat the previous values
        got = duckdb_fold(con, src)
        assert got == fold(evs)
        assert sum(got.values()) < len(evs)


def test_noop_share_means_same_values():
    import gen

    with tempfile.TemporaryDirectory() as tmp:
        wl = Path(tmp) / "wl"
        gen.gen_bulk(wl, events=2000, keys=50, files=1, noop_share=1.0, delete_share=0.0,
                     late_share=0.0, seed=3, stats=False)
        con = duckdb.connect()
        got = duckdb_fold(con, f"SELECT * FROM read_parquet('{gen.events_dir(wl)}/*.parquet')")
        # every key: one insert, then only no-ops -> one open version per key
        assert sum(got.values()) == len({k[0] for k in got}) <= 50
        assert all(r[5] is None for r in got)


def test_delta_log_reader():
    """run.py's fallback reader of strata's table: replays _delta_log (a parquet
    checkpoint plus later JSON commits with add/remove actions)."""
    import json

    import run

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp) / "target"
        (t / "_delta_log").mkdir(parents=True)
        con = duckdb.connect()
        for n in ("a", "b", "c d"):
            con.execute(f"COPY (SELECT '{n}' AS x) TO '{t / (n + '.parquet')}'")
        con.execute(f"""COPY (SELECT {{'path': 'a.parquet', 'deletionVector': NULL::VARCHAR,
                                       'partitionValues': NULL::MAP(VARCHAR, VARCHAR)}} AS add
                            UNION ALL SELECT {{'path': 'b.parquet', 'deletionVector': NULL::VARCHAR,
                                       'partitionValues': NULL::MAP(VARCHAR, VARCHAR)}})
                        TO '{t / "_delta_log" / (f"{1:020d}" + ".checkpoint.parquet")}'""")
        (t / "_delta_log" / "_last_checkpoint").write_text(json.dumps({"version": 1}))
        (t / "_delta_log" / f"{0:020d}.json").write_text(json.dumps({"add": {"path": "zzz.parquet"}}))
        (t / "_delta_log" / f"{2:020d}.json").write_text(
            json.dumps({"remove": {"path": "a.parquet"}}) + "\n"
            + json.dumps({"add": {"path": "c%20d.parquet", "partitionValues": {}}}) + "\n")
        files = run.delta_files(t)
        assert [f.name for f in files] == ["b.parquet", "c d.parquet"], files


def snapshot_scd2(v1, v2, ver1=1, ver2=2):
    """Reference SCD2 of two snapshots (dicts key -> (name, city, amount)): every v1 row opens at
    ver1; a key missing from v2 or with other values in v2 is closed at ver2; a changed or new key
    opens at ver2; an unchanged key keeps its open row (start ver1)."""
    out = Counter()
    for k, vals in v1.items():
        end = None if v2.get(k, object()) == vals else ver2
        out[(k, *vals, ver1, end)] += 1
    for k, vals in v2.items():
        if k not in v1 or v1[k] != vals:
            out[(k, *vals, ver2, None)] += 1
    return out


def _duckdb_snapshot(con, v1_files, v2_files) -> Counter:
    """run.py's two steps on CON (in memory here; run.py uses a database file, same SQL)."""
    import run

    fl = {k: "[" + ", ".join(f"'{f}'" for f in files) + "]"
          for k, files in (("v1", v1_files), ("v2", v2_files))}
    con.execute(run.SNAPSHOT_LOAD_SQL.format(v1=fl["v1"]))
    con.execute(run.SNAPSHOT_APPLY_SQL.format(v1=fl["v1"], v2=fl["v2"], version=2))
    got = Counter(con.execute("SELECT * FROM target").fetchall())
    con.execute("DROP TABLE target; DROP TABLE changes")
    return got


def _write_snapshot(con, path: Path, rows: dict, v: int) -> None:
    con.execute("CREATE OR REPLACE TEMP TABLE s (key BIGINT, name VARCHAR, city VARCHAR, "
                "amount BIGINT, v BIGINT)")
    if rows:
        con.executemany("INSERT INTO s VALUES (?, ?, ?, ?, ?)", [[k, *vals, v] for k, vals in rows.items()])
    con.execute(f"COPY s TO '{path}' (FORMAT parquet)")


def test_snapshot_formulation():
    """run.py's DuckDB diff-and-apply of snapshot 2 against snapshot 1 equals the reference,
    on hand-written NULL cases and on random small snapshots."""
    rng = random.Random(99)
    con = duckdb.connect()
    cases = [
        ({1: ("a", None, 1), 2: ("b", "x", 2), 3: ("c", "y", 3), 4: ("d", None, None)},
         {1: ("a", None, 1), 2: ("b", None, 2), 4: ("d", None, None), 5: ("e", "z", 5)}),
        ({}, {1: ("a", "x", 1)}),
        ({1: ("a", "x", 1)}, {}),
    ]
    for _ in range(40):
        dom = lambda: None if rng.random() < 0.2 else rng.choice(["p", "q"])  # noqa: E731
        v1 = {k: (dom(), dom(), rng.choice([None, 1, 2])) for k in rng.sample(range(12), rng.randint(0, 10))}
        v2 = {k: (dom(), dom(), rng.choice([None, 1, 2])) for k in rng.sample(range(12), rng.randint(0, 10))}
        for k in v1:  # many unchanged keys
            if k in v2 and rng.random() < 0.5:
                v2[k] = v1[k]
        cases.append((v1, v2))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for i, (v1, v2) in enumerate(cases):
            _write_snapshot(con, tmp / "v1.parquet", v1, 1)
            _write_snapshot(con, tmp / "v2.parquet", v2, 2)
            got = _duckdb_snapshot(con, [tmp / "v1.parquet"], [tmp / "v2.parquet"])
            assert got == snapshot_scd2(v1, v2), f"case {i}: v1={v1} v2={v2} got={got}"


def test_snapshot_generator():
    """gen_snapshot: the counts it reports, a third each changed/removed/new, every changed key
    really differs, output is deterministic; DuckDB's apply over it equals the reference."""
    import gen

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        st = gen.gen_snapshot(tmp / "wl", rows=3000, change_pct=30, seed=5, files=2)
        con = duckdb.connect()

        def read(v):
            files = gen.snapshot_files(tmp / "wl", v)
            assert len(files) == 2
            rows = con.execute("SELECT key, name, city, amount, v FROM read_parquet(["
                               + ", ".join(f"'{f}'" for f in files) + "])").fetchall()
            assert {r[4] for r in rows} == {v}
            d = {r[0]: r[1:4] for r in rows}
            assert len(d) == len(rows), "duplicate key"
            return d

        v1, v2 = read(1), read(2)
        changed = [k for k in v1 if k in v2 and v1[k] != v2[k]]
        removed = [k for k in v1 if k not in v2]
        new = [k for k in v2 if k not in v1]
        assert (len(v1), len(v2)) == (st["rows_v1"], st["rows_v2"]) == (3000, 3000 - len(removed) + len(new))
        assert (len(changed), len(removed), len(new)) == (st["changed"], st["removed"], st["new"])
        for n in (len(changed), len(removed), len(new)):
            assert 200 < n < 400, (len(changed), len(removed), len(new))
        assert any(v[1] is None for v in v1.values())
        expected = snapshot_scd2(v1, v2)
        assert sum(expected.values()) == st["scd2_rows"]
        got = _duckdb_snapshot(con, gen.snapshot_files(tmp / "wl", 1), gen.snapshot_files(tmp / "wl", 2))
        assert got == expected
        gen.gen_snapshot(tmp / "wl2", rows=3000, change_pct=30, seed=5, files=2)
        for v in (1, 2):
            for f1, f2 in zip(gen.snapshot_files(tmp / "wl", v), gen.snapshot_files(tmp / "wl2", v)):
                assert (con.execute(f"SELECT * FROM read_parquet('{f1}')").fetchall()
                        == con.execute(f"SELECT * FROM read_parquet('{f2}')").fetchall())


def _main() -> int:
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, f in tests:
        try:
            f()
            print(f"PASS {name}")
        except Exception as exc:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {exc!r}"[:2000])
    print(f"{len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_main())
