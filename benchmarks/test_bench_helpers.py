#!/usr/bin/env python3
"""Checks the pure parts of serve_bench.py and mview_bench.py: percentiles, the lookup mix
and its answer check, DuckDB's formulation of as_of against the documented rule, the
parsing of `strata run`'s view lines, the pipeline's dialect and the row fingerprints.

    python3 benchmarks/test_bench_helpers.py
    python3 -m pytest benchmarks/test_bench_helpers.py
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from _venv import add_venv_to_path, ensure_venv  # noqa: E402

if __name__ == "__main__":
    ensure_venv()
else:
    add_venv_to_path()

import duckdb  # noqa: E402

import mview_bench  # noqa: E402
import serve_bench  # noqa: E402


def test_percentile_nearest_rank():
    xs = [float(i) for i in range(1, 101)]
    assert serve_bench.percentile(xs, 50) == 50.0
    assert serve_bench.percentile(xs, 99) == 99.0
    assert serve_bench.percentile(xs, 100) == 100.0
    assert serve_bench.percentile([3.0], 99) == 3.0
    assert serve_bench.percentile([], 50) is None


def test_query_plan_is_seeded_and_in_range():
    r1, r2 = random.Random(7), random.Random(7)
    a = [serve_bench.query_plan(r1, 100, 5000, 0.5) for _ in range(20)]
    b = [serve_bench.query_plan(r2, 100, 5000, 0.5) for _ in range(20)]
    assert a == b
    rng = random.Random(1)
    plans = [serve_bench.query_plan(rng, 100, 5000, 0.3) for _ in range(2000)]
    assert all(0 <= k < 100 and 1 <= t <= 5000 for _, k, t in plans)
    share = sum(kind == "as_of" for kind, _, _ in plans) / len(plans)
    assert 0.25 < share < 0.35


def test_check_answer():
    assert serve_bench.check_answer([], 5) is None
    assert serve_bench.check_answer([(5, "n", "c", 1, 10)], 5) is None
    assert "key 6" in serve_bench.check_answer([(6, "n", "c", 1, 10)], 5)
    assert "2 rows" in serve_bench.check_answer([(5,), (5,)], 5)


def test_duckdb_as_of_formulation_matches_the_rule():
    """DUCK_AS_OF is docs/history.md's rule: start <= t and (end open or t < end)."""
    rows = [(1, "a", "x", 1, 10, 20), (1, "b", "y", 2, 20, 30), (1, "c", "z", 3, 40, None),
            (2, "d", "w", 4, 15, None)]
    con = duckdb.connect()
    con.execute('CREATE TABLE t (id BIGINT, name VARCHAR, city VARCHAR, amount BIGINT, '
                '"__START_AT" BIGINT, "__END_AT" BIGINT)')
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)", rows)
    as_of = serve_bench.DUCK_AS_OF.format(table="t")
    current = serve_bench.DUCK_CURRENT.format(table="t")
    for key in (1, 2, 3):
        for t in range(0, 50):
            want = [r[:5] for r in rows
                    if r[0] == key and r[4] <= t and (r[5] is None or t < r[5])]
            assert con.execute(as_of, [key, t, t]).fetchall() == want, (key, t)
        want = [r[:5] for r in rows if r[0] == key and r[5] is None]
        assert con.execute(current, [key]).fetchall() == want


def test_view_lines_are_parsed():
    stdout = ("table default.events_raw: ingested 200 row(s) from 1 file(s)\n"
              "materialized view default.mv_filter: incremental: 42 row(s) from its input's new "
              "rows appended\n"
              "materialized view default.mv_regroup: recomputed, 2000 row(s)\n")
    stderr = ("12:41:25 materialized view default.mv_filter: 42 row(s) appended (incremental) "
              "(0.09 s)\n12:41:26 materialized view default.mv_regroup: 2000 row(s) (1.25 s)\n")
    assert mview_bench.view_outcome(stdout, "mv_filter").startswith("incremental:")
    assert mview_bench.view_outcome(stdout, "mv_regroup") == "recomputed, 2000 row(s)"
    assert mview_bench.view_outcome(stdout, "mv_combine") is None
    assert mview_bench.view_seconds(stderr, "mv_filter") == 0.09
    assert mview_bench.view_seconds(stderr, "mv_regroup") == 1.25
    assert mview_bench.view_seconds(stderr, "mv_combine") is None


def test_pipeline_quotes_identifiers_with_backticks():
    sql = mview_bench.pipeline_sql()
    assert '"__START_AT"' not in sql and "max(`__START_AT`)" in sql
    for name in mview_bench.VIEWS:
        assert f"CREATE OR REFRESH MATERIALIZED VIEW {name}\nAS SELECT" in sql


def test_fingerprint_ignores_order_and_integer_widths():
    """DuckDB's sum() is a HUGEINT where DataFusion's is a BIGINT: the fingerprint's casts make
    them hash alike; row order does not matter, a changed value does."""
    con = duckdb.connect()
    cols = mview_bench.VIEWS["mv_combine"][2]
    base = "SELECT * FROM (VALUES ('Oslo', 2, 7, 1, 6), ('Rome', 1, 3, 3, 3)) v(city, n, total, lo, hi)"
    wide = ("SELECT city, n, total::HUGEINT AS total, lo, hi FROM (VALUES ('Rome', 1, 3, 3, 3), "
            "('Oslo', 2, 7, 1, 6)) v(city, n, total, lo, hi)")
    changed = "SELECT * FROM (VALUES ('Oslo', 2, 8, 1, 6), ('Rome', 1, 3, 3, 3)) v(city, n, total, lo, hi)"

    def fp(rel):
        return con.execute(f"SELECT count(*), sum(hash({cols})::HUGEINT)::VARCHAR FROM ({rel})").fetchone()

    assert fp(base) == fp(wide)
    assert fp(base) != fp(changed)


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
