//! The record of the input files a file-ingesting streaming table has taken.
//!
//! The record itself is the table's commit log: each append's commit info lists the files it
//! took (`strata.files`, or `strata.files.<flow>` for an append flow), committed atomically
//! with their rows. Reading it means reading every commit, which grows with the table's age
//! (a pipeline run hourly makes almost 9,000 commits a year). A cache keeps that cost flat:
//! `<warehouse>/_strata/<schema>/<table>/taken/<key>/<version>.json` holds the union of the
//! record up to a table version, with the table's id (a table created again at the same path
//! has another) and the input columns recorded last. A run reads the newest cache at or below
//! the table's version and only the commits after it, and writes a new cache once it had to
//! read more than [`CACHE_AFTER`] commits.
//!
//! The cache is derived from commits that are already in the log, so it needs no place in a
//! commit: written after the fact, to a temporary name and then renamed, it is either whole
//! or absent. A cache that is missing, unreadable, made for another table or beyond the
//! table's version is ignored, and the commits are read instead.

use crate::error::{Context, Result};
use crate::storage::location::Location;
use deltalake::arrow::datatypes::DataType;
use deltalake::DeltaTable;
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A new cache is written when a run had to read more commits than this past the last one.
pub(crate) const CACHE_AFTER: usize = 32;

/// What a streaming table has taken: the input files, and the input columns the latest
/// commit that recorded any recorded (none before the first).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Taken {
    pub(crate) files: BTreeSet<String>,
    pub(crate) columns: Vec<(String, DataType)>,
}

/// The record of `table` under commit-info keys `files_key` and `schema_key`, using and
/// refreshing the cache in `cache_dir` (see the module docs; on object storage the cache is
/// an object, written in one put, so it too is whole or absent).
pub(crate) async fn read(
    table: &DeltaTable,
    cache_dir: &Location,
    files_key: &str,
    schema_key: &str,
) -> Result<Taken> {
    let Some(version) = table.version().and_then(|v| i64::try_from(v).ok()) else {
        return Ok(Taken::default());
    };
    let table_id = table
        .snapshot()
        .context(|| "reading the table's state".into())?
        .metadata()
        .id()
        .to_string();
    let dir = cache_dir.join(files_key);
    let cached = match dir.local() {
        Some(d) => load(d, &table_id, version),
        None => load_object(&dir, &table_id, version).await,
    };
    let (mut files, mut columns, from) = match cached {
        Some(c) => (c.files, c.columns, c.version),
        None => (BTreeSet::new(), None, -1),
    };
    // Newest first: the first commit that recorded columns is the latest.
    let mut newer_columns: Option<Value> = None;
    let mut read = 0usize;
    let limit = usize::try_from(version - from).unwrap_or(usize::MAX);
    let mut history = table.history(Some(limit));
    while let Some(info) = history.next().await {
        let info = info.context(|| "reading table history".into())?;
        read += 1;
        if let Some(Value::Array(taken)) = info.info.get(files_key) {
            files.extend(taken.iter().filter_map(|f| f.as_str().map(str::to_string)));
        }
        if newer_columns.is_none() {
            newer_columns = info.info.get(schema_key).cloned();
        }
    }
    if newer_columns.is_some() {
        columns = newer_columns;
    }
    if read > CACHE_AFTER {
        let cache = Cache {
            table_id,
            version,
            files,
            columns,
        };
        let saved = match dir.local() {
            Some(d) => save(d, &cache).map_err(|e| e.to_string()),
            None => save_object(&dir, &cache).await,
        };
        if let Err(e) = saved {
            tracing::warn!("the record of files taken was not cached: {e}");
        }
        files = cache.files;
        columns = cache.columns;
    }
    Ok(Taken {
        files,
        columns: columns
            .as_ref()
            .and_then(columns_from_json)
            .unwrap_or_default(),
    })
}

/// [`load`] from an object store.
async fn load_object(dir: &Location, table_id: &str, version: i64) -> Option<Cache> {
    let mut versions: Vec<i64> = dir
        .list_files()
        .await
        .ok()?
        .iter()
        .filter_map(|name| name.strip_suffix(".json")?.parse::<i64>().ok())
        .filter(|v| *v <= version)
        .collect();
    versions.sort_unstable();
    for v in versions.into_iter().rev() {
        let name = format!("{v:020}.json");
        let parsed = match dir.read_file(&name).await {
            Ok(Some(bytes)) => parse_text(&String::from_utf8_lossy(&bytes), table_id, v),
            Ok(None) => continue,
            Err(e) => Err(e.to_string()),
        };
        match parsed {
            Ok(Some(c)) => return Some(c),
            Ok(None) => {}
            Err(e) => tracing::warn!("ignoring the cached record {dir}/{name}: {e}"),
        }
    }
    None
}

/// [`save`] to an object store: one put (whole or absent), then the older caches go.
async fn save_object(dir: &Location, cache: &Cache) -> std::result::Result<(), String> {
    let name = format!("{:020}.json", cache.version);
    let body = serde_json::to_vec(&body_of(cache)).map_err(|e| e.to_string())?;
    dir.write_file(&name, body.into())
        .await
        .map_err(|e| e.to_string())?;
    for old in dir.list_files().await.map_err(|e| e.to_string())? {
        if old != name {
            dir.remove_file(&old).await.map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// One cache file's content.
struct Cache {
    table_id: String,
    version: i64,
    files: BTreeSet<String>,
    /// The recorded input columns, as the commit info holds them.
    columns: Option<Value>,
}

fn file_of(dir: &Path, version: i64) -> PathBuf {
    dir.join(format!("{version:020}.json"))
}

/// The newest readable cache in `dir` for table `table_id` at or below `version`.
fn load(dir: &Path, table_id: &str, version: i64) -> Option<Cache> {
    let mut versions: Vec<i64> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            name.to_str()?.strip_suffix(".json")?.parse::<i64>().ok()
        })
        .filter(|v| *v <= version)
        .collect();
    versions.sort_unstable();
    versions.into_iter().rev().find_map(|v| {
        let path = file_of(dir, v);
        match parse(&path, table_id, v) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("ignoring the cached record {}: {e}", path.display());
                None
            }
        }
    })
}

fn parse(path: &Path, table_id: &str, version: i64) -> std::result::Result<Option<Cache>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    parse_text(&text, table_id, version)
}

fn parse_text(
    text: &str,
    table_id: &str,
    version: i64,
) -> std::result::Result<Option<Cache>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if v.get("table_id").and_then(Value::as_str) != Some(table_id)
        || v.get("version").and_then(Value::as_i64) != Some(version)
    {
        return Ok(None);
    }
    let files = v
        .get("files")
        .and_then(Value::as_array)
        .ok_or("no list of files")?
        .iter()
        .map(|f| {
            f.as_str()
                .map(str::to_string)
                .ok_or("a file name is not a string")
        })
        .collect::<std::result::Result<BTreeSet<_>, _>>()?;
    let columns = v.get("columns").filter(|c| !c.is_null()).cloned();
    Ok(Some(Cache {
        table_id: table_id.to_string(),
        version,
        files,
        columns,
    }))
}

/// Writes `cache` (temporary name, then renamed) and removes the older caches in `dir`.
fn save(dir: &Path, cache: &Cache) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let body = body_of(cache);
    let target = file_of(dir, cache.version);
    let tmp = dir.join(format!(".{:020}.tmp", cache.version));
    std::fs::write(&tmp, serde_json::to_vec(&body)?)?;
    std::fs::rename(&tmp, &target)?;
    for e in std::fs::read_dir(dir)?.flatten() {
        let p = e.path();
        if p != target {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(())
}

fn body_of(cache: &Cache) -> Value {
    json!({
        "table_id": cache.table_id,
        "version": cache.version,
        "files": cache.files,
        "columns": cache.columns,
    })
}

/// The commit-info key under which an ingestion records its inferred input columns.
pub(crate) const SCHEMA_KEY: &str = "strata.inputSchema";

/// `columns` as recorded in a commit: `[["name", "BIGINT"], ["at", "TIMESTAMP"], ...]`, each
/// type by its SQL name.
pub(crate) fn columns_to_json(columns: &[(String, DataType)]) -> Value {
    Value::Array(
        columns
            .iter()
            .map(|(n, t)| {
                let name = crate::util::arrow::sql_type_name(t);
                Value::Array(vec![Value::String(n.clone()), Value::String(name)])
            })
            .collect(),
    )
}

/// The columns recorded by [`columns_to_json`]; a type it cannot read is STRING.
pub(crate) fn columns_from_json(v: &Value) -> Option<Vec<(String, DataType)>> {
    v.as_array()?
        .iter()
        .map(|pair| {
            let pair = pair.as_array()?;
            let name = pair.first()?.as_str()?.to_string();
            Some((name, recorded_type(pair.get(1)?.as_str()?)))
        })
        .collect()
}

/// A recorded SQL type name as the type a declared column of it has.
fn recorded_type(sql: &str) -> DataType {
    strata_sql::parse_ddl_schema(&format!("c {sql}"))
        .ok()
        .and_then(|cols| cols.into_iter().next())
        .map_or(DataType::Utf8, |c| c.data_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_columns_read_back_with_their_types() {
        use deltalake::arrow::datatypes::TimeUnit;
        let columns = vec![
            ("i".to_string(), DataType::Int32),
            ("b".to_string(), DataType::Int64),
            ("d".to_string(), DataType::Decimal128(20, 0)),
            ("f".to_string(), DataType::Float64),
            ("on".to_string(), DataType::Boolean),
            ("day".to_string(), DataType::Date32),
            (
                "at".to_string(),
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ),
            ("s".to_string(), DataType::Utf8),
        ];
        let recorded = columns_to_json(&columns);
        assert_eq!(recorded[6], json!(["at", "TIMESTAMP"]));
        assert_eq!(columns_from_json(&recorded), Some(columns));
        // Types recorded by earlier versions read as they did.
        assert_eq!(
            columns_from_json(&json!([["a", "BIGINT"], ["b", "STRING"], ["c", "?"]])),
            Some(vec![
                ("a".to_string(), DataType::Int64),
                ("b".to_string(), DataType::Utf8),
                ("c".to_string(), DataType::Utf8),
            ])
        );
    }

    fn cache(id: &str, version: i64, files: &[&str]) -> Cache {
        Cache {
            table_id: id.into(),
            version,
            files: files.iter().map(|f| f.to_string()).collect(),
            columns: Some(json!([["a", "BIGINT"]])),
        }
    }

    #[test]
    fn a_cache_is_read_back_only_for_its_table_and_versions_at_or_above_it() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &cache("t1", 40, &["a.json", "b.json"])).unwrap();
        let c = load(dir.path(), "t1", 45).unwrap();
        assert_eq!(c.version, 40);
        assert_eq!(c.files.len(), 2);
        assert_eq!(c.columns, Some(json!([["a", "BIGINT"]])));
        // Another table at the same path, or a table version the cache is beyond.
        assert!(load(dir.path(), "t2", 45).is_none());
        assert!(load(dir.path(), "t1", 39).is_none());
    }

    #[test]
    fn a_new_cache_replaces_the_older_and_a_broken_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &cache("t", 10, &["a"])).unwrap();
        save(dir.path(), &cache("t", 20, &["a", "b"])).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![format!("{:020}.json", 20)]);
        std::fs::write(file_of(dir.path(), 30), b"{not json").unwrap();
        assert_eq!(load(dir.path(), "t", 35).unwrap().version, 20);
    }
}
