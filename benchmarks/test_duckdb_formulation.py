#!/usr/bin/env python3
"""Checks duckdb_scd2.sql (and the generator) against a pure-Python SCD2 fold.

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
