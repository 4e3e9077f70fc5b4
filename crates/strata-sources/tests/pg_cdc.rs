//! PostgreSQL log-based CDC against a real server (run under scripts/services/with-services.sh).

mod common;

use std::collections::BTreeMap;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use common::*;
use strata_sources::*;

struct Fixture {
    spec: ConnectionSpec,
    admin: tokio_postgres::Client,
    slot: String,
    publication: String,
    _cleanup: Cleanup,
}

async fn fixture(name: &str) -> Option<Fixture> {
    let spec = pg_spec(name)?;
    let slot = unique("slot");
    let publication = unique("pub");
    Some(Fixture {
        spec,
        admin: pg_admin().await,
        _cleanup: Cleanup {
            slot: slot.clone(),
            publication: publication.clone(),
        },
        slot,
        publication,
    })
}

impl Fixture {
    fn config(&self, tables: &[&str]) -> CdcConfig {
        CdcConfig::new(
            self.slot.clone(),
            self.publication.clone(),
            tables.iter().map(|t| TableRef::new("public", *t)).collect(),
        )
    }

    async fn cdc(&self, tables: &[&str]) -> PgCdc {
        PgCdc::connect(&self.spec, self.config(tables))
            .await
            .expect("connect cdc")
    }

    async fn sql(&self, sql: &str) {
        self.admin
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }

    /// Each statement on its own (a multi-statement simple query is one transaction).
    async fn each(&self, statements: &[String]) {
        for st in statements {
            self.sql(st).await;
        }
    }
}

async fn snapshot(cdc: &PgCdc) -> (Lsn, BTreeMap<String, Vec<RecordBatch>>) {
    let mut s = cdc.start_snapshot(true).await.expect("snapshot");
    let cp = s.consistent_point();
    let mut out: BTreeMap<String, Vec<RecordBatch>> = BTreeMap::new();
    while let Some(tb) = s.next_batch().await.expect("snapshot batch") {
        out.entry(tb.table.name.clone()).or_default().push(tb.batch);
    }
    (cp, out)
}

async fn changes(
    cdc: &PgCdc,
    after: Lsn,
    options: ReadOptions,
) -> (ChangeSummary, BTreeMap<String, Vec<TableBatch>>) {
    let mut r = cdc
        .read_changes(after, options)
        .await
        .expect("read changes");
    let mut out: BTreeMap<String, Vec<TableBatch>> = BTreeMap::new();
    while let Some(tb) = r.next_batch().await.expect("change batch") {
        out.entry(tb.table.name.clone()).or_default().push(tb);
    }
    (r.summary().expect("summary").clone(), out)
}

fn batches(v: &BTreeMap<String, Vec<TableBatch>>, t: &str) -> Vec<RecordBatch> {
    v.get(t)
        .map(|x| x.iter().map(|b| b.batch.clone()).collect())
        .unwrap_or_default()
}

fn s(v: &str) -> String {
    v.to_string()
}

#[tokio::test]
async fn snapshot_then_inserts_updates_deletes() {
    let Some(f) = fixture("pg_cdc").await else {
        return;
    };
    let t = unique("cdc_basic");
    f.sql(&format!(
        "CREATE TABLE {t} (id int PRIMARY KEY, name text, amount numeric(10,2), at timestamptz, u uuid, b bytea);
         INSERT INTO {t} VALUES (1, 'a', 1.50, '2024-01-01 00:00:00+00', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x01'),
                                (2, 'b', 2.00, NULL, NULL, NULL), (3, 'c', -3.25, NULL, NULL, NULL);"
    ))
    .await;
    let cdc = f.cdc(&[&t]).await;
    let (cp, snap) = snapshot(&cdc).await;
    let snap = &snap[&t];
    let snap_rows = rows(
        snap,
        &[
            "id",
            "name",
            "amount",
            "_change_type",
            "_commit_lsn",
            "_change_seq",
            "_unchanged_cols",
        ],
    );
    assert_eq!(snap_rows.len(), 3);
    for r in &snap_rows {
        assert_eq!(r[3], "snapshot");
        assert_eq!(
            r[4],
            cp.to_i64().to_string(),
            "snapshot rows carry the consistent point"
        );
        assert_eq!(r[5], "0");
        assert_eq!(r[6], "NULL");
    }
    assert_eq!(snap_rows[0][..3], [s("1"), s("a"), s("150e-2")]);
    assert!(!snap[0]
        .column_by_name("_commit_timestamp")
        .unwrap()
        .is_null(0));

    f.each(&[
        format!("INSERT INTO {t} VALUES (4, 'd', 4.00, '2024-06-01 12:00:00.5+02', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12', '\\xff00')"),
        format!("UPDATE {t} SET name = 'bb', amount = 20.00 WHERE id = 2"),
        format!("DELETE FROM {t} WHERE id = 3"),
        format!("BEGIN; INSERT INTO {t} (id, name) VALUES (5, 'e'); UPDATE {t} SET name = 'ee' WHERE id = 5; COMMIT;"),
    ])
    .await;
    let (sum, ch) = changes(&cdc, cp, ReadOptions::default()).await;
    let b = batches(&ch, &t);
    let r = rows(
        &b,
        &[
            "id",
            "name",
            "amount",
            "_change_type",
            "_change_seq",
            "_unchanged_cols",
        ],
    );
    assert_eq!(
        r,
        vec![
            vec![s("4"), s("d"), s("400e-2"), s("insert"), s("0"), s("NULL")],
            vec![
                s("2"),
                s("bb"),
                s("2000e-2"),
                s("update"),
                s("0"),
                s("NULL")
            ],
            // A delete carries the key (REPLICA IDENTITY DEFAULT): the rest is NULL.
            vec![s("3"), s("NULL"), s("NULL"), s("delete"), s("0"), s("NULL")],
            vec![s("5"), s("e"), s("NULL"), s("insert"), s("0"), s("NULL")],
            vec![s("5"), s("ee"), s("NULL"), s("update"), s("1"), s("NULL")],
        ]
    );
    // Same types as the snapshot, exact values.
    assert_eq!(b[0].schema().fields()[..6], snap[0].schema().fields()[..6]);
    let at = b[0]
        .column_by_name("at")
        .unwrap()
        .as_primitive::<TimestampMicrosecondType>()
        .value(0);
    assert_eq!(at, 1_717_236_000_500_000);
    assert_eq!(
        b[0].column_by_name("u")
            .unwrap()
            .as_string::<i32>()
            .value(0),
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12"
    );
    assert_eq!(
        b[0].column_by_name("b")
            .unwrap()
            .as_binary::<i32>()
            .value(0),
        &[0xff, 0x00]
    );
    // Commit LSNs increase by transaction; the two changes of one transaction share it.
    let lsn: Vec<i64> = rows(&b, &["_commit_lsn"])
        .iter()
        .map(|r| r[0].parse().unwrap())
        .collect();
    assert!(lsn[0] > cp.to_i64() && lsn[0] < lsn[1] && lsn[1] < lsn[2] && lsn[2] < lsn[3]);
    assert_eq!(lsn[3], lsn[4]);
    assert!(rows(&b, &["_commit_timestamp"])
        .iter()
        .all(|r| r[0] != "NULL"));
    assert_eq!(sum.transactions, 4);
    assert_eq!(sum.rows, 5);
    assert!(sum.complete);
    assert_eq!(sum.resume_lsn, sum.fence_lsn);
    assert!(sum.last_commit_end_lsn.unwrap() <= sum.fence_lsn);

    // The slot did not move by itself.
    let st = cdc.slot_status().await.unwrap().unwrap();
    assert_eq!(st.confirmed_flush_lsn, cp);
    assert!(st.lag_bytes > 0);
    assert!(!st.active);
    // Reading again from the same LSN gives the same changes (a crash before the commit).
    let (sum2, ch2) = changes(&cdc, cp, ReadOptions::default()).await;
    assert_eq!(
        rows(
            &batches(&ch2, &t),
            &["id", "_change_type", "_commit_lsn", "_change_seq"]
        ),
        rows(&b, &["id", "_change_type", "_commit_lsn", "_change_seq"])
    );
    assert_eq!(sum2.transactions, 4);
    // After the commit: advance. Then nothing is left.
    let pos = cdc.advance_slot(sum.resume_lsn).await.unwrap();
    assert_eq!(pos, sum.resume_lsn);
    assert_eq!(
        cdc.slot_status()
            .await
            .unwrap()
            .unwrap()
            .confirmed_flush_lsn,
        sum.resume_lsn
    );
    let (sum3, ch3) = changes(&cdc, sum.resume_lsn, ReadOptions::default()).await;
    assert!(ch3.is_empty());
    assert_eq!(sum3.transactions, 0);
    assert!(sum3.resume_lsn > sum.resume_lsn, "the new fence");
    // Advancing backwards is a no-op, not an error.
    assert_eq!(cdc.advance_slot(cp).await.unwrap(), sum.resume_lsn);
}

#[tokio::test]
async fn unchanged_toast_values_default_and_full_identity() {
    let Some(f) = fixture("pg_toast").await else {
        return;
    };
    let t1 = unique("toast_default");
    let t2 = unique("toast_full");
    // 6400 characters of md5 output: incompressible enough to be stored out of line.
    for t in [&t1, &t2] {
        f.sql(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, big text, n int);
             INSERT INTO {t} SELECT 1, string_agg(md5(i::text), ''), 0 FROM generate_series(1, 200) i;"
        ))
        .await;
    }
    f.sql(&format!("ALTER TABLE {t2} REPLICA IDENTITY FULL"))
        .await;
    let big: String = f
        .admin
        .query_one(&format!("SELECT big FROM {t1}"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(big.len() > 2048);
    let cdc = f.cdc(&[&t1, &t2]).await;
    let (cp, _) = snapshot(&cdc).await;
    for t in [&t1, &t2] {
        f.each(&[
            format!("UPDATE {t} SET n = 1 WHERE id = 1"),
            format!("DELETE FROM {t} WHERE id = 1"),
        ])
        .await;
    }
    let (_, ch) = changes(&cdc, cp, ReadOptions::default()).await;
    // Default identity: the unchanged TOASTed value is not sent: NULL, and named.
    let r1 = rows(
        &batches(&ch, &t1),
        &["id", "n", "_change_type", "_unchanged_cols"],
    );
    assert_eq!(r1[0], vec![s("1"), s("1"), s("update"), s("[big]")]);
    assert_eq!(rows(&batches(&ch, &t1), &["big"])[0][0], "NULL");
    assert_eq!(r1[1], vec![s("1"), s("NULL"), s("delete"), s("NULL")]);
    // REPLICA IDENTITY FULL: the old row has it; strata fills it in.
    let b2 = batches(&ch, &t2);
    let r2 = rows(&b2, &["id", "n", "_change_type", "_unchanged_cols"]);
    assert_eq!(r2[0], vec![s("1"), s("1"), s("update"), s("NULL")]);
    assert_eq!(rows(&b2, &["big"])[0][0], big);
    // ...and a delete carries the whole old row.
    assert_eq!(r2[1], vec![s("1"), s("1"), s("delete"), s("NULL")]);
    assert_eq!(rows(&b2, &["big"])[1][0], big);
}

#[tokio::test]
async fn truncate_and_multi_table_transactions() {
    let Some(f) = fixture("pg_multi").await else {
        return;
    };
    let a = unique("cdc_a");
    let b = unique("cdc_b");
    f.sql(&format!(
        "CREATE TABLE {a} (id int PRIMARY KEY, v text); CREATE TABLE {b} (id bigint PRIMARY KEY, w int);
         INSERT INTO {a} VALUES (1, 'x');"
    ))
    .await;
    let cdc = f.cdc(&[&a, &b]).await;
    let (cp, snap) = snapshot(&cdc).await;
    assert_eq!(snap[&b].len(), 1, "an empty table gives one empty batch");
    assert_eq!(snap[&b][0].num_rows(), 0);
    f.each(&[
        format!(
            "BEGIN; INSERT INTO {a} VALUES (2, 'y'); INSERT INTO {b} VALUES (10, 1); UPDATE {a} SET v = 'yy' WHERE id = 2;
                    INSERT INTO {b} VALUES (11, 2); COMMIT;"
        ),
        format!("TRUNCATE {a}, {b}"),
        format!("INSERT INTO {b} VALUES (12, 3)"),
    ])
    .await;
    let (sum, ch) = changes(&cdc, cp, ReadOptions::default()).await;
    let ra = rows(
        &batches(&ch, &a),
        &["id", "v", "_change_type", "_commit_lsn", "_change_seq"],
    );
    let rb = rows(
        &batches(&ch, &b),
        &["id", "w", "_change_type", "_commit_lsn", "_change_seq"],
    );
    let txn1 = ra[0][3].clone();
    assert_eq!(
        ra,
        vec![
            vec![s("2"), s("y"), s("insert"), txn1.clone(), s("0")],
            vec![s("2"), s("yy"), s("update"), txn1.clone(), s("2")],
            vec![
                s("NULL"),
                s("NULL"),
                s("truncate"),
                ra[2][3].clone(),
                s("0")
            ],
        ]
    );
    assert_eq!(
        rb[0],
        vec![s("10"), s("1"), s("insert"), txn1.clone(), s("1")]
    );
    assert_eq!(
        rb[1],
        vec![s("11"), s("2"), s("insert"), txn1.clone(), s("3")]
    );
    assert_eq!(rb[2][2], "truncate");
    assert_eq!(
        rb[2][3], ra[2][3],
        "one TRUNCATE of two tables: one transaction"
    );
    assert_eq!(rb[2][4], "1");
    assert_eq!(rb[3][..3], [s("12"), s("3"), s("insert")]);
    assert_eq!(sum.transactions, 3);
}

#[tokio::test]
async fn column_added_mid_stream_widens_the_batch() {
    let Some(f) = fixture("pg_addcol").await else {
        return;
    };
    let t = unique("cdc_addcol");
    f.sql(&format!("CREATE TABLE {t} (id int PRIMARY KEY, v text)"))
        .await;
    let cdc = f.cdc(&[&t]).await;
    let (cp, _) = snapshot(&cdc).await;
    f.each(&[
        format!("INSERT INTO {t} VALUES (1, 'a')"),
        format!("ALTER TABLE {t} ADD COLUMN extra numeric(6,1)"),
        format!("INSERT INTO {t} VALUES (2, 'b', 12.5)"),
        format!("ALTER TABLE {t} DROP COLUMN v"),
        format!("INSERT INTO {t} VALUES (3, 1.5)"),
    ])
    .await;
    let (sum, ch) = changes(&cdc, cp, ReadOptions::default()).await;
    let tb = &ch[&t];
    assert_eq!(tb.len(), 1);
    assert_eq!(tb[0].added_columns, vec![s("extra")]);
    assert_eq!(
        rows(&batches(&ch, &t), &["id", "v", "extra"]),
        vec![
            vec![s("1"), s("a"), s("NULL")],
            vec![s("2"), s("b"), s("125e-1")],
            vec![s("3"), s("NULL"), s("15e-1")],
        ]
    );
    assert_eq!(
        sum.added_columns[&TableRef::new("public", t.clone())],
        vec![s("extra")]
    );
    assert_eq!(
        sum.dropped_columns[&TableRef::new("public", t.clone())],
        vec![s("v")]
    );
}

#[tokio::test]
async fn key_changing_update_is_a_delete_and_an_update() {
    let Some(f) = fixture("pg_pk").await else {
        return;
    };
    let t = unique("cdc_pk");
    let t2 = unique("cdc_pk_full");
    f.sql(&format!(
        "CREATE TABLE {t} (id int PRIMARY KEY, v text); INSERT INTO {t} VALUES (1, 'a');
         CREATE TABLE {t2} (id int PRIMARY KEY, v text); INSERT INTO {t2} VALUES (1, 'a');
         ALTER TABLE {t2} REPLICA IDENTITY FULL;"
    ))
    .await;
    let cdc = f.cdc(&[&t, &t2]).await;
    let (cp, _) = snapshot(&cdc).await;
    f.each(&[
        format!("UPDATE {t} SET id = 100 WHERE id = 1"),
        format!("UPDATE {t} SET v = 'b' WHERE id = 100"),
        format!("UPDATE {t2} SET id = 100 WHERE id = 1"),
        format!("UPDATE {t2} SET v = 'b' WHERE id = 100"),
    ])
    .await;
    let (_, ch) = changes(&cdc, cp, ReadOptions::default()).await;
    for table in [&t, &t2] {
        let r = rows(
            &batches(&ch, table),
            &["id", "v", "_change_type", "_change_seq"],
        );
        let old_v = if *table == t { s("NULL") } else { s("a") };
        assert_eq!(
            r,
            vec![
                vec![s("1"), old_v, s("delete"), s("0")],
                vec![s("100"), s("a"), s("update"), s("1")],
                vec![s("100"), s("b"), s("update"), s("0")],
            ],
            "{table}"
        );
    }
}

#[tokio::test]
async fn dropped_slot_is_a_typed_error_saying_how_to_resnapshot() {
    let Some(f) = fixture("pg_dropped").await else {
        return;
    };
    let t = unique("cdc_drop");
    f.sql(&format!("CREATE TABLE {t} (id int PRIMARY KEY)"))
        .await;
    let cdc = f.cdc(&[&t]).await;
    let (cp, _) = snapshot(&cdc).await;
    f.admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&f.slot])
        .await
        .unwrap();
    let e = match cdc.read_changes(cp, ReadOptions::default()).await {
        Err(e) => e,
        Ok(_) => panic!("a read from a dropped slot must fail"),
    };
    assert!(e.needs_resnapshot());
    assert!(
        matches!(&e, SourceError::SlotMissing { slot, recorded_lsn: Some(l), .. } if *slot == f.slot && *l == cp)
    );
    let text = e.to_string();
    assert!(
        text.contains(&f.slot) && text.contains("full refresh") && text.contains(&cp.to_string()),
        "{text}"
    );
    let e = cdc.advance_slot(cp).await.unwrap_err();
    assert!(e.needs_resnapshot(), "{e}");
    // A slot that is already there cannot take a fresh snapshot.
    let (cp2, _) = snapshot(&cdc).await;
    assert!(cp2 > cp);
    let e = match cdc.start_snapshot(true).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("second snapshot through an existing slot"),
    };
    assert!(e.contains("already exists") && e.contains(&f.slot), "{e}");
    assert!(cdc.drop_slot().await.unwrap());
    assert!(!cdc.drop_slot().await.unwrap());
}

#[tokio::test]
async fn resume_after_a_given_lsn_skips_exactly_what_was_taken() {
    let Some(f) = fixture("pg_resume").await else {
        return;
    };
    let t = unique("cdc_resume");
    f.sql(&format!("CREATE TABLE {t} (id int PRIMARY KEY, v int)"))
        .await;
    let cdc = f.cdc(&[&t]).await;
    let (cp, _) = snapshot(&cdc).await;
    for i in 1..=5 {
        f.sql(&format!("BEGIN; INSERT INTO {t} VALUES ({i}, 0); UPDATE {t} SET v = {i} WHERE id = {i}; COMMIT;")).await;
    }
    // Take at least 3 changes: stops at the end of the second transaction.
    let (s1, ch1) = changes(
        &cdc,
        cp,
        ReadOptions {
            max_changes: Some(3),
            ..Default::default()
        },
    )
    .await;
    assert!(!s1.complete);
    assert_eq!(s1.transactions, 2);
    assert_eq!(Some(s1.resume_lsn), s1.last_commit_end_lsn);
    let r1 = rows(&batches(&ch1, &t), &["id", "_change_type"]);
    assert_eq!(r1.len(), 4);
    // The engine committed r1 with resume_lsn and crashed before advancing: the next read
    // starts after it and gets exactly the rest.
    let (s2, ch2) = changes(&cdc, s1.resume_lsn, ReadOptions::default()).await;
    assert!(s2.complete);
    assert_eq!(s2.transactions, 3);
    let r2 = rows(&batches(&ch2, &t), &["id", "_change_type", "_commit_lsn"]);
    assert_eq!(
        r2.iter().map(|r| r[0].clone()).collect::<Vec<_>>(),
        vec!["3", "3", "4", "4", "5", "5"]
    );
    // The rows below the recorded LSN are exactly the ones taken before.
    assert!(r2
        .iter()
        .all(|r| r[2].parse::<i64>().unwrap() >= s1.resume_lsn.to_i64()));
    assert_eq!(
        s2.skipped_transactions, 0,
        "the server starts after the recorded LSN"
    );
    // Advance in two steps, like two commits.
    assert_eq!(
        cdc.advance_slot(s1.resume_lsn).await.unwrap(),
        s1.resume_lsn
    );
    assert_eq!(
        cdc.advance_slot(s2.resume_lsn).await.unwrap(),
        s2.resume_lsn
    );
    // A slot ahead of the recorded LSN (someone else consumed it) is an error.
    let e = match cdc
        .read_changes(s1.resume_lsn, ReadOptions::default())
        .await
    {
        Err(e) => e,
        Ok(_) => panic!("slot ahead must fail"),
    };
    assert!(
        e.needs_resnapshot() && e.to_string().contains("beyond the LSN strata recorded"),
        "{e}"
    );
    // The lag is the WAL between the slot's confirmed position and the server's.
    let st = cdc.slot_status().await.unwrap().unwrap();
    assert_eq!(st.confirmed_flush_lsn, s2.resume_lsn);
    assert_eq!(
        st.lag_bytes,
        st.current_wal_lsn.0 - st.confirmed_flush_lsn.0
    );
    assert!(cdc.slot_lag().await.unwrap() >= st.lag_bytes);
}

#[tokio::test]
async fn snapshot_and_stream_meet_exactly_under_a_concurrent_writer() {
    let Some(f) = fixture("pg_race").await else {
        return;
    };
    let t = unique("cdc_race");
    f.sql(&format!(
        "CREATE TABLE {t} (id int PRIMARY KEY, v int);
         INSERT INTO {t} SELECT i, 0 FROM generate_series(1, 200) i;"
    ))
    .await;
    let cdc = f.cdc(&[&t]).await;
    // A writer inserting new keys and updating old ones, one transaction each, all along.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let t = t.clone();
        tokio::spawn(async move {
            let c = pg_admin().await;
            let mut i = 1000;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                c.batch_execute(&format!(
                    "INSERT INTO {t} VALUES ({i}, 0); UPDATE {t} SET v = v + 1 WHERE id = {};",
                    1 + i % 200
                ))
                .await
                .unwrap();
                if i % 7 == 0 {
                    c.batch_execute(&format!("DELETE FROM {t} WHERE id = {}", i - 3))
                        .await
                        .unwrap();
                }
                i += 1;
            }
            i
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (cp, snap) = snapshot(&cdc).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let written = writer.await.unwrap();
    assert!(
        written > 1010,
        "the writer ran during the snapshot ({written})"
    );
    let (_, ch) = changes(&cdc, cp, ReadOptions::default()).await;

    // Apply snapshot then changes; compare with the table.
    let mut state: BTreeMap<i64, i64> = BTreeMap::new();
    let snap_ids: std::collections::BTreeSet<i64> = rows(&snap[&t], &["id"])
        .iter()
        .map(|r| r[0].parse().unwrap())
        .collect();
    for r in rows(&snap[&t], &["id", "v"]) {
        state.insert(r[0].parse().unwrap(), r[1].parse().unwrap());
    }
    let mut inserts = 0;
    for r in rows(
        &batches(&ch, &t),
        &["id", "v", "_change_type", "_commit_lsn"],
    ) {
        assert!(r[3].parse::<i64>().unwrap() >= cp.to_i64());
        let id: i64 = r[0].parse().unwrap();
        match r[2].as_str() {
            "insert" => {
                inserts += 1;
                assert!(
                    !snap_ids.contains(&id),
                    "overlap: key {id} is in the snapshot and inserted by the stream"
                );
                state.insert(id, r[1].parse().unwrap());
            }
            "update" => {
                assert!(
                    state.contains_key(&id),
                    "gap: update of {id} that neither snapshot nor stream inserted"
                );
                state.insert(id, r[1].parse().unwrap());
            }
            "delete" => {
                assert!(
                    state.remove(&id).is_some(),
                    "gap: delete of {id} never seen"
                );
            }
            other => panic!("{other}"),
        }
    }
    assert!(inserts > 0, "the stream carried inserts after the snapshot");
    let table: BTreeMap<i64, i64> = f
        .admin
        .query(&format!("SELECT id::bigint, v::bigint FROM {t}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(state, table, "snapshot + stream = the table");
}

#[tokio::test]
async fn unsupported_column_types_name_the_column_and_can_be_excluded() {
    let Some(f) = fixture("pg_cdc_unsup").await else {
        return;
    };
    let t = unique("cdc_unsup");
    f.sql(&format!("CREATE TABLE {t} (id int PRIMARY KEY, tags int4range, v text); INSERT INTO {t} VALUES (1, '[1,2)', 'a')")).await;
    let cdc = f.cdc(&[&t]).await;
    let mut snap = cdc.start_snapshot(true).await.unwrap();
    let e = snap.next_batch().await.unwrap_err();
    assert!(
        matches!(&e, SourceError::UnsupportedType { column, .. } if column == "tags"),
        "{e}"
    );
    drop(snap);
    cdc.drop_slot().await.unwrap();

    let mut cfg = f.config(&[&t]);
    cfg.tables[0].exclude_columns = vec!["tags".into()];
    let cdc = PgCdc::connect(&f.spec, cfg).await.unwrap();
    let (cp, snap) = snapshot(&cdc).await;
    assert_eq!(rows(&snap[&t], &["id", "v"]), vec![vec![s("1"), s("a")]]);
    assert!(snap[&t][0].column_by_name("tags").is_none());
    f.sql(&format!("INSERT INTO {t} VALUES (2, '[2,3)', 'b')"))
        .await;
    let (_, ch) = changes(&cdc, cp, ReadOptions::default()).await;
    assert_eq!(
        rows(&batches(&ch, &t), &["id", "v"]),
        vec![vec![s("2"), s("b")]]
    );
    assert!(batches(&ch, &t)[0].column_by_name("tags").is_none());

    // Without exclusion the stream names the column too.
    let cdc_all = PgCdc::connect(&f.spec, f.config(&[&t])).await.unwrap();
    let mut r = cdc_all
        .read_changes(cp, ReadOptions::default())
        .await
        .unwrap();
    let e = loop {
        match r.next_batch().await {
            Err(e) => break e,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("expected an error"),
        }
    };
    assert!(
        matches!(&e, SourceError::UnsupportedType { column, .. } if column == "tags"),
        "{e}"
    );
}

#[tokio::test]
async fn existing_publication_must_contain_the_tables() {
    let Some(f) = fixture("pg_pub").await else {
        return;
    };
    let t = unique("cdc_pub");
    let other = unique("cdc_pub_other");
    f.sql(&format!(
        "CREATE TABLE {t} (id int PRIMARY KEY); CREATE TABLE {other} (id int PRIMARY KEY);
         CREATE PUBLICATION {} FOR TABLE {other};",
        f.publication
    ))
    .await;
    let mut cfg = f.config(&[&t]);
    cfg.create_publication = false;
    let cdc = PgCdc::connect(&f.spec, cfg).await.unwrap();
    let e = match cdc.start_snapshot(true).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("table missing from the publication"),
    };
    assert!(
        e.contains(&f.publication) && e.contains(&t) && e.contains("ALTER PUBLICATION"),
        "{e}"
    );
    // Managed: strata adds it.
    let cdc = f.cdc(&[&t]).await;
    let (cp, _) = snapshot(&cdc).await;
    f.each(&[
        format!("INSERT INTO {t} VALUES (1)"),
        format!("INSERT INTO {other} VALUES (1)"),
    ])
    .await;
    let (_, ch) = changes(&cdc, cp, ReadOptions::default()).await;
    assert_eq!(
        ch.keys().cloned().collect::<Vec<_>>(),
        vec![t.clone()],
        "only the configured tables"
    );
    let bad = PgCdc::connect(
        &f.spec,
        CdcConfig::new("Bad-Slot", "p", vec![TableRef::new("public", "x")]),
    )
    .await;
    assert!(matches!(bad, Err(SourceError::Config { .. })));
}

#[tokio::test]
async fn large_backlog_streams_in_bounded_batches() {
    let Some(f) = fixture("pg_backlog").await else {
        return;
    };
    let t = unique("cdc_backlog");
    f.sql(&format!("CREATE TABLE {t} (id int PRIMARY KEY, v text)"))
        .await;
    let mut cfg = f.config(&[&t]);
    cfg.batch_rows = 1000;
    let cdc = PgCdc::connect(&f.spec, cfg).await.unwrap();
    let (cp, _) = snapshot(&cdc).await;
    // One big transaction and many small ones.
    f.sql(&format!(
        "INSERT INTO {t} SELECT i, md5(i::text) FROM generate_series(1, 20000) i"
    ))
    .await;
    for i in 0..50 {
        f.sql(&format!("UPDATE {t} SET v = 'x' WHERE id = {}", i + 1))
            .await;
    }
    let mut r = cdc.read_changes(cp, ReadOptions::default()).await.unwrap();
    let mut n = 0;
    let mut batches = 0;
    while let Some(b) = r.next_batch().await.unwrap() {
        assert!(b.batch.num_rows() <= 1000);
        n += b.batch.num_rows();
        batches += 1;
    }
    assert_eq!(n, 20050);
    assert!(batches >= 21);
    assert_eq!(r.summary().unwrap().transactions, 51);
}

#[tokio::test]
async fn stream_values_equal_snapshot_values_for_every_mapped_type() {
    let Some(f) = fixture("pg_cdc_types").await else {
        return;
    };
    let t = unique("cdc_types");
    let ty = unique("mood");
    let dom = unique("price");
    let values = "true, -32768, 2147483647, -9223372036854775808, 1.5, 0.1, 1234567890.12, \
                  12345678901234567890.123456789012345678, 12300, 'héllo', 'abc', 'ab', 'x', 'happy', \
                  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"a\": [1, 2]}', '{\"b\":  1, \"a\": 2}', '\\x00ff10', \
                  '2024-02-29', '2024-01-31 12:00:00.123456', '2024-01-31 12:00:00.123456+02', 19.99, 4000000000";
    f.sql(&format!(
        "CREATE TYPE {ty} AS ENUM ('sad', 'happy');
         CREATE DOMAIN {dom} AS numeric(6,2) CHECK (VALUE > 0);
         CREATE TABLE {t} (id int PRIMARY KEY, b bool, s smallint, i integer, bi bigint, r real, d double precision,
           n12 numeric(12,2), nfree numeric, nneg numeric(5,-2), tx text, vc varchar(10), ch char(5), c1 \"char\",
           e {ty}, u uuid, j json, jb jsonb, by bytea, dt date, ts timestamp, tstz timestamptz, dom {dom}, o oid);
         INSERT INTO {t} VALUES (1, {values}), (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);"
    ))
    .await;
    let cdc = f.cdc(&[&t]).await;
    let (cp, snap) = snapshot(&cdc).await;
    f.each(&[
        format!("INSERT INTO {t} VALUES (11, {values})"),
        format!("INSERT INTO {t} (id) VALUES (12)"),
    ])
    .await;
    let (_, ch) = changes(&cdc, cp, ReadOptions::default()).await;
    let stream = batches(&ch, &t);
    let snap = &snap[&t];
    let n_cols = 24;
    assert_eq!(
        stream[0].schema().fields()[..n_cols],
        snap[0].schema().fields()[..n_cols],
        "same Arrow types"
    );
    let cols: Vec<String> = snap[0].schema().fields()[1..n_cols]
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let cols: Vec<&str> = cols.iter().map(|c| c.as_str()).collect();
    assert_eq!(rows(&stream, &cols), rows(snap, &cols), "same values");
    assert_eq!(
        rows(&stream, &["dom", "e", "nneg"])[0],
        vec![s("1999e-2"), s("happy"), s("12300e-0")]
    );
}

/// Arrays (of built-in types, enums and composites; empty, NULL, with NULL elements) and
/// composite types (with an array field) are Delta ARRAYs and STRUCTs, the same in the
/// snapshot and in the stream; a two-dimensional array is an error naming the column.
#[tokio::test]
async fn arrays_and_composites_are_arrays_and_structs() {
    let Some(f) = fixture("pg_cdc_nested").await else {
        return;
    };
    let t = unique("cdc_nested");
    let mood = unique("mood");
    let addr = unique("addr");
    let values = format!(
        "'{{1,NULL,3}}', '{{\"a b\",c}}', '{{1.50,-2.25}}', '{{happy,sad}}'::{mood}[], \
         ROW('Main St', 1000, '{{x,y}}')::{addr}, ARRAY[ROW('A', 1, NULL)::{addr}, NULL]"
    );
    f.sql(&format!(
        "CREATE TYPE {mood} AS ENUM ('sad', 'happy');
         CREATE TYPE {addr} AS (street text, zip int, tags text[]);
         CREATE TABLE {t} (id int PRIMARY KEY, ints int[], texts text[], nums numeric(10,2)[],
           moods {mood}[], home {addr}, homes {addr}[]);
         INSERT INTO {t} VALUES (1, {values}),
           (2, '{{}}', '{{}}', NULL, '{{}}', NULL, '{{}}'),
           (3, NULL, NULL, NULL, NULL, NULL, NULL);"
    ))
    .await;
    let cdc = f.cdc(&[&t]).await;
    let (cp, snap) = snapshot(&cdc).await;
    f.each(&[
        format!("INSERT INTO {t} VALUES (11, {values})"),
        format!("UPDATE {t} SET ints = '{{7}}', home = ROW(NULL, 2, '{{}}')::{addr} WHERE id = 2"),
    ])
    .await;
    let (_, ch) = changes(&cdc, cp, ReadOptions::default()).await;
    let stream = batches(&ch, &t);
    let snap = &snap[&t];
    let cols = ["ints", "texts", "nums", "moods", "home", "homes"];
    assert_eq!(
        stream[0].schema().fields()[..7],
        snap[0].schema().fields()[..7],
        "same Arrow types"
    );
    let home = snap[0].schema().field_with_name("home").unwrap().clone();
    assert!(
        matches!(home.data_type(), arrow_schema::DataType::Struct(f) if f.len() == 3
            && matches!(f[2].data_type(), arrow_schema::DataType::List(_))),
        "{home:?}"
    );
    let first = vec![
        s("[1,NULL,3]"),
        s("[a b,c]"),
        s("[150e-2,-225e-2]"),
        s("[happy,sad]"),
        s("{street: Main St, zip: 1000, tags: [x,y]}"),
        s("[{street: A, zip: 1, tags: NULL},NULL]"),
    ];
    let snap_rows = rows(snap, &cols);
    assert_eq!(snap_rows[0], first);
    assert_eq!(
        snap_rows[1],
        vec![s("[]"), s("[]"), s("NULL"), s("[]"), s("NULL"), s("[]")]
    );
    assert_eq!(snap_rows[2], vec![s("NULL"); 6]);
    let stream_rows = rows(&stream, &cols);
    assert_eq!(stream_rows[0], first, "the stream decodes as the snapshot");
    assert_eq!(stream_rows[1][0], "[7]");
    assert_eq!(stream_rows[1][4], "{street: NULL, zip: 2, tags: []}");

    let t2 = unique("cdc_matrix");
    f.sql(&format!(
        "CREATE TABLE {t2} (id int PRIMARY KEY, m int[]); INSERT INTO {t2} VALUES (1, '{{{{1,2}},{{3,4}}}}')"
    ))
    .await;
    let f2 = fixture("pg_cdc_matrix").await.expect("fixture");
    let cdc2 = f2.cdc(&[&t2]).await;
    let mut snap2 = cdc2.start_snapshot(true).await.unwrap();
    let e = snap2.next_batch().await.unwrap_err().to_string();
    assert!(e.contains("2-dimensional") && e.contains('m'), "{e}");
}
