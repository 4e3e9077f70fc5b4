//! # strata-python: the native half of the `strata` Python package (`strata._native`)
//!
//! A thin binding: the engine does the work, this crate converts at the border.
//!
//! ```text
//!   strata/pipelines.py  decorators and calls ─▶ SQL texts, one per declaration
//!   strata/__init__.py   run / query / as_of / events ─┐
//!                                                       ▼
//!   _native.run_path / run_sources ─▶ strata_engine::run_pipeline / plan_sources + run_planned
//!   _native.query ─▶ strata_engine::query ─▶ record batches ─▶ Arrow C stream (PyCapsule
//!                    "arrow_array_stream"), which pyarrow imports without copying a buffer
//!   _native.stage_snapshot ◀─ any object with __arrow_c_stream__ (pyarrow, pandas via
//!                    pyarrow, Polars): one snapshot written as a Parquet file, with its
//!                    version as a column, where the pipeline's snapshot flow reads it
//!   _native.stage_table ◀─ the same, returned by a @dp.table function: the rows of a
//!                    warehouse table replaced whole, which the dataset's view reads
//!   _native.load_spec ─▶ a YAML spec's .py libraries, which Python executes; their SQL
//!                    goes back to run_path(..., python=texts)
//! ```
//!
//! Engine errors become `strata.StrataError` with the engine's message (which names the
//! place: `pipeline.py:12 (@dp.table users): ...`, `flow users_flow: ...`) and a `kind`
//! (`pipeline`, `conflict`, `storage`, `internal`) matching the CLI's exit codes 2-5.

use deltalake::arrow::array::TimestampMicrosecondArray;
use deltalake::arrow::array::{ArrayRef, Date32Array, Int64Array, RecordBatch, RecordBatchReader};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::arrow::error::ArrowError;
use deltalake::arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use deltalake::parquet::arrow::ArrowWriter;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use strata_engine::{EngineError, PipelineSource, Progress, ProgressFn, RunOptions, RunReport};
use strata_engine::{Selection, SourceKind, Warehouse};

// Arrow buffers are allocated and freed in large bursts; mimalloc returns freed memory to
// the system where glibc's malloc keeps much of it (the CLI uses it for the same reason).
// Buffers handed to Python are freed by their release callback, inside this library, so
// they go back to the allocator that made them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

create_exception!(
    _native,
    StrataError,
    PyException,
    "An error of strata: the engine's message, which names its place; `kind` says what \
     went wrong (pipeline, conflict, storage, internal)."
);

/// The Arrow PyCapsule interface's name for a C stream.
const STREAM_CAPSULE: &std::ffi::CStr = c"arrow_array_stream";

/// One runtime for the process. Query planning recurses over deep expression trees, so
/// its threads get roomy stacks (as in the CLI).
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(64 << 20)
        .build()
        .map_err(|e| {
            StrataError::new_err((format!("cannot start the runtime: {e}"), "internal"))
        })?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// Runs `work` on the runtime's threads with the GIL released (and transparent huge pages
/// off meanwhile, see [`NoHugePages`]).
fn block_on<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = strata_engine::Result<T>> + Send + 'static,
{
    let rt = runtime()?;
    let _pages = NoHugePages::start();
    py.detach(|| {
        rt.block_on(async move {
            match tokio::spawn(work).await {
                Ok(result) => result.map_err(to_py),
                Err(e) => Err(StrataError::new_err((
                    format!("internal error, this is a bug in strata: {e}"),
                    "internal",
                ))),
            }
        })
    })
}

/// Transparent huge pages off for the process while the engine works, back as they were
/// when the last call into the engine returns. The CLI keeps them off for its whole run
/// (strata-cli's `no_transparent_huge_pages`: mimalloc's large regions, given back and
/// faulted in again, each zero a 2 MiB page; a third of a bulk run's CPU); a Python
/// process belongs to its user, so here they are off only during the engine's calls.
struct NoHugePages;

/// Calls into the engine under way, and whether huge pages were off before the first.
static HUGE_PAGES: std::sync::Mutex<(usize, bool)> = std::sync::Mutex::new((0, false));

impl NoHugePages {
    fn start() -> NoHugePages {
        if let Ok(mut state) = HUGE_PAGES.lock() {
            if state.0 == 0 {
                state.1 = thp_disabled();
                set_thp_disabled(true);
            }
            state.0 += 1;
        }
        NoHugePages
    }
}

impl Drop for NoHugePages {
    fn drop(&mut self) {
        if let Ok(mut state) = HUGE_PAGES.lock() {
            state.0 = state.0.saturating_sub(1);
            if state.0 == 0 && !state.1 {
                set_thp_disabled(false);
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn thp_disabled() -> bool {
    // SAFETY: PR_GET_THP_DISABLE takes no pointer and only reads a flag of this process.
    unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1 }
}

#[cfg(target_os = "linux")]
fn set_thp_disabled(off: bool) {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and only sets a flag of this process.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, libc::c_ulong::from(off), 0, 0, 0);
    }
}

#[cfg(not(target_os = "linux"))]
fn thp_disabled() -> bool {
    false
}

#[cfg(not(target_os = "linux"))]
fn set_thp_disabled(_off: bool) {}

/// The engine's error as a `StrataError(message, kind)`.
fn to_py(e: EngineError) -> PyErr {
    let kind = match &e {
        EngineError::Conflict { .. } => "conflict",
        EngineError::Delta { .. } | EngineError::DataFusion { .. } | EngineError::Io { .. } => {
            "storage"
        }
        EngineError::Internal(_) => "internal",
        _ => "pipeline",
    };
    StrataError::new_err((strata_engine::chain(&e), kind))
}

fn user_error(msg: impl Into<String>) -> PyErr {
    StrataError::new_err((msg.into(), "pipeline"))
}

/// How to run, as Python passes it.
struct RunArgs {
    warehouse: String,
    conf: BTreeMap<String, String>,
    select: Option<String>,
    full_refresh: Option<Vec<String>>,
    progress: Option<Py<PyAny>>,
}

impl RunArgs {
    /// Opens the warehouse and runs `run` with it and the run's options, off the GIL; the
    /// run's report as a dict.
    fn run<F, Fut>(self, py: Python<'_>, run: F) -> PyResult<Py<PyAny>>
    where
        F: FnOnce(Warehouse, RunOptions) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = strata_engine::Result<RunReport>> + Send + 'static,
    {
        let options = self.options()?;
        let warehouse = self.warehouse;
        let report = block_on(py, async move {
            let wh = Warehouse::open(&warehouse)?;
            run(wh, options).await
        })?;
        report_dict(py, &report)
    }

    fn options(&self) -> PyResult<RunOptions> {
        let select = match &self.select {
            Some(s) => Some(s.parse::<Selection>().map_err(user_error)?),
            None => None,
        };
        let progress = self.progress.as_ref().map(|cb| {
            let cb = Python::attach(|py| cb.clone_ref(py));
            ProgressFn(Arc::new(move |p: Progress| {
                Python::attach(|py| {
                    let args = match p {
                        Progress::Started { node } => ("started", node, String::new(), 0.0),
                        Progress::Update { node, detail } => ("update", node, detail, 0.0),
                        Progress::Finished {
                            node,
                            summary,
                            elapsed,
                        } => ("finished", node, summary, elapsed.as_secs_f64()),
                    };
                    // A failing progress callback must not fail the run: show its error.
                    if let Err(e) = cb.call1(py, args) {
                        e.print(py);
                    }
                })
            }))
        });
        Ok(RunOptions {
            configuration: self.conf.clone(),
            select,
            full_refresh: self.full_refresh.clone(),
            progress,
            stop: None,
            lock: None,
            cluster: None,
        })
    }
}

/// Runs the pipeline file `path` (SQL or a YAML spec) as `strata run` does; returns the
/// run report as a dict. `python`: the texts rendered from the spec's `.py` libraries
/// (see [`run_sources`]), which Python executed; without it such a spec is an error.
#[pyfunction]
#[pyo3(signature = (path, warehouse, conf, select=None, full_refresh=None, progress=None, python=None))]
#[allow(clippy::too_many_arguments)]
fn run_path(
    py: Python<'_>,
    path: PathBuf,
    warehouse: String,
    conf: BTreeMap<String, String>,
    select: Option<String>,
    full_refresh: Option<Vec<String>>,
    progress: Option<Py<PyAny>>,
    python: Option<Vec<(String, String, bool)>>,
) -> PyResult<Py<PyAny>> {
    let args = RunArgs {
        warehouse,
        conf,
        select,
        full_refresh,
        progress,
    };
    let python = python.map(pipeline_sources);
    args.run(py, |wh, options| async move {
        match python {
            Some(python) => {
                strata_engine::run_pipeline_with_python(&path, &wh, &options, python).await
            }
            None => strata_engine::run_pipeline(&path, &wh, &options).await,
        }
    })
}

/// What Python passes as a pipeline's texts: `(name, text, is_file)` each.
fn pipeline_sources(sources: Vec<(String, String, bool)>) -> Vec<PipelineSource> {
    sources
        .into_iter()
        .map(|(name, text, is_file)| PipelineSource {
            name,
            text,
            kind: if is_file {
                SourceKind::File
            } else {
                SourceKind::Generated
            },
        })
        .collect()
}

/// What Python needs of a YAML spec before running it: `{"python_libraries": [path, ...],
/// "schema": ..., "dir": ...}` (the `.py` libraries, resolved; the schema of unqualified
/// names; the folder relative paths resolve against).
#[pyfunction]
fn load_spec(py: Python<'_>, path: PathBuf, conf: BTreeMap<String, String>) -> PyResult<Py<PyAny>> {
    let loaded = strata_engine::load_pipeline_with_python(&path, &conf).map_err(to_py)?;
    let d = PyDict::new(py);
    let libraries: Vec<String> = loaded
        .python_libraries
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    d.set_item("python_libraries", libraries)?;
    d.set_item("schema", loaded.schema)?;
    d.set_item("dir", loaded.dir.display().to_string())?;
    Ok(d.into_any().unbind())
}

/// Plans and runs a pipeline made of several texts: `(name, text, is_file)` each, a file
/// the user wrote (errors say `name:line:column`) or SQL generated from a Python
/// declaration (errors say `name: ...`, the name holding the Python file and line).
/// `path` names the pipeline in the event log; relative paths resolve against `dir`.
#[pyfunction]
#[pyo3(signature = (sources, path, dir, warehouse, conf, select=None, full_refresh=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn run_sources(
    py: Python<'_>,
    sources: Vec<(String, String, bool)>,
    path: PathBuf,
    dir: PathBuf,
    warehouse: String,
    conf: BTreeMap<String, String>,
    select: Option<String>,
    full_refresh: Option<Vec<String>>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let args = RunArgs {
        warehouse,
        conf,
        select,
        full_refresh,
        progress,
    };
    let sources = pipeline_sources(sources);
    args.run(py, |wh, options| async move {
        let planned =
            strata_engine::plan_sources(&sources, &options.configuration, "default", wh.catalog())?;
        strata_engine::run_planned(planned, &path, dir, &wh, &options).await
    })
}

/// Plans the texts without running anything (`strata plan`): one dict per step.
#[pyfunction]
fn plan_sources(
    py: Python<'_>,
    sources: Vec<(String, String, bool)>,
    conf: BTreeMap<String, String>,
) -> PyResult<Py<PyAny>> {
    let sources = pipeline_sources(sources);
    let planned = strata_engine::plan_sources(&sources, &conf, "default", "main").map_err(to_py)?;
    let out = PyList::empty(py);
    for s in planned.steps() {
        let d = PyDict::new(py);
        d.set_item("kind", s.kind)?;
        d.set_item("name", s.name)?;
        d.set_item("detail", s.detail)?;
        d.set_item("reads", s.reads)?;
        d.set_item("writes", s.writes)?;
        d.set_item("origin", s.origin)?;
        out.append(d)?;
    }
    Ok(out.into_any().unbind())
}

/// The warehouse's folder, as the engine resolves it (`file://` URLs are folders).
#[pyfunction]
fn warehouse_root(warehouse: String) -> PyResult<String> {
    let wh = Warehouse::open(&warehouse).map_err(to_py)?;
    Ok(wh.root().to_string())
}

/// Runs `sql` over the warehouse; returns a PyCapsule holding an Arrow C stream of the
/// result (the Arrow PyCapsule interface). The batches are handed over, not copied: pyarrow
/// imports their buffers and frees them through the stream's release callbacks.
#[pyfunction]
fn query(py: Python<'_>, sql: String, warehouse: String) -> PyResult<Py<PyCapsule>> {
    let (schema, batches) = block_on(py, async move {
        let wh = Warehouse::open(&warehouse)?;
        strata_engine::query(&wh, &sql).await
    })?;
    let reader = Batches {
        schema,
        batches: batches.into_iter(),
    };
    let stream = FFI_ArrowArrayStream::new(Box::new(reader));
    Ok(PyCapsule::new_with_value(py, stream, STREAM_CAPSULE)?.unbind())
}

/// Collected batches as a [`RecordBatchReader`].
struct Batches {
    schema: SchemaRef,
    batches: std::vec::IntoIter<RecordBatch>,
}

impl Iterator for Batches {
    type Item = Result<RecordBatch, ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.batches.next().map(Ok)
    }
}

impl RecordBatchReader for Batches {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// Reads every batch of `data`, any object with `__arrow_c_stream__` (pyarrow tables and
/// readers, Polars DataFrames, pandas through pyarrow).
fn import_stream(data: &Bound<'_, PyAny>) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
    if !data.hasattr("__arrow_c_stream__")? {
        let type_name = data.get_type().name()?;
        return Err(user_error(format!(
            "expected Arrow data (a pyarrow Table, a Polars or pandas DataFrame: anything \
             with __arrow_c_stream__), got {type_name}"
        )));
    }
    let capsule = data.call_method0("__arrow_c_stream__")?;
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| user_error("__arrow_c_stream__() did not return a PyCapsule".to_string()))?;
    let ptr = capsule.pointer_checked(Some(STREAM_CAPSULE))?;
    // SAFETY: the capsule is named "arrow_array_stream", so by the Arrow PyCapsule
    // interface it points to an FFI_ArrowArrayStream; `from_raw` moves the stream out and
    // leaves a released one behind, which the capsule's destructor then ignores.
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(ptr.as_ptr().cast()) };
    let reader = ArrowArrayStreamReader::try_new(stream)
        .map_err(|e| user_error(format!("cannot read the Arrow stream: {e}")))?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| user_error(format!("cannot read the Arrow stream: {e}")))?;
    Ok((schema, batches))
}

/// The type a column is staged as: the string and binary layouts Python libraries choose
/// (large, view) become the plain ones, so that deliveries from pandas and Polars compare
/// equal and read like files from anywhere else.
fn staged_type(t: &DataType) -> DataType {
    match t {
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::LargeBinary | DataType::BinaryView => DataType::Binary,
        other => other.clone(),
    }
}

/// Writes one snapshot returned by a Python function into `dir` as `file_name` (a Parquet
/// file with the snapshot's rows and `version_column` = `version`), where the pipeline's
/// snapshot flow reads it. `version` is `("int", n)`, `("date", days since 1970-01-01)` or
/// `("timestamp", microseconds since 1970-01-01 UTC)`. Refuses a snapshot whose columns
/// differ from those of the snapshots already staged in `dir`, naming the difference. The
/// file appears whole or not at all (written aside, then renamed).
#[pyfunction]
fn stage_snapshot(
    py: Python<'_>,
    dir: PathBuf,
    file_name: String,
    data: &Bound<'_, PyAny>,
    version_column: String,
    version: (String, i64),
) -> PyResult<usize> {
    let (schema, batches) = import_stream(data)?;
    let version_type = match version.0.as_str() {
        "int" => DataType::Int64,
        "date" => DataType::Date32,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        other => return Err(user_error(format!("unknown snapshot version kind {other}"))),
    };
    if schema.field_with_name(&version_column).is_ok() {
        return Err(user_error(format!(
            "the snapshot has a column {version_column}, which strata uses for the version"
        )));
    }
    let mut fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            f.as_ref()
                .clone()
                .with_data_type(staged_type(f.data_type()))
        })
        .collect();
    fields.push(Field::new(&version_column, version_type.clone(), false));
    let staged = Arc::new(Schema::new(fields));
    py.detach(|| {
        check_same_columns(&dir, &staged)?;
        write_snapshot(
            &dir,
            &file_name,
            &staged,
            &batches,
            &version_type,
            version.1,
        )
    })
}

/// Replaces the rows of the warehouse table `table` (`t` or `schema.t`, unqualified in
/// `schema`) with `data` (any object with `__arrow_c_stream__`): the result of a Python
/// dataset function, which the pipeline's materialized view of that name reads. Returns the
/// number of rows.
#[pyfunction]
fn stage_table(
    py: Python<'_>,
    warehouse: String,
    table: String,
    schema: String,
    data: &Bound<'_, PyAny>,
    comment: String,
) -> PyResult<usize> {
    let (arrow_schema, batches) = import_stream(data)?;
    block_on(py, async move {
        let wh = Warehouse::open(&warehouse)?;
        strata_engine::replace_table_rows(&wh, &table, &schema, arrow_schema, batches, &comment)
            .await
    })
}

/// The columns of the first snapshot staged in `dir`, if any, must be `staged`'s.
fn check_same_columns(dir: &Path, staged: &SchemaRef) -> PyResult<()> {
    let mut names: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
            .collect(),
        Err(_) => return Ok(()),
    };
    names.sort();
    let Some(first) = names.first() else {
        return Ok(());
    };
    let file = std::fs::File::open(first)
        .map_err(|e| user_error(format!("cannot read {}: {e}", first.display())))?;
    let before = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| user_error(format!("cannot read {}: {e}", first.display())))?
        .schema()
        .clone();
    let shape = |s: &Schema| -> Vec<String> {
        s.fields()
            .iter()
            .map(|f| format!("{} {}", f.name(), f.data_type()))
            .collect()
    };
    let (was, now) = (shape(&before), shape(staged));
    if was != now {
        let missing: Vec<&String> = was.iter().filter(|c| !now.contains(c)).collect();
        let extra: Vec<&String> = now.iter().filter(|c| !was.contains(c)).collect();
        return Err(user_error(format!(
            "the snapshot's columns differ from the earlier snapshots' ({}): missing or \
             changed {missing:?}, new or changed {extra:?}",
            was.join(", ")
        )));
    }
    Ok(())
}

fn write_snapshot(
    dir: &Path,
    file_name: &str,
    staged: &SchemaRef,
    batches: &[RecordBatch],
    version_type: &DataType,
    version: i64,
) -> PyResult<usize> {
    let io = |e: std::io::Error| user_error(format!("cannot write to {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!(".{file_name}.tmp"));
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let parquet = |e: deltalake::parquet::errors::ParquetError| {
        user_error(format!("cannot write {}: {e}", tmp.display()))
    };
    let arrow = |e: ArrowError| user_error(format!("cannot convert the snapshot: {e}"));
    let mut writer = ArrowWriter::try_new(file, staged.clone(), None).map_err(parquet)?;
    let mut rows = 0;
    for b in batches {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(b.num_columns() + 1);
        for (c, f) in b.columns().iter().zip(staged.fields()) {
            columns.push(if c.data_type() == f.data_type() {
                c.clone()
            } else {
                cast(c, f.data_type()).map_err(arrow)?
            });
        }
        let n = b.num_rows();
        columns.push(match version_type {
            DataType::Int64 => Arc::new(Int64Array::from(vec![version; n])),
            DataType::Date32 => Arc::new(Date32Array::from(vec![version as i32; n])),
            _ => Arc::new(TimestampMicrosecondArray::from(vec![version; n]).with_timezone("UTC")),
        });
        writer
            .write(&RecordBatch::try_new(staged.clone(), columns).map_err(arrow)?)
            .map_err(parquet)?;
        rows += n;
    }
    writer.close().map_err(parquet)?;
    std::fs::rename(&tmp, dir.join(file_name)).map_err(io)?;
    Ok(rows)
}

/// The run report as a dict of lists of dicts (the CLI's output, as data): the engine's
/// JSON form of it, read by Python's `json`.
fn report_dict(py: Python<'_>, r: &RunReport) -> PyResult<Py<PyAny>> {
    let text = r.to_json().to_string();
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("StrataError", m.py().get_type::<StrataError>())?;
    m.add_function(wrap_pyfunction!(run_path, m)?)?;
    m.add_function(wrap_pyfunction!(run_sources, m)?)?;
    m.add_function(wrap_pyfunction!(plan_sources, m)?)?;
    m.add_function(wrap_pyfunction!(warehouse_root, m)?)?;
    m.add_function(wrap_pyfunction!(query, m)?)?;
    m.add_function(wrap_pyfunction!(stage_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(stage_table, m)?)?;
    m.add_function(wrap_pyfunction!(load_spec, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
