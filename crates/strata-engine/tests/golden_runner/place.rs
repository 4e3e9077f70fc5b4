//! Where one scenario runs: a temp dir holding `pipeline.sql` and the spec files, and the
//! root of its warehouse (`warehouse/`) and input files (`data/`), which is the same temp dir,
//! or a prefix of its own in the test bucket of the S3-compatible server or in the test
//! container of the Azure Storage emulator.
//!
//! The runner reaches the root through one `ObjectStore` either way (a local file system
//! rooted at the temp dir, or the bucket or container under the prefix), so that writing
//! input, listing the warehouse's files and expiring a table's log are the same code on all.

use deltalake::logstore::object_store::{
    self, aws::AmazonS3Builder, azure::MicrosoftAzureBuilder, local::LocalFileSystem,
    path::Path as StorePath, prefix::PrefixStore, ObjectStore, ObjectStoreExt, PutPayload,
};
use futures::{StreamExt, TryStreamExt};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Where the scenarios of a test target keep their warehouse and input.
#[derive(Clone)]
pub enum Storage {
    /// The scenario's temp dir.
    Local,
    /// The S3-compatible test server (its `AWS_*` settings in the environment, for the engine
    /// and for this runner): each scenario under `s3://BUCKET/RUN/NAME/`.
    S3 { bucket: String, run: String },
    /// The Azure Storage emulator (its object_store emulator settings in the environment, for
    /// the engine and for this runner): each scenario under `az://CONTAINER/RUN/NAME/`.
    Azure { container: String, run: String },
}

/// The input folder of every scenario: `file` blocks below it are input files, and the
/// pipeline names it by a relative path (`read_files('data/cdc', ...)`).
const INPUT: &str = "data";

pub struct Place {
    dir: tempfile::TempDir,
    /// The root of the warehouse and the input as a URL prefix (`s3://b/p`, `az://c/p`), or `None` for
    /// the temp dir.
    url: Option<String>,
    store: Arc<dyn ObjectStore>,
}

impl Place {
    /// A fresh place for the scenario `name`.
    pub fn new(storage: &Storage, name: &str) -> Result<Place, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (url, store): (_, Arc<dyn ObjectStore>) = match storage {
            Storage::Local => {
                let fs = LocalFileSystem::new_with_prefix(dir.path())
                    .map_err(|e| e.to_string())?
                    .with_automatic_cleanup(true);
                (None, Arc::new(fs))
            }
            Storage::S3 { bucket, run } => {
                let prefix = format!("{run}/{name}");
                let s3 = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .build()
                    .map_err(|e| format!("an S3 client from AWS_*: {e}"))?;
                let url = format!("s3://{bucket}/{prefix}");
                (Some(url), Arc::new(PrefixStore::new(s3, prefix.as_str())))
            }
            Storage::Azure { container, run } => {
                let prefix = format!("{run}/{name}");
                let azure = MicrosoftAzureBuilder::from_env()
                    .with_container_name(container)
                    .build()
                    .map_err(|e| format!("an Azure client from AZURE_*: {e}"))?;
                let url = format!("az://{container}/{prefix}");
                (
                    Some(url),
                    Arc::new(PrefixStore::new(azure, prefix.as_str())),
                )
            }
        };
        Ok(Place { dir, url, store })
    }

    /// The local folder of `pipeline.sql` and the spec files (relative paths in a pipeline
    /// resolve against it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The warehouse, as `Warehouse::open` takes it.
    pub fn warehouse(&self) -> String {
        self.location("warehouse")
    }

    /// `rel` below the root: a local path or an object URL.
    fn location(&self, rel: &str) -> String {
        match &self.url {
            None => self.dir.path().join(rel).to_string_lossy().to_string(),
            Some(url) => format!("{url}/{rel}"),
        }
    }

    /// Writes the `file` block `path`: an input file goes below the root, anything else
    /// (a spec, a library's SQL) into the temp dir beside `pipeline.sql`.
    pub async fn write_file(&self, path: &str, content: &str) -> Result<(), String> {
        if self.url.is_some() && is_input(path) {
            return self
                .store
                .put(
                    &StorePath::from(path),
                    PutPayload::from(content.to_string()),
                )
                .await
                .map(|_| ())
                .map_err(|e| format!("writing {}: {e}", self.location(path)));
        }
        let p = self.dir.path().join(path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&p, self.sources_text(content)).map_err(|e| e.to_string())
    }

    /// A pipeline's or spec's text with its input paths pointing at the root: with input in
    /// the object store, a quoted `'data/...'` (or `'data'`; double quotes and backticks
    /// alike) becomes `'s3://b/p/data/...'`,
    /// and so does a plain YAML value `key: data...` (a spec's configuration that paths are
    /// built from). On local disk the text is unchanged.
    pub fn sources_text(&self, text: &str) -> String {
        let Some(url) = &self.url else {
            return text.to_string();
        };
        let mut out = text.to_string();
        // Backticks too: Spark's direct reads name their path as an identifier
        // (``parquet.`data/x` ``).
        for q in ['\'', '"', '`'] {
            out = out
                .replace(&format!("{q}{INPUT}/"), &format!("{q}{url}/{INPUT}/"))
                .replace(&format!("{q}{INPUT}{q}"), &format!("{q}{url}/{INPUT}{q}"));
        }
        out.lines()
            .map(|line| match line.split_once(": ") {
                Some((key, value))
                    if is_yaml_key(key) && (value == INPUT || value.starts_with("data/")) =>
                {
                    format!("{key}: {url}/{value}")
                }
                _ => line.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n")
            + if out.ends_with('\n') { "\n" } else { "" }
    }

    /// Every file of the warehouse (path relative to it -> its size and a hash of its
    /// content), except the event log's, which records failing runs by design.
    pub async fn warehouse_files(&self) -> Result<BTreeMap<String, (u64, u64)>, String> {
        let root = StorePath::from("warehouse");
        let objects: Vec<_> = self
            .store
            .list(Some(&root))
            .try_collect()
            .await
            .map_err(|e| format!("listing {}: {e}", self.warehouse()))?;
        let mut out = BTreeMap::new();
        for o in objects {
            let rel = relative(&o.location, &root);
            if rel.starts_with("_strata/event_log/") {
                continue;
            }
            let bytes = self.read(&o.location).await?;
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut h);
            out.insert(rel, (bytes.len() as u64, h.finish()));
        }
        Ok(out)
    }

    /// Log cleanup and VACUUM of change files, for real, on the Delta table at `table`
    /// (relative to the root): a checkpoint at the latest version, the commit files before
    /// it removed (with `log`), and every file under `_change_data/`.
    pub async fn expire(&self, table: &str, log: bool) -> Result<(), String> {
        let url = self.table_url(table)?;
        let t = deltalake::open_table(url)
            .await
            .map_err(|e| format!("opening {table}: {e}"))?;
        let latest = t.version().unwrap_or(0);
        if log {
            deltalake::checkpoints::create_checkpoint(&t, None)
                .await
                .map_err(|e| format!("checkpoint of {table}: {e}"))?;
            let log_dir = StorePath::from(format!("{table}/_delta_log"));
            for o in self.list(&log_dir).await? {
                let version = o
                    .filename()
                    .and_then(|n| n.strip_suffix(".json"))
                    .and_then(|v| v.parse::<u64>().ok());
                if version.is_some_and(|v| v < latest) {
                    self.delete(&o).await?;
                }
            }
        }
        for o in self
            .list(&StorePath::from(format!("{table}/_change_data")))
            .await?
        {
            self.delete(&o).await?;
        }
        Ok(())
    }

    /// Removes the scenario's objects from the bucket or container (the temp dir goes when the
    /// place is dropped). moto lists a prefix by going over every key of the bucket, so a
    /// bucket that kept every scenario's objects would make each listing slower than the last.
    pub async fn clear(&self) -> Result<(), String> {
        if self.url.is_none() {
            return Ok(());
        }
        let all = self.store.list(None).map_ok(|o| o.location).boxed();
        self.store
            .delete_stream(all)
            .try_collect::<Vec<_>>()
            .await
            .map(|_| ())
            .map_err(|e| format!("removing the objects under {}: {e}", self.location("")))
    }

    /// The URL deltalake opens the table `table` (relative to the root) by.
    fn table_url(&self, table: &str) -> Result<url::Url, String> {
        match &self.url {
            None => url::Url::from_directory_path(self.dir.path().join(table))
                .map_err(|_| format!("{table} is not a directory path")),
            Some(u) => url::Url::parse(&format!("{u}/{table}/")).map_err(|e| e.to_string()),
        }
    }

    /// The paths of the objects below `prefix`.
    async fn list(&self, prefix: &StorePath) -> Result<Vec<StorePath>, String> {
        self.store
            .list(Some(prefix))
            .map_ok(|o| o.location)
            .try_collect()
            .await
            .map_err(|e| format!("listing {prefix}: {e}"))
    }

    async fn read(&self, path: &StorePath) -> Result<bytes::Bytes, String> {
        let got = self.store.get(path).await;
        match got {
            Ok(g) => g.bytes().await,
            Err(e) => Err(e),
        }
        .map_err(|e| format!("reading {path}: {e}"))
    }

    async fn delete(&self, path: &StorePath) -> Result<(), String> {
        match self.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(format!("removing {path}: {e}")),
        }
    }
}

/// Whether the `file` block `path` is an input file (below `data/`).
fn is_input(path: &str) -> bool {
    path.strip_prefix(INPUT)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `key` (the part of a line before `: `) is a YAML mapping key: indentation, maybe
/// a list item's `- `, then a plain word.
fn is_yaml_key(key: &str) -> bool {
    let word = key.trim_start().trim_start_matches("- ");
    !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `path` relative to `root` (`a/b.json`).
fn relative(path: &StorePath, root: &StorePath) -> String {
    path.prefix_match(root)
        .into_iter()
        .flatten()
        .map(|p| p.as_ref().to_string())
        .collect::<Vec<_>>()
        .join("/")
}
