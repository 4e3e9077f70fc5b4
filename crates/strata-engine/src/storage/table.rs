//! One Delta table: opening and creating it, its properties, schema and version, the files
//! of a version, and the application transactions it records.

use crate::error::{Context, EngineError, Result};
use crate::storage::location::Location;
use deltalake::arrow::datatypes::Schema;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::StructType;
use deltalake::DeltaTable;
use deltalake::DeltaTableBuilder;
use std::collections::HashMap;
use std::collections::HashSet;

/// Opens the Delta table at `path`, `None` if there is none yet.
pub(crate) async fn open_delta(path: &Location) -> Result<Option<DeltaTable>> {
    if !path.has_delta_log().await? {
        return Ok(None);
    }
    let url = path.table_url()?;
    let table = deltalake::open_table(url)
        .await
        .context(|| format!("cannot open Delta table {path}"))?;
    Ok(Some(table))
}

/// The properties (Delta configuration) of `table`: `strata.keys`, `strata.scdType`, the
/// timeline convention, and whatever `TBLPROPERTIES` set.
pub(crate) fn table_properties(table: &DeltaTable) -> Result<HashMap<String, String>> {
    Ok(table
        .snapshot()
        .context(|| "reading table state".into())?
        .metadata()
        .configuration()
        .clone())
}

/// The table property in which an AUTO CDC target records its key columns (comma-separated).
pub(crate) const KEYS_PROPERTY: &str = "strata.keys";

/// The key columns `properties` record ([`KEYS_PROPERTY`]), `None` when they record none.
pub(crate) fn recorded_keys(properties: &HashMap<String, String>) -> Option<Vec<String>> {
    properties
        .get(KEYS_PROPERTY)
        .map(|k| k.split(',').map(str::to_string).collect())
}

/// Table properties as written in `TBLPROPERTIES`, plus the change data feed that every
/// strata table has enabled (R12), as Delta configuration entries.
pub(crate) fn table_configuration<'a>(
    properties: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Vec<(String, Option<String>)> {
    let mut conf: Vec<(String, Option<String>)> = properties
        .into_iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    conf.push((
        "delta.enableChangeDataFeed".to_string(),
        Some("true".to_string()),
    ));
    conf
}

/// Whether `properties` (as written in `TBLPROPERTIES`) set `name`, in any case.
pub(crate) fn sets_property(
    properties: &std::collections::BTreeMap<String, String>,
    name: &str,
) -> bool {
    properties.keys().any(|k| k.eq_ignore_ascii_case(name))
}

/// The checkpoint interval of the tables strata creates unless their properties say
/// otherwise: Delta's own default (Spark's), where delta-rs would take 100. Opening a table
/// reads its newest checkpoint and the commits after it, so on object storage a run's
/// requests stay flat instead of growing with every commit until the hundredth.
pub(crate) const CHECKPOINT_INTERVAL: &str = "10";

/// Creates an empty Delta table at `path`. Properties outside Delta's own (`strata.*`,
/// `pipelines.*`) are kept as written; `delta.checkpointInterval` is
/// [`CHECKPOINT_INTERVAL`] unless they set it.
pub(crate) async fn create_delta(
    path: &Location,
    name: &str,
    schema: &Schema,
    mut configuration: Vec<(String, Option<String>)>,
    comment: Option<&str>,
    partition_columns: Vec<String>,
) -> Result<DeltaTable> {
    if !configuration
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("delta.checkpointInterval"))
    {
        configuration.push((
            "delta.checkpointInterval".into(),
            Some(CHECKPOINT_INTERVAL.into()),
        ));
    }
    let url = path.table_url()?;
    let handle = DeltaTableBuilder::from_url(url)
        .and_then(|b| b.build())
        .context(|| format!("cannot open {path}"))?;
    let st: StructType = schema
        .try_into_kernel()
        .map_err(|e| EngineError::internal(format!("schema not representable in Delta: {e}")))?;
    // No retries: when another writer has created the table since, delta-rs would otherwise
    // read the table it finds and commit this CREATE TABLE on top of it as a new version
    // (a second protocol and metadata, a new table id), after which that writer's first
    // commits are no longer the table's start: runs started together on an empty warehouse
    // then each took the same input files (seen as 1200 rows for 600 in `drills.rs`).
    let mut create = handle
        .create()
        .with_commit_properties(
            deltalake::kernel::transaction::CommitProperties::default().with_max_retries(0),
        )
        .with_table_name(name)
        .with_columns(st.fields().cloned())
        .with_configuration(configuration)
        .with_partition_columns(partition_columns)
        .with_raise_if_key_not_exists(false);
    if let Some(c) = comment {
        create = create.with_comment(c);
    }
    match create.await {
        Ok(table) => Ok(table),
        // Another writer created the table at the same moment: a lost race, which the
        // dataset's run settles by starting again on the table as it now is.
        Err(source)
            if path
                .join("_delta_log")
                .has_file(FIRST_COMMIT)
                .await
                .unwrap_or(false) =>
        {
            Err(EngineError::Conflict {
                context: format!("creating Delta table {path}"),
                source: Box::new(source),
            })
        }
        Err(e) => Err(e).context(|| format!("cannot create Delta table {path}")),
    }
}

/// Checks that `partitions` (from `PARTITIONED BY`) are columns of `schema`, named as it
/// names them, each once.
pub(crate) fn check_partition_columns(
    schema: &Schema,
    partitions: &[String],
) -> std::result::Result<(), String> {
    for (i, p) in partitions.iter().enumerate() {
        if schema.field_with_name(p).is_err() {
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(format!(
                "PARTITIONED BY names column {p}, which the table does not have (its columns: {})",
                names.join(", ")
            ));
        }
        if partitions[..i].contains(p) {
            return Err(format!("PARTITIONED BY names column {p} twice"));
        }
    }
    if partitions.len() == schema.fields().len() && !partitions.is_empty() {
        return Err("PARTITIONED BY names every column; a table needs a column to store".into());
    }
    Ok(())
}

/// The commit file of a table's version 0.
const FIRST_COMMIT: &str = "00000000000000000000.json";

/// The Arrow schema of a Delta table.
pub(crate) fn table_schema(table: &DeltaTable) -> Result<SchemaRef> {
    Ok(table
        .snapshot()
        .context(|| "reading table state".into())?
        .snapshot()
        .arrow_schema())
}

pub(crate) fn table_files(table: &DeltaTable) -> Result<HashSet<String>> {
    Ok(table
        .snapshot()
        .context(|| "reading table state".into())?
        .log_data()
        .iter()
        .map(|f| f.path().to_string())
        .collect())
}

/// The value of table property `name` (matched case-insensitively) in `properties`.
pub(crate) fn property<'a>(
    properties: &'a std::collections::HashMap<String, String>,
    name: &str,
) -> Option<&'a str> {
    properties
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The table's version as Delta's signed transaction versions count it, -1 if none.
pub(crate) fn version_of(table: &DeltaTable) -> i64 {
    table.version().map_or(-1, |v| v as i64)
}

/// The number of files of the table's latest version and their bytes.
pub(crate) fn file_stats(table: &DeltaTable) -> Result<(usize, u64)> {
    let snapshot = table.snapshot().context(|| "reading table state".into())?;
    let mut files = 0usize;
    let mut bytes = 0u64;
    for f in snapshot.log_data().iter() {
        files += 1;
        bytes += u64::try_from(f.size()).unwrap_or(0);
    }
    Ok((files, bytes))
}
