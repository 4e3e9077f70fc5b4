"""`strata serve --pg` read by psycopg (3, with libpq from its binary wheel), and `strata
serve --flight` read by ADBC's Flight SQL driver: the real binary of the workspace's debug
build on a warehouse built by `strata run`; typed values in text and binary, parameters
bound by the protocol, Arrow tables, the tables listed, refused writes; both over TLS with
a CA made by the openssl command, SCRAM-SHA-256 checking psycopg's password."""

import datetime
import decimal
import os
import subprocess
from pathlib import Path

import adbc_driver_flightsql.dbapi
import adbc_driver_manager.dbapi
import psycopg
import pyarrow as pa
import pytest

from conftest import REPO

PASSWORD = "s3cret-psycopg"
TOKEN = "t0ken-adbc"

PIPELINE = """
CREATE OR REFRESH STREAMING TABLE orders_cdc
AS SELECT * FROM STREAM read_files('data/cdc', format => 'json',
  schema => 'id BIGINT, name STRING, amount DECIMAL(10,2), placed_at TIMESTAMP, local_at TIMESTAMP_NTZ, day DATE, tags ARRAY<STRING>, addr STRUCT<city: STRING, zip INT>, seq INT');
CREATE OR REFRESH STREAMING TABLE orders;
CREATE FLOW orders_flow AS AUTO CDC INTO orders
FROM STREAM(orders_cdc)
KEYS (id)
SEQUENCE BY seq
COLUMNS * EXCEPT (seq)
STORED AS SCD TYPE 2;
"""

DATA = """{"id": 1, "name": "Isabel", "amount": "123.45", "placed_at": "2024-01-01T10:00:00Z", "local_at": "2024-01-01T10:00:00.5", "day": "2024-01-01", "tags": ["a", "b"], "addr": {"city": "Monterrey", "zip": 64000}, "seq": 1}
{"id": 2, "name": "Raul", "amount": "-0.05", "placed_at": "2024-02-29T23:59:59.123456Z", "local_at": "2024-02-29T23:59:59", "day": "2024-02-29", "tags": [], "addr": {"city": "Oaxaca", "zip": null}, "seq": 1}
"""


def strata_binary() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    path = target / "debug" / "strata"
    if not path.is_file():
        pytest.fail(f"{path} not found: build it with cargo build --workspace")
    return path


def serve(tmp_path, listen, marker):
    """`strata serve listen...` on a fresh warehouse: the port of the line with `marker`."""
    strata = strata_binary()
    (tmp_path / "data" / "cdc").mkdir(parents=True)
    (tmp_path / "data" / "cdc" / "001.json").write_text(DATA)
    (tmp_path / "pipeline.sql").write_text(PIPELINE)
    env = {k: v for k, v in os.environ.items() if k not in ("STRATA_WAREHOUSE", "RUST_LOG")}
    subprocess.run([strata, "run", "pipeline.sql"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    env["STRATA_SERVE_PASSWORD"] = PASSWORD
    env["STRATA_SERVE_TOKEN"] = TOKEN
    proc = subprocess.Popen([strata, "serve", *listen], cwd=tmp_path, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            if marker in line:
                port = int(line.split("127.0.0.1:")[1].split()[0])
                break
        assert port, "strata serve ended before listening"
        yield port
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0


@pytest.fixture
def server(tmp_path):
    """`strata serve --pg 127.0.0.1:0` on a fresh warehouse: the port it listens on."""
    yield from serve(tmp_path, ["--pg", "127.0.0.1:0"], "PostgreSQL clients on 127.0.0.1:")


@pytest.fixture
def flight(tmp_path):
    """`strata serve --flight 127.0.0.1:0` on a fresh warehouse: the port it listens on."""
    yield from serve(tmp_path, ["--flight", "127.0.0.1:0"],
                     "Flight SQL clients on 127.0.0.1:")


def connect(port):
    return psycopg.connect(f"host=127.0.0.1 port={port} user=strata password={PASSWORD} "
                           "dbname=main")


def test_psycopg_reads_typed_values_with_parameters(server):
    with connect(server) as conn:
        for binary in (False, True):
            cur = conn.cursor(binary=binary)
            cur.execute("SELECT id, name, amount, placed_at, local_at, day, tags, addr "
                        "FROM orders WHERE id = %s AND name = %s", (2, "Raul"))
            assert [d.type_code for d in cur.description] == [20, 25, 1700, 1184, 1114, 1082,
                                                             114, 114]
            utc = datetime.timezone.utc
            assert cur.fetchall() == [(
                2, "Raul", decimal.Decimal("-0.05"),
                datetime.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=utc),
                datetime.datetime(2024, 2, 29, 23, 59, 59),
                datetime.date(2024, 2, 29),
                [],
                {"city": "Oaxaca", "zip": None},
            )], f"binary={binary}"
        cur = conn.cursor()
        cur.execute("SELECT id FROM orders WHERE placed_at > %s AND amount > %s ORDER BY id",
                    (datetime.datetime(2024, 1, 1, 12, tzinfo=datetime.timezone.utc),
                     decimal.Decimal("-1")))
        assert cur.fetchall() == [(2,)]
        with pytest.raises(psycopg.Error) as refused:
            cur.execute("DELETE FROM orders WHERE id = %s", (1,))
        assert refused.value.sqlstate == "25006"
        conn.rollback()
        cur.execute("SELECT count(*) FROM orders")
        assert cur.fetchone() == (2,)


def test_adbc_reads_arrow_tables_and_lists_the_tables(flight):
    uri = f"grpc://127.0.0.1:{flight}"
    with adbc_driver_flightsql.dbapi.connect(
            uri, db_kwargs={"username": "strata", "password": PASSWORD},
            autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("SELECT id, name, amount, placed_at, day, tags, addr FROM orders "
                    "ORDER BY id")
        table = cur.fetch_arrow_table()
        assert table.schema.field("name").type == pa.string()
        assert table.schema.field("amount").type == pa.decimal128(10, 2)
        utc = datetime.timezone.utc
        assert table.to_pylist() == [
            {"id": 1, "name": "Isabel", "amount": decimal.Decimal("123.45"),
             "placed_at": datetime.datetime(2024, 1, 1, 10, tzinfo=utc),
             "day": datetime.date(2024, 1, 1), "tags": ["a", "b"],
             "addr": {"city": "Monterrey", "zip": 64000}},
            {"id": 2, "name": "Raul", "amount": decimal.Decimal("-0.05"),
             "placed_at": datetime.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=utc),
             "day": datetime.date(2024, 2, 29), "tags": [],
             "addr": {"city": "Oaxaca", "zip": None}},
        ]
        # Parameters, bound by the driver (a prepared statement with its values).
        cur.execute("SELECT name FROM orders WHERE id = $1 AND amount > $2",
                    parameters=(2, decimal.Decimal("-1")))
        assert cur.fetch_arrow_table().to_pylist() == [{"name": "Raul"}]
        # pandas through the same cursor.
        cur.execute("SELECT count(*) AS n FROM orders")
        assert cur.fetch_df()["n"].tolist() == [2]

        objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
        tables = {(c["catalog_name"], s["db_schema_name"], t["table_name"])
                  for c in objects for s in c["catalog_db_schemas"]
                  for t in s["db_schema_tables"]}
        assert {("main", "default", "orders"), ("main", "default", "orders_cdc")} <= tables

        with pytest.raises(adbc_driver_manager.dbapi.Error) as refused:
            cur.execute("DELETE FROM orders WHERE id = 1")
        assert "read-only: DELETE is refused" in str(refused.value)
        cur.execute("SELECT count(*) AS n FROM orders")
        assert cur.fetch_arrow_table().to_pylist() == [{"n": 2}]


def test_adbc_with_the_bearer_token_and_a_wrong_password(flight):
    uri = f"grpc://127.0.0.1:{flight}"
    header = adbc_driver_flightsql.DatabaseOptions.AUTHORIZATION_HEADER.value
    with adbc_driver_flightsql.dbapi.connect(
            uri, db_kwargs={header: f"Bearer {TOKEN}"}, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("SELECT name FROM orders WHERE id = 2")
        assert cur.fetch_arrow_table().to_pylist() == [{"name": "Raul"}]
    with pytest.raises(adbc_driver_manager.dbapi.Error) as refused:
        with adbc_driver_flightsql.dbapi.connect(
                uri, db_kwargs={"username": "strata", "password": "wrong"},
                autocommit=True) as conn:
            conn.cursor().execute("SELECT 1")
    assert "wrong user or password" in str(refused.value)


def make_certs(folder: Path) -> dict:
    """A test CA and a server certificate it signed (for localhost and 127.0.0.1), and a
    second CA that signed nothing of the server's, made by the openssl command."""
    folder.mkdir()

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                "-days", "2", "-subj", f"/CN=strata test {ca}")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (folder / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return {name: folder / f"{name}.pem" for name in ("ca", "other-ca", "server")} | {
        "key": folder / "server.key"}


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "tls")


def tls_args(certs):
    return ["--tls-cert", str(certs["server"]), "--tls-key", str(certs["key"])]


@pytest.fixture
def tls_server(tmp_path, certs):
    """`strata serve --pg` with TLS: the port it listens on."""
    yield from serve(tmp_path, ["--pg", "127.0.0.1:0", *tls_args(certs)],
                     "PostgreSQL clients on 127.0.0.1:")


@pytest.fixture
def tls_flight(tmp_path, certs):
    """`strata serve --flight` with TLS: the port it listens on."""
    yield from serve(tmp_path, ["--flight", "127.0.0.1:0", *tls_args(certs)],
                     "Flight SQL clients on 127.0.0.1:")


def test_psycopg_over_tls_with_scram(tls_server, certs):
    base = f"host=127.0.0.1 port={tls_server} user=strata dbname=main"
    verify = f"sslmode=verify-full sslrootcert={certs['ca']}"
    with psycopg.connect(f"{base} password={PASSWORD} {verify}") as conn:
        assert conn.info.pgconn.ssl_in_use
        cur = conn.cursor()
        cur.execute("SELECT name FROM orders WHERE id = %s", (2,))
        assert cur.fetchall() == [("Raul",)]
    refusals = [
        (f"password=wrong {verify}", "authentication failed for user \"strata\""),
        (f"password={PASSWORD} sslmode=verify-full sslrootcert={certs['other-ca']}",
         "certificate verify failed"),
        (f"password={PASSWORD} sslmode=disable", "strata serve requires TLS"),
    ]
    for conninfo, said in refusals:
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(f"{base} {conninfo}", connect_timeout=10)
        assert said in str(refused.value), conninfo


def test_adbc_over_tls_with_the_bearer_token(tls_flight, certs):
    uri = f"grpc+tls://127.0.0.1:{tls_flight}"
    header = adbc_driver_flightsql.DatabaseOptions.AUTHORIZATION_HEADER.value
    roots = adbc_driver_flightsql.DatabaseOptions.TLS_ROOT_CERTS.value
    assert roots == "adbc.flight.sql.client_option.tls_root_certs"
    with adbc_driver_flightsql.dbapi.connect(
            uri, db_kwargs={header: f"Bearer {TOKEN}", roots: certs["ca"].read_text()},
            autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("SELECT name FROM orders WHERE id = 2")
        assert cur.fetch_arrow_table().to_pylist() == [{"name": "Raul"}]
    with pytest.raises(adbc_driver_manager.dbapi.Error) as refused:
        with adbc_driver_flightsql.dbapi.connect(
                uri, db_kwargs={header: f"Bearer {TOKEN}",
                                roots: certs["other-ca"].read_text()},
                autocommit=True) as conn:
            conn.cursor().execute("SELECT 1")
    assert "certificate" in str(refused.value)
