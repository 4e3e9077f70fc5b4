"""@dp.table / @dp.materialized_view functions returning Arrow data (pyarrow, pandas, Polars):
a materialized view of what the function returns when the pipeline runs."""

import datetime as dt
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

import strata
from strata import pipelines as dp

from conftest import rows


def frame(pairs, flavour):
    """(id, name) pairs as a pyarrow Table, a pandas or a Polars DataFrame."""
    t = pa.table({"id": pa.array([p[0] for p in pairs], pa.int64()),
                  "name": pa.array([p[1] for p in pairs], pa.string())})
    if flavour == "pandas":
        return t.to_pandas()
    if flavour == "polars":
        import polars as pl
        return pl.from_arrow(t)
    return t


@pytest.mark.parametrize("flavour", ["pyarrow", "pandas", "polars"])
def test_returned_rows_are_a_materialized_view_recomputed_each_run(tmp_path, flavour):
    state = {"rows": [(9, "declared")]}
    orders = tmp_path / "orders"
    with dp.Pipeline() as p:
        @dp.materialized_view(comment="prices from Python")
        @dp.expect_or_drop("has_name", "name IS NOT NULL")
        def prices():
            return frame(state["rows"], flavour)

        @dp.materialized_view
        def n_prices():
            return "SELECT count(*) AS n FROM prices"

        @dp.table
        def long_names():
            return dp.table_ref("prices").where("length(name) > 1")

        @dp.table  # a stream joined with the view, read in batch
        def orders_named():
            return (f"SELECT o.order_id, p.name FROM STREAM read_files('{orders}', "
                    "format => 'json', schema => 'order_id INT, id BIGINT') o "
                    "JOIN prices p ON o.id = p.id")
    wh = tmp_path / "wh"
    orders.mkdir()
    (orders / "1.json").write_text('{"order_id": 10, "id": 1}\n{"order_id": 11, "id": 2}\n')
    # The rows are the function's result when the pipeline runs, not when it was declared.
    state["rows"] = [(1, "a"), (2, "bb"), (3, None)]
    r1 = strata.run(p, warehouse=wh, progress=False)
    assert rows(strata.query("SELECT * FROM prices", warehouse=wh)) == [(1, "a"), (2, "bb")]
    mv = {v["table"]: v for v in r1["views"]}["default.prices"]
    assert mv["rows_dropped"] == 1 and mv["rows"] == 2
    assert strata.query("SELECT n FROM n_prices", warehouse=wh).to_pylist() == [{"n": 2}]
    assert rows(strata.query("SELECT * FROM long_names", warehouse=wh)) == [(2, "bb")]
    # As with any materialized view, a stream joining it waits for its first columns.
    assert any("orders_named" in w and "joins default.prices" in w for w in r1["waiting"])

    # A second run with other data replaces the rows, and what reads them follows: views
    # recompute, a stream's new rows meet the new rows.
    state["rows"] = [(1, "a2"), (4, "dd")]
    (orders / "2.json").write_text('{"order_id": 12, "id": 1}\n')
    r2 = strata.run(p, warehouse=wh, progress=False)
    assert rows(strata.query("SELECT * FROM prices", warehouse=wh)) == [(1, "a2"), (4, "dd")]
    assert not {v["table"]: v for v in r2["views"]}["default.prices"]["skipped"]
    assert strata.query("SELECT n FROM n_prices", warehouse=wh).to_pylist() == [{"n": 2}]
    assert rows(strata.query("SELECT * FROM long_names", warehouse=wh)) == [(1, "a2"), (4, "dd")]
    assert rows(strata.query("SELECT * FROM orders_named", warehouse=wh)) == \
        [(10, "a2"), (12, "a2")]
    state["rows"] = [(1, "a3")]
    (orders / "3.json").write_text('{"order_id": 13, "id": 1}\n')
    strata.run(p, warehouse=wh, progress=False)
    assert rows(strata.query("SELECT * FROM orders_named", warehouse=wh)) == \
        [(10, "a2"), (12, "a2"), (13, "a3")]
    assert strata.query("SELECT n FROM n_prices", warehouse=wh).to_pylist() == [{"n": 1}]

    # The rows are staged in a table of the warehouse, beside the view.
    staged = strata.query("SELECT * FROM prices__python", warehouse=wh)
    assert rows(staged) == [(1, "a3")]
    assert (wh / "default" / "prices__python" / "_delta_log").is_dir()
    detail = strata.query("DESCRIBE DETAIL prices", warehouse=wh).to_pylist()[0]
    assert detail["description"] == "prices from Python"


def test_flows_read_it_as_they_read_any_materialized_view():
    def refused(source_sql):
        with dp.Pipeline() as p:
            if source_sql:
                dp.materialized_view(name="src")(lambda: "SELECT 1 AS id")
            else:
                dp.materialized_view(name="src")(lambda: pa.table({"id": [1]}))
            dp.create_streaming_table("hist")
            dp.create_auto_cdc_from_snapshot_flow(target="hist", source="src", keys=["id"])
        with pytest.raises(strata.StrataError) as e:
            strata.plan(p)
        return str(e.value)

    assert refused(False) == refused(True)
    assert "flow hist_flow reads default.src, which is not declared" in refused(False)


def test_pipeline_file_calls_the_function_once_per_run(tmp_path):
    (tmp_path / "rates.csv").write_text("currency,rate\nEUR,1.0\nUSD,1.1\n")
    p = tmp_path / "p.py"
    p.write_text(textwrap.dedent("""\
        from pathlib import Path
        import pyarrow.csv
        from strata import pipelines as dp

        HERE = Path(__file__).parent

        @dp.table(partition_cols=["currency"], schema="currency STRING, rate DOUBLE")
        def rates():
            with open(HERE / "calls.txt", "a") as f:
                f.write("call\\n")
            return pyarrow.csv.read_csv(HERE / "rates.csv")

        @dp.materialized_view
        def usd():
            return "SELECT rate FROM rates WHERE currency = 'USD'"
    """))
    wh = tmp_path / "wh"
    strata.run(p, warehouse=wh, progress=False)
    assert strata.query("SELECT rate FROM usd", warehouse=wh).to_pylist() == [{"rate": 1.1}]
    (tmp_path / "rates.csv").write_text("currency,rate\nEUR,1.0\nUSD,1.2\nGBP,0.9\n")
    strata.run(p, warehouse=wh, progress=False)
    assert strata.query("SELECT rate FROM usd", warehouse=wh).to_pylist() == [{"rate": 1.2}]
    assert len(strata.query("SELECT * FROM rates", warehouse=wh)) == 3
    # Declared when the file was read, and that result is the run's: one call per run.
    assert (tmp_path / "calls.txt").read_text().count("call") == 2
    import deltalake
    assert deltalake.DeltaTable(str(wh / "default" / "rates")).metadata().partition_columns \
        == ["currency"]


def test_columns_may_change_between_runs_and_types_become_delta_types(tmp_path):
    state = {"t": pa.table({"id": pa.array([1], pa.uint32()), "v": ["x"]})}
    with dp.Pipeline() as p:
        @dp.materialized_view
        def data():
            return state["t"]
    wh = tmp_path / "wh"
    strata.run(p, warehouse=wh, progress=False)
    got = strata.query("SELECT * FROM data", warehouse=wh)
    assert got.schema.field("id").type == pa.int64()  # UInt32 has no Delta type
    state["t"] = pa.table({
        "id": pa.array([2], pa.int32()),
        "at": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6)], pa.timestamp("ns")),
        "cat": pa.array(["a"]).dictionary_encode(),
    })
    strata.run(p, warehouse=wh, progress=False)
    got = strata.query("SELECT * FROM data", warehouse=wh)
    assert got.column_names == ["id", "at", "cat"]
    assert got.to_pylist() == [{"id": 2, "at": dt.datetime(2024, 1, 2, 3, 4, 5, 6), "cat": "a"}]


def test_errors_name_the_function(tmp_path):
    wh = tmp_path / "wh"
    state = {"result": pa.table({"id": [1]})}

    def result():
        r = state["result"]
        if isinstance(r, Exception):
            raise r
        return r

    with dp.Pipeline() as p:
        @dp.materialized_view
        def feed():
            return result()
    origin = r"test_returned_data.py:\d+ \(@dp.materialized_view feed\)"

    state["result"] = ValueError("the API is down")
    with pytest.raises(strata.StrataError, match=origin + r": feed\(\) raised ValueError: "
                                                          r"the API is down") as e:
        strata.run(p, warehouse=wh, progress=False)
    assert isinstance(e.value.__cause__, ValueError)
    assert not wh.exists() or not (wh / "default").exists()  # nothing was run

    state["result"] = "SELECT 1 AS id"
    with pytest.raises(strata.StrataError, match=origin + r": feed\(\) returned Arrow data "
                                                          r"when it was declared and now str"):
        strata.run(p, warehouse=wh, progress=False)

    state["result"] = pa.table({"t": pa.array([1], pa.time64("us"))})
    with pytest.raises(strata.StrataError, match=origin + r": the data feed\(\) returned: .*"
                                                          r"column t: .*no Delta type"):
        strata.run(p, warehouse=wh, progress=False)

    with dp.Pipeline():
        with pytest.raises(strata.StrataError, match="must return SQL text, a relation .* or "
                                                     "Arrow data"):
            @dp.materialized_view
            def nothing():
                return None

        dp.create_streaming_table("t")
        with pytest.raises(strata.StrataError, match="a flow's function returns a stream"):
            @dp.append_flow(target="t")
            def rows_from_python():
                return pa.table({"id": [1]})


def test_a_view_over_returned_data_and_plan_runs_nothing(tmp_path):
    calls = []

    def make():
        calls.append(1)
        return pa.table({"id": [1, 2, 3]})

    with dp.Pipeline() as p:
        dp.view(name="ids")(make)

        @dp.materialized_view
        def odd():
            return "SELECT id FROM ids WHERE id % 2 = 1"
    assert len(calls) == 1  # declaring calls it once, to see what it returns
    steps = strata.plan(p)
    assert [s["name"] for s in steps] == ["default.odd"]
    assert "FROM ids__python" in strata.sql(p)
    assert len(calls) == 1
    strata.run(p, warehouse=tmp_path / "wh", progress=False)
    assert len(calls) == 2
    assert rows(strata.query("SELECT id FROM odd", warehouse=tmp_path / "wh")) == [(1,), (3,)]
