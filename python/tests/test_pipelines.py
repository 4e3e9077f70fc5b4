"""The Python API against the real engine: real Delta tables in temp dirs."""

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

import strata
from strata import pipelines as dp
from strata.pipelines import col, expr

from conftest import REPO, rows

USERS_EXPECTED = [
    (123, "Isabel", "Chihuahua", 5, 6),
    (123, "Isabel", "Monterrey", 1, 5),
    (124, "Raul", "Oaxaca", 1, None),
    (125, "Mercedes", "Guadalajara", 6, None),
    (125, "Mercedes", "Mexicali", 5, 6),
    (125, "Mercedes", "Tijuana", 2, 5),
    (126, "Lily", "Cancun", 2, None),
]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def jsonl(path: Path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


# ------------------------------------------------------------------------------------------
# The documentation's users example: Python equals SQL
# ------------------------------------------------------------------------------------------

def test_users_example_in_python_equals_sql(example, tmp_path):
    d = example("users")
    report = strata.run(d / "pipeline.py", warehouse=tmp_path / "py", progress=False)
    strata.run(d / "pipeline.sql", warehouse=tmp_path / "sql", progress=False)
    q = "SELECT * FROM users"
    got = strata.query(q, warehouse=tmp_path / "py")
    assert rows(got) == rows(strata.query(q, warehouse=tmp_path / "sql"))
    assert rows(got) == sorted(USERS_EXPECTED, key=lambda r: tuple(str(v) for v in r))
    assert got.column_names == ["userId", "name", "city", "__START_AT", "__END_AT"]
    # The report is the CLI's, as data.
    assert [f["flow"] for f in report["flows"]] == ["users_flow"]
    assert report["flows"][0]["events"] == 8
    assert report["ingests"][0]["table"] == "default.users_cdc"
    # A second run finds nothing new.
    again = strata.run(d / "pipeline.py", warehouse=tmp_path / "py", progress=False)
    assert again["ingests"][0]["rows"] == 0 or again["ingests"][0]["skipped"]


def test_cli_runs_a_python_pipeline(example, tmp_path):
    binary = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "debug" / "strata"
    if not binary.exists():
        pytest.skip(f"{binary} not built")
    d = example("users")
    env = dict(os.environ, STRATA_PYTHON=sys.executable)
    out = subprocess.run([str(binary), "run", str(d / "pipeline.py"), "--warehouse",
                          str(tmp_path / "wh")], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "flow users_flow: 8 event(s)" in out.stdout
    assert len(strata.query("SELECT * FROM users", warehouse=tmp_path / "wh")) == 7
    # A pipeline error exits 2 with the engine's message naming the Python place.
    bad = write(tmp_path / "bad.py", """\
        from strata import pipelines as dp
        dp.create_streaming_table("t")
        dp.create_auto_cdc_flow(target="t", source="nowhere", keys=["id"], sequence_by="seq")
    """)
    out = subprocess.run([str(binary), "run", str(bad), "--warehouse", str(tmp_path / "wh")],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "bad.py:3 (create_auto_cdc_flow t_flow)" in out.stderr
    # Without the package: a clear error.
    env["STRATA_PYTHON"] = "/nonexistent/python3"
    out = subprocess.run([str(binary), "run", str(d / "pipeline.py")], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "STRATA_PYTHON" in out.stderr


# ------------------------------------------------------------------------------------------
# Every declaration and argument, run by the engine
# ------------------------------------------------------------------------------------------

CDC_SCHEMA = "id INT, name STRING, city STRING, op STRING, seq INT"


def cdc_data(tmp_path):
    jsonl(tmp_path / "data/cdc/001.json", [
        {"id": 1, "name": "a", "city": "x", "op": "UPSERT", "seq": 1},
        {"id": 2, "name": "b", "city": "y", "op": "UPSERT", "seq": 1},
        {"id": 1, "name": None, "city": "z", "op": "UPSERT", "seq": 2},
        {"id": 3, "name": "c", "city": "w", "op": "UPSERT", "seq": 1},
        {"id": 3, "name": "c", "city": "w", "op": "DELETE", "seq": 3},
        {"id": None, "name": "bad", "city": "w", "op": "UPSERT", "seq": 9},
    ])


RICH_SQL = """\
CREATE OR REFRESH STREAMING TABLE events (
  CONSTRAINT has_id EXPECT (id IS NOT NULL) ON VIOLATION DROP ROW,
  CONSTRAINT known_op EXPECT (op IN ('UPSERT', 'DELETE'))
)
COMMENT 'raw'
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json', schema => '{schema}');

CREATE OR REFRESH STREAMING TABLE scd1 TBLPROPERTIES ('delta.enableDeletionVectors' = 'false');
CREATE FLOW scd1_flow AS AUTO CDC INTO scd1 FROM STREAM(events) KEYS (id)
IGNORE NULL UPDATES APPLY AS DELETE WHEN op = 'DELETE' APPLY AS TRUNCATE WHEN op = 'TRUNCATE'
SEQUENCE BY seq COLUMNS id, name, city STORED AS SCD TYPE 1;

CREATE OR REFRESH STREAMING TABLE scd2;
CREATE FLOW scd2_flow AS AUTO CDC INTO scd2 FROM STREAM(events) KEYS (id)
APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2 TRACK HISTORY ON * EXCEPT (name);

CREATE OR REFRESH STREAMING TABLE scd2_city;
CREATE FLOW city_flow AS AUTO CDC INTO scd2_city FROM STREAM(events) KEYS (id)
SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2 TRACK HISTORY ON city;

CREATE OR REFRESH STREAMING TABLE all_events;
CREATE FLOW copy_a AS INSERT INTO all_events BY NAME SELECT id, op FROM STREAM(events);
CREATE FLOW copy_b AS INSERT INTO all_events BY NAME SELECT id, op FROM STREAM(events) WHERE seq > 1;

CREATE TEMPORARY VIEW current_cities AS SELECT city FROM scd1;
CREATE OR REFRESH MATERIALIZED VIEW city_counts (
  CONSTRAINT some EXPECT (n > 0)
) AS SELECT city, count(*) AS n FROM current_cities GROUP BY city;
"""

RICH_PY = """\
from strata import pipelines as dp
from strata.pipelines import col, expr

@dp.table(comment="raw")
@dp.expect_or_drop("has_id", "id IS NOT NULL")
@dp.expect("known_op", col("op").isin("UPSERT", "DELETE"))
def events():
    return dp.read_files("data/cdc", format="json", schema="{schema}")

dp.create_streaming_table("scd1", table_properties={{"delta.enableDeletionVectors": "false"}})
dp.create_auto_cdc_flow(target="scd1", source="events", keys=["id"], sequence_by="seq",
                        ignore_null_updates=True, apply_as_deletes=expr("op = 'DELETE'"),
                        apply_as_truncates="op = 'TRUNCATE'", column_list=["id", "name", col("city")],
                        stored_as_scd_type=1)

dp.create_streaming_table("scd2")
dp.create_auto_cdc_flow(target="scd2", source="events", keys=[col("id")], sequence_by=col("seq"),
                        apply_as_deletes=col("op") == "DELETE", except_column_list=["op", "seq"],
                        stored_as_scd_type=2, track_history_except_column_list=["name"])

dp.create_streaming_table("scd2_city")
dp.create_auto_cdc_flow(target="scd2_city", source="events", keys=["id"], sequence_by="seq",
                        except_column_list=["op", "seq"], stored_as_scd_type="2",
                        track_history_column_list=["city"], name="city_flow")

dp.create_streaming_table("all_events")

@dp.append_flow(target="all_events")
def copy_a():
    return dp.stream("events").select("id", "op")

@dp.append_flow(target="all_events", name="copy_b")
def second():
    return "SELECT id, op FROM STREAM(events) WHERE seq > 1"

@dp.view
def current_cities():
    return dp.table_ref("scd1").select("city")

@dp.materialized_view
@dp.expect_all({{"some": "n > 0"}})
def city_counts():
    return "SELECT city, count(*) AS n FROM current_cities GROUP BY city"
"""

RICH_TABLES = ["events", "scd1", "scd2", "scd2_city", "all_events", "city_counts"]


def test_every_declaration_python_equals_sql(tmp_path):
    cdc_data(tmp_path)
    write(tmp_path / "p.sql", RICH_SQL.format(schema=CDC_SCHEMA))
    write(tmp_path / "p.py", RICH_PY.format(schema=CDC_SCHEMA))
    r_sql = strata.run(tmp_path / "p.sql", warehouse=tmp_path / "a", progress=False)
    r_py = strata.run(tmp_path / "p.py", warehouse=tmp_path / "b", progress=False)
    for t in RICH_TABLES:
        a = strata.query(f"SELECT * FROM {t}", warehouse=tmp_path / "a")
        b = strata.query(f"SELECT * FROM {t}", warehouse=tmp_path / "b")
        assert a.schema == b.schema, t
        assert rows(a) == rows(b), t
        assert len(a) > 0, t
    assert r_py["ingests"][0]["rows_dropped"] == 1
    exps = {e["name"]: e for e in r_py["ingests"][0]["expectations"]}
    assert exps["has_id"]["action"] == "drop" and exps["has_id"]["failed"] == 1
    assert exps["known_op"]["action"] == "warn"
    assert sorted(f["flow"] for f in r_py["flows"]) == sorted(f["flow"] for f in r_sql["flows"])
    # What each argument did, in the rows.
    scd1 = {r["id"]: r for r in strata.query("SELECT * FROM scd1", warehouse=tmp_path / "b")
            .to_pylist()}
    assert scd1[1]["name"] == "a"  # ignore_null_updates kept the name
    assert 3 not in scd1  # apply_as_deletes
    assert list(strata.query("SELECT * FROM scd1", warehouse=tmp_path / "b").column_names) == \
        ["id", "name", "city"]  # column_list
    city = strata.query("SELECT * FROM scd2_city WHERE id = 1", warehouse=tmp_path / "b")
    assert len(city) == 2  # the city changed: two versions


def test_rendered_sql_of_each_call():
    with dp.Pipeline() as p:
        dp.create_streaming_table("t", comment="c", schema="id INT, v STRING",
                                  table_properties={"a": "b"},
                                  expect_all={"e1": "id > 0"}, expect_all_or_drop={"e2": "v <> ''"},
                                  expect_all_or_fail={"e3": col("id").isNotNull()})
        dp.create_auto_cdc_from_snapshot_flow(target="h", source="snap", keys=["id"],
                                              stored_as_scd_type=2,
                                              track_history_column_list=["v"])
    sql = [d.sql for d in p.decls]
    assert sql[0] == ("CREATE OR REFRESH STREAMING TABLE t (\n  id INT, v STRING, "
                      "CONSTRAINT e1 EXPECT (id > 0), CONSTRAINT e2 EXPECT (v <> '') ON VIOLATION "
                      "DROP ROW, CONSTRAINT e3 EXPECT ((id IS NOT NULL)) ON VIOLATION FAIL UPDATE\n)"
                      "\nCOMMENT 'c'\nTBLPROPERTIES ('a' = 'b')")
    assert sql[1] == ("CREATE FLOW h_flow AS AUTO CDC FROM SNAPSHOT INTO h\nFROM snap\nKEYS (id)\n"
                      "STORED AS SCD TYPE 2\nTRACK HISTORY ON v")
    assert p.decls[0].origin.startswith("test_pipelines.py:")
    # The relation API.
    rel = dp.stream("src").where(col("a") > 1).with_column("b", col("a") * 2).select("*", "c")
    assert rel.sql == "SELECT *, c FROM STREAM(src) WHERE ((a > 1))"
    rel = dp.table_ref("my table").withColumn("d", dt.date(2024, 1, 2)).filter("x = 'y'")
    assert rel.sql == "SELECT *, DATE '2024-01-02' AS d FROM `my table` WHERE (x = 'y')"
    assert dp.struct("a", col("b")).sql == "STRUCT(a, b)"
    # once=True: the batch form of read_files, INSERT INTO ONCE.
    with dp.Pipeline() as p:
        @dp.append_flow(target="t", once=True)
        def backfill():
            return dp.read_files("old", format="csv", header=True).select("id")
    assert p.decls[0].sql == ("CREATE FLOW backfill AS INSERT INTO ONCE t BY NAME\n"
                              "SELECT id FROM read_files('old', format => 'csv', header => TRUE)")


def test_legacy_names_and_snapshot_table_mode(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data/001.csv").write_text("id,v\n1,a\n2,b\n")
    write(tmp_path / "p.py", """\
        import strata.pipelines as dlt

        @dlt.table
        def raw():
            return dlt.read_files("data", format="csv", header=True, schema="id INT, v STRING")

        @dlt.materialized_view
        def n_raw():
            return "SELECT count(*) AS n FROM raw"

        dlt.create_target_table("hist")
        dlt.apply_changes_from_snapshot(target="hist", source="raw", keys=["id"],
                                        stored_as_scd_type=2)
    """)
    strata.run(tmp_path / "p.py", warehouse=tmp_path / "wh", progress=False)
    got = strata.query("SELECT id, v, __END_AT FROM hist", warehouse=tmp_path / "wh")
    assert rows(got) == [(1, "a", None), (2, "b", None)]


def test_python_and_sql_in_one_pipeline(tmp_path):
    cdc_data(tmp_path)
    write(tmp_path / "bronze.sql", f"""\
        CREATE OR REFRESH STREAMING TABLE events
        AS SELECT * FROM STREAM read_files('data/cdc', format => 'json', schema => '{CDC_SCHEMA}')
        WHERE id IS NOT NULL;
    """)
    write(tmp_path / "silver.py", """\
        from strata import pipelines as dp
        dp.create_streaming_table("users")
        dp.create_auto_cdc_flow(target="users", source="events", keys=["id"], sequence_by="seq",
                                apply_as_deletes="op = 'DELETE'", except_column_list=["op", "seq"])
    """)
    write(tmp_path / "gold.sql", """\
        CREATE OR REFRESH MATERIALIZED VIEW n_users AS SELECT count(*) AS n FROM users;
    """)
    report = strata.run([tmp_path / "bronze.sql", tmp_path / "silver.py", tmp_path / "gold.sql"],
                        warehouse=tmp_path / "wh", progress=False)
    assert strata.query("SELECT n FROM n_users", warehouse=tmp_path / "wh").to_pylist() == \
        [{"n": 2}]
    assert report["views"][0]["table"] == "default.n_users"
    # An error in a SQL file of the mix names the file, line and column.
    write(tmp_path / "gold.sql", "CREATE OR REFRESH MATERIALIZED VIEW n AS SELEC 1;\n")
    with pytest.raises(strata.StrataError, match=r"gold.sql:1:\d+"):
        strata.run([tmp_path / "bronze.sql", tmp_path / "silver.py", tmp_path / "gold.sql"],
                   warehouse=tmp_path / "wh", progress=False)


PRIVATE_PY = """\
from strata import pipelines as dp

@dp.table(private=True)
def events_clean():
    return dp.read_files("data/cdc", format="json", schema="{schema}").where("id IS NOT NULL")

@dp.materialized_view(private=True)
def by_op():
    return "SELECT op, count(*) AS n FROM events_clean GROUP BY op"

@dp.materialized_view
def ops():
    return "SELECT op, n FROM by_op"
"""


def test_private_datasets_are_read_by_their_pipeline_only(tmp_path):
    cdc_data(tmp_path)
    p = write(tmp_path / "p.py", PRIVATE_PY.format(schema=CDC_SCHEMA))
    sql = strata.sql(p)
    assert "CREATE OR REFRESH PRIVATE STREAMING TABLE events_clean" in sql
    assert "CREATE OR REFRESH PRIVATE MATERIALIZED VIEW by_op" in sql
    wh = tmp_path / "wh"
    strata.run(p, warehouse=wh, progress=False)
    # The public view read the private ones...
    got = strata.query("SELECT op, n FROM ops ORDER BY op", warehouse=wh).to_pylist()
    assert sum(r["n"] for r in got) > 0
    # ...which the warehouse's catalog does not show, nor let a query read.
    shown = strata.query("SHOW TABLES", warehouse=wh).to_pylist()
    assert sorted(r["tableName"] for r in shown) == ["event_log", "ops"]
    with pytest.raises(strata.StrataError, match="events_clean"):
        strata.query("SELECT * FROM events_clean", warehouse=wh)
    # They are Delta tables all the same, in the pipeline's private folder.
    private = wh / "_strata" / "private" / "p.py" / "default"
    assert (private / "events_clean" / "_delta_log").is_dir()
    assert (private / "by_op" / "_delta_log").is_dir()
    assert not (wh / "default" / "events_clean").exists()
    # A second run of the pipeline finds its private tables again: nothing new.
    again = strata.run(p, warehouse=wh, progress=False)
    assert all(i["rows"] == 0 or i["skipped"] for i in again["ingests"])


SINK_PY = """\
from strata import pipelines as dp

@dp.table
def events():
    return dp.read_files("data/cdc", format="json", schema="{schema}")

dp.create_sink("by_path", "delta", {{"path": "out/events"}})
dp.create_sink("by_name", "delta", {{"tableName": "gold.events_copy"}})

@dp.append_flow(target="by_path")
def to_path():
    return dp.stream("events").select("id", "op", "seq")

@dp.append_flow(target="by_name")
def to_name():
    return dp.stream("events").select("id", "seq")
"""


def test_sinks_receive_append_flows_exactly_once(tmp_path):
    import deltalake
    cdc_data(tmp_path)
    p = write(tmp_path / "p.py", SINK_PY.format(schema=CDC_SCHEMA))
    assert "CREATE SINK by_path OPTIONS (format 'delta', path 'out/events')" in strata.sql(p)
    wh = tmp_path / "wh"
    strata.run(p, warehouse=wh, progress=False)
    strata.run(p, warehouse=wh, progress=False)  # nothing new: nothing appended again
    by_path = deltalake.DeltaTable(str(tmp_path / "out" / "events")).to_pyarrow_table()
    assert by_path.num_rows == 6 and by_path.column_names == ["id", "op", "seq"]
    by_name = strata.query("SELECT count(*) AS n FROM gold.events_copy", warehouse=wh)
    assert by_name.to_pylist() == [{"n": 6}]
    jsonl(tmp_path / "data/cdc/002.json",
          [{"id": 4, "name": "d", "city": "v", "op": "UPSERT", "seq": 1}])
    strata.run(p, warehouse=wh, progress=False)
    assert deltalake.DeltaTable(str(tmp_path / "out" / "events")).to_pyarrow_table().num_rows == 7
    # An AUTO CDC flow into a sink by path: the Delta table there holds the current state.
    cdc = write(tmp_path / "cdc.py", SINK_PY.format(schema=CDC_SCHEMA) + """
@dp.table
def keyed():
    return dp.read_files("data/cdc", format="json", schema="%s").where("id IS NOT NULL")

dp.create_sink("now", "delta", {"path": "out/now"})
dp.create_auto_cdc_flow(target="now", source="keyed", keys=["id"], sequence_by="seq",
                        apply_as_deletes="op = 'DELETE'", except_column_list=["op"])
""" % CDC_SCHEMA)
    strata.run(cdc, warehouse=wh, progress=False)
    now = deltalake.DeltaTable(str(tmp_path / "out" / "now")).to_pyarrow_table()
    assert now.sort_by("id").select(["id", "name", "city", "seq"]).to_pylist() == [
        {"id": 1, "name": None, "city": "z", "seq": 2},
        {"id": 2, "name": "b", "city": "y", "seq": 1},
        {"id": 4, "name": "d", "city": "v", "seq": 1},
    ]
    # A sink is written, not read.
    bad = write(tmp_path / "bad.py", SINK_PY.format(schema=CDC_SCHEMA) + """
@dp.materialized_view
def n():
    return dp.table_ref("by_path").select("id")
""")
    with pytest.raises(strata.StrataError, match="reads sink"):
        strata.run(bad, warehouse=wh, progress=False)


PARTITIONED_PY = """\
from strata import pipelines as dp
from strata.pipelines import col

@dp.table(partition_cols=["city"])
def events():
    return dp.read_files("data/cdc", format="json", schema="{schema}").where("id IS NOT NULL")

@dp.materialized_view(cluster_by=["city", col("n")])
def by_city():
    return "SELECT city, count(*) AS n FROM events GROUP BY city"

@dp.table(partition_cols=["op"], comment="ops")
def ops():
    return "SELECT op, count(*) AS n FROM events GROUP BY op"

dp.create_streaming_table("users", partition_cols=["city"])
dp.create_auto_cdc_flow(target="users", source="events", keys=["id"], sequence_by="seq",
                        apply_as_deletes="op = 'DELETE'", except_column_list=["op", "seq"],
                        stored_as_scd_type=2)
"""


def test_partition_cols_and_cluster_by_reach_the_delta_tables(tmp_path):
    import deltalake

    cdc_data(tmp_path)
    p = write(tmp_path / "p.py", PARTITIONED_PY.format(schema=CDC_SCHEMA))
    sql = strata.sql(p)
    assert "CREATE OR REFRESH STREAMING TABLE events\nPARTITIONED BY (city)\nAS SELECT" in sql
    assert "MATERIALIZED VIEW ops\nCOMMENT 'ops'\nPARTITIONED BY (op)\nAS" in sql
    wh = tmp_path / "wh"
    strata.run(p, warehouse=wh, progress=False)

    def delta(name):
        return deltalake.DeltaTable(str(wh / "default" / name))

    assert delta("events").metadata().partition_columns == ["city"]
    files = [u.split("/default/events/")[1] for u in delta("events").file_uris()]
    assert files and all(f.startswith("city=") for f in files), files
    assert delta("ops").metadata().partition_columns == ["op"]
    assert delta("users").metadata().partition_columns == ["city"]
    assert delta("by_city").metadata().partition_columns == []
    assert delta("by_city").metadata().configuration[
        "pipelines.autoOptimize.zOrderCols"] == "city,n"
    # The rows are what they are without the clauses.
    assert rows(strata.query("SELECT op, n FROM ops", warehouse=wh)) == [("DELETE", 1),
                                                                         ("UPSERT", 4)]
    assert len(strata.query("SELECT * FROM users WHERE __END_AT IS NULL", warehouse=wh)) == 2
    # A partition column the table lacks is the engine's error, naming the declaration.
    bad = write(tmp_path / "bad.py", """\
        from strata import pipelines as dp

        @dp.materialized_view(partition_cols=["nope"])
        def mv():
            return "SELECT 1 AS a, 2 AS b"
    """)
    with pytest.raises(strata.StrataError, match=r"nope"):
        strata.run(bad, warehouse=tmp_path / "wh2", progress=False)


SPEC_WITH_PYTHON = """\
name: mixed
schema: sales
libraries:
  - bronze.sql
  - py/silver.py
tables:
  - name: products
    source: {{ path: data/products, format: csv, header: true, schema: "sku STRING, price INT, seq INT" }}
    keys: [sku]
    sequence_by: seq
"""

SILVER_PY = """\
import pyarrow as pa
from strata import pipelines as dp

dp.create_streaming_table("users")
dp.create_auto_cdc_flow(target="users", source="events", keys=["id"], sequence_by="seq",
                        apply_as_deletes="op = 'DELETE'", except_column_list=["op", "seq"])

@dp.materialized_view
def discounts():
    return pa.table({{"sku": ["a", "b"], "pct": [10, {pct}]}})

@dp.materialized_view
def net_prices():
    return ("SELECT p.sku, p.price * (100 - d.pct) / 100 AS net "
            "FROM products p JOIN discounts d ON p.sku = d.sku")
"""


def spec_project(tmp_path, pct=20):
    cdc_data(tmp_path)
    write(tmp_path / "data/products/001.csv", "sku,price,seq\na,100,1\nb,200,1\n")
    write(tmp_path / "bronze.sql", f"""\
        CREATE OR REFRESH STREAMING TABLE events
        AS SELECT * FROM STREAM read_files('data/cdc', format => 'json', schema => '{CDC_SCHEMA}')
        WHERE id IS NOT NULL;
    """)
    write(tmp_path / "py/silver.py", SILVER_PY.format(pct=pct))
    return write(tmp_path / "spec.yaml", SPEC_WITH_PYTHON.format())


def test_yaml_spec_with_a_python_library_runs_from_python(tmp_path):
    spec = spec_project(tmp_path)
    wh = tmp_path / "wh"
    report = strata.run(spec, warehouse=wh, progress=False)
    assert sorted(f["flow"] for f in report["flows"]) == ["products_flow", "users_flow"]
    # The Python library's datasets are in the spec's schema, with the SQL's and the tables'.
    assert rows(strata.query("SELECT id, name FROM sales.users", warehouse=wh)) == \
        [(1, None), (2, "b")]
    assert rows(strata.query("SELECT sku, net FROM sales.net_prices", warehouse=wh)) == \
        [("a", 90), ("b", 160)]
    assert (wh / "sales" / "discounts__python").is_dir()
    # The event log names the spec; python -m strata runs it too, with new Python data.
    assert "spec.yaml" in strata.events(warehouse=wh).column("pipeline")[0].as_py()
    write(tmp_path / "py/silver.py", SILVER_PY.format(pct=50))
    out = subprocess.run([sys.executable, "-m", "strata", "run", str(spec), "--warehouse",
                          str(wh)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "materialized view sales.net_prices: recomputed, 2 row(s)" in out.stdout
    assert rows(strata.query("SELECT sku, net FROM sales.net_prices", warehouse=wh)) == \
        [("a", 90), ("b", 100)]
    # An error in the Python library names its file and line.
    write(tmp_path / "py/silver.py", """\
        from strata import pipelines as dp
        dp.create_streaming_table("t")
        dp.create_auto_cdc_flow(target="t", source="nowhere", keys=["id"], sequence_by="seq")
    """)
    with pytest.raises(strata.StrataError, match=r"silver.py:3 \(create_auto_cdc_flow t_flow\)"):
        strata.run(spec, warehouse=wh, progress=False)
    write(tmp_path / "spec.yaml",
          SPEC_WITH_PYTHON.format().replace("py/silver.py", "py/gone.py"))
    with pytest.raises(strata.StrataError, match=r"spec.yaml: libraries\[1\]: cannot read "
                                                 r"\S*py/gone.py: no such file"):
        strata.run(spec, warehouse=wh, progress=False)


def test_cli_binary_refuses_a_spec_with_a_python_library(tmp_path):
    binary = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "debug" / "strata"
    if not binary.exists():
        pytest.skip(f"{binary} not built")
    spec = spec_project(tmp_path)
    out = subprocess.run([str(binary), "run", str(spec), "--warehouse", str(tmp_path / "wh")],
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "libraries[1]:" in out.stderr and "is a Python pipeline file" in out.stderr
    assert f"python -m strata run {spec}" in out.stderr
    assert not (tmp_path / "wh" / "sales").exists()


def test_notebook_style_default_pipeline_progress_and_refresh(tmp_path, capsys):
    cdc_data(tmp_path)
    os.chdir(tmp_path)
    dp.current().clear()
    try:
        @dp.table(name="ev")
        def anything():
            return dp.read_files("data/cdc", format="json", schema=CDC_SCHEMA).where("id IS NOT NULL")

        seen = []
        strata.run(warehouse="wh", progress=lambda *a: seen.append(a))
        assert ("started", "table default.ev", "", 0.0) in seen
        assert any(e[0] == "finished" and e[1] == "table default.ev" for e in seen)
        strata.run(warehouse="wh", full_refresh=True)
        out = capsys.readouterr().out
        assert "table default.ev: 1 file(s), 5 row(s) appended" in out  # a plain line per dataset
        assert len(strata.query("SELECT * FROM ev", warehouse="wh")) == 5
        r = strata.run(warehouse="wh", full_refresh=["ev"], progress=False)
        assert r["set_aside"] and r["set_aside"][0][0] == "default.ev"
        r = strata.run(warehouse="wh", select="ev", progress=False)
        assert r["ingests"][0]["rows"] == 0
    finally:
        dp.current().clear()


def test_once_flow_backfills_one_time(tmp_path):
    """@dp.append_flow(once=True) is INSERT INTO ONCE: the backfill's files are appended in the
    first run only (later files in its folder wait for a full refresh), while the live flow
    keeps taking new files; a full refresh of the target runs the backfill again."""
    jsonl(tmp_path / "data/live/001.json", [{"id": 10, "v": "live"}])
    jsonl(tmp_path / "data/old/001.json", [{"id": 1, "v": "old"}, {"id": 2, "v": "old"}])
    jsonl(tmp_path / "data/old/002.json", [{"id": 3, "v": "old"}])
    jsonl(tmp_path / "data/legacy/001.json", [{"id": 102}])
    p = write(tmp_path / "p.py", """\
        from strata import pipelines as dp

        dp.create_streaming_table("events")

        @dp.append_flow(target="events")
        def live():
            return dp.read_files("data/live", format="json", schema="id INT, v STRING")

        @dp.append_flow(target="events", once=True)
        def backfill():
            return dp.read_files("data/old", format="json", schema="id INT, v STRING") \\
                .where("id > 1")

        @dp.table
        def legacy():
            return dp.read_files("data/legacy", format="json", schema="id INT")

        @dp.append_flow(target="events", once=True, name="from_table")
        def seed():
            return dp.table_ref("legacy").with_column("v", "seed")
    """)
    wh = tmp_path / "wh"
    ids = lambda: sorted(r["id"] for r in strata.query("SELECT id FROM events", warehouse=wh)
                         .to_pylist())
    r = strata.run(p, warehouse=wh, progress=False)
    assert ids() == [2, 3, 10, 102]
    once = {i["flow"]: i for i in r["ingests"] if i["flow"] in ("backfill", "from_table")}
    assert once["backfill"]["files"] == ["001.json", "002.json"]
    assert once["backfill"]["rows"] == 2 and once["backfill"]["skipped"] is None
    assert once["from_table"]["rows"] == 1
    # New files for both flows: only the live one takes its new file.
    jsonl(tmp_path / "data/live/002.json", [{"id": 11, "v": "live"}])
    jsonl(tmp_path / "data/old/003.json", [{"id": 4, "v": "old"}])
    jsonl(tmp_path / "data/legacy/002.json", [{"id": 103}])
    r = strata.run(p, warehouse=wh, progress=False)
    assert ids() == [2, 3, 10, 11, 102]
    skipped = {i["flow"]: i["skipped"] for i in r["ingests"]}
    assert skipped["backfill"].startswith("once flow already ran at version ")
    assert "a full refresh of default.events runs it again" in skipped["backfill"]
    assert skipped["from_table"].startswith("once flow already ran at version ")
    # The version named is the commit that holds the backfill's rows.
    version = int(skipped["backfill"].split("at version ")[1].split()[0])
    hist = strata.query("DESCRIBE HISTORY events", warehouse=wh).to_pylist()
    assert any(h["version"] == version for h in hist)
    # A full refresh of the target runs the backfill again, over its folder as it is now.
    strata.run(p, warehouse=wh, full_refresh=["events"], progress=False)
    assert ids() == [2, 3, 4, 10, 11, 102, 103]


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------

def test_auto_cdc_once_backfills_history_the_streaming_flow_continues(tmp_path):
    """create_auto_cdc_flow(once=True) is AUTO CDC ONCE: a table of old change events is
    folded into the target once, next to the streaming flow; a late event of the stream that
    belongs before the backfill's versions is placed into history."""
    jsonl(tmp_path / "data/old/1.json", [
        {"id": 1, "name": "a0", "seq": 1},
        {"id": 1, "name": "a1", "seq": 3},
        {"id": 2, "name": "b0", "seq": 1},
    ])
    jsonl(tmp_path / "data/new/1.json", [
        {"id": 1, "name": "a2", "seq": 5},
        {"id": 2, "name": "b-late", "seq": 2},
    ])
    p = write(tmp_path / "p.py", """\
        from strata import pipelines as dp

        @dp.table
        def history():
            return dp.read_files("data/old", format="json", schema="id INT, name STRING, seq INT")

        @dp.table
        def events():
            return dp.read_files("data/new", format="json", schema="id INT, name STRING, seq INT")

        dp.create_streaming_table("users")
        dp.create_auto_cdc_flow(target="users", source="events", keys=["id"], sequence_by="seq",
                                stored_as_scd_type=2, name="live")
        dp.create_auto_cdc_flow(target="users", source="history", keys=["id"], sequence_by="seq",
                                stored_as_scd_type=2, name="backfill", once=True)
    """)
    assert "AS AUTO CDC ONCE INTO users\nFROM history\n" in strata.sql(p)
    wh = tmp_path / "wh"
    strata.run(p, warehouse=wh, progress=False)
    q = "SELECT id, name, __START_AT, __END_AT FROM users"
    expected = [(1, "a0", 1, 3), (1, "a1", 3, 5), (1, "a2", 5, None),
                (2, "b-late", 2, None), (2, "b0", 1, 2)]
    assert set(rows(strata.query(q, warehouse=wh))) == set(expected)
    # The backfill does not run again, even when its source grows.
    jsonl(tmp_path / "data/old/2.json", [{"id": 3, "name": "c0", "seq": 1}])
    strata.run(p, warehouse=wh, progress=False)
    assert len(strata.query(q, warehouse=wh)) == 5


def test_unknown_argument_and_wrong_types():
    with dp.Pipeline():
        with pytest.raises(TypeError, match="unexpected keyword argument 'keyz'"):
            dp.create_auto_cdc_flow(target="t", source="s", keyz=["id"], sequence_by="seq")
        with pytest.raises(TypeError):
            @dp.table(nme="x")
            def x():
                return "SELECT 1"
        with pytest.raises(strata.StrataError, match="keys: expected a list of column names"):
            dp.create_auto_cdc_flow(target="t", source="s", keys="id", sequence_by="seq")
        with pytest.raises(strata.StrataError, match="stored_as_scd_type must be 1 or 2"):
            dp.create_auto_cdc_flow(target="t", source="s", keys=["id"], sequence_by="seq",
                                    stored_as_scd_type=3)
        with pytest.raises(strata.StrataError, match="ignore_null_updates must be True or False"):
            dp.create_auto_cdc_flow(target="t", source="s", keys=["id"], sequence_by="seq",
                                    ignore_null_updates="yes")
        with pytest.raises(strata.StrataError, match="column_list or except_column_list"):
            dp.create_auto_cdc_flow(target="t", source="s", keys=["id"], sequence_by="seq",
                                    column_list=["a"], except_column_list=["b"])
        with pytest.raises(strata.StrataError, match="row_filter is not supported"):
            dp.create_streaming_table("t", row_filter="ROW FILTER f ON (a)")
        with pytest.raises(strata.StrataError, match="give partition_cols or cluster_by, not "
                                                     "both"):
            dp.create_streaming_table("t", partition_cols=["a"], cluster_by=["b"])
        with pytest.raises(strata.StrataError, match=r"test_pipelines.py:\d+ \(create_streaming_"
                                                     r"table t\): partition_cols: expected a "
                                                     r"list of column names, got str"):
            dp.create_streaming_table("t", partition_cols="a")
        with pytest.raises(strata.StrataError, match="once must be True or False"):
            dp.create_auto_cdc_flow(target="t", source="s", keys=["id"], sequence_by="s",
                                    once="yes")
        with pytest.raises(strata.StrataError, match="a once=True flow reads in batch"):
            @dp.append_flow(target="t", once=True)
            def from_stream():
                return dp.stream("s")
        with pytest.raises(strata.StrataError, match="a once=True flow reads in batch"):
            @dp.append_flow(target="t", once=True)
            def from_sql_stream():
                return "SELECT * FROM STREAM(s)"
        with pytest.raises(strata.StrataError, match="must return SQL text, a relation"):
            @dp.materialized_view
            def y():
                return 42
        with pytest.raises(strata.StrataError, match="truth value"):
            bool(col("a") == 1)
        with pytest.raises(strata.StrataError, match="schema must be a DDL string"):
            dp.create_streaming_table("u", schema=["id"])


def test_engine_errors_name_the_python_place(tmp_path):
    cdc_data(tmp_path)
    p = write(tmp_path / "p.py", f"""\
        from strata import pipelines as dp

        @dp.table
        def events():
            return dp.read_files("data/cdc", format="json", schema="{CDC_SCHEMA}")

        dp.create_streaming_table("t")
        dp.create_auto_cdc_flow(target="t", source="events", keys=["userId"], sequence_by="seq")
    """)
    with pytest.raises(strata.StrataError) as e:
        strata.run(p, warehouse=tmp_path / "wh", progress=False)
    assert "p.py:8 (create_auto_cdc_flow t_flow)" in str(e.value)
    assert "userId" in str(e.value)
    assert e.value.kind == "pipeline"
    # A rejected batch: the engine's message, nothing written.
    p = write(tmp_path / "q.py", f"""\
        from strata import pipelines as dp

        @dp.table
        @dp.expect_or_fail("has_id", "id IS NOT NULL")
        def events():
            return dp.read_files("data/cdc", format="json", schema="{CDC_SCHEMA}")
    """)
    with pytest.raises(strata.StrataError, match="has_id"):
        strata.run(p, warehouse=tmp_path / "wh2", progress=False)
    # A SQL error in SQL text returned by a function names the declaration.
    p = write(tmp_path / "r.py", """\
        from strata import pipelines as dp

        @dp.materialized_view
        def mv():
            return "SELECT FROM WHERE"
    """)
    with pytest.raises(strata.StrataError, match=r"r.py:3 \(@dp.materialized_view mv\)"):
        strata.run(p, warehouse=tmp_path / "wh3", progress=False)
    with pytest.raises(strata.StrataError, match="no such file"):
        strata.run(tmp_path / "missing.py", warehouse=tmp_path / "wh3")
    with pytest.raises(strata.StrataError, match="already declared"):
        with dp.Pipeline():
            dp.create_streaming_table("dup")
            dp.create_streaming_table("dup")


# ------------------------------------------------------------------------------------------
# Reading: query, as_of, events
# ------------------------------------------------------------------------------------------

def test_query_as_of_events(example, tmp_path):
    import pandas as pd
    import polars as pl

    d = example("users")
    strata.run(d / "pipeline.py", warehouse=tmp_path / "wh", progress=False)
    wh = tmp_path / "wh"
    t = strata.query("SELECT * FROM users ORDER BY userId, __START_AT", warehouse=wh)
    assert isinstance(t, pa.Table)
    df = t.to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == 7
    assert pl.from_arrow(t).shape == (7, 5)
    assert pl.DataFrame(strata.query_stream("SELECT 1 AS one", warehouse=wh)).to_dicts() == \
        [{"one": 1}]
    at = strata.as_of("users", 5, warehouse=wh)
    assert rows(at.select(["userId", "city"])) == [
        (123, "Chihuahua"), (124, "Raul") if False else (124, "Oaxaca"),
        (125, "Mexicali"), (126, "Cancun")]
    ev = strata.events(warehouse=wh)
    assert set(ev.column("status").to_pylist()) == {"COMPLETED"}
    assert "users_flow" in ev.column("flow").to_pylist()
    assert len(strata.events(warehouse=wh, flow="users_flow")) == 1
    with pytest.raises(strata.StrataError) as e:
        strata.query("SELECT * FROM no_such_table", warehouse=wh)
    assert "no_such_table" in str(e.value)


def test_query_hands_over_arrow_buffers_without_copying(tmp_path):
    n = 5_000_000
    before = pa.total_allocated_bytes()
    t = strata.query(f"SELECT value AS v, value * 2 AS w FROM generate_series(1, {n})",
                     warehouse=tmp_path / "wh")
    assert len(t) == n
    # pyarrow's allocator allocated nothing for 80 MB of values: the buffers are the
    # engine's, imported through the C stream interface.
    assert pa.total_allocated_bytes() - before < 1 << 20
    assert t.nbytes >= 16 * n
    # Every value, in whatever order the engine's partitions delivered them (no ORDER BY).
    import pyarrow.compute as pc
    v, w = t.column("v"), t.column("w")
    assert pc.all(pc.equal(w, pc.multiply(v, 2))).as_py()
    assert (pc.min(v).as_py(), pc.max(v).as_py(), pc.count_distinct(v).as_py()) == (1, n, n)


MUSIC_TABLES = ["bronze_users", "bronze_artists", "bronze_tracks", "bronze_streams",
                "silver_users", "silver_tracks", "silver_streams", "dim_user", "dim_track",
                "dim_artist", "fact_stream", "plan_hours_by_month", "plan_hours_by_month_naive",
                "genre_hours_by_month"]


def test_music_streaming_in_python_equals_sql(example, tmp_path):
    import shutil

    d = example("music_streaming")
    reports = {}
    for lang in ("sql", "py"):
        for batch in ("batch1", "batch2"):
            shutil.copytree(d / "data" / batch, d / "incoming", dirs_exist_ok=True)
            reports[lang, batch] = strata.run(d / f"pipeline.{lang}",
                                              warehouse=tmp_path / lang, progress=False)
        shutil.rmtree(d / "incoming")
    for t in MUSIC_TABLES:
        a = strata.query(f"SELECT * FROM {t}", warehouse=tmp_path / "sql")
        b = strata.query(f"SELECT * FROM {t}", warehouse=tmp_path / "py")
        assert a.schema == b.schema, t
        assert len(a) > 0, t
        assert rows(a) == rows(b), t
    for batch in ("batch1", "batch2"):
        exp = lambda r: sorted((i["table"], e["name"], e["action"], e["failed"])  # noqa: E731
                               for i in r["ingests"] for e in i["expectations"])
        assert exp(reports["sql", batch]) == exp(reports["py", batch])
