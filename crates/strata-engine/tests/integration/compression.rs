//! `strata.parquet.compression` chooses the codec of every Parquet file strata writes into a
//! table (appends, rewrites, change data files); strata's own event stores use LZ4_RAW (their
//! integer keys packed as deltas, without a codec); an
//! unknown codec is refused before anything runs. `strata.parquet.plainColumns` keeps
//! columns out of dictionary encoding (by default a target's key and timeline columns);
//! `strata.parquet.uncompressedColumns` writes columns without the table's codec.

use crate::common;

use deltalake::parquet::basic::Compression;
use deltalake::parquet::file::metadata::ColumnChunkMetaData;
use deltalake::parquet::file::reader::{FileReader, SerializedFileReader};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Calls `each` with every column chunk of every Parquet file under `dir` (recursively,
/// change data files included).
fn each_chunk(dir: &Path, mut each: impl FnMut(&ColumnChunkMetaData)) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                let reader = SerializedFileReader::new(std::fs::File::open(&p).expect("open"))
                    .expect("parquet");
                for rg in reader.metadata().row_groups() {
                    rg.columns().iter().for_each(&mut each);
                }
            }
        }
    }
}

/// The codecs of every column chunk of every Parquet file under `dir`.
fn codecs(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    each_chunk(dir, |c| {
        out.insert(codec_name(c));
    });
    out
}

/// The codec of a column chunk, without its level.
fn codec_name(c: &ColumnChunkMetaData) -> String {
    match c.compression() {
        Compression::ZSTD(_) => "ZSTD".to_string(),
        other => format!("{other:?}"),
    }
}

/// For each column of the Parquet files under `dir`: whether any of its chunks is
/// dictionary-encoded.
fn dictionary_columns(dir: &Path) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    each_chunk(dir, |c| {
        *out.entry(c.column_path().string()).or_insert(false) |=
            c.dictionary_page_offset().is_some();
    });
    out
}

/// Two runs of `pipeline`: two keys inserted, then one of them updated (the targets' files
/// are rewritten and change data files written).
async fn insert_then_update(data: &Path, pipeline: &Path, wh: &strata_engine::Warehouse) {
    std::fs::write(
        data.join("001.json"),
        "{\"id\":1,\"name\":\"a\",\"seq\":1}\n{\"id\":2,\"name\":\"b\",\"seq\":1}\n",
    )
    .expect("write");
    strata_engine::run_pipeline_file(pipeline, wh)
        .await
        .expect("run 1");
    std::fs::write(
        data.join("002.json"),
        "{\"id\":1,\"name\":\"c\",\"seq\":2}\n",
    )
    .expect("write");
    let report = strata_engine::run_pipeline_file(pipeline, wh)
        .await
        .expect("run 2");
    assert!(report.flows.iter().all(|f| f.keys_changed == 1));
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const PIPELINE: &str = "\
CREATE OR REFRESH STREAMING TABLE raw
TBLPROPERTIES ('strata.parquet.compression' = 'zstd')
AS SELECT * FROM STREAM read_files('data', format => 'json',
  schema => 'id BIGINT, name STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE fast
TBLPROPERTIES ('strata.parquet.compression' = 'LZ4_RAW');
CREATE FLOW f1 AS AUTO CDC INTO fast FROM STREAM(raw) KEYS (id) SEQUENCE BY seq
COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;
CREATE OR REFRESH STREAMING TABLE plain;
CREATE FLOW f2 AS AUTO CDC INTO plain FROM STREAM(raw) KEYS (id) SEQUENCE BY seq
COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;
";

#[tokio::test]
async fn every_file_of_a_table_has_its_codec() {
    let (dir, pipeline, wh_dir, wh) = common::project(PIPELINE);
    insert_then_update(&dir.path().join("data"), &pipeline, &wh).await;
    assert!(wh_dir.join("default/fast/_change_data").is_dir());

    assert_eq!(codecs(&wh_dir.join("default/raw")), set(&["ZSTD"]));
    assert_eq!(codecs(&wh_dir.join("default/fast")), set(&["LZ4_RAW"]));
    assert_eq!(codecs(&wh_dir.join("default/plain")), set(&["SNAPPY"]));
    assert_eq!(
        codecs(&wh_dir.join("_strata")),
        set(&["LZ4_RAW", "SNAPPY", "UNCOMPRESSED"])
    );
    // Event stores are LZ4_RAW, but for their integer key, packed as deltas without a
    // codec (`strata.parquet.deltaColumns`).
    let mut store = BTreeMap::<String, BTreeSet<String>>::new();
    each_chunk(&wh_dir.join("_strata/default/plain"), |c| {
        store
            .entry(c.column_path().string())
            .or_default()
            .insert(codec_name(c));
    });
    assert_eq!(store.remove("id"), Some(set(&["UNCOMPRESSED"])));
    assert!(
        store.values().all(|c| *c == set(&["LZ4_RAW"])),
        "event stores are LZ4_RAW: {store:?}"
    );

    let both = "\
+----+------+------+
| id | name | open |
+----+------+------+
| 1  | a    | 0    |
| 1  | c    | 1    |
| 2  | b    | 1    |
+----+------+------+";
    for t in ["fast", "plain"] {
        let sql = format!(
            "SELECT id, name, CAST(__END_AT IS NULL AS INT) AS open FROM {t} ORDER BY id, name"
        );
        assert_eq!(common::query_text(&wh, &sql).await, both, "{t}");
    }
}

/// The codecs of each column's chunks in the Parquet files under `dir`.
fn column_codecs(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    each_chunk(dir, |c| {
        out.entry(c.column_path().string())
            .or_default()
            .insert(codec_name(c));
    });
    out
}

/// `strata.parquet.uncompressedColumns` (any case, names the table lacks ignored) writes
/// those columns without the table's codec in every file of the table, rewrites and change
/// data files included; the others keep it.
#[tokio::test]
async fn uncompressed_columns_skip_the_codec() {
    let pipeline_sql = "\
CREATE OR REFRESH STREAMING TABLE raw
TBLPROPERTIES ('strata.parquet.uncompressedColumns' = 'NAME, nosuch')
AS SELECT * FROM STREAM read_files('data', format => 'json',
  schema => 'id BIGINT, name STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE hist
TBLPROPERTIES ('strata.parquet.compression' = 'zstd',
               'strata.parquet.uncompressedColumns' = 'name');
CREATE FLOW f1 AS AUTO CDC INTO hist FROM STREAM(raw) KEYS (id) SEQUENCE BY seq
COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;
";
    let (dir, pipeline, wh_dir, wh) = common::project(pipeline_sql);
    insert_then_update(&dir.path().join("data"), &pipeline, &wh).await;
    assert!(wh_dir.join("default/hist/_change_data").is_dir());

    let raw = column_codecs(&wh_dir.join("default/raw"));
    assert_eq!(raw["name"], set(&["UNCOMPRESSED"]));
    assert_eq!(
        (&raw["id"], &raw["seq"]),
        (&set(&["SNAPPY"]), &set(&["SNAPPY"]))
    );
    let hist = column_codecs(&wh_dir.join("default/hist"));
    assert_eq!(hist["name"], set(&["UNCOMPRESSED"]), "{hist:?}");
    assert_eq!(hist["id"], set(&["ZSTD"]));
    assert_eq!(
        hist["_change_type"],
        set(&["ZSTD"]),
        "change data files too"
    );
    assert_eq!(
        common::query_text(&wh, "SELECT id, name FROM hist ORDER BY id, name").await,
        "\
+----+------+
| id | name |
+----+------+
| 1  | a    |
| 1  | c    |
| 2  | b    |
+----+------+"
    );
}

#[tokio::test]
async fn an_unknown_codec_is_refused_before_anything_runs() {
    let (dir, pipeline, wh_dir, wh) = common::project(&PIPELINE.replace(
        "'strata.parquet.compression' = 'LZ4_RAW'",
        "'strata.parquet.compression' = 'lz5'",
    ));
    std::fs::write(
        dir.path().join("data/001.json"),
        "{\"id\":1,\"name\":\"a\",\"seq\":1}\n",
    )
    .expect("write");
    let err = strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("table default.fast: strata.parquet.compression = 'lz5' is not a known codec"),
        "{err}"
    );
    assert!(!wh_dir.join("default/raw").exists(), "nothing ran");
}

/// The event store of a flow with one integer key is written sorted by key in small pages
/// (what lets a later batch read its keys through the page index), whatever order the
/// events arrive in.
#[tokio::test]
async fn an_event_store_is_sorted_by_key_in_small_pages() {
    use deltalake::arrow::array::Int64Array;
    use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let (dir, pipeline, wh_dir, wh) = common::project(PIPELINE);
    let data = dir.path().join("data");
    let ids = [7, 3, 9, 1, 3, 8, 2, 7, 5];
    let lines: String = ids
        .iter()
        .enumerate()
        .map(|(seq, id)| format!("{{\"id\":{id},\"name\":\"n{seq}\",\"seq\":{seq}}}\n"))
        .collect();
    std::fs::write(data.join("001.json"), lines).expect("write");
    strata_engine::run_pipeline_file(&pipeline, &wh)
        .await
        .expect("run");

    let store = wh_dir.join("_strata/default/plain/events");
    let log =
        std::fs::read_to_string(store.join("_delta_log/00000000000000000000.json")).expect("log");
    assert!(log.contains(r#""strata.parquet.pageRows":"512""#), "{log}");
    let mut stored: Vec<i64> = Vec::new();
    for e in std::fs::read_dir(&store).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "parquet") {
            let file = std::fs::File::open(&p).expect("open");
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .expect("parquet")
                .build()
                .expect("reader");
            for b in reader {
                let b = b.expect("batch");
                let id = b.column_by_name("id").expect("id");
                let id = id.as_any().downcast_ref::<Int64Array>().expect("int64");
                stored.extend(id.values().iter());
            }
        }
    }
    let mut want: Vec<i64> = ids.to_vec();
    want.sort();
    assert_eq!(stored, want, "one file, in key order");
}

/// A target strata creates writes its key and timeline columns without a dictionary (their
/// values are nearly all distinct) and the others with one, in every file it writes;
/// `strata.parquet.plainColumns` set by the user replaces that choice.
#[tokio::test]
async fn key_and_timeline_columns_are_written_plain() {
    let pipeline_sql = "\
CREATE OR REFRESH STREAMING TABLE raw
AS SELECT * FROM STREAM read_files('data', format => 'json',
  schema => 'id BIGINT, name STRING, seq BIGINT');
CREATE OR REFRESH STREAMING TABLE hist;
CREATE FLOW f1 AS AUTO CDC INTO hist FROM STREAM(raw) KEYS (id) SEQUENCE BY seq
COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;
CREATE OR REFRESH STREAMING TABLE chosen
TBLPROPERTIES ('strata.parquet.plainColumns' = 'NAME');
CREATE FLOW f2 AS AUTO CDC INTO chosen FROM STREAM(raw) KEYS (id) SEQUENCE BY seq
COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 2;
CREATE OR REFRESH STREAMING TABLE current;
CREATE FLOW f3 AS AUTO CDC INTO current FROM STREAM(raw) KEYS (id) SEQUENCE BY seq
COLUMNS * EXCEPT (seq) STORED AS SCD TYPE 1;
";
    let (dir, pipeline, wh_dir, wh) = common::project(pipeline_sql);
    insert_then_update(&dir.path().join("data"), &pipeline, &wh).await;
    assert!(wh_dir.join("default/hist/_change_data").is_dir());

    // Both tables have change data files, whose `_change_type` keeps its dictionary.
    let expect = |pairs: &[(&str, bool)]| -> BTreeMap<String, bool> {
        let mut m: BTreeMap<String, bool> =
            pairs.iter().map(|(c, d)| (c.to_string(), *d)).collect();
        m.insert("_change_type".to_string(), true);
        m
    };
    assert_eq!(
        dictionary_columns(&wh_dir.join("default/hist")),
        expect(&[
            ("id", false),
            ("name", true),
            ("__START_AT", false),
            ("__END_AT", false)
        ])
    );
    assert_eq!(
        dictionary_columns(&wh_dir.join("default/chosen")),
        expect(&[
            ("id", true),
            ("name", false),
            ("__START_AT", true),
            ("__END_AT", true)
        ])
    );
    let current = dictionary_columns(&wh_dir.join("default/current"));
    assert_eq!(
        (current["id"], current["name"]),
        (false, true),
        "SCD1: the key"
    );

    let log =
        std::fs::read_to_string(wh_dir.join("default/hist/_delta_log/00000000000000000000.json"))
            .expect("log");
    assert!(
        log.contains(r#""strata.parquet.plainColumns":"id,__START_AT,__END_AT""#),
        "{log}"
    );
}
