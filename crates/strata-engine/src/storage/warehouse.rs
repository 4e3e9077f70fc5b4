//! Where tables live and how they are opened.
//!
//! ```text
//!   <warehouse>/<schema>/<table>/_delta_log          user-visible Delta tables
//!   <warehouse>/_strata/<schema>/<table>/events      event store of an AUTO CDC target
//!   <warehouse>/_strata/private/<pipeline>/<schema>/<table>
//!                                                    a pipeline's PRIVATE datasets, their
//!                                                    state under .../<pipeline>/_strata/
//! ```
//!
//! Folders starting with `_` or `.` at the top level are strata's own and are not tables.
//! A pipeline's run sees its private datasets by their names ([`Warehouse::with_private`]);
//! nothing else does (`strata query`, other pipelines).

use crate::error::{Context, Result};
use crate::storage::location::Location;
use crate::storage::table::open_delta;
use deltalake::DeltaTable;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use strata_sql::TableName;

/// The name `strata query` knows the event log by.
pub const EVENT_LOG_TABLE: &str = "event_log";

/// A folder of Delta tables, on a local file system or in an object store.
#[derive(Debug, Clone)]
pub struct Warehouse {
    root: Location,
    /// The catalog name the warehouse answers to in three-part names (`main` unless set).
    catalog: String,
    /// The event log as this process last committed to it (see `event_log::append`), so
    /// that a run's records do not each open it again.
    event_log: Arc<Mutex<Option<DeltaTable>>>,
    /// The private datasets of the pipeline this handle runs, if any.
    private: Option<Arc<Private>>,
    /// Where the sinks of the pipeline this handle runs write (`CREATE SINK`).
    sinks: Option<Arc<BTreeMap<TableName, Location>>>,
    /// The Delta tables this handle has opened, as last seen, when it keeps them (a run's
    /// handle: [`Warehouse::keeping_opened_tables`]).
    opened: Option<Arc<OpenedTables>>,
}

/// The Delta tables a run has opened, by location, each at the newest version the run has
/// seen. Opening a table again brings the kept one up to date, which reads only the commits
/// made since (one listing of the log on object storage) instead of the log from its last
/// checkpoint (a listing, `_last_checkpoint`, the checkpoint and every commit after it).
#[derive(Debug, Default)]
struct OpenedTables(Mutex<HashMap<String, DeltaTable>>);

impl OpenedTables {
    fn get(&self, at: &Location) -> Option<DeltaTable> {
        self.0.lock().ok()?.get(&at.to_string()).cloned()
    }

    /// Keeps `table` unless a newer version of it is kept already (flows running side by
    /// side open the same source).
    fn keep(&self, at: &Location, table: &DeltaTable) {
        let Ok(mut kept) = self.0.lock() else { return };
        let newer = |t: &DeltaTable| t.version() > table.version();
        let key = at.to_string();
        if !kept.get(&key).is_some_and(newer) {
            kept.insert(key, table.clone());
        }
    }

    fn forget(&self, at: &Location) {
        if let Ok(mut kept) = self.0.lock() {
            kept.remove(&at.to_string());
        }
    }
}

/// A pipeline's private datasets: their names and the folder they live in.
#[derive(Debug)]
struct Private {
    /// `_strata/private/<pipeline>`.
    root: Location,
    names: BTreeSet<TableName>,
}

/// A pipeline's name as a folder name: letters, digits, `-`, `.` kept, the rest `_`.
fn folder_name(pipeline: &str) -> String {
    pipeline
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Warehouse {
    /// Opens (and creates, if missing) the warehouse folder. A `file://` URL names a local
    /// folder; `s3://`, `gs://`, `abfss://`... name a prefix in an object store (nothing is
    /// created or read there until the first table is); another URL scheme is refused, saying
    /// so, rather than taken for a local folder named `ftp:`.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = match Location::parse(&root.as_ref().to_string_lossy(), "warehouse")? {
            Location::Local(local) => {
                let root = local.as_path();
                std::fs::create_dir_all(root)
                    .context(|| format!("cannot create warehouse folder {}", root.display()))?;
                Location::Local(
                    std::fs::canonicalize(root)
                        .context(|| format!("cannot open warehouse folder {}", root.display()))?,
                )
            }
            object => object,
        };
        Ok(Warehouse {
            root,
            catalog: strata_sql::TableName::CATALOGS[0].to_string(),
            event_log: Arc::default(),
            private: None,
            sinks: None,
            opened: None,
        })
    }

    /// The warehouse as pipeline `pipeline` sees it: its `PRIVATE` datasets `names` live
    /// in `_strata/private/<pipeline>/` (with their state), are listed and opened by name by
    /// this handle, and by no other (`strata query` and other pipelines do not see them).
    pub(crate) fn with_private(&self, pipeline: &str, names: BTreeSet<TableName>) -> Warehouse {
        let mut wh = self.clone();
        wh.private = (!names.is_empty()).then(|| {
            Arc::new(Private {
                root: self
                    .state_root()
                    .join("private")
                    .join(&folder_name(pipeline)),
                names,
            })
        });
        wh
    }

    /// The warehouse as a pipeline with sinks sees it: the sink `name` is the Delta table
    /// at `sinks[name]` (a path outside the warehouse, or a table of it), opened and
    /// created there by name.
    pub(crate) fn with_sinks(&self, sinks: BTreeMap<TableName, Location>) -> Warehouse {
        let mut wh = self.clone();
        wh.sinks = (!sinks.is_empty()).then(|| Arc::new(sinks));
        wh
    }

    /// The warehouse as one run sees it: every Delta table opened through this handle (and
    /// its clones) is kept, and opening it again reads only what was committed since. Only
    /// for a handle that lives as long as one run: one that lives longer (`strata serve`)
    /// would not see a table that was replaced, which a run's own steps announce
    /// ([`Warehouse::forget_table`]).
    pub(crate) fn keeping_opened_tables(&self) -> Warehouse {
        let mut wh = self.clone();
        wh.opened = Some(Arc::default());
        wh
    }

    /// The private folder of `name`, when it is a private dataset of this handle's pipeline.
    fn private_root(&self, name: &TableName) -> Option<&Location> {
        self.private
            .as_ref()
            .filter(|p| p.names.contains(name))
            .map(|p| &p.root)
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

    /// Where the warehouse is.
    pub fn root(&self) -> &Location {
        &self.root
    }

    /// Whether the warehouse is in an object store (some local caches are then not kept).
    pub fn is_object_store(&self) -> bool {
        self.root.local().is_none()
    }

    /// Where table `name` lives: `<warehouse>/<schema>/<name>`, or in its pipeline's
    /// private folder.
    pub fn table_location(&self, name: &TableName) -> Location {
        if let Some(sink) = self.sinks.as_ref().and_then(|s| s.get(name)) {
            return sink.clone();
        }
        self.private_root(name)
            .unwrap_or(&self.root)
            .join(&name.schema)
            .join(&name.name)
    }

    /// Where strata keeps its own state (`_strata`: event stores, the event log, caches,
    /// tables set aside by a full refresh).
    pub(crate) fn state_root(&self) -> Location {
        self.root.join("_strata")
    }

    /// Where strata keeps its own state of table `name` (event store, caches):
    /// `_strata/<schema>/<name>`.
    fn state_location(&self, name: &TableName) -> Location {
        match self.private_root(name) {
            Some(private) => private.join("_strata"),
            None => self.state_root(),
        }
        .join(&name.schema)
        .join(&name.name)
    }

    /// The event log: one record per dataset or flow per run (`runtime/event_log.rs`).
    pub(crate) fn event_log_location(&self) -> Location {
        self.state_root().join(EVENT_LOG_TABLE)
    }

    /// The event store of the AUTO CDC target `name`.
    pub fn event_store_location(&self, name: &TableName) -> Location {
        self.state_location(name).join("events")
    }

    /// The cached record of the input files the streaming table `name` has taken
    /// (`storage/ledger.rs`).
    pub fn taken_cache_location(&self, name: &TableName) -> Location {
        self.state_location(name).join("taken")
    }

    /// Every table of the warehouse, sorted, with the private datasets of this handle's
    /// pipeline that exist (in place of public tables of the same names). Folders starting
    /// with `_` or `.` are strata's own (or hidden) and hold no tables.
    pub async fn list_tables(&self) -> Result<Vec<TableName>> {
        let visible = |n: &String| !n.starts_with('_') && !n.starts_with('.');
        let mut out = BTreeSet::new();
        for schema in self.root.list_dirs().await?.into_iter().filter(visible) {
            let schema_dir = self.root.join(&schema);
            for table in schema_dir.list_dirs().await?.into_iter().filter(visible) {
                if schema_dir.join(&table).has_delta_log().await? {
                    out.insert(TableName::new(Some(&schema), &table));
                }
            }
        }
        if let Some(private) = &self.private {
            for name in &private.names {
                out.remove(name);
                if self.table_location(name).has_delta_log().await? {
                    out.insert(name.clone());
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Opens an existing table; `None` if there is no Delta table at its location.
    pub async fn open_table(&self, name: &TableName) -> Result<Option<DeltaTable>> {
        self.open_at(&self.table_location(name)).await
    }

    /// Opens the Delta table at `at` (a table, an event store); `None` if there is none. A
    /// handle that keeps opened tables brings a kept one up to date instead.
    pub(crate) async fn open_at(&self, at: &Location) -> Result<Option<DeltaTable>> {
        let Some(opened) = &self.opened else {
            return open_delta(at).await;
        };
        let table = match opened.get(at) {
            Some(mut kept) => {
                kept.update_incremental(None)
                    .await
                    .context(|| format!("cannot read the log of Delta table {at}"))?;
                kept
            }
            None => match open_delta(at).await? {
                Some(table) => table,
                None => return Ok(None),
            },
        };
        opened.keep(at, &table);
        Ok(Some(table))
    }

    /// Drops what this handle keeps of the Delta tables at `at` (set aside by a full
    /// refresh, about to be rebuilt), so that the next open reads whatever is there then.
    pub(crate) fn forget_table(&self, at: &Location) {
        if let Some(opened) = &self.opened {
            opened.forget(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::commit::PendingCommit;
    use deltalake::arrow::array::Int64Array;
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use deltalake::arrow::record_batch::RecordBatch;

    #[tokio::test]
    async fn a_run_sees_commits_made_since_it_opened_a_table_and_not_a_table_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let wh = Warehouse::open(dir.path()).unwrap();
        let run = wh.keeping_opened_tables();
        let name = TableName::new(Some("default"), "t");
        let at = wh.table_location(&name);
        assert!(run.open_table(&name).await.unwrap().is_none());
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        crate::storage::table::create_delta(&at, "t", &schema, Vec::new(), None, Vec::new())
            .await
            .unwrap();
        let first = run.open_table(&name).await.unwrap().unwrap();
        assert_eq!(first.version(), Some(0));

        // Another writer (a handle that keeps nothing, as another process) appends.
        let other = wh.open_table(&name).await.unwrap().unwrap();
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
        crate::storage::write::append(&other, vec![batch], Vec::new(), &PendingCommit::default())
            .await
            .unwrap();
        let again = run.open_table(&name).await.unwrap().unwrap();
        assert_eq!(again.version(), Some(1));
        assert_eq!(again.snapshot().unwrap().log_data().num_files(), 1);
        // The table opened first is the caller's: bringing the kept one up to date left it.
        assert_eq!(first.version(), Some(0));

        // Set aside (as a full refresh does): the run reads what is there afterwards.
        run.forget_table(&at);
        assert!(at.move_to(&wh.state_root().join("aside")).await.unwrap());
        assert!(run.open_table(&name).await.unwrap().is_none());
    }
}
