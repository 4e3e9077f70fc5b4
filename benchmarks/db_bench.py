#!/usr/bin/env python3
"""strata's database sources against DuckDB's postgres extension, on the same PostgreSQL data;
and strata's MariaDB/MySQL binlog CDC source on the same CDC workload.

    python3 benchmarks/db_bench.py --small             # ~1 minute: 50k-row bulk, 20k-row CDC + 20k changes
    python3 benchmarks/db_bench.py                     # 10M-row bulk; CDC: 1M rows, then 1M changes
    python3 benchmarks/db_bench.py --rounds 3 --strata path/to/strata --json results.json
    python3 benchmarks/db_bench.py --small --check-only   # correctness only (debug builds, CI)
    python3 benchmarks/db_bench.py --source mariadb       # CDC from MariaDB's binlog: 1M rows, then 1M changes
    python3 benchmarks/db_bench.py cdc --source both      # the same CDC workload from each, one after the other

Three parts, the first two against a real PostgreSQL (14 or newer, wal_level=logical), the
third against MariaDB:

1. bulk: a table of N rows (10 columns: bigint, int, numeric(12,2), text, text with NULLs, bool,
   date, timestamptz, uuid, jsonb) is generated inside PostgreSQL with generate_series. strata
   loads it by watermark (`read_database(..., watermark => 'updated_at, id')`, a first run:
   every row) into a fresh Delta table; DuckDB (in its own process) ATTACHes the database with
   its postgres extension and copies the same table to one Parquet file. Both are timed
   (wall clock) with their peak RSS (/usr/bin/time -v); both results are checked against the
   source (row count, sum of ids, sum of amounts). `--rounds R` repeats strata then DuckDB R
   times and reports every round's ratio and the median.
2. cdc: a table of K rows is copied by strata's log-based CDC source (first run: the slot's
   snapshot) into an SCD type 2 target through AUTO CDC; then M changes (70% updates, 15%
   deletes, 15% inserts, in transactions of --txn-size) are made in PostgreSQL, and ONE
   strata run applies them. Reported: changes/s of that run end to end, the replication
   slot's lag in bytes before and after it, peak RSS. Checked: the target's open rows equal
   the PostgreSQL table (count, sum of ids, and every row's values compared through DuckDB),
   the change table holds M changes, the target holds K + updates + inserts versions, and
   `strata validate` accepts its timeline. DuckDB has no log-based CDC: this part measures
   strata alone.
3. cdc from MariaDB (`--source mariadb`, or `both` after the PostgreSQL parts): the same
   shape through the binlog source (`read_database(conn, 'strata_bench.cust', mode =>
   'cdc')` on a `TYPE mysql` connection): a table of K rows (the same ten columns in
   MariaDB's types: bigint, int, decimal(12,2), varchar, text with NULLs, boolean (tinyint(1),
   an integer in Delta), date, timestamp(6), char(36) for the uuid, json) generated with the
   SEQUENCE engine (`seq_1_to_N`), copied by the first run (a consistent snapshot and its
   binlog position), then the same M changes in transactions of --txn-size (sent by the
   `mariadb` client as one script of START TRANSACTION ... COMMIT blocks), applied by ONE
   strata run. Reported: changes/s end to end, the binlog bytes the changes wrote, how far
   the position strata recorded is behind the binlog's end after the run, peak RSS. Checked
   as for PostgreSQL: the target's open rows equal the MariaDB table (count, sum of ids, sum
   of amounts, and every row's values: the table exported by the `mariadb` client and both
   sides compared in DuckDB), the change table holds M changes, the target K + updates +
   inserts versions, `strata validate`. Only `cdc` runs against MariaDB (`bulk` is
   PostgreSQL's against DuckDB's postgres extension).

PostgreSQL: the STRATA_TEST_PG_HOST/PORT/USER/PASSWORD/DATABASE variables name the server (as
scripts/services/with-services.sh exports them). Without them, a throwaway server is started
with scripts/services/postgres.sh in a temp dir and stopped at the end. The benchmark works in
its own schema `strata_bench` (dropped and recreated), with its own slot and publication
(dropped at the end, so no WAL is kept).

MariaDB (`--source mariadb` or `both`): the STRATA_TEST_MYSQL_HOST/PORT/USER/PASSWORD/DATABASE
variables name the server (as with-services.sh exports them); it needs the binary log on,
binlog_format=ROW, binlog_row_image=FULL and a user with REPLICATION SLAVE and REPLICATION
CLIENT (docs/sources.md), and MariaDB's SEQUENCE engine to generate the data (MySQL has none:
this part runs on MariaDB only). Without them, a throwaway server is started with
scripts/services/mariadb.sh in a temp dir (binlog set up that way) and stopped at the end.
The benchmark works in its own database `strata_bench` (dropped and recreated, and dropped at
the end unless --keep); the binlog source keeps nothing on the server between runs.

The exit status is 1 if strata or DuckDB fails or any check fails, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from _venv import ensure_venv  # noqa: E402
from _bench import FAILURES, fail, log  # noqa: E402

REPO_DIR = BENCH_DIR.parent
PG_SCRIPT = REPO_DIR / "scripts" / "services" / "postgres.sh"
MARIADB_SCRIPT = REPO_DIR / "scripts" / "services" / "mariadb.sh"
GNU_TIME = "/usr/bin/time"
SCHEMA = "strata_bench"
BULK_TABLE = f"{SCHEMA}.orders"
CDC_TABLE = f"{SCHEMA}.cust"
SLOT = "strata_bench_slot"
PUBLICATION = "strata_bench_pub"
PW_ENV = "STRATA_BENCH_PG_PW"  # the variable the pipelines' CONNECTION reads its password from
MY_DB = "strata_bench"  # MariaDB: the benchmark's own database
MY_CDC_TABLE = f"{MY_DB}.cust"
MY_PW_ENV = "STRATA_BENCH_MYSQL_PW"
SOURCES = {"postgres": ["postgres"], "mariadb": ["mariadb"], "both": ["postgres", "mariadb"]}

FULL = dict(rows=10_000_000, cdc_rows=1_000_000, changes=1_000_000)
SMALL = dict(rows=50_000, cdc_rows=20_000, changes=20_000)
# Shares of a transaction's changes (the rest are updates).
DELETE_SHARE = 0.15
INSERT_SHARE = 0.15

CHECK_ONLY = False  # --check-only: timings are not printed (debug builds, CI)


def fmt_int(n) -> str:
    return "n/a" if n is None else f"{n:,}"


def fmt_s(s) -> str:
    if CHECK_ONLY:
        return "-"
    return "n/a" if s is None else f"{s:.2f} s"


def fmt_rate(n, s) -> str:
    if CHECK_ONLY:
        return "-"
    return "n/a" if not s or n is None else f"{n / s:,.0f}/s"


def fmt_cpu(r: dict) -> str:
    if CHECK_ONLY or r.get("user_s") is None or r.get("sys_s") is None:
        return "-" if CHECK_ONLY else "n/a"
    return f"{r['user_s'] + r['sys_s']:.1f} s"


def fmt_mem(kib) -> str:
    if CHECK_ONLY:
        return "-"
    if kib is None:
        return "n/a"
    return f"{kib / 1024 / 1024:.2f} GiB" if kib >= 1024 * 1024 else f"{kib / 1024:.0f} MiB"


def fmt_bytes(b) -> str:
    if b is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= size:
            return f"{b / size:.2f} {unit}"
    return f"{b} B"


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# --------------------------------------------------------------------------- running processes

def timed(cmd: list[str], stdout_path: Path, stderr_path: Path, env: dict | None = None) -> dict:
    """Run CMD as a child process; return {rc, seconds, maxrss_kib, user_s, sys_s}. Wall clock
    from here; peak RSS and CPU times from GNU time (/usr/bin/time -v) when it exists, else
    from getrusage(RUSAGE_CHILDREN) in a fresh Python wrapper process (as run.py does)."""
    res = {"rc": None, "seconds": None, "maxrss_kib": None, "user_s": None, "sys_s": None}
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        if os.path.exists(GNU_TIME):
            tfile = stderr_path.with_suffix(".time")
            t0 = time.perf_counter()
            rc = subprocess.call([GNU_TIME, "-v", "-o", str(tfile), *cmd], stdout=out, stderr=err,
                                 env=env)
            res["seconds"] = time.perf_counter() - t0
            try:
                for line in tfile.read_text().splitlines():
                    key, _, val = line.strip().rpartition(": ")
                    if key == "Maximum resident set size (kbytes)":
                        res["maxrss_kib"] = int(val)
                    elif key == "User time (seconds)":
                        res["user_s"] = float(val)
                    elif key == "System time (seconds)":
                        res["sys_s"] = float(val)
            except (OSError, ValueError):
                pass
        else:
            wrapper = ("import json, resource, subprocess, sys\n"
                       "rc = subprocess.call(sys.argv[2:])\n"
                       "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
                       "open(sys.argv[1], 'w').write(json.dumps([u.ru_maxrss, u.ru_utime, u.ru_stime]))\n"
                       "sys.exit(rc)\n")
            rfile = stderr_path.with_suffix(".rss")
            t0 = time.perf_counter()
            rc = subprocess.call([sys.executable, "-c", wrapper, str(rfile), *cmd],
                                 stdout=out, stderr=err, env=env)
            res["seconds"] = time.perf_counter() - t0
            try:
                res["maxrss_kib"], res["user_s"], res["sys_s"] = json.loads(rfile.read_text())
            except (OSError, ValueError):
                pass
    res["rc"] = rc
    return res


# --------------------------------------------------------------------------- PostgreSQL

def start_service(script: Path, own_dir: str, name: str) -> None:
    """Starts the throwaway server of `script` (scripts/services/*.sh) in `own_dir` and takes
    the `export NAME=VALUE` lines it prints into this process's environment; exits naming
    `name` if it does not start (after stopping what it left and removing the dir)."""
    log(f"$ {script} start {own_dir}")
    r = subprocess.run([str(script), "start", own_dir], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        stop_service(script, own_dir)
        raise SystemExit(f"could not start {name} with scripts/services/{script.name} "
                         "(or run under scripts/services/with-services.sh)")
    for line in r.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export "):].split("=", 1)
            os.environ[k] = v


def stop_service(script: Path, own_dir: str | None) -> None:
    """Stops the throwaway server of `script` in `own_dir` (if any) and removes the dir."""
    if own_dir:
        subprocess.run([str(script), "stop", own_dir], capture_output=True)
        shutil.rmtree(own_dir, ignore_errors=True)
    return None


class Service:
    """A database server the benchmark reads: the `{prefix}_*` variables with-services.sh
    exports, else a throwaway one started with `script` in a short dir under /tmp (stopped
    by close()). Subclasses name them and add their client."""

    name = ""
    kind = ""  # the CREATE CONNECTION ... TYPE
    prefix = ""  # STRATA_TEST_PG, STRATA_TEST_MYSQL
    script: Path
    dir_prefix = ""
    dir_mode: int | None = None
    pw_env = ""

    def __init__(self):
        self.own_dir: str | None = None
        facts = ["HOST", "PORT", "USER", "PASSWORD", "DATABASE"]
        if not all(os.environ.get(f"{self.prefix}_{k}") for k in facts):
            self._start_own()
        self.host, self.port, self.user, self.password, self.database = (
            os.environ[f"{self.prefix}_{k}"] for k in facts)

    def _start_own(self) -> None:
        # The server's unix socket lives in the dir: keep it short, directly under /tmp.
        self.own_dir = tempfile.mkdtemp(prefix=self.dir_prefix, dir="/tmp")
        if self.dir_mode is not None:
            os.chmod(self.own_dir, self.dir_mode)
        log(f"no {self.prefix}_* variables: starting a throwaway {self.name} in {self.own_dir}")
        start_service(self.script, self.own_dir, self.name)

    def close(self) -> None:
        stop_service(self.script, self.own_dir)
        self.own_dir = None

    def connection_sql(self) -> str:
        return (f"CREATE CONNECTION bench TYPE {self.kind} OPTIONS (host '{self.host}', "
                f"port '{self.port}', database '{self.database}', user '{self.user}', "
                f"password_env '{self.pw_env}');\n")


class Postgres(Service):
    """The PostgreSQL server the benchmark reads (STRATA_TEST_PG_*); SQL goes through psql."""

    name = "PostgreSQL"
    kind = "postgresql"
    prefix = "STRATA_TEST_PG"
    script = PG_SCRIPT
    dir_prefix = "strata-dbb."
    dir_mode = 0o711
    pw_env = PW_ENV

    def __init__(self):
        super().__init__()
        self.psql_bin = shutil.which("psql") or "/usr/bin/psql"
        self.env = dict(os.environ, PGHOST=self.host, PGPORT=self.port, PGUSER=self.user,
                        PGPASSWORD=self.password, PGDATABASE=self.database)

    def dsn(self) -> str:
        return (f"host={self.host} port={self.port} dbname={self.database} user={self.user} "
                f"password={self.password}")

    def psql(self, sql: str, quiet_notices: bool = True) -> str:
        """Run SQL (one or more statements, autocommit) and return the unaligned output."""
        cmd = [self.psql_bin, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-f", "-"]
        pre = "SET client_min_messages = warning;\n" if quiet_notices else ""
        r = subprocess.run(cmd, input=pre + sql, capture_output=True, text=True, env=self.env)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed (exit {r.returncode}):\n{r.stderr.strip()}\nSQL:\n{sql[:2000]}")
        return r.stdout.strip()

    def one(self, sql: str) -> list[str]:
        out = self.psql(sql)
        return out.splitlines()[-1].split("|") if out else []

    def version(self) -> str:
        return self.psql("SELECT current_setting('server_version')")

    def slot_lag(self) -> int | None:
        out = self.psql(f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                        f"FROM pg_replication_slots WHERE slot_name = '{SLOT}'")
        return int(out) if out else None

    def drop_slot(self) -> None:
        self.psql(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                  f"WHERE slot_name = '{SLOT}' AND NOT active;\n"
                  f"DROP PUBLICATION IF EXISTS {PUBLICATION};")

    def reset_schema(self) -> None:
        self.drop_slot()
        self.psql(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA};")


# --------------------------------------------------------------------------- MariaDB

class MariaDB(Service):
    """The MariaDB server the binlog part reads (STRATA_TEST_MYSQL_*). SQL goes through the
    `mariadb` (or `mysql`) command-line client, in UTC."""

    name = "MariaDB"
    kind = "mysql"
    prefix = "STRATA_TEST_MYSQL"
    script = MARIADB_SCRIPT
    dir_prefix = "strata-dbm."
    pw_env = MY_PW_ENV

    def __init__(self):
        super().__init__()
        self.client = shutil.which("mariadb") or shutil.which("mysql")
        if not self.client:
            self.close()
            raise SystemExit("the mariadb (or mysql) command-line client is not on PATH "
                             "(Debian: apt-get install mariadb-client)")
        self.env = dict(os.environ, MYSQL_PWD=self.password)

    def client_cmd(self) -> list[str]:
        return [self.client, "--no-defaults", "--protocol=tcp", "-h", self.host, "-P", self.port,
                "-u", self.user, "--batch", "--skip-column-names", self.database]

    def sql(self, sql: str, out: Path | None = None) -> str:
        """Run SQL (statements separated by `;`, autocommit unless a script says otherwise;
        the client stops at the first error) in UTC; return the tab-separated output, or
        with OUT, write it there (and return "")."""
        script = "SET time_zone = '+00:00';\n" + sql
        if out is not None:
            with open(out, "wb") as fo:
                r = subprocess.run(self.client_cmd(), input=script.encode(), stdout=fo,
                                   stderr=subprocess.PIPE, env=self.env)
            err, text = r.stderr.decode(errors="replace"), ""
        else:
            r = subprocess.run(self.client_cmd(), input=script.encode(), capture_output=True,
                               env=self.env)
            err, text = r.stderr.decode(errors="replace"), r.stdout.decode(errors="replace")
        if r.returncode != 0:
            raise RuntimeError(f"{Path(self.client).name} failed (exit {r.returncode}):\n"
                               f"{err.strip()}\nSQL:\n{sql[:2000]}")
        return text.strip()

    def one(self, sql: str) -> list[str]:
        out = self.sql(sql)
        return out.splitlines()[-1].split("\t") if out else []

    def version(self) -> str:
        return self.sql("SELECT VERSION()")

    def check_server(self) -> None:
        """What the binlog source and this benchmark need, checked before any data is made."""
        log_bin, fmt, image = self.one("SELECT @@log_bin, @@binlog_format, @@binlog_row_image")
        bad = []
        if log_bin != "1":
            bad.append("the binary log is off (log-bin and server-id in the option file)")
        if fmt != "ROW":
            bad.append(f"binlog_format is {fmt}, not ROW")
        if image != "FULL":
            bad.append(f"binlog_row_image is {image}, not FULL")
        if bad:
            raise SystemExit(f"MariaDB on {self.host}:{self.port} cannot feed binlog CDC: "
                             + "; ".join(bad) + " (docs/sources.md, the MySQL / MariaDB section)")
        try:
            self.sql("SELECT count(*) FROM seq_1_to_3")
        except RuntimeError as e:
            raise SystemExit(f"{self.version()} on {self.host}:{self.port} has no SEQUENCE engine "
                             f"(seq_1_to_N), which the benchmark generates its rows with "
                             f"(MariaDB only): {str(e).splitlines()[1:2]}")

    def binlog_bytes(self) -> int:
        """Bytes of binary log the server holds now (SHOW BINARY LOGS, summed)."""
        return sum(int(line.split("\t")[1])
                   for line in self.sql("SHOW BINARY LOGS").splitlines() if "\t" in line)

    def binlog_end(self) -> tuple[str, int]:
        """The binlog's end, as SHOW MASTER STATUS gives it: (file, position)."""
        f, pos = self.one("SHOW MASTER STATUS")[:2]
        return f, int(pos)

    def reset_database(self) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {MY_DB}; CREATE DATABASE {MY_DB} CHARACTER SET utf8mb4;")

    def table_sums(self, table: str) -> dict:
        n, s_id, s_amount = self.one(f"SELECT count(*), coalesce(sum(id), 0), "
                                     f"coalesce(sum(amount), 0) FROM {table}")
        return {"rows": int(n), "sum_id": int(s_id), "sum_amount": money(s_amount)}


# --------------------------------------------------------------------------- data

COLUMNS_DDL = """(
  id          bigint PRIMARY KEY,
  customer_id integer NOT NULL,
  amount      numeric(12,2) NOT NULL,
  status      text NOT NULL,
  note        text,
  paid        boolean NOT NULL,
  order_date  date NOT NULL,
  updated_at  timestamptz NOT NULL,
  ref         uuid NOT NULL,
  attrs       jsonb
)"""
COLUMN_NAMES = ["id", "customer_id", "amount", "status", "note", "paid", "order_date",
                "updated_at", "ref", "attrs"]
# One row from the bigint g (and a version v, which changes the values of an update).
ROW_SELECT = """
  g,
  ((g * 7919) % 100000)::int,
  (((g * 104729 + ({v})) % 10000000) / 100.0)::numeric(12,2),
  (ARRAY['new','paid','shipped','delivered','returned'])[1 + ((g + ({v})) % 5)::int],
  CASE WHEN g % 10 = 0 THEN NULL ELSE 'order ' || g || ' note ' || ({v}) END,
  (g + ({v})) % 3 <> 0,
  date '2020-01-01' + (g % 2000)::int,
  timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second' + ({v}) * interval '1 millisecond',
  md5(g::text)::uuid,
  jsonb_build_object('channel', (ARRAY['web','app','store'])[1 + (g % 3)::int],
                     'items', 1 + (g + ({v})) % 9, 'v', ({v}))
"""


def create_table(pg: Postgres, table: str, rows: int) -> dict:
    t0 = time.perf_counter()
    pg.psql(f"""
CREATE TABLE {table} {COLUMNS_DDL};
INSERT INTO {table} SELECT {ROW_SELECT.format(v=0)} FROM generate_series(1, {rows}::bigint) g;
CREATE INDEX ON {table} (updated_at, id);
VACUUM (FREEZE, ANALYZE) {table};
""")
    # The table's pages are written out now rather than by the checkpointer during the
    # first measured run (strata's, in every round): that run paid for them, up to 2 s.
    # A role without the right to CHECKPOINT leaves it to the server.
    try:
        pg.psql("CHECKPOINT;")
    except RuntimeError as e:
        log(f"  (no CHECKPOINT after generating the table: {str(e).splitlines()[1:2]})")
    secs = time.perf_counter() - t0
    size = int(pg.psql(f"SELECT pg_total_relation_size('{table}')"))
    heap = int(pg.psql(f"SELECT pg_relation_size('{table}')"))
    return {"rows": rows, "seconds": secs, "total_bytes": size, "heap_bytes": heap}


def table_sums(pg: Postgres, table: str) -> dict:
    n, s_id, s_amount = pg.one(f"SELECT count(*), coalesce(sum(id), 0), coalesce(sum(amount), 0) "
                               f"FROM {table}")
    return {"rows": int(n), "sum_id": int(s_id), "sum_amount": money(s_amount)}


# --------------------------------------------------------------------------- strata

class Strata:
    """The strata binary, running pipelines whose CONNECTION `bench` is DB (a Postgres or a
    MariaDB: its password in the variable the connection names)."""

    def __init__(self, binary: str, db: "Postgres | MariaDB"):
        self.bin = binary
        self.env = dict(os.environ, **{db.pw_env: db.password})
        self.db = db

    def check(self) -> None:
        for i in range(30):  # a debug binary being relinked by a concurrent build comes back
            if os.path.isfile(self.bin) and os.access(self.bin, os.X_OK):
                return
            if i == 0:
                log(f"waiting for {self.bin} to appear ...")
            time.sleep(10)
        raise SystemExit(f"strata binary not found or not executable: {self.bin}\n"
                         "build it with: cargo build --release --workspace   "
                         "(or pass --strata / set STRATA_BIN)")

    def version(self) -> str:
        try:
            r = subprocess.run([self.bin, "--version"], capture_output=True, text=True, timeout=30)
            return (r.stdout or r.stderr).strip().splitlines()[0] if r.returncode == 0 else "?"
        except Exception:  # noqa: BLE001
            return "?"

    def connection_sql(self) -> str:
        return self.db.connection_sql()

    def run(self, wl: Path, label: str) -> dict:
        cmd = [self.bin, "run", str(wl / "pipeline.sql"), "--warehouse", str(wl / "warehouse")]
        log(f"$ {self.db.pw_env}=... {shlex.join(cmd)}")
        logs = wl / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        r = timed(cmd, logs / f"{label}.stdout", logs / f"{label}.stderr", env=self.env)
        r["cmd"] = shlex.join(cmd)
        r["stdout"] = tail(logs / f"{label}.stdout", 20)
        r["stderr_tail"] = tail(logs / f"{label}.stderr", 20)
        log(f"  -> exit {r['rc']}, {fmt_s(r['seconds'])}, peak RSS {fmt_mem(r['maxrss_kib'])}")
        for line in r["stdout"].splitlines()[-6:]:
            log(f"     | {line}")
        if r["rc"] != 0:
            fail(f"strata run failed ({label}): exit {r['rc']}\n$ {r['cmd']}\n"
                 f"{tail(logs / f'{label}.stderr')}")
        return r

    def query(self, wl: Path, sql: str, out: Path | None = None) -> list[dict] | None:
        """`strata query --format csv SQL`: the rows as dicts of strings (None on failure), or
        with OUT, the CSV written there (returns [] on success)."""
        import csv
        import io

        cmd = [self.bin, "query", "--warehouse", str(wl / "warehouse"), "--format", "csv", sql]
        log(f"$ {shlex.join(cmd)}" + (f" > {out}" if out else ""))
        if out is not None:
            with open(out, "wb") as fo:
                r = subprocess.run(cmd, stdout=fo, stderr=subprocess.PIPE, env=self.env)
            err = r.stderr.decode(errors="replace")
        else:
            r = subprocess.run(cmd, capture_output=True, env=self.env)
            err = r.stderr.decode(errors="replace")
        if r.returncode != 0:
            fail(f"strata query failed: exit {r.returncode}\n$ {shlex.join(cmd)}\n{err.strip()}")
            return None
        if out is not None:
            return []
        return list(csv.DictReader(io.StringIO(r.stdout.decode())))

    def validate(self, wl: Path, table: str) -> bool:
        cmd = [self.bin, "validate", table, "--warehouse", str(wl / "warehouse")]
        log(f"$ {shlex.join(cmd)}")
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
        out = (r.stdout + r.stderr).strip().splitlines()
        log(f"  -> exit {r.returncode}: " + (" / ".join(out[-2:]) if out else ""))
        if r.returncode != 0:
            fail(f"strata validate {table} failed: exit {r.returncode}\n" + "\n".join(out[-20:]))
        return r.returncode == 0


# --------------------------------------------------------------------------- DuckDB

def packaged_postgres_extension() -> Path | None:
    """The postgres_scanner extension file of the duckdb-ext-postgres wheel, if installed."""
    import glob

    import duckdb

    for site in sys.path:
        hits = glob.glob(os.path.join(site, "duckdb_ext", "extensions", f"v{duckdb.__version__}",
                                      "*", "postgres_scanner.duckdb_extension"))
        if hits:
            return Path(hits[0])
    return None


def install_duckdb_postgres(ext_dir: Path) -> str:
    """INSTALL the postgres extension into EXT_DIR once (from the pinned wheel, else from
    DuckDB's repository); the benchmark's child processes only LOAD it from there."""
    import duckdb

    ext_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"SET extension_directory = '{ext_dir}'")
    attempts = []
    packaged = packaged_postgres_extension()
    if packaged is not None:
        attempts.append((f"INSTALL '{packaged}'", "the duckdb-ext-postgres wheel"))
    attempts.append(("INSTALL postgres_scanner", "DuckDB's extension repository"))
    errors = []
    for install, source in attempts:
        try:
            con.execute(install)
            con.execute("LOAD postgres_scanner")
            return source
        except duckdb.Error as e:
            errors.append(f"{install}: {str(e).splitlines()[0]}")
    raise SystemExit("DuckDB's postgres extension could not be installed: " + "; ".join(errors))


def run_duckdb(wl: Path, pg: Postgres, label: str, ext_dir: Path, threads: int | None,
               pages_per_task: int | None, uuid_text: bool = False) -> dict:
    """DuckDB's ATTACH + COPY of the table to Parquet in its own process; with `uuid_text`,
    its uuid columns written as text (`SELECT * REPLACE (col::VARCHAR AS col)`), the type
    strata's mapping gives them, so that both write the same columns."""
    if uuid_text:
        label = f"{label}-uuid-text"
    out = wl / "duckdb" / f"{label}.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    spec = wl / "logs" / f"{label}.duckdb.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps({"dsn": pg.dsn(), "table": BULK_TABLE, "out": str(out),
                                "ext_dir": str(ext_dir), "threads": threads,
                                "pages_per_task": pages_per_task, "uuid_text": uuid_text}))
    cmd = [sys.executable, str(Path(__file__).resolve()), "_duckdb", str(spec)]
    log(f"$ {shlex.join(cmd)}   # ATTACH (TYPE postgres); COPY (SELECT * FROM pg.{BULK_TABLE}) "
        f"TO {out.name}")
    r = timed(cmd, wl / "logs" / f"{label}.duckdb.stdout", wl / "logs" / f"{label}.duckdb.stderr")
    r["cmd"] = shlex.join(cmd)
    if r["rc"] != 0:
        fail(f"DuckDB failed ({label}): exit {r['rc']}\n{tail(wl / 'logs' / f'{label}.duckdb.stderr')}")
        return r
    inner = json.loads((wl / "logs" / f"{label}.duckdb.stdout").read_text().strip().splitlines()[-1])
    r.update(inner)
    r["parquet_bytes"] = out.stat().st_size
    log(f"  -> ATTACH + COPY {fmt_s(r['copy_seconds'])} ({fmt_s(r['seconds'])} process), "
        f"peak RSS {fmt_mem(r['maxrss_kib'])}, {fmt_int(r['rows'])} rows")
    out.unlink()  # 10M rows are ~1 GB; the counts above are what is kept
    return r


def _duckdb_child(spec_path: str) -> None:
    import duckdb

    spec = json.loads(Path(spec_path).read_text())
    con = duckdb.connect()
    con.execute(f"SET extension_directory = '{spec['ext_dir']}'")
    con.execute("LOAD postgres_scanner")
    if spec.get("threads"):
        con.execute(f"SET threads = {int(spec['threads'])}")
    if spec.get("pages_per_task"):
        con.execute(f"SET pg_pages_per_task = {int(spec['pages_per_task'])}")
    # The order of a table scan means nothing here: let every thread write its row groups as
    # they come (DuckDB's advice for large COPY ... TO).
    con.execute("SET preserve_insertion_order = false")
    settings = dict(con.execute(
        "SELECT name, value FROM duckdb_settings() WHERE name IN ('threads', 'pg_pages_per_task', "
        "'pg_use_binary_copy', 'pg_use_ctid_scan', 'pg_connection_limit', "
        "'preserve_insertion_order')").fetchall())
    dsn = spec["dsn"].replace("'", "''")
    t0 = time.perf_counter()
    con.execute(f"ATTACH '{dsn}' AS pg (TYPE postgres, READ_ONLY)")
    select = f"SELECT * FROM pg.{spec['table']}"
    if spec.get("uuid_text"):
        uuids = [r[0] for r in con.execute(f"DESCRIBE pg.{spec['table']}").fetchall()
                 if r[1] == "UUID"]
        if uuids:
            casts = ", ".join(f'"{c}"::VARCHAR AS "{c}"' for c in uuids)
            select = f"SELECT * REPLACE ({casts}) FROM pg.{spec['table']}"
    con.execute(f"COPY ({select}) TO '{spec['out']}' (FORMAT parquet)")
    secs = time.perf_counter() - t0
    n, s_id, s_amount = con.execute(
        f"SELECT count(*), coalesce(sum(id), 0), coalesce(sum(amount), 0) "
        f"FROM read_parquet('{spec['out']}')").fetchone()
    print(json.dumps({"copy_seconds": secs, "rows": n, "sum_id": int(s_id),
                      "sum_amount": str(s_amount), "duckdb_version": duckdb.__version__,
                      "settings": settings}))


# --------------------------------------------------------------------------- checks

def money(x) -> str:
    """A sum of numeric(12,2) values, as text with two decimals, whoever computed it."""
    from decimal import Decimal

    return str(Decimal(str(x or 0)).quantize(Decimal("0.01")))


def check_sums(what: str, got: dict | None, want: dict) -> bool:
    if got is None:
        fail(f"{what}: no result to check")
        return False
    bad = [k for k in ("rows", "sum_id", "sum_amount") if str(got.get(k)) != str(want[k])]
    if bad:
        fail(f"{what}: " + ", ".join(f"{k} {got.get(k)} != source's {want[k]}" for k in bad))
        return False
    log(f"  ok: {what}: {fmt_int(got['rows'])} rows, sum(id) and sum(amount) equal the source's")
    return True


def strata_sums(strata: Strata, wl: Path, table: str, where: str = "") -> dict | None:
    rows = strata.query(wl, f"SELECT count(*) AS n, sum(id) AS s_id, sum(amount) AS s_amount "
                            f"FROM {table} {where}")
    if not rows:
        return None
    r = rows[0]
    return {"rows": int(r["n"]), "sum_id": int(r["s_id"] or 0), "sum_amount": money(r["s_amount"])}


def compare_rows(strata: Strata, wl: Path, pg: Postgres, ext_dir: Path, target: str,
                 source: str, where: str) -> dict:
    """Every value of strata's open rows against the PostgreSQL table, through DuckDB: the
    strata side exported with `strata query --format csv`, read with the source's types; the
    PostgreSQL side read by DuckDB's postgres extension. Returns counts, sums, an
    order-independent hash of all values on each side and the rows missing on either side."""
    import duckdb

    csv_path = wl / f"{target}.open.csv"
    cols = ", ".join(COLUMN_NAMES)
    if strata.query(wl, f"SELECT {cols} FROM {target} {where}", out=csv_path) is None:
        return {"ok": False}
    con = duckdb.connect()
    con.execute(f"SET extension_directory = '{ext_dir}'")
    con.execute("LOAD postgres_scanner")
    con.execute("SET TimeZone = 'UTC'")
    dsn = pg.dsn().replace("'", "''")
    con.execute(f"ATTACH '{dsn}' AS pg (TYPE postgres, READ_ONLY)")
    types = ("{'id': 'BIGINT', 'customer_id': 'INTEGER', 'amount': 'DECIMAL(12,2)', "
             "'status': 'VARCHAR', 'note': 'VARCHAR', 'paid': 'BOOLEAN', 'order_date': 'DATE', "
             "'updated_at': 'TIMESTAMPTZ', 'ref': 'UUID', 'attrs': 'VARCHAR'}")
    con.execute(f"CREATE TEMP TABLE s AS SELECT * FROM read_csv('{csv_path}', header = true, "
                f"columns = {types})")
    con.execute(f"CREATE TEMP TABLE p AS SELECT {cols.replace('attrs', 'attrs::VARCHAR AS attrs')} "
                f"FROM pg.{source}")
    res = compare_s_and_p(con, "postgres")
    con.close()
    csv_path.unlink()
    return res


def compare_rows_mariadb(strata: Strata, wl: Path, my: MariaDB, target: str, source: str,
                         where: str) -> dict:
    """compare_rows for a MariaDB table: strata's open rows exported with `strata query
    --format csv`, the MariaDB table with the `mariadb` client (tab-separated, NULL as `NULL`,
    timestamps in UTC), both read into DuckDB with the same types and compared there."""
    import duckdb

    csv_path = wl / f"{target}.open.csv"
    tsv_path = wl / f"{target}.source.tsv"
    cols = ", ".join(COLUMN_NAMES)
    if strata.query(wl, f"SELECT {cols} FROM {target} {where}", out=csv_path) is None:
        return {"ok": False}
    log(f"$ {Path(my.client).name} --batch --skip-column-names ... -e 'SELECT {cols} FROM {source}' "
        f"> {tsv_path}")
    my.sql(f"SELECT {cols} FROM {source}", out=tsv_path)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    # boolean is tinyint(1) in MariaDB: an integer (0/1) in the binlog and in Delta.
    types = ("{'id': 'BIGINT', 'customer_id': 'INTEGER', 'amount': 'DECIMAL(12,2)', "
             "'status': 'VARCHAR', 'note': 'VARCHAR', 'paid': 'TINYINT', 'order_date': 'DATE', "
             "'updated_at': 'TIMESTAMPTZ', 'ref': 'VARCHAR', 'attrs': 'VARCHAR'}")
    con.execute(f"CREATE TEMP TABLE s AS SELECT * FROM read_csv('{csv_path}', header = true, "
                f"columns = {types})")
    # The client's batch output: tabs between values, no quoting, NULL for NULL (no value
    # here holds a tab, a newline, a backslash or the text NULL).
    con.execute(f"CREATE TEMP TABLE p AS SELECT * FROM read_csv('{tsv_path}', header = false, "
                f"delim = '\t', quote = '', escape = '', nullstr = 'NULL', columns = {types})")
    res = compare_s_and_p(con, "mariadb")
    con.close()
    csv_path.unlink()
    tsv_path.unlink()
    return res


def compare_s_and_p(con, source_name: str) -> dict:
    """Compare DuckDB's temp tables s (strata's rows) and p (the source's), both with
    COLUMN_NAMES: counts, sums of ids, an order-independent hash of every value, and the rows
    only on one side (EXCEPT ALL both ways), with up to three examples of each."""
    norm = ("id, customer_id, amount::VARCHAR AS amount, status, note, paid, "
            "order_date::VARCHAR AS order_date, epoch_us(updated_at) AS updated_us, "
            "ref::VARCHAR AS ref, attrs")
    hcols = ", ".join(c if c != "updated_at" else "updated_us" for c in COLUMN_NAMES)
    agg = f"SELECT count(*), coalesce(sum(id), 0), coalesce(sum(hash({hcols})::HUGEINT), 0) FROM (SELECT {norm} FROM {{}}) t"
    sn, sid, shash = con.execute(agg.format("s")).fetchone()
    pn, pid, phash = con.execute(agg.format("p")).fetchone()
    only_s = con.execute(f"SELECT count(*) FROM (SELECT {norm} FROM s EXCEPT ALL SELECT {norm} FROM p)").fetchone()[0]
    only_p = con.execute(f"SELECT count(*) FROM (SELECT {norm} FROM p EXCEPT ALL SELECT {norm} FROM s)").fetchone()[0]
    example = None
    if only_s or only_p:
        example = con.execute(
            f"(SELECT 'strata' AS side, * FROM (SELECT {norm} FROM s EXCEPT ALL SELECT {norm} FROM p) LIMIT 3) "
            f"UNION ALL (SELECT '{source_name}', * FROM (SELECT {norm} FROM p EXCEPT ALL SELECT {norm} FROM s) LIMIT 3)"
        ).fetchall()
    return {"ok": only_s == 0 and only_p == 0 and sn == pn and sid == pid and shash == phash,
            "strata_rows": sn, "source_rows": pn, "strata_sum_id": int(sid), "source_sum_id": int(pid),
            "strata_hash": str(shash), "source_hash": str(phash),
            "only_in_strata": only_s, "only_in_source": only_p,
            "example": [list(map(str, r)) for r in example] if example else None}


# --------------------------------------------------------------------------- bulk

BULK_PIPELINE = """\
CREATE STREAMING TABLE orders_raw
AS SELECT * FROM STREAM read_database('bench', table => '{table}', watermark => 'updated_at, id'{options});
"""


def bench_bulk(a, pg: Postgres, strata: Strata, ext_dir: Path) -> dict:
    wl = a.workdir / "bulk"
    shutil.rmtree(wl, ignore_errors=True)
    wl.mkdir(parents=True)
    rows = a.rows
    log(f"\n=== bulk: {rows:,} rows, strata watermark load vs DuckDB ATTACH + COPY TO parquet ===")
    log(f"generating {BULK_TABLE} in PostgreSQL (generate_series, index on (updated_at, id), VACUUM FREEZE)")
    gen = create_table(pg, BULK_TABLE, rows)
    log(f"  -> {fmt_s(gen['seconds'])}; table {fmt_bytes(gen['heap_bytes'])}, "
        f"with indexes {fmt_bytes(gen['total_bytes'])}")
    want = table_sums(pg, BULK_TABLE)
    (wl / "pipeline.sql").write_text(strata.connection_sql() + BULK_PIPELINE.format(
        table=BULK_TABLE,
        options=f", chunk_bytes => '{a.chunk_bytes}'" if a.chunk_bytes else ""))
    rounds = []
    for i in range(1, a.rounds + 1):
        if a.rounds > 1:
            log(f"--- round {i} of {a.rounds}")
        shutil.rmtree(wl / "warehouse", ignore_errors=True)
        s = strata.run(wl, f"bulk-{i}")
        if s["rc"] == 0:
            s["check"] = strata_sums(strata, wl, "orders_raw")
            check_sums(f"strata orders_raw (round {i})", s["check"], want)
            s["delta_bytes"] = dir_bytes(wl / "warehouse")
        d = run_duckdb(wl, pg, f"bulk-{i}", ext_dir, a.threads, a.pages_per_task)
        if d["rc"] == 0:
            d["sum_amount"] = money(d["sum_amount"])
            check_sums(f"DuckDB parquet (round {i})", d, want)
        t = run_duckdb(wl, pg, f"bulk-{i}", ext_dir, a.threads, a.pages_per_task, uuid_text=True)
        if t["rc"] == 0:
            t["sum_amount"] = money(t["sum_amount"])
            check_sums(f"DuckDB parquet, uuid as text (round {i})", t, want)
        rounds.append({"strata": s, "duckdb": d, "duckdb_uuid_text": t})
    compare = None
    if a.full_compare and rounds and rounds[-1]["strata"]["rc"] == 0:
        log("comparing every value of strata's table with the source (through DuckDB)")
        compare = compare_rows(strata, wl, pg, ext_dir, "orders_raw", BULK_TABLE, "")
        report_compare("bulk: orders_raw vs the source table", compare)
    return {"workload": "bulk", "rows": rows, "generate": gen, "source": want, "rounds": rounds,
            "compare": compare}


def report_compare(what: str, c: dict) -> None:
    if not c or "strata_rows" not in c:
        fail(f"{what}: comparison not done")
        return
    if c["ok"]:
        log(f"  ok: {what}: {c['strata_rows']:,} rows, every value equal (EXCEPT ALL both ways "
            f"empty; sum(id) and value hash equal)")
    else:
        fail(f"{what}: rows {c['strata_rows']} vs {c['source_rows']}, sum(id) {c['strata_sum_id']} vs "
             f"{c['source_sum_id']}, hash {c['strata_hash']} vs {c['source_hash']}, "
             f"{c['only_in_strata']} row(s) only in strata, {c['only_in_source']} only in the source; "
             f"e.g. {c['example']}")


# --------------------------------------------------------------------------- cdc

# The CDC pipeline of either database: {options} are PostgreSQL's slot and publication
# (MariaDB's binlog needs none).
CDC_PIPELINE = """\
CREATE STREAMING TABLE cust_changes
AS SELECT * FROM STREAM read_database('bench', table => '{table}', mode => 'cdc'{options});
CREATE STREAMING TABLE cust;
CREATE FLOW cust_flow AS AUTO CDC INTO cust
FROM STREAM(cust_changes)
KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, _commit_timestamp, _unchanged_cols)
STORED AS SCD TYPE 2;
"""


def change_plan(k: int, m: int, txn: int) -> dict:
    """How the M changes are made: M // TXN transactions, each UPDATE-ing `upd` distinct live
    rows (never deleted ones), DELETE-ing `dele` rows from the low ids up, INSERT-ing `ins` new
    ids above K."""
    import math

    txns = max(1, m // txn)
    dele = round(txn * DELETE_SHARE)
    ins = round(txn * INSERT_SHARE)
    upd = txn - dele - ins
    deleted = txns * dele
    live = k - deleted  # ids deleted+1 .. k are never deleted: the updates pick from them
    if live < upd:
        raise SystemExit(f"--changes {m} deletes {deleted} of {k} rows, leaving fewer than the "
                         f"{upd} updates of a transaction; use more --cdc-rows or fewer --changes")
    stride = 1_000_003
    while math.gcd(stride, live) != 1:
        stride += 2
    return {"transactions": txns, "txn_size": txn, "updates_per_txn": upd,
            "deletes_per_txn": dele, "inserts_per_txn": ins, "updates": txns * upd,
            "deletes": deleted, "inserts": txns * ins, "changes": txns * txn,
            "live": live, "stride": stride}


def make_changes(pg: Postgres, k: int, plan: dict) -> float:
    p = plan
    sql = f"""
DO $$
BEGIN
  FOR b IN 0..{p['transactions'] - 1} LOOP
    UPDATE {CDC_TABLE} t SET
      amount = t.amount + 1,
      status = (ARRAY['new','paid','shipped','delivered','returned'])[1 + ((t.id + b + 1) % 5)::int],
      note = 'updated in ' || b,
      paid = NOT t.paid,
      updated_at = clock_timestamp(),
      attrs = jsonb_set(t.attrs, '{{v}}', to_jsonb(b + 1))
    WHERE t.id IN (SELECT {p['deletes'] + 1} + ((b * {p['updates_per_txn']} + j) * {p['stride']}) % {p['live']}
                   FROM generate_series(0::bigint, {p['updates_per_txn'] - 1}) j);
    DELETE FROM {CDC_TABLE} WHERE id BETWEEN b * {p['deletes_per_txn']} + 1 AND (b + 1) * {p['deletes_per_txn']};
    INSERT INTO {CDC_TABLE}
      SELECT {ROW_SELECT.format(v='b + 1')}
      FROM generate_series(({k} + b * {p['inserts_per_txn']} + 1)::bigint,
                           ({k} + (b + 1) * {p['inserts_per_txn']})::bigint) g;
    COMMIT;
  END LOOP;
END $$;
"""
    t0 = time.perf_counter()
    pg.psql(sql)
    return time.perf_counter() - t0


def bench_cdc(a, pg: Postgres, strata: Strata, ext_dir: Path) -> dict:
    wl = a.workdir / "cdc"
    shutil.rmtree(wl, ignore_errors=True)
    wl.mkdir(parents=True)
    k = a.cdc_rows
    plan = change_plan(k, a.changes, a.txn_size)
    log(f"\n=== cdc: {k:,} rows copied, then {plan['changes']:,} changes "
        f"({plan['updates']:,} updates, {plan['deletes']:,} deletes, {plan['inserts']:,} inserts "
        f"in {plan['transactions']:,} transactions) applied by one run into an SCD2 target ===")
    pg.drop_slot()
    log(f"generating {CDC_TABLE} in PostgreSQL")
    gen = create_table(pg, CDC_TABLE, k)
    log(f"  -> {fmt_s(gen['seconds'])}; table {fmt_bytes(gen['heap_bytes'])}")
    (wl / "pipeline.sql").write_text(strata.connection_sql() + CDC_PIPELINE.format(
        table=CDC_TABLE, options=f",\n  slot => '{SLOT}', publication => '{PUBLICATION}'"))
    res: dict = {"workload": "cdc", "db": "postgres", "rows": k, "plan": plan, "generate": gen}

    log("run 1: the slot's snapshot copy")
    first = strata.run(wl, "cdc-1")
    res["first_run"] = first
    if first["rc"] != 0:
        return res
    res["lag_after_first"] = pg.slot_lag()
    got = strata_sums(strata, wl, "cust", "WHERE __END_AT IS NULL")
    check_sums("strata cust after the snapshot copy", got, table_sums(pg, CDC_TABLE))

    log(f"making {plan['changes']:,} changes in PostgreSQL (one DO block, COMMIT every {a.txn_size})")
    res["changes_seconds"] = make_changes(pg, k, plan)
    log(f"  -> {fmt_s(res['changes_seconds'])}")
    res["lag_before"] = pg.slot_lag()
    log(f"slot {SLOT} lag before the run: {fmt_bytes(res['lag_before'])}")

    log("run 2: every change since the snapshot")
    second = strata.run(wl, "cdc-2")
    res["second_run"] = second
    res["lag_after"] = pg.slot_lag()
    log(f"slot {SLOT} lag after the run: {fmt_bytes(res['lag_after'])}")
    if second["rc"] != 0:
        return res

    check_cdc_result(res, strata, wl, k, plan, table_sums(pg, CDC_TABLE))
    log("comparing every value of the open rows with the PostgreSQL table (through DuckDB)")
    res["compare"] = compare_rows(strata, wl, pg, ext_dir, "cust", CDC_TABLE, "WHERE __END_AT IS NULL")
    report_compare("cdc: cust open rows vs the source table", res["compare"])
    res["delta_bytes"] = dir_bytes(wl / "warehouse")
    return res


def check_cdc_result(res: dict, strata: Strata, wl: Path, k: int, plan: dict, want: dict) -> None:
    """The checks of a CDC run that applied the plan's changes, whichever database they came
    from: the target's open rows against WANT (the source table's count and sums), the change
    table holding every change once, the target's versions, `strata validate`."""
    res["source"] = want
    check_sums("strata cust open rows (__END_AT IS NULL) after the changes",
               strata_sums(strata, wl, "cust", "WHERE __END_AT IS NULL"), want)
    rows = strata.query(wl, "SELECT count(*) AS n FROM cust_changes WHERE _change_type <> 'snapshot'")
    n_changes = int(rows[0]["n"]) if rows else None
    res["change_rows"] = n_changes
    if n_changes != plan["changes"]:
        fail(f"cust_changes holds {n_changes} change rows, {plan['changes']} were made")
    else:
        log(f"  ok: cust_changes holds the {n_changes:,} changes made")
    rows = strata.query(wl, "SELECT count(*) AS n FROM cust")
    versions = int(rows[0]["n"]) if rows else None
    res["target_versions"] = versions
    want_versions = k + plan["updates"] + plan["inserts"]
    if versions != want_versions:
        fail(f"cust holds {versions} versions; {k} + {plan['updates']} updates + "
             f"{plan['inserts']} inserts = {want_versions} expected")
    else:
        log(f"  ok: cust holds {versions:,} versions (rows + updates + inserts)")
    strata.validate(wl, "cust")


# --------------------------------------------------------------------------- cdc from MariaDB

# The columns of COLUMNS_DDL in MariaDB's types: boolean is tinyint(1); timestamp(6) is stored
# in UTC as timestamptz is; the uuid is its text, char(36) (strata gives PostgreSQL's uuid
# the same string type); json is MariaDB's alias of longtext, checked valid.
MY_COLUMNS_DDL = """(
  id          bigint PRIMARY KEY,
  customer_id int NOT NULL,
  amount      decimal(12,2) NOT NULL,
  status      varchar(16) NOT NULL,
  note        text,
  paid        boolean NOT NULL,
  order_date  date NOT NULL,
  updated_at  timestamp(6) NOT NULL,
  ref         char(36) NOT NULL,
  attrs       json
)"""
# One row from the integer g (and its md5 h, and a version v), the values ROW_SELECT gives
# in PostgreSQL (in a session at time zone UTC).
MY_ROW_SELECT = """
  g,
  (g * 7919) % 100000,
  CAST(((g * 104729 + ({v})) % 10000000) / 100 AS DECIMAL(12,2)),
  ELT(1 + ((g + ({v})) % 5), 'new', 'paid', 'shipped', 'delivered', 'returned'),
  CASE WHEN g % 10 = 0 THEN NULL ELSE CONCAT('order ', g, ' note ', ({v})) END,
  (g + ({v})) % 3 <> 0,
  DATE '2020-01-01' + INTERVAL (g % 2000) DAY,
  TIMESTAMP '2024-01-01 00:00:00' + INTERVAL g SECOND + INTERVAL (({v}) * 1000) MICROSECOND,
  CONCAT_WS('-', SUBSTR(h, 1, 8), SUBSTR(h, 9, 4), SUBSTR(h, 13, 4), SUBSTR(h, 17, 4), SUBSTR(h, 21, 12)),
  JSON_OBJECT('channel', ELT(1 + g % 3, 'web', 'app', 'store'), 'items', 1 + (g + ({v})) % 9, 'v', ({v}))
"""


def my_rows_from(lo: int, hi: int, v: str) -> str:
    """SELECT of the rows lo..hi (MY_ROW_SELECT at version V) from MariaDB's SEQUENCE engine."""
    return (f"SELECT {MY_ROW_SELECT.format(v=v)} FROM (SELECT seq AS g, MD5(seq) AS h "
            f"FROM seq_{lo}_to_{hi}) s")


def create_table_mariadb(my: MariaDB, table: str, rows: int) -> dict:
    t0 = time.perf_counter()
    my.sql(f"CREATE TABLE {table} {MY_COLUMNS_DDL} ENGINE = InnoDB;\n"
           f"INSERT INTO {table} {my_rows_from(1, rows, '0')};\n"
           f"ANALYZE TABLE {table};")
    secs = time.perf_counter() - t0
    schema, name = table.split(".")
    data, index = my.one(f"SELECT data_length, index_length FROM information_schema.tables "
                         f"WHERE table_schema = '{schema}' AND table_name = '{name}'")
    return {"rows": rows, "seconds": secs, "data_bytes": int(data), "index_bytes": int(index)}


def make_changes_mariadb(my: MariaDB, k: int, plan: dict) -> float:
    """The plan's changes, as make_changes makes them in PostgreSQL: one script of
    START TRANSACTION ... COMMIT blocks (updates of distinct live rows through a join with the
    ids they pick, deletes from the low ids up, inserts of new ids above K)."""
    p = plan
    t = MY_CDC_TABLE
    blocks = []
    for b in range(p["transactions"]):
        stmts = ["START TRANSACTION;"]
        stmts.append(
            f"UPDATE {t} t JOIN (SELECT {p['deletes'] + 1} + (({b * p['updates_per_txn']} + seq) "
            f"* {p['stride']}) % {p['live']} AS id FROM seq_0_to_{p['updates_per_txn'] - 1}) j "
            f"ON t.id = j.id SET t.amount = t.amount + 1, "
            f"t.status = ELT(1 + ((t.id + {b + 1}) % 5), 'new', 'paid', 'shipped', 'delivered', 'returned'), "
            f"t.note = 'updated in {b}', t.paid = NOT t.paid, t.updated_at = NOW(6), "
            f"t.attrs = JSON_SET(t.attrs, '$.v', {b + 1});")
        if p["deletes_per_txn"]:
            stmts.append(f"DELETE FROM {t} WHERE id BETWEEN {b * p['deletes_per_txn'] + 1} "
                         f"AND {(b + 1) * p['deletes_per_txn']};")
        if p["inserts_per_txn"]:
            lo = k + b * p["inserts_per_txn"] + 1
            hi = k + (b + 1) * p["inserts_per_txn"]
            stmts.append(f"INSERT INTO {t} {my_rows_from(lo, hi, str(b + 1))};")
        stmts.append("COMMIT;")
        blocks.append("\n".join(stmts))
    t0 = time.perf_counter()
    my.sql("\n".join(blocks))
    return time.perf_counter() - t0


def recorded_position(table_dir: Path) -> str | None:
    """The last `strata.lsn` a table's Delta log recorded in a commitInfo (`N/OFFSET`)."""
    found = None
    for f in sorted((table_dir / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            if '"commitInfo"' in line:
                found = json.loads(line)["commitInfo"].get("strata.lsn", found)
    return found


def binlog_behind(recorded: str | None, end: tuple[str, int]) -> int | None:
    """Bytes between a recorded position (`N/OFFSET`, hexadecimal: binlog file number and
    offset) and the binlog's end (file, position), when both are in the same file."""
    if not recorded or "/" not in recorded:
        return None
    n, off = (int(x, 16) for x in recorded.split("/", 1))
    end_file, end_pos = end
    if int(end_file.rsplit(".", 1)[-1]) != n:
        return None
    return end_pos - off


def bench_cdc_mariadb(a, my: MariaDB, strata: Strata) -> dict:
    wl = a.workdir / "cdc-mariadb"
    shutil.rmtree(wl, ignore_errors=True)
    wl.mkdir(parents=True)
    k = a.cdc_rows
    plan = change_plan(k, a.changes, a.txn_size)
    log(f"\n=== cdc from MariaDB's binlog: {k:,} rows copied, then {plan['changes']:,} changes "
        f"({plan['updates']:,} updates, {plan['deletes']:,} deletes, {plan['inserts']:,} inserts "
        f"in {plan['transactions']:,} transactions) applied by one run into an SCD2 target ===")
    log(f"generating {MY_CDC_TABLE} in MariaDB (SEQUENCE engine)")
    gen = create_table_mariadb(my, MY_CDC_TABLE, k)
    log(f"  -> {fmt_s(gen['seconds'])}; table about {fmt_bytes(gen['data_bytes'])}")
    (wl / "pipeline.sql").write_text(strata.connection_sql() + CDC_PIPELINE.format(
        table=MY_CDC_TABLE, options=""))
    res: dict = {"workload": "cdc", "db": "mariadb", "rows": k, "plan": plan, "generate": gen}

    log("run 1: the consistent snapshot's copy")
    first = strata.run(wl, "cdc-1")
    res["first_run"] = first
    if first["rc"] != 0:
        return res
    got = strata_sums(strata, wl, "cust", "WHERE __END_AT IS NULL")
    check_sums("strata cust after the snapshot copy", got, my.table_sums(MY_CDC_TABLE))

    log(f"making {plan['changes']:,} changes in MariaDB (one client script, COMMIT every "
        f"{a.txn_size})")
    binlog_before = my.binlog_bytes()
    res["changes_seconds"] = make_changes_mariadb(my, k, plan)
    res["binlog_bytes"] = my.binlog_bytes() - binlog_before
    log(f"  -> {fmt_s(res['changes_seconds'])}; {fmt_bytes(res['binlog_bytes'])} of binlog")
    res["binlog_end_before"] = my.binlog_end()

    log("run 2: every change since the snapshot")
    second = strata.run(wl, "cdc-2")
    res["second_run"] = second
    if second["rc"] != 0:
        return res
    res["recorded_position"] = recorded_position(wl / "warehouse" / "default" / "cust_changes")
    res["behind_after"] = binlog_behind(res["recorded_position"], res["binlog_end_before"])
    log(f"position recorded by run 2: {res['recorded_position']}; binlog end before the run: "
        f"{res['binlog_end_before'][0]}:{res['binlog_end_before'][1]} "
        f"({fmt_bytes(res['behind_after'])} behind it)")

    check_cdc_result(res, strata, wl, k, plan, my.table_sums(MY_CDC_TABLE))
    log("comparing every value of the open rows with the MariaDB table (client export, in DuckDB)")
    res["compare"] = compare_rows_mariadb(strata, wl, my, "cust", MY_CDC_TABLE, "WHERE __END_AT IS NULL")
    report_compare("cdc (MariaDB): cust open rows vs the source table", res["compare"])
    res["delta_bytes"] = dir_bytes(wl / "warehouse")
    return res


# --------------------------------------------------------------------------- report

def report(results: list[dict], strata: Strata, meta: dict) -> None:
    log("\n" + "=" * 78)
    log(f"strata: {strata.version()} ({strata.bin})")
    servers = []
    if meta.get("postgres"):
        servers.append(f"PostgreSQL {meta['postgres']}, DuckDB {meta['duckdb']} + postgres "
                       f"extension ({meta['duckdb_ext_source']})")
    if meta.get("mariadb"):
        servers.append(f"MariaDB {meta['mariadb']}")
    log(f"{'; '.join(servers)}; {meta['cpus']} cores; load average at start {meta['loadavg_start']}")
    if CHECK_ONLY:
        log("timings and memory not shown (--check-only: a correctness check, e.g. on a debug build)")
    for r in results:
        if r["workload"] == "bulk":
            log(f"\nbulk: {r['rows']:,} rows ({fmt_bytes(r['generate']['heap_bytes'])} in PostgreSQL)")
            if CHECK_ONLY:
                continue  # the checks were printed as they ran
            log(f"  {'round':<6} {'strata':>10} {'rows/s':>12} {'CPU':>8} {'RSS':>9}   {'duckdb':>10} "
                f"{'rows/s':>12} {'CPU':>8} {'RSS':>9}   {'ratio':>6}")
            ratios = []
            for i, rd in enumerate(r["rounds"], 1):
                s, d = rd["strata"], rd["duckdb"]
                ok = s.get("rc") == 0 and d.get("rc") == 0
                ratio = s["seconds"] / d["copy_seconds"] if ok else None
                if ratio:
                    ratios.append(ratio)
                log(f"  {i:<6} {fmt_s(s['seconds']):>10} {fmt_rate(r['rows'], s['seconds']):>12} "
                    f"{fmt_cpu(s):>8} {fmt_mem(s['maxrss_kib']):>9}   {fmt_s(d.get('copy_seconds')):>10} "
                    f"{fmt_rate(r['rows'], d.get('copy_seconds')):>12} {fmt_cpu(d):>8} "
                    f"{fmt_mem(d['maxrss_kib']):>9}   "
                    + ("-" if CHECK_ONLY or ratio is None else f"{ratio:.2f}x").rjust(6))
            if ratios and not CHECK_ONLY:
                r["median_ratio"] = statistics.median(ratios)
                log(f"  median ratio strata / duckdb over {len(ratios)} round(s): "
                    f"{r['median_ratio']:.2f}x (strata: process wall clock; DuckDB: ATTACH + COPY "
                    f"inside its process; CPU: user + system of the whole process, not counting "
                    f"the PostgreSQL backends serving it)")
            text_ratios = []
            for i, rd in enumerate(r["rounds"], 1):
                s, t = rd["strata"], rd.get("duckdb_uuid_text", {})
                if s.get("rc") == 0 and t.get("rc") == 0:
                    text_ratios.append(s["seconds"] / t["copy_seconds"])
                    log(f"  {i:<6} DuckDB writing uuid as text (strata's type for it): "
                        f"{fmt_s(t['copy_seconds'])}, CPU {fmt_cpu(t)}, RSS "
                        f"{fmt_mem(t['maxrss_kib'])}, Parquet {fmt_bytes(t.get('parquet_bytes'))} "
                        f"(native uuid: {fmt_bytes(rd['duckdb'].get('parquet_bytes'))}); ratio "
                        f"{text_ratios[-1]:.2f}x")
            if text_ratios and not CHECK_ONLY:
                r["median_ratio_uuid_text"] = statistics.median(text_ratios)
                log(f"  median ratio strata / duckdb with the same column types: "
                    f"{r['median_ratio_uuid_text']:.2f}x")
        else:
            p = r["plan"]
            mariadb = r.get("db") == "mariadb"
            log(f"\ncdc{' from MariaDB (binlog)' if mariadb else ' from PostgreSQL (logical replication)'}: "
                f"{r['rows']:,} rows, then {p['changes']:,} changes (DuckDB has no log-based CDC: "
                f"strata alone)")
            f, s = r.get("first_run"), r.get("second_run")
            if mariadb:
                log_line = (f"  binlog written by the changes: {fmt_bytes(r.get('binlog_bytes'))}; "
                            f"position recorded by run 2: {fmt_bytes(r.get('behind_after'))} behind "
                            f"the binlog's end before it")
            else:
                log_line = (f"  slot lag before / after run 2: {fmt_bytes(r.get('lag_before'))} / "
                            f"{fmt_bytes(r.get('lag_after'))}")
            if CHECK_ONLY:
                log(log_line)
                continue
            if f:
                log(f"  run 1 (snapshot copy):   {fmt_s(f['seconds']):>10}  "
                    f"{fmt_rate(r['rows'], f['seconds']):>12} rows     CPU {fmt_cpu(f):>8}  "
                    f"peak RSS {fmt_mem(f['maxrss_kib'])}")
            if s:
                log(f"  run 2 (the changes):     {fmt_s(s['seconds']):>10}  "
                    f"{fmt_rate(p['changes'], s['seconds']):>12} changes  CPU {fmt_cpu(s):>8}  "
                    f"peak RSS {fmt_mem(s['maxrss_kib'])}")
                log(log_line)
            if "changes_seconds" in r:
                log(f"  ({'MariaDB' if mariadb else 'PostgreSQL'} made the changes in "
                    f"{fmt_s(r['changes_seconds'])})")
    log("=" * 78)


def default_strata() -> str:
    if os.environ.get("STRATA_BIN"):
        return os.environ["STRATA_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO_DIR / "target")
    return str(target / "release" / "strata")


def main(argv=None) -> int:
    global CHECK_ONLY
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", metavar="bulk|cdc",
                    help="which parts to run (default: both; MariaDB has cdc only)")
    ap.add_argument("--source", choices=sorted(SOURCES), default="postgres",
                    help="the database the parts read: postgres (default), mariadb (cdc from its "
                         "binlog), or both (PostgreSQL's parts, then MariaDB's cdc)")
    ap.add_argument("--small", action="store_true",
                    help=f"small sizes: {SMALL['rows']:,}-row bulk, {SMALL['cdc_rows']:,}-row CDC "
                         f"table and {SMALL['changes']:,} changes")
    ap.add_argument("--strata", default=default_strata(),
                    help="strata binary (default: $STRATA_BIN, else $CARGO_TARGET_DIR (or target/)"
                         "/release/strata)")
    ap.add_argument("--rows", type=int, help=f"bulk: rows of the table (default {FULL['rows']:,})")
    ap.add_argument("--chunk-bytes",
                    help="bulk: strata's chunk_bytes option (default: strata's, 128MB); '1000GB' "
                         "commits the whole load at once, as before chunked commits")
    ap.add_argument("--rounds", type=int, default=1,
                    help="bulk: rounds of strata then DuckDB; the report gives each round's ratio "
                         "and their median (default 1)")
    ap.add_argument("--cdc-rows", type=int, help=f"cdc: rows copied first (default {FULL['cdc_rows']:,})")
    ap.add_argument("--changes", type=int,
                    help=f"cdc: changes made after the copy (default {FULL['changes']:,}; "
                         "rounded down to whole transactions)")
    ap.add_argument("--txn-size", type=int, default=1000, help="cdc: changes per transaction (default 1000)")
    ap.add_argument("--threads", type=int, help="DuckDB threads (default: all cores)")
    ap.add_argument("--pages-per-task", type=int,
                    help="DuckDB's pg_pages_per_task (default: the extension's, 1000)")
    ap.add_argument("--full-compare", dest="full_compare", action="store_true", default=None,
                    help="bulk: also compare every value of strata's table with the source "
                         "(default with --small; CDC always compares every value)")
    ap.add_argument("--no-full-compare", dest="full_compare", action="store_false")
    ap.add_argument("--check-only", action="store_true",
                    help="report correctness only, no timings (for debug builds and CI)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the benchmark schema in PostgreSQL (the slot is dropped anyway) "
                         "and the database in MariaDB")
    ap.add_argument("--workdir", type=Path, default=BENCH_DIR / "data" / "db")
    ap.add_argument("--json", type=Path, help="write all measurements here (default: "
                                               "WORKDIR/results-<time>.json)")
    a = ap.parse_args(argv)
    CHECK_ONLY = a.check_only
    preset = SMALL if a.small else FULL
    for k, v in preset.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.full_compare is None:
        a.full_compare = a.small
    parts = a.parts or ["bulk", "cdc"]
    if set(parts) - {"bulk", "cdc"}:
        ap.error(f"unknown part(s) {sorted(set(parts) - {'bulk', 'cdc'})}: choose from bulk, cdc")
    sources = SOURCES[a.source]
    if "postgres" not in sources:
        if "bulk" in a.parts:
            ap.error("bulk is PostgreSQL's part (against DuckDB's postgres extension): "
                     "--source mariadb runs cdc only")
        parts = ["cdc"]
    a.workdir.mkdir(parents=True, exist_ok=True)
    a.workdir = a.workdir.resolve()
    log(f"$ {shlex.join([sys.executable, *sys.argv])}")

    import duckdb

    pg: Postgres | None = None
    my: MariaDB | None = None
    results: list[dict] = []
    meta: dict = {
        "duckdb": duckdb.__version__, "cpus": os.cpu_count(), "machine": platform.platform(),
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv,
        "check_only": CHECK_ONLY, "source": a.source, "parts": parts,
    }
    try:
        strata = None
        if "postgres" in sources:
            pg = Postgres()
            strata = Strata(a.strata, pg)
            strata.check()
            ext_dir = a.workdir / "duckdb_extensions"
            meta.update({"strata": strata.version(), "strata_bin": strata.bin,
                         "postgres": pg.version(),
                         "duckdb_ext_source": install_duckdb_postgres(ext_dir)})
            log(f"strata {meta['strata']}; PostgreSQL {meta['postgres']} on {pg.host}:{pg.port}; "
                f"DuckDB {meta['duckdb']} (postgres extension from {meta['duckdb_ext_source']})")
            pg.reset_schema()
            try:
                if "bulk" in parts:
                    results.append(bench_bulk(a, pg, strata, ext_dir))
                if "cdc" in parts:
                    results.append(bench_cdc(a, pg, strata, ext_dir))
            finally:
                pg.drop_slot()  # a slot left behind keeps WAL forever
                if not a.keep:
                    pg.psql(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        if "mariadb" in sources and "cdc" in parts:
            my = MariaDB()
            strata = Strata(a.strata, my)
            strata.check()
            my.check_server()
            meta.update({"strata": strata.version(), "strata_bin": strata.bin,
                         "mariadb": my.version()})
            log(f"strata {meta['strata']}; MariaDB {meta['mariadb']} on {my.host}:{my.port}")
            my.reset_database()
            try:
                results.append(bench_cdc_mariadb(a, my, strata))
            finally:
                if not a.keep:
                    my.sql(f"DROP DATABASE IF EXISTS {MY_DB}")
        meta["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        if strata is not None:
            report(results, strata, meta)
    finally:
        if pg is not None:
            pg.close()
        if my is not None:
            my.close()
    out_json = a.json or (a.workdir / f"results-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out_json.write_text(json.dumps({"meta": meta, "results": results, "failures": FAILURES},
                                   indent=2, default=str))
    log(f"measurements written to {out_json}")
    if FAILURES:
        log(f"\n{len(FAILURES)} FAILURE(S):")
        for f in FAILURES:
            log("- " + f)
        return 1
    log("all checks passed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "_duckdb":
        _duckdb_child(sys.argv[2])
        sys.exit(0)
    ensure_venv()
    sys.exit(main())
