"""`strata serve --pg` read by psycopg (3, with libpq from its binary wheel): the real binary
of the workspace's debug build on a warehouse built by `strata run`; typed values in text
and binary, parameters bound by the protocol, a refused write."""

import datetime
import decimal
import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from conftest import REPO

PASSWORD = "s3cret-psycopg"

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


@pytest.fixture
def server(tmp_path):
    """`strata serve --pg 127.0.0.1:0` on a fresh warehouse: the port it listens on."""
    strata = strata_binary()
    (tmp_path / "data" / "cdc").mkdir(parents=True)
    (tmp_path / "data" / "cdc" / "001.json").write_text(DATA)
    (tmp_path / "pipeline.sql").write_text(PIPELINE)
    env = {k: v for k, v in os.environ.items() if k not in ("STRATA_WAREHOUSE", "RUST_LOG")}
    subprocess.run([strata, "run", "pipeline.sql"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)
    env["STRATA_SERVE_PASSWORD"] = PASSWORD
    proc = subprocess.Popen([strata, "serve", "--pg", "127.0.0.1:0"], cwd=tmp_path, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            if "PostgreSQL clients on 127.0.0.1:" in line:
                port = int(line.split("127.0.0.1:")[1].split()[0])
                break
        assert port, "strata serve ended before listening"
        yield port
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0


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
