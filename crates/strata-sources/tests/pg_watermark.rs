//! Watermark reads from a real PostgreSQL (run under scripts/services/with-services.sh).

mod common;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use common::*;
use strata_sources::*;

async fn read_all(src: &Source, read: &WatermarkRead) -> (Vec<RecordBatch>, Option<Watermark>) {
    let mut r = src.read_watermark(read).await.expect("read");
    let mut out = vec![];
    while let Some(b) = r.next_batch().await.expect("batch") {
        assert!(b.num_rows() <= read.batch_rows);
        out.push(b);
    }
    (out, r.max_watermark().cloned())
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            let a = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
            (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn first_load_incremental_no_new_rows() {
    let Some(spec) = pg_spec("pg_src") else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("wm_orders");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, updated_at timestamptz, name text);
             INSERT INTO {t} SELECT i, timestamptz '2024-01-01 00:00:00+00' + i * interval '1 minute', 'n' || i
               FROM generate_series(1, 5) i;
             INSERT INTO {t} VALUES (99, NULL, 'no watermark');"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let read = WatermarkRead::new(
        SourceObject::table(&format!("public.{t}")).unwrap(),
        vec!["updated_at".into()],
    )
    .batch_rows(2);
    let (batches, max) = read_all(&src, &read).await;
    assert_eq!(batches.len(), 3, "5 rows in batches of 2");
    assert_eq!(
        ids(&batches),
        vec![1, 2, 3, 4, 5],
        "in watermark order; the NULL-watermark row is not read"
    );
    let max = max.expect("a max");
    let expected_micros = 1_704_067_200_000_000 + 5 * 60_000_000;
    assert_eq!(
        max.values,
        vec![WatermarkValue::TimestampUtc(expected_micros)]
    );
    // Stored as JSON and given back.
    let stored = max.to_json();
    assert!(stored.contains("2024-01-01T00:05:00.000000Z"), "{stored}");

    // Incremental: two new rows, one old row touched.
    admin
        .batch_execute(&format!(
            "INSERT INTO {t} VALUES (6, '2024-01-01 00:10:00+00', 'n6'), (7, '2024-01-01 00:06:00+00', 'n7');
             UPDATE {t} SET updated_at = '2024-01-01 00:07:00+00', name = 'changed' WHERE id = 2;"
        ))
        .await
        .unwrap();
    let back = Watermark::from_json(&stored).unwrap();
    let read2 = read.clone().lower_bound(Some(LowerBound::after(back)));
    let (batches, max2) = read_all(&src, &read2).await;
    assert_eq!(ids(&batches), vec![7, 2, 6]);
    assert_eq!(
        rows(&batches, &["name"]),
        vec![
            vec!["n7".to_string()],
            vec!["changed".to_string()],
            vec!["n6".to_string()]
        ]
    );
    let max2 = max2.unwrap();

    // Nothing new: no rows, no max.
    let read3 = read
        .clone()
        .lower_bound(Some(LowerBound::after(max2.clone())));
    let (batches, max3) = read_all(&src, &read3).await;
    assert!(batches.is_empty());
    assert!(max3.is_none());
}

#[tokio::test]
async fn overlap_window_is_inclusive_and_tuple_watermarks_break_ties() {
    let Some(spec) = pg_spec("pg_src") else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("wm_overlap");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id bigint PRIMARY KEY, ts timestamp NOT NULL, amount numeric(12,2));
             INSERT INTO {t} VALUES
               (1, '2024-05-01 10:00:00', 1.00), (2, '2024-05-01 11:00:00', 2.00),
               (3, '2024-05-01 11:30:00', 3.00), (4, '2024-05-01 12:00:00', 4.00),
               (5, '2024-05-01 12:00:00', 5.00), (6, '2024-05-01 12:00:00', 6.00);"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let obj = SourceObject::table(&format!("public.{t}")).unwrap();
    let read = WatermarkRead::new(obj.clone(), vec!["ts".into(), "id".into()]);
    let (_, max) = read_all(&src, &read).await;
    let max = max.unwrap();
    let noon = 1_714_564_800_000_000; // 2024-05-01 12:00:00
    assert_eq!(
        max.values,
        vec![WatermarkValue::Timestamp(noon), WatermarkValue::Int(6)]
    );

    // Strictly after (12:00, 4): ids 5 and 6 only.
    let after4 = Watermark {
        columns: max.columns.clone(),
        values: vec![WatermarkValue::Timestamp(noon), WatermarkValue::Int(4)],
    };
    let (b, _) = read_all(
        &src,
        &read
            .clone()
            .lower_bound(Some(LowerBound::after(after4.clone()))),
    )
    .await;
    assert_eq!(ids(&b), vec![5, 6]);
    // Inclusive: 4 too.
    let (b, _) = read_all(
        &src,
        &read.clone().lower_bound(Some(LowerBound::from(after4))),
    )
    .await;
    assert_eq!(ids(&b), vec![4, 5, 6]);

    // An overlap of one hour back from the stored max: every row at or after 11:00.
    let lb = max
        .overlap(Overlap::Duration(std::time::Duration::from_secs(3600)))
        .unwrap();
    assert!(lb.inclusive);
    let (b, _) = read_all(&src, &read.clone().lower_bound(Some(lb))).await;
    assert_eq!(ids(&b), vec![2, 3, 4, 5, 6]);

    // A decimal watermark with an amount overlap, inclusive bound exactly on a value.
    let read_amt = WatermarkRead::new(obj, vec!["amount".into()]);
    let stored = Watermark {
        columns: vec!["amount".into()],
        values: vec![WatermarkValue::Decimal {
            unscaled: 500,
            scale: 2,
        }],
    };
    let (b, _) = read_all(
        &src,
        &read_amt
            .clone()
            .lower_bound(Some(stored.overlap(Overlap::Amount(1)).unwrap())),
    )
    .await;
    assert_eq!(ids(&b), vec![4, 5, 6]);
    let (b, m) = read_all(&src, &read_amt.lower_bound(Some(LowerBound::after(stored)))).await;
    assert_eq!(ids(&b), vec![6]);
    assert_eq!(
        m.unwrap().values,
        vec![WatermarkValue::Decimal {
            unscaled: 600,
            scale: 2
        }]
    );
}

#[tokio::test]
async fn type_mapping_exact_values() {
    let Some(spec) = pg_spec("pg_types") else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("wm_types");
    let ty = unique("mood");
    let dom = unique("posint");
    admin
        .batch_execute(&format!(
            "CREATE TYPE {ty} AS ENUM ('sad', 'happy');
             CREATE DOMAIN {dom} AS integer CHECK (VALUE > 0);
             CREATE TABLE {t} (
               id bigint PRIMARY KEY, s smallint, i integer, b bool, r real, d double precision,
               n12 numeric(12,2), nfree numeric, n38 numeric(38,0), nneg numeric(5,-2),
               tx text, vc varchar(10), ch char(5), e {ty}, u uuid, j json, jb jsonb, by bytea,
               dt date, ts timestamp, tstz timestamptz, dom {dom}, o oid);
             INSERT INTO {t} VALUES
              (1, -32768, 2147483647, true, 1.5, 0.1, 1234567890.12, 12345678901234567890.123456789012345678,
               99999999999999999999999999999999999999, 12300,
               'héllo', 'abc', 'ab', 'happy', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{\"a\": [1, 2]}}',
               '{{\"b\":  1, \"a\": 2}}', '\\x00ff10', '2024-02-29', '2024-01-31 12:00:00.123456',
               '2024-01-31 12:00:00.123456+02', 7, 4000000000),
              (2, NULL, NULL, NULL, NULL, NULL, -0.01, -0.000000000000000001, -1, NULL,
               '', NULL, NULL, NULL, NULL, NULL, NULL, '\\x', '0001-01-01', '1970-01-01 00:00:00',
               '1969-12-31 23:59:59.999999+00', NULL, NULL);"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let obj = SourceObject::table(&format!("public.{t}")).unwrap();
    let schema = src.describe(&obj, &[]).await.unwrap();
    let kinds: Vec<(String, ColumnKind)> = schema
        .columns
        .iter()
        .map(|c| (c.name.clone(), c.kind.clone()))
        .collect();
    let k = |n: &str| kinds.iter().find(|(c, _)| c == n).unwrap().1.clone();
    assert_eq!(k("s"), ColumnKind::Int16);
    assert_eq!(
        k("n12"),
        ColumnKind::Decimal {
            precision: 12,
            scale: 2
        }
    );
    assert_eq!(
        k("nfree"),
        ColumnKind::Decimal {
            precision: 38,
            scale: 18
        }
    );
    assert_eq!(
        k("n38"),
        ColumnKind::Decimal {
            precision: 38,
            scale: 0
        }
    );
    assert_eq!(
        k("nneg"),
        ColumnKind::Decimal {
            precision: 7,
            scale: 0
        }
    );
    assert_eq!(k("e"), ColumnKind::Utf8);
    assert_eq!(k("by"), ColumnKind::Binary);
    assert_eq!(k("tstz"), ColumnKind::TimestampUtc);
    assert_eq!(k("ts"), ColumnKind::Timestamp);
    assert_eq!(k("dom"), ColumnKind::Int32);
    assert_eq!(k("o"), ColumnKind::Int64);
    assert!(
        schema
            .columns
            .iter()
            .find(|c| c.name == "id")
            .unwrap()
            .not_null
    );
    assert_eq!(
        schema
            .columns
            .iter()
            .find(|c| c.name == "n12")
            .unwrap()
            .source_type,
        "numeric(12,2)"
    );

    let (batches, _) = read_all(&src, &WatermarkRead::new(obj, vec!["id".into()])).await;
    let b = &batches[0];
    assert_eq!(b.num_rows(), 2);
    let col = |n: &str| b.column_by_name(n).unwrap().clone();
    assert_eq!(col("s").data_type(), &DataType::Int16);
    assert_eq!(col("s").as_primitive::<Int16Type>().value(0), -32768);
    assert_eq!(col("i").as_primitive::<Int32Type>().value(0), 2147483647);
    assert!(col("b").as_boolean().value(0));
    assert_eq!(col("r").as_primitive::<Float32Type>().value(0), 1.5);
    assert_eq!(col("d").as_primitive::<Float64Type>().value(0), 0.1);
    let dec = |n: &str, r: usize| col(n).as_primitive::<Decimal128Type>().value(r);
    assert_eq!(dec("n12", 0), 123_456_789_012);
    assert_eq!(dec("n12", 1), -1);
    assert_eq!(
        dec("nfree", 0),
        12_345_678_901_234_567_890_123_456_789_012_345_678
    );
    assert_eq!(dec("nfree", 1), -1);
    assert_eq!(
        dec("n38", 0),
        99_999_999_999_999_999_999_999_999_999_999_999_999
    );
    assert_eq!(dec("n38", 1), -1);
    assert_eq!(dec("nneg", 0), 12_300);
    let s = |n: &str, r: usize| col(n).as_string::<i32>().value(r).to_string();
    assert_eq!(s("tx", 0), "héllo");
    assert_eq!(s("tx", 1), "");
    assert_eq!(s("vc", 0), "abc");
    assert_eq!(s("ch", 0), "ab   ");
    assert_eq!(s("e", 0), "happy");
    assert_eq!(s("u", 0), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
    assert_eq!(s("j", 0), "{\"a\": [1, 2]}");
    assert_eq!(s("jb", 0), "{\"a\": 2, \"b\": 1}");
    assert_eq!(col("by").as_binary::<i32>().value(0), &[0x00, 0xff, 0x10]);
    assert_eq!(col("by").as_binary::<i32>().value(1), &[] as &[u8]);
    assert!(!col("by").is_null(1));
    assert_eq!(col("dt").as_primitive::<Date32Type>().value(0), 19_782); // 2024-02-29
    assert_eq!(col("dt").as_primitive::<Date32Type>().value(1), -719_162); // 0001-01-01
    assert_eq!(
        col("ts").data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, None)
    );
    assert_eq!(
        col("ts")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_706_702_400_123_456
    );
    assert_eq!(
        col("ts")
            .as_primitive::<TimestampMicrosecondType>()
            .value(1),
        0
    );
    assert_eq!(
        col("tstz").data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    );
    assert_eq!(
        col("tstz")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_706_702_400_123_456 - 7_200_000_000
    );
    assert_eq!(
        col("tstz")
            .as_primitive::<TimestampMicrosecondType>()
            .value(1),
        -1
    );
    assert_eq!(col("dom").as_primitive::<Int32Type>().value(0), 7);
    assert_eq!(col("o").as_primitive::<Int64Type>().value(0), 4_000_000_000);
    for n in [
        "s", "i", "b", "r", "d", "nneg", "vc", "ch", "e", "u", "j", "jb", "dom", "o",
    ] {
        assert!(col(n).is_null(1), "{n} row 2 is NULL");
    }
}

#[tokio::test]
async fn numeric_values_that_do_not_fit_are_errors_naming_the_column() {
    let Some(spec) = pg_spec("pg_numeric") else {
        return;
    };
    let admin = pg_admin().await;
    let src = Source::connect(&spec).await.unwrap();
    for (value, what) in [
        ("'NaN'", "NaN"),
        ("'Infinity'", "Infinity"),
        ("0.0000000000000000001", "more than 18 decimal digits"),
        ("123456789012345678901", "DECIMAL(38,18)"),
    ] {
        let t = unique("wm_num");
        admin
            .batch_execute(&format!(
                "CREATE TABLE {t} (id int, amount numeric); INSERT INTO {t} VALUES (1, {value});"
            ))
            .await
            .unwrap();
        let read = WatermarkRead::new(SourceObject::table(&t).unwrap(), vec!["id".into()]);
        let mut r = src.read_watermark(&read).await.unwrap();
        let e = r.next_batch().await.unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, SourceError::Value { ref column, .. } if column == "amount"),
            "{text}"
        );
        assert!(
            text.contains("'amount'") && text.contains(what),
            "{value}: {text}"
        );
    }
    // A declared precision above 38: unsupported at describe time.
    let t = unique("wm_num");
    admin
        .batch_execute(&format!("CREATE TABLE {t} (id int, big numeric(50,2))"))
        .await
        .unwrap();
    let e = src
        .describe(&SourceObject::table(&t).unwrap(), &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'big'") && e.contains("numeric(50,2)") && e.contains("38"),
        "{e}"
    );
}

#[tokio::test]
async fn unsupported_types_name_the_column_and_can_be_excluded() {
    let Some(spec) = pg_spec("pg_unsup") else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("wm_unsup");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id int, tags int4range, span interval, p point, arr int[], ok text);
             INSERT INTO {t} VALUES (1, '[1,2)', '1 day', '(1,2)', '{{1,2}}', 'fine');"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let obj = SourceObject::table(&format!("public.{t}")).unwrap();
    let e = src.describe(&obj, &[]).await.unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(&e, SourceError::UnsupportedType { column, .. } if column == "tags"),
        "{text}"
    );
    assert!(
        text.contains("pg_src") || text.contains("pg_unsup"),
        "names the connection: {text}"
    );
    assert!(text.contains("int4range"), "names the type: {text}");
    assert!(text.contains("exclude the column"), "{text}");
    let e = src.describe(&obj, &["tags".into()]).await.unwrap_err();
    assert!(
        matches!(&e, SourceError::UnsupportedType { column, .. } if column == "span"),
        "{e}"
    );

    let read = WatermarkRead::new(obj.clone(), vec!["id".into()]).exclude(vec![
        "tags".into(),
        "span".into(),
        "p".into(),
    ]);
    let (b, _) = read_all(&src, &read).await;
    assert_eq!(
        b[0].schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>(),
        vec!["id", "arr", "ok"]
    );
    // An array is read as one (it was refused by name before).
    assert_eq!(rows(&b, &["arr"]), vec![vec!["[1,2]".to_string()]]);

    // Naming a column that does not exist is an error saying which columns exist.
    let e = src
        .read_watermark(
            &WatermarkRead::new(obj.clone(), vec!["nope".into()]).exclude(vec![
                "tags".into(),
                "span".into(),
                "p".into(),
            ]),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'nope'") && e.contains("id, tags, span, p, arr, ok"),
        "{e}"
    );
    // Or through a query that casts.
    let q = SourceObject::Query(format!(
        "SELECT id, tags::text AS tags, span::text AS span FROM {t};"
    ));
    let (b, _) = read_all(&src, &WatermarkRead::new(q, vec!["id".into()])).await;
    assert_eq!(
        rows(&b, &["tags", "span"]),
        vec![vec!["[1,2)".to_string(), "1 day".to_string()]]
    );
}

#[tokio::test]
async fn query_sources_and_stored_watermark_mismatch() {
    let Some(spec) = pg_spec("pg_query") else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("wm_q");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {t} (id bigint, k text, v int);
             INSERT INTO {t} SELECT i, 'k' || (i % 3), i * 10 FROM generate_series(1, 10) i;"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let q = SourceObject::Query(format!(
        "SELECT id, k, v * 2 AS v2 FROM {t} WHERE k <> 'k0'"
    ));
    let read = WatermarkRead::new(q, vec!["id".into()]).batch_rows(4);
    let (b, m) = read_all(&src, &read).await;
    assert_eq!(ids(&b), vec![1, 2, 4, 5, 7, 8, 10]);
    assert_eq!(m.clone().unwrap().values, vec![WatermarkValue::Int(10)]);
    let wrong = Watermark {
        columns: vec!["k".into()],
        values: vec![WatermarkValue::Str("x".into())],
    };
    let e = src
        .read_watermark(&read.clone().lower_bound(Some(LowerBound::after(wrong))))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("full refresh"), "{e}");
    // A text watermark.
    let read_k = WatermarkRead::new(
        SourceObject::table(&t).unwrap(),
        vec!["k".into(), "id".into()],
    );
    let after = Watermark {
        columns: vec!["k".into(), "id".into()],
        values: vec![WatermarkValue::Str("k1".into()), WatermarkValue::Int(7)],
    };
    let (b, _) = read_all(&src, &read_k.lower_bound(Some(LowerBound::after(after)))).await;
    assert_eq!(ids(&b), vec![10, 2, 5, 8]);
}

/// Reads a 1M-row table with 6 mixed columns and prints rows/s and the process's peak RSS.
/// Run it explicitly: `cargo test --release -p strata-sources --test pg_watermark -- --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn bench_one_million_rows() {
    let Some(spec) = pg_spec("pg_bench") else {
        return;
    };
    let admin = pg_admin().await;
    let t = unique("bench");
    let n: i64 = std::env::var("STRATA_BENCH_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    admin
        .batch_execute(&format!(
            "CREATE UNLOGGED TABLE {t} (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric(12,2), e float8);
             INSERT INTO {t} SELECT i, (i % 100000)::int, md5(i::text), now() - i * interval '1 second',
                    (i % 1000000) / 100.0, i / 3.0 FROM generate_series(1, {n}) i;
             ANALYZE {t};"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let read = WatermarkRead::new(SourceObject::table(&t).unwrap(), vec!["id".into()]);
    let start = std::time::Instant::now();
    let mut r = src.read_watermark(&read).await.unwrap();
    let mut rows = 0usize;
    let mut batches = 0usize;
    while let Some(b) = r.next_batch().await.unwrap() {
        rows += b.num_rows();
        batches += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or("VmHWM: ?")
        .to_string();
    assert_eq!(rows as i64, n);
    println!(
        "BENCH {rows} rows in {batches} batches: {secs:.2} s, {:.0} rows/s, {hwm} (build: {})",
        rows as f64 / secs,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    admin
        .batch_execute(&format!("DROP TABLE {t}"))
        .await
        .unwrap();
}
