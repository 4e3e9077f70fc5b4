//! Input files: listing a `read_files` folder and reading one file (with DataFusion, or
//! Auto Loader style).

use crate::error::{Context, EngineError, Result};
use crate::ops::ingest::arrow_schema;
use crate::ops::ingest::autoload;
use crate::ops::ingest::IngestSetup;
use crate::ops::ingest::Source;
use crate::storage::location::Location;
use crate::util::glob::Glob;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{Schema, SchemaRef};
use deltalake::datafusion::prelude::CsvReadOptions;
use deltalake::datafusion::prelude::DataFrame;
use deltalake::datafusion::prelude::JsonReadOptions;
use deltalake::datafusion::prelude::ParquetReadOptions;
use deltalake::datafusion::prelude::SessionContext;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use strata_sql::FileFormat;
use strata_sql::ReadFiles;

/// A `read_files` folder: a local one, or an object-store prefix whose files are copied
/// into a local staging folder (removed with the last clone of this value) as they are read,
/// so that every reader of input files (DataFusion's, Auto Loader's, Debezium's, Parquet
/// adoption) works on local files alike.
#[derive(Debug, Clone)]
pub(crate) struct InputDir {
    /// The folder (or file) to read; for object storage, the staging folder.
    local: PathBuf,
    remote: Option<(Location, Arc<tempfile::TempDir>)>,
    /// The glob of a path like `data/*.csv`, below the folder (`data`): only the files it
    /// matches are input.
    glob: Option<Glob>,
}

impl InputDir {
    /// The input at `location` (a local path is taken as it is, relative to the current
    /// folder unless absolute).
    pub(crate) fn new(location: Location) -> Result<InputDir> {
        match location {
            Location::Local(local) => Ok(InputDir {
                local,
                remote: None,
                glob: None,
            }),
            remote => {
                let staging = tempfile::Builder::new()
                    .prefix("strata-input-")
                    .tempdir()
                    .context(|| format!("cannot create a staging folder for {remote}"))?;
                Ok(InputDir {
                    local: staging.path().to_path_buf(),
                    remote: Some((remote, Arc::new(staging))),
                    glob: None,
                })
            }
        }
    }

    /// The input of read_files path `path` (relative to the pipeline's folder `dir`): a
    /// folder, a file or an object-store prefix, or with a glob (`data/*.csv`, Spark's glob
    /// characters: `util/glob.rs`) the folder before the glob and the files below it the
    /// glob matches. The inner error says what is wrong with the glob.
    pub(crate) fn at(path: &str, dir: &Path) -> Result<std::result::Result<InputDir, String>> {
        let (base, pattern) = crate::util::glob::split(path);
        let input = match Location::parse(&base, "read_files path")? {
            Location::Local(p) => InputDir::new(Location::Local(dir.join(p)))?,
            remote => InputDir::new(remote)?,
        };
        Ok(match pattern {
            None => Ok(input),
            Some(p) => Glob::new(&p).map(|glob| input.with_glob(glob)),
        })
    }

    /// Only the files below the folder that `glob` matches are input.
    pub(crate) fn with_glob(self, glob: Glob) -> InputDir {
        InputDir {
            glob: Some(glob),
            ..self
        }
    }

    /// The glob the input's files are matched against, if any.
    pub(crate) fn glob(&self) -> Option<&Glob> {
        self.glob.as_ref()
    }

    /// Whether the input exists (a local path; anything below an object prefix; with a
    /// glob, a file it matches).
    pub(crate) async fn exists(&self) -> Result<bool> {
        let folder = match &self.remote {
            None => self.local.exists(),
            Some((remote, _)) => remote.exists().await?,
        };
        match (&self.glob, folder) {
            (Some(_), true) => Ok(!self.list().await?.is_empty()),
            (_, folder) => Ok(folder),
        }
    }

    /// Every input file, relative names, sorted (see [`list_files`]); with a glob, those it
    /// matches.
    pub(crate) async fn list(&self) -> Result<Vec<String>> {
        let mut files = match &self.remote {
            None => list_files(&self.local)?,
            Some((remote, _)) => remote.list_files().await?,
        };
        if let Some(glob) = &self.glob {
            files.retain(|f| glob.matches(&f.replace('\\', "/")));
        }
        Ok(files)
    }

    /// The local path of input file `name` (as [`InputDir::list`] names it), copied from
    /// the object store first when the input is there.
    pub(crate) async fn file(&self, name: &str) -> Result<PathBuf> {
        let path = input_root(&self.local).join(name);
        let Some((remote, _)) = &self.remote else {
            return Ok(path);
        };
        if !path.exists() {
            let (bytes, modified) = remote
                .read_file_dated(name)
                .await?
                .ok_or_else(|| EngineError::BadInput(format!("file {remote}/{name} is gone")))?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)
                    .context(|| format!("cannot create {}", parent.display()))?;
            }
            std::fs::write(&path, &bytes).context(|| format!("cannot write {}", path.display()))?;
            // The staged copy keeps the object's time: `_metadata.file_modification_time`.
            if let Some(t) = modified {
                std::fs::File::options()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(t))
                    .context(|| format!("cannot set the time of {}", path.display()))?;
            }
        }
        Ok(path)
    }

    /// Input file `name` as the user knows it: its local path, or its object URL (not the
    /// staged copy's path): `_metadata.file_path`.
    pub(crate) fn shown(&self, name: &str) -> String {
        match &self.remote {
            None => input_root(&self.local).join(name).display().to_string(),
            Some((remote, _)) => format!("{remote}/{name}"),
        }
    }

    /// Where the input is, as the user named it.
    pub(crate) fn display(&self) -> String {
        match &self.remote {
            None => self.local.display().to_string(),
            Some((remote, _)) => remote.to_string(),
        }
    }
}

/// Every input file under `dir` (or `dir` itself if it is a file), relative names, sorted.
/// Names starting with `.` or `_` are skipped, as Spark does, and so are empty files: a
/// writer that creates a file before filling it would otherwise have it taken with no rows
/// and its content never read. An empty file is taken once it has bytes.
pub(crate) fn list_files(dir: &Path) -> Result<Vec<String>> {
    if dir.is_file() {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let empty = std::fs::metadata(dir).is_ok_and(|m| m.len() == 0);
        return Ok(match empty {
            true => Vec::new(),
            false => vec![name.to_string()],
        });
    }
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        let entries =
            std::fs::read_dir(&abs).context(|| format!("cannot list {}", abs.display()))?;
        for entry in entries {
            let entry = entry.context(|| format!("cannot list {}", abs.display()))?;
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            let child = rel.join(&name);
            let meta = std::fs::metadata(entry.path())
                .context(|| format!("cannot read {}", entry.path().display()))?;
            if meta.is_dir() {
                stack.push(child);
            } else if meta.len() > 0 {
                out.push(child.to_string_lossy().to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

pub(crate) fn input_root(dir: &Path) -> PathBuf {
    if dir.is_file() {
        dir.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        dir.to_path_buf()
    }
}

/// Reads one input file into a DataFrame, with the declared schema if any.
pub(crate) async fn read_file(
    ctx: &SessionContext,
    path: &Path,
    spec: &ReadFiles,
) -> Result<DataFrame> {
    let path_str = path.to_string_lossy().to_string();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let schema = spec.schema.as_ref().map(|s| arrow_schema(s));
    let result = match spec.format {
        FileFormat::Json => {
            let mut opts = JsonReadOptions::default().file_extension(&ext);
            if let Some(s) = &schema {
                opts = opts.schema(s);
            }
            ctx.read_json(path_str, opts).await
        }
        FileFormat::Csv => {
            let mut opts = CsvReadOptions::new()
                .has_header(spec.header)
                .delimiter(spec.delimiter)
                .file_extension(&ext);
            if let Some(s) = &schema {
                opts = opts.schema(s);
            }
            ctx.read_csv(path_str, opts).await
        }
        FileFormat::Parquet => {
            let mut opts = ParquetReadOptions::default().file_extension(&ext);
            if let Some(s) = &schema {
                opts = opts.schema(s);
            }
            ctx.read_parquet(path_str, opts)
                .await
                .and_then(crate::util::arrow::wall_clocks_in_micros)
        }
        FileFormat::Debezium => return read_debezium(ctx, path, schema),
    };
    result.map_err(|e| EngineError::BadInput(format!("file {}: {e}", path.display())))
}

/// One Debezium change file (JSON lines) as a DataFrame in the row shape of database CDC:
/// the table's columns (from the embedded schema, else `declared`), then the change columns.
fn read_debezium(
    ctx: &SessionContext,
    path: &Path,
    declared: Option<SchemaRef>,
) -> Result<DataFrame> {
    let bad = |e: String| EngineError::BadInput(format!("file {}: {e}", path.display()));
    let bytes = std::fs::read(path).context(|| format!("cannot read {}", path.display()))?;
    let options = strata_sources::DebeziumOptions {
        schema: declared.clone(),
        ..Default::default()
    };
    let batches = strata_sources::read_debezium(&bytes, &path.display().to_string(), options)
        .map_err(|e| bad(e.to_string()))?;
    let batches = match (batches.is_empty(), declared) {
        (false, _) => batches,
        // Only tombstones or messages: no rows, in the declared columns.
        (true, Some(table)) => {
            let mut fields: Vec<_> = table.fields().iter().map(|f| f.as_ref().clone()).collect();
            fields.extend(strata_sources::change_meta_fields());
            vec![RecordBatch::new_empty(Arc::new(Schema::new(fields)))]
        }
        (true, None) => {
            return Err(bad(
                "no change event to learn the table's columns from; give them with schema => '...'"
                    .into(),
            ))
        }
    };
    ctx.read_batches(batches).map_err(|e| bad(e.to_string()))
}

/// One input file as a DataFrame: read Auto Loader style (inferred or declared columns,
/// rescued data) or with DataFusion's reader, with `_metadata` when the query asks for it.
pub(super) async fn read_input_file(
    setup: &IngestSetup,
    path: &std::path::Path,
    file: &str,
) -> Result<DataFrame> {
    let Source::Files {
        dir,
        spec,
        mode,
        input,
        ..
    } = &setup.source
    else {
        return Err(EngineError::internal("not a file source"));
    };
    let ctx = crate::storage::session::file_session();
    let df = match (mode, input) {
        (autoload::Mode::Autoload { rescued, inferred }, Some(columns)) => {
            let batch = autoload::read(
                path,
                file,
                spec,
                &autoload::schema_of(columns),
                rescued.as_str(),
                !inferred,
            )?;
            ctx.read_batch(batch)
                .context(|| format!("file {}", path.display()))?
        }
        _ => read_file(&ctx, path, spec).await?,
    };
    match autoload::wants_metadata(&setup.query_sql) {
        true => autoload::with_metadata(df, path, &dir.shown(file)),
        false => Ok(df),
    }
}

/// The files a batch query reads (a materialized view's `read_files(...)` or
/// ``parquet.`path` ``), relative to the pipeline's folder `dir`: every file, read and put
/// together by column name (read before the staged copies of object-store files go), and
/// the files' names; `None` when there is no file yet.
///
/// read_files reads as a streaming table does (columns inferred across all the files, with
/// `_rescued_data`; or declared). A direct read uses Spark's reader defaults: Parquet and
/// JSON with their own columns, CSV without a header, every column `_c0`, `_c1`, ... a
/// STRING.
pub(crate) async fn read_batch_files(
    read: &strata_sql::FileRead,
    dir: &Path,
) -> Result<Option<(SchemaRef, Vec<RecordBatch>, Vec<String>)>> {
    let spec = &read.spec;
    let bad = |e: String| EngineError::plan(format!("read_files path {}: {e}", spec.path));
    let input = InputDir::at(&spec.path, dir)?.map_err(bad)?;
    if !input.exists().await? {
        return Err(bad(match input.glob() {
            Some(g) => format!("no file matches the glob {}", g.as_str()),
            None => "does not exist".into(),
        }));
    }
    let names = input.list().await?;
    if names.is_empty() {
        return Ok(None);
    }
    let mut paths = Vec::with_capacity(names.len());
    for n in &names {
        paths.push(input.file(n).await?);
    }
    let ctx = crate::storage::session::file_session();
    let text_spec;
    let (spec, columns, rescued, keep_extra) = match (read.direct, spec.format) {
        (true, FileFormat::Csv) => {
            let mut s = spec.clone();
            s.other_options
                .insert("infercolumntypes".into(), "false".into());
            text_spec = s;
            let columns = autoload::infer(&paths, &text_spec)?;
            (&text_spec, Some(columns), String::new(), false)
        }
        (true, _) => (spec, None, String::new(), false),
        (false, _) => match autoload::mode(spec)? {
            autoload::Mode::Declared => (spec, None, String::new(), false),
            autoload::Mode::Autoload { rescued, inferred } => {
                let columns = match inferred {
                    true => autoload::merge(&[], &autoload::infer(&paths, spec)?, &rescued),
                    false => {
                        let declared: Vec<(String, deltalake::arrow::datatypes::DataType)> = spec
                            .schema
                            .iter()
                            .flatten()
                            .map(|c| (c.name.clone(), c.data_type.clone()))
                            .collect();
                        autoload::merge(&declared, &[], &rescued)
                    }
                };
                (spec, Some(columns), rescued, !inferred)
            }
        },
    };
    let mut all: Option<DataFrame> = None;
    for (name, path) in names.iter().zip(&paths) {
        let df = match &columns {
            Some(columns) => {
                let schema = autoload::schema_of(columns);
                let batch = autoload::read(path, name, spec, &schema, &rescued, keep_extra)?;
                ctx.read_batch(batch)
                    .context(|| format!("file {}", path.display()))?
            }
            None => read_file(&ctx, path, spec).await?,
        };
        all = Some(match all {
            None => df,
            Some(before) => before
                .union_by_name(df)
                .map_err(|e| bad(format!("file {}: {e}", path.display())))?,
        });
    }
    let Some(df) = all else {
        return Ok(None);
    };
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await.map_err(|e| bad(format!("{e}")))?;
    Ok(Some((schema, batches, names)))
}

/// A line of a JSON Lines file that is not a JSON value.
#[derive(Debug, PartialEq)]
pub(crate) struct BadLine {
    /// 1-based.
    pub(crate) line: usize,
    /// 1-based, within the line.
    pub(crate) column: usize,
    /// The parser's reason.
    pub(crate) why: String,
    /// The text ends inside this value: the last line, cut short (a file still being
    /// written, or a copy that stopped).
    pub(crate) cut_short: bool,
}

impl std::fmt::Display for BadLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}, column {}: ", self.line, self.column)?;
        match self.cut_short {
            true => write!(
                f,
                "the file ends inside this line's JSON value ({}); if it is still being \
                 written, nothing was taken from it and a later run takes it once it is whole",
                self.why
            ),
            false => write!(f, "not valid JSON: {}", self.why),
        }
    }
}

/// The first line of JSON Lines `text` that does not parse, if any.
pub(crate) fn first_bad_json_line(text: &str) -> Option<BadLine> {
    let lines: Vec<&str> = text.lines().collect();
    lines.iter().enumerate().find_map(|(i, line)| {
        if line.trim().is_empty() {
            return None;
        }
        let e = serde_json::from_str::<serde::de::IgnoredAny>(line).err()?;
        let why = e.to_string();
        let why = why
            .rsplit_once(" at line ")
            .map(|(reason, _)| reason.to_string())
            .unwrap_or(why);
        Some(BadLine {
            line: i + 1,
            column: e.column(),
            why,
            cut_short: e.is_eof() && i + 1 == lines.len() && !text.ends_with('\n'),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_that_does_not_parse_is_named() {
        assert_eq!(first_bad_json_line("{\"a\": 1}\n\n{\"a\": 2}\n"), None);
        let cut = first_bad_json_line("{\"a\": 1}\n{\"a\": \"x").expect("bad");
        assert_eq!((cut.line, cut.cut_short), (2, true));
        assert!(
            cut.to_string()
                .starts_with("line 2, column 8: the file ends"),
            "{cut}"
        );
        let bad = first_bad_json_line("{\"a\": 1}\n{\"a\": }\n{\"a\": 3}\n").expect("bad");
        assert_eq!((bad.line, bad.cut_short), (2, false));
        assert!(
            bad.to_string().contains("not valid JSON: expected value"),
            "{bad}"
        );
        // A line cut short that is followed by a newline is bad, not still being written.
        let ended = first_bad_json_line("{\"a\": \n").expect("bad");
        assert!(!ended.cut_short);
    }
}
