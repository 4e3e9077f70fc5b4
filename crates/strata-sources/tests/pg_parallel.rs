//! Parallel watermark reads of a real PostgreSQL (run under scripts/services/with-services.sh):
//! a read split into ranges of its leading watermark column, read on several connections in
//! one snapshot, must give exactly the rows of the serial read, in the same order, with the
//! same watermarks.

mod common;

use arrow_array::RecordBatch;
use common::*;
use strata_sources::*;

/// Every batch of a read, and the watermark after each.
async fn read_all(src: &Source, read: &WatermarkRead) -> (Vec<RecordBatch>, Vec<Watermark>) {
    let mut r = src.read_watermark(read).await.expect("read");
    let mut batches = vec![];
    let mut marks = vec![];
    while let Some(b) = r.next_batch().await.expect("batch") {
        assert!(b.num_rows() <= read.batch_rows);
        batches.push(b);
        marks.push(r.max_watermark().cloned().expect("a watermark"));
    }
    (batches, marks)
}

/// The connections a spec named `app` has open.
async fn connections(admin: &tokio_postgres::Client, app: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .unwrap()
        .get(0)
}

const COLUMNS: [&str; 4] = ["id", "grp", "name", "at"];

/// Reads `read` serially and with `parallel` ranges; both must give the same rows in the
/// same order, and the same last watermark. Returns the serial rows.
async fn same_as_serial(src: &Source, read: &WatermarkRead, parallel: usize) -> Vec<Vec<String>> {
    let (serial, serial_marks) = read_all(src, &read.clone().parallel(Some(1))).await;
    let (par, par_marks) = read_all(src, &read.clone().parallel(Some(parallel))).await;
    let want = rows(&serial, &COLUMNS);
    assert_eq!(
        rows(&par, &COLUMNS),
        want,
        "{parallel} ranges: the rows of the serial read, in its order"
    );
    assert_eq!(
        par_marks.last(),
        serial_marks.last(),
        "the same last watermark"
    );
    // Each batch's watermark is its last row's: never going back.
    let mut seen = 0;
    for (b, m) in par.iter().zip(&par_marks) {
        seen += b.num_rows();
        let last = &want[seen - 1];
        assert_eq!(
            m.values[0].to_sql_text(),
            last[1],
            "a batch's watermark is its last row's grp"
        );
    }
    want
}

/// A table of `rows` rows; with `indexed`, an index on the watermark columns (ranges are
/// then many, about four batches each, several per connection).
async fn grouped_table(admin: &tokio_postgres::Client, rows: i64, indexed: bool) -> String {
    let t = unique("par_rows");
    if indexed {
        admin
            .batch_execute(&format!(
                "CREATE TABLE {t} (id bigint PRIMARY KEY, grp bigint, name text, at timestamptz);
                 CREATE INDEX ON {t} (grp, id);"
            ))
            .await
            .unwrap();
    }
    // grp repeats (7 rows a value: ties across any split point), some rows have no grp.
    admin
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {t} (id bigint PRIMARY KEY, grp bigint, name text, at timestamptz);
             INSERT INTO {t} SELECT i, CASE WHEN i % 101 = 0 THEN NULL ELSE i / 7 END,
                    'n' || i, timestamptz '2024-01-01 00:00:00+00' + (i / 7) * interval '1 second'
               FROM generate_series(1, {rows}) i;
             ANALYZE {t};"
        ))
        .await
        .unwrap();
    t
}

#[tokio::test]
async fn parallel_reads_give_the_serial_rows_in_order() {
    let app = unique("par_app");
    let Some(spec) = pg_spec("pg_src") else {
        return;
    };
    let spec = spec.with_option("application_name", app.clone());
    let admin = pg_admin().await;
    let t = grouped_table(&admin, 20_000, false).await;
    let src = Source::connect(&spec).await.unwrap();
    let read = WatermarkRead::new(
        SourceObject::table(&format!("public.{t}")).unwrap(),
        vec!["grp".into(), "id".into()],
    )
    .batch_rows(1000);
    for k in [2, 3, 5] {
        let want = same_as_serial(&src, &read, k).await;
        assert_eq!(
            want.len(),
            20_000 - 20 * 10 + 2,
            "rows without grp are not read"
        );
        assert!(want.iter().all(|r| r[1] != "NULL"));
    }
    // The ranges really run on connections of their own (the histogram gives the splits).
    let r = src
        .read_watermark(&read.clone().parallel(Some(4)))
        .await
        .unwrap();
    assert_eq!(connections(&admin, &app).await, 1 + 4);
    drop(r);

    // Above a lower bound, exclusive and inclusive, in the middle of a run of ties.
    let bound = Watermark {
        columns: vec!["grp".into(), "id".into()],
        values: vec![WatermarkValue::Int(1500), WatermarkValue::Int(10_502)],
    };
    for lb in [
        LowerBound::after(bound.clone()),
        LowerBound {
            watermark: bound.clone(),
            inclusive: true,
        },
    ] {
        let read = read.clone().lower_bound(Some(lb.clone()));
        let want = same_as_serial(&src, &read, 3).await;
        let first = if lb.inclusive { "10502" } else { "10503" };
        assert_eq!(want[0][0], first, "{lb:?}");
    }
    // A bound on the leading column only.
    let only_grp = Watermark {
        columns: vec!["grp".into(), "id".into()],
        values: vec![WatermarkValue::Int(2000)],
    };
    let read_above = read.clone().lower_bound(Some(LowerBound::after(only_grp)));
    let want = same_as_serial(&src, &read_above, 4).await;
    assert_eq!(want[0][1], "2001");
    // Nothing above the bound: no rows, in parallel too.
    let far = Watermark {
        columns: vec!["grp".into()],
        values: vec![WatermarkValue::Int(1_000_000)],
    };
    let (b, _) = read_all(
        &src,
        &read
            .clone()
            .parallel(Some(3))
            .lower_bound(Some(LowerBound::after(far))),
    )
    .await;
    assert!(b.is_empty());
}

#[tokio::test]
async fn parallel_reads_of_queries_and_unanalyzed_tables_split_between_min_and_max() {
    let Some(spec) = pg_spec("pg_src") else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("par_nostats");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, grp bigint, name text, at timestamptz);
             INSERT INTO {t} SELECT i, CASE WHEN i % 50 = 0 THEN NULL ELSE i / 3 END, 'n' || i,
                    timestamptz '2024-01-01 00:00:00+00' + (i / 3) * interval '1 minute'
               FROM generate_series(1, 6000) i;"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    // A table without statistics.
    let table = WatermarkRead::new(
        SourceObject::table(&format!("public.{t}")).unwrap(),
        vec!["grp".into(), "id".into()],
    )
    .batch_rows(500);
    same_as_serial(&src, &table, 3).await;
    // A query: its own rows and columns, split on a timestamp (the leading watermark column).
    let query = WatermarkRead::new(
        SourceObject::Query(format!(
            "SELECT id, grp, name || '!' AS name, at FROM public.{t} WHERE id % 2 = 0"
        )),
        vec!["at".into(), "id".into()],
    )
    .batch_rows(300);
    let (serial, _) = read_all(&src, &query.clone().parallel(Some(1))).await;
    let (par, marks) = read_all(&src, &query.clone().parallel(Some(4))).await;
    assert_eq!(rows(&par, &COLUMNS), rows(&serial, &COLUMNS));
    assert_eq!(rows(&serial, &COLUMNS).len(), 3000);
    assert!(rows(&par, &["name"]).iter().all(|r| r[0].ends_with('!')));
    assert_eq!(
        marks.last().unwrap().values[1],
        WatermarkValue::Int(6000),
        "the last row: the largest time, then id"
    );
}

#[tokio::test]
async fn parallel_reads_see_one_snapshot_while_rows_change() {
    let Some(spec) = pg_spec("pg_src") else {
        return;
    };
    let admin = pg_admin().await;
    let t = grouped_table(&admin, 30_000, true).await;
    let src = Source::connect(&spec).await.unwrap();
    let read = WatermarkRead::new(
        SourceObject::table(&format!("public.{t}")).unwrap(),
        vec!["grp".into(), "id".into()],
    )
    .batch_rows(200);
    let (before, _) = read_all(&src, &read.clone().parallel(Some(1))).await;
    let want = rows(&before, &COLUMNS);
    // The ranges' readers start, read a little ahead, and wait for the caller ...
    let mut r = src
        .read_watermark(&read.clone().parallel(Some(4)))
        .await
        .unwrap();
    let mut got = vec![r.next_batch().await.unwrap().unwrap()];
    // ... while other transactions move rows between ranges, delete and insert some.
    admin
        .batch_execute(&format!(
            "UPDATE {t} SET grp = 4300 - grp, name = 'moved' WHERE id % 3 = 0;
             DELETE FROM {t} WHERE id % 11 = 0;
             INSERT INTO {t} SELECT i, i / 7, 'new', now() FROM generate_series(30001, 31000) i;"
        ))
        .await
        .unwrap();
    while let Some(b) = r.next_batch().await.unwrap() {
        got.push(b);
    }
    assert_eq!(
        rows(&got, &COLUMNS),
        want,
        "the rows as of the read's start, no change seen"
    );
}

#[tokio::test]
async fn text_watermarks_split_in_the_columns_collation() {
    let Some(spec) = pg_spec("pg_src") else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("par_text");
    // Mixed case: "C" and the default collation order these differently.
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, grp text COLLATE \"C\", name text, at timestamptz);
             INSERT INTO {t} SELECT i, CASE WHEN i % 2 = 0 THEN upper(md5(i::text)) ELSE md5(i::text) END,
                    'n' || i, NULL FROM generate_series(1, 5000) i;
             ANALYZE {t};"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let read = WatermarkRead::new(
        SourceObject::table(&format!("public.{t}")).unwrap(),
        vec!["grp".into()],
    )
    .batch_rows(250);
    let want = same_as_serial(&src, &read, 4).await;
    assert_eq!(want.len(), 5000);
}

/// A first load in any order (`any_order`) of a table: its pages read in ranges on several
/// connections in one snapshot, the batches as they come. The rows are the ordered read's
/// (as a set, none twice, none seen from transactions after the start), and the highest
/// watermark is the ordered read's last, found by the server from the start.
#[tokio::test]
async fn reads_in_any_order_give_the_snapshots_rows_and_its_highest_watermark() {
    let app = unique("scan_app");
    let Some(spec) = pg_spec("pg_src") else {
        return;
    };
    let spec = spec.with_option("application_name", app.clone());
    let admin = pg_admin().await;
    let t = grouped_table(&admin, 30_000, false).await;
    let src = Source::connect(&spec).await.unwrap();
    let read = WatermarkRead::new(
        SourceObject::table(&format!("public.{t}")).unwrap(),
        vec!["grp".into(), "id".into()],
    )
    .batch_rows(500);
    let (ordered, marks) = read_all(&src, &read.clone().parallel(Some(1))).await;
    let mut want = rows(&ordered, &COLUMNS);
    want.sort();

    let mut r = src
        .read_watermark(&read.clone().any_order(true).parallel(Some(3)))
        .await
        .unwrap();
    assert!(!r.in_watermark_order());
    assert_eq!(
        r.max_watermark(),
        marks.last(),
        "the highest watermark, from the start"
    );
    assert_eq!(connections(&admin, &app).await, 1 + 3);
    let mut got = vec![r.next_batch().await.unwrap().unwrap()];
    // Rows move (an update writes a new version at the table's end), go and come while
    // the ranges are read: none of it is seen.
    admin
        .batch_execute(&format!(
            "UPDATE {t} SET grp = grp + 100000, name = 'moved' WHERE id % 3 = 0;
             DELETE FROM {t} WHERE id % 11 = 0;
             INSERT INTO {t} SELECT i, i, 'new', now() FROM generate_series(30001, 31000) i;"
        ))
        .await
        .unwrap();
    while let Some(b) = r.next_batch().await.unwrap() {
        assert!(b.num_rows() <= 500);
        got.push(b);
    }
    let mut got = rows(&got, &COLUMNS);
    got.sort();
    assert_eq!(got, want, "the snapshot's rows, each once");
    assert_eq!(r.max_watermark(), marks.last());

    // From a lower bound, and for a query, the read stays in watermark order.
    let above = read
        .clone()
        .any_order(true)
        .lower_bound(Some(LowerBound::after(marks[0].clone())));
    assert!(src
        .read_watermark(&above)
        .await
        .unwrap()
        .in_watermark_order());
    let query = WatermarkRead::new(
        SourceObject::Query(format!("SELECT id, grp FROM public.{t}")),
        vec!["grp".into(), "id".into()],
    )
    .any_order(true);
    assert!(src
        .read_watermark(&query)
        .await
        .unwrap()
        .in_watermark_order());

    // An empty table: no rows, no watermark.
    let empty = unique("scan_empty");
    admin
        .batch_execute(&format!("CREATE TABLE {empty} (id bigint, grp bigint)"))
        .await
        .unwrap();
    let read_empty = WatermarkRead::new(
        SourceObject::table(&format!("public.{empty}")).unwrap(),
        vec!["grp".into()],
    )
    .any_order(true);
    let mut r = src.read_watermark(&read_empty).await.unwrap();
    assert_eq!(r.max_watermark(), None);
    assert!(r.next_batch().await.unwrap().is_none());
}
