#!/usr/bin/env python3
"""Do other Delta readers see the same rows as strata?

Runs the real strata binary on a small pipeline covering every kind of table strata writes
(streaming tables from JSON and Parquet files, AUTO CDC SCD type 1 and 2 targets, an SCD2
target in the Kimball convention, an AUTO CDC FROM SNAPSHOT target, a point-in-time table,
a materialized view in a second schema, and the event log), three times with new input
between the runs (updates, deletes, re-inserts, late events and late/redelivered snapshots,
so targets get rows rewritten and files removed in their Delta logs). After every run, each
table is read with

  * deltalake  ``DeltaTable(path).to_pyarrow_table()``
  * polars     ``polars.read_delta(path)``
  * duckdb     ``SELECT * FROM delta_scan('path')`` (the delta extension)

and each reader's rows are compared, as a multiset, with what ``strata query --format json
"SELECT * FROM <table>"`` returns. Values are normalised before comparing (numbers by their
type, timestamps to ISO-8601 in UTC, dates to ISO dates; column names case-insensitively),
nothing else is forgiven. Exit status 1 if any reader fails to open a table or disagrees,
or a sanity check fails (an empty table, an SCD2 target without closed versions after the
second run, a target whose Delta log never removed a file); 2 if strata itself fails.

    python3 tests/interop/check_readers.py --strata target/debug/strata
    python3 tests/interop/check_readers.py --strata target/debug/strata --s3

With ``--s3`` the warehouse is on the S3-compatible test server (moto) that
scripts/services/with-services.sh starts (``STRATA_TEST_S3_*``), under a prefix of its own, and
every reader reads the tables from there: deltalake and Polars with ``storage_options``
(endpoint, keys, region, ``AWS_ALLOW_HTTP``), DuckDB through its httpfs extension and an S3
secret (``ENDPOINT``, ``URL_STYLE 'path'``, ``USE_SSL false``). The input files stay on local
disk; what is checked is the tables strata wrote to the bucket.

The first run creates tests/interop/.venv and installs the pinned readers
(tests/interop/requirements.txt). DuckDB's delta extension comes from the pinned
``duckdb-ext-delta`` wheel (DuckDB's signed build, installed with ``INSTALL '<file>'``), else
from DuckDB's extension repository (``INSTALL delta``); if neither works the DuckDB reader
fails. ``--skip-duckdb-delta`` skips that reader on purpose (offline machines without the
wheel); the skip is printed on every table's line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strata", required=True, help="the strata binary to test")
    p.add_argument("--workdir", help="where to write the pipeline, inputs and warehouse "
                                     "(default: a fresh temp dir, removed at the end)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (its path is printed)")
    p.add_argument("--s3", action="store_true",
                   help="write the warehouse to the S3-compatible test server of STRATA_TEST_S3_* "
                        "(run under scripts/services/with-services.sh) and read it from there")
    p.add_argument("--skip-duckdb-delta", action="store_true",
                   help="do not read with DuckDB's delta extension (for offline machines where "
                        "neither the duckdb-ext-delta wheel nor DuckDB's extension repository "
                        "is available); every table's DuckDB line then says SKIPPED")
    return p.parse_args()


# --------------------------------------------------------------------------------------------
# The pipeline and its input
# --------------------------------------------------------------------------------------------

PIPELINE = """\
-- Change events as JSON, declared schema, one warn-only expectation (counted in the event log).
CREATE OR REFRESH STREAMING TABLE users_cdc (
  CONSTRAINT known_op EXPECT (op IN ('INSERT', 'UPDATE', 'DELETE'))
)
AS SELECT * FROM STREAM read_files('data/users', format => 'json',
  schema => 'id BIGINT, name STRING, city STRING, op STRING, seq BIGINT, ts TIMESTAMP,
             local_ts TIMESTAMP_NTZ, d DATE, amount DECIMAL(10,2), score DOUBLE, active BOOLEAN');

-- Targets have deletion vectors by default; these two are written without (files rewritten),
-- so deltalake's to_pyarrow_table() reads them.
CREATE OR REFRESH STREAMING TABLE users_scd1
TBLPROPERTIES ('delta.enableDeletionVectors' = 'false');
CREATE FLOW users_scd1_flow AS AUTO CDC INTO users_scd1
FROM STREAM(users_cdc)
KEYS (id)
APPLY AS DELETE WHEN op = "DELETE"
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 1;

CREATE OR REFRESH STREAMING TABLE users_scd2
TBLPROPERTIES ('delta.enableDeletionVectors' = 'false');
CREATE FLOW users_scd2_flow AS AUTO CDC INTO users_scd2
FROM STREAM(users_cdc)
KEYS (id)
APPLY AS DELETE WHEN op = "DELETE"
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;

-- The same history with deletion vectors (the default, here spelled out): replaced rows are
-- marked deleted in their files.
CREATE OR REFRESH STREAMING TABLE users_scd2_dv
TBLPROPERTIES ('delta.enableDeletionVectors' = 'true');
CREATE FLOW users_scd2_dv_flow AS AUTO CDC INTO users_scd2_dv
FROM STREAM(users_cdc)
KEYS (id)
APPLY AS DELETE WHEN op = "DELETE"
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;

-- 200 keys with deletion vectors, a few changed per run: rows marked deleted in place.
CREATE OR REFRESH STREAMING TABLE many_cdc
AS SELECT * FROM STREAM read_files('data/many', format => 'csv', header => true,
  schema => 'id BIGINT, v STRING, op STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE many_scd2_dv
TBLPROPERTIES ('delta.enableDeletionVectors' = 'true');
CREATE FLOW many_flow AS AUTO CDC INTO many_scd2_dv
FROM STREAM(many_cdc)
KEYS (id)
APPLY AS DELETE WHEN op = 'D'
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;

-- Kimball convention: surrogate_key, valid_from, valid_to (open end 9999-12-31), is_current.
CREATE OR REFRESH STREAMING TABLE users_kimball
TBLPROPERTIES ('strata.scd.convention' = 'kimball');
CREATE FLOW users_kimball_flow AS AUTO CDC INTO users_kimball
FROM STREAM(users_cdc)
KEYS (id)
APPLY AS DELETE WHEN op = "DELETE"
SEQUENCE BY ts
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 2;

-- Change events as Parquet files written by pyarrow; schema from the files.
CREATE OR REFRESH STREAMING TABLE items_raw
AS SELECT * FROM STREAM read_files('data/items', format => 'parquet');
CREATE OR REFRESH STREAMING TABLE items_scd1;
CREATE FLOW items_flow AS AUTO CDC INTO items_scd1
FROM STREAM(items_raw)
KEYS (id)
APPLY AS DELETE WHEN op = 'DELETE'
SEQUENCE BY seq
COLUMNS * EXCEPT (op, seq)
STORED AS SCD TYPE 1;

-- Full extracts (CSV), history from snapshots, with late and redelivered versions.
CREATE OR REFRESH STREAMING TABLE place_deliveries
AS SELECT * FROM STREAM read_files('data/places', format => 'csv', header => true,
  schema => 'id INT, city STRING, population BIGINT, v DATE');
CREATE OR REFRESH STREAMING TABLE places;
CREATE FLOW places_flow AS AUTO CDC FROM SNAPSHOT INTO places
FROM STREAM(place_deliveries)
KEYS (id)
SNAPSHOT VERSION BY v
COLUMNS * EXCEPT (v)
STORED AS SCD TYPE 2;

-- JSON read without a schema; run 2 brings a new column `color`: the bronze table and the
-- SCD2 target gain it (their earlier files lack it, so readers must fill NULL).
CREATE OR REFRESH STREAMING TABLE tags_raw
AS SELECT * FROM STREAM read_files('data/tags', format => 'json');
CREATE OR REFRESH STREAMING TABLE tags_scd2;
CREATE FLOW tags_flow AS AUTO CDC INTO tags_scd2
FROM STREAM(tags_raw)
KEYS (id)
SEQUENCE BY seq
COLUMNS * EXCEPT (seq, _rescued_data)
STORED AS SCD TYPE 2;

CREATE OR REFRESH POINT IN TIME TABLE users_pit
KEYS (id)
AS OF (1, 3, 5, 7, 9, 11)
FROM users_scd2;

-- A materialized view in a second schema (stored under <warehouse>/analytics/).
CREATE OR REFRESH MATERIALIZED VIEW analytics.city_stats
AS SELECT city, count(*) AS n_users, sum(amount) AS total_amount, max(ts) AS last_ts,
          min(local_ts) AS first_local_ts, min(d) AS first_day, avg(score) AS avg_score,
          bool_or(active) AS any_active
FROM users_scd1 GROUP BY city;
"""

# Every table the pipeline writes, plus the event log (schema.name).
EXPECTED_TABLES = {
    "default.users_cdc", "default.users_scd1", "default.users_scd2", "default.users_kimball",
    "default.items_raw", "default.items_scd1", "default.place_deliveries", "default.places",
    "default.users_pit", "analytics.city_stats", "default.event_log", "default.tags_raw",
    "default.tags_scd2", "default.users_scd2_dv", "default.many_cdc", "default.many_scd2_dv",
}

# Targets whose Delta log must show removed files by the end (rows rewritten, recomputed).
REWRITTEN_TABLES = [
    "default.users_scd1", "default.users_scd2", "default.users_kimball", "default.items_scd1",
    "default.places", "analytics.city_stats", "default.tags_scd2",
]

# Targets that enable deletion vectors: by the end their logs must hold some (on local disk:
# on object storage strata rewrites files instead, so --s3 does not check this).
DV_TABLES = ["default.many_scd2_dv"]

# SCD type 2 targets and how to count their closed versions; checked from the second run on.
CLOSED_VERSIONS = {
    "default.users_scd2": "SELECT count(*) AS n FROM users_scd2 WHERE __END_AT IS NOT NULL",
    "default.users_kimball": "SELECT count(*) AS n FROM users_kimball WHERE NOT is_current",
    "default.places": "SELECT count(*) AS n FROM places WHERE __END_AT IS NOT NULL",
    "default.tags_scd2": "SELECT count(*) AS n FROM tags_scd2 WHERE __END_AT IS NOT NULL",
    "default.users_scd2_dv": "SELECT count(*) AS n FROM users_scd2_dv WHERE __END_AT IS NOT NULL",
    "default.many_scd2_dv": "SELECT count(*) AS n FROM many_scd2_dv WHERE __END_AT IS NOT NULL",
}

# users: (id, name, city, op, seq); the other columns are derived from these (user_row).
USERS = [
    [  # run 1, two files
        [(1, "Ann", "Paris", "INSERT", 1), (2, "Bob", "Rome", "INSERT", 1),
         (3, "Cy", "Oslo", "INSERT", 1), (4, "Dee", "Paris", "INSERT", 2)],
        [(5, "Eve", "Rome", "INSERT", 2), (1, "Ann", "Lyon", "UPDATE", 5),
         (3, "Cy", "Bergen", "UPDATE", 4), (6, 'Zoë "Z", Jr.', "Köln", "INSERT", 3)],
    ],
    [  # run 2: deletes, late events (seq below the current one), an insert, a NULL city
        [(2, None, None, "DELETE", 6), (1, "Ann", "Nice", "UPDATE", 3),
         (3, "Cy", "Oslo", "UPDATE", 2), (4, "Dee", "Paris", "UPDATE", 7),
         (5, None, None, "DELETE", 8), (7, "Gus", "Paris", "INSERT", 6),
         (6, 'Zoë "Z", Jr.', None, "UPDATE", 9)],
    ],
    [  # run 3: re-insert after a delete, a late event before a delete, an unknown op (warned)
        [(2, "Bob", "Milan", "INSERT", 10), (5, "Eve", "Turin", "UPDATE", 4),
         (7, None, None, "DELETE", 11), (8, "Hal", "Oslo", "UPSERT", 10),
         (1, "Ann", "Lyon", "UPDATE", 12)],
    ],
]

# items (Parquet): (id, name, seq, op)
ITEMS = [
    [[(1, "apple", 1, "INSERT"), (2, "pear", 1, "INSERT"), (3, "plum", 1, "INSERT"),
      (1, "apple2", 3, "UPDATE")]],
    [[(2, None, 3, "DELETE"), (3, "plum3", 3, "UPDATE"), (4, "fig", 2, "INSERT"),
      (1, "apple1", 2, "UPDATE")]],  # the last one is late: older than apple2
    [[(2, "pear4", 4, "INSERT"), (5, "kiwi", 4, "INSERT"), (4, None, 5, "DELETE")]],
]

# places (CSV snapshots): version -> [(id, city, population)]
PLACES = [
    {"2024-01-31": [(1, "Paris", 100), (2, "Rome", 200), (3, "Oslo", 300)],
     "2024-03-31": [(1, "Paris", 110), (2, "Rome", 200), (4, "Bergen", 400)]},
    {"2024-02-29": [(1, "Paris", 105), (2, "Roma", 200), (3, "Oslo", 300)],  # late version
     "2024-04-30": [(1, "Paris", 110), (4, "Bergen", 410), (5, "Nice", 500)]},
    {"2024-04-30": [(1, "Paris", 111), (4, "Bergen", 410), (5, "Nice", 500)],  # redelivered
     "2024-05-31": [(1, "Paris", 111), (2, "Rome", 220), (4, "Bergen", 410), (5, "Nice", 500)]},
]


# many (CSV): 200 keys, then a few changes, a late event and a delete per run, so that the
# deletion-vector target marks rows in place (a file more than a quarter deleted would be
# rewritten instead).
MANY = [
    [(i, "a", "U", 10) for i in range(200)],
    [(i, "b", "U", 20) for i in range(5)] + [(50, "late", "U", 5), (60, None, "D", 20)],
    [(i, "c", "U", 30) for i in range(3, 8)] + [(61, None, "D", 30)],
]

# tags (JSON, schema inferred): one list of rows per run; `color` appears in run 2.
TAGS = [
    [{"id": 1, "tag": "a", "seq": 1}, {"id": 2, "tag": "b", "seq": 1}],
    [{"id": 1, "tag": "a", "seq": 2, "color": "red"}, {"id": 3, "tag": "c", "seq": 2, "color": "blue"}],
    [{"id": 2, "tag": "b2", "seq": 3, "color": "green"}, {"id": 1, "tag": "a", "seq": 1}],
]


def user_row(id_: int, name, city, op: str, seq: int) -> dict:
    ts = datetime(2024, 1, 1) + timedelta(days=seq, minutes=id_)
    if id_ % 2:
        ts += timedelta(microseconds=123456 * id_ % 1000000)
    return {
        "id": id_, "name": name, "city": city, "op": op, "seq": seq,
        "ts": ts.isoformat(),
        "local_ts": (ts + timedelta(hours=2)).isoformat(),
        "d": (date(2024, 1, 1) + timedelta(days=seq)).isoformat(),
        "amount": f"{(seq * 10 + id_) / 4:.2f}",
        "score": None if seq % 3 == 0 else id_ / 8 + seq,
        "active": seq % 2 == 1,
    }


def write_inputs(root: Path, run: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    users = root / "data" / "users"
    items = root / "data" / "items"
    places = root / "data" / "places"
    for d in (users, items, places):
        d.mkdir(parents=True, exist_ok=True)
    for i, events in enumerate(USERS[run]):
        lines = [json.dumps(user_row(*e), ensure_ascii=False) for e in events]
        (users / f"{run + 1:03}_{i}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for i, events in enumerate(ITEMS[run]):
        ids, names, seqs, ops = zip(*events)
        table = pa.table({
            "id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
            "seq": pa.array(seqs, pa.int64()), "op": pa.array(ops, pa.string()),
        })
        pq.write_table(table, items / f"{run + 1:03}_{i}.parquet")
    many = root / "data" / "many"
    many.mkdir(parents=True, exist_ok=True)
    (many / f"{run + 1:03}.csv").write_text("id,v,op,seq\n" + "".join(
        f"{i},{v or ''},{op},{seq}\n" for i, v, op, seq in MANY[run]))
    tags = root / "data" / "tags"
    tags.mkdir(parents=True, exist_ok=True)
    (tags / f"{run + 1:03}.json").write_text("\n".join(json.dumps(t) for t in TAGS[run]) + "\n")
    lines = ["id,city,population,v"]
    for version, rows in PLACES[run].items():
        lines += [f"{i},{c},{p},{version}" for i, c, p in rows]
    (places / f"{run + 1:03}.csv").write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------------------------
# strata
# --------------------------------------------------------------------------------------------

class StrataError(Exception):
    pass


class Strata:
    def __init__(self, binary: str, storage: "Storage"):
        self.binary = binary
        self.warehouse = storage.warehouse
        self.env = storage.strata_env()

    def _call(self, args: list[str], cwd: Path | None = None) -> str:
        env = {k: v for k, v in os.environ.items() if k != "STRATA_WAREHOUSE"}
        env.update(self.env)
        proc = subprocess.run([self.binary, *args], cwd=cwd, env=env, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise StrataError(f"strata {' '.join(args)} exited {proc.returncode}\n"
                              f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc.stdout

    def run(self, pipeline: Path) -> None:
        self._call(["run", str(pipeline), "--warehouse", str(self.warehouse)],
                   cwd=pipeline.parent)

    def upkeep(self) -> str:
        """`strata optimize`, then `strata vacuum` with no retention window: every file no
        version needs goes (the readers its pipeline declares are protected by itself)."""
        out = self._call(["optimize", "--warehouse", str(self.warehouse)])
        out += self._call(["vacuum", "--warehouse", str(self.warehouse), "--retain", "0",
                           "--allow-short-retention"])
        return out

    def query(self, sql: str) -> list[dict]:
        out = self._call(["query", "--warehouse", str(self.warehouse), "--format", "json", sql])
        return [json.loads(line, parse_float=Decimal) for line in out.splitlines()
                if line.strip()]


# --------------------------------------------------------------------------------------------
# Where the warehouse is
# --------------------------------------------------------------------------------------------

class Storage:
    """The warehouse on local disk: its tables are folders, read with pyarrow's file system
    (the same calls serve the S3 bucket in S3Storage)."""

    def __init__(self, root: Path):
        from pyarrow import fs

        self.warehouse = str(root / "warehouse")
        self.fs = fs.LocalFileSystem()
        # What deltalake and Polars take as storage_options (None: local paths).
        self.options: dict[str, str] | None = None

    def describe(self) -> str:
        return f"local disk ({self.warehouse})"

    def strata_env(self) -> dict[str, str]:
        return {}

    def table(self, schema: str, name: str) -> str:
        return f"{self.warehouse}/{schema}/{name}"

    def _fs_path(self, location: str) -> str:
        return location

    def relative(self, location: str) -> str:
        return location[len(self.warehouse) + 1:]

    def is_table(self, location: str) -> bool:
        from pyarrow import fs

        info = self.fs.get_file_info(fs.FileSelector(self._fs_path(location) + "/_delta_log",
                                                     allow_not_found=True))
        return len(info) > 0

    def commits(self, location: str) -> list[tuple[int, str]]:
        """(version, text) of every JSON commit of the table's Delta log."""
        from pyarrow import fs

        out = []
        for f in self.fs.get_file_info(fs.FileSelector(self._fs_path(location) + "/_delta_log",
                                                       allow_not_found=True)):
            name = f.base_name
            if f.type == fs.FileType.File and name.endswith(".json") and name[:-5].isdigit():
                with self.fs.open_input_stream(f.path) as stream:
                    out.append((int(name[:-5]), stream.read().decode()))
        return sorted(out)


class S3Storage(Storage):
    """The warehouse under a fresh prefix of the test bucket on the S3-compatible server
    (STRATA_TEST_S3_*): strata gets the keys as AWS_* in its environment, the readers as
    storage options or a DuckDB secret."""

    def __init__(self):
        from pyarrow import fs

        missing = [k for k in ("ENDPOINT", "BUCKET", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "REGION")
                   if not os.environ.get(f"STRATA_TEST_S3_{k}")]
        if missing:
            raise SystemExit(f"error: --s3 needs STRATA_TEST_S3_{missing[0]} (and the rest of "
                             "STRATA_TEST_S3_*): run it under scripts/services/with-services.sh, "
                             "as scripts/test.sh does")
        env = {k: os.environ[f"STRATA_TEST_S3_{k}"]
               for k in ("ENDPOINT", "BUCKET", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "REGION")}
        self.endpoint = env["ENDPOINT"]
        self.key_id = env["ACCESS_KEY_ID"]
        self.secret = env["SECRET_ACCESS_KEY"]
        self.region = env["REGION"]
        self.warehouse = (f"s3://{env['BUCKET']}/interop-{os.getpid()}-{time.time_ns()}"
                          "/warehouse")
        scheme, host = self.endpoint.split("://", 1)
        self.fs = fs.S3FileSystem(access_key=self.key_id, secret_key=self.secret,
                                  region=self.region, endpoint_override=host, scheme=scheme)
        self.options = {
            "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }

    def describe(self) -> str:
        return f"the S3-compatible server at {self.endpoint} ({self.warehouse})"

    def strata_env(self) -> dict[str, str]:
        return dict(self.options)

    def _fs_path(self, location: str) -> str:
        return location.removeprefix("s3://")

    def duckdb_secret(self) -> str:
        host = self.endpoint.split("://", 1)[1]
        return (f"CREATE OR REPLACE SECRET strata_test_s3 (TYPE s3, KEY_ID '{_sql_str(self.key_id)}', "
                f"SECRET '{_sql_str(self.secret)}', REGION '{_sql_str(self.region)}', "
                f"ENDPOINT '{_sql_str(host)}', URL_STYLE 'path', "
                f"USE_SSL {'true' if self.endpoint.startswith('https') else 'false'})")


# --------------------------------------------------------------------------------------------
# Normalising values
# --------------------------------------------------------------------------------------------

def _dec(d: Decimal) -> str:
    return format(d.normalize(), "f")  # 10.50 and 10.5 alike; no exponent notation


def _float(f: float) -> tuple:
    if math.isnan(f):
        return ("float", "nan")
    if math.isinf(f):
        return ("float", "inf" if f > 0 else "-inf")
    return ("float", repr(f))


def _ts(v: datetime) -> tuple:
    if v.tzinfo is None:
        return ("timestamp_ntz", v.strftime("%Y-%m-%dT%H:%M:%S.%f"))
    v = v.astimezone(timezone.utc)
    return ("timestamp", v.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def canon(v, nested: bool = False):
    """A reader's Python value -> a hashable, comparable form. Top-level numbers keep their
    kind (int, float, decimal); inside lists and structs (strata prints them as JSON, without
    their Arrow types) any number is compared by value, and a nested timestamp or date would
    compare as a string on strata's side and so fail loudly (the event log's `expectations`,
    the only nested column here, holds strings and integers)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return ("bool", v)
    if nested and isinstance(v, (int, float, Decimal)):
        return ("num", _dec(Decimal(repr(v)) if isinstance(v, float) else Decimal(v)))
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, Decimal):
        return ("decimal", _dec(v))
    if isinstance(v, datetime):
        return _ts(v)
    if isinstance(v, date):
        return ("date", v.isoformat())
    if isinstance(v, str):
        return ("str", v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return ("binary", bytes(v).hex())
    if isinstance(v, (list, tuple)):
        return ("list", tuple(canon(x, True) for x in v))
    if isinstance(v, dict):
        return ("struct", tuple(sorted(((str(k).lower(), canon(x, True)) for k, x in v.items()),
                                       key=repr)))
    raise TypeError(f"no normalisation for {type(v).__name__}: {v!r}")


def canon_strata(v, data_type: str):
    """A value of `strata query --format json` -> the same form, using the column's Arrow type
    (information_schema.columns.data_type) to tell timestamps, dates and numbers apart."""
    if v is None:
        return None
    t = data_type
    if t.startswith("Timestamp"):
        parsed = datetime.fromisoformat(v)
        aware = "," in t  # Timestamp(µs, "UTC") vs Timestamp(µs)
        if aware and parsed.tzinfo is None:
            raise ValueError(f"strata printed {v!r} without a zone for a {t} column")
        if not aware and parsed.tzinfo is not None:
            raise ValueError(f"strata printed {v!r} with a zone for a {t} column")
        return _ts(parsed)
    if t.startswith("Date"):
        return ("date", date.fromisoformat(v).isoformat())
    if t.startswith("Decimal"):
        return ("decimal", _dec(Decimal(v)))
    if t.startswith("Float"):
        return _float(float(v))
    if t.startswith(("Int", "UInt")):
        return ("int", int(v))
    if t == "Boolean":
        return ("bool", bool(v))
    if t.startswith(("Utf8", "LargeUtf8")):
        return ("str", v)
    return canon(v)  # lists, structs: JSON arrays and objects


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------

def read_deltalake(path: str, storage: Storage) -> tuple[list[str], list[dict]]:
    """``DeltaTable.to_pyarrow_table()``; for a table with deletion vectors, which that call
    refuses in deltalake 1.6 ("reader features {'deletionVectors'} ... not yet supported"),
    deltalake's own DataFusion reader (``QueryBuilder``), which applies them."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(path, storage_options=storage.options)
    if "deletionVectors" in (dt.protocol().reader_features or []):
        table = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    else:
        table = dt.to_pyarrow_table()
    return table.column_names, table.to_pylist()


def read_polars(path: str, storage: Storage) -> tuple[list[str], list[dict]]:
    import polars as pl

    df = pl.read_delta(path, storage_options=storage.options)
    return df.columns, df.to_dicts()


class DuckDBReader:
    """One connection with the delta extension loaded (or the reason it could not be); for a
    warehouse on S3 also the httpfs extension and an S3 secret for the test server."""

    def __init__(self, skip: bool, storage: Storage):
        self.skip = skip
        self.error: str | None = None
        self.source = ""
        self.con = None
        if skip:
            return
        import duckdb

        ext_dir = HERE / ".venv" / "duckdb_extensions"
        ext_dir.mkdir(parents=True, exist_ok=True)
        con = duckdb.connect()
        con.execute(f"SET extension_directory = '{_sql_str(str(ext_dir))}'")
        sources = []
        errors = []
        extensions = ["delta"] + (["httpfs"] if isinstance(storage, S3Storage) else [])
        for ext in extensions:
            loaded = _load_extension(con, ext, duckdb)
            if isinstance(loaded, list):
                errors += loaded
            else:
                sources.append(loaded)
        if errors:
            self.error = "DuckDB's extensions could not be installed: " + "; ".join(errors)
            return
        if isinstance(storage, S3Storage):
            try:
                con.execute(storage.duckdb_secret())
            except duckdb.Error as e:
                self.error = f"DuckDB's S3 secret for the test server: {str(e).splitlines()[0]}"
                return
        self.con = con
        self.source = "; ".join(sources)

    def read(self, path: str, _storage: Storage) -> tuple[list[str], list[dict]]:
        table = self.con.execute(
            f"SELECT * FROM delta_scan('{_sql_str(path)}')").fetch_arrow_table()
        return table.column_names, table.to_pylist()


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def _load_extension(con, ext: str, duckdb) -> str | list[str]:
    """Installs and loads DuckDB's extension `ext`: from its pinned duckdb-ext-* wheel, else
    from DuckDB's extension repository. Where it came from, or the errors of each attempt."""
    packaged = _packaged_extension(ext, duckdb.__version__)
    attempts = []
    if packaged is not None:
        attempts.append((f"INSTALL '{_sql_str(str(packaged))}'", f"the duckdb-ext-{ext} wheel"))
    attempts.append((f"INSTALL {ext}", "DuckDB's extension repository"))
    errors = []
    for install, source in attempts:
        try:
            con.execute(install)
            con.execute(f"LOAD {ext}")
            (path,) = con.execute("SELECT install_path FROM duckdb_extensions() "
                                  f"WHERE extension_name = '{ext}'").fetchone()
            return f"{ext} from {source}, installed at {path}"
        except duckdb.Error as e:
            errors.append(f"{install}: {str(e).splitlines()[0]}")
    return errors


def _packaged_extension(ext: str, version: str) -> Path | None:
    import glob

    for site in sys.path:
        hits = glob.glob(os.path.join(site, "duckdb_ext", "extensions", f"v{version}", "*",
                                      f"{ext}.duckdb_extension"))
        if hits:
            return Path(hits[0])
    return None


# --------------------------------------------------------------------------------------------
# Checking
# --------------------------------------------------------------------------------------------

def delta_log_actions(storage: Storage, path: str) -> tuple[int, int, int]:
    """(latest version, add actions, remove actions) over the table's JSON commits."""
    version, adds, removes = -1, 0, 0
    for v, text in storage.commits(path):
        version = max(version, v)
        for line in text.splitlines():
            if line.startswith('{"add"'):
                adds += 1
            elif line.startswith('{"remove"'):
                removes += 1
    return version, adds, removes


def table_path(storage: Storage, schema: str, name: str) -> str:
    path = storage.table(schema, name)
    if (schema, name) == ("default", "event_log") and not storage.is_table(path):
        path = storage.table("_strata", "event_log")  # docs/operations.md, "The event log"
    return path


def compare(strata_cols: list[str], strata_rows: list[tuple], reader_cols: list[str],
            reader_rows: list[dict]) -> list[str]:
    """Differences between strata's rows and a reader's, as printable lines (none: equal)."""
    lower = [c.lower() for c in strata_cols]
    rcols = [c.lower() for c in reader_cols]
    if sorted(rcols) != sorted(lower):
        return [f"columns differ: strata {strata_cols}, reader {reader_cols}"]
    problems = []
    if rcols != lower:
        problems.append(f"column order differs: strata {strata_cols}, reader {reader_cols}")
    got = Counter(
        tuple(canon(r[k]) for k in lower)
        for r in ({k.lower(): v for k, v in row.items()} for row in reader_rows)
    )
    want = Counter(strata_rows)
    if got != want:
        only_strata = list((want - got).elements())
        only_reader = list((got - want).elements())
        problems.append(f"{len(only_strata)} row(s) only in strata, "
                        f"{len(only_reader)} row(s) only in the reader")
        for r in sorted(only_strata, key=repr)[:5]:
            problems.append(f"only strata: {show(lower, r)}")
        for r in sorted(only_reader, key=repr)[:5]:
            problems.append(f"only reader: {show(lower, r)}")
    return problems


def show(cols: list[str], row: tuple) -> str:
    return "{" + ", ".join(f"{c}={plain(v)}" for c, v in zip(cols, row)) + "}"


def plain(v) -> str:
    """A normalised value as text, for mismatch reports."""
    if v is None:
        return "NULL"
    kind, x = v
    if kind == "str":
        return repr(x)
    if kind == "list":
        return "[" + ", ".join(plain(e) for e in x) + "]"
    if kind == "struct":
        return "{" + ", ".join(f"{k}: {plain(e)}" for k, e in x) + "}"
    if kind in ("float", "decimal"):
        return f"{x} ({kind})"
    return str(x)


def check_run(strata: Strata, storage: Storage, run: int, readers: list, duck: DuckDBReader,
              failures: list[str]) -> None:
    listed = strata.query("SHOW TABLES")
    tables = sorted(f"{t['database']}.{t['tableName']}" for t in listed)
    for missing in sorted(EXPECTED_TABLES - set(tables)):
        failures.append(f"run {run}: {missing}: not listed by strata (SHOW TABLES)")
        print(f"  {missing:<26} MISSING from strata's SHOW TABLES")
    types: dict[str, list[tuple[str, str]]] = {}
    for c in strata.query("SELECT table_schema, table_name, column_name, data_type "
                          "FROM information_schema.columns "
                          "WHERE table_schema <> 'information_schema' "
                          "ORDER BY table_schema, table_name, ordinal_position"):
        types.setdefault(f"{c['table_schema']}.{c['table_name']}", []).append(
            (c["column_name"], c["data_type"]))

    width = max(len(t) for t in tables)
    for name in tables:
        schema, table = name.split(".", 1)
        path = table_path(storage, schema, table)
        cols = types[name]
        rows = strata.query(f"SELECT * FROM {name}")
        strata_rows = [tuple(canon_strata(r[c], t) for c, t in cols) for r in rows]
        col_names = [c for c, _ in cols]
        if not storage.is_table(path):
            failures.append(f"run {run}: {name}: no Delta table at {path}")
            print(f"  {name:<{width}}  no Delta table at {path}  FAIL")
            continue
        version, adds, removes = delta_log_actions(storage, path)
        print(f"  {name:<{width}}  strata     {len(rows):>3} rows  (Delta version {version}: "
              f"{adds} add, {removes} remove actions; {storage.relative(path)})")
        if not rows:
            failures.append(f"run {run}: {name}: strata returns no rows (expected a non-empty "
                            f"table)")
            print(f"  {'':<{width}}  sanity: table is empty  FAIL")
        for reader_name, read in readers:
            if reader_name == "duckdb" and duck.skip:
                print(f"  {name:<{width}}  {reader_name:<9}  SKIPPED (--skip-duckdb-delta)")
                continue
            if reader_name == "duckdb" and duck.error:
                print(f"  {name:<{width}}  {reader_name:<9}  FAIL: DuckDB's extensions are not "
                      f"loaded (see above)")
                continue
            try:
                rcols, rrows = read(path, storage)
                problems = compare(col_names, strata_rows, rcols, rrows)
            except Exception as e:  # noqa: BLE001 - any reader error is a finding
                msg = f"{type(e).__name__}: {e}".strip().replace("\n", " | ")
                failures.append(f"run {run}: {name}: {reader_name} cannot read it: {msg}")
                print(f"  {name:<{width}}  {reader_name:<9}  ERROR {msg}")
                continue
            status = "OK" if not problems else "MISMATCH"
            print(f"  {name:<{width}}  {reader_name:<9}  {len(rrows):>3} rows  {status}")
            for p in problems:
                print(f"  {'':<{width}}    {p}")
            if problems:
                failures.append(f"run {run}: {name}: {reader_name} disagrees with strata: "
                                f"{problems[0]}")

    if run == len(USERS):
        for name in REWRITTEN_TABLES:
            _, _, removes = delta_log_actions(storage, table_path(storage, *name.split(".", 1)))
            ok = removes > 0
            print(f"  sanity: {name} has removed {removes} file(s) in its Delta log  "
                  f"{'OK' if ok else 'FAIL'}")
            if not ok:
                failures.append(f"run {run}: {name}: no file was ever removed from it, so the "
                                f"check did not cover rewritten tables")
        for name in DV_TABLES:
            path = table_path(storage, *name.split(".", 1))
            adds = [line for _, text in storage.commits(path) for line in text.splitlines()
                    if line.startswith('{"add"') and '"deletionVector":{' in line]
            marked = len(adds)
            ok = marked > 0
            print(f"  sanity: {name} has {marked} file(s) added with a deletion vector  "
                  f"{'OK' if ok else 'FAIL'}")
            if not ok:
                failures.append(f"run {run}: {name}: no deletion vector was ever written, so the "
                                f"check did not cover them")
            if os.environ.get("STRATA_DV_INLINE_MAX_BYTES") == "0":
                # Every vector in a deletion-vector file: the readers must have read those.
                in_files = sum('"storageType":"u"' in line for line in adds)
                ok = in_files == marked
                print(f"  sanity: {name}: {in_files} of its {marked} vector(s) in deletion-vector "
                      f"files (STRATA_DV_INLINE_MAX_BYTES=0)  {'OK' if ok else 'FAIL'}")
                if not ok:
                    failures.append(f"run {run}: {name}: a vector stayed inline with "
                                    f"STRATA_DV_INLINE_MAX_BYTES=0")
    if run >= 2:
        for name, sql in CLOSED_VERSIONS.items():
            n = strata.query(sql)[0]["n"]
            ok = n > 0
            print(f"  sanity: {name} has {n} closed version(s)  {'OK' if ok else 'FAIL'}")
            if not ok:
                failures.append(f"run {run}: {name}: no closed versions after run {run}")


def main() -> int:
    args = parse_args()
    sys.path.insert(0, str(HERE.parent.parent / "benchmarks"))
    import _venv

    _venv.ensure_venv(HERE)  # may re-exec this script in tests/interop/.venv

    import deltalake
    import duckdb
    import polars
    import pyarrow

    strata_bin = str(Path(args.strata).resolve())
    if not os.access(strata_bin, os.X_OK):
        print(f"error: {args.strata} is not an executable", file=sys.stderr)
        return 2

    started = time.monotonic()
    if args.workdir:
        root = Path(args.workdir).resolve()
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="strata-interop-"))
    storage = S3Storage() if args.s3 else Storage(root)
    print(f"warehouse: {storage.describe()}")
    duck = DuckDBReader(args.skip_duckdb_delta, storage)
    print(f"readers: deltalake {deltalake.__version__}, polars {polars.__version__}, "
          f"duckdb {duckdb.__version__}, pyarrow {pyarrow.__version__}")
    if duck.skip:
        print("duckdb delta extension: SKIPPED (--skip-duckdb-delta): DuckDB is not checked")
    elif duck.error:
        print(f"duckdb extensions: FAILED: {duck.error}")
        print("  (every table's DuckDB line fails; on an offline machine without the "
              "duckdb-ext-delta wheel, --skip-duckdb-delta skips this reader)")
    else:
        print(f"duckdb extensions: {duck.source}")

    pipeline = root / "pipeline.sql"
    pipeline.write_text(PIPELINE)
    strata = Strata(strata_bin, storage)
    readers = [("deltalake", read_deltalake), ("polars", read_polars), ("duckdb", duck.read)]
    failures: list[str] = []
    if duck.error:
        failures.append(f"duckdb cannot read any table: {duck.error}")
    try:
        for run in range(len(USERS)):
            write_inputs(root, run)
            t0 = time.monotonic()
            strata.run(pipeline)
            print(f"\nrun {run + 1}/{len(USERS)}: strata run took {time.monotonic() - t0:.2f} s")
            check_run(strata, storage, run + 1, readers, duck, failures)
        # Upkeep: compaction and a vacuum with no retention window; every reader must still
        # read every table, with the same rows, and a run after it must change nothing.
        t0 = time.monotonic()
        out = strata.upkeep()
        print(f"\nafter strata optimize + vacuum --retain 0 ({time.monotonic() - t0:.2f} s):")
        for line in out.splitlines():
            print(f"  | {line}")
        check_run(strata, storage, len(USERS), readers, duck, failures)
        # The event log records the run itself.
        kept = sorted(EXPECTED_TABLES - {"default.event_log"})

        def contents() -> dict[str, Counter]:
            return {t: Counter(json.dumps(r, sort_keys=True, default=str)
                               for r in strata.query(f"SELECT * FROM {t}")) for t in kept}

        before = contents()
        strata.run(pipeline)
        after = contents()
        for t in kept:
            ok = before[t] == after[t]
            print(f"  sanity: a run after upkeep left {t} as it was  {'OK' if ok else 'FAIL'}")
            if not ok:
                failures.append(f"upkeep: {t}: a run with no new input after optimize and "
                                f"vacuum changed its rows")
    except StrataError as e:
        print(f"\nstrata failed: {e}", file=sys.stderr)
        print(f"work dir kept: {root}", file=sys.stderr)
        return 2

    elapsed = time.monotonic() - started
    if failures:
        print(f"\nFAILED: {len(failures)} problem(s) in {elapsed:.1f} s:")
        for f in failures:
            print(f"  {f}")
    else:
        checked = "deltalake and polars (DuckDB SKIPPED)" if duck.skip else "all readers"
        print(f"\n{checked} agree with strata on every table after every run ({elapsed:.1f} s)")
    if args.keep or args.workdir or failures:
        print(f"work dir: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
