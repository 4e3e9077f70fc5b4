//! Crash drill for database sources: a writer changes a live PostgreSQL (or, for binlog CDC,
//! MariaDB) table while `strata run` is started and killed (SIGKILL) at random moments, over
//! and over; then clean runs finish the work, and the targets are compared with what the
//! database did. Log-based CDC
//! must give an SCD2 target with exactly one version per value ever written (none lost, none
//! doubled); a watermark load must give an SCD1 target equal to the table, and a bronze
//! table without a row read twice.
//!
//! `STRATA_DRILL_ROUNDS` sets the number of kills per mode (default 6; the README's test
//! command runs the default). A failure prints the seed; `STRATA_DRILL_SEED` replays it.

mod common;

use common::database::{drop_slot, pg, pg_value, Server};
use common::{stderr, Project};
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const PG: &str = "STRATA_TEST_PG";

/// A small deterministic generator (xorshift64*), seeded and printed so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    std::env::var("STRATA_DRILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 | 1)
                .unwrap_or(1)
        })
}

fn rounds() -> usize {
    std::env::var("STRATA_DRILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6)
}

/// What the writer did to each key, in order: `Some(value)` set, `None` deleted.
type History = BTreeMap<i64, Vec<Option<i64>>>;

/// Changes `table` (keys 1..=20, one statement per transaction) until `stop`, recording
/// every change; values are unique so every update is a new version. With `alter_at`, the
/// change of that value is preceded by `ALTER TABLE ... ADD COLUMN w bigint`, and it and
/// every later change set `w` to the value too (the writer goes on past it whatever
/// `stop` says).
fn write_until(
    config: String,
    table: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    alter_at: Option<i64>,
) -> History {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let (client, conn) = tokio_postgres::connect(&config, tokio_postgres::NoTls)
            .await
            .expect("writer connects");
        let task = tokio::spawn(conn);
        let mut rng = Rng(seed);
        let mut history: History = BTreeMap::new();
        let mut value = 0i64;
        while !stop.load(Ordering::SeqCst) || alter_at.is_some_and(|a| value < a + 20) {
            let key = 1 + rng.below(20) as i64;
            value += 1;
            if alter_at == Some(value) {
                client
                    .batch_execute(&format!("ALTER TABLE {table} ADD COLUMN w bigint"))
                    .await
                    .expect("writer adds a column");
            }
            let (w_col, w_val, w_set) = match alter_at.is_some_and(|a| value >= a) {
                true => (", w", format!(", {value}"), format!(", w = {value}")),
                false => ("", String::new(), String::new()),
            };
            let exists = history
                .get(&key)
                .and_then(|h| h.last().copied())
                .flatten()
                .is_some();
            let sql = match (exists, rng.below(10)) {
                (false, _) => format!(
                    "INSERT INTO {table} (id, v, updated_at{w_col}) VALUES ({key}, {value}, clock_timestamp(){w_val})"
                ),
                (true, 0) => format!("DELETE FROM {table} WHERE id = {key}"),
                (true, _) => format!(
                    "UPDATE {table} SET v = {value}, updated_at = clock_timestamp(){w_set} WHERE id = {key}"
                ),
            };
            client.batch_execute(&sql).await.expect("writer changes");
            let change = if sql.starts_with("DELETE") {
                None
            } else {
                Some(value)
            };
            history.entry(key).or_default().push(change);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        drop(client);
        let _ = task.await;
        history
    })
}

/// Starts `strata run` and kills it after a random pause, `rounds` times; some runs end by
/// themselves first.
fn run_and_kill(p: &Project, password: &str, rng: &mut Rng, rounds: usize) {
    for _ in 0..rounds {
        let mut child = p
            .command(&["run", "pipeline.sql"])
            .env("SHOP_PW", password)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("strata starts");
        std::thread::sleep(Duration::from_millis(50 + rng.below(700)));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
    }
}

fn run_clean(p: &Project, password: &str) {
    let out = p
        .command(&["run", "pipeline.sql"])
        .env("SHOP_PW", password)
        .output()
        .expect("strata runs");
    assert!(out.status.success(), "clean run failed: {}", stderr(&out));
}

/// Runs the drill on `pipeline` (reading `table`) and returns what the writer did (which
/// adds a column at `alter_at`, see [`write_until`]). With `seeded` rows (keys from 1001,
/// `v = -id`, above the writer's keys) the table is not empty when the first run starts,
/// and the kills land in its first copy too.
fn drill(
    server: &Server,
    table: &str,
    pipeline: &str,
    seed: u64,
    alter_at: Option<i64>,
    seeded: u64,
) -> (Project, History) {
    pg(
        server,
        &format!("CREATE TABLE {table} (id bigint PRIMARY KEY, v bigint, updated_at timestamptz NOT NULL)"),
    );
    let p = Project::new(&format!("{}{pipeline}", server.connection("postgresql")));
    if seeded > 0 {
        pg(
            server,
            &format!(
                "INSERT INTO {table} SELECT 1000 + i, -(1000 + i), now() FROM generate_series(1, {seeded}) i"
            ),
        );
    } else {
        // The empty table first (a CDC source takes its snapshot now): every change the
        // writer makes then reaches strata as a change.
        run_clean(&p, &server.password);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (config, table, stop) = (server.dsn(), table.to_string(), stop.clone());
        std::thread::spawn(move || write_until(config, table, seed, stop, alter_at))
    };
    let mut rng = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
    run_and_kill(&p, &server.password, &mut rng, rounds());
    stop.store(true, Ordering::SeqCst);
    let history = writer.join().expect("writer");
    // Two clean runs: the first finishes whatever the killed ones left, the second must
    // find nothing new and change nothing.
    run_clean(&p, &server.password);
    run_clean(&p, &server.password);
    (p, history)
}

#[test]
fn killed_cdc_runs_lose_and_double_no_change() {
    cdc_drill("cdc", "", None, 0);
}

/// The same starting from a table of 100,000 rows, copied in parts of 2,000 while the
/// writer changes the keys below them and runs are killed: a killed copy resumes after its
/// last part (or starts over before the first), and every seeded row is copied once.
#[test]
fn killed_first_copies_resume_and_lose_and_double_no_change() {
    cdc_drill(
        "cdc_copy",
        ", chunk_rows => '2000', batch_rows => '1000'",
        None,
        100_000,
    );
}

/// The same with each run committing its changes in parts of a few transactions, so that
/// kills also land between the parts of one run.
#[test]
fn killed_cdc_runs_committing_in_parts_lose_and_double_no_change() {
    cdc_drill("cdc_parts", ", chunk_rows => '50'", None, 0);
}

/// The same while the writer adds a column to the table (`ALTER TABLE ... ADD COLUMN w`)
/// after its 100th change and fills it from then on: the change table and the SCD2 target
/// (`COLUMNS * EXCEPT (...)`) gain it, every version before the ALTER has it NULL and
/// every one after has its value, whichever runs were killed around it.
#[test]
fn killed_cdc_runs_across_an_added_column_lose_and_double_no_change() {
    cdc_drill("cdc_alter", ", chunk_rows => '50'", Some(100), 0);
}

fn cdc_drill(prefix: &str, options: &str, alter_at: Option<i64>, seeded: u64) {
    let server = Server::from_env(PG);
    let seed = seed();
    eprintln!("drill seed {seed} (STRATA_DRILL_SEED={seed} replays it)");
    let table = format!("drill_{prefix}_{}", std::process::id());
    let slot = format!("strata_drill_{prefix}_{}", std::process::id());
    let (p, history) = drill(
        &server,
        &table,
        &format!(
            "CREATE STREAMING TABLE changes AS SELECT * FROM STREAM read_database('shop', \
             table => 'public.{table}', mode => 'cdc', slot => '{slot}', publication => '{slot}'{options});
CREATE STREAMING TABLE hist;
CREATE FLOW hist_flow AS AUTO CDC INTO hist FROM STREAM(changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
{columns}
STORED AS SCD TYPE 2;
",
            columns = match alter_at {
                Some(_) => "COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, \
                            _commit_timestamp, _unchanged_cols, updated_at)",
                None => "COLUMNS id, v",
            }
        ),
        seed,
        alter_at,
        seeded,
    );
    assert_history(&p, &history, alter_at, seed, seeded > 0);
    assert_seeded(&p, seeded, seed);
    drop_slot(&server, &slot);
}

/// Every value the writer ever wrote is one version of the SCD2 target `hist`, in order,
/// with `w` set from the ALTER at `alter_at` on; a key deleted last has no open one; and no
/// change is twice in the change table `changes`. `copied_live`: the writer began with the
/// first copy, so only the versions from the copy's snapshot on are asked for.
fn assert_history(
    p: &Project,
    history: &History,
    alter_at: Option<i64>,
    seed: u64,
    copied_live: bool,
) {
    let w = if alter_at.is_some() { "w" } else { "NULL" };
    let rows = p.csv(&format!(
        "SELECT id, v, {w} AS w, __END_AT IS NULL AS open FROM hist WHERE id <= 1000 \
         ORDER BY id, __START_AT"
    ));
    type Versions = BTreeMap<i64, Vec<(i64, Option<i64>, bool)>>;
    let mut got: Versions = BTreeMap::new();
    for line in rows.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        got.entry(f[0].parse().unwrap()).or_default().push((
            f[1].parse().unwrap(),
            f[2].parse().ok(),
            f[3] == "true",
        ));
    }
    let mut want: Versions = BTreeMap::new();
    for (key, changes) in history {
        let values: Vec<i64> = changes.iter().flatten().copied().collect();
        let open_last = changes.last().is_some_and(Option::is_some);
        let n = values.len();
        want.insert(
            *key,
            values
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    let w = alter_at.filter(|a| v >= *a).map(|_| v);
                    (v, w, open_last && i + 1 == n)
                })
                .collect(),
        );
    }
    if copied_live {
        // The writer began with the first copy: the versions a key had before the copy's
        // snapshot are folded into its snapshot row, so each key's versions are the tail
        // of what it was given from the one at the snapshot on (none lost or doubled
        // after it), and a key that exists at the end has its open version.
        for (key, versions) in &want {
            let tail = got.get(key).map(Vec::as_slice).unwrap_or_default();
            assert!(
                versions.ends_with(tail)
                    && !(tail.is_empty() && versions.last().is_some_and(|v| v.2)),
                "seed {seed}: key {key} has versions {tail:?}, not a tail of {versions:?}"
            );
        }
        assert!(
            got.keys().all(|k| want.contains_key(k)),
            "seed {seed}: keys the writer never wrote"
        );
    } else {
        assert_eq!(
            got, want,
            "seed {seed}: the SCD2 target is not the fold of the changes"
        );
    }
    // No change was taken twice: each (commit LSN, position) is one row of the change table.
    let dups = p.csv(
        "SELECT count(*) AS n FROM (SELECT _commit_lsn, _change_seq FROM changes \
         WHERE _change_type <> 'snapshot' GROUP BY _commit_lsn, _change_seq HAVING count(*) > 1)",
    );
    assert_eq!(dups, "n\n0\n", "seed {seed}: a change was taken twice");
}

/// The MariaDB the test command starts (row-based binlog).
fn mariadb() -> (mysql_async::Opts, String, String) {
    let var = |name: &str| {
        std::env::var(format!("STRATA_TEST_MYSQL_{name}")).unwrap_or_else(|_| {
            panic!(
                "STRATA_TEST_MYSQL_{name} is not set: run the tests under \
                 scripts/services/with-services.sh (the README's test command does)"
            )
        })
    };
    let (host, port, db, user, password) = (
        var("HOST"),
        var("PORT"),
        var("DATABASE"),
        var("USER"),
        var("PASSWORD"),
    );
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname(host.clone())
        .tcp_port(port.parse().expect("port"))
        .db_name(Some(db.clone()))
        .user(Some(user.clone()))
        .pass(Some(password.clone()))
        .into();
    let connection = format!(
        "CREATE CONNECTION shop TYPE mysql OPTIONS (host '{host}', port '{port}', \
         database '{db}', user '{user}', password_env 'SHOP_PW');\n"
    );
    (opts, connection, password)
}

/// The writer of [`write_until`] on MariaDB (keys 1..=20, one statement per transaction)
/// until `stop`, recording every change; with `alter_at`, it adds the column `w` after
/// `id` before that change (`ALTER TABLE ... ADD COLUMN w bigint AFTER id`: the row images
/// change shape in the middle) and sets it in every later change.
fn my_write_until(
    opts: mysql_async::Opts,
    table: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    alter_at: Option<i64>,
) -> History {
    use mysql_async::prelude::Queryable;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut conn = mysql_async::Conn::new(opts).await.expect("writer connects");
        let mut rng = Rng(seed);
        let mut history: History = BTreeMap::new();
        let mut value = 0i64;
        while !stop.load(Ordering::SeqCst) || alter_at.is_some_and(|a| value < a + 20) {
            let key = 1 + rng.below(20) as i64;
            value += 1;
            if alter_at == Some(value) {
                conn.query_drop(format!("ALTER TABLE {table} ADD COLUMN w bigint AFTER id"))
                    .await
                    .expect("writer adds a column");
            }
            let (w_col, w_val, w_set) = match alter_at.is_some_and(|a| value >= a) {
                true => (", w", format!(", {value}"), format!(", w = {value}")),
                false => ("", String::new(), String::new()),
            };
            let exists = history
                .get(&key)
                .and_then(|h| h.last().copied())
                .flatten()
                .is_some();
            let sql = match (exists, rng.below(10)) {
                (false, _) => format!(
                    "INSERT INTO {table} (id, v, updated_at{w_col}) VALUES ({key}, {value}, NOW(6){w_val})"
                ),
                (true, 0) => format!("DELETE FROM {table} WHERE id = {key}"),
                (true, _) => format!(
                    "UPDATE {table} SET v = {value}, updated_at = NOW(6){w_set} WHERE id = {key}"
                ),
            };
            conn.query_drop(&sql).await.expect("writer changes");
            let change = if sql.starts_with("DELETE") {
                None
            } else {
                Some(value)
            };
            history.entry(key).or_default().push(change);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let _ = conn.disconnect().await;
        history
    })
}

/// Binlog CDC (MariaDB) under the same kills, committing in parts of a few transactions:
/// the SCD2 target is the fold of every change, none lost or doubled.
#[test]
fn killed_binlog_cdc_runs_lose_and_double_no_change() {
    binlog_drill("binlog", None, 0);
}

/// The same starting from a table of 100,000 rows whose first copy, in parts of 2,000, is
/// killed and resumed: every seeded row is copied once, each key's history is a tail of
/// what the writer gave it.
#[test]
fn killed_binlog_first_copies_resume_and_lose_and_double_no_change() {
    binlog_drill("binlog_copy", None, 100_000);
}

/// The same while the writer adds a column in the middle of the table's columns after its
/// 100th change ([`my_write_until`]): the change table and the SCD2 target (`COLUMNS *
/// EXCEPT (...)`) gain it, every version before the ALTER has it NULL and every one after
/// has its value, whichever runs were killed around it.
#[test]
fn killed_binlog_cdc_runs_across_an_added_column_lose_and_double_no_change() {
    binlog_drill("binlog_alter", Some(100), 0);
}

fn binlog_drill(prefix: &str, alter_at: Option<i64>, seeded: u64) {
    use mysql_async::prelude::Queryable;
    let (opts, connection, password) = mariadb();
    let seed = seed();
    eprintln!("drill seed {seed} (STRATA_DRILL_SEED={seed} replays it)");
    let table = format!("drill_{prefix}_{}", std::process::id());
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let mut conn = mysql_async::Conn::new(opts.clone()).await.expect("connect");
            conn.query_drop(format!(
                "CREATE TABLE {table} (id bigint PRIMARY KEY, v bigint, updated_at datetime(6) NOT NULL)"
            ))
            .await
            .expect("create the table");
            if seeded > 0 {
                conn.query_drop(format!(
                    "INSERT INTO {table} SELECT 1000 + seq, -(1000 + seq), NOW(6) FROM seq_1_to_{seeded}"
                ))
                .await
                .expect("seed the table (MariaDB's sequence engine)");
            }
            let _ = conn.disconnect().await;
        });
    let columns = match alter_at {
        Some(_) => {
            "COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, \
                    _commit_timestamp, _unchanged_cols, updated_at)"
        }
        None => "COLUMNS id, v",
    };
    let parts = match seeded {
        0 => "chunk_rows => '50'",
        _ => "chunk_rows => '2000', batch_rows => '1000'",
    };
    let p = Project::new(&format!(
        "{connection}CREATE STREAMING TABLE changes AS SELECT * FROM STREAM read_database('shop', \
         table => '{table}', mode => 'cdc', {parts});
CREATE STREAMING TABLE hist;
CREATE FLOW hist_flow AS AUTO CDC INTO hist FROM STREAM(changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
{columns}
STORED AS SCD TYPE 2;
"
    ));
    if seeded == 0 {
        // The empty table first (its snapshot now): every change then comes through the
        // binlog.
        run_clean(&p, &password);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (opts, table, stop) = (opts.clone(), table.clone(), stop.clone());
        std::thread::spawn(move || my_write_until(opts, table, seed, stop, alter_at))
    };
    let mut rng = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
    run_and_kill(&p, &password, &mut rng, rounds());
    stop.store(true, Ordering::SeqCst);
    let history = writer.join().expect("writer");
    run_clean(&p, &password);
    run_clean(&p, &password);
    assert_history(&p, &history, alter_at, seed, seeded > 0);
    assert_seeded(&p, seeded, seed);
}

/// Each seeded row (keys from 1001, `v = -id`) is copied once and is one open version with
/// its value; says how many snapshots the copy took (one plus the resumes).
fn assert_seeded(p: &Project, seeded: u64, seed: u64) {
    if seeded == 0 {
        return;
    }
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS keys FROM changes WHERE id > 1000"),
        format!("n,keys\n{seeded},{seeded}\n"),
        "seed {seed}: a seeded row was copied twice or not at all"
    );
    assert_eq!(
        p.csv("SELECT count(*) AS n FROM hist WHERE id > 1000 AND v = -id AND __END_AT IS NULL"),
        format!("n\n{seeded}\n"),
        "seed {seed}"
    );
    let points = p.csv(
        "SELECT count(DISTINCT _commit_lsn) AS n FROM changes WHERE _change_type = 'snapshot'",
    );
    eprintln!(
        "seed {seed}: the first copy took {} snapshot(s)",
        points.lines().nth(1).unwrap_or("?")
    );
}

#[test]
fn killed_watermark_runs_end_with_the_tables_state() {
    let server = Server::from_env(PG);
    let seed = seed();
    eprintln!("drill seed {seed} (STRATA_DRILL_SEED={seed} replays it)");
    let table = format!("drill_wm_{}", std::process::id());
    let (p, history) = drill(
        &server,
        &table,
        &format!(
            "CREATE STREAMING TABLE rows_raw AS SELECT * FROM STREAM read_database('shop', \
             table => 'public.{table}', watermark => 'updated_at, id');
CREATE STREAMING TABLE current_rows;
CREATE FLOW current_flow AS AUTO CDC INTO current_rows FROM STREAM(rows_raw) KEYS (id)
SEQUENCE BY updated_at COLUMNS id, v STORED AS SCD TYPE 1;
"
        ),
        seed,
        None,
        0,
    );
    // A watermark load cannot see deletes: the target holds the last value each key had
    // while it existed at a load; keys never deleted must match the table exactly.
    let got = p.csv("SELECT id, v FROM current_rows ORDER BY id");
    let mut want = String::from("id,v\n");
    let never_deleted: Vec<(i64, i64)> = history
        .iter()
        .filter(|(_, c)| c.iter().all(Option::is_some))
        .map(|(k, c)| (*k, c.last().copied().flatten().unwrap()))
        .collect();
    for (k, v) in &never_deleted {
        want.push_str(&format!("{k},{v}\n"));
    }
    let got_never_deleted: String = got
        .lines()
        .filter(|l| {
            l.starts_with("id,")
                || never_deleted
                    .iter()
                    .any(|(k, _)| l.split(',').next() == Some(k.to_string().as_str()))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(got_never_deleted, want, "seed {seed}");
    let dups = p.csv(
        "SELECT count(*) AS n FROM (SELECT id, updated_at FROM rows_raw GROUP BY id, updated_at HAVING count(*) > 1)",
    );
    assert_eq!(dups, "n\n0\n", "seed {seed}: a row was loaded twice");
}

#[test]
fn killed_chunked_loads_take_every_row_once() {
    chunked_load_drill(
        "drill_chunks",
        ", batch_rows => 250, first_load => 'chunks'",
        "",
    );
}

/// The same with the default `batch_rows` (65,536): every chunk of 1,000 rows ends inside a
/// batch, at a change of the watermark.
#[test]
fn killed_chunked_loads_cut_inside_batches_take_every_row_once() {
    chunked_load_drill("drill_cut_chunks", ", first_load => 'chunks'", "");
}

/// A first load read as a scan (the default: page ranges on three connections, one
/// commit) killed at random moments starts over until one finishes; the later runs are
/// chunked. Every row once.
#[test]
fn killed_first_load_scans_take_every_row_once() {
    chunked_load_drill("drill_scan", ", batch_rows => 250, parallel => 3", "");
}

/// The same with the load read in ranges of `grp` on three connections, in one snapshot:
/// three ranges between the smallest and largest `grp` (no statistics), then, indexed and
/// analyzed, about 30 ranges of four batches taken in turn. The commits still follow the
/// watermark, so a kill loses and doubles nothing.
#[test]
fn killed_parallel_chunked_loads_take_every_row_once() {
    chunked_load_drill(
        "drill_par_chunks",
        ", batch_rows => 250, parallel => 3, first_load => 'chunks'",
        "",
    );
    chunked_load_drill(
        "drill_par_idx_chunks",
        ", batch_rows => 250, parallel => 3, first_load => 'chunks'",
        "CREATE INDEX ON {table} (grp); ANALYZE {table};",
    );
}

/// Loads of a growing table (options added to the read: `options`; statements run after
/// the table is filled: `setup`, `{table}` naming it), killed at random moments, then a
/// clean run: every row once.
fn chunked_load_drill(prefix: &str, options: &str, setup: &str) {
    let server = Server::from_env(PG);
    let seed = seed();
    eprintln!("drill seed {seed} (STRATA_DRILL_SEED={seed} replays it)");
    let table = format!("{prefix}_{}", std::process::id());
    let setup = setup.replace("{table}", &table);
    // Three rows to a watermark value, committed 1,000 rows at a time: kills land between
    // chunks and inside them.
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, grp bigint NOT NULL, pad text);
             INSERT INTO {table} SELECT i, i / 3, repeat('p', 40) FROM generate_series(1, 30000) i;
             {setup}"
        ),
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE bulk_raw AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', watermark => 'grp', chunk_rows => 1000{options});
",
        server.connection("postgresql")
    ));
    let mut rng = Rng(seed);
    let mut total = 30000;
    let mut partial = Vec::new();
    for round in 0..rounds() {
        run_and_kill(&p, &server.password, &mut rng, 1);
        if p.path("warehouse/default/bulk_raw/_delta_log").exists() {
            partial.push(p.csv("SELECT count(*) AS n FROM bulk_raw"));
        }
        // New rows arrive between runs, above every watermark loaded.
        let from = total + 1;
        total += 500 * (round + 1);
        pg(
            &server,
            &format!(
                "INSERT INTO {table} SELECT i, i, 'n' FROM generate_series({from}, {total}) i;"
            ),
        );
    }
    eprintln!("rows after each killed run: {partial:?}");
    run_clean(&p, &server.password);
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS ids, max(id) AS top FROM bulk_raw"),
        format!("n,ids,top\n{total},{total},{total}\n"),
        "seed {seed}: rows lost or loaded twice"
    );
}

/// PostgreSQL sinks under kills: CDC changes go to an SCD2 sink and an append sink, while
/// runs are killed at random (also between an outbox's commit and its delivery, and inside
/// a delivery). After the clean runs each PostgreSQL table equals its sink's outbox: no
/// version lost, none sent twice.
#[test]
fn killed_runs_deliver_postgres_sinks_exactly_once() {
    let server = Server::from_env(PG);
    let seed = seed();
    eprintln!("drill seed {seed} (STRATA_DRILL_SEED={seed} replays it)");
    let id = std::process::id();
    let table = format!("drill_sink_{id}");
    let slot = format!("strata_drill_sink_{id}");
    let (hist, log) = (
        format!("drill_sink_hist_{id}"),
        format!("drill_sink_log_{id}"),
    );
    let (p, _) = drill(
        &server,
        &table,
        &format!(
            "CREATE STREAMING TABLE changes AS SELECT * FROM STREAM read_database('shop', \
             table => 'public.{table}', mode => 'cdc', slot => '{slot}', publication => '{slot}', chunk_rows => '50');
CREATE SINK hist_pg OPTIONS (format 'postgresql', connection 'shop', table 'public.{hist}');
CREATE FLOW hist_flow AS AUTO CDC INTO hist_pg FROM STREAM(changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete' SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS id, v STORED AS SCD TYPE 2;
CREATE SINK log_pg OPTIONS (format 'postgresql', connection 'shop', table 'public.{log}');
CREATE FLOW log_flow AS INSERT INTO log_pg BY NAME
SELECT id, v, _change_type, _commit_lsn, _change_seq FROM STREAM(changes);
"
        ),
        seed,
        None,
        0,
    );
    let pg_rows = |t: &str, cols: &str| {
        let text = pg_value(
            &server,
            &format!(
                "SELECT string_agg(concat_ws('|', {cols}), E'\\n' ORDER BY {cols}) FROM public.{t}"
            ),
        )
        .unwrap_or_default();
        if text.is_empty() {
            text
        } else {
            format!("{text}\n")
        }
    };
    let outbox_rows = |sql: &str| {
        let csv = p.csv(sql);
        csv.split_once('\n')
            .map(|(_, rows)| rows.to_string())
            .unwrap_or_default()
    };
    // `__START_AT` and `__END_AT` are structs (the sequence), jsonb in PostgreSQL.
    let hist_outbox = outbox_rows(
        "SELECT concat_ws('|', id, v, __START_AT['_commit_lsn'], __START_AT['_change_seq'], \
         __END_AT['_commit_lsn'], __END_AT['_change_seq']) AS r FROM hist_pg \
         ORDER BY id, v, __START_AT['_commit_lsn'], __START_AT['_change_seq']",
    );
    assert!(
        !hist_outbox.is_empty(),
        "seed {seed}: the drill wrote nothing"
    );
    assert_eq!(
        pg_rows(
            &hist,
            "id, v, (\"__START_AT\"->>'_commit_lsn')::bigint, (\"__START_AT\"->>'_change_seq')::bigint, \
             (\"__END_AT\"->>'_commit_lsn')::bigint, (\"__END_AT\"->>'_change_seq')::bigint"
        ),
        hist_outbox,
        "seed {seed}: the SCD2 sink's table differs from its outbox"
    );
    assert_eq!(
        pg_rows(&log, "id, v, _change_type, _commit_lsn, _change_seq"),
        outbox_rows(
            "SELECT concat_ws('|', id, v, _change_type, _commit_lsn, _change_seq) AS r \
             FROM log_pg ORDER BY id, v, _change_type, _commit_lsn, _change_seq"
        ),
        "seed {seed}: the append sink's table differs from its outbox"
    );
    drop_slot(&server, &slot);
}
