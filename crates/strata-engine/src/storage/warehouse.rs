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
use std::collections::{BTreeMap, BTreeSet};
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
        open_delta(&self.table_location(name)).await
    }
}
