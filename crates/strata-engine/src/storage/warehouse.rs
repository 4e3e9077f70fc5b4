//! Where tables live and how they are opened.
//!
//! ```text
//!   <warehouse>/<schema>/<table>/_delta_log          user-visible Delta tables
//!   <warehouse>/_strata/<schema>/<table>/events      event store of an AUTO CDC target
//! ```
//!
//! Folders starting with `_` or `.` at the top level are strata's own and are not tables.

use crate::error::{Context, EngineError, Result};
use crate::storage::table::open_delta;
use deltalake::DeltaTable;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use strata_sql::TableName;

/// The name `strata query` knows the event log by.
pub const EVENT_LOG_TABLE: &str = "event_log";

/// `path` as a local folder: itself, or the path of a `file://` URL. A URL of another
/// scheme is an error naming it.
pub(crate) fn local_path(path: &Path, what: &str) -> Result<PathBuf> {
    let text = path.to_string_lossy();
    let Some((scheme, rest)) = text.split_once("://") else {
        return Ok(path.to_path_buf());
    };
    let is_scheme = !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    match (is_scheme, scheme.to_ascii_lowercase().as_str()) {
        (false, _) => Ok(path.to_path_buf()),
        (true, "file") => Ok(PathBuf::from(if rest.starts_with('/') {
            rest.to_string()
        } else {
            format!("/{rest}")
        })),
        (true, other) => Err(EngineError::NotFound(format!(
            "{what} {text}: {other}:// is object storage, and this strata reads and writes a \
             local or mounted file system only (object storage is not supported yet); give a \
             folder, or mount the bucket and give its path"
        ))),
    }
}

/// A folder of Delta tables.
#[derive(Debug, Clone)]
pub struct Warehouse {
    root: PathBuf,
    /// The catalog name the warehouse answers to in three-part names (`main` unless set).
    catalog: String,
    /// The event log as this process last committed to it (see `event_log::append`), so
    /// that a run's records do not each open it again.
    event_log: Arc<Mutex<Option<DeltaTable>>>,
}

impl Warehouse {
    /// Opens (and creates, if missing) the warehouse folder. A `file://` URL names a local
    /// folder; other URLs (object storage) are refused, saying so, rather than taken for a
    /// local folder named `s3:`.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let local = local_path(root.as_ref(), "warehouse")?;
        let root = local.as_path();
        std::fs::create_dir_all(root)
            .context(|| format!("cannot create warehouse folder {}", root.display()))?;
        let root = std::fs::canonicalize(root)
            .context(|| format!("cannot open warehouse folder {}", root.display()))?;
        Ok(Warehouse {
            root,
            catalog: strata_sql::TableName::CATALOGS[0].to_string(),
            event_log: Arc::default(),
        })
    }

    /// The warehouse answering to catalog name `catalog` in three-part names (besides
    /// `strata`, and `main`, Unity Catalog's default).
    pub fn with_catalog(mut self, catalog: &str) -> Self {
        self.catalog = catalog.to_string();
        self
    }

    /// The catalog name of the warehouse in three-part names.
    pub fn catalog(&self) -> &str {
        &self.catalog
    }

    /// Takes the event log handle this process last committed with, if any.
    pub(crate) fn take_event_log(&self) -> Option<DeltaTable> {
        self.event_log.lock().ok().and_then(|mut t| t.take())
    }

    /// Keeps `table` as the event log handle for the next record.
    pub(crate) fn keep_event_log(&self, table: DeltaTable) {
        if let Ok(mut kept) = self.event_log.lock() {
            *kept = Some(table);
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn table_path(&self, name: &TableName) -> PathBuf {
        self.root.join(&name.schema).join(&name.name)
    }

    /// Where strata keeps its own state of table `name` (event store, caches):
    /// `_strata/<schema>/<name>`.
    fn state_path(&self, name: &TableName) -> PathBuf {
        self.root
            .join("_strata")
            .join(&name.schema)
            .join(&name.name)
    }

    /// The event log: one record per dataset or flow per run (`runtime/event_log.rs`).
    pub(crate) fn event_log_path(&self) -> PathBuf {
        self.root.join("_strata").join(EVENT_LOG_TABLE)
    }

    /// The event store of the AUTO CDC target `name`.
    pub fn event_store_path(&self, name: &TableName) -> PathBuf {
        self.state_path(name).join("events")
    }

    /// The cached record of the input files the streaming table `name` has taken
    /// (`storage/ledger.rs`).
    pub fn taken_cache_path(&self, name: &TableName) -> PathBuf {
        self.state_path(name).join("taken")
    }

    /// Every table of the warehouse, sorted.
    pub fn list_tables(&self) -> Result<Vec<TableName>> {
        let mut out = Vec::new();
        for schema in read_dir_sorted(&self.root)? {
            let Some(schema_name) = visible_dir_name(&schema) else {
                continue;
            };
            for table in read_dir_sorted(&schema)? {
                let Some(table_name) = visible_dir_name(&table) else {
                    continue;
                };
                if table.join("_delta_log").is_dir() {
                    out.push(TableName::new(Some(&schema_name), &table_name));
                }
            }
        }
        Ok(out)
    }

    /// Opens an existing table; `None` if there is no Delta table at its path.
    pub async fn open_table(&self, name: &TableName) -> Result<Option<DeltaTable>> {
        open_delta(&self.table_path(name)).await
    }
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    Ok(entries)
}

fn visible_dir_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    (path.is_dir() && !name.starts_with('_') && !name.starts_with('.')).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_are_folders_and_object_storage_is_refused_by_name() {
        assert_eq!(
            local_path(Path::new("wh"), "w").unwrap(),
            PathBuf::from("wh")
        );
        assert_eq!(
            local_path(Path::new("file:///tmp/wh"), "w").unwrap(),
            PathBuf::from("/tmp/wh")
        );
        let e = local_path(Path::new("s3://lake/wh"), "warehouse")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s3://lake/wh") && e.contains("not supported"),
            "{e}"
        );
        assert!(local_path(Path::new("abfss://c@a.dfs.core.windows.net/wh"), "w").is_err());
        assert_eq!(
            local_path(Path::new("odd dir://x"), "w").unwrap(),
            PathBuf::from("odd dir://x")
        );
    }
}
