//! MySQL / MariaDB log-based CDC from the binlog against a real server (run under
//! scripts/services/with-services.sh, whose MariaDB logs row events with full images).

mod common;

use arrow_array::RecordBatch;
use common::*;
use mysql_async::prelude::Queryable;
use strata_sources::*;

struct Fixture {
    spec: ConnectionSpec,
    admin: mysql_async::Conn,
    database: String,
}

async fn fixture(name: &str) -> Option<Fixture> {
    let spec = mysql_spec(name)?;
    let database = spec.database.clone();
    Some(Fixture {
        spec,
        admin: mysql_admin().await,
        database,
    })
}

impl Fixture {
    async fn cdc(&self, table: &str) -> BinlogCdc {
        let cfg = CdcConfig::new(
            unique("slot"),
            "unused",
            vec![TableRef::new(self.database.clone(), table)],
        );
        BinlogCdc::connect(&self.spec, cfg)
            .await
            .expect("connect binlog cdc")
    }

    /// Each statement in its own transaction (autocommit).
    async fn each(&mut self, statements: &[String]) {
        for st in statements {
            self.admin
                .query_drop(st)
                .await
                .unwrap_or_else(|e| panic!("{st}: {e:?}"));
        }
    }
}

async fn snapshot(cdc: &BinlogCdc) -> (Lsn, Vec<RecordBatch>) {
    let mut s = cdc
        .start_snapshot(&strata_sources::CopyPosition::start(), true)
        .await
        .expect("snapshot");
    let cp = s.consistent_point();
    let mut out = Vec::new();
    while let Some(tb) = s.next_batch().await.expect("snapshot batch") {
        out.push(tb.batch);
    }
    (cp, out)
}

async fn read_changes(
    cdc: &BinlogCdc,
    after: Lsn,
    options: ReadOptions,
) -> (ChangeSummary, Vec<TableBatch>) {
    let mut r = cdc
        .read_changes(after, options)
        .await
        .expect("read changes");
    let mut out = Vec::new();
    while let Some(tb) = r.next_batch().await.expect("change batch") {
        out.push(tb);
    }
    (r.summary().expect("summary").clone(), out)
}

fn batches(v: &[TableBatch]) -> Vec<RecordBatch> {
    v.iter().map(|b| b.batch.clone()).collect()
}

const ALL_TYPES: &str = "(id INT PRIMARY KEY, big BIGINT, amount DECIMAL(12,2), name VARCHAR(40), \
    note TEXT, day DATE, at DATETIME(6), stamp TIMESTAMP(3) NULL, x DOUBLE, flag BOOL, \
    small TINYINT UNSIGNED, status ENUM('new','done'))";

const COLUMNS: [&str; 12] = [
    "id", "big", "amount", "name", "note", "day", "at", "stamp", "x", "flag", "small", "status",
];

#[tokio::test]
async fn snapshot_then_every_kind_of_change_with_every_common_type() {
    let Some(mut f) = fixture("my_cdc").await else {
        return;
    };
    let t = unique("bl_types");
    f.each(&[
        format!("CREATE TABLE {t} {ALL_TYPES}"),
        format!(
            "INSERT INTO {t} VALUES (1, 9007199254740993, 12.50, 'a', 'long text', '2024-02-29', \
             '2024-01-01 10:00:00.123456', '2024-01-01 10:00:00.500', 0.18980066596326006, TRUE, 200, 'new'), \
             (2, -5, -0.01, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
        ),
    ])
    .await;
    let cdc = f.cdc(&t).await;
    let (cp, snap) = snapshot(&cdc).await;
    let snap_rows = rows(&snap, &COLUMNS);
    assert_eq!(
        snap_rows,
        vec![
            vec![
                "1",
                "9007199254740993",
                "1250e-2",
                "a",
                "long text",
                "19782",
                "1704103200123456",
                "1704103200500000",
                "0.18980066596326006",
                "1",
                "200",
                "new"
            ],
            vec![
                "2", "-5", "-1e-2", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "NULL",
                "NULL"
            ],
        ]
    );
    let meta = rows(&snap, &["_change_type", "_commit_lsn", "_change_seq"]);
    for m in &meta {
        assert_eq!(m, &vec![s("snapshot"), cp.to_i64().to_string(), s("0")]);
    }

    // Changes in several transactions: an insert with every type, an update, a key change,
    // a delete, and one transaction of two statements.
    f.each(&[
        format!(
            "INSERT INTO {t} VALUES (3, 1, 0.05, 'ü€', 'x', '1999-12-31', '2000-01-01 00:00:00', \
             '2038-01-19 03:14:07.999', -2.5, FALSE, 255, 'done')"
        ),
        format!("UPDATE {t} SET name = 'b', small = 7 WHERE id = 2"),
        format!("UPDATE {t} SET id = 10 WHERE id = 1"),
        format!("DELETE FROM {t} WHERE id = 3"),
        format!("START TRANSACTION; INSERT INTO {t} (id, name) VALUES (4, 'd'); UPDATE {t} SET name = 'e' WHERE id = 4; COMMIT"),
    ])
    .await;
    let (summary, got) = read_changes(&cdc, cp, ReadOptions::default()).await;
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.transactions, 5);
    assert_eq!(summary.rows, 7, "a key change is a delete and an update");
    let b = batches(&got);
    let changes = rows(
        &b,
        &[
            "_change_type",
            "id",
            "name",
            "small",
            "stamp",
            "x",
            "status",
        ],
    );
    assert_eq!(
        changes,
        vec![
            vec![
                "insert",
                "3",
                "ü€",
                "255",
                "2147483647999000",
                "-2.5",
                "done"
            ],
            vec!["update", "2", "b", "7", "NULL", "NULL", "NULL"],
            vec![
                "delete",
                "1",
                "a",
                "200",
                "1704103200500000",
                "0.18980066596326006",
                "new"
            ],
            vec![
                "update",
                "10",
                "a",
                "200",
                "1704103200500000",
                "0.18980066596326006",
                "new"
            ],
            vec![
                "delete",
                "3",
                "ü€",
                "255",
                "2147483647999000",
                "-2.5",
                "done"
            ],
            vec!["insert", "4", "d", "NULL", "NULL", "NULL", "NULL"],
            vec!["update", "4", "e", "NULL", "NULL", "NULL", "NULL"],
        ]
    );
    // Every column of the inserted row, as the snapshot reads the same values.
    assert_eq!(
        rows(&b[..1], &COLUMNS)[0],
        vec![
            "3",
            "1",
            "5e-2",
            "ü€",
            "x",
            "10956",
            "946684800000000",
            "2147483647999000",
            "-2.5",
            "0",
            "255",
            "done"
        ]
    );
    // Positions: after the snapshot, one per transaction, increasing; the sequence numbers
    // count inside a transaction; the key change's update follows its delete.
    let meta: Vec<(i64, i64)> = rows(&b, &["_commit_lsn", "_change_seq"])
        .iter()
        .map(|r| (r[0].parse().unwrap(), r[1].parse().unwrap()))
        .collect();
    let lsns: Vec<i64> = meta.iter().map(|m| m.0).collect();
    assert!(lsns[0] > cp.to_i64());
    assert!(lsns.windows(2).all(|w| w[0] <= w[1]), "{lsns:?}");
    assert_eq!(lsns[2], lsns[3], "the key change is one transaction");
    assert_eq!(lsns[5], lsns[6]);
    assert_eq!(
        meta.iter().map(|m| m.1).collect::<Vec<_>>(),
        vec![0, 0, 0, 1, 0, 0, 1]
    );
    let key_changes: Vec<(i64, i64)> = got.iter().flat_map(|tb| tb.key_changes.clone()).collect();
    assert_eq!(key_changes, vec![(lsns[3], 1)]);
    assert!(summary.resume_lsn.to_i64() >= lsns[6]);

    // From the resume position: nothing again.
    let (again, got) = read_changes(&cdc, summary.resume_lsn, ReadOptions::default()).await;
    assert!(again.complete);
    assert_eq!((again.rows, got.len()), (0, 0));
    assert!(again.resume_lsn >= summary.resume_lsn);
}

fn s(v: &str) -> String {
    v.to_string()
}

#[tokio::test]
async fn a_change_made_while_the_snapshot_is_read_comes_once_after_it() {
    let Some(mut f) = fixture("my_cdc").await else {
        return;
    };
    let t = unique("bl_seam");
    f.each(&[
        format!("CREATE TABLE {t} (id INT PRIMARY KEY, v INT)"),
        format!("INSERT INTO {t} VALUES (1, 1), (2, 2)"),
    ])
    .await;
    let cdc = f.cdc(&t).await;
    let mut snap = cdc
        .start_snapshot(&strata_sources::CopyPosition::start(), true)
        .await
        .expect("snapshot");
    // After the snapshot's transaction began, before its rows are read.
    f.each(&[
        format!("INSERT INTO {t} VALUES (3, 3)"),
        format!("UPDATE {t} SET v = 20 WHERE id = 2"),
    ])
    .await;
    let mut snap_batches = Vec::new();
    while let Some(tb) = snap.next_batch().await.unwrap() {
        snap_batches.push(tb.batch);
    }
    assert_eq!(
        rows(&snap_batches, &["id", "v"]),
        vec![vec!["1", "1"], vec!["2", "2"]]
    );
    let (summary, got) = read_changes(&cdc, snap.consistent_point(), ReadOptions::default()).await;
    assert_eq!(
        rows(&batches(&got), &["_change_type", "id", "v"]),
        vec![vec!["insert", "3", "3"], vec!["update", "2", "20"]]
    );
    assert_eq!(summary.rows, 2);
}

#[tokio::test]
async fn a_read_in_parts_ends_each_at_a_transaction_end() {
    let Some(mut f) = fixture("my_cdc").await else {
        return;
    };
    let t = unique("bl_parts");
    f.each(&[format!("CREATE TABLE {t} (id INT PRIMARY KEY)")])
        .await;
    let cdc = f.cdc(&t).await;
    let (cp, _) = snapshot(&cdc).await;
    f.each(&[
        format!("INSERT INTO {t} VALUES (1), (2), (3)"),
        format!("INSERT INTO {t} VALUES (4)"),
        format!("INSERT INTO {t} VALUES (5), (6)"),
    ])
    .await;
    let options = ReadOptions {
        part_changes: Some(2),
        ..ReadOptions::default()
    };
    let mut r = cdc.read_changes(cp, options).await.unwrap();
    let mut parts = Vec::new();
    loop {
        let mut ids = Vec::new();
        while let Some(tb) = r.next_batch().await.unwrap() {
            ids.extend(rows(&[tb.batch], &["id"]).into_iter().map(|r| r[0].clone()));
        }
        match r.part_end() {
            Some(end) => {
                parts.push((ids, Some(end)));
                r.next_part();
            }
            None => {
                parts.push((ids, None));
                break;
            }
        }
    }
    // Three rows fill the first part (it ends with its transaction), then 4 alone does not,
    // 5 and 6 fill the second; the read ends with nothing more.
    let ids: Vec<Vec<String>> = parts.iter().map(|p| p.0.clone()).collect();
    assert_eq!(ids, vec![vec!["1", "2", "3"], vec!["4", "5", "6"], vec![]]);
    let ends: Vec<Lsn> = parts.iter().filter_map(|p| p.1).collect();
    assert_eq!(ends.len(), 2);
    assert!(ends[0] < ends[1]);
    // Resuming after the first part gives the rest.
    let (_, rest) = read_changes(&cdc, ends[0], ReadOptions::default()).await;
    assert_eq!(
        rows(&batches(&rest), &["id"]),
        vec![vec!["4"], vec!["5"], vec!["6"]]
    );
}

#[tokio::test]
async fn truncate_is_a_change_and_a_dropped_column_asks_for_a_full_refresh() {
    let Some(mut f) = fixture("my_cdc").await else {
        return;
    };
    let t = unique("bl_ddl");
    f.each(&[
        format!("CREATE TABLE {t} (id INT PRIMARY KEY, v INT, gone INT)"),
        format!("INSERT INTO {t} VALUES (1, 1, 1)"),
    ])
    .await;
    let cdc = f.cdc(&t).await;
    let (cp, _) = snapshot(&cdc).await;
    f.each(&[
        format!("TRUNCATE TABLE {t}"),
        format!("INSERT INTO {t} VALUES (2, 2, 2)"),
    ])
    .await;
    let (summary, got) = read_changes(&cdc, cp, ReadOptions::default()).await;
    assert_eq!(
        rows(&batches(&got), &["_change_type", "id", "v"]),
        vec![vec!["truncate", "NULL", "NULL"], vec!["insert", "2", "2"]]
    );
    f.each(&[
        format!("INSERT INTO {t} VALUES (3, 3, 3)"),
        format!("ALTER TABLE {t} DROP COLUMN gone"),
        format!("INSERT INTO {t} VALUES (4, 4)"),
    ])
    .await;
    let mut r = cdc
        .read_changes(summary.resume_lsn, ReadOptions::default())
        .await
        .unwrap();
    let err = loop {
        match r.next_batch().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the ALTER TABLE was read without an error"),
            Err(e) => break e,
        }
    };
    let text = err.to_string();
    assert!(err.needs_resnapshot(), "{text}");
    assert!(
        text.contains(&format!("strata_test.{t}"))
            && text.contains("column `gone` was dropped")
            && text.contains("DROP COLUMN gone"),
        "{text}"
    );
    assert!(text.contains("full refresh"), "{text}");
    assert!(
        !text.contains("  "),
        "one sentence, no runs of spaces: {text}"
    );
}

/// Columns added in the middle of a read (`ADD COLUMN`, `ADD (a, b)` and `FIRST` / `AFTER`
/// positions): the rows logged before each ALTER have NULL in the columns it added, the rows
/// after carry their values, each under its own name; a read resumed between the ALTERs
/// (after a part, as after a kill) gives the same.
#[tokio::test]
async fn columns_added_during_a_read_are_null_before_and_filled_after() {
    let Some(mut f) = fixture("my_cdc").await else {
        return;
    };
    let t = unique("bl_add");
    f.each(&[
        format!("CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(10))"),
        format!("INSERT INTO {t} VALUES (1, 'one')"),
    ])
    .await;
    let cdc = f.cdc(&t).await;
    let (cp, _) = snapshot(&cdc).await;
    f.each(&[
        format!("INSERT INTO {t} VALUES (2, 'two')"),
        format!("UPDATE {t} SET v = 'uno' WHERE id = 1"),
        format!("ALTER TABLE {t} ADD COLUMN n INT AFTER id"),
        format!("INSERT INTO {t} VALUES (3, 30, 'three')"),
        format!("UPDATE {t} SET n = 10 WHERE id = 1"),
        format!("ALTER TABLE {t} ADD (note TEXT, d INT DEFAULT 7), ADD z INT FIRST"),
        format!("INSERT INTO {t} VALUES (-4, 4, 40, 'four', 'a,b', 9)"),
        format!("DELETE FROM {t} WHERE id = 2"),
    ])
    .await;
    let cols = ["_change_type", "id", "v", "n", "note", "d", "z"];
    let want = vec![
        vec!["insert", "2", "two", "NULL", "NULL", "NULL", "NULL"],
        vec!["update", "1", "uno", "NULL", "NULL", "NULL", "NULL"],
        vec!["insert", "3", "three", "30", "NULL", "NULL", "NULL"],
        vec!["update", "1", "uno", "10", "NULL", "NULL", "NULL"],
        vec!["insert", "4", "four", "40", "a,b", "9", "-4"],
        vec!["delete", "2", "two", "NULL", "NULL", "7", "NULL"],
    ];
    let (summary, got) = read_changes(&cdc, cp, ReadOptions::default()).await;
    assert_eq!(rows(&batches(&got), &cols), want);
    assert!(summary.complete);
    // The change rows have the table's columns in its order now, then the change columns.
    let names: Vec<String> = got[0]
        .batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(&names[..6], &["z", "id", "n", "v", "note", "d"]);

    // In parts of one change: a read resumed at each part's end (a run killed after that
    // part's commit) reads the rest with the columns of its place in the binlog.
    let options = ReadOptions {
        part_changes: Some(1),
        ..ReadOptions::default()
    };
    let mut after = cp;
    let mut resumed = Vec::new();
    while after < summary.resume_lsn {
        let mut r = cdc.read_changes(after, options.clone()).await.unwrap();
        while let Some(tb) = r.next_batch().await.unwrap() {
            resumed.extend(rows(&[tb.batch], &cols));
        }
        after = match r.part_end() {
            Some(end) => end,
            None => r.summary().expect("summary").resume_lsn,
        };
    }
    assert_eq!(resumed, want);
}

#[tokio::test]
async fn a_position_whose_binlog_file_is_gone_asks_for_a_full_refresh() {
    let Some(f) = fixture("my_cdc").await else {
        return;
    };
    let t = unique("bl_gone");
    let mut admin = f.admin;
    admin
        .query_drop(format!("CREATE TABLE {t} (id INT PRIMARY KEY)"))
        .await
        .unwrap();
    let cfg = CdcConfig::new(
        unique("slot"),
        "unused",
        vec![TableRef::new(f.database.clone(), &t)],
    );
    let cdc = BinlogCdc::connect(&f.spec, cfg).await.unwrap();
    // A file number the server never had (files are numbered from 1).
    let gone = Lsn(4);
    let err = cdc
        .read_changes(gone, ReadOptions::default())
        .await
        .expect_err("a position in a missing file");
    assert!(err.needs_resnapshot(), "{err}");
    assert!(
        err.to_string().contains("no longer has the binlog file"),
        "{err}"
    );
}
