//! `read_database` sources on the real binary against the real PostgreSQL and MariaDB that
//! `scripts/services/with-services.sh` starts (the README's test command runs every test
//! under it): first load, a run with nothing new, incremental loads feeding an SCD2 target,
//! an overlap window catching a late row without doubling the rows read again, the errors a
//! user meets, and the password appearing nowhere strata writes.

mod common;

use common::database::{
    cdc_history, commits, drop_slot, files_containing, full_refresh_ok, mysql, pg, pg_value, run,
    run_ok, unique, Server,
};
use common::{stderr, Project};
use std::path::Path;

#[test]
fn postgres_watermark_loads_feed_an_scd2_target_exactly_once() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("orders");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, status text NOT NULL, amount numeric(10,2), \
             ok boolean, day date, uid uuid, doc jsonb, updated_at timestamptz NOT NULL);
             INSERT INTO {table} VALUES
               (1, 'new', 10.50, true, '2024-01-31', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{\"a\": 1}}', '2024-01-01 10:00:00+00'),
               (2, 'new', 20.00, false, NULL, NULL, NULL, '2024-01-01 11:00:00+00'),
               (3, 'new', NULL, NULL, NULL, NULL, NULL, '2024-01-01 12:00:00+00');"
        ),
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE orders_raw AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', watermark => 'updated_at');
CREATE STREAMING TABLE orders;
CREATE FLOW orders_flow AS AUTO CDC INTO orders FROM STREAM(orders_raw) KEYS (id)
SEQUENCE BY updated_at STORED AS SCD TYPE 2;
",
        server.connection("postgresql")
    ));
    let mut said = run_ok(&p, &server.password);
    assert_eq!(p.csv("SELECT count(*) AS n FROM orders_raw"), "n\n3\n");
    assert_eq!(
        p.csv("SELECT id, status, amount, ok, day, uid, doc FROM orders_raw WHERE id = 1"),
        "id,status,amount,ok,day,uid,doc\n\
         1,new,10.50,true,2024-01-31,a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,\"{\"\"a\"\": 1}\"\n"
    );

    // The uuid column is written uncompressed (random hex digits do not compress), and
    // without a dictionary like the key and the watermark; the table's properties say so.
    let raw_dir = p.path("warehouse/default/orders_raw");
    let codecs = column_codecs(&raw_dir);
    assert_eq!(codecs["uid"], "UNCOMPRESSED", "{codecs:?}");
    assert!(
        codecs.iter().all(|(c, v)| c == "uid" || v == "SNAPPY"),
        "{codecs:?}"
    );
    let created = &commit_log(&raw_dir)[0];
    let conf = created
        .iter()
        .find_map(|a| a.get("metaData"))
        .map(|m| &m["configuration"])
        .expect("metaData");
    assert_eq!(conf["strata.parquet.uncompressedColumns"], "uid");
    assert_eq!(conf["strata.parquet.plainColumns"], "id,uid,updated_at");

    // Nothing new: nothing is committed.
    let before = commits(&raw_dir);
    said += &run_ok(&p, &server.password);
    assert_eq!(
        commits(&raw_dir),
        before,
        "a run with nothing new committed"
    );
    assert_eq!(p.csv("SELECT count(*) AS n FROM orders_raw"), "n\n3\n");

    // An update and an insert: only they are read, and the target keeps the history.
    pg(
        &server,
        &format!(
            "UPDATE {table} SET status = 'paid', updated_at = '2024-01-02 09:00:00+00' WHERE id = 1;
             INSERT INTO {table} (id, status, updated_at) VALUES (4, 'new', '2024-01-02 10:00:00+00');"
        ),
    );
    said += &run_ok(&p, &server.password);
    assert_eq!(p.csv("SELECT count(*) AS n FROM orders_raw"), "n\n5\n");
    assert_eq!(
        p.csv("SELECT id, status, __END_AT IS NULL AS open FROM orders ORDER BY id, __START_AT"),
        "id,status,open\n1,new,false\n1,paid,true\n2,new,true\n3,new,true\n4,new,true\n"
    );

    // The source table gains a column: so does the streaming table (earlier rows NULL),
    // and the flow carries it into the target.
    pg(
        &server,
        &format!(
            "ALTER TABLE {table} ADD COLUMN note text;
             UPDATE {table} SET note = 'vip', updated_at = '2024-01-03 09:00:00+00' WHERE id = 2;"
        ),
    );
    said += &run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, note FROM orders_raw ORDER BY id, updated_at"),
        "id,note\n1,\n1,\n2,\n2,vip\n3,\n4,\n"
    );
    assert_eq!(
        p.csv("SELECT id, note FROM orders WHERE __END_AT IS NULL ORDER BY id"),
        "id,note\n1,\n2,vip\n3,\n4,\n"
    );

    // The password is nowhere: not in what strata printed, not in any file it wrote.
    assert!(!said.contains(&server.password), "the password was printed");
    let found = files_containing(&p.path("warehouse"), &server.password);
    assert!(found.is_empty(), "the password is in {found:?}");
}

/// The codec of each column's chunks in the Parquet files of `table_dir` (one per column,
/// or "mixed").
fn column_codecs(table_dir: &Path) -> std::collections::BTreeMap<String, String> {
    use deltalake::parquet::file::reader::{FileReader, SerializedFileReader};
    let mut out = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(table_dir)
        .expect("table folder")
        .flatten()
    {
        if e.path().extension().is_none_or(|x| x != "parquet") {
            continue;
        }
        let file = std::fs::File::open(e.path()).expect("open");
        let reader = SerializedFileReader::new(file).expect("parquet");
        for rg in reader.metadata().row_groups() {
            for c in rg.columns() {
                let codec = format!("{:?}", c.compression());
                let seen = out.entry(c.column_path().string()).or_insert(codec.clone());
                if *seen != codec {
                    *seen = "mixed".to_string();
                }
            }
        }
    }
    out
}

/// The actions of each commit of a table's log, in version order.
fn commit_log(table_dir: &Path) -> Vec<Vec<serde_json::Value>> {
    let mut logs: Vec<_> = std::fs::read_dir(table_dir.join("_delta_log"))
        .expect("log")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    logs.sort();
    logs.iter()
        .map(|log| {
            std::fs::read_to_string(log)
                .expect("commit")
                .lines()
                .map(|line| serde_json::from_str(line).expect("action"))
                .collect()
        })
        .collect()
}

/// The statistics of an `add` action; `None` for other actions.
fn add_stats(action: &serde_json::Value) -> Option<serde_json::Value> {
    let stats = action["add"]["stats"].as_str()?;
    Some(serde_json::from_str(stats).expect("stats"))
}

/// Per commit of a table's log that recorded a position under `key` (`strata.lsn`,
/// `strata.watermark`): that position and the rows the commit added (from its files'
/// statistics).
fn positions(table_dir: &Path, key: &str) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for actions in commit_log(table_dir) {
        let position = actions
            .iter()
            .find_map(|a| a["commitInfo"][key].as_str().map(str::to_string));
        let rows = actions
            .iter()
            .filter_map(add_stats)
            .map(|s| s["numRecords"].as_i64().expect("numRecords"))
            .sum();
        if let Some(p) = position {
            out.push((p, rows));
        }
    }
    out
}

/// Per commit of a table's log that recorded a watermark: the smallest and largest value of
/// `column` among the files it added (from their statistics) and the watermark's value.
fn chunks_of(table_dir: &Path, column: &str) -> Vec<(i64, i64, i64)> {
    let mut out = Vec::new();
    for actions in commit_log(table_dir) {
        let (mut lo, mut hi, mut mark) = (i64::MAX, i64::MIN, None);
        for action in &actions {
            if let Some(w) = action["commitInfo"]["strata.watermark"].as_str() {
                let w: serde_json::Value = serde_json::from_str(w).expect("watermark");
                mark = w["values"][0]["value"].as_i64();
            }
            if let Some(stats) = add_stats(action) {
                lo = lo.min(stats["minValues"][column].as_i64().expect("min"));
                hi = hi.max(stats["maxValues"][column].as_i64().expect("max"));
            }
        }
        if let Some(mark) = mark {
            out.push((lo, hi, mark));
        }
    }
    out
}

#[test]
fn a_large_watermark_load_commits_in_chunks_that_never_split_a_watermark() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("bulk");
    // 5,000 rows, seven to a watermark value: a chunk may end only between two values.
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, grp bigint NOT NULL, pad text);
             INSERT INTO {table} SELECT i, i / 7, repeat('x', 20) FROM generate_series(1, 5000) i;"
        ),
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE bulk_raw AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', watermark => 'grp', batch_rows => 100, chunk_rows => 250, \
         first_load => 'chunks');
",
        server.connection("postgresql")
    ));
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS ids FROM bulk_raw"),
        "n,ids\n5000,5000\n"
    );
    let dir = p.path("warehouse/default/bulk_raw");
    let chunks = chunks_of(&dir, "grp");
    assert!(chunks.len() >= 15, "{} chunk(s): {chunks:?}", chunks.len());
    let mut previous = i64::MIN;
    for (lo, hi, mark) in &chunks {
        assert!(
            *lo > previous && hi == mark,
            "a chunk split a watermark: {chunks:?}"
        );
        previous = *mark;
    }
    assert_eq!(previous, 5000 / 7);
    // The next run reads after the last chunk's watermark, again in chunks; then nothing.
    pg(
        &server,
        &format!(
            "INSERT INTO {table} SELECT i, 1000 + i / 7, 'y' FROM generate_series(5001, 5600) i;"
        ),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS ids FROM bulk_raw"),
        "n,ids\n5600,5600\n"
    );
    assert!(chunks_of(&dir, "grp").len() > chunks.len() + 1);
    let before = commits(&dir);
    run_ok(&p, &server.password);
    assert_eq!(commits(&dir), before, "a run with nothing new committed");
}

/// `chunk_rows` below `batch_rows` (here its default, 65,536, so the whole load is one
/// batch): a chunk ends inside the batch, at the first change of the watermark once it
/// holds `chunk_rows` rows, so 1,000 rows with seven to a watermark value make three
/// commits (405, 406 and 189 rows), none splitting a value; the next run reads after the
/// last one and is cut the same way.
#[test]
fn chunk_rows_cuts_a_watermark_load_inside_a_batch_where_the_watermark_changes() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("cut");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, grp bigint NOT NULL, pad text);
             INSERT INTO {table} SELECT i, i / 7, 'x' FROM generate_series(1, 1000) i;"
        ),
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE cut_raw AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', watermark => 'grp', chunk_rows => 400, first_load => 'chunks');
",
        server.connection("postgresql")
    ));
    run_ok(&p, &server.password);
    let dir = p.path("warehouse/default/cut_raw");
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS ids, min(id) AS lo, max(id) AS hi FROM cut_raw"),
        "n,ids,lo,hi\n1000,1000,1,1000\n"
    );
    assert_eq!(
        chunks_of(&dir, "grp"),
        [(0, 57, 57), (58, 115, 115), (116, 142, 142)]
    );
    let rows: Vec<i64> = positions(&dir, "strata.watermark")
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert_eq!(rows, [405, 406, 189]);
    pg(
        &server,
        &format!("INSERT INTO {table} SELECT i, i / 7, 'y' FROM generate_series(1001, 2000) i;"),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS ids, max(id) AS hi FROM cut_raw"),
        "n,ids,hi\n2000,2000,2000\n"
    );
    assert_eq!(
        chunks_of(&dir, "grp")[3..],
        [(143, 200, 200), (201, 258, 258), (259, 285, 285)]
    );
    let before = commits(&dir);
    run_ok(&p, &server.password);
    assert_eq!(commits(&dir), before, "a run with nothing new committed");
}

/// A first load (`first_load => 'scan'`, the default) reads the table in ranges of its
/// pages, in any order, and commits once with the highest watermark, which the server finds
/// in the same snapshot: here the rows lie on disk against watermark order, some have no
/// watermark (never read), and the table is read on three connections. Chunks apply to the
/// later runs, read in watermark order.
#[test]
fn a_first_load_scans_the_table_in_page_ranges_and_commits_once_with_the_highest_watermark() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("scan");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, grp bigint, pad text);
             INSERT INTO {table} SELECT i, 100000 - i, repeat('x', 200) FROM generate_series(1, 20000) i;
             UPDATE {table} SET grp = NULL WHERE id % 1000 = 0;"
        ),
    );
    pg(&server, &format!("VACUUM ANALYZE {table}"));
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE scan_raw AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', watermark => 'grp', batch_rows => 500, parallel => '3', \
         chunk_rows => 1000);
",
        server.connection("postgresql")
    ));
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS ids, min(grp) AS lo, max(grp) AS hi FROM scan_raw"),
        "n,ids,lo,hi\n19980,19980,80001,99999\n"
    );
    let dir = p.path("warehouse/default/scan_raw");
    let chunks = chunks_of(&dir, "grp");
    assert_eq!(chunks.len(), 1, "one commit with the watermark: {chunks:?}");
    assert_eq!(chunks[0], (80001, 99999, 99999));
    // The next run reads only what is above the highest watermark (the new rows and an
    // update), in watermark order.
    pg(
        &server,
        &format!(
            "INSERT INTO {table} SELECT i, 200000 + i, 'y' FROM generate_series(20001, 20100) i;
             UPDATE {table} SET grp = 300000 WHERE id = 2;"
        ),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT count(*) AS n, count(DISTINCT id) AS ids, max(grp) AS hi FROM scan_raw"),
        "n,ids,hi\n20081,20080,300000\n"
    );
    let before = commits(&dir);
    run_ok(&p, &server.password);
    assert_eq!(commits(&dir), before, "a run with nothing new committed");
}

#[test]
fn mysql_overlap_window_catches_a_late_row_without_doubling_the_rows_read_again() {
    let server = Server::from_env("STRATA_TEST_MYSQL");
    let table = unique("events");
    mysql(
        &server,
        &[
            &format!(
                "CREATE TABLE {table} (id int PRIMARY KEY, v varchar(20), updated_at datetime(6) NOT NULL)"
            ),
            &format!(
                "INSERT INTO {table} VALUES (1, 'a', '2024-01-01 10:00:00'), \
                 (2, 'b', '2024-01-01 10:30:00'), (3, 'c', '2024-01-01 11:00:00')"
            ),
        ],
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE events_raw AS SELECT id, v, updated_at FROM STREAM \
         read_database('shop', table => '{table}', watermark => 'updated_at', overlap => '1 hour');
",
        server.connection("mysql")
    ));
    run_ok(&p, &server.password);
    assert_eq!(p.csv("SELECT count(*) AS n FROM events_raw"), "n\n3\n");
    // A row that committed late, with a watermark below the one taken, inside the window;
    // and a new one.
    mysql(
        &server,
        &[&format!(
            "INSERT INTO {table} VALUES (4, 'late', '2024-01-01 10:45:00'), (5, 'e', '2024-01-01 12:00:00')"
        )],
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, v FROM events_raw ORDER BY id"),
        "id,v\n1,a\n2,b\n3,c\n4,late\n5,e\n"
    );
    // Again with nothing new: the window reads rows 3, 5 (and 4) again and keeps none.
    let dir = p.path("warehouse/default/events_raw");
    let before = commits(&dir);
    run_ok(&p, &server.password);
    assert_eq!(commits(&dir), before);
    assert_eq!(p.csv("SELECT count(*) AS n FROM events_raw"), "n\n5\n");
}

#[test]
fn database_source_errors_name_the_place_and_nothing_is_written() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("shapes");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, spot point, updated_at timestamp NOT NULL);
             INSERT INTO {table} VALUES (1, '(1,2)', '2024-01-01 00:00:00');"
        ),
    );
    let query = format!(
        "CREATE STREAMING TABLE shapes_raw AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', watermark => 'updated_at'"
    );
    // An unsupported type names the column; nothing is written.
    let p = Project::new(&format!("{}{query});\n", server.connection("postgresql")));
    let out = run(&p, &server.password);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'spot'") && err.contains("shapes_raw"),
        "{err}"
    );
    assert!(!p.path("warehouse/default/shapes_raw").exists());
    // Excluding it reads the rest.
    p.file(
        "pipeline.sql",
        &format!(
            "{}{query}, exclude => 'spot');\n",
            server.connection("postgresql")
        ),
    );
    run_ok(&p, &server.password);
    assert_eq!(p.csv("SELECT id FROM shapes_raw"), "id\n1\n");

    // A connection that is not declared, and a password written in the text.
    p.file("pipeline.sql", &format!("{query});\n"));
    let out = run(&p, &server.password);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("connection 'shop', which is not declared"),
        "{}",
        stderr(&out)
    );
    p.file(
        "pipeline.sql",
        &format!(
            "CREATE CONNECTION shop TYPE postgresql OPTIONS (database 'd', user 'u', password 'hunter2');\n{query});\n"
        ),
    );
    let out = run(&p, &server.password);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("password_env") && !err.contains("hunter2"),
        "{err}"
    );
    // A wrong password: refused by the server, and not printed.
    p.file(
        "pipeline.sql",
        &format!("{}{query});\n", server.connection("postgresql")),
    );
    let out = run(&p, "wrong-password-123");
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        err.contains("connection 'shop'") && !err.contains("wrong-password-123"),
        "{err}"
    );
}

/// Creates `table` with a `body` stored out of line, uncompressed (EXTERNAL: an update of
/// `n` alone does not send it under REPLICA IDENTITY DEFAULT), holding keys 1 and 2.
fn toasted_table(server: &Server, table: &str) {
    pg(
        server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, body text, n int);
             ALTER TABLE {table} ALTER COLUMN body SET STORAGE EXTERNAL;
             INSERT INTO {table} VALUES (1, repeat('a', 5000), 0), (2, repeat('b', 6000), 0);"
        ),
    );
}

/// Asserts that `slot` was advanced at least to the last change `changes` (a change table)
/// recorded.
fn assert_slot_follows(server: &Server, p: &Project, slot: &str, changes: &str) {
    let recorded = p.csv(&format!("SELECT max(_commit_lsn) AS l FROM {changes}"));
    let recorded: i64 = recorded.lines().nth(1).unwrap().parse().unwrap();
    let confirmed = pg_value(
        server,
        &format!(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::text FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ),
    )
    .expect("the slot exists");
    assert!(
        confirmed.parse::<i64>().unwrap() >= recorded,
        "slot at {confirmed}, changes up to {recorded}"
    );
}

#[test]
fn postgres_cdc_copies_the_table_then_applies_every_change_once() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("cust");
    let slot = unique("strata_slot");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, name text, city text);
             INSERT INTO {table} VALUES (1, 'Ann', 'Oslo'), (2, 'Bob', 'Rome');"
        ),
    );
    let p = cdc_history(&server, "cust", &table, &slot, "");
    // First run: the table as of the slot's snapshot, committed on its own with the slot's
    // consistent point (where the slot stands while nothing has changed since).
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, _change_type FROM cust_changes ORDER BY id"),
        "id,_change_type\n1,snapshot\n2,snapshot\n"
    );
    let created_at = pg_value(
        &server,
        &format!(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ),
    )
    .expect("the slot exists");
    let dir = p.path("warehouse/default/cust_changes");
    assert_eq!(positions(&dir, "strata.lsn"), [(created_at, 2)]);
    // Changes in two transactions, one of them touching every kind.
    pg(
        &server,
        &format!(
            "BEGIN; UPDATE {table} SET city = 'Bergen' WHERE id = 1; DELETE FROM {table} WHERE id = 2;
             INSERT INTO {table} VALUES (3, 'Cy', 'Nice'); COMMIT;
             UPDATE {table} SET city = 'Lyon' WHERE id = 3;"
        ),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, _change_type, _change_seq FROM cust_changes WHERE _change_type <> 'snapshot' ORDER BY _commit_lsn, _change_seq"),
        "id,_change_type,_change_seq\n1,update,0\n2,delete,1\n3,insert,2\n3,update,0\n"
    );
    assert_eq!(
        p.csv("SELECT id, name, city, __END_AT IS NULL AS open FROM cust ORDER BY id, __START_AT"),
        "id,name,city,open\n1,Ann,Oslo,false\n1,Ann,Bergen,true\n2,Bob,Rome,false\n3,Cy,Nice,false\n3,Cy,Lyon,true\n"
    );
    // The slot was advanced to what the table recorded.
    assert_slot_follows(&server, &p, &slot, "cust_changes");
    // Nothing new: nothing committed.
    let before = commits(&dir);
    run_ok(&p, &server.password);
    assert_eq!(commits(&dir), before);
    drop_slot(&server, &slot);
}

/// The one-switch form: `AUTO CDC INTO t FROM STREAM read_database(..., mode => 'cdc')`
/// declares the change table `t_changes` and the flow with the change log's defaults
/// (sequence, deletes, change columns left out), giving the same history as writing them.
#[test]
fn one_switch_cdc_flow_declares_its_change_table_and_defaults() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("acct");
    let slot = unique("strata_slot");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, plan text);
             INSERT INTO {table} VALUES (1, 'free'), (2, 'pro');"
        ),
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE acct;
CREATE FLOW acct_flow AS AUTO CDC INTO acct FROM STREAM read_database('shop',
  table => 'public.{table}', mode => 'cdc', slot => '{slot}', publication => '{slot}')
KEYS (id) STORED AS SCD TYPE 2;
",
        server.connection("postgresql")
    ));
    run_ok(&p, &server.password);
    pg(
        &server,
        &format!("UPDATE {table} SET plan = 'pro' WHERE id = 1; DELETE FROM {table} WHERE id = 2;"),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, plan, __END_AT IS NULL AS open FROM acct ORDER BY id, __START_AT"),
        "id,plan,open\n1,free,false\n1,pro,true\n2,pro,false\n"
    );
    assert_eq!(
        p.csv(
            "SELECT _change_type, count(*) AS n FROM acct_changes GROUP BY _change_type ORDER BY 1"
        ),
        "_change_type,n\ndelete,1\nsnapshot,2\nupdate,1\n"
    );
    // The change columns stay in the change table.
    let columns = p.csv("SELECT column_name FROM information_schema.columns WHERE table_name = 'acct' ORDER BY ordinal_position");
    assert_eq!(columns, "column_name\nid\nplan\n__START_AT\n__END_AT\n");
    assert!(p.ok(&["validate", "acct"]).contains("acct: ok"));
    drop_slot(&server, &slot);
}

/// PostgreSQL arrays and composite types reach an SCD type 2 target through the change
/// log as Delta ARRAY and STRUCT columns, in the first copy and in later changes, and are
/// queried as such.
#[test]
fn arrays_and_composites_reach_the_history_as_arrays_and_structs() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("people");
    let addr = unique("addr");
    let slot = unique("strata_slot");
    pg(
        &server,
        &format!(
            "CREATE TYPE {addr} AS (city text, zip int);
             CREATE TABLE {table} (id int PRIMARY KEY, tags text[], home {addr});
             INSERT INTO {table} VALUES (1, '{{a,b}}', ROW('Paris', 75001)), (2, NULL, NULL);"
        ),
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE people;
CREATE FLOW people_flow AS AUTO CDC INTO people FROM STREAM read_database('shop',
  table => 'public.{table}', mode => 'cdc', slot => '{slot}', publication => '{slot}')
KEYS (id) STORED AS SCD TYPE 2;
",
        server.connection("postgresql")
    ));
    run_ok(&p, &server.password);
    pg(
        &server,
        &format!(
            "UPDATE {table} SET tags = array_append(tags, 'c'), home = ROW('Lyon', 69001) WHERE id = 1;
             UPDATE {table} SET tags = '{{}}' WHERE id = 2;"
        ),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv(
            "SELECT id, array_to_string(tags, '/') AS tags, cardinality(tags) AS n, \
             home['city'] AS city, home['zip'] AS zip, __END_AT IS NULL AS open \
             FROM people ORDER BY id, __START_AT"
        ),
        "id,tags,n,city,zip,open\n1,a/b,2,Paris,75001,false\n1,a/b/c,3,Lyon,69001,true\n\
         2,,,,,false\n2,,0,,,true\n"
    );
    let types = p.csv(
        "SELECT column_name, data_type FROM information_schema.columns \
         WHERE table_name = 'people' AND column_name IN ('tags', 'home') ORDER BY column_name",
    );
    assert!(
        types.contains("home,\"Struct(") && types.contains("tags,\"List("),
        "{types}"
    );
    drop_slot(&server, &slot);
}

#[test]
fn unchanged_toasted_values_are_taken_from_the_keys_last_row() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("docs");
    let slot = unique("strata_slot");
    toasted_table(&server, &table);
    let p = cdc_history(&server, "docs", &table, &slot, "");
    run_ok(&p, &server.password);
    // Key 1: its last value is in the streaming table. Key 3: inserted then updated in
    // the same run. Key 2: updated twice in one run, the value from the table both times.
    pg(
        &server,
        &format!(
            "UPDATE {table} SET n = 1 WHERE id = 1;
             INSERT INTO {table} VALUES (3, repeat('c', 7000), 0);
             UPDATE {table} SET n = 1 WHERE id = 3;
             UPDATE {table} SET n = 1 WHERE id = 2;
             UPDATE {table} SET n = 2 WHERE id = 2;"
        ),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv(
            "SELECT id, n, length(body) AS len, substr(body, 1, 1) AS c, _unchanged_cols IS NULL AS sent \
             FROM docs_changes WHERE _change_type = 'update' ORDER BY _commit_lsn, _change_seq"
        ),
        "id,n,len,c,sent\n1,1,5000,a,true\n3,1,7000,c,true\n2,1,6000,b,true\n2,2,6000,b,true\n"
    );
    assert_eq!(
        p.csv("SELECT id, n, length(body) AS len FROM docs WHERE __END_AT IS NULL ORDER BY id"),
        "id,n,len\n1,1,5000\n2,2,6000\n3,1,7000\n"
    );
    drop_slot(&server, &slot);
}

/// A first copy commits the table in parts of `chunk_rows` rows in key order; one that
/// fails after some parts (here a row its expectation refuses) resumes after the last part
/// committed, in a new snapshot. A change committed before the resume to a key the first
/// parts copied is read from the log; one to a key copied after the resume is already in
/// its row and is not applied twice. The history then equals the source, and later changes
/// go on from the first snapshot's position (PostgreSQL's slot).
#[test]
fn an_interrupted_first_copy_resumes_after_its_last_part() {
    let server = Server::from_env("STRATA_TEST_PG");
    let slot = unique("strata_slot");
    interrupted_first_copy(&server, Db::Postgres(&slot));
    drop_slot(&server, &slot);
}

/// The same through the MariaDB binlog: the resumed part is a new consistent snapshot.
#[test]
fn an_interrupted_binlog_first_copy_resumes_after_its_last_part() {
    let server = Server::from_env("STRATA_TEST_MYSQL");
    interrupted_first_copy(&server, Db::Mysql);
}

/// A first copy in key order commits in parts of `chunk_rows` rows; `first_load =>
/// 'scan'` reads the table as it lies and commits it once.
#[test]
fn a_first_copy_commits_in_parts_unless_first_load_is_scan() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("copyparts");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, v int);
             INSERT INTO {table} SELECT i, i FROM generate_series(1, 300) i;"
        ),
    );
    // The table's creation, then three parts and the commit of the copy's position (the
    // copy learns it ended after the third part's commit); or the creation and one commit.
    for (first_load, commits_made) in [("", 5), (", first_load => 'scan'", 2)] {
        let slot = unique("strata_slot");
        let p = cdc_history(
            &server,
            "parts",
            &table,
            &slot,
            &format!(", chunk_rows => '100', batch_rows => '50'{first_load}"),
        );
        run_ok(&p, &server.password);
        assert_eq!(
            commits(&p.path("warehouse/default/parts_changes")),
            commits_made,
            "{first_load}"
        );
        assert_eq!(
            p.csv(
                "SELECT count(*) AS n, count(DISTINCT id) AS k FROM parts WHERE __END_AT IS NULL"
            ),
            "n,k\n300,300\n"
        );
        drop_slot(&server, &slot);
    }
}

/// The database an interrupted-copy test runs against (PostgreSQL with its slot's name).
enum Db<'a> {
    Postgres(&'a str),
    Mysql,
}

impl Db<'_> {
    fn exec(&self, server: &Server, sql: &str) {
        match self {
            Db::Postgres(_) => pg(server, sql),
            Db::Mysql => mysql(server, &[sql]),
        }
    }
}

fn interrupted_first_copy(server: &Server, db: Db) {
    let table = unique("resume");
    db.exec(
        server,
        &format!("CREATE TABLE {table} (id int PRIMARY KEY, v int)"),
    );
    db.exec(
        server,
        &format!(
            "INSERT INTO {table} SELECT i, CASE WHEN i = 700 THEN NULL ELSE i END FROM \
             (WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 1000) \
             SELECT i FROM s) AS n"
        ),
    );
    let (connection, source) = match &db {
        Db::Postgres(slot) => (
            server.connection("postgresql"),
            format!("table => 'public.{table}', slot => '{slot}', publication => '{slot}'"),
        ),
        Db::Mysql => (server.connection("mysql"), format!("table => '{table}'")),
    };
    let p = Project::new(&format!(
        "{connection}CREATE STREAMING TABLE resume_changes (
  CONSTRAINT v_set EXPECT (v IS NOT NULL OR _change_type = 'delete') ON VIOLATION FAIL UPDATE
) AS SELECT * FROM STREAM read_database('shop', {source}, mode => 'cdc', \
chunk_rows => '100', batch_rows => '50');
CREATE STREAMING TABLE resume;
CREATE FLOW resume_flow AS AUTO CDC INTO resume FROM STREAM(resume_changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS id, v
STORED AS SCD TYPE 2;
"
    ));
    let out = run(&p, &server.password);
    assert!(!out.status.success(), "the copy meets the NULL and fails");
    assert!(stderr(&out).contains("v_set"), "{}", stderr(&out));
    // Parts of 100 rows (two batches of 50) up to key 600 are committed; nothing after.
    assert_eq!(
        p.csv("SELECT count(*) AS n, max(id) AS hi FROM resume_changes"),
        "n,hi\n600,600\n"
    );
    // Meanwhile the source changes below and above that key, and the bad row is fixed.
    for change in [
        format!("UPDATE {table} SET v = -5 WHERE id = 5"),
        format!("DELETE FROM {table} WHERE id = 10"),
        format!("INSERT INTO {table} VALUES (0, 0)"),
        format!("UPDATE {table} SET v = 700 WHERE id = 700"),
        format!("UPDATE {table} SET v = -900 WHERE id = 900"),
        format!("DELETE FROM {table} WHERE id = 950"),
        format!("INSERT INTO {table} VALUES (1001, 1001)"),
    ] {
        db.exec(server, &change);
    }
    let log = run_ok(&p, &server.password);
    assert!(
        log.contains("the initial snapshot resumed after key id = 600"),
        "{log}"
    );
    // The copy after key 600 is as of the resume; of the changes before it, only those to
    // keys the first parts copied are applied.
    assert_eq!(
        p.csv(
            "SELECT count(*) AS n, min(id) AS lo, max(id) AS hi, count(DISTINCT _commit_lsn) AS points \
             FROM resume_changes WHERE _change_type = 'snapshot'"
        ),
        "n,lo,hi,points\n1000,1,1001,2\n"
    );
    assert_eq!(
        p.csv(
            "SELECT id, _change_type, v FROM resume_changes WHERE _change_type <> 'snapshot' \
             ORDER BY _commit_lsn, _change_seq"
        ),
        match db {
            // PostgreSQL's delete carries the key only, the binlog's the whole row.
            Db::Postgres(_) => "id,_change_type,v\n5,update,-5\n10,delete,\n0,insert,0\n",
            Db::Mysql => "id,_change_type,v\n5,update,-5\n10,delete,10\n0,insert,0\n",
        }
    );
    // The source now: keys 0 to 1001 but 10 and 950, each its own value but 5 and 900.
    let mut source: std::collections::BTreeMap<i64, i64> = (0..=1001).map(|i| (i, i)).collect();
    source.remove(&10);
    source.remove(&950);
    source.insert(5, -5);
    source.insert(900, -900);
    let current = || {
        p.csv("SELECT id, v FROM resume WHERE __END_AT IS NULL ORDER BY id")
            .lines()
            .skip(1)
            .map(|l| {
                let (k, v) = l.split_once(',').expect("two columns");
                (k.parse().expect("id"), v.parse().expect("v"))
            })
            .collect::<std::collections::BTreeMap<i64, i64>>()
    };
    assert_eq!(current(), source);
    assert_eq!(
        p.csv("SELECT id, v, __END_AT IS NULL AS open FROM resume WHERE id IN (5, 10, 900) ORDER BY id, __START_AT"),
        "id,v,open\n5,5,false\n5,-5,true\n10,10,false\n900,-900,true\n"
    );
    // Later changes are read from the first snapshot's position on, once each.
    db.exec(
        server,
        &format!("UPDATE {table} SET v = 2 WHERE id IN (1, 999)"),
    );
    run_ok(&p, &server.password);
    run_ok(&p, &server.password);
    source.insert(1, 2);
    source.insert(999, 2);
    assert_eq!(current(), source);
    assert_eq!(
        p.csv("SELECT count(*) AS n FROM resume_changes WHERE _change_type = 'update'"),
        "n\n3\n"
    );
}

/// `chunk_rows`: a CDC run commits its changes in parts, each ended at a transaction end and
/// recording where the next starts; an unchanged TOASTed value is found in an earlier part
/// of the same run; the slot follows each part; the history equals the source.
#[test]
fn a_cdc_run_commits_its_changes_in_parts_of_whole_transactions() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("parts");
    let slot = unique("strata_slot");
    toasted_table(&server, &table);
    let p = cdc_history(&server, "parts", &table, &slot, ", chunk_rows => '3'");
    run_ok(&p, &server.password);
    let dir = p.path("warehouse/default/parts_changes");
    let before = commits(&dir);
    // Six transactions, nine changes: a part ends at the first transaction end after three
    // changes, so the run commits [T1], [T2 T3 T4] and [T5 T6]; nothing follows them before
    // the fence, so there is no fourth commit.
    for transaction in [
        format!("INSERT INTO {table} VALUES (3, repeat('c', 7000), 0), (4, 'd', 0), (5, 'e', 0)"),
        format!("UPDATE {table} SET n = 1 WHERE id = 1"),
        format!("UPDATE {table} SET n = 1 WHERE id = 3"),
        format!("DELETE FROM {table} WHERE id = 2"),
        format!(
            "BEGIN; UPDATE {table} SET n = 2 WHERE id = 3; UPDATE {table} SET n = 2 WHERE id = 4; COMMIT"
        ),
        format!("INSERT INTO {table} VALUES (6, 'f', 0)"),
    ] {
        pg(&server, &transaction);
    }
    run_ok(&p, &server.password);
    assert_eq!(commits(&dir), before + 3, "one commit per part");
    assert_eq!(
        p.csv(
            "SELECT id, _change_type, n, length(body) AS len FROM parts_changes \
             WHERE _change_type <> 'snapshot' ORDER BY _commit_lsn, _change_seq"
        ),
        "id,_change_type,n,len\n3,insert,0,7000\n4,insert,0,1\n5,insert,0,1\n1,update,1,5000\n\
         3,update,1,7000\n2,delete,,\n3,update,2,7000\n4,update,2,1\n6,insert,0,1\n"
    );
    assert_eq!(
        p.csv("SELECT id, n, length(body) AS len FROM parts WHERE __END_AT IS NULL ORDER BY id"),
        "id,n,len\n1,1,5000\n3,2,7000\n4,2,1\n5,0,1\n6,0,1\n"
    );
    // The slot was advanced to the last part's position.
    assert_slot_follows(&server, &p, &slot, "parts_changes");
    // Nothing new: nothing committed.
    let after = commits(&dir);
    run_ok(&p, &server.password);
    assert_eq!(commits(&dir), after);
    drop_slot(&server, &slot);
}

#[test]
fn an_unchanged_toasted_value_strata_cannot_find_is_an_error_naming_the_fix() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("notes");
    let slot = unique("strata_slot");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, body text, n int);
             ALTER TABLE {table} ALTER COLUMN body SET STORAGE EXTERNAL;
             INSERT INTO {table} VALUES (1, repeat('a', 5000), 0);"
        ),
    );
    // The change table keeps no change order: the key's last row cannot be told.
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE notes_changes AS SELECT id, body, n, _change_type FROM STREAM \
         read_database('shop', table => 'public.{table}', mode => 'cdc', slot => '{slot}', \
         publication => '{slot}');
",
        server.connection("postgresql")
    ));
    run_ok(&p, &server.password);
    pg(&server, &format!("UPDATE {table} SET n = 1 WHERE id = 1;"));
    let out = run(&p, &server.password);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("public.{table}"))
            && err.contains("column body")
            && err.contains("REPLICA IDENTITY FULL")
            && err.contains("_commit_lsn"),
        "{err}"
    );
    assert_eq!(p.csv("SELECT count(*) AS n FROM notes_changes"), "n\n1\n");
    drop_slot(&server, &slot);
}

#[test]
fn yaml_spec_turns_three_lines_per_table_into_history() {
    let server = Server::from_env("STRATA_TEST_PG");
    let cust = unique("ycust");
    let orders = unique("yorders");
    let slot = unique("strata_yslot");
    pg(
        &server,
        &format!(
            "CREATE TABLE {cust} (id int PRIMARY KEY, city text);
             INSERT INTO {cust} VALUES (1, 'Oslo');
             CREATE TABLE {orders} (id int PRIMARY KEY, total int, updated_at timestamp NOT NULL);
             INSERT INTO {orders} VALUES (10, 5, '2024-01-01 00:00:00');"
        ),
    );
    let p = Project::new("");
    p.file(
        "spec.yaml",
        &format!(
            "name: shop\n\
             connections:\n  shop: {{ type: postgresql, host: '{}', port: {}, database: {}, user: {}, password_env: SHOP_PW }}\n\
             tables:\n\
             \x20 - name: customers\n\
             \x20   source: {{ database: shop, table: public.{cust}, cdc: true, slot: {slot} }}\n\
             \x20   keys: [id]\n\
             \x20   stored_as: SCD TYPE 2\n\
             \x20 - name: orders\n\
             \x20   source: {{ database: shop, table: public.{orders}, watermark: [updated_at, id] }}\n\
             \x20   keys: [id]\n\
             \x20   sequence_by: updated_at\n",
            server.host, server.port, server.database, server.user
        ),
    );
    let run_spec = || {
        let out = p
            .command(&["run", "spec.yaml"])
            .env("SHOP_PW", &server.password)
            .env_remove("PGPASSWORD")
            .output()
            .expect("strata runs");
        assert!(out.status.success(), "run failed: {}", stderr(&out));
    };
    run_spec();
    pg(
        &server,
        &format!(
            "UPDATE {cust} SET city = 'Bergen' WHERE id = 1; INSERT INTO {cust} VALUES (2, 'Rome');
             DELETE FROM {cust} WHERE id = 2;
             UPDATE {orders} SET total = 7, updated_at = '2024-01-02 00:00:00' WHERE id = 10;"
        ),
    );
    run_spec();
    let row: serde_json::Value = serde_json::from_str(
        p.query("json", "SELECT * FROM customers WHERE id = 2")
            .trim(),
    )
    .expect("one JSON row");
    let columns: Vec<&String> = row.as_object().expect("an object").keys().collect();
    assert_eq!(
        columns,
        ["__END_AT", "__START_AT", "city", "id"],
        "the change columns stay out of the target"
    );
    assert_eq!(
        p.csv("SELECT id, city, __END_AT IS NULL AS open FROM customers ORDER BY id, __START_AT"),
        "id,city,open\n1,Oslo,false\n1,Bergen,true\n2,Rome,false\n"
    );
    assert_eq!(p.csv("SELECT id, total FROM orders"), "id,total\n10,7\n");
    drop_slot(&server, &slot);
}

/// A replication slot dropped on the server: the run fails (exit 2, nothing written) with
/// the exact command that takes a new snapshot, naming the pipeline and the table; that
/// command then brings the table back in step with the source.
#[test]
fn a_dropped_slot_names_the_full_refresh_command() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("gone");
    let slot = unique("strata_slot");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, plan text);
             INSERT INTO {table} VALUES (1, 'free');"
        ),
    );
    let p = cdc_history(&server, "gone", &table, &slot, "");
    run_ok(&p, &server.password);
    drop_slot(&server, &slot);
    pg(
        &server,
        &format!("UPDATE {table} SET plan = 'pro' WHERE id = 1"),
    );
    let dir = p.path("warehouse/default/gone_changes");
    let before = commits(&dir);
    let out = run(&p, &server.password);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`strata run pipeline.sql --full-refresh default.gone_changes`")
            || err.contains("`strata run pipeline.sql --full-refresh gone_changes`"),
        "{err}"
    );
    assert!(err.contains(&slot), "{err}");
    assert_eq!(commits(&dir), before, "nothing written");
    full_refresh_ok(&p, &server.password, "gone_changes");
    assert_eq!(
        p.csv("SELECT id, plan FROM gone WHERE __END_AT IS NULL"),
        "id,plan\n1,pro\n"
    );
    drop_slot(&server, &slot);
}

/// A first copy that stopped after some parts cannot resume once its slot is gone (the
/// changes since its snapshot are lost to strata): the run says so with the full-refresh
/// command and writes nothing, and that command copies the table again.
#[test]
fn a_stopped_first_copy_whose_slot_is_gone_names_the_full_refresh_command() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("noresume");
    let slot = unique("strata_slot");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, v int);
             INSERT INTO {table} SELECT i, CASE WHEN i = 250 THEN NULL ELSE i END FROM generate_series(1, 300) i;"
        ),
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE noresume_changes (
  CONSTRAINT v_set EXPECT (v IS NOT NULL OR _change_type = 'delete') ON VIOLATION FAIL UPDATE
) AS SELECT * FROM STREAM read_database('shop', table => 'public.{table}', mode => 'cdc', \
slot => '{slot}', publication => '{slot}', chunk_rows => '100', batch_rows => '50');
",
        server.connection("postgresql")
    ));
    assert!(
        !run(&p, &server.password).status.success(),
        "the copy meets the NULL"
    );
    assert_eq!(
        p.csv("SELECT count(*) AS n FROM noresume_changes"),
        "n\n200\n"
    );
    drop_slot(&server, &slot);
    pg(
        &server,
        &format!("UPDATE {table} SET v = 250 WHERE id = 250"),
    );
    let dir = p.path("warehouse/default/noresume_changes");
    let before = commits(&dir);
    let out = run(&p, &server.password);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`strata run pipeline.sql --full-refresh default.noresume_changes`"),
        "{err}"
    );
    assert!(err.contains(&slot) && err.contains("is gone"), "{err}");
    assert_eq!(commits(&dir), before, "nothing written");
    full_refresh_ok(&p, &server.password, "noresume_changes");
    assert_eq!(
        p.csv("SELECT count(*) AS n, sum(v) AS s FROM noresume_changes"),
        "n,s\n300,45150\n"
    );
    drop_slot(&server, &slot);
}

/// An update of a TOASTed row's primary key (`UPDATE docs SET id = 10 WHERE id = 1`) leaves
/// the large value unchanged: the new key takes it from the old key's last row, whether
/// that row is in the streaming table (an earlier run) or earlier in the same run, and a
/// chain of key changes in one run carries it along. SCD1 and SCD2 targets get the value.
#[test]
fn a_key_change_of_a_toasted_row_carries_its_values_over() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("rekey");
    let slot = unique("strata_slot");
    toasted_table(&server, &table);
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE docs_changes AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', mode => 'cdc', slot => '{slot}', publication => '{slot}');
CREATE STREAMING TABLE docs;
CREATE FLOW docs_flow AS AUTO CDC INTO docs FROM STREAM(docs_changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, _commit_timestamp, _unchanged_cols);
CREATE STREAMING TABLE docs_history;
CREATE FLOW docs_history_flow AS AUTO CDC INTO docs_history FROM STREAM(docs_changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, _commit_timestamp, _unchanged_cols)
STORED AS SCD TYPE 2;
",
        server.connection("postgresql")
    ));
    run_ok(&p, &server.password);
    // Key 1 -> 10 (its value in the streaming table); key 2 updated, then 2 -> 20 -> 21 in
    // the same run (the value from the run's own earlier rows).
    pg(
        &server,
        &format!(
            "UPDATE {table} SET id = 10 WHERE id = 1;
             UPDATE {table} SET n = 5 WHERE id = 2;
             UPDATE {table} SET id = 20 WHERE id = 2;
             UPDATE {table} SET id = 21, n = 6 WHERE id = 20;"
        ),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, n, length(body) AS len, substr(body, 1, 1) AS c FROM docs ORDER BY id"),
        "id,n,len,c\n10,0,5000,a\n21,6,6000,b\n"
    );
    assert_eq!(
        p.csv(
            "SELECT id, n, length(body) AS len, __END_AT IS NULL AS open FROM docs_history \
             ORDER BY id, __START_AT"
        ),
        "id,n,len,open\n1,0,5000,false\n2,0,6000,false\n2,5,6000,false\n10,0,5000,true\n\
         20,5,6000,false\n21,6,6000,true\n"
    );
    // A later run is not stuck.
    pg(&server, &format!("UPDATE {table} SET n = 7 WHERE id = 10;"));
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, n, length(body) AS len FROM docs ORDER BY id"),
        "id,n,len\n10,7,5000\n21,6,6000\n"
    );
    drop_slot(&server, &slot);
}

/// `TRUNCATE` on a replicated table, then new rows: the one-switch form applies it (SCD1:
/// the target emptied at the truncate's position; SCD2: every open version closed there,
/// as a delete of every key would), and later runs go on. The explicit form without
/// `APPLY AS TRUNCATE WHEN` says that a truncate arrived and which clause handles it.
#[test]
fn a_source_truncate_empties_scd1_and_closes_scd2_in_the_one_switch_form() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("trunc");
    let slot = unique("strata_slot");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, plan text);
             INSERT INTO {table} VALUES (1, 'free'), (2, 'pro');"
        ),
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE acct;
CREATE FLOW acct_flow AS AUTO CDC INTO acct FROM STREAM read_database('shop',
  table => 'public.{table}', mode => 'cdc', slot => '{slot}', publication => '{slot}')
KEYS (id) STORED AS SCD TYPE 2;
CREATE STREAMING TABLE acct_now;
CREATE FLOW acct_now_flow AS AUTO CDC INTO acct_now FROM STREAM(acct_changes)
KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
APPLY AS TRUNCATE WHEN _change_type = 'truncate'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, _commit_timestamp, _unchanged_cols);
",
        server.connection("postgresql")
    ));
    run_ok(&p, &server.password);
    pg(
        &server,
        &format!("TRUNCATE {table}; INSERT INTO {table} VALUES (3, 'team');"),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, plan FROM acct_now ORDER BY id"),
        "id,plan\n3,team\n"
    );
    assert_eq!(
        p.csv("SELECT id, plan, __END_AT IS NULL AS open FROM acct ORDER BY id, __START_AT"),
        "id,plan,open\n1,free,false\n2,pro,false\n3,team,true\n"
    );
    assert!(p.ok(&["validate", "acct"]).contains("ok"));
    pg(&server, &format!("INSERT INTO {table} VALUES (1, 'back');"));
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, plan FROM acct_now ORDER BY id"),
        "id,plan\n1,back\n3,team\n"
    );

    // The explicit form without a truncate rule is told what arrived and what to add.
    let q = Project::new(&format!(
        "{}CREATE STREAMING TABLE plain_changes AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', mode => 'cdc', slot => '{slot}_b', publication => '{slot}');
CREATE STREAMING TABLE plain;
CREATE FLOW plain_flow AS AUTO CDC INTO plain FROM STREAM(plain_changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, _commit_timestamp, _unchanged_cols);
",
        server.connection("postgresql")
    ));
    run_ok(&q, &server.password);
    pg(&server, &format!("TRUNCATE {table};"));
    let out = run(&q, &server.password);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("truncate")
            && err.contains("APPLY AS TRUNCATE WHEN _change_type = 'truncate'"),
        "{err}"
    );
    for s in [slot.clone(), format!("{slot}_b")] {
        drop_slot(&server, &s);
    }
}

/// `ALTER TABLE ... ADD COLUMN` on a replicated table: the change table gains the column
/// after its own (NULL in the rows before; no data file rewritten), and SCD1 and SCD2
/// targets with `COLUMNS * EXCEPT (...)` gain it too. Changes before and after the ALTER
/// in one run, committed in parts of one transaction, land without and with it; a column
/// added between runs reaches the tables with the next change, and a run with nothing new
/// commits nothing.
#[test]
fn a_column_added_to_a_replicated_table_reaches_the_change_table_and_its_targets() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("grow");
    let slot = unique("strata_slot");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, name text);
             INSERT INTO {table} VALUES (1, 'Ann'), (2, 'Bob');"
        ),
    );
    let columns = "COLUMNS * EXCEPT (_change_type, _commit_lsn, _change_seq, _commit_timestamp, \
                   _unchanged_cols)";
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE grow_changes AS SELECT * FROM STREAM read_database('shop', \
         table => 'public.{table}', mode => 'cdc', slot => '{slot}', publication => '{slot}', \
         chunk_rows => '1');
CREATE STREAMING TABLE grow_now;
CREATE FLOW grow_now_flow AS AUTO CDC INTO grow_now FROM STREAM(grow_changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
{columns};
CREATE STREAMING TABLE grow_history;
CREATE FLOW grow_history_flow AS AUTO CDC INTO grow_history FROM STREAM(grow_changes) KEYS (id)
APPLY AS DELETE WHEN _change_type = 'delete'
SEQUENCE BY STRUCT(_commit_lsn, _change_seq)
{columns}
STORED AS SCD TYPE 2;
",
        server.connection("postgresql")
    ));
    run_ok(&p, &server.password);
    let dir = p.path("warehouse/default/grow_changes");
    let before = commits(&dir);
    // One run's changes, each its own transaction: an update before the ALTER, then
    // changes that fill the column.
    for transaction in [
        format!("UPDATE {table} SET name = 'Anna' WHERE id = 1"),
        format!("ALTER TABLE {table} ADD COLUMN city text"),
        format!("UPDATE {table} SET city = 'Oslo' WHERE id = 1"),
        format!("INSERT INTO {table} VALUES (3, 'Cy', 'Nice')"),
        format!("DELETE FROM {table} WHERE id = 2"),
    ] {
        pg(&server, &transaction);
    }
    run_ok(&p, &server.password);
    assert_eq!(
        commits(&dir),
        before + 4,
        "one commit per transaction with changes"
    );
    assert_eq!(
        p.csv(
            "SELECT id, name, city, _change_type FROM grow_changes \
             ORDER BY _commit_lsn, _change_seq, id"
        ),
        "id,name,city,_change_type\n1,Ann,,snapshot\n2,Bob,,snapshot\n1,Anna,,update\n\
         1,Anna,Oslo,update\n3,Cy,Nice,insert\n2,,,delete\n"
    );
    assert_eq!(
        p.csv(
            "SELECT column_name FROM information_schema.columns \
             WHERE table_name = 'grow_changes' ORDER BY ordinal_position"
        ),
        "column_name\nid\nname\n_change_type\n_commit_lsn\n_change_seq\n_commit_timestamp\n\
         _unchanged_cols\ncity\n"
    );
    assert_eq!(
        p.csv("SELECT id, name, city FROM grow_now ORDER BY id"),
        "id,name,city\n1,Anna,Oslo\n3,Cy,Nice\n"
    );
    assert_eq!(
        p.csv(
            "SELECT id, name, city, __END_AT IS NULL AS open FROM grow_history \
             ORDER BY id, __START_AT"
        ),
        "id,name,city,open\n1,Ann,,false\n1,Anna,,false\n1,Anna,Oslo,true\n2,Bob,,false\n\
         3,Cy,Nice,true\n"
    );
    let removed = commit_log(&dir)
        .iter()
        .flatten()
        .filter(|a| a.get("remove").is_some())
        .count();
    assert_eq!(removed, 0, "no data file of the change table was rewritten");
    // A column added between runs: nothing to commit until a change comes, which carries it.
    pg(
        &server,
        &format!("ALTER TABLE {table} ADD COLUMN score int;"),
    );
    let before = commits(&dir);
    run_ok(&p, &server.password);
    assert_eq!(commits(&dir), before, "no change, no commit");
    pg(
        &server,
        &format!("UPDATE {table} SET score = 9 WHERE id = 3;"),
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, name, city, score FROM grow_now ORDER BY id"),
        "id,name,city,score\n1,Anna,Oslo,\n3,Cy,Nice,9\n"
    );
    assert_eq!(
        p.csv(
            "SELECT id, city, score, __END_AT IS NULL AS open FROM grow_history \
             WHERE id = 3 ORDER BY __START_AT"
        ),
        "id,city,score,open\n3,Nice,,false\n3,Nice,9,true\n"
    );
    assert!(p.ok(&["validate", "grow_history"]).contains("ok"));
    drop_slot(&server, &slot);
}

/// A replicated table that lost a column and had another retyped: the run fails (exit
/// code 2, nothing written) naming each column and what happened to it, and the command
/// that reads the source again, which then brings the tables in step.
#[test]
fn a_dropped_or_retyped_source_column_names_the_column_and_the_full_refresh_command() {
    let server = Server::from_env("STRATA_TEST_PG");
    let table = unique("shrink");
    let slot = unique("strata_slot");
    pg(
        &server,
        &format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, name text, city text, n int);
             INSERT INTO {table} VALUES (1, 'Ann', 'Oslo', 1);"
        ),
    );
    let p = cdc_history(&server, "shrink", &table, &slot, "");
    run_ok(&p, &server.password);
    pg(
        &server,
        &format!(
            "ALTER TABLE {table} DROP COLUMN city;
             ALTER TABLE {table} ALTER COLUMN n TYPE bigint;
             UPDATE {table} SET name = 'Anna' WHERE id = 1;"
        ),
    );
    let dir = p.path("warehouse/default/shrink_changes");
    let before = commits(&dir);
    let out = run(&p, &server.password);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "column `city` (STRING) is no longer produced: the source dropped or renamed it"
        ) && err.contains("column `n` is now BIGINT but the table has it as INT"),
        "{err}"
    );
    assert!(
        err.contains("`strata run pipeline.sql --full-refresh default.shrink_changes`")
            || err.contains("`strata run pipeline.sql --full-refresh shrink_changes`"),
        "{err}"
    );
    assert_eq!(commits(&dir), before, "nothing written");
    full_refresh_ok(&p, &server.password, "shrink_changes");
    assert_eq!(
        p.csv("SELECT id, name, n FROM shrink WHERE __END_AT IS NULL"),
        "id,name,n\n1,Anna,1\n"
    );
    drop_slot(&server, &slot);
}

/// MySQL / MariaDB CDC from the binlog, in the one-switch form: the first run copies the
/// table in a consistent snapshot and records its binlog position; a run after changes in
/// several transactions (updates, a delete, a key change, a transaction of two statements)
/// gives the exact SCD2 history; a run with nothing new commits nothing; a TRUNCATE closes
/// every open version, and the rows after it open new ones.
#[test]
fn mysql_binlog_cdc_copies_the_table_then_gives_the_exact_scd2_history() {
    let server = Server::from_env("STRATA_TEST_MYSQL");
    let table = unique("crm");
    mysql(
        &server,
        &[
            &format!(
                "CREATE TABLE {table} (id int PRIMARY KEY, name varchar(20), city varchar(20), \
                 score decimal(6,2), seen datetime(3))"
            ),
            &format!(
                "INSERT INTO {table} VALUES (1, 'Ann', 'Oslo', 1.50, '2024-01-01 10:00:00'), \
                 (2, 'Bob', 'Rome', NULL, NULL)"
            ),
        ],
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE cust;
CREATE FLOW cust_flow AS AUTO CDC INTO cust FROM STREAM read_database('shop',
  table => '{table}', mode => 'cdc')
KEYS (id) STORED AS SCD TYPE 2;
",
        server.connection("mysql")
    ));
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, name, city, score, _change_type FROM cust_changes ORDER BY id"),
        "id,name,city,score,_change_type\n1,Ann,Oslo,1.50,snapshot\n2,Bob,Rome,,snapshot\n"
    );
    let dir = p.path("warehouse/default/cust_changes");
    let recorded = positions(&dir, "strata.lsn");
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let file_number = recorded[0].0.split('/').next().unwrap().to_string();
    assert!(
        file_number != "0",
        "a binlog position (file number / offset): {recorded:?}"
    );

    mysql(
        &server,
        &[
            &format!(
                "START TRANSACTION; UPDATE {table} SET city = 'Bergen' WHERE id = 1; \
                 DELETE FROM {table} WHERE id = 2; INSERT INTO {table} VALUES (3, 'Cy', 'Nice', 2.25, NULL); COMMIT"
            ),
            &format!("UPDATE {table} SET city = 'Lyon' WHERE id = 3"),
            &format!("UPDATE {table} SET id = 4 WHERE id = 3"),
        ],
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv(
            "SELECT id, _change_type, _change_seq FROM cust_changes WHERE _change_type <> 'snapshot' \
             ORDER BY _commit_lsn, _change_seq"
        ),
        "id,_change_type,_change_seq\n1,update,0\n2,delete,1\n3,insert,2\n3,update,0\n3,delete,0\n4,update,1\n"
    );
    assert_eq!(
        p.csv("SELECT id, name, city, __END_AT IS NULL AS open FROM cust ORDER BY id, __START_AT"),
        "id,name,city,open\n1,Ann,Oslo,false\n1,Ann,Bergen,true\n2,Bob,Rome,false\n\
         3,Cy,Nice,false\n3,Cy,Lyon,false\n4,Cy,Lyon,true\n"
    );
    assert!(p.ok(&["validate", "cust"]).contains("ok"));

    // Nothing new: nothing committed, in either table.
    let target = p.path("warehouse/default/cust");
    let before = (commits(&dir), commits(&target));
    run_ok(&p, &server.password);
    assert_eq!((commits(&dir), commits(&target)), before);

    // A TRUNCATE closes every open version at its position.
    mysql(
        &server,
        &[
            &format!("TRUNCATE TABLE {table}"),
            &format!("INSERT INTO {table} (id, name) VALUES (5, 'Di')"),
        ],
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv("SELECT id, name FROM cust WHERE __END_AT IS NULL ORDER BY id"),
        "id,name\n5,Di\n"
    );
}

/// Columns added to a table read from the binlog are followed as PostgreSQL's are: the
/// change table gains them after its own (NULL in the rows before; no data file rewritten)
/// and so does the one-switch SCD2 target. Changes before and after two ALTERs (`AFTER`,
/// `ADD (a, b)`) in one run, committed in parts of one transaction, land without and with
/// the columns; a column added between runs (`FIRST`) reaches the tables with the next
/// change, and a run with nothing new commits nothing.
#[test]
fn mysql_binlog_cdc_follows_added_columns_into_the_change_table_and_the_scd2_target() {
    let server = Server::from_env("STRATA_TEST_MYSQL");
    let table = unique("crm_grow");
    mysql(
        &server,
        &[
            &format!("CREATE TABLE {table} (id int PRIMARY KEY, name varchar(20))"),
            &format!("INSERT INTO {table} VALUES (1, 'Ann'), (2, 'Bob')"),
        ],
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE acct;
CREATE FLOW acct_flow AS AUTO CDC INTO acct FROM STREAM read_database('shop',
  table => '{table}', mode => 'cdc', chunk_rows => '1')
KEYS (id) STORED AS SCD TYPE 2;
",
        server.connection("mysql")
    ));
    run_ok(&p, &server.password);
    let dir = p.path("warehouse/default/acct_changes");
    let before = commits(&dir);
    // One run's changes, each statement its own transaction.
    mysql(
        &server,
        &[
            &format!("UPDATE {table} SET name = 'Anna' WHERE id = 1"),
            &format!("ALTER TABLE {table} ADD COLUMN city varchar(20) AFTER id"),
            &format!("UPDATE {table} SET city = 'Oslo' WHERE id = 1"),
            &format!("INSERT INTO {table} VALUES (3, 'Nice', 'Cy')"),
            &format!("ALTER TABLE {table} ADD (score int, tier varchar(5) DEFAULT 'std')"),
            &format!("UPDATE {table} SET score = 7 WHERE id = 3"),
            &format!("DELETE FROM {table} WHERE id = 2"),
        ],
    );
    run_ok(&p, &server.password);
    assert_eq!(
        commits(&dir),
        before + 5,
        "one commit per transaction with changes"
    );
    assert_eq!(
        p.csv(
            "SELECT id, name, city, score, tier, _change_type FROM acct_changes \
             ORDER BY _commit_lsn, _change_seq, id"
        ),
        "id,name,city,score,tier,_change_type\n1,Ann,,,,snapshot\n2,Bob,,,,snapshot\n\
         1,Anna,,,,update\n1,Anna,Oslo,,,update\n3,Cy,Nice,,,insert\n3,Cy,Nice,7,std,update\n\
         2,Bob,,,std,delete\n"
    );
    assert_eq!(
        p.csv(
            "SELECT column_name FROM information_schema.columns \
             WHERE table_name = 'acct_changes' ORDER BY ordinal_position"
        ),
        "column_name\nid\nname\n_change_type\n_commit_lsn\n_change_seq\n_commit_timestamp\n\
         _unchanged_cols\ncity\nscore\ntier\n"
    );
    assert_eq!(
        p.csv(
            "SELECT id, name, city, score, tier, __END_AT IS NULL AS open FROM acct \
             ORDER BY id, __START_AT"
        ),
        "id,name,city,score,tier,open\n1,Ann,,,,false\n1,Anna,,,,false\n1,Anna,Oslo,,,true\n\
         2,Bob,,,,false\n3,Cy,Nice,,,false\n3,Cy,Nice,7,std,true\n"
    );
    let removed = commit_log(&dir)
        .iter()
        .flatten()
        .filter(|a| a.get("remove").is_some())
        .count();
    assert_eq!(removed, 0, "no data file of the change table was rewritten");
    // A column added between runs: nothing to commit until a change comes, which carries it.
    mysql(
        &server,
        &[&format!("ALTER TABLE {table} ADD COLUMN seats int FIRST")],
    );
    let before = commits(&dir);
    run_ok(&p, &server.password);
    assert_eq!(commits(&dir), before, "no change, no commit");
    mysql(
        &server,
        &[&format!("UPDATE {table} SET seats = 5 WHERE id = 3")],
    );
    run_ok(&p, &server.password);
    assert_eq!(
        p.csv(
            "SELECT id, city, score, seats, __END_AT IS NULL AS open FROM acct \
             WHERE id = 3 ORDER BY __START_AT"
        ),
        "id,city,score,seats,open\n3,Nice,,,false\n3,Nice,7,,false\n3,Nice,7,5,true\n"
    );
    assert!(p.ok(&["validate", "acct"]).contains("ok"));
}

/// A column dropped from a table read from the binlog stops the run before it reads
/// anything (exit code 2), naming the column, what happened to it and the exact
/// full-refresh command; nothing is written, and the full refresh takes a new snapshot
/// without the column. (A column dropped and added again between runs looks unchanged to
/// that check; the binlog's DROP stops the read then: tests/mysql_cdc.rs.)
#[test]
fn a_dropped_column_in_the_binlog_names_the_column_and_the_full_refresh_command() {
    let server = Server::from_env("STRATA_TEST_MYSQL");
    let table = unique("crm_ddl");
    mysql(
        &server,
        &[
            &format!("CREATE TABLE {table} (id int PRIMARY KEY, plan varchar(10), seats int)"),
            &format!("INSERT INTO {table} VALUES (1, 'free', 1)"),
        ],
    );
    let p = Project::new(&format!(
        "{}CREATE STREAMING TABLE acct;
CREATE FLOW acct_flow AS AUTO CDC INTO acct FROM STREAM read_database('shop',
  table => '{table}', mode => 'cdc')
KEYS (id) STORED AS SCD TYPE 1;
",
        server.connection("mysql")
    ));
    run_ok(&p, &server.password);
    mysql(
        &server,
        &[
            &format!("UPDATE {table} SET seats = 2 WHERE id = 1"),
            &format!("ALTER TABLE {table} DROP COLUMN seats"),
            &format!("INSERT INTO {table} VALUES (2, 'pro')"),
        ],
    );
    let dir = p.path("warehouse/default/acct_changes");
    let before = commits(&dir);
    let out = run(&p, &server.password);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("acct_changes")
            && err.contains("column `seats` (INT) is no longer produced: the source dropped"),
        "{err}"
    );
    assert!(
        err.contains("`strata run pipeline.sql --full-refresh acct_changes`")
            || err.contains("`strata run pipeline.sql --full-refresh default.acct_changes`"),
        "{err}"
    );
    assert_eq!(commits(&dir), before, "nothing written");
    full_refresh_ok(&p, &server.password, "acct_changes,acct");
    assert_eq!(
        p.csv("SELECT id, plan FROM acct ORDER BY id"),
        "id,plan\n1,free\n2,pro\n"
    );
}

/// The rows of PostgreSQL table `table` as strata's CSV prints them (header, then one line
/// per row in `order`; NULL as an empty field).
fn pg_csv(server: &Server, table: &str, columns: &[&str], order: &str) -> String {
    let fields = columns
        .iter()
        .map(|c| format!("coalesce({c}::text, '')"))
        .collect::<Vec<_>>()
        .join(" || ',' || ");
    let rows = pg_value(
        server,
        &format!("SELECT string_agg({fields}, E'\\n' ORDER BY {order}) FROM {table}"),
    )
    .unwrap_or_default();
    let header: Vec<&str> = columns.iter().map(|c| c.trim_matches('"')).collect();
    format!("{}\n{rows}\n", header.join(","))
}

/// PostgreSQL sinks: an append flow, an SCD1 and an SCD2 AUTO CDC flow each write a
/// PostgreSQL table through the declared connection (an existing table gains the columns it
/// lacks), which receives every outbox version once: after a delivery that failed (the password wrong) the next run sends what the
/// outbox holds, deletes and late events replace their keys' rows, and runs with nothing
/// new send nothing. Each table then equals the sink's outbox.
#[test]
fn postgres_sinks_receive_appends_and_auto_cdc_changes_exactly_once() {
    let server = Server::from_env("STRATA_TEST_PG");
    let (log, cur, hist) = (unique("sink_log"), unique("sink_cur"), unique("sink_hist"));
    let p = Project::new(&format!(
        "{}CREATE OR REFRESH STREAMING TABLE changes AS SELECT * FROM STREAM \
         read_files('data/changes', format => 'json', schema => 'id INT, name STRING, op STRING, seq BIGINT');
CREATE SINK log_pg OPTIONS (format 'postgresql', connection 'shop', table 'public.{log}');
CREATE FLOW log_flow AS INSERT INTO log_pg BY NAME SELECT id, name, op, seq FROM STREAM(changes);
CREATE SINK cur_pg OPTIONS (format 'postgresql', connection 'shop', table 'public.{cur}');
CREATE FLOW cur_flow AS AUTO CDC INTO cur_pg FROM STREAM(changes) KEYS (id)
  APPLY AS DELETE WHEN op = 'delete' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq);
CREATE SINK hist_pg OPTIONS (format 'postgresql', connection 'shop', table 'public.{hist}');
CREATE FLOW hist_flow AS AUTO CDC INTO hist_pg FROM STREAM(changes) KEYS (id)
  APPLY AS DELETE WHEN op = 'delete' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2;
",
        server.connection("postgresql")
    ));
    let equal_outboxes = |p: &Project| {
        assert_eq!(
            pg_csv(&server, &log, &["id", "name", "op", "seq"], "seq, id"),
            p.csv("SELECT id, name, op, seq FROM log_pg ORDER BY seq, id")
        );
        assert_eq!(
            pg_csv(&server, &cur, &["id", "name"], "id"),
            p.csv("SELECT id, name FROM cur_pg ORDER BY id")
        );
        assert_eq!(
            pg_csv(
                &server,
                &hist,
                &["id", "name", "\"__START_AT\"", "\"__END_AT\""],
                "id, \"__START_AT\""
            ),
            p.csv("SELECT id, name, __START_AT, __END_AT FROM hist_pg ORDER BY id, __START_AT")
        );
    };
    // The append sink's table exists with two of the four columns: the others are added.
    pg(
        &server,
        &format!("CREATE TABLE public.{log} (id integer, name text)"),
    );
    p.file(
        "data/changes/001.json",
        "{\"id\": 1, \"name\": \"Ann\", \"op\": \"upsert\", \"seq\": 1}\n\
         {\"id\": 2, \"name\": \"Bob\", \"op\": \"upsert\", \"seq\": 2}\n\
         {\"id\": 3, \"name\": \"Cy\\ttab\", \"op\": \"upsert\", \"seq\": 3}\n",
    );
    // The outboxes commit, the deliveries fail: nothing reaches PostgreSQL, the run fails
    // naming the sink, and the password appears nowhere.
    let out = run(&p, "not-the-password");
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("sink") && !err.contains("not-the-password"),
        "{err}"
    );
    assert_eq!(p.csv("SELECT count(*) AS n FROM log_pg"), "n\n3\n");
    // The next run sends what the outboxes hold.
    let said = run_ok(&p, &server.password);
    assert!(
        said.contains(&format!("3 row(s) sent to postgresql table public.{log}")),
        "{said}"
    );
    assert!(said.contains("added column(s) op, seq to it"), "{said}");
    equal_outboxes(&p);
    assert_eq!(
        pg_csv(&server, &cur, &["id", "name"], "id"),
        "id,name\n1,Ann\n2,Bob\n3,Cy\ttab\n"
    );
    // Updates, a delete and a late event (seq 0 for key 1 comes before its first version).
    p.file(
        "data/changes/002.json",
        "{\"id\": 1, \"name\": \"Anne\", \"op\": \"upsert\", \"seq\": 4}\n\
         {\"id\": 2, \"name\": null, \"op\": \"delete\", \"seq\": 5}\n\
         {\"id\": 4, \"name\": \"Dee\", \"op\": \"upsert\", \"seq\": 6}\n\
         {\"id\": 1, \"name\": \"A.\", \"op\": \"upsert\", \"seq\": 0}\n",
    );
    run_ok(&p, &server.password);
    equal_outboxes(&p);
    assert_eq!(
        pg_csv(&server, &cur, &["id", "name"], "id"),
        "id,name\n1,Anne\n3,Cy\ttab\n4,Dee\n"
    );
    assert_eq!(
        pg_csv(&server, &hist, &["id", "name", "\"__START_AT\"", "\"__END_AT\""], "id, \"__START_AT\""),
        "id,name,__START_AT,__END_AT\n1,A.,0,1\n1,Ann,1,4\n1,Anne,4,\n2,Bob,2,5\n3,Cy\ttab,3,\n4,Dee,6,\n"
    );
    // Nothing new: nothing sent, the positions unchanged.
    let positions = pg_value(
        &server,
        &format!("SELECT string_agg(sink || '=' || version, ',' ORDER BY sink) FROM strata_sink_positions WHERE sink LIKE 'public.sink_%' AND sink IN ('public.{log}', 'public.{cur}', 'public.{hist}')"),
    );
    let said = run_ok(&p, &server.password);
    assert!(
        said.contains(&format!("postgresql table public.{cur} is up to date")),
        "{said}"
    );
    assert_eq!(
        pg_value(
            &server,
            &format!("SELECT string_agg(sink || '=' || version, ',' ORDER BY sink) FROM strata_sink_positions WHERE sink LIKE 'public.sink_%' AND sink IN ('public.{log}', 'public.{cur}', 'public.{hist}')"),
        ),
        positions
    );
    equal_outboxes(&p);
    // A full refresh reaching a sink stops, naming its table, and sends nothing.
    let out = p.strata(&["run", "pipeline.sql", "--full-refresh"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("postgresql table public."), "{err}");
    equal_outboxes(&p);
}

#[test]
fn a_sink_naming_a_missing_or_mysql_connection_is_refused_before_anything_runs() {
    let p = Project::new(
        "CREATE CONNECTION m TYPE mysql OPTIONS (host 'localhost', database 'd', user 'u');
CREATE OR REFRESH STREAMING TABLE t AS SELECT * FROM STREAM read_files('data/t', format => 'json', schema => 'id INT');
CREATE SINK s OPTIONS (format 'postgresql', connection 'm', table 'public.t');
CREATE FLOW f AS INSERT INTO s BY NAME SELECT id FROM STREAM(t);
",
    );
    let out = p.run();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("a mysql connection; a database sink writes PostgreSQL tables"),
        "{err}"
    );
    p.file(
        "pipeline.sql",
        "CREATE OR REFRESH STREAMING TABLE t AS SELECT * FROM STREAM read_files('data/t', format => 'json', schema => 'id INT');
CREATE SINK s OPTIONS (format 'postgresql', table 'public.t');
",
    );
    let err = stderr(&p.run());
    assert!(err.contains("takes the options connection"), "{err}");
    assert!(!p.path("warehouse").join("default/t").exists());
}
