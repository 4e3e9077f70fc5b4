//! Watermark reads from a real MariaDB (run under scripts/services/with-services.sh).

mod common;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use common::*;
use mysql_async::prelude::Queryable;
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
    rows(batches, &["id"])
        .iter()
        .map(|r| r[0].parse().unwrap())
        .collect()
}

#[tokio::test]
async fn first_load_incremental_no_new_rows_and_overlap() {
    let Some(spec) = mysql_spec("my_src") else {
        return;
    };
    let mut admin = mysql_admin().await;
    let t = unique("wm_orders");
    admin
        .query_drop(format!(
            "CREATE TABLE {t} (id BIGINT PRIMARY KEY, updated_at DATETIME(6), name VARCHAR(20))"
        ))
        .await
        .unwrap();
    admin
        .query_drop(format!(
            "INSERT INTO {t} VALUES (1,'2024-01-01 00:01:00','a'),(2,'2024-01-01 00:02:00','b'),
             (3,'2024-01-01 00:03:00.5','c'),(4,'2024-01-01 00:03:00.5','d'),(5,NULL,'no wm')"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let obj = SourceObject::table(&t).unwrap();
    let read = WatermarkRead::new(obj, vec!["updated_at".into(), "id".into()]).batch_rows(3);
    let (b, max) = read_all(&src, &read).await;
    assert_eq!(b.len(), 2);
    assert_eq!(ids(&b), vec![1, 2, 3, 4]);
    let max = max.unwrap();
    let t3 = 1_704_067_380_500_000;
    assert_eq!(
        max.values,
        vec![WatermarkValue::Timestamp(t3), WatermarkValue::Int(4)]
    );
    let stored = Watermark::from_json(&max.to_json()).unwrap();

    admin
        .query_drop(format!(
            "INSERT INTO {t} VALUES (6,'2024-01-01 00:03:00.5','e'),(7,'2024-01-01 00:04:00','f');
             UPDATE {t} SET updated_at = '2024-01-01 00:05:00' WHERE id = 1"
        ))
        .await
        .unwrap();
    let (b, max2) = read_all(
        &src,
        &read
            .clone()
            .lower_bound(Some(LowerBound::after(stored.clone()))),
    )
    .await;
    assert_eq!(ids(&b), vec![6, 7, 1]);
    let (b, none) = read_all(
        &src,
        &read
            .clone()
            .lower_bound(Some(LowerBound::after(max2.unwrap()))),
    )
    .await;
    assert!(b.is_empty() && none.is_none());
    // Overlap: one minute back from the first stored max, inclusive.
    let lb = stored
        .overlap(Overlap::Duration(std::time::Duration::from_secs(60)))
        .unwrap();
    let (b, _) = read_all(&src, &read.clone().lower_bound(Some(lb))).await;
    assert_eq!(ids(&b), vec![3, 4, 6, 7, 1]);
    let (b, _) = read_all(&src, &read.lower_bound(Some(LowerBound::from(stored)))).await;
    assert_eq!(ids(&b), vec![4, 6, 7, 1]);
}

#[tokio::test]
async fn type_mapping_exact_values() {
    let Some(spec) = mysql_spec("my_types") else {
        return;
    };
    let mut admin = mysql_admin().await;
    let t = unique("wm_types");
    admin
        .query_drop(format!(
            "CREATE TABLE {t} (
               id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, su SMALLINT UNSIGNED, mi MEDIUMINT,
               iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED, d DECIMAL(20,4), du DECIMAL(10,0) UNSIGNED,
               f FLOAT, db DOUBLE, dt DATE, dtm DATETIME(6), ts TIMESTAMP(3) NULL, y YEAR,
               j JSON, bl BLOB, vb VARBINARY(10), tx TEXT, e ENUM('x','y'), c CHAR(3))"
        ))
        .await
        .unwrap();
    admin
        .query_drop(format!(
            "INSERT INTO {t} VALUES
             (1, -128, 255, 65535, -8388608, 4294967295, -9223372036854775808, 18446744073709551615,
              1234567890123456.7891, 9999999999, 1.5, 0.1, '2024-02-29', '2024-01-31 12:00:00.123456',
              '2024-01-31 12:00:00.123', 2024, '{{\"a\": [1, 2]}}', x'00ff10', x'0102', 'héllo', 'y', 'ab'),
             (2, NULL, NULL, NULL, NULL, NULL, NULL, 0, -0.0001, 0, NULL, NULL, '1000-01-01', '1970-01-01 00:00:00',
              NULL, NULL, NULL, x'', NULL, '', NULL, NULL)"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let obj = SourceObject::table(&t).unwrap();
    let schema = src.describe(&obj, &[]).await.unwrap();
    let k = |n: &str| {
        schema
            .columns
            .iter()
            .find(|c| c.name == n)
            .unwrap()
            .kind
            .clone()
    };
    assert_eq!(k("ti"), ColumnKind::Int8);
    assert_eq!(k("tu"), ColumnKind::Int16);
    assert_eq!(k("su"), ColumnKind::Int32);
    assert_eq!(k("mi"), ColumnKind::Int32);
    assert_eq!(k("iu"), ColumnKind::Int64);
    assert_eq!(k("bi"), ColumnKind::Int64);
    assert_eq!(
        k("bu"),
        ColumnKind::Decimal {
            precision: 20,
            scale: 0
        }
    );
    assert_eq!(
        k("d"),
        ColumnKind::Decimal {
            precision: 20,
            scale: 4
        }
    );
    assert_eq!(
        k("du"),
        ColumnKind::Decimal {
            precision: 10,
            scale: 0
        }
    );
    assert_eq!(k("f"), ColumnKind::Float32);
    assert_eq!(k("dtm"), ColumnKind::Timestamp);
    assert_eq!(k("ts"), ColumnKind::TimestampUtc);
    assert_eq!(k("y"), ColumnKind::Int16);
    assert_eq!(k("j"), ColumnKind::Utf8, "MariaDB JSON is LONGTEXT");
    assert_eq!(k("bl"), ColumnKind::Binary);
    assert_eq!(k("vb"), ColumnKind::Binary);
    assert_eq!(k("tx"), ColumnKind::Utf8);
    assert_eq!(k("e"), ColumnKind::Utf8);
    assert!(schema.columns[0].not_null);

    let (b, _) = read_all(&src, &WatermarkRead::new(obj, vec!["id".into()])).await;
    let b = &b[0];
    let col = |n: &str| b.column_by_name(n).unwrap().clone();
    assert_eq!(col("ti").as_primitive::<Int8Type>().value(0), -128);
    assert_eq!(col("tu").as_primitive::<Int16Type>().value(0), 255);
    assert_eq!(col("su").as_primitive::<Int32Type>().value(0), 65535);
    assert_eq!(col("mi").as_primitive::<Int32Type>().value(0), -8_388_608);
    assert_eq!(
        col("iu").as_primitive::<Int64Type>().value(0),
        4_294_967_295
    );
    assert_eq!(col("bi").as_primitive::<Int64Type>().value(0), i64::MIN);
    let dec = |n: &str, r: usize| col(n).as_primitive::<Decimal128Type>().value(r);
    assert_eq!(dec("bu", 0), 18_446_744_073_709_551_615);
    assert_eq!(dec("bu", 1), 0);
    assert_eq!(col("bu").data_type(), &DataType::Decimal128(20, 0));
    assert_eq!(dec("d", 0), 12_345_678_901_234_567_891);
    assert_eq!(dec("d", 1), -1);
    assert_eq!(dec("du", 0), 9_999_999_999);
    assert_eq!(col("f").as_primitive::<Float32Type>().value(0), 1.5);
    assert_eq!(col("db").as_primitive::<Float64Type>().value(0), 0.1);
    assert_eq!(col("dt").as_primitive::<Date32Type>().value(0), 19_782);
    assert_eq!(col("dt").as_primitive::<Date32Type>().value(1), -354_285); // 1000-01-01
    assert_eq!(
        col("dtm").data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, None)
    );
    assert_eq!(
        col("dtm")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_706_702_400_123_456
    );
    assert_eq!(
        col("dtm")
            .as_primitive::<TimestampMicrosecondType>()
            .value(1),
        0
    );
    assert_eq!(
        col("ts").data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    );
    assert_eq!(
        col("ts")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_706_702_400_123_000
    );
    assert_eq!(col("y").as_primitive::<Int16Type>().value(0), 2024);
    assert_eq!(col("j").as_string::<i32>().value(0), "{\"a\": [1, 2]}");
    assert_eq!(col("bl").as_binary::<i32>().value(0), &[0x00, 0xff, 0x10]);
    assert_eq!(col("bl").as_binary::<i32>().value(1), &[] as &[u8]);
    assert_eq!(col("vb").as_binary::<i32>().value(0), &[1, 2]);
    assert_eq!(col("tx").as_string::<i32>().value(0), "héllo");
    assert_eq!(col("e").as_string::<i32>().value(0), "y");
    assert_eq!(col("c").as_string::<i32>().value(0), "ab");
    for n in [
        "ti", "tu", "su", "iu", "bi", "f", "db", "ts", "y", "j", "vb", "e", "c",
    ] {
        assert!(col(n).is_null(1), "{n}");
    }

    // Watermarks on unsigned bigint and decimal columns round-trip and bind exactly.
    let (b, m) = read_all(
        &src,
        &WatermarkRead::new(SourceObject::table(&t).unwrap(), vec!["bu".into()]),
    )
    .await;
    assert_eq!(ids(&b), vec![2, 1]);
    let m = Watermark::from_json(&m.unwrap().to_json()).unwrap();
    assert_eq!(
        m.values,
        vec![WatermarkValue::Decimal {
            unscaled: 18_446_744_073_709_551_615,
            scale: 0
        }]
    );
    let (b, _) = read_all(
        &src,
        &WatermarkRead::new(SourceObject::table(&t).unwrap(), vec!["bu".into()])
            .lower_bound(Some(LowerBound::from(m))),
    )
    .await;
    assert_eq!(ids(&b), vec![1]);
    let d_bound = Watermark {
        columns: vec!["d".into()],
        values: vec![WatermarkValue::Decimal {
            unscaled: 12_345_678_901_234_567_890,
            scale: 4,
        }],
    };
    let (b, _) = read_all(
        &src,
        &WatermarkRead::new(SourceObject::table(&t).unwrap(), vec!["d".into()])
            .lower_bound(Some(LowerBound::after(d_bound))),
    )
    .await;
    assert_eq!(ids(&b), vec![1], "compared as DECIMAL, not as a double");
}

#[tokio::test]
async fn unsupported_types_name_the_column_and_can_be_excluded() {
    let Some(spec) = mysql_spec("my_unsup") else {
        return;
    };
    let mut admin = mysql_admin().await;
    let t = unique("wm_unsup");
    admin
        .query_drop(format!(
            "CREATE TABLE {t} (id INT, tm TIME, bt BIT(3), ok INT)"
        ))
        .await
        .unwrap();
    admin
        .query_drop(format!("INSERT INTO {t} VALUES (1, '10:00:00', b'101', 5)"))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let obj = SourceObject::table(&t).unwrap();
    let e = src.describe(&obj, &[]).await.unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(&e, SourceError::UnsupportedType { column, .. } if column == "tm"),
        "{text}"
    );
    assert!(
        text.contains("my_unsup") && text.contains("time") && text.contains("exclude"),
        "{text}"
    );
    let e = src.describe(&obj, &["tm".into()]).await.unwrap_err();
    assert!(
        matches!(&e, SourceError::UnsupportedType { column, .. } if column == "bt"),
        "{e}"
    );
    let (b, _) = read_all(
        &src,
        &WatermarkRead::new(obj, vec!["id".into()]).exclude(vec!["tm".into(), "bt".into()]),
    )
    .await;
    assert_eq!(
        rows(&b, &["id", "ok"]),
        vec![vec!["1".to_string(), "5".to_string()]]
    );
    // A query that casts instead.
    let q = SourceObject::Query(format!("SELECT id, CAST(tm AS CHAR) AS tm FROM {t}"));
    let (b, _) = read_all(&src, &WatermarkRead::new(q, vec!["id".into()])).await;
    assert_eq!(rows(&b, &["tm"]), vec![vec!["10:00:00".to_string()]]);
}

#[tokio::test]
async fn large_table_streams_in_batches() {
    let Some(spec) = mysql_spec("my_big") else {
        return;
    };
    let mut admin = mysql_admin().await;
    let t = unique("wm_big");
    admin
        .query_drop(format!(
            "CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(40));
             INSERT INTO {t} SELECT seq, MD5(seq) FROM seq_1_to_50000"
        ))
        .await
        .unwrap();
    let src = Source::connect(&spec).await.unwrap();
    let read =
        WatermarkRead::new(SourceObject::table(&t).unwrap(), vec!["id".into()]).batch_rows(10_000);
    let mut r = src.read_watermark(&read).await.unwrap();
    let mut n = 0;
    let mut batches = 0;
    while let Some(b) = r.next_batch().await.unwrap() {
        assert!(b.num_rows() <= 10_000);
        n += b.num_rows();
        batches += 1;
    }
    assert_eq!((n, batches), (50_000, 5));
    assert_eq!(
        r.max_watermark().unwrap().values,
        vec![WatermarkValue::Int(50_000)]
    );
    // Dropping a reader half way stops the read.
    let mut r = src.read_watermark(&read).await.unwrap();
    assert!(r.next_batch().await.unwrap().is_some());
    drop(r);
}
