//! Where a table or a folder of strata's own state lives: a local folder, or a prefix in an
//! object store (S3 and S3-compatible stores, Azure Data Lake Storage / Blob Storage, Google
//! Cloud Storage).
//!
//! Object stores are reached through `object_store`'s own clients, the ones deltalake uses,
//! registered here with deltalake's object-store and log-store factories for `s3://`,
//! `s3a://`, `gs://`, `az://`, `abfs://`, `abfss://` and `azure://`. Their credentials,
//! regions and endpoints come from the environment (`AWS_*`, `AZURE_*`, `GOOGLE_*`, then the
//! provider's usual chain: instance metadata, web identity, ...), never from strata's
//! arguments, so that no secret passes through a command line, a log or a table property.
//!
//! Commits use deltalake's default log store: a new log entry is written with
//! `PutMode::Create`, which on S3 is a conditional put (`If-None-Match: *`, AWS since 2024,
//! MinIO, R2, Ceph RGW), so of two writers of the same version exactly one wins and the
//! other sees a conflict (docs/operations.md, "Object storage").
//!
//! A local location behaves exactly as strata's local folders always did (`std::fs`); the
//! object-store forms of the same operations (listing child folders, moving or removing a
//! whole prefix) go through the store.

use crate::error::{Context, EngineError, Result};
use deltalake::logstore::object_store::{
    self, aws::AmazonS3Builder, azure::MicrosoftAzureBuilder, gcp::GoogleCloudStorageBuilder,
    path::Path as StorePath, ObjectStore, ObjectStoreExt,
};
use deltalake::logstore::{
    default_logstore, logstore_factories, object_store_factories, LogStore, LogStoreFactory,
    ObjectStoreFactory, ObjectStoreRef, StorageConfig,
};
use deltalake::{DeltaResult, DeltaTableError};
use futures::TryStreamExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once, OnceLock};
use url::Url;

/// The URL schemes of object stores strata opens.
pub(crate) const OBJECT_SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "abfs", "abfss", "azure"];

/// A table's or a state folder's place.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// A folder on a local or mounted file system.
    Local(PathBuf),
    /// A prefix in an object store: `s3://bucket/prefix/` (always ending with `/`).
    Object(Url),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Object(u) => write!(f, "{}", u.as_str().trim_end_matches('/')),
        }
    }
}

impl Location {
    /// What `text` names: a local folder (a plain path or a `file://` URL), or an object
    /// store prefix (a URL of one of [`OBJECT_SCHEMES`]). A URL of another scheme is an error
    /// naming it; a path that merely contains `://` after something that is no scheme is a
    /// folder.
    pub(crate) fn parse(text: &str, what: &str) -> Result<Location> {
        let Some((scheme, rest)) = text.split_once("://") else {
            return Ok(Location::Local(PathBuf::from(text)));
        };
        let is_scheme = !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        let lower = scheme.to_ascii_lowercase();
        match (is_scheme, lower.as_str()) {
            (false, _) => Ok(Location::Local(PathBuf::from(text))),
            (true, "file") => Ok(Location::Local(PathBuf::from(if rest.starts_with('/') {
                rest.to_string()
            } else {
                format!("/{rest}")
            }))),
            (true, s) if OBJECT_SCHEMES.contains(&s) => {
                let mut url = Url::parse(text).map_err(|e| {
                    EngineError::NotFound(format!("{what} {text}: not a valid URL: {e}"))
                })?;
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(EngineError::NotFound(format!(
                        "{what} {text}: names no bucket or container (write {s}://BUCKET/PREFIX)"
                    )));
                }
                // An Azure URL's user part is its container (abfss://container@account...).
                let azure = s.starts_with("abfs");
                if url.password().is_some() || (!url.username().is_empty() && !azure) {
                    return Err(EngineError::NotFound(format!(
                        "{what}: credentials do not belong in the URL ({s}://...); \
                         set them in the environment (AWS_ACCESS_KEY_ID, ...)"
                    )));
                }
                url.set_query(None);
                url.set_fragment(None);
                if !url.path().ends_with('/') {
                    let p = format!("{}/", url.path());
                    url.set_path(&p);
                }
                register_object_stores();
                Ok(Location::Object(url))
            }
            (true, other) => Err(EngineError::NotFound(format!(
                "{what} {text}: {other}:// is not a storage strata knows; give a folder, a \
                 file:// URL or an object store URL ({})",
                OBJECT_SCHEMES
                    .iter()
                    .map(|s| format!("{s}://"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// The location `segment` below this one (`segment` may hold `/`).
    pub fn join(&self, segment: &str) -> Location {
        match self {
            Location::Local(p) => Location::Local(p.join(segment)),
            Location::Object(u) => {
                let mut url = u.clone();
                let p = format!("{}{}/", u.path(), segment.trim_matches('/'));
                url.set_path(&p);
                Location::Object(url)
            }
        }
    }

    /// The local folder, if this is one.
    pub fn local(&self) -> Option<&Path> {
        match self {
            Location::Local(p) => Some(p),
            Location::Object(_) => None,
        }
    }

    /// The last segment of the location.
    pub fn name(&self) -> Option<String> {
        match self {
            Location::Local(p) => p.file_name()?.to_str().map(str::to_string),
            Location::Object(u) => u
                .path()
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        }
    }

    /// The location as deltalake opens it; a local folder is created first (deltalake
    /// wants an existing directory).
    pub(crate) fn table_url(&self) -> Result<Url> {
        match self {
            Location::Local(path) => {
                std::fs::create_dir_all(path)
                    .context(|| format!("cannot create {}", path.display()))?;
                Url::from_directory_path(path).map_err(|_| {
                    EngineError::internal(format!("not an absolute path: {}", path.display()))
                })
            }
            Location::Object(u) => Ok(u.clone()),
        }
    }

    /// The store holding this object location and the location's path in it.
    fn store(&self) -> Result<Option<(Arc<dyn ObjectStore>, StorePath)>> {
        match self {
            Location::Local(_) => Ok(None),
            Location::Object(u) => {
                let store =
                    store_for(u).context(|| format!("cannot open object store for {self}"))?;
                let path = StorePath::from_url_path(u.path())
                    .map_err(|e| store_error(e.into()))
                    .context(|| format!("not an object store path: {self}"))?;
                Ok(Some((store, path)))
            }
        }
    }

    /// Whether a Delta table lives here (its `_delta_log` has an entry).
    pub async fn has_delta_log(&self) -> Result<bool> {
        let log = self.join("_delta_log");
        match &log {
            Location::Local(p) => Ok(holds_a_version(p)),
            Location::Object(_) => log.has_objects().await,
        }
    }

    /// Whether anything lives under this location.
    pub async fn exists(&self) -> Result<bool> {
        match self {
            Location::Local(p) => Ok(p.exists()),
            Location::Object(_) => self.has_objects().await,
        }
    }

    /// Whether the object `file` below this location exists.
    pub(crate) async fn has_file(&self, file: &str) -> Result<bool> {
        match self {
            Location::Local(p) => Ok(p.join(file).exists()),
            Location::Object(_) => {
                let Some((store, prefix)) = self.store()? else {
                    return Ok(false);
                };
                let path = below(&prefix, file);
                match store.head(&path).await {
                    Ok(_) => Ok(true),
                    Err(object_store::Error::NotFound { .. }) => Ok(false),
                    Err(e) => Err(store_error(e)).context(|| format!("cannot read {self}/{file}")),
                }
            }
        }
    }

    /// The content of the file `file` below this location, `None` if there is none.
    pub(crate) async fn read_file(&self, file: &str) -> Result<Option<bytes::Bytes>> {
        Ok(self.read_file_dated(file).await?.map(|(bytes, _)| bytes))
    }

    /// The content of the file `file` below this location and when it was last modified
    /// (if the file system tells), `None` if there is none.
    pub(crate) async fn read_file_dated(
        &self,
        file: &str,
    ) -> Result<Option<(bytes::Bytes, Option<std::time::SystemTime>)>> {
        match self {
            Location::Local(p) => {
                let path = p.join(file);
                let read = std::fs::read(&path).and_then(|b| Ok((b, std::fs::metadata(&path)?)));
                match read {
                    Ok((b, meta)) => Ok(Some((b.into(), meta.modified().ok()))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(e).context(|| format!("reading {}", path.display())),
                }
            }
            Location::Object(_) => {
                let Some((store, prefix)) = self.store()? else {
                    return Ok(None);
                };
                let got = match store.get(&below(&prefix, file)).await {
                    Ok(got) => {
                        let modified = std::time::SystemTime::from(got.meta.last_modified);
                        got.bytes().await.map(|b| (b, Some(modified)))
                    }
                    Err(e) => Err(e),
                };
                match got {
                    Ok(b) => Ok(Some(b)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(store_error(e)).context(|| format!("reading {self}/{file}")),
                }
            }
        }
    }

    /// Writes `bytes` as the file `file` below this location (replacing one there).
    pub(crate) async fn write_file(&self, file: &str, bytes: bytes::Bytes) -> Result<()> {
        match self {
            Location::Local(p) => std::fs::write(p.join(file), &bytes)
                .context(|| format!("writing {}", p.join(file).display())),
            Location::Object(_) => {
                let Some((store, prefix)) = self.store()? else {
                    return Ok(());
                };
                store
                    .put(&below(&prefix, file), bytes.into())
                    .await
                    .map_err(store_error)
                    .context(|| format!("writing {self}/{file}"))?;
                Ok(())
            }
        }
    }

    /// Creates the file `file` below this location holding `bytes` only if there is none
    /// (a local `create_new`, an object store's conditional put): `false` when one exists.
    pub(crate) async fn create_file(&self, file: &str, bytes: bytes::Bytes) -> Result<bool> {
        match self {
            Location::Local(p) => {
                use std::io::Write;
                let path = p.join(file);
                match std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                {
                    Ok(mut f) => {
                        f.write_all(&bytes)
                            .context(|| format!("writing {}", path.display()))?;
                        Ok(true)
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                    Err(e) => Err(e).context(|| format!("creating {}", path.display())),
                }
            }
            Location::Object(_) => {
                let Some((store, prefix)) = self.store()? else {
                    return Ok(false);
                };
                let options = object_store::PutOptions {
                    mode: object_store::PutMode::Create,
                    ..Default::default()
                };
                match store
                    .put_opts(&below(&prefix, file), bytes.into(), options)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                    Err(e) => Err(store_error(e)).context(|| format!("creating {self}/{file}")),
                }
            }
        }
    }

    /// Every object below `prefix` in `store` (this location's).
    async fn objects(
        &self,
        store: &Arc<dyn ObjectStore>,
        prefix: &StorePath,
    ) -> Result<Vec<object_store::ObjectMeta>> {
        store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(store_error)
            .context(|| format!("cannot list {self}"))
    }

    /// Every object below this object-store location, by its path relative to it
    /// (`a/b.json`), sorted; names with a part starting with `.` or `_` are left out, as
    /// Spark does, and so are empty objects (see `ops::ingest::files::list_files`). Empty
    /// for a local location (list those with `std::fs`).
    pub(crate) async fn list_files(&self) -> Result<Vec<String>> {
        let Some((store, prefix)) = self.store()? else {
            return Ok(Vec::new());
        };
        let objects = self.objects(&store, &prefix).await?;
        let mut out: Vec<String> = objects
            .iter()
            .filter(|o| o.size > 0)
            .filter_map(|o| {
                let parts: Vec<String> = o
                    .location
                    .prefix_match(&prefix)?
                    .map(|p| p.as_ref().to_string())
                    .collect();
                let visible = !parts.is_empty()
                    && parts
                        .iter()
                        .all(|p| !p.starts_with('.') && !p.starts_with('_'));
                visible.then(|| parts.join("/"))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    async fn has_objects(&self) -> Result<bool> {
        let Some((store, prefix)) = self.store()? else {
            return Ok(false);
        };
        let first = store
            .list(Some(&prefix))
            .try_next()
            .await
            .map_err(store_error)
            .context(|| format!("cannot list {self}"))?;
        Ok(first.is_some())
    }

    /// The names of the folders directly below this location, sorted (none if it does not
    /// exist).
    pub(crate) async fn list_dirs(&self) -> Result<Vec<String>> {
        let mut out = match self {
            Location::Local(dir) => {
                if !dir.is_dir() {
                    return Ok(Vec::new());
                }
                std::fs::read_dir(dir)
                    .context(|| format!("cannot list {}", dir.display()))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.is_dir())
                    .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
                    .collect::<Vec<_>>()
            }
            Location::Object(_) => {
                let Some((store, prefix)) = self.store()? else {
                    return Ok(Vec::new());
                };
                let listing = store
                    .list_with_delimiter(Some(&prefix))
                    .await
                    .map_err(store_error)
                    .context(|| format!("cannot list {self}"))?;
                listing
                    .common_prefixes
                    .iter()
                    .filter_map(|p| p.filename().map(str::to_string))
                    .collect()
            }
        };
        out.sort();
        Ok(out)
    }

    /// The newest modification time of anything below this location (a local folder's
    /// own time; an object prefix's newest object), `None` if it cannot be told.
    pub(crate) async fn modified(&self) -> Option<std::time::SystemTime> {
        match self {
            Location::Local(dir) => std::fs::metadata(dir).ok()?.modified().ok(),
            Location::Object(_) => {
                let (store, prefix) = self.store().ok()??;
                let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await.ok()?;
                let newest = objects.iter().map(|o| o.last_modified).max()?;
                Some(std::time::SystemTime::from(newest))
            }
        }
    }

    /// Moves everything below this location to `to` (a folder rename on a local file
    /// system; a copy of each object then its removal on an object store, so an
    /// interrupted move leaves objects in both places and is completed by running it
    /// again). Nothing to move is not an error. Returns whether anything was moved.
    pub(crate) async fn move_to(&self, to: &Location) -> Result<bool> {
        match (self, to) {
            (Location::Local(from), Location::Local(to)) => {
                if !from.exists() {
                    return Ok(false);
                }
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent)
                        .context(|| format!("cannot create {}", parent.display()))?;
                }
                std::fs::rename(from, to)
                    .context(|| format!("cannot move {} to {}", from.display(), to.display()))?;
                Ok(true)
            }
            _ => {
                let (Some((store, from)), Some((_, dest))) = (self.store()?, to.store()?) else {
                    return Err(EngineError::internal(format!(
                        "moving {self} to {to}: both must be on one object store"
                    )));
                };
                let objects = self.objects(&store, &from).await?;
                for o in &objects {
                    let rest = o.location.prefix_match(&from).into_iter().flatten();
                    let target = rest.fold(dest.clone(), |p, part| p.join(part));
                    store
                        .rename(&o.location, &target)
                        .await
                        .map_err(store_error)
                        .context(|| format!("cannot move {} to {target}", o.location))?;
                }
                Ok(!objects.is_empty())
            }
        }
    }

    /// Removes the file `file` below this location; none there is not an error.
    pub(crate) async fn remove_file(&self, file: &str) -> Result<()> {
        match self {
            Location::Local(p) => match std::fs::remove_file(p.join(file)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e).context(|| format!("cannot remove {}", p.join(file).display())),
            },
            Location::Object(_) => {
                let Some((store, prefix)) = self.store()? else {
                    return Ok(());
                };
                match store.delete(&below(&prefix, file)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => {
                        Err(store_error(e)).context(|| format!("cannot remove {self}/{file}"))
                    }
                }
            }
        }
    }

    /// Removes everything below this location; nothing there is not an error.
    pub(crate) async fn remove_all(&self) -> Result<()> {
        match self {
            Location::Local(dir) => {
                if dir.exists() {
                    std::fs::remove_dir_all(dir)
                        .context(|| format!("cannot remove {}", dir.display()))?;
                }
                Ok(())
            }
            Location::Object(_) => {
                let Some((store, prefix)) = self.store()? else {
                    return Ok(());
                };
                let objects = self.objects(&store, &prefix).await?;
                for o in objects {
                    match store.delete(&o.location).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => {
                            return Err(store_error(e))
                                .context(|| format!("cannot remove {}", o.location))
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// The object `file` below `prefix`, `file` being a relative name that may hold `/`
/// (`sub/002.json`): one path part per segment, where `Path::join` would encode the `/`
/// into a single part (`sub%2F002.json`, an object nobody wrote).
fn below(prefix: &StorePath, file: &str) -> StorePath {
    file.split('/')
        .filter(|part| !part.is_empty())
        .fold(prefix.clone(), |path, part| path.join(part))
}

/// An object store's error as one line, with a hint when the store refused the
/// credentials (the message carries the store's answer, never a secret).
pub(crate) fn store_error(e: object_store::Error) -> std::io::Error {
    let text = e.to_string();
    let mut line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.contains("403 Forbidden") || line.contains("401 Unauthorized") {
        line.push_str(
            " (the object store refused the credentials: check AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY, or the AZURE_* / GOOGLE_* settings, and their permissions)",
        );
    }
    std::io::Error::other(line)
}

/// The store (at its root: bucket or container) for an object URL, built once per bucket
/// from the environment.
fn store_for(url: &Url) -> DeltaResult<Arc<dyn ObjectStore>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    let key = format!("{}://{}", url.scheme(), url.authority());
    let stores = STORES.get_or_init(Mutex::default);
    if let Some(s) = stores.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return Ok(s);
    }
    let store = build_store(url, &HashMap::new())?;
    if let Ok(mut m) = stores.lock() {
        m.insert(key, store.clone());
    }
    Ok(store)
}

/// A store for `url` with its settings from the environment, then `options` (deltalake's
/// storage options, which strata itself never sets).
fn build_store(url: &Url, options: &HashMap<String, String>) -> DeltaResult<Arc<dyn ObjectStore>> {
    let store: Arc<dyn ObjectStore> = match url.scheme() {
        "s3" | "s3a" => {
            let mut b = AmazonS3Builder::from_env().with_url(url.as_str());
            for (k, v) in options {
                if let Ok(key) = k.to_ascii_lowercase().parse() {
                    b = b.with_config(key, v);
                }
            }
            Arc::new(b.build()?)
        }
        "gs" => {
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
            for (k, v) in options {
                if let Ok(key) = k.to_ascii_lowercase().parse() {
                    b = b.with_config(key, v);
                }
            }
            Arc::new(b.build()?)
        }
        "az" | "abfs" | "abfss" | "azure" => {
            let mut b = MicrosoftAzureBuilder::from_env().with_url(url.as_str());
            for (k, v) in options {
                if let Ok(key) = k.to_ascii_lowercase().parse() {
                    b = b.with_config(key, v);
                }
            }
            Arc::new(b.build()?)
        }
        _ => return Err(DeltaTableError::InvalidTableLocation(url.to_string())),
    };
    Ok(store)
}

/// The store at the root (bucket, container) of the object URL `url`, with its settings from
/// the environment, as strata's tables reach it: for a cluster's processes, which read the
/// same files.
pub fn object_store_for(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    if !OBJECT_SCHEMES.contains(&url.scheme()) {
        return Err(EngineError::BadInput(format!(
            "{}:// is not an object store strata opens (it opens {})",
            url.scheme(),
            OBJECT_SCHEMES.join(", ")
        )));
    }
    store_for(url).map_err(|e| {
        EngineError::BadInput(format!(
            "opening {}://{}: {e}",
            url.scheme(),
            url.authority()
        ))
    })
}

/// deltalake's way to our stores.
struct EnvStores;

impl ObjectStoreFactory for EnvStores {
    fn parse_url_opts(
        &self,
        url: &Url,
        config: &StorageConfig,
    ) -> DeltaResult<(ObjectStoreRef, StorePath)> {
        let store = if config.raw.is_empty() {
            store_for(url)?
        } else {
            build_store(url, &config.raw)?
        };
        let path = StorePath::from_url_path(url.path())?;
        Ok((store, path))
    }
}

impl LogStoreFactory for EnvStores {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> DeltaResult<Arc<dyn LogStore>> {
        Ok(default_logstore(
            prefixed_store,
            root_store,
            location,
            options,
        ))
    }
}

/// Registers [`EnvStores`] for every scheme of [`OBJECT_SCHEMES`] with deltalake (once).
pub(crate) fn register_object_stores() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let factory = Arc::new(EnvStores);
        for scheme in OBJECT_SCHEMES {
            let Ok(url) = Url::parse(&format!("{scheme}://")) else {
                continue;
            };
            object_store_factories().insert(url.clone(), factory.clone());
            logstore_factories().insert(url, factory.clone());
        }
    });
}

/// Whether the local log folder `log` holds a commit or a checkpoint. A writer killed while
/// creating a table can leave the folder empty, or holding only a temporary file: that is no
/// table yet. (An object store has no folders, and its puts are whole.)
fn holds_a_version(log: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(log) else {
        return false;
    };
    entries
        .flatten()
        .any(|e| is_version_file(&e.file_name().to_string_lossy()))
}

/// Whether `name` is a file of a Delta log version: a commit (`00000000000000000003.json`),
/// a checkpoint (`...03.checkpoint.parquet`, multi-part or v2) or a log compaction, not a
/// writer's temporary file or `_last_checkpoint`.
fn is_version_file(name: &str) -> bool {
    let digits = name.bytes().take_while(u8::is_ascii_digit).count();
    digits == 20
        && (name.ends_with(".json") || name.ends_with(".parquet"))
        && name.as_bytes().get(20) == Some(&b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_commits_and_checkpoints_make_a_table() {
        for name in [
            "00000000000000000000.json",
            "00000000000000000010.checkpoint.parquet",
            "00000000000000000010.checkpoint.0000000001.0000000002.parquet",
            "00000000000000000000.00000000000000000005.compacted.json",
        ] {
            assert!(is_version_file(name), "{name}");
        }
        for name in [
            "_last_checkpoint",
            "00000000000000000000.json#1",
            "_commit_5f1c.json.tmp",
            ".00000000000000000000.json.crc",
            "0000000000000000000.json",
        ] {
            assert!(!is_version_file(name), "{name}");
        }
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("_delta_log");
        std::fs::create_dir(&log).unwrap();
        assert!(!holds_a_version(&log), "an empty log folder");
        std::fs::write(log.join("00000000000000000000.json#1"), "{}").unwrap();
        assert!(!holds_a_version(&log), "a writer's temporary file");
        std::fs::write(log.join("00000000000000000000.json"), "{}").unwrap();
        assert!(holds_a_version(&log));
    }

    #[test]
    fn file_urls_are_folders_and_object_urls_are_prefixes() {
        assert_eq!(
            Location::parse("wh", "w").unwrap(),
            Location::Local(PathBuf::from("wh"))
        );
        assert_eq!(
            Location::parse("file:///tmp/wh", "w").unwrap(),
            Location::Local(PathBuf::from("/tmp/wh"))
        );
        let s3 = Location::parse("s3://lake/wh", "warehouse").unwrap();
        assert_eq!(s3.to_string(), "s3://lake/wh");
        assert_eq!(
            s3.join("default").join("users").to_string(),
            "s3://lake/wh/default/users"
        );
        assert_eq!(s3.join("default/users").name().as_deref(), Some("users"));
        assert!(Location::parse("abfss://c@a.dfs.core.windows.net/wh", "w").is_ok());
        assert!(Location::parse("gs://b", "w").is_ok());
        let e = Location::parse("ftp://x/y", "warehouse")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ftp://") && e.contains("s3://"), "{e}");
        assert!(Location::parse("s3:///x", "w").is_err());
        let e = Location::parse("s3://key:secret@b/x", "w")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(
            Location::parse("odd dir://x", "w").unwrap(),
            Location::Local(PathBuf::from("odd dir://x"))
        );
    }

    #[test]
    fn a_file_in_a_subfolder_of_a_prefix_is_one_object_per_segment() {
        let prefix = StorePath::from("wh/data/m");
        assert_eq!(
            below(&prefix, "sub/002.json").as_ref(),
            "wh/data/m/sub/002.json"
        );
        assert_eq!(below(&prefix, "001.json").as_ref(), "wh/data/m/001.json");
    }
}
