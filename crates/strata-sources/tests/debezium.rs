//! Debezium change files (no database needed).

mod common;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::Array;
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use common::rows;
use strata_sources::*;

fn s(v: &str) -> String {
    v.to_string()
}

/// A PostgreSQL connector event with the JSON converter's embedded schema.
fn pg_event(op: &str, before: &str, after: &str, seq: &str, ts_ms: i64) -> String {
    format!(
        r#"{{"schema":{{"type":"struct","name":"srv.public.items.Envelope","fields":[
  {{"type":"struct","field":"before","optional":true,"fields":[
    {{"type":"int32","optional":false,"field":"id"}},
    {{"type":"string","optional":true,"field":"name"}},
    {{"type":"bytes","optional":true,"field":"price","name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{{"scale":"2","connect.decimal.precision":"10"}}}},
    {{"type":"int64","optional":true,"field":"seen","name":"io.debezium.time.MicroTimestamp","version":1}},
    {{"type":"int32","optional":true,"field":"day","name":"io.debezium.time.Date","version":1}},
    {{"type":"string","optional":true,"field":"at","name":"io.debezium.time.ZonedTimestamp","version":1}},
    {{"type":"bytes","optional":true,"field":"raw"}},
    {{"type":"boolean","optional":true,"field":"ok"}}]}},
  {{"type":"struct","field":"after","optional":true,"fields":[
    {{"type":"int32","optional":false,"field":"id"}},
    {{"type":"string","optional":true,"field":"name"}},
    {{"type":"bytes","optional":true,"field":"price","name":"org.apache.kafka.connect.data.Decimal","version":1,"parameters":{{"scale":"2","connect.decimal.precision":"10"}}}},
    {{"type":"int64","optional":true,"field":"seen","name":"io.debezium.time.MicroTimestamp","version":1}},
    {{"type":"int32","optional":true,"field":"day","name":"io.debezium.time.Date","version":1}},
    {{"type":"string","optional":true,"field":"at","name":"io.debezium.time.ZonedTimestamp","version":1}},
    {{"type":"bytes","optional":true,"field":"raw"}},
    {{"type":"boolean","optional":true,"field":"ok"}}]}},
  {{"type":"struct","field":"source","fields":[]}},
  {{"type":"string","field":"op"}},{{"type":"int64","field":"ts_ms"}}]}},
 "payload":{{"before":{before},"after":{after},"source":{{"connector":"postgresql","db":"shop","schema":"public","table":"items","lsn":999,"sequence":"{seq}","ts_ms":{ts_ms},"txId":7}},"op":"{op}","ts_ms":1}}}}"#
    )
    .replace('\n', "")
}

#[test]
fn postgres_connector_with_embedded_schema_every_op() {
    // price 12.34 = 1234 = 0x04D2 -> "BNI="; -0.01 = -1 = 0xFF -> "/w=="
    let row1 = r#"{"id":1,"name":"a","price":"BNI=","seen":1706702400123456,"day":19782,"at":"2024-01-31T12:00:00.5+02:00","raw":"AP8=","ok":true}"#;
    let row1b = r#"{"id":1,"name":"__debezium_unavailable_value","price":"/w==","seen":null,"day":null,"at":null,"raw":"X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==","ok":false}"#;
    let lines = [
        pg_event("r", "null", row1, r#"[null,\"100\"]"#, 1000),
        pg_event("c", "null", r#"{"id":2,"name":"b","price":null,"seen":null,"day":null,"at":null,"raw":null,"ok":null}"#, r#"[\"200\",\"210\"]"#, 2000),
        pg_event("u", row1, row1b, r#"[\"300\",\"305\"]"#, 3000),
        pg_event("u", "null", row1b, r#"[\"300\",\"306\"]"#, 3000),
        pg_event("d", r#"{"id":2,"name":null,"price":null,"seen":null,"day":null,"at":null,"raw":null,"ok":null}"#, "null", r#"[\"400\",\"401\"]"#, 4000),
        pg_event("t", "null", "null", r#"[\"500\",\"501\"]"#, 5000),
        // A tombstone and an empty line are skipped.
        "null".to_string(),
        String::new(),
    ]
    .join("\n");
    let batches =
        read_debezium(lines.as_bytes(), "items.json", DebeziumOptions::default()).unwrap();
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    let names: Vec<String> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "id",
            "name",
            "price",
            "seen",
            "day",
            "at",
            "raw",
            "ok",
            "_change_type",
            "_commit_lsn",
            "_change_seq",
            "_commit_timestamp",
            "_unchanged_cols"
        ]
    );
    assert_eq!(
        b.column_by_name("price").unwrap().data_type(),
        &DataType::Decimal128(10, 2)
    );
    assert_eq!(
        b.column_by_name("at").unwrap().data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    );
    assert_eq!(
        rows(
            &batches,
            &[
                "id",
                "name",
                "price",
                "_change_type",
                "_commit_lsn",
                "_change_seq",
                "_commit_timestamp",
                "_unchanged_cols"
            ]
        ),
        vec![
            vec![
                s("1"),
                s("a"),
                s("1234e-2"),
                s("snapshot"),
                s("999"),
                s("0"),
                s("1000000"),
                s("NULL")
            ],
            vec![
                s("2"),
                s("b"),
                s("NULL"),
                s("insert"),
                s("200"),
                s("210"),
                s("2000000"),
                s("NULL")
            ],
            vec![
                s("1"),
                s("NULL"),
                s("-1e-2"),
                s("update"),
                s("300"),
                s("305"),
                s("3000000"),
                s("[name,raw]")
            ],
            vec![
                s("1"),
                s("NULL"),
                s("-1e-2"),
                s("update"),
                s("300"),
                s("306"),
                s("3000000"),
                s("[name,raw]")
            ],
            vec![
                s("2"),
                s("NULL"),
                s("NULL"),
                s("delete"),
                s("400"),
                s("401"),
                s("4000000"),
                s("NULL")
            ],
            vec![
                s("NULL"),
                s("NULL"),
                s("NULL"),
                s("truncate"),
                s("500"),
                s("501"),
                s("5000000"),
                s("NULL")
            ],
        ]
    );
    let col = |n: &str| b.column_by_name(n).unwrap().clone();
    assert_eq!(
        col("seen")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_706_702_400_123_456
    );
    assert_eq!(col("day").as_primitive::<Date32Type>().value(0), 19_782);
    assert_eq!(
        col("at")
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_706_702_400_500_000 - 7_200_000_000
    );
    assert_eq!(col("raw").as_binary::<i32>().value(0), &[0x00, 0xff]);
    assert!(col("raw").is_null(2));
    assert!(col("ok").as_boolean().value(0));
}

#[test]
fn mysql_connector_bare_payload_with_a_given_schema() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("qty", DataType::Decimal128(20, 0), true),
        Field::new("amount", DataType::Decimal128(10, 2), true),
        Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("note", DataType::Utf8, true),
    ]));
    let text = [
        r#"{"before":null,"after":{"id":1,"qty":18446744073709551615,"amount":"12.50","at":1706702400123,"note":"x"},"source":{"connector":"mysql","db":"shop","table":"orders","file":"mysql-bin.000003","pos":4015,"row":0,"ts_ms":1615928467000},"op":"c","ts_ms":1615928467236}"#,
        r#"{"before":null,"after":{"id":2,"qty":1,"amount":7.5,"at":null,"note":null},"source":{"connector":"mysql","db":"shop","table":"orders","file":"mysql-bin.000003","pos":4015,"row":1,"ts_ms":1615928467000},"op":"c","ts_ms":1615928467236}"#,
        r#"{"before":{"id":1,"qty":1,"amount":"12.50","at":1706702400123,"note":"x"},"after":{"id":1,"qty":2,"amount":"BNI=","at":1706702400123,"note":"y"},"source":{"connector":"mysql","db":"shop","table":"orders","file":"mysql-bin.000010","pos":120,"row":0,"ts_ms":1615928468000},"op":"u","ts_ms":1615928468236}"#,
        r#"{"before":{"id":2,"qty":1,"amount":7.5,"at":null,"note":null},"after":null,"source":{"connector":"mysql","db":"shop","table":"orders","file":"mysql-bin.000010","pos":500,"row":0,"ts_ms":1615928469000},"op":"d","ts_ms":1615928469236}"#,
    ]
    .join("\n");
    let opts = DebeziumOptions {
        schema: Some(schema),
        integer_timestamp_unit: TimeUnit::Millisecond,
        batch_rows: 3,
        ..Default::default()
    };
    let mut r = DebeziumReader::new(text.as_bytes(), "orders.json", opts);
    let mut batches = vec![];
    while let Some(b) = r.next_batch().unwrap() {
        batches.push(b);
    }
    assert_eq!(batches.len(), 2, "3 rows per batch");
    assert_eq!(r.source_table(), Some("shop.orders"));
    let lsn = |file: i64, pos: i64| ((file << 32) | pos).to_string();
    assert_eq!(
        rows(
            &batches,
            &[
                "id",
                "qty",
                "amount",
                "at",
                "note",
                "_change_type",
                "_commit_lsn",
                "_change_seq"
            ]
        ),
        vec![
            vec![
                s("1"),
                s("18446744073709551615e-0"),
                s("1250e-2"),
                s("1706702400123000"),
                s("x"),
                s("insert"),
                lsn(3, 4015),
                s("0")
            ],
            vec![
                s("2"),
                s("1e-0"),
                s("750e-2"),
                s("NULL"),
                s("NULL"),
                s("insert"),
                lsn(3, 4015),
                s("1")
            ],
            vec![
                s("1"),
                s("2e-0"),
                s("1234e-2"),
                s("1706702400123000"),
                s("y"),
                s("update"),
                lsn(10, 120),
                s("0")
            ],
            vec![
                s("2"),
                s("1e-0"),
                s("750e-2"),
                s("NULL"),
                s("NULL"),
                s("delete"),
                lsn(10, 500),
                s("0")
            ],
        ]
    );
    // Binlog order is the order of (_commit_lsn, _change_seq) across files.
    assert!(lsn(10, 120).parse::<i64>().unwrap() > lsn(3, 4015).parse::<i64>().unwrap());
    let ts = rows(&batches, &["_commit_timestamp"]);
    assert_eq!(ts[0][0], "1615928467000000");
    assert_eq!(
        batches[0]
            .schema()
            .field_with_name("_commit_timestamp")
            .unwrap()
            .data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    );
    let _ = batches[0].column(0).as_primitive::<Int64Type>();
}

#[test]
fn errors_name_the_file_line() {
    let ok = r#"{"before":null,"after":{"id":1},"source":{"lsn":5},"op":"c"}"#;
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, true)]));
    let opts = || DebeziumOptions {
        schema: Some(schema.clone()),
        ..Default::default()
    };
    let cases = [
        (format!("{ok}\n\n{{not json"), 3, "not JSON"),
        (
            format!("{ok}\n{}", ok.replace("\"c\"", "\"x\"")),
            2,
            "unknown op 'x'",
        ),
        (
            format!("{ok}\n{}", ok.replace("\"id\":1", "\"id\":\"abc\"")),
            2,
            "column 'id'",
        ),
        (
            format!("{ok}\n{}", ok.replace("\"id\":1", "\"id\":99999999999")),
            2,
            "out of range",
        ),
        (
            ok.replace(r#""source":{"lsn":5},"#, ""),
            1,
            "no source position",
        ),
        (
            format!(
                "{ok}\n{}",
                ok.replace(r#"{"lsn":5}"#, r#"{"lsn":6,"schema":"a","table":"x"}"#)
                    + "\n"
                    + &ok.replace(r#"{"lsn":5}"#, r#"{"lsn":7,"schema":"a","table":"y"}"#)
            ),
            3,
            "one table",
        ),
    ];
    for (text, line, what) in cases {
        let e = read_debezium(text.as_bytes(), "cdc/part-1.json", opts()).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(&e, SourceError::Debezium { line: l, .. } if *l == line),
            "{msg}"
        );
        assert!(
            msg.starts_with(&format!("cdc/part-1.json:{line}:")) && msg.contains(what),
            "{msg}"
        );
    }
    // No schema anywhere.
    let e = read_debezium(ok.as_bytes(), "f.json", DebeziumOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("f.json:1") && e.contains("no embedded schema"),
        "{e}"
    );
    // An embedded schema with a type strata cannot map names the column; excluding it works.
    let ev = r#"{"schema":{"type":"struct","fields":[{"type":"struct","field":"after","fields":[{"type":"int32","field":"id"},{"type":"int64","field":"t","name":"io.debezium.time.MicroTime"}]}]},"payload":{"before":null,"after":{"id":1,"t":5},"source":{"lsn":1},"op":"c"}}"#;
    let e = read_debezium(ev.as_bytes(), "f.json", DebeziumOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("'t'") && e.contains("time-of-day"), "{e}");
    let b = read_debezium(
        ev.as_bytes(),
        "f.json",
        DebeziumOptions {
            exclude_columns: vec!["t".into()],
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(rows(&b, &["id"]), vec![vec![s("1")]]);
}

#[test]
fn a_column_added_later_in_the_file_widens_the_batch() {
    let ev = |fields: &str, after: &str, lsn: i64| {
        format!(
            r#"{{"schema":{{"type":"struct","fields":[{{"type":"struct","field":"after","fields":[{fields}]}}]}},"payload":{{"before":null,"after":{after},"source":{{"lsn":{lsn}}},"op":"c"}}}}"#
        )
    };
    let f1 = r#"{"type":"int32","field":"id"}"#;
    let f2 = r#"{"type":"int32","field":"id"},{"type":"string","field":"extra"}"#;
    let text = [
        ev(f1, r#"{"id":1}"#, 1),
        ev(f2, r#"{"id":2,"extra":"e"}"#, 2),
    ]
    .join("\n");
    let b = read_debezium(text.as_bytes(), "f.json", DebeziumOptions::default()).unwrap();
    assert_eq!(
        rows(&b, &["id", "extra"]),
        vec![vec![s("1"), s("NULL")], vec![s("2"), s("e")]]
    );
}

/// Every double round-trips bit for bit (a serde_json without `float_roundtrip` read about
/// one random double in six off by one in the last digit): 20,000 random finite doubles
/// over the whole exponent range, in bare payloads with a declared schema, written as
/// Rust's shortest round-trip text.
#[test]
fn doubles_are_read_exactly() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("x", DataType::Float64, true),
    ]));
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut values = Vec::new();
    while values.len() < 20_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let v = f64::from_bits(seed);
        if v.is_finite() {
            values.push(v);
        }
    }
    // The issue's example, and doubles of the usual [0, 1) shape.
    values.push(0.189_800_665_963_260_06);
    values.extend((1..1000u32).map(|i| f64::from(i) / 997.0 + 1e-17 * f64::from(i)));
    let text: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                r#"{{"before":null,"after":{{"id":{i},"x":{v:?}}},"source":{{"connector":"mysql","db":"d","table":"t","file":"mysql-bin.000001","pos":4,"row":{i},"ts_ms":1}},"op":"c","ts_ms":1}}"#
            )
        })
        .collect();
    let opts = DebeziumOptions {
        schema: Some(schema),
        ..Default::default()
    };
    let batches = read_debezium(text.join("\n").as_bytes(), "doubles.json", opts).unwrap();
    let mut got = Vec::new();
    for b in &batches {
        let x = b.column_by_name("x").unwrap().as_primitive::<Float64Type>();
        got.extend((0..x.len()).map(|i| x.value(i)));
    }
    assert_eq!(got.len(), values.len());
    let wrong: Vec<(f64, f64)> = values
        .iter()
        .zip(&got)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .map(|(a, b)| (*a, *b))
        .take(5)
        .collect();
    assert!(wrong.is_empty(), "doubles changed: {wrong:?}");
}
