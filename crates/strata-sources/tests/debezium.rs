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

/// An Arrow schema from a SQL column list, as `schema => '...'` declares it.
fn declared(ddl: &str) -> Arc<Schema> {
    let cols = strata_sql::parse_ddl_schema(ddl).unwrap();
    Arc::new(Schema::new(
        cols.into_iter()
            .map(|c| Field::new(c.name, c.data_type, c.nullable))
            .collect::<Vec<_>>(),
    ))
}

/// `batch`'s columns named in `ddl` have the types `ddl` declares.
fn assert_types(batch: &arrow_array::RecordBatch, ddl: &str) {
    let schema = batch.schema();
    for f in declared(ddl).fields() {
        let got = schema.field_with_name(f.name()).unwrap().data_type();
        assert_eq!(got, f.data_type(), "{}", f.name());
    }
}

const NESTED_DDL: &str = "id INT, addr STRUCT<city: STRING, zip: STRING, \
     geo: STRUCT<lat: DOUBLE, lon: DOUBLE>>, tags ARRAY<STRING>, attrs MAP<STRING, INT>";

/// A bare PostgreSQL connector payload.
fn bare(op: &str, after: &str, lsn: i64) -> String {
    let (before, after) = if op == "d" {
        (after, "null")
    } else {
        ("null", after)
    };
    format!(
        r#"{{"before":{before},"after":{after},"source":{{"connector":"postgresql","lsn":{lsn}}},"op":"{op}","ts_ms":1}}"#
    )
}

#[test]
fn declared_structs_arrays_and_maps_with_nulls_at_every_level() {
    let text = [
        bare(
            "r",
            r#"{"id":1,"addr":{"city":"Oslo","zip":"0150","geo":{"lat":59.9,"lon":10.75}},"tags":["a","b"],"attrs":{"x":1,"y":null}}"#,
            1,
        ),
        // A NULL struct, a NULL element, a NULL map.
        bare("c", r#"{"id":2,"addr":null,"tags":[null,"c"],"attrs":null}"#, 2),
        // A NULL field, a field left out, a NULL nested struct, empty array and map.
        bare(
            "c",
            r#"{"id":3,"addr":{"city":null,"geo":null},"tags":[],"attrs":{}}"#,
            3,
        ),
        // A map as [key, value] pairs (a non-string key's form), a NULL array, a column
        // left out.
        bare(
            "u",
            r#"{"id":1,"addr":{"city":"Bergen","zip":"5003","geo":{"lat":null,"lon":-1.5}},"tags":null,"attrs":[["z",3],["w",null]]}"#,
            4,
        ),
        bare("d", r#"{"id":2}"#, 5),
    ]
    .join("\n");
    let opts = DebeziumOptions {
        schema: Some(declared(NESTED_DDL)),
        ..Default::default()
    };
    let batches = read_debezium(text.as_bytes(), "people.json", opts).unwrap();
    // The columns have the declared types, as Delta stores them.
    assert_types(&batches[0], NESTED_DDL);
    assert_eq!(
        rows(&batches, &["id", "addr", "tags", "attrs", "_change_type"]),
        vec![
            vec![
                s("1"),
                s("{city: Oslo, zip: 0150, geo: {lat: 59.9, lon: 10.75}}"),
                s("[a,b]"),
                s("{x: 1, y: NULL}"),
                s("snapshot")
            ],
            vec![s("2"), s("NULL"), s("[NULL,c]"), s("NULL"), s("insert")],
            vec![
                s("3"),
                s("{city: NULL, zip: NULL, geo: NULL}"),
                s("[]"),
                s("{}"),
                s("insert")
            ],
            vec![
                s("1"),
                s("{city: Bergen, zip: 5003, geo: {lat: NULL, lon: -1.5}}"),
                s("NULL"),
                s("{z: 3, w: NULL}"),
                s("update")
            ],
            vec![s("2"), s("NULL"), s("NULL"), s("NULL"), s("delete")],
        ]
    );
}

/// Kafka Connect's `struct`, `array` and `map` schemas (with logical types inside) give the
/// types the same SQL declaration gives.
#[test]
fn embedded_struct_array_and_map_schemas() {
    let fields = r#"[
      {"type":"int32","optional":false,"field":"id"},
      {"type":"struct","optional":true,"name":"srv.public.address","field":"addr","fields":[
        {"type":"string","optional":true,"field":"city"},
        {"type":"bytes","optional":true,"field":"rent","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"8"}},
        {"type":"struct","optional":true,"field":"geo","fields":[{"type":"double","optional":true,"field":"lat"}]}]},
      {"type":"array","optional":true,"field":"seen","items":{"type":"int64","optional":true,"name":"io.debezium.time.MicroTimestamp"}},
      {"type":"map","optional":true,"field":"attrs","keys":{"type":"string","optional":false},"values":{"type":"array","optional":true,"items":{"type":"int16","optional":true}}},
      {"type":"map","optional":true,"field":"by_day","keys":{"type":"int32","optional":false,"name":"io.debezium.time.Date"},"values":{"type":"string","optional":true}}]"#;
    let event = |op: &str, after: &str, lsn: i64| {
        format!(
            r#"{{"schema":{{"type":"struct","fields":[{{"type":"struct","field":"after","optional":true,"fields":{fields}}}]}},"payload":{{"before":null,"after":{after},"source":{{"lsn":{lsn}}},"op":"{op}"}}}}"#
        )
        .replace('\n', "")
    };
    // rent 12.34 = 1234 = 0x04D2 -> "BNI="
    let text = [
        event(
            "c",
            r#"{"id":1,"addr":{"city":"Oslo","rent":"BNI=","geo":{"lat":0.18980066596326006}},"seen":[1706702400123456,null],"attrs":{"k":[1,null,-2]},"by_day":[[19782,"a"],[0,null]]}"#,
            1,
        ),
        event(
            "c",
            r#"{"id":2,"addr":{"city":null,"rent":null,"geo":null},"seen":[],"attrs":{"k":null},"by_day":null}"#,
            2,
        ),
    ]
    .join("\n");
    let batches = read_debezium(text.as_bytes(), "f.json", DebeziumOptions::default()).unwrap();
    assert_types(
        &batches[0],
        "id INT, addr STRUCT<city: STRING, rent: DECIMAL(8,2), geo: STRUCT<lat: DOUBLE>>, \
         seen ARRAY<TIMESTAMP_NTZ>, attrs MAP<STRING, ARRAY<SMALLINT>>, by_day MAP<DATE, STRING>",
    );
    assert_eq!(
        rows(&batches, &["id", "addr", "seen", "attrs", "by_day"]),
        vec![
            vec![
                s("1"),
                s("{city: Oslo, rent: 1234e-2, geo: {lat: 0.18980066596326006}}"),
                s("[1706702400123456,NULL]"),
                s("{k: [1,NULL,-2]}"),
                s("{19782: a, 0: NULL}")
            ],
            vec![
                s("2"),
                s("{city: NULL, rent: NULL, geo: NULL}"),
                s("[]"),
                s("{k: NULL}"),
                s("NULL")
            ],
        ]
    );
    // An unsupported type inside a struct names its path; excluding the column works.
    let bad = event("c", r#"{"id":1}"#, 1).replace(
        r#"{"type":"double","optional":true,"field":"lat"}"#,
        r#"{"type":"int64","optional":true,"field":"t","name":"io.debezium.time.MicroTime"}"#,
    );
    let e = read_debezium(bad.as_bytes(), "f.json", DebeziumOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("column 'addr.geo.t'") && e.contains("time-of-day"),
        "{e}"
    );
    let b = read_debezium(
        bad.as_bytes(),
        "f.json",
        DebeziumOptions {
            exclude_columns: vec!["addr".into()],
            ..Default::default()
        },
    )
    .unwrap();
    assert!(b[0].schema().field_with_name("addr").is_err());
}

#[test]
fn nested_values_that_do_not_fit_name_file_line_and_path() {
    let ddl = "id INT, addr STRUCT<city: STRING, zip: INT, id: INT NOT NULL>, \
               tags ARRAY<TINYINT>, attrs MAP<STRING, DECIMAL(4,2)>, m MAP<INT, STRING>";
    let ok = r#"{"id":1,"addr":{"city":"a","zip":1,"id":7},"tags":[1],"attrs":{"k":"1.5"},"m":{"1":"x"}}"#;
    let cases = [
        (
            r#""zip":1"#,
            r#""zip":"abc""#,
            "column 'addr.zip': JSON value \"abc\" is not a valid INT",
        ),
        (
            r#""zip":1"#,
            r#""zip":4294967296"#,
            "column 'addr.zip': value 4294967296 is out of range for INT",
        ),
        (
            r#""tags":[1]"#,
            r#""tags":[1,2,300]"#,
            "column 'tags[2]': value 300 is out of range for TINYINT",
        ),
        (
            r#""tags":[1]"#,
            r#""tags":{"a":1}"#,
            "column 'tags': JSON value {\"a\":1} is not an ARRAY",
        ),
        (
            r#""k":"1.5""#,
            r#""k":"123.45""#,
            "column 'attrs['k']': value with 5 digits exceeds DECIMAL precision 4",
        ),
        (
            r#""k":"1.5""#,
            r#""k":"0.125""#,
            "column 'attrs['k']': decimal has more than 2 decimals",
        ),
        (
            r#""m":{"1":"x"}"#,
            r#""m":{"one":"x"}"#,
            "column 'm': JSON value \"one\" is not a valid INT",
        ),
        (
            r#""m":{"1":"x"}"#,
            r#""m":[[null,"x"]]"#,
            "column 'm': a MAP key is NULL",
        ),
        (
            r#""m":{"1":"x"}"#,
            r#""m":[[1]]"#,
            "column 'm': map entry [1] is not a [key, value] pair",
        ),
        (
            r#""addr":{"#,
            r#""addr":5,"x":{"#,
            "column 'addr': JSON value 5 is not a STRUCT",
        ),
        (
            r#","id":7"#,
            "",
            "column 'addr.id': NULL in a field declared NOT NULL",
        ),
    ];
    for (from, to, want) in cases {
        let bad = ok.replacen(from, to, 1);
        assert_ne!(bad, ok, "{from}");
        let text = [bare("c", ok, 1), bare("c", &bad, 2)].join("\n");
        let opts = DebeziumOptions {
            schema: Some(declared(ddl)),
            ..Default::default()
        };
        let e = read_debezium(text.as_bytes(), "cdc/part-7.json", opts).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(&e, SourceError::Debezium { line: 2, .. })
                && msg.starts_with("cdc/part-7.json:2:")
                && msg.contains(want),
            "{msg}\nwanted: {want}"
        );
    }
}

/// Doubles nested in structs, arrays and maps are read bit for bit too.
#[test]
fn nested_doubles_are_read_exactly() {
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut values = Vec::new();
    while values.len() < 3_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let v = f64::from_bits(seed);
        if v.is_finite() {
            values.push(v);
        }
    }
    let text: Vec<String> = values
        .chunks(3)
        .enumerate()
        .map(|(i, v)| {
            bare(
                "c",
                &format!(
                    r#"{{"id":{i},"p":{{"x":{:?}}},"xs":[{:?}],"m":{{"k":{:?}}}}}"#,
                    v[0], v[1], v[2]
                ),
                i as i64,
            )
        })
        .collect();
    let opts = DebeziumOptions {
        schema: Some(declared(
            "id INT, p STRUCT<x: DOUBLE>, xs ARRAY<DOUBLE>, m MAP<STRING, DOUBLE>",
        )),
        ..Default::default()
    };
    let batches = read_debezium(text.join("\n").as_bytes(), "d.json", opts).unwrap();
    let mut got = Vec::new();
    for b in &batches {
        let p = b.column_by_name("p").unwrap().as_struct();
        let xs = b.column_by_name("xs").unwrap().as_list::<i32>();
        let m = b.column_by_name("m").unwrap().as_map();
        for r in 0..b.num_rows() {
            got.push(p.column(0).as_primitive::<Float64Type>().value(r));
            got.push(xs.value(r).as_primitive::<Float64Type>().value(0));
            got.push(m.value(r).column(1).as_primitive::<Float64Type>().value(0));
        }
    }
    assert_eq!(got.len(), values.len());
    assert!(values
        .iter()
        .zip(&got)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// An unchanged TOASTed array (PostgreSQL: an array holding only the placeholder) is NULL
/// and named in `_unchanged_cols`, like a scalar; a column's type change names SQL types.
#[test]
fn unavailable_nested_values_and_type_changes() {
    let opts = || DebeziumOptions {
        schema: Some(declared("id INT, tags ARRAY<STRING>, a STRUCT<x: INT>")),
        ..Default::default()
    };
    let text = [
        bare("c", r#"{"id":1,"tags":["x"],"a":{"x":1}}"#, 1),
        bare(
            "u",
            r#"{"id":1,"tags":["__debezium_unavailable_value"],"a":"__debezium_unavailable_value"}"#,
            2,
        ),
    ]
    .join("\n");
    let b = read_debezium(text.as_bytes(), "t.json", opts()).unwrap();
    assert_eq!(
        rows(&b, &["tags", "a", "_unchanged_cols"]),
        vec![
            vec![s("[x]"), s("{x: 1}"), s("NULL")],
            vec![s("NULL"), s("NULL"), s("[tags,a]")],
        ]
    );
    let ev = |ty: &str, v: &str, lsn: i64| {
        format!(
            r#"{{"schema":{{"type":"struct","fields":[{{"type":"struct","field":"after","fields":[{{"type":"int32","field":"id"}},{{"field":"a",{ty}}}]}}]}},"payload":{{"before":null,"after":{{"id":1,"a":{v}}},"source":{{"lsn":{lsn}}},"op":"c"}}}}"#
        )
    };
    let text = [
        ev(r#""type":"array","items":{"type":"int32"}"#, "[1]", 1),
        ev(r#""type":"array","items":{"type":"string"}"#, r#"["1"]"#, 2),
    ]
    .join("\n");
    let e = read_debezium(text.as_bytes(), "t.json", DebeziumOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("column 'a' changed type from ARRAY<INT> to ARRAY<STRING>"),
        "{e}"
    );
}
