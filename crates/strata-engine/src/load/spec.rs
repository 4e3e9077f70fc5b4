//! YAML pipeline specs: settings kept out of SQL, and a metadata-driven table list.
//!
//! ```yaml
//! name: shop
//! warehouse: ./warehouse          # relative to this file; --warehouse overrides
//! configuration: { source_root: data }
//! libraries: [sql/gold.sql]       # SQL files, relative to this file
//! tables:                         # one generated ingestion + AUTO CDC flow each
//!   - name: customers
//!     source: { path: "${source_root}/customers", format: json, schema: "id INT, op STRING, ts BIGINT" }
//!     keys: [id]
//!     sequence_by: ts
//!     stored_as: SCD TYPE 2
//! notifications:                  # who is told of a run's outcome (load/settings.rs)
//!   - { email_recipients: [oncall@example.com], alerts: [on-update-failure] }
//! smtp: { host: mail.example.com, from: strata@example.com }
//! ```
//!
//! Each entry of `tables` becomes Lakeflow SQL ([`table_sql`]): a streaming table
//! `<name>_raw` over `read_files` (not for `source: { table: t }`, which reads an existing
//! streaming table), the target `<name>` and the flow `<name>_flow`. The generated text and
//! the libraries are planned and run as one pipeline ([`crate::load::sources`]), after the
//! `configuration` values (and `--conf`, which wins) are substituted for `${key}` in each.
//!
//! Unknown keys are errors, and every error names the spec file and, for an entry, `tables[i]
//! (name)`. The YAML reader is `serde_norway` (see the workspace manifest for why).

use crate::error::{Context, EngineError, Result};
use crate::load::settings::{Notification, Smtp, UpdateSettings};
use crate::load::sources::{PipelineSource, SourceKind};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The file format of a spec, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    name: String,
    #[serde(default)]
    warehouse: Option<String>,
    #[serde(default)]
    schema: Option<String>,
    /// The catalog name the warehouse answers to in three-part names (`main` by default).
    #[serde(default)]
    catalog: Option<String>,
    #[serde(default)]
    configuration: BTreeMap<String, Scalar>,
    #[serde(default)]
    libraries: Vec<String>,
    /// Databases the tables (and libraries) read, by name.
    #[serde(default)]
    connections: BTreeMap<String, ConnectionEntry>,
    #[serde(default)]
    tables: Vec<TableEntry>,
    /// Who is told of a run's outcome, and the server that sends the e-mail.
    #[serde(default)]
    notifications: Vec<Notification>,
    #[serde(default)]
    smtp: Option<Smtp>,
}

/// `shop: { type: postgresql, host: db, port: 5432, database: shop, user: etl,
/// password_env: SHOP_PW }`: a `CREATE CONNECTION` (no password: see docs/sources.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnectionEntry {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    port: Option<Scalar>,
    database: String,
    user: String,
    #[serde(default)]
    password_env: Option<String>,
    /// Driver options (`sslmode`, `connect_timeout`, ...).
    #[serde(default)]
    options: BTreeMap<String, Scalar>,
}

use strata_sql::CHANGE_COLUMNS;

/// `CREATE CONNECTION name TYPE kind OPTIONS (...)` for a spec's connection.
fn connection_sql(name: &str, c: &ConnectionEntry) -> Result<String, String> {
    let word = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !word(name) {
        return Err(format!(
            "`{name}` is not a connection name (letters, digits, _)"
        ));
    }
    if !word(&c.kind) {
        return Err(format!("type: `{}` is not a connection type", c.kind));
    }
    let mut options = vec![
        ("database".to_string(), c.database.clone()),
        ("user".to_string(), c.user.clone()),
    ];
    options.extend(c.host.iter().map(|h| ("host".to_string(), h.clone())));
    options.extend(c.port.iter().map(|p| ("port".to_string(), p.text())));
    options.extend(
        c.password_env
            .iter()
            .map(|v| ("password_env".to_string(), v.clone())),
    );
    for (k, v) in &c.options {
        if !word(k) {
            return Err(format!(
                "options: `{k}` is not an option name (letters, digits, _)"
            ));
        }
        options.push((k.clone(), v.text()));
    }
    let options: Vec<String> = options
        .iter()
        .map(|(k, v)| format!("{k} {}", string(v)))
        .collect();
    Ok(format!(
        "CREATE CONNECTION {name} TYPE {} OPTIONS ({});\n",
        c.kind,
        options.join(", ")
    ))
}

/// A configuration or property value: YAML may type `2` or `true`, SQL sees text.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string, number or boolean")]
enum Scalar {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    fn text(&self) -> String {
        match self {
            Scalar::Text(s) => s.clone(),
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

/// One metadata-driven table: where its changes come from and how to keep them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TableEntry {
    name: String,
    source: SourceEntry,
    keys: Vec<String>,
    #[serde(default)]
    sequence_by: Option<String>,
    #[serde(default)]
    stored_as: Option<String>,
    /// Alias of `stored_as`: `1` or `2`.
    #[serde(default)]
    scd_type: Option<u8>,
    #[serde(default)]
    delete_when: Option<String>,
    #[serde(default)]
    truncate_when: Option<String>,
    #[serde(default)]
    ignore_null_updates: bool,
    /// `COLUMNS a, b`.
    #[serde(default)]
    columns: Option<Vec<String>>,
    /// `COLUMNS * EXCEPT (...)`.
    #[serde(default)]
    except_columns: Vec<String>,
    /// `TRACK HISTORY ON a, b`.
    #[serde(default)]
    track_history_on: Option<Vec<String>>,
    /// `TRACK HISTORY ON * EXCEPT (...)`.
    #[serde(default)]
    track_history_except: Option<Vec<String>>,
    /// `AUTO CDC FROM SNAPSHOT` (implied by `snapshot_version_by`).
    #[serde(default)]
    snapshot: bool,
    #[serde(default)]
    snapshot_version_by: Option<String>,
    /// The target's `TBLPROPERTIES` (e.g. `strata.scd.convention: kimball`).
    #[serde(default)]
    table_properties: BTreeMap<String, Scalar>,
}

/// `{ path, format, schema, header, sep, options }` (files), `{ table }` (a streaming table
/// of the pipeline), or `{ database, table | query, watermark, overlap, exclude }` /
/// `{ database, table, cdc: true }` (a database, see docs/sources.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceEntry {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    table: Option<String>,
    /// A connection of the spec: the source is that database's `table` or `query`.
    #[serde(default)]
    database: Option<String>,
    #[serde(default)]
    query: Option<String>,
    #[serde(default)]
    watermark: Option<Vec<String>>,
    #[serde(default)]
    overlap: Option<Scalar>,
    /// A watermark load's commits: at most this many bytes / rows held before one.
    #[serde(default)]
    chunk_bytes: Option<Scalar>,
    #[serde(default)]
    chunk_rows: Option<Scalar>,
    /// PostgreSQL: ranges of the leading watermark column read concurrently.
    #[serde(default)]
    parallel: Option<Scalar>,
    /// A watermark load's first run: `scan` (the default) or `chunks`.
    #[serde(default)]
    first_load: Option<Scalar>,
    #[serde(default)]
    exclude: Vec<String>,
    /// Read the table's change log (PostgreSQL) instead of a watermark.
    #[serde(default)]
    cdc: bool,
    #[serde(default)]
    slot: Option<String>,
    #[serde(default)]
    publication: Option<String>,
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    schema: Option<String>,
    #[serde(default)]
    header: Option<bool>,
    #[serde(default)]
    sep: Option<String>,
    /// Any other `read_files` option, passed through as written.
    #[serde(default)]
    options: BTreeMap<String, Scalar>,
}

/// A pipeline ready to plan: its SQL sources, where relative paths resolve, and its settings.
#[derive(Debug, Clone)]
pub struct LoadedPipeline {
    /// The spec's `name`; `None` for a plain SQL file.
    pub name: Option<String>,
    /// Relative paths inside the pipeline resolve against this folder.
    pub dir: PathBuf,
    /// The spec's `warehouse`, resolved against the spec's folder.
    pub warehouse: Option<PathBuf>,
    pub sources: Vec<PipelineSource>,
    /// The spec's `configuration` overridden by the caller's values.
    pub configuration: BTreeMap<String, String>,
    /// The schema of unqualified table names (the spec's `schema`, else `default`).
    pub schema: String,
    /// The spec's `catalog`: the warehouse's name in three-part names.
    pub catalog: Option<String>,
    /// Retries and notifications (the spec's and the configuration's).
    pub(crate) settings: UpdateSettings,
    /// The spec's `.py` libraries (Lakeflow's Python API), resolved against the spec's
    /// folder, which only the Python package runs ([`load_pipeline_with_python`]); their
    /// declarations join [`LoadedPipeline::sources`] as generated SQL.
    pub python_libraries: Vec<PathBuf>,
}

/// Whether `path` names a YAML spec (`.yaml` / `.yml`) rather than a SQL file.
pub fn is_spec(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

/// Reads a pipeline: a YAML spec (its libraries and the SQL generated from its tables) or
/// one SQL file. `configuration` overrides the spec's values. A spec listing a Python
/// library is an error saying to run it with the Python package.
pub fn load_pipeline(
    path: &Path,
    configuration: &BTreeMap<String, String>,
) -> Result<LoadedPipeline> {
    load(path, configuration, false)
}

/// [`load_pipeline`] keeping a spec's `.py` libraries aside in
/// [`LoadedPipeline::python_libraries`], for the Python package to run them.
pub fn load_pipeline_with_python(
    path: &Path,
    configuration: &BTreeMap<String, String>,
) -> Result<LoadedPipeline> {
    load(path, configuration, true)
}

/// A pipeline's name: a spec's `name`, else its file's name. It keys the pipeline's lock
/// and the folder of its private datasets.
pub(crate) fn pipeline_name(spec_name: Option<&str>, path: &Path) -> String {
    spec_name.map(str::to_string).unwrap_or_else(|| {
        path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into(),
        )
    })
}

/// Reads a pipeline; `python`: whether a spec's `.py` libraries are kept aside (else they
/// are an error).
fn load(
    path: &Path,
    configuration: &BTreeMap<String, String>,
    python: bool,
) -> Result<LoadedPipeline> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).context(|| format!("cannot read {file}"))?;
    let dir = std::fs::canonicalize(path)
        .context(|| format!("cannot resolve {file}"))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    if !is_spec(path) {
        return Ok(LoadedPipeline {
            name: None,
            dir,
            warehouse: None,
            sources: vec![PipelineSource {
                name: file,
                text,
                kind: SourceKind::File,
            }],
            configuration: configuration.clone(),
            schema: strata_sql::TableName::DEFAULT_SCHEMA.to_string(),
            catalog: None,
            settings: UpdateSettings::resolve(Vec::new(), None, configuration)
                .map_err(|m| EngineError::plan(format!("configuration: {m}")))?,
            python_libraries: Vec::new(),
        });
    }
    let spec: Spec =
        serde_norway::from_str(&text).map_err(|e| EngineError::Spec(format!("{file}: {e}")))?;
    let spec_err = |m: String| EngineError::Spec(format!("{file}: {m}"));
    let schema = checked_names(&spec).map_err(spec_err)?;
    let mut conf: BTreeMap<String, String> = spec
        .configuration
        .iter()
        .map(|(k, v)| (k.clone(), v.text()))
        .collect();
    conf.extend(configuration.iter().map(|(k, v)| (k.clone(), v.clone())));
    let settings =
        UpdateSettings::resolve(spec.notifications, spec.smtp, &conf).map_err(spec_err)?;
    // Generated tables first: the libraries usually read them (the order only breaks
    // ties in the execution order).
    let mut sources = generated_sources(&file, &spec.connections, &spec.tables)?;
    let (libraries, python_libraries) =
        library_sources(path, &file, &dir, &spec.libraries, python)?;
    sources.extend(libraries);
    if sources.is_empty() && python_libraries.is_empty() {
        return Err(spec_err(
            "the spec has neither libraries nor tables: nothing to run".into(),
        ));
    }
    Ok(LoadedPipeline {
        name: Some(spec.name),
        warehouse: spec.warehouse.map(|w| dir.join(w)),
        dir,
        sources,
        configuration: conf,
        schema,
        catalog: spec.catalog,
        settings,
        python_libraries,
    })
}

/// The spec's name, schema and catalog checked; the schema its tables go to.
fn checked_names(spec: &Spec) -> std::result::Result<String, String> {
    if spec.name.trim().is_empty() {
        return Err("name: must not be empty".into());
    }
    let schema = match &spec.schema {
        Some(s) if s.trim().is_empty() || s.contains('.') || s.starts_with('_') => {
            return Err(format!(
                "schema: `{s}` is not a schema name (one identifier, not starting with `_`)"
            ))
        }
        Some(s) => s.clone(),
        None => strata_sql::TableName::DEFAULT_SCHEMA.to_string(),
    };
    if let Some(c) = &spec.catalog {
        if c.trim().is_empty() || c.contains('.') || c.contains(char::is_whitespace) {
            return Err(format!(
                "catalog: `{c}` is not a catalog name (one identifier)"
            ));
        }
    }
    Ok(schema)
}

/// The SQL the spec's `connections` and `tables` stand for, one source each (the
/// connections together).
fn generated_sources(
    file: &str,
    connections: &BTreeMap<String, ConnectionEntry>,
    tables: &[TableEntry],
) -> Result<Vec<PipelineSource>> {
    let mut sources = Vec::new();
    if !connections.is_empty() {
        let mut text = String::new();
        for (name, c) in connections {
            let sql = connection_sql(name, c)
                .map_err(|m| EngineError::Spec(format!("{file}: connections.{name}: {m}")))?;
            text.push_str(&sql);
        }
        sources.push(PipelineSource {
            name: format!("{file}: connections"),
            text,
            kind: SourceKind::Generated,
        });
    }
    for (i, entry) in tables.iter().enumerate() {
        let origin = format!("{file}: tables[{i}] ({})", entry.name);
        let text = table_sql(entry).map_err(|m| EngineError::Spec(format!("{origin}: {m}")))?;
        sources.push(PipelineSource {
            name: origin,
            text,
            kind: SourceKind::Generated,
        });
    }
    Ok(sources)
}

/// The spec's SQL libraries, read, and its Python ones (kept aside when `python`, else an
/// error). Paths are relative to the spec; messages name them as reachable from here.
fn library_sources(
    path: &Path,
    file: &str,
    dir: &Path,
    libraries: &[String],
    python: bool,
) -> Result<(Vec<PipelineSource>, Vec<PathBuf>)> {
    let spec_err = |m: String| EngineError::Spec(format!("{file}: {m}"));
    let shown_dir = path.parent().unwrap_or(Path::new(""));
    let mut sources = Vec::new();
    let mut python_libraries = Vec::new();
    for (i, lib) in libraries.iter().enumerate() {
        let lib_path = shown_dir.join(lib);
        let name = lib_path.display().to_string();
        if lib_path.extension().is_some_and(|e| e == "py") {
            if !python {
                return Err(spec_err(format!(
                    "libraries[{i}]: {name} is a Python pipeline file, which the strata \
                     binary does not run: run the spec with the strata Python package, \
                     `python -m strata run {file}` (docs/python.md)"
                )));
            }
            if !lib_path.is_file() {
                return Err(spec_err(format!(
                    "libraries[{i}]: cannot read {name}: no such file"
                )));
            }
            python_libraries.push(dir.join(lib));
            continue;
        }
        let text = std::fs::read_to_string(&lib_path)
            .context(|| format!("{file}: libraries[{i}]: cannot read {name}"))?;
        sources.push(PipelineSource {
            name,
            text,
            kind: SourceKind::File,
        });
    }
    Ok((sources, python_libraries))
}

/// A backtick-quoted identifier (a backtick inside is doubled).
fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// `schema.name` or `name`, each part quoted.
fn table_ident(name: &str) -> String {
    name.split('.').map(ident).collect::<Vec<_>>().join(".")
}

/// A single-quoted string literal under Spark's rules (backslash escapes).
fn string(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn ident_list(names: &[String]) -> String {
    names
        .iter()
        .map(|n| ident(n))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The history mode of an entry as SQL (`SCD TYPE 2`), from `stored_as` or `scd_type`.
fn stored_as(entry: &TableEntry) -> Result<String, String> {
    match (&entry.stored_as, entry.scd_type) {
        (Some(_), Some(_)) => Err("give stored_as or scd_type, not both".into()),
        (None, Some(n @ (1 | 2))) => Ok(format!("SCD TYPE {n}")),
        (None, Some(n)) => Err(format!("scd_type: expected 1 or 2, found {n}")),
        (None, None) => Ok("SCD TYPE 1".into()),
        (Some(s), None) => {
            // A configuration reference is checked by the parser once substituted.
            if s.contains("${") {
                return Ok(s.clone());
            }
            let words: Vec<String> = s.split_whitespace().map(str::to_ascii_uppercase).collect();
            match words.join(" ").as_str() {
                "SCD TYPE 1" | "1" => Ok("SCD TYPE 1".into()),
                "SCD TYPE 2" | "2" => Ok("SCD TYPE 2".into()),
                "SNAPSHOTS" => Ok("SNAPSHOTS".into()),
                _ => Err(format!(
                    "stored_as: expected SCD TYPE 1, SCD TYPE 2 or SNAPSHOTS, found `{s}`"
                )),
            }
        }
    }
}

/// The Lakeflow SQL of one table entry. Names are backtick-quoted and option values are
/// string literals; `sequence_by`, `delete_when`, `truncate_when` and
/// `snapshot_version_by` are SQL expressions and are copied as written.
///
/// ```text
///  check_entry ─▶ source_sql ─▶ target_sql ─▶ flow_sql
///  (the entry's    (the raw table  (the target   (the AUTO CDC flow
///   keys agree)     it reads)       table)        into it)
/// ```
pub(crate) fn table_sql(entry: &TableEntry) -> Result<String, String> {
    let checked = check_entry(entry)?;
    let mut sql = String::new();
    let source = source_sql(entry, checked.name, &mut sql)?;
    target_sql(entry, checked.name, &mut sql);
    flow_sql(entry, &checked, &source, &mut sql)?;
    Ok(sql)
}

/// What a table entry's keys say, once checked to agree.
struct Checked<'a> {
    /// The table's name, trimmed.
    name: &'a str,
    /// The flow reads snapshots.
    snapshot: bool,
    /// What the flow is `STORED AS`.
    mode: String,
}

/// Checks that a table entry's keys name a table and agree with each other.
fn check_entry(entry: &TableEntry) -> Result<Checked<'_>, String> {
    let name = entry.name.trim();
    if name.is_empty() {
        return Err("name: must not be empty".into());
    }
    if name.contains('.') {
        return Err(format!(
            "name: `{name}` must be a table name without a schema (tables go to the pipeline's schema)"
        ));
    }
    if entry.keys.is_empty() {
        return Err("keys: at least one key column is needed".into());
    }
    let snapshot = entry.snapshot || entry.snapshot_version_by.is_some();
    let mode = stored_as(entry)?;
    if snapshot {
        for (set, key) in [
            (entry.sequence_by.is_some(), "sequence_by"),
            (entry.delete_when.is_some(), "delete_when"),
            (entry.truncate_when.is_some(), "truncate_when"),
            (entry.ignore_null_updates, "ignore_null_updates"),
        ] {
            if set {
                return Err(format!(
                    "{key} applies to change events, not to snapshots (snapshot: true); \
                     a snapshot's version is snapshot_version_by"
                ));
            }
        }
    } else if mode == "SNAPSHOTS" {
        return Err("stored_as: SNAPSHOTS needs snapshot: true".into());
    }
    if entry.columns.is_some() && !entry.except_columns.is_empty() {
        return Err("give columns or except_columns, not both".into());
    }
    if entry.track_history_on.is_some() && entry.track_history_except.is_some() {
        return Err("give track_history_on or track_history_except, not both".into());
    }
    Ok(Checked {
        name,
        snapshot,
        mode,
    })
}

/// Writes the raw streaming table a file or database source lands in to `sql`, and returns
/// the table the flow reads (that one, or `source.table`).
fn source_sql(entry: &TableEntry, name: &str, sql: &mut String) -> Result<String, String> {
    Ok(match (&entry.source.path, &entry.source.table) {
        _ if entry.source.database.is_some() => {
            let raw = format!("{name}_raw");
            let _ = write!(
                sql,
                "CREATE OR REFRESH STREAMING TABLE {}\nAS SELECT * FROM STREAM {};\n\n",
                ident(&raw),
                read_database_call(&entry.source)?,
            );
            ident(&raw)
        }
        (Some(path), None) => {
            let raw = format!("{name}_raw");
            let options = read_files_options(&entry.source)?;
            // Writing to a String cannot fail.
            let _ = write!(
                sql,
                "CREATE OR REFRESH STREAMING TABLE {}\nAS SELECT * FROM STREAM read_files({}{options});\n\n",
                ident(&raw),
                string(path),
            );
            ident(&raw)
        }
        (None, Some(table)) => {
            let s = &entry.source;
            if s.format.is_some()
                || s.schema.is_some()
                || s.header.is_some()
                || s.sep.is_some()
                || !s.options.is_empty()
            {
                return Err(
                    "source: format, schema, header, sep and options belong to a path source, \
                     not to source.table"
                        .into(),
                );
            }
            table_ident(table)
        }
        _ => return Err("source: give either path (files) or table (a streaming table)".into()),
    })
}

/// Writes the target streaming table, with its properties, to `sql`.
fn target_sql(entry: &TableEntry, name: &str, sql: &mut String) {
    let _ = write!(sql, "CREATE OR REFRESH STREAMING TABLE {}", ident(name));
    if !entry.table_properties.is_empty() {
        let props: Vec<String> = entry
            .table_properties
            .iter()
            .map(|(k, v)| format!("{} = {}", string(k), string(&v.text())))
            .collect();
        let _ = write!(sql, "\nTBLPROPERTIES ({})", props.join(", "));
    }
    sql.push_str(";\n\n");
}

/// Writes the AUTO CDC flow from `source` into the target to `sql`.
fn flow_sql(
    entry: &TableEntry,
    checked: &Checked<'_>,
    source: &str,
    sql: &mut String,
) -> Result<(), String> {
    let (name, snapshot, mode) = (checked.name, checked.snapshot, &checked.mode);
    let cdc = entry.source.database.is_some() && entry.source.cdc;
    let _ = write!(
        sql,
        "CREATE FLOW {} AS AUTO CDC {}INTO {}\nFROM STREAM({source})\nKEYS ({})",
        ident(&format!("{name}_flow")),
        if snapshot { "FROM SNAPSHOT " } else { "" },
        ident(name),
        ident_list(&entry.keys),
    );
    if entry.ignore_null_updates {
        sql.push_str("\nIGNORE NULL UPDATES");
    }
    // Conditions in parentheses: an incomplete one fails inside them, not at the next clause.
    match (&entry.delete_when, cdc) {
        (Some(cond), _) => {
            let _ = write!(sql, "\nAPPLY AS DELETE WHEN ({cond})");
        }
        // A change log's deletes are deletes.
        (None, true) => sql.push_str("\nAPPLY AS DELETE WHEN _change_type = 'delete'"),
        (None, false) => {}
    }
    if let Some(cond) = &entry.truncate_when {
        let _ = write!(sql, "\nAPPLY AS TRUNCATE WHEN ({cond})");
    }
    if snapshot {
        if let Some(v) = &entry.snapshot_version_by {
            let _ = write!(sql, "\nSNAPSHOT VERSION BY {v}");
        }
    } else {
        match &entry.sequence_by {
            Some(seq) => {
                let _ = write!(sql, "\nSEQUENCE BY {seq}");
            }
            // A change log orders its changes exactly.
            None if cdc => sql.push_str("\nSEQUENCE BY STRUCT(_commit_lsn, _change_seq)"),
            None => {
                return Err("sequence_by: needed for change events (or set snapshot: true)".into())
            }
        }
    }
    // A change log's own columns stay in the change table, out of the target.
    let mut except = entry.except_columns.clone();
    if cdc {
        except.extend(CHANGE_COLUMNS.iter().map(|c| c.to_string()));
    }
    if let Some(cols) = &entry.columns {
        let _ = write!(sql, "\nCOLUMNS {}", ident_list(cols));
    } else if !except.is_empty() {
        let _ = write!(sql, "\nCOLUMNS * EXCEPT ({})", ident_list(&except));
    }
    let _ = write!(sql, "\nSTORED AS {mode}");
    if let Some(cols) = &entry.track_history_on {
        let _ = write!(sql, "\nTRACK HISTORY ON {}", ident_list(cols));
    } else if let Some(cols) = &entry.track_history_except {
        let _ = write!(sql, "\nTRACK HISTORY ON * EXCEPT ({})", ident_list(cols));
    }
    sql.push_str(";\n");
    Ok(())
}

/// `read_database('conn', table => ..., ...)` for a database source entry.
fn read_database_call(source: &SourceEntry) -> Result<String, String> {
    let s = source;
    if s.path.is_some()
        || s.format.is_some()
        || s.schema.is_some()
        || s.header.is_some()
        || s.sep.is_some()
        || !s.options.is_empty()
    {
        return Err(
            "source: path, format, schema, header, sep and options belong to a files source, \
             not to a database source"
                .into(),
        );
    }
    let connection = s.database.as_deref().unwrap_or_default();
    let mut out = format!("read_database({}", string(connection));
    match (&s.table, &s.query) {
        (Some(t), None) => {
            let _ = write!(out, ", table => {}", string(t));
        }
        (None, Some(q)) if !s.cdc => {
            let _ = write!(out, ", query => {}", string(q));
        }
        _ => {
            return Err(if s.cdc {
                "source: a cdc source reads one table: table: schema.table".into()
            } else {
                "source: a database source reads either table or query".into()
            })
        }
    }
    if s.cdc {
        let watermark_only = [
            s.overlap.is_some(),
            s.chunk_bytes.is_some(),
            s.parallel.is_some(),
        ];
        if s.watermark.is_some() || watermark_only.contains(&true) {
            return Err(
                "source: watermark, overlap, chunk_bytes and parallel belong to watermark \
                 loads, not to cdc: true"
                    .into(),
            );
        }
        out.push_str(", mode => 'cdc'");
        for (k, v) in [("slot", &s.slot), ("publication", &s.publication)] {
            if let Some(v) = v {
                let _ = write!(out, ", {k} => {}", string(v));
            }
        }
        for (k, v) in [("chunk_rows", &s.chunk_rows), ("first_load", &s.first_load)] {
            if let Some(v) = v {
                let _ = write!(out, ", {k} => {}", string(&v.text()));
            }
        }
    } else {
        if s.slot.is_some() || s.publication.is_some() {
            return Err("source: slot and publication belong to cdc: true".into());
        }
        let columns = s
            .watermark
            .as_ref()
            .filter(|w| !w.is_empty())
            .ok_or("source: a database source needs watermark: [column, ...] (or cdc: true)")?;
        let _ = write!(out, ", watermark => {}", string(&columns.join(", ")));
        for (k, v) in [
            ("overlap", &s.overlap),
            ("chunk_bytes", &s.chunk_bytes),
            ("chunk_rows", &s.chunk_rows),
            ("parallel", &s.parallel),
            ("first_load", &s.first_load),
        ] {
            if let Some(v) = v {
                let _ = write!(out, ", {k} => {}", string(&v.text()));
            }
        }
    }
    if !s.exclude.is_empty() {
        let _ = write!(out, ", exclude => {}", string(&s.exclude.join(", ")));
    }
    out.push(')');
    Ok(out)
}

/// `, format => 'json', schema => '...', ...` for `read_files`.
fn read_files_options(source: &SourceEntry) -> Result<String, String> {
    let format = source
        .format
        .as_deref()
        .ok_or("source: path needs format (json, csv or parquet)")?;
    let mut out = format!(", format => {}", string(format));
    if let Some(schema) = &source.schema {
        let _ = write!(out, ", schema => {}", string(schema));
    }
    if let Some(header) = source.header {
        let _ = write!(out, ", header => {header}");
    }
    if let Some(sep) = &source.sep {
        let _ = write!(out, ", sep => {}", string(sep));
    }
    for (k, v) in &source.options {
        if !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || k.is_empty() {
            return Err(format!(
                "source.options: `{k}` is not an option name (letters, digits, _)"
            ));
        }
        let _ = write!(out, ", {k} => {}", string(&v.text()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_sql::{
        parse_pipeline, ColumnSelection, FlowKind, QuerySource, ScdType, SequenceBy, Statement,
    };

    fn entry(yaml: &str) -> TableEntry {
        serde_norway::from_str(yaml).expect("entry parses")
    }

    fn statements(entry: &TableEntry) -> Vec<Statement> {
        let sql = table_sql(entry).expect("generates");
        parse_pipeline(&sql)
            .unwrap_or_else(|e| panic!("generated SQL does not parse: {e}\n{sql}"))
            .statements
    }

    #[test]
    fn files_source_generates_raw_table_target_and_flow() {
        let e = entry(
            "name: customers\n\
             source: { path: data/customers, format: json, schema: 'id INT, op STRING, ts BIGINT' }\n\
             keys: [id]\nsequence_by: ts\nstored_as: scd type 2\n\
             delete_when: \"op = 'DELETE'\"\nexcept_columns: [op, ts]\n\
             track_history_except: [name]\n",
        );
        let sql = table_sql(&e).unwrap();
        assert!(
            sql.contains("CREATE OR REFRESH STREAMING TABLE `customers_raw`"),
            "{sql}"
        );
        let st = statements(&e);
        assert_eq!(st.len(), 3);
        let Statement::StreamingTable(raw) = &st[0] else {
            panic!("{st:?}")
        };
        assert_eq!(raw.name.name, "customers_raw");
        let Some(QuerySource::ReadFiles(rf)) = raw.query.as_ref().map(|q| &q.source) else {
            panic!("{raw:?}")
        };
        assert_eq!(rf.path, "data/customers");
        assert_eq!(rf.schema.as_ref().map(Vec::len), Some(3));
        let Statement::Flow(f) = &st[2] else {
            panic!("{st:?}")
        };
        assert_eq!(f.name, "customers_flow");
        assert_eq!(f.target.name, "customers");
        assert_eq!(f.source.name, "customers_raw");
        assert_eq!(f.keys, vec!["id".to_string()]);
        assert_eq!(f.stored_as, ScdType::Type2);
        assert_eq!(f.sequence_by, SequenceBy::Expr("ts".into()));
        assert_eq!(f.delete_when.as_deref(), Some("(op = 'DELETE')"));
        assert_eq!(
            f.columns,
            ColumnSelection::Except(vec!["op".into(), "ts".into()])
        );
        assert_eq!(
            f.track_history,
            Some(ColumnSelection::Except(vec!["name".into()]))
        );
    }

    #[test]
    fn database_sources_generate_read_database_and_cdc_defaults() {
        let e = entry(
            "name: orders\n\
             source: { database: shop, table: public.orders, watermark: [updated_at, id], overlap: 600, \
             chunk_bytes: 64MB, chunk_rows: 100000, parallel: 4, first_load: chunks }\n\
             keys: [id]\nsequence_by: updated_at\n",
        );
        let sql = table_sql(&e).unwrap();
        assert!(
            sql.contains(
                "read_database('shop', table => 'public.orders', watermark => 'updated_at, id', \
                 overlap => '600', chunk_bytes => '64MB', chunk_rows => '100000', parallel => '4', \
                 first_load => 'chunks')"
            ),
            "{sql}"
        );
        // Parsed as the engine will read them.
        assert!(strata_sql::parse_pipeline(&sql).is_ok(), "{sql}");
        let cdc_parts = entry(
            "name: c\nsource: { database: shop, table: t, cdc: true, chunk_rows: 10, first_load: scan }\nkeys: [id]\n",
        );
        let sql = table_sql(&cdc_parts).unwrap();
        assert!(
            sql.contains("mode => 'cdc', chunk_rows => '10', first_load => 'scan'"),
            "{sql}"
        );
        let cdc_chunk_bytes = entry(
            "name: c\nsource: { database: shop, table: t, cdc: true, chunk_bytes: 10MB }\nkeys: [id]\n",
        );
        let e = table_sql(&cdc_chunk_bytes).unwrap_err();
        assert!(e.contains("parallel belong to watermark loads"), "{e}");
        let e = entry(
            "name: customers\nsource: { database: shop, table: public.customers, cdc: true }\n\
             keys: [id]\nstored_as: SCD TYPE 2\nexcept_columns: [secret]\n",
        );
        let mut text = connection_sql(
            "shop",
            &serde_norway::from_str(
                "{ type: postgresql, database: shop, user: etl, port: 5432, password_env: PW }",
            )
            .unwrap(),
        )
        .unwrap();
        text.push_str(&table_sql(&e).unwrap());
        let st = strata_sql::parse_pipeline(&text).unwrap().statements;
        let Statement::Connection(c) = &st[0] else {
            panic!("{st:?}")
        };
        assert_eq!(c.options["port"], "5432");
        assert_eq!(c.options["password_env"], "PW");
        let Statement::Flow(f) = &st[3] else {
            panic!("{st:?}")
        };
        assert_eq!(f.delete_when.as_deref(), Some("_change_type = 'delete'"));
        assert!(matches!(&f.sequence_by, SequenceBy::Struct(p) if p.len() == 2));
        let ColumnSelection::Except(except) = &f.columns else {
            panic!("{:?}", f.columns)
        };
        assert_eq!(except[0], "secret");
        assert!(except.contains(&"_unchanged_cols".to_string()));
    }

    #[test]
    fn database_entries_that_mix_kinds_say_which_option() {
        let err = |y: &str| table_sql(&entry(y)).unwrap_err();
        let base = "keys: [id]\nsequence_by: ts\n";
        assert!(err(&format!(
            "name: a\nsource: {{ database: shop, table: t }}\n{base}"
        ))
        .contains("needs watermark"));
        assert!(err(&format!(
            "name: a\nsource: {{ database: shop, table: t, watermark: [ts], format: json }}\n{base}"
        ))
        .contains("files source"));
        assert!(err(&format!(
            "name: a\nsource: {{ database: shop, query: 'SELECT 1', cdc: true }}\n{base}"
        ))
        .contains("one table"));
        assert!(connection_sql(
            "bad name",
            &serde_norway::from_str("{ type: mysql, database: d, user: u }").unwrap()
        )
        .unwrap_err()
        .contains("connection name"));
    }

    #[test]
    fn names_and_strings_are_quoted() {
        let e = entry(
            "name: \"odd`name\"\n\
             source: { path: \"it's\\\\here\", format: csv, header: true, sep: ';' }\n\
             keys: [\"key col\", \"b`t\"]\nsequence_by: \"`seq no`\"\nscd_type: 1\n\
             table_properties: { strata.scd.convention: kimball }\n",
        );
        let st = statements(&e);
        let Statement::StreamingTable(raw) = &st[0] else {
            panic!("{st:?}")
        };
        assert_eq!(raw.name.name, "odd`name_raw");
        let Some(QuerySource::ReadFiles(rf)) = raw.query.as_ref().map(|q| &q.source) else {
            panic!("{raw:?}")
        };
        assert_eq!(rf.path, "it's\\here");
        assert!(rf.header);
        assert_eq!(rf.delimiter, b';');
        let Statement::StreamingTable(target) = &st[1] else {
            panic!("{st:?}")
        };
        assert_eq!(target.name.name, "odd`name");
        assert_eq!(
            target
                .properties
                .get("strata.scd.convention")
                .map(String::as_str),
            Some("kimball")
        );
        let Statement::Flow(f) = &st[2] else {
            panic!("{st:?}")
        };
        assert_eq!(f.keys, vec!["key col".to_string(), "b`t".to_string()]);
        assert_eq!(f.stored_as, ScdType::Type1);
    }

    #[test]
    fn table_source_and_snapshots() {
        let e = entry(
            "name: plans\nsource: { table: bronze.plan_feed }\nkeys: [id]\n\
             snapshot_version_by: month\nstored_as: SNAPSHOTS\n",
        );
        let st = statements(&e);
        assert_eq!(st.len(), 2, "no raw table for a table source");
        let Statement::Flow(f) = &st[1] else {
            panic!("{st:?}")
        };
        assert_eq!(f.source.schema, "bronze");
        assert_eq!(f.source.name, "plan_feed");
        assert_eq!(
            f.kind,
            FlowKind::Snapshot {
                version_by: Some("month".into())
            }
        );
        assert_eq!(f.stored_as, ScdType::Snapshots);
    }

    #[test]
    fn bad_entries_say_which_option() {
        let cases = [
            ("name: t\nsource: { table: s }\nkeys: [id]\n", "sequence_by"),
            (
                "name: t\nsource: { table: s }\nkeys: [id]\nsequence_by: ts\nstored_as: SCD TYPE 3\n",
                "stored_as: expected SCD TYPE 1, SCD TYPE 2 or SNAPSHOTS, found `SCD TYPE 3`",
            ),
            ("name: t\nsource: { table: s }\nkeys: []\nsequence_by: ts\n", "keys"),
            ("name: t\nsource: { path: p }\nkeys: [id]\nsequence_by: ts\n", "needs format"),
            ("name: t\nsource: {}\nkeys: [id]\nsequence_by: ts\n", "either path"),
            (
                "name: t\nsource: { table: s }\nkeys: [id]\nsnapshot: true\ndelete_when: x\n",
                "delete_when applies to change events",
            ),
            (
                "name: t\nsource: { table: s }\nkeys: [id]\nsequence_by: ts\nscd_type: 3\n",
                "scd_type: expected 1 or 2",
            ),
        ];
        for (yaml, expected) in cases {
            let err = table_sql(&entry(yaml)).unwrap_err();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }

    #[test]
    fn python_libraries_are_kept_aside_or_refused() {
        let dir = std::env::temp_dir().join(format!("strata-spec-py-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("py")).expect("mkdir");
        std::fs::write(
            dir.join("gold.sql"),
            "CREATE TEMPORARY VIEW v AS SELECT 1 AS a;\n",
        )
        .expect("write");
        std::fs::write(dir.join("py/silver.py"), "").expect("write");
        let spec = dir.join("spec.yaml");
        std::fs::write(&spec, "name: p\nlibraries: [gold.sql, py/silver.py]\n").expect("write");
        let conf = BTreeMap::new();
        let loaded = load_pipeline_with_python(&spec, &conf).expect("loads");
        assert_eq!(loaded.sources.len(), 1, "the SQL library only");
        assert_eq!(loaded.python_libraries, [loaded.dir.join("py/silver.py")]);
        let err = load_pipeline(&spec, &conf).unwrap_err().to_string();
        assert!(
            err.contains("libraries[1]: ") && err.contains("silver.py is a Python pipeline file"),
            "{err}"
        );
        assert!(err.contains("python -m strata run"), "{err}");
        // Only Python libraries: something to run, from Python.
        std::fs::write(&spec, "name: p\nlibraries: [py/silver.py]\n").expect("write");
        assert!(load_pipeline_with_python(&spec, &conf).is_ok());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_place() {
        let err = serde_norway::from_str::<Spec>(
            "name: p\ntables:\n  - name: t\n    source: { table: s }\n    keys: [id]\n    sequence: ts\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field `sequence`"), "{err}");
        assert!(err.contains("tables[0]"), "{err}");
        assert!(err.contains("line 6"), "{err}");
    }
}
