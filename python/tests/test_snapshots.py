"""create_auto_cdc_from_snapshot_flow with a Python function as the source."""

import datetime as dt
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

import strata
from strata import pipelines as dp

from conftest import rows

# The versions of tests/scenarios/snapshots/late_version.scn: v1 and v3 in run 1, the late
# v2 in run 2, v0 (older than everything) in run 3.
SNAPSHOTS = {
    1: [(1, "A"), (3, "B"), (4, "C"), (5, "D"), (6, "F"), (7, "H")],
    3: [(1, "A"), (3, "B"), (4, "C"), (5, "E"), (6, "G"), (8, "I")],
    2: [(1, "A"), (2, "X"), (3, "B2"), (5, "D"), (6, "G"), (8, "I")],
    0: [(1, "Z"), (7, "H")],
}
# What the scenario expects of the SCD2 target after run 3.
EXPECTED_SCD2 = [
    (1, "A", 1, None), (1, "Z", 0, 1), (2, "X", 2, 3), (3, "B", 1, 2), (3, "B", 3, None),
    (3, "B2", 2, 3), (4, "C", 1, 2), (4, "C", 3, None), (5, "D", 1, 3), (5, "E", 3, None),
    (6, "F", 1, 2), (6, "G", 2, None), (7, "H", 0, 2), (8, "I", 2, None),
]


def as_arrow(pairs, flavour):
    t = pa.table({"id": pa.array([p[0] for p in pairs], pa.int32()),
                  "city": [p[1] for p in pairs]})
    if flavour == "pandas":
        return t.to_pandas()
    if flavour == "polars":
        import polars as pl
        return pl.from_arrow(t)
    return t


def deliveries(batches, flavour="pyarrow"):
    """A snapshot source that, on each run, delivers the versions of the next batch in the
    order given (late ones included), then None."""
    state = {"run": 0, "queue": []}
    calls = []

    def next_snapshot_and_version(latest):
        calls.append(latest)
        if not state["queue"]:
            return None
        v = state["queue"].pop(0)
        return as_arrow(SNAPSHOTS[v], flavour), v

    def start_run():
        state["queue"] = list(batches[state["run"]])
        state["run"] += 1

    return next_snapshot_and_version, start_run, calls


@pytest.mark.parametrize("flavour", ["pyarrow", "pandas", "polars"])
def test_snapshot_function_late_versions_as_the_sql_scenario(tmp_path, flavour):
    fn, start_run, calls = deliveries([[1, 3], [2], [0]], flavour)
    fn1, start_run1, _ = deliveries([[1, 3], [2], [0]], flavour)
    with dp.Pipeline() as p:
        dp.create_streaming_table("hist")
        dp.create_auto_cdc_from_snapshot_flow(target="hist", source=fn, keys=["id"],
                                              stored_as_scd_type=2)
        dp.create_streaming_table("cur")
        dp.create_auto_cdc_from_snapshot_flow(target="cur", source=fn1, keys=["id"])
    wh = tmp_path / "wh"
    for _ in range(3):
        start_run()
        start_run1()
        report = strata.run(p, warehouse=wh, progress=False)
    got = strata.query("SELECT id, city, __START_AT, __END_AT FROM hist", warehouse=wh)
    assert rows(got) == sorted(EXPECTED_SCD2, key=lambda r: tuple((v is None, str(v)) for v in r))
    assert got.schema.field("__START_AT").type == pa.int64()
    # SCD type 1 keeps the rows of the latest version, v3.
    assert rows(strata.query("SELECT * FROM cur", warehouse=wh)) == sorted(SNAPSHOTS[3])
    # Lakeflow's contract: called with the latest version given so far (None at first);
    # after a late version the function is asked again in the next run.
    assert calls == [None, 1, 3, 3, 3]
    assert {f["flow"] for f in report["flows"]} == {"hist_flow", "cur_flow"}


def test_snapshot_function_matches_sql_snapshot_flow(tmp_path):
    """Golden equivalence: the same snapshots through a SQL snapshot flow over CSV files."""
    data = tmp_path / "data/snap"
    data.mkdir(parents=True)
    for i, v in enumerate([1, 3, 2]):
        (data / f"{i:03d}.csv").write_text(
            "id,city,v\n" + "".join(f"{k},{c},{v}\n" for k, c in SNAPSHOTS[v]))
    sql = tmp_path / "p.sql"
    sql.write_text(textwrap.dedent("""\
        CREATE OR REFRESH STREAMING TABLE deliveries
        AS SELECT * FROM STREAM read_files('data/snap', format => 'csv', header => true,
          schema => 'id INT, city STRING, v BIGINT');
        CREATE OR REFRESH STREAMING TABLE hist;
        CREATE FLOW hist_flow AS AUTO CDC FROM SNAPSHOT INTO hist FROM STREAM(deliveries)
        KEYS (id) SNAPSHOT VERSION BY v COLUMNS * EXCEPT (v) STORED AS SCD TYPE 2;
    """))
    strata.run(sql, warehouse=tmp_path / "a", progress=False)
    fn, start_run, _ = deliveries([[1, 3, 2]])
    start_run()
    with dp.Pipeline() as p:
        dp.create_streaming_table("hist")
        dp.create_auto_cdc_from_snapshot_flow(target="hist", source=fn, keys=["id"],
                                              stored_as_scd_type=2)
    strata.run(p, warehouse=tmp_path / "b", progress=False)
    a = strata.query("SELECT * FROM hist", warehouse=tmp_path / "a")
    b = strata.query("SELECT * FROM hist", warehouse=tmp_path / "b")
    assert a.schema == b.schema
    assert rows(a) == rows(b)


def test_snapshot_function_dates_and_track_history(tmp_path):
    days = {dt.date(2024, 1, 1): [(1, "a", 10)], dt.date(2024, 2, 1): [(1, "a", 11)],
            dt.date(2024, 3, 1): [(1, "b", 12)]}

    def source(latest):
        later = sorted(d for d in days if latest is None or d > latest)
        if not later:
            return None
        d = later[0]
        return pa.table({"id": [r[0] for r in days[d]], "name": [r[1] for r in days[d]],
                         "visits": [r[2] for r in days[d]]}), d

    with dp.Pipeline() as p:
        dp.create_streaming_table("h")
        dp.create_auto_cdc_from_snapshot_flow(target="h", source=source, keys=["id"],
                                              stored_as_scd_type=2,
                                              track_history_column_list=["name"])
    strata.run(p, warehouse=tmp_path / "wh", progress=False)
    got = strata.query("SELECT id, name, visits, __START_AT, __END_AT FROM h",
                       warehouse=tmp_path / "wh")
    assert rows(got) == [(1, "a", 11, dt.date(2024, 1, 1), dt.date(2024, 3, 1)),
                         (1, "b", 12, dt.date(2024, 3, 1), None)]
    # Nothing new: the function is asked with the latest date and says None.
    r = strata.run(p, warehouse=tmp_path / "wh", progress=False)
    assert r["flows"][0]["events"] == 0 or r["flows"][0]["skipped"]


def test_snapshot_function_errors(tmp_path):
    def raising(latest):
        raise ValueError("the extract is not there")

    with dp.Pipeline() as p:
        dp.create_streaming_table("h")
        dp.create_auto_cdc_from_snapshot_flow(target="h", source=raising, keys=["id"])
    with pytest.raises(strata.StrataError, match="raising\\(None\\) raised ValueError: the "
                                                 "extract is not there") as e:
        strata.run(p, warehouse=tmp_path / "wh", progress=False)
    assert "test_snapshots.py:" in str(e.value)
    assert isinstance(e.value.__cause__, ValueError)

    calls = []

    def changing(latest):
        calls.append(latest)
        if latest is None:
            return pa.table({"id": [1], "city": ["a"]}), 1
        if latest == 1:
            return pa.table({"id": [1], "town": ["a"]}), 2
        return None

    with dp.Pipeline() as p:
        dp.create_streaming_table("h")
        dp.create_auto_cdc_from_snapshot_flow(target="h", source=changing, keys=["id"])
    with pytest.raises(strata.StrataError, match="columns differ .*town"):
        strata.run(p, warehouse=tmp_path / "wh2", progress=False)

    for bad, message in [(lambda v: 42, "must return \\(data, version\\) or None"),
                         (lambda v: (pa.table({"id": [1]}), "v1"), "int, a date or a datetime"),
                         (lambda v: ({"id": [1]}, 1), "expected Arrow data")]:
        with dp.Pipeline() as p:
            dp.create_streaming_table("h")
            dp.create_auto_cdc_from_snapshot_flow(target="h", source=bad, keys=["id"])
        with pytest.raises(strata.StrataError, match=message):
            strata.run(p, warehouse=tmp_path / "wh3", progress=False)

    # A key the snapshots do not have: the engine's planning error, at the Python place.
    def no_key(latest):
        return None if latest else (pa.table({"k": [1]}), 1)

    with dp.Pipeline() as p:
        dp.create_streaming_table("h")
        dp.create_auto_cdc_from_snapshot_flow(target="h", source=no_key, keys=["id"])
    with pytest.raises(strata.StrataError, match="create_auto_cdc_from_snapshot_flow h_flow"):
        strata.run(p, warehouse=tmp_path / "wh4", progress=False)
