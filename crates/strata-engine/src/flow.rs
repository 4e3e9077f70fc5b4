//! One run of one AUTO CDC flow.
//!
//! ```text
//!  source (append-only Delta)     event store (Delta, per target)        target (Delta)
//!  files added since the   ──▶  1. stored events of the touched keys ─┐
//!  flow's txn version           2. + new events  ──fold (strata-core)─┴─▶ rows of touched keys
//!                               3. commit new events + source txn      4. replace changed keys'
//!                                                                         rows (rewrite.rs)
//!                                                                         + txn "strata-events"
//! ```
//!
//! The event store keeps every event ever applied (after ties are settled at fold time), so
//! that late events can be placed exactly where their sequence says (semantics page, §1).
//! The target is derived from it: `strata-events` in the target's log says which event-store
//! version it reflects. A crash between steps 3 and 4 is repaired by the next run, which
//! re-derives the keys of the event-store commits the target has not seen. The source
//! position is the application transaction `strata-flow:<name>` of the event store, written in
//! the same commit as the events, so no event is lost or applied twice.

use crate::error::{Context, EngineError, Result};
use crate::fold::{self, FoldSpec, END_COL, OP_COL, RUN_COL, SEQ_COL, START_COL};
use crate::snapshot;
use crate::sqlutil::{self, quote_ident};
use crate::timeline::Timeline;
use crate::warehouse::{self, Warehouse};
use deltalake::arrow::array::{
    Array, ArrayRef, Int64Array, Int8Array, RecordBatch, StructArray, UInt32Array,
};
use deltalake::arrow::compute::{self, concat_batches};
use deltalake::arrow::datatypes::TimeUnit;
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::prelude::{col, lit, Expr, SessionContext};
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::{Action, MetadataExt, Transaction};
use deltalake::protocol::DeltaOperation;
use deltalake::DeltaTable;
use std::collections::HashSet;
use std::sync::Arc;
use strata_core::FoldOptions;
use strata_sql::{CdcFlow, ColumnSelection, FlowKind, ScdType, SequenceBy};

/// The application id under which a target records the event-store version it reflects.
const EVENTS_APP_ID: &str = "strata-events";

/// A flow checked against its source's schema: everything needed to run it.
#[derive(Debug, Clone)]
pub(crate) struct FlowSetup {
    pub flow: CdcFlow,
    /// `SELECT <output cols>, <seq> AS __strata_seq, <op> AS __strata_op FROM __strata_source`
    pub select_sql: String,
    pub out_cols: Vec<String>,
    pub key_names: Vec<String>,
    /// Event-store schema: output columns, `__strata_seq`, `__strata_op`, `__strata_run`.
    pub event_schema: SchemaRef,
    /// Rows as the fold produces them: output columns, then `__START_AT`, `__END_AT` for
    /// SCD type 2 and `SNAPSHOTS` targets.
    pub fold_schema: SchemaRef,
    /// The target's columns: output columns, then the timeline columns of its convention.
    pub target_schema: SchemaRef,
    pub timeline: Timeline,
    pub spec: FoldSpec,
    /// The source is an AUTO CDC target, read through its change data feed (set by the
    /// pipeline; table-mode snapshot flows read the table itself).
    pub source_feed: bool,
    /// How long a delete's tombstone is kept, in seconds (`tombstones.rs`): change-event
    /// flows into SCD type 1 targets; `None` for the others, which keep them all.
    pub tombstone_secs: Option<u64>,
}

impl FlowSetup {
    /// An `AUTO CDC FROM SNAPSHOT` flow.
    pub(crate) fn is_snapshot(&self) -> bool {
        matches!(self.flow.kind, FlowKind::Snapshot { .. })
    }

    /// The key columns of `batch` (in the event or target layout) in Arrow's row format.
    pub(crate) fn key_rows(&self, batch: &RecordBatch) -> Result<deltalake::arrow::row::Rows> {
        sqlutil::rows(
            &self
                .spec
                .keys
                .iter()
                .map(|&k| batch.column(k).clone())
                .collect::<Vec<_>>(),
        )
    }

    /// The target rows (timeline convention applied) of every key of `events`, and how
    /// many keys they hold.
    pub(crate) fn fold_to_target(&self, events: &RecordBatch) -> Result<(RecordBatch, usize)> {
        let (rows, keys) = fold::fold_batch(events, &self.spec, &self.fold_schema)?;
        if !self.spec.scd2 {
            return Ok((rows, keys));
        }
        let rows =
            self.timeline
                .apply(&rows, self.spec.n_out, &self.spec.keys, &self.target_schema)?;
        Ok((rows, keys))
    }

    /// A snapshot flow without `SNAPSHOT VERSION BY`: each run snapshots the whole source.
    pub(crate) fn table_mode(&self) -> bool {
        matches!(self.flow.kind, FlowKind::Snapshot { version_by: None })
    }
}

fn flow_err(flow: &CdcFlow, msg: impl std::fmt::Display) -> EngineError {
    EngineError::Plan(format!(
        "flow {} (line {}): {msg}",
        flow.name, flow.location.line
    ))
}

/// Resolves a `COLUMNS`/`TRACK HISTORY ON` selection against `available`, in table order for
/// `*` forms and in the written order for explicit lists.
fn select_columns(
    flow: &CdcFlow,
    clause: &str,
    sel: &ColumnSelection,
    available: &[String],
) -> Result<Vec<String>> {
    let check = |names: &[String]| -> Result<()> {
        for n in names {
            if !available.contains(n) {
                return Err(flow_err(
                    flow,
                    format!(
                        "{clause} names unknown column `{n}`; available: {}",
                        available.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    };
    Ok(match sel {
        ColumnSelection::All => available.to_vec(),
        ColumnSelection::Only(names) => {
            check(names)?;
            names.clone()
        }
        ColumnSelection::Except(names) => {
            check(names)?;
            available
                .iter()
                .filter(|c| !names.contains(c))
                .cloned()
                .collect()
        }
    })
}

/// Checks `flow` against the schema of its source and derives the event-store and target
/// schemas. Nothing is read or written.
pub(crate) async fn prepare_flow(
    flow: &CdcFlow,
    source: &SchemaRef,
    target_properties: &std::collections::BTreeMap<String, String>,
) -> Result<FlowSetup> {
    let available: Vec<String> = source.fields().iter().map(|f| f.name().clone()).collect();
    let out_cols = select_columns(flow, "COLUMNS", &flow.columns, &available)?;
    for k in &flow.keys {
        if !available.contains(k) {
            return Err(flow_err(
                flow,
                format!(
                    "KEYS names unknown column `{k}`; available: {}",
                    available.join(", ")
                ),
            ));
        }
        if !out_cols.contains(k) {
            return Err(flow_err(
                flow,
                format!("key column `{k}` must be among the output COLUMNS"),
            ));
        }
    }
    for c in &out_cols {
        let lower = c.to_ascii_lowercase();
        if lower == "__start_at" || lower == "__end_at" {
            return Err(flow_err(
                flow,
                format!(
                    "the source carries the reserved column `{c}`; exclude it with COLUMNS * EXCEPT ({c})"
                ),
            ));
        }
        if lower.starts_with("__strata_") {
            return Err(flow_err(
                flow,
                format!("column `{c}`: names starting with __strata_ are reserved"),
            ));
        }
    }
    let tracked_names = match &flow.track_history {
        None => out_cols.clone(),
        Some(sel) => select_columns(flow, "TRACK HISTORY ON", sel, &out_cols)?,
    };

    let seq_sql = match &flow.sequence_by {
        SequenceBy::Expr(e) => e.clone(),
        SequenceBy::Struct(fields) => format!(
            "named_struct({})",
            fields
                .iter()
                .map(|(name, e)| format!("{}, {e}", sqlutil::quote_str(name)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let whens = format!(
        "{}{}",
        flow.truncate_when
            .as_ref()
            .map(|c| format!("WHEN ({c}) THEN 2 "))
            .unwrap_or_default(),
        flow.delete_when
            .as_ref()
            .map(|c| format!("WHEN ({c}) THEN 1 "))
            .unwrap_or_default(),
    );
    let op_sql = if whens.is_empty() {
        "CAST(0 AS TINYINT)".to_string()
    } else {
        format!("CAST(CASE {whens}ELSE 0 END AS TINYINT)")
    };
    let select_sql = format!(
        "SELECT {}, {seq_sql} AS {}, {op_sql} AS {} FROM {}",
        out_cols
            .iter()
            .map(|c| quote_ident(c))
            .collect::<Vec<_>>()
            .join(", "),
        quote_ident(SEQ_COL),
        quote_ident(OP_COL),
        strata_sql::SOURCE_PLACEHOLDER,
    );

    // Plan the SELECT over an empty source: unknown columns in expressions, conditions that
    // are not boolean and unorderable sequences are errors before anything runs.
    let ctx = crate::warehouse::new_session();
    let empty = RecordBatch::new_empty(source.clone());
    ctx.register_batch(strata_sql::SOURCE_PLACEHOLDER, empty)
        .context(|| "registering source".to_string())?;
    for (clause, cond) in [
        ("APPLY AS DELETE WHEN", &flow.delete_when),
        ("APPLY AS TRUNCATE WHEN", &flow.truncate_when),
    ] {
        if let Some(c) = cond {
            let df = ctx
                .sql(&format!(
                    "SELECT ({c}) FROM {}",
                    strata_sql::SOURCE_PLACEHOLDER
                ))
                .await
                .map_err(|e| flow_err(flow, format!("{clause} {c}: {e}")))?;
            let t = df.schema().field(0).data_type();
            if !matches!(t, DataType::Boolean | DataType::Null) {
                return Err(flow_err(
                    flow,
                    format!("{clause} {c}: the condition is of type {t}, not BOOLEAN"),
                ));
            }
        }
    }
    let df = ctx
        .sql(&select_sql)
        .await
        .map_err(|e| flow_err(flow, format!("SEQUENCE BY {seq_sql}: {e}")))?;
    let planned: Schema = df.schema().as_arrow().clone();
    let mut seq_type = planned.field(out_cols.len()).data_type().clone();
    if matches!(flow.kind, FlowKind::Snapshot { version_by: None }) {
        // Table mode: the version is the run's start time, as a Delta TIMESTAMP.
        seq_type = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    }
    if matches!(flow.kind, FlowKind::Snapshot { .. }) && matches!(seq_type, DataType::Struct(_)) {
        return Err(flow_err(
            flow,
            format!(
                "SNAPSHOT VERSION BY {seq_sql}: a version must be a single value, not a struct"
            ),
        ));
    }
    if !orderable(&seq_type) {
        return Err(flow_err(
            flow,
            format!("SEQUENCE BY {seq_sql}: values of type {seq_type} cannot be ordered"),
        ));
    }

    // View types (DataFusion's in-memory string layout) are stored as plain strings.
    let seq_type = sqlutil::storage_type(&seq_type);
    let mut fields: Vec<Field> = planned.fields()[..out_cols.len()]
        .iter()
        .map(|f| Field::new(f.name(), sqlutil::storage_type(f.data_type()), true))
        .collect();
    let mut fold_fields = fields.clone();
    let mut target_fields = fields.clone();
    let timeline = if flow.stored_as.has_timeline() {
        let t = Timeline::from_properties(target_properties)
            .map_err(|e| flow_err(flow, format!("target {}: {e}", flow.target)))?;
        t.open_end_value(&seq_type)
            .map_err(|e| flow_err(flow, format!("target {}: {e}", flow.target)))?;
        for name in t.column_names() {
            if let Some(c) = out_cols.iter().find(|c| c.eq_ignore_ascii_case(&name)) {
                return Err(flow_err(
                    flow,
                    format!(
                        "the source column `{c}` has the name of a timeline column of {}; \
                         exclude it with COLUMNS * EXCEPT ({c}) or rename the timeline column",
                        flow.target
                    ),
                ));
            }
        }
        fold_fields.push(Field::new(START_COL, seq_type.clone(), true));
        fold_fields.push(Field::new(END_COL, seq_type.clone(), true));
        target_fields.extend(t.fields(&seq_type));
        t
    } else {
        Timeline::default()
    };
    fields.push(Field::new(SEQ_COL, seq_type, true));
    fields.push(Field::new(OP_COL, DataType::Int8, false));
    fields.push(Field::new(RUN_COL, DataType::Int64, false));

    let index = |name: &String| out_cols.iter().position(|c| c == name).unwrap_or(0);
    let spec = FoldSpec {
        n_out: out_cols.len(),
        keys: flow.keys.iter().map(index).collect(),
        tracked: tracked_names.iter().map(index).collect(),
        scd2: flow.stored_as == ScdType::Type2,
        options: FoldOptions {
            ignore_null_updates: flow.ignore_null_updates,
        },
        flow: flow.name.clone(),
    };
    Ok(FlowSetup {
        flow: flow.clone(),
        select_sql,
        out_cols,
        key_names: flow.keys.clone(),
        event_schema: Arc::new(Schema::new(fields)),
        fold_schema: Arc::new(Schema::new(fold_fields)),
        target_schema: Arc::new(Schema::new(target_fields)),
        timeline,
        spec,
        source_feed: false,
        tombstone_secs: match (&flow.kind, flow.stored_as) {
            (FlowKind::Snapshot { .. }, _) | (_, ScdType::Type2 | ScdType::Snapshots) => None,
            _ => Some(
                crate::tombstones::threshold(target_properties)
                    .map_err(|e| flow_err(flow, format!("{}: {e}", flow.target)))?,
            ),
        },
    })
}

fn orderable(t: &DataType) -> bool {
    match t {
        DataType::Struct(fields) => fields.iter().all(|f| orderable(f.data_type())),
        DataType::Null
        | DataType::List(_)
        | DataType::LargeList(_)
        | DataType::FixedSizeList(_, _)
        | DataType::Map(_, _)
        | DataType::Union(_, _)
        | DataType::Binary
        | DataType::LargeBinary => false,
        _ => true,
    }
}

/// What one run of a flow did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowReport {
    pub flow: String,
    /// Source Delta version range read, `(from, to]`.
    pub source_versions: Option<(Option<i64>, i64)>,
    pub events: usize,
    pub keys_touched: usize,
    pub keys_changed: usize,
    pub rows_inserted: usize,
    pub rows_deleted: usize,
    /// SCD type 1: keys whose current row was inserted or changed / removed.
    pub keys_upserted: usize,
    pub keys_deleted: usize,
    /// Target rows written whose values were not there before (inserted or updated rows;
    /// rows of a rewritten key that come back unchanged do not count).
    pub rows_written: usize,
    /// SCD type 2: versions (key, start) that did not exist before / that were open before
    /// and are closed now.
    pub versions_opened: usize,
    pub versions_closed: usize,
    /// Things worth telling the user (late snapshot versions, redeliveries).
    pub notes: Vec<String>,
    /// Event-store commits repaired from an earlier interrupted run.
    pub recovered: bool,
    /// Why nothing ran, if nothing did.
    pub skipped: Option<String>,
}

/// Checks new events (R4): NULL keys (except on truncates) and NULL sequence values reject
/// them. `place` names where the rows came from.
pub(crate) fn validate_events(
    setup: &FlowSetup,
    batches: &[RecordBatch],
    place: &str,
) -> Result<()> {
    let n_out = setup.spec.n_out;
    let reject = |what: String, count: usize| {
        EngineError::BadInput(format!(
            "flow {}: {count} row(s) {what} in {place}; the batch was rejected and nothing was written",
            setup.flow.name
        ))
    };
    let mut null_keys = vec![0usize; setup.spec.keys.len()];
    let mut null_seqs = 0usize;
    for batch in batches {
        let ops = batch
            .column(n_out + 1)
            .as_any()
            .downcast_ref::<Int8Array>()
            .ok_or_else(|| EngineError::Internal("op column is not Int8".into()))?;
        let truncate = |i: usize| !ops.is_null(i) && ops.value(i) == 2;
        for (count, k) in null_keys.iter_mut().zip(&setup.spec.keys) {
            let c = batch.column(*k);
            if c.null_count() > 0 {
                *count += (0..batch.num_rows())
                    .filter(|&i| c.is_null(i) && !truncate(i))
                    .count();
            }
        }
        let seq = batch.column(n_out);
        null_seqs += (0..batch.num_rows())
            .filter(|&i| seq_is_null(seq, i))
            .count();
    }
    for (count, name) in null_keys.iter().zip(&setup.key_names) {
        if *count > 0 {
            return Err(reject(format!("with a NULL key column `{name}`"), *count));
        }
    }
    if null_seqs > 0 {
        let expr = match &setup.flow.sequence_by {
            SequenceBy::Expr(e) => e.clone(),
            SequenceBy::Struct(fields) => format!(
                "STRUCT({})",
                fields
                    .iter()
                    .map(|(_, e)| e.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let clause = if setup.is_snapshot() {
            "SNAPSHOT VERSION BY"
        } else {
            "SEQUENCE BY"
        };
        return Err(reject(
            format!("with a NULL {clause} value ({expr})"),
            null_seqs,
        ));
    }
    Ok(())
}

fn seq_is_null(seq: &ArrayRef, i: usize) -> bool {
    if seq.is_null(i) {
        return true;
    }
    match seq.as_any().downcast_ref::<StructArray>() {
        Some(s) => s.columns().iter().any(|c| seq_is_null(c, i)),
        None => false,
    }
}

/// Evaluates the flow's SELECT over `source` rows registered in `ctx` as the placeholder:
/// events without their run column, in batches as the query made them.
pub(crate) async fn evaluate_events(
    ctx: &SessionContext,
    setup: &FlowSetup,
) -> Result<Vec<RecordBatch>> {
    let batches = ctx
        .sql(&setup.select_sql)
        .await
        .context(|| format!("flow {}", setup.flow.name))?
        .collect()
        .await
        .context(|| format!("flow {}: evaluating events", setup.flow.name))?;
    let partial = without_run(setup);
    batches
        .iter()
        .map(|b| sqlutil::cast_batch(b, &partial))
        .collect()
}

/// The event schema without its last column, the run.
fn without_run(setup: &FlowSetup) -> SchemaRef {
    let fields = setup.event_schema.fields();
    Arc::new(Schema::new(fields[..fields.len() - 1].to_vec()))
}

/// [`evaluate_events`] as one batch of run `run`.
pub(crate) async fn events_from(
    ctx: &SessionContext,
    setup: &FlowSetup,
    run: i64,
) -> Result<RecordBatch> {
    with_run(setup, evaluate_events(ctx, setup).await?, run)
}

/// `events` (as [`evaluate_events`] made them) as one batch of run `run`.
fn with_run(setup: &FlowSetup, events: Vec<RecordBatch>, run: i64) -> Result<RecordBatch> {
    let partial = without_run(setup);
    if let Some(b) = events.iter().find(|b| b.schema() != partial) {
        return Err(EngineError::Internal(format!(
            "flow {}: events have ({}), expected ({})",
            setup.flow.name,
            sqlutil::describe_fields(&b.schema()),
            sqlutil::describe_fields(&partial)
        )));
    }
    let rows: usize = events.iter().map(RecordBatch::num_rows).sum();
    let width = partial.fields().len();
    // One integer key and no truncates: the events go in key order right away. The fold
    // then walks them in memory order, and the event store is written in that order, which
    // is what lets later runs read a key's events through the page index (`store.rs`).
    let key_ordered = match setup.spec.keys.as_slice() {
        [key]
            if !setup.is_snapshot() && setup.flow.truncate_when.is_none() && !events.is_empty() =>
        {
            fold::columns_in_key_order(events, width, *key)?
        }
        _ => Err(events),
    };
    let mut columns = match key_ordered {
        Ok(columns) => columns,
        Err(events) if events.is_empty() => partial
            .fields()
            .iter()
            .map(|f| deltalake::arrow::array::new_empty_array(f.data_type()))
            .collect(),
        Err(events) => sqlutil::concat_columns(events, width)?,
    };
    columns.push(Arc::new(Int64Array::from(vec![run; rows])));
    RecordBatch::try_new(setup.event_schema.clone(), columns)
        .context(|| format!("flow {}: event batch", setup.flow.name))
}

fn table_files(table: &DeltaTable) -> Result<HashSet<String>> {
    Ok(table
        .snapshot()
        .context(|| "reading table state".into())?
        .log_data()
        .iter()
        .map(|f| f.path().to_string())
        .collect())
}

/// Files added to the append-only `source` after version `from`.
pub(crate) async fn new_files(source: &DeltaTable, from: Option<i64>) -> Result<Vec<String>> {
    let now = table_files(source)?;
    let old = match from {
        None => HashSet::new(),
        Some(v) => {
            let mut old = source.clone();
            old.load_version(v as u64)
                .await
                .context(|| format!("loading source version {v}"))?;
            table_files(&old)?
        }
    };
    let mut files: Vec<String> = now.difference(&old).cloned().collect();
    files.sort();
    Ok(files)
}

/// Reads every row of `table` restricted to `files` (all files when `None`) in a new session.
pub(crate) async fn register_table(
    ctx: &SessionContext,
    name: &str,
    table: &DeltaTable,
    files: Option<Vec<String>>,
) -> Result<()> {
    table
        .update_datafusion_session(&ctx.state())
        .context(|| "registering object store".into())?;
    let mut builder = table.table_provider();
    if let Some(f) = files {
        builder = builder.with_file_paths(f);
    }
    let provider = builder
        .await
        .context(|| format!("reading {}", table.table_url()))?;
    ctx.register_table(name, provider)
        .context(|| format!("registering {name}"))?;
    Ok(())
}

async fn collect_sql(ctx: &SessionContext, sql: &str, schema: &SchemaRef) -> Result<RecordBatch> {
    let batches = ctx
        .sql(sql)
        .await
        .context(|| format!("planning {sql}"))?
        .collect()
        .await
        .context(|| format!("running {sql}"))?;
    let cast = batches
        .iter()
        .map(|b| sqlutil::cast_batch(b, schema))
        .collect::<Result<Vec<_>>>()?;
    concat_batches(schema, &cast).context(|| "concatenating".into())
}

/// Which keys to re-derive.
enum Touched {
    All,
    Keys(RecordBatch),
}

/// Distinct keys of the non-truncate rows of `events`, or `All` when a truncate is among them.
fn touched_keys(setup: &FlowSetup, events: &RecordBatch) -> Result<Touched> {
    let ops = events
        .column(setup.spec.n_out + 1)
        .as_any()
        .downcast_ref::<Int8Array>()
        .ok_or_else(|| EngineError::Internal("op column is not Int8".into()))?;
    if ops.iter().any(|o| o == Some(2)) {
        return Ok(Touched::All);
    }
    let key_cols: Vec<ArrayRef> = setup
        .spec
        .keys
        .iter()
        .map(|&k| events.column(k).clone())
        .collect();
    let rows = sqlutil::rows(&key_cols)?;
    let mut seen = ahash::AHashSet::with_capacity(events.num_rows());
    let idx: Vec<u32> = (0..events.num_rows())
        .filter(|&i| seen.insert(rows.row(i)))
        .map(|i| i as u32)
        .collect();
    let idx = UInt32Array::from(idx);
    let fields: Vec<Field> = setup
        .spec
        .keys
        .iter()
        .map(|&k| events.schema().field(k).clone())
        .collect();
    let cols = key_cols
        .iter()
        .map(|c| compute::take(c.as_ref(), &idx, None))
        .collect::<std::result::Result<Vec<_>, _>>()
        .context(|| "collecting keys".into())?;
    Ok(Touched::Keys(
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)
            .context(|| "collecting keys".into())?,
    ))
}

fn merge_touched(a: Touched, b: Touched) -> Result<Touched> {
    Ok(match (a, b) {
        (Touched::All, _) | (_, Touched::All) => Touched::All,
        (Touched::Keys(x), Touched::Keys(y)) => {
            Touched::Keys(concat_batches(&x.schema(), &[x.clone(), y]).context(|| "keys".into())?)
        }
    })
}

/// Rows of the table registered as `table` whose keys are in `touched` (plus, for the event
/// store, every truncate).
async fn read_slice(
    ctx: &SessionContext,
    setup: &FlowSetup,
    table: &str,
    touched: &Touched,
    schema: &SchemaRef,
    with_truncates: bool,
) -> Result<RecordBatch> {
    let sql = match touched {
        Touched::All => format!("SELECT * FROM {table}"),
        Touched::Keys(keys) => {
            let _ = ctx.deregister_table("__strata_keys");
            ctx.register_batch("__strata_keys", keys.clone())
                .context(|| "registering keys".into())?;
            let on = setup
                .key_names
                .iter()
                .map(|k| format!("t.{q} = k.{q}", q = quote_ident(k)))
                .collect::<Vec<_>>()
                .join(" AND ");
            let mut sql =
                format!("SELECT t.* FROM {table} t LEFT SEMI JOIN __strata_keys k ON {on}");
            if with_truncates {
                sql.push_str(&format!(
                    " UNION ALL SELECT * FROM {table} WHERE {} = 2",
                    quote_ident(OP_COL)
                ));
            }
            sql
        }
    };
    collect_sql(ctx, &sql, schema).await
}

/// Compares the rows the touched keys have before the run (`old`) with the rows they have
/// after it (`new`), both in the target layout: which keys changed, as row indices, and the
/// change counts of `report`. One row-format conversion of each side serves both.
fn compare(
    setup: &FlowSetup,
    old: &RecordBatch,
    new: &RecordBatch,
    report: &mut FlowReport,
) -> Result<ChangeSet> {
    // Each side's keys and whole rows in the row format, the two sides side by side.
    use deltalake::arrow::row::Rows;
    let convert = |b: &RecordBatch| -> Result<(Rows, Rows)> {
        Ok((setup.key_rows(b)?, sqlutil::rows(b.columns())?))
    };
    let (old_side, new_side) = std::thread::scope(|scope| {
        let old_side = scope.spawn(|| convert(old));
        let new_side = convert(new);
        (old_side.join(), new_side)
    });
    let old_side =
        old_side.map_err(|_| EngineError::Internal("a row-format thread panicked".into()))?;
    let ((old_keys, old_rows), (new_keys, new_rows)) = (old_side?, new_side?);
    // SCD type 2 and snapshots: versions are told apart by their start, open ones by a NULL
    // end (whatever the open-end marker).
    let timeline = match setup.flow.stored_as.has_timeline() {
        false => None,
        true => {
            let schema = &setup.target_schema;
            let index = |name: &str| {
                schema
                    .index_of(name)
                    .map_err(|_| EngineError::Internal(format!("target has no column {name}")))
            };
            let (s, e) = (
                index(&setup.timeline.valid_from)?,
                index(&setup.timeline.valid_to)?,
            );
            Some((
                sqlutil::rows(&[old.column(s).clone()])?,
                sqlutil::rows(&[new.column(s).clone()])?,
                setup.timeline.open_as_null(old.column(e))?,
                setup.timeline.open_as_null(new.column(e))?,
            ))
        }
    };
    // Each key's rows on both sides. Sized for the keys, not the rows (a key has several
    // versions): fresh memory is dear.
    let mut by_key: ahash::AHashMap<&[u8], (Vec<u32>, Vec<u32>)> = ahash::AHashMap::new();
    for i in 0..old.num_rows() {
        by_key
            .entry(old_keys.row(i).data())
            .or_default()
            .0
            .push(i as u32);
    }
    for i in 0..new.num_rows() {
        by_key
            .entry(new_keys.row(i).data())
            .or_default()
            .1
            .push(i as u32);
    }
    let mut out = ChangeSet {
        keys: 0,
        delete_rows: Vec::new(),
        insert_rows: Vec::new(),
        old_rows: Vec::new(),
        rows_deleted: 0,
    };
    let (mut od, mut nd): (Vec<&[u8]>, Vec<&[u8]>) = (Vec::new(), Vec::new());
    for (o, n) in by_key.values() {
        od.clear();
        od.extend(o.iter().map(|&i| old_rows.row(i as usize).data()));
        od.sort_unstable();
        nd.clear();
        nd.extend(n.iter().map(|&i| new_rows.row(i as usize).data()));
        nd.sort_unstable();
        if od != nd {
            out.keys += 1;
            out.delete_rows.extend(o.first());
            out.insert_rows.extend_from_slice(n);
            out.old_rows.extend_from_slice(o);
        }
        report.rows_written += nd.iter().filter(|r| od.binary_search(r).is_err()).count();
        match &timeline {
            Some((old_start, new_start, old_end, new_end)) => {
                let (os, ns) = (
                    |i: u32| old_start.row(i as usize).data(),
                    |i: u32| new_start.row(i as usize).data(),
                );
                report.versions_opened += n
                    .iter()
                    .filter(|&&j| !o.iter().any(|&i| os(i) == ns(j)))
                    .count();
                report.versions_closed += o
                    .iter()
                    .filter(|&&i| {
                        old_end.is_null(i as usize)
                            && n.iter()
                                .any(|&j| new_end.is_valid(j as usize) && ns(j) == os(i))
                    })
                    .count();
            }
            None => {
                let before = o.last().map(|&i| old_rows.row(i as usize).data());
                report.keys_upserted += n
                    .iter()
                    .filter(|&&j| before != Some(new_rows.row(j as usize).data()))
                    .count();
                report.keys_deleted += usize::from(!o.is_empty() && n.is_empty());
            }
        }
    }
    out.delete_rows.sort_unstable();
    out.insert_rows.sort_unstable();
    out.old_rows.sort_unstable();
    out.rows_deleted = out.old_rows.len();
    Ok(out)
}

/// Fills the change counts of `report` for a target that had no rows before the run: every
/// row of `new` (in the target layout) is new.
pub(crate) fn count_first_rows(setup: &FlowSetup, new: &RecordBatch, report: &mut FlowReport) {
    report.rows_written += new.num_rows();
    if setup.flow.stored_as.has_timeline() {
        report.versions_opened += new.num_rows();
    } else {
        report.keys_upserted += new.num_rows();
    }
}

struct ChangeSet {
    keys: usize,
    /// One old row per changed key that exists in the target (its key drives the delete).
    delete_rows: Vec<u32>,
    /// Every new row of a changed key.
    insert_rows: Vec<u32>,
    /// Every old row of a changed key.
    old_rows: Vec<u32>,
    rows_deleted: usize,
}

/// The value of the `strata.scdType` table property for a history mode.
fn scd_type_property(mode: ScdType) -> &'static str {
    match mode {
        ScdType::Type1 => "1",
        ScdType::Type2 => "2",
        ScdType::Snapshots => "snapshots",
    }
}

/// Whether the flow's target gets deletion vectors without having asked for them: the
/// targets strata creates have them unless their TBLPROPERTIES set the property or the
/// target is partitioned by its start (written through delta-rs).
fn deletion_vectors_by_default(
    setup: &FlowSetup,
    user: &std::collections::BTreeMap<String, String>,
) -> bool {
    !warehouse::sets_property(user, crate::dv::PROPERTY) && !setup.timeline.partition_by_start
}

/// Table properties every AUTO CDC target carries.
pub(crate) fn target_configuration(
    setup: &FlowSetup,
    user: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, Option<String>)> {
    let mut conf = warehouse::table_configuration(user);
    if deletion_vectors_by_default(setup, user) {
        conf.push((crate::dv::PROPERTY.to_string(), Some("true".to_string())));
    }
    conf.push(("strata.keys".to_string(), Some(setup.key_names.join(","))));
    conf.push((
        "strata.scdType".to_string(),
        Some(scd_type_property(setup.flow.stored_as).to_string()),
    ));
    if !warehouse::sets_property(user, warehouse::PLAIN_COLUMNS_PROPERTY) {
        // Columns of nearly distinct values: the keys, and the timeline's (a boolean current
        // flag among them never gets a dictionary anyway).
        let mut plain = setup.key_names.clone();
        if setup.flow.stored_as.has_timeline() {
            plain.extend(setup.timeline.column_names());
        }
        conf.push((
            warehouse::PLAIN_COLUMNS_PROPERTY.to_string(),
            Some(plain.join(",")),
        ));
    }
    conf
}

/// The columns `now` adds to `before`, when that is all it changes: every column of
/// `before` is still there, in the same order and with the same type, and the others are
/// nullable. `None` for any other change; empty when nothing changed.
fn added_columns(before: &Schema, now: &Schema) -> Option<Vec<String>> {
    let mut added = Vec::new();
    let mut old = before.fields().iter().peekable();
    for f in now.fields() {
        match old.peek() {
            Some(o) if o.name() == f.name() => {
                if !sqlutil::same_type(o.data_type(), f.data_type()) {
                    return None;
                }
                old.next();
            }
            _ if f.is_nullable() && before.field_with_name(f.name()).is_err() => {
                added.push(f.name().clone())
            }
            _ => return None,
        }
    }
    old.peek().is_none().then_some(added)
}

/// Adds the columns the flow now produces beyond those its event store and target have
/// (its source gained a column under `COLUMNS *`, or the flow lists more): one
/// metadata-only commit per table, so the rows already there read NULL in them. Returns
/// the columns added; `check_existing` has refused every other change of columns.
async fn evolve_tables(
    wh: &Warehouse,
    setup: &FlowSetup,
    target: Option<DeltaTable>,
) -> Result<Vec<String>> {
    let flow = &setup.flow;
    let mut added = Vec::new();
    let tables = [
        (
            warehouse::open_delta(&wh.event_store_path(&flow.target)).await?,
            &setup.event_schema,
        ),
        (target, &setup.target_schema),
    ];
    for (table, want) in tables {
        let Some(table) = table else { continue };
        let have = sqlutil::table_schema(&table)?;
        let Some(new) = added_columns(&have, want).filter(|a| !a.is_empty()) else {
            continue;
        };
        let snapshot = table.snapshot().context(|| "reading table state".into())?;
        let st: deltalake::kernel::StructType = want.as_ref().try_into_kernel().map_err(|e| {
            EngineError::Internal(format!("schema not representable in Delta: {e}"))
        })?;
        let fields: Vec<_> = st
            .fields()
            .filter(|f| new.contains(f.name()))
            .cloned()
            .collect();
        let metadata = snapshot.metadata().clone().with_schema(&st).map_err(|e| {
            EngineError::Internal(format!("adding columns to {}: {e}", table.table_url()))
        })?;
        warehouse::commit_actions(
            &table,
            vec![Action::Metadata(metadata)],
            DeltaOperation::AddColumn { fields },
            CommitProperties::default(),
        )
        .await?;
        for c in new {
            if !added.contains(&c) {
                added.push(c);
            }
        }
    }
    Ok(added)
}

/// Sets the existing `target`'s `delta.enableDeletionVectors` to what the pipeline now
/// declares for it, when the two differ (the property was added to, or changed in, the
/// TBLPROPERTIES of a target that already exists); enabling it upgrades the table's
/// protocol. Returns the target as it now is, and the new setting when it changed. Vectors
/// already written stay valid either way; with the property off, the next run that
/// replaces their rows rewrites those files.
async fn follow_deletion_vectors(
    target: DeltaTable,
    setup: &FlowSetup,
    declared: &std::collections::BTreeMap<String, String>,
) -> Result<(DeltaTable, Option<bool>)> {
    let Some(want) = declared
        .get(crate::dv::PROPERTY)
        .map(|v| v.eq_ignore_ascii_case("true"))
    else {
        return Ok((target, None));
    };
    let has = warehouse::table_properties(&target)?
        .get(crate::dv::PROPERTY)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if has == want {
        return Ok((target, None));
    }
    let target = target
        .set_tbl_properties()
        .with_properties(std::collections::HashMap::from([(
            crate::dv::PROPERTY.to_string(),
            want.to_string(),
        )]))
        .await
        .context(|| format!("setting {} on {}", crate::dv::PROPERTY, setup.flow.target))?;
    Ok((target, Some(want)))
}

/// Checks an existing event store and target against the flow (R10) before anything runs.
pub(crate) async fn check_existing(wh: &Warehouse, setup: &FlowSetup) -> Result<()> {
    let flow = &setup.flow;
    if let Some(store) = warehouse::open_delta(&wh.event_store_path(&flow.target)).await? {
        let schema = sqlutil::table_schema(&store)?;
        let mut key_and_seq: Vec<usize> = setup.spec.keys.clone();
        key_and_seq.push(setup.spec.n_out);
        for i in key_and_seq {
            let want = setup.event_schema.field(i);
            let ok = schema
                .field_with_name(want.name())
                .map(|f| sqlutil::same_type(f.data_type(), want.data_type()))
                .unwrap_or(false);
            if !ok {
                return Err(flow_err(
                    flow,
                    format!(
                        "the key columns or the SEQUENCE BY type changed since the flow last ran \
                         (`{}` is now {}); a full refresh of {} is needed",
                        if i == setup.spec.n_out {
                            "SEQUENCE BY"
                        } else {
                            want.name()
                        },
                        want.data_type(),
                        flow.target
                    ),
                ));
            }
        }
        if added_columns(&schema, &setup.event_schema).is_none() {
            let n = setup.out_cols.len();
            let names = |s: &Schema, n: usize| -> Vec<String> {
                s.fields()
                    .iter()
                    .take(n)
                    .map(|f| f.name().clone())
                    .collect()
            };
            let stored_n = schema.fields().len().saturating_sub(3);
            let (now, before) = (names(&setup.event_schema, n), names(&schema, stored_n));
            let gone: Vec<String> = before
                .iter()
                .filter(|c| !now.contains(c))
                .map(|c| format!("`{c}`"))
                .collect();
            let advice = if gone.is_empty() {
                format!(
                    "a column changed its type or its place; columns can only be added (at \
                     any place, earlier rows then read NULL), so a full refresh of {} is needed",
                    flow.target
                )
            } else {
                format!(
                    "the flow no longer produces {}; columns can only be added, so list the \
                     dropped columns again or run --full-refresh {}",
                    gone.join(", "),
                    flow.target
                )
            };
            return Err(flow_err(
                flow,
                format!(
                    "the output columns changed since the flow last ran (now {}; the target has {}); \
                     {advice}",
                    now.join(", "),
                    before.join(", "),
                ),
            ));
        }
    }
    if let Some(target) = wh.open_table(&flow.target).await? {
        let config = warehouse::table_properties(&target)?;
        let mode = scd_type_property(flow.stored_as);
        if let Some(recorded) = config.get("strata.scdType").filter(|m| **m != mode) {
            let name = |m: &str| match m {
                "1" => "SCD TYPE 1".to_string(),
                "2" => "SCD TYPE 2".to_string(),
                "snapshots" => "SNAPSHOTS".to_string(),
                other => other.to_string(),
            };
            return Err(flow_err(
                flow,
                format!(
                    "{} is stored as {} but the flow now says STORED AS {}; switching the \
                     history mode needs a rebuild of {} from its source (remove the table and \
                     its state under _strata, then run again)",
                    flow.target,
                    name(recorded),
                    flow.stored_as,
                    flow.target
                ),
            ));
        }
        let recorded = config.get("strata.keys").cloned();
        if let Some(recorded) = recorded {
            if recorded != setup.key_names.join(",") {
                return Err(flow_err(
                    flow,
                    format!(
                        "KEYS changed from ({recorded}) to ({}) since the flow last ran; \
                         a full refresh of {} is needed",
                        setup.key_names.join(", "),
                        flow.target
                    ),
                ));
            }
        }
        let schema = sqlutil::table_schema(&target)?;
        if added_columns(&schema, &setup.target_schema).is_none() {
            return Err(flow_err(
                flow,
                format!(
                    "target {} has columns ({}) but the flow produces ({}); a full refresh is needed",
                    flow.target,
                    sqlutil::describe_fields(&schema),
                    sqlutil::describe_fields(&setup.target_schema)
                ),
            ));
        }
    }
    Ok(())
}

/// Runs `setup` once over all source rows it has not seen, after bringing an existing
/// target in line with the flow: its deletion-vector setting, and the columns the flow
/// newly produces (added to the event store and the target).
pub(crate) async fn run_flow(
    wh: &Warehouse,
    setup: &FlowSetup,
    target_properties: &std::collections::BTreeMap<String, String>,
    update: &(dyn Fn(String) + Send + Sync),
) -> Result<FlowReport> {
    let (target, switched) = match wh.open_table(&setup.flow.target).await? {
        Some(t) => {
            let (t, switched) = follow_deletion_vectors(t, setup, target_properties).await?;
            (Some(t), switched)
        }
        None => (None, None),
    };
    let created = target.is_none();
    let added = evolve_tables(wh, setup, target).await?;
    let mut report = run_flow_once(wh, setup, target_properties, update).await?;
    let gc_set = warehouse::sets_property(target_properties, crate::tombstones::PROPERTY);
    if gc_set && setup.tombstone_secs.is_none() {
        report.notes.push(format!(
            "{} is not acted on for {}: its deletes end versions of its history and are \
             kept, so a late event older than a delete never brings its key back",
            crate::tombstones::PROPERTY,
            setup.flow.target
        ));
    }
    if created
        && deletion_vectors_by_default(setup, target_properties)
        && wh.open_table(&setup.flow.target).await?.is_some()
    {
        report.notes.push(format!(
            "created {} with deletion vectors (for deltalake for Python's \
             to_pyarrow_table(), set '{}' = 'false')",
            setup.flow.target,
            crate::dv::PROPERTY
        ));
    }
    if let Some(on) = switched {
        report.notes.push(format!(
            "deletion vectors {} on {} (delta.enableDeletionVectors = {on})",
            if on { "enabled" } else { "disabled" },
            setup.flow.target
        ));
    }
    if !added.is_empty() {
        report.notes.push(format!(
            "added column(s) {} to {}; rows written before read NULL in them",
            added.join(", "),
            setup.flow.target
        ));
    }
    Ok(report)
}

async fn run_flow_once(
    wh: &Warehouse,
    setup: &FlowSetup,
    target_properties: &std::collections::BTreeMap<String, String>,
    update: &(dyn Fn(String) + Send + Sync),
) -> Result<FlowReport> {
    if setup.flow.stored_as == ScdType::Snapshots {
        return snapshot::run_snapshots_mode(wh, setup, target_properties).await;
    }
    let flow = &setup.flow;
    let mut report = FlowReport {
        flow: flow.name.clone(),
        ..Default::default()
    };
    let Some(source) = wh.open_table(&flow.source).await? else {
        report.skipped = Some(format!("source {} has no data yet", flow.source));
        return Ok(report);
    };
    let store_path = wh.event_store_path(&flow.target);
    let store = warehouse::open_delta(&store_path).await?;
    let app_id = format!("strata-flow:{}", flow.name);
    let from = match &store {
        Some(s) => txn_version(s, &app_id).await?,
        None => None,
    };
    let source_version = version_of(&source);

    let target = wh.open_table(&flow.target).await?;
    let applied = match &target {
        Some(t) => txn_version(t, EVENTS_APP_ID).await?.unwrap_or(-1),
        None => -1,
    };
    let store_version = store.as_ref().map_or(-1, version_of);

    let ctx = warehouse::new_session();
    let steps = warehouse::Steps::new(&flow.name, "");
    let phase = |what: &str| warehouse::step!(info, steps, what);
    // Keys of event-store commits the target does not reflect yet (an interrupted run).
    let mut touched: Option<Touched> = None;
    if let Some(store) = &store {
        register_table(&ctx, "__strata_events", store, None).await?;
        if store_version > applied {
            let (seq, op, run) = (
                quote_ident(SEQ_COL),
                quote_ident(OP_COL),
                quote_ident(RUN_COL),
            );
            let sql = if setup.is_snapshot() {
                // Also the events that the unapplied runs' deliveries superseded.
                format!(
                    "SELECT * FROM __strata_events WHERE {op} < {m} AND ({run} > {applied} OR \
                     {seq} IN (SELECT {seq} FROM __strata_events WHERE {op} = {m} AND {run} > {applied}))",
                    m = snapshot::OP_MARKER
                )
            } else {
                format!("SELECT * FROM __strata_events WHERE {run} > {applied}")
            };
            let pending = collect_sql(&ctx, &sql, &setup.event_schema).await?;
            if pending.num_rows() > 0 {
                touched = Some(touched_keys(setup, &pending)?);
                report.recovered = true;
            }
        }
    }

    let has_new_input = from.is_none_or(|f| f < source_version);
    let run = store_version + 1;
    // The instant this run decides which tombstones have expired, recorded in its
    // event-store commit as the time its events were processed (`tombstones.rs`).
    let decided_at = chrono::Utc::now().timestamp_millis();
    // What the event store gets in this run (for a snapshot flow, the events plus markers).
    let mut to_commit: Option<Vec<RecordBatch>> = None;
    let mut superseded: Option<RecordBatch> = None;
    let mut new_markers: Option<RecordBatch> = None;
    // A snapshot flow's digest of the state after this run, and where it goes (`digest.rs`).
    let mut state_digest: Option<crate::digest::Digest> = None;
    let digest_dir = crate::digest::dir_for(&store_path);
    let new_events = if has_new_input {
        let handed = (!setup.table_mode() && !setup.source_feed)
            .then(|| {
                wh.take_appended(
                    &wh.table_path(&flow.source),
                    &flow.name,
                    from,
                    source_version,
                )
            })
            .flatten();
        let pieces = if let Some(checked) = handed {
            // Exactly the rows this process just appended to the source, evaluated and
            // checked for this flow before that commit: no need to read back the files it
            // wrote.
            checked
        } else {
            if setup.source_feed && !setup.table_mode() {
                let feed =
                    crate::changes::read_feed(&source, from, Some(source_version), false).await?;
                ctx.register_batch(strata_sql::SOURCE_PLACEHOLDER, feed)
                    .context(|| "registering the change feed".into())?;
            } else {
                let files = if setup.table_mode() {
                    None
                } else {
                    Some(new_files(&source, from).await?)
                };
                register_table(&ctx, strata_sql::SOURCE_PLACEHOLDER, &source, files).await?;
            }
            let pieces = evaluate_events(&ctx, setup).await?;
            let _ = ctx.deregister_table(strata_sql::SOURCE_PLACEHOLDER);
            let place = format!(
                "the rows of {} added after version {}",
                flow.source,
                from.map_or("(start)".to_string(), |v| v.to_string())
            );
            validate_events(setup, &pieces, &place)?;
            pieces
        };
        report.source_versions = Some((from, source_version));
        report.events = pieces.iter().map(RecordBatch::num_rows).sum();
        if setup.is_snapshot() {
            // A snapshot's rows go to `to_events` in the pieces they came in: a large
            // snapshot diffed by digest is never copied into one batch.
            phase("evaluated and checked the new events");
            // The target reflects the latest stored version when no earlier run is pending.
            let in_step = store.is_some() && store_version == applied;
            let current = target.as_ref().filter(|_| in_step);
            let s = snapshot::to_events(
                &ctx,
                setup,
                store.is_some(),
                current,
                (&digest_dir, store_version),
                &pieces,
                run,
            )
            .await?;
            report.notes = s.notes;
            state_digest = s.state_digest;
            if store.is_some() {
                snapshot::register_effective(
                    &ctx,
                    setup,
                    "__strata_effective",
                    "__strata_events",
                    Some(&s.markers),
                )
                .await?;
            }
            new_markers = Some(s.markers.clone());
            to_commit = Some(vec![s.events.clone(), s.markers]);
            superseded = s.superseded;
            Some(s.events)
        } else {
            let events = with_run(setup, pieces, run)?;
            phase("evaluated and checked the new events");
            to_commit = Some(vec![events.clone()]);
            Some(events)
        }
    } else {
        None
    };
    if new_events.is_none() && touched.is_none() {
        report.skipped = Some("no new input".to_string());
        return Ok(report);
    }
    if let Some(ev) = &new_events {
        // Without an event store there is nothing stored to look up: the first run derives
        // every key it sees, and the target has nothing yet.
        let t = if store.is_some() {
            touched_keys(setup, ev)?
        } else {
            Touched::All
        };
        touched = Some(match touched {
            Some(p) => merge_touched(p, t)?,
            None => t,
        });
    }
    if let Some(old) = &superseded {
        let t = touched_keys(setup, old)?;
        touched = Some(match touched {
            Some(p) => merge_touched(p, t)?,
            None => t,
        });
    }
    let Some(touched) = touched else {
        return Err(EngineError::Internal("no keys to derive".into()));
    };
    warehouse::step!(debug, steps, "collected the touched keys");
    report.keys_touched = match &touched {
        Touched::All => 0,
        Touched::Keys(k) => k.num_rows(),
    };

    // Every stored event of the touched keys, plus the new ones: the fold's input.
    let mut parts = Vec::new();
    if store.is_some() {
        if setup.is_snapshot() && new_events.is_none() {
            snapshot::register_effective(
                &ctx,
                setup,
                "__strata_effective",
                "__strata_events",
                None,
            )
            .await?;
        }
        // One integer key and no truncates: the touched keys' pages of the store, found
        // through its page index (`store.rs`); else a DataFusion join.
        let mut by_pages = match (&touched, &store, setup.key_names.as_slice()) {
            (Touched::Keys(keys), Some(store), [key]) if setup.flow.truncate_when.is_none() => {
                match crate::store::int_keys(keys) {
                    Some(keys) => {
                        crate::store::read_keys(store, &store_path, key, keys, &setup.event_schema)
                            .await?
                    }
                    None => None,
                }
            }
            _ => None,
        };
        if by_pages.is_some() {
            warehouse::step!(debug, steps, "read the touched keys' stored events by page");
        }
        if let (Some(raw), true) = (&by_pages, setup.is_snapshot()) {
            // A snapshot flow's stored events count unless a later delivery of their
            // version superseded them.
            let _ = ctx.deregister_table("__strata_touched_raw");
            ctx.register_batch("__strata_touched_raw", raw.clone())
                .context(|| "registering stored events".into())?;
            snapshot::register_effective(
                &ctx,
                setup,
                "__strata_touched",
                "__strata_touched_raw",
                new_markers.as_ref(),
            )
            .await?;
            by_pages = Some(
                collect_sql(&ctx, "SELECT * FROM __strata_touched", &setup.event_schema).await?,
            );
            warehouse::step!(
                debug,
                steps,
                "kept the stored events no later delivery superseded"
            );
        }
        let slice = match by_pages {
            Some(slice) => slice,
            None => {
                read_slice(
                    &ctx,
                    setup,
                    if setup.is_snapshot() {
                        "__strata_effective"
                    } else {
                        "__strata_events"
                    },
                    &touched,
                    &setup.event_schema,
                    true,
                )
                .await?
            }
        };
        let slice = match setup.tombstone_secs {
            Some(secs) => {
                let (kept, forgotten) = crate::tombstones::forget_expired(
                    &slice,
                    &setup.spec.keys,
                    setup.spec.n_out,
                    secs,
                    decided_at,
                    &mut crate::tombstones::CommitTimes::new(store_path.clone()),
                )?;
                if forgotten > 0 {
                    report.notes.push(format!(
                        "{forgotten} tombstone(s) older than {secs} s forgotten \
                         ({}): a late event older than one of those deletes brings its key back",
                        crate::tombstones::PROPERTY
                    ));
                }
                kept
            }
            None => slice,
        };
        parts.push(slice);
    }
    // The target reflects every stored event (no interrupted run to complete): the rows the
    // touched keys have now are the fold of their stored events, so the target need not be
    // read to find out what changes.
    // (For a snapshot flow, the run's deliveries must supersede nothing stored: new
    // versions only.)
    let stored_only = (store_version == applied
        && !report.recovered
        && (!setup.is_snapshot() || superseded.is_none())
        && matches!(touched, Touched::Keys(_)))
    .then(|| parts.first().cloned())
    .flatten();
    if let Some(ev) = &new_events {
        parts.push(ev.clone());
    }
    let all_events = match parts.len() {
        1 => parts.swap_remove(0),
        _ => {
            concat_batches(&setup.event_schema, &parts).context(|| "concatenating events".into())?
        }
    };
    phase("read new events and the stored events of the touched keys");
    update(format!(
        "{} new event(s), folding {} event(s)",
        report.events,
        all_events.num_rows()
    ));
    let (derived, keys_derived) = setup.fold_to_target(&all_events)?;
    phase("folded");
    drop(all_events);
    if matches!(touched, Touched::All) {
        report.keys_touched = keys_derived;
    }
    if setup.flow.stored_as == ScdType::Type2 {
        // The built-in integrity check: a broken timeline is never committed.
        let violations = crate::query::check_rows(&derived, &setup.key_names, &setup.timeline)?;
        if let Some(v) = violations.first() {
            return Err(EngineError::Internal(format!(
                "flow {}: the SCD2 integrity check failed before anything was written: key ({}) \
                 {} ({} violation(s) in all)",
                flow.name,
                v.key,
                v.problem,
                violations.len()
            )));
        }
    }

    phase("checked the SCD2 integrity");
    // Commit the events (and the source position) first: from here on they are never lost.
    drop(new_events);
    let new_store_version = match to_commit {
        Some(ev) => {
            let handle = match store {
                Some(s) => s,
                None => {
                    warehouse::create_delta(
                        &store_path,
                        "events",
                        &setup.event_schema,
                        vec![
                            (
                                warehouse::COMPRESSION_PROPERTY.to_string(),
                                Some("lz4_raw".to_string()),
                            ),
                            (
                                warehouse::PAGE_ROWS_PROPERTY.to_string(),
                                Some(crate::store::STORE_PAGE_ROWS.to_string()),
                            ),
                        ],
                        None,
                        Vec::new(),
                    )
                    .await?
                }
            };
            let version = warehouse::append(
                &handle,
                ev,
                Vec::new(),
                CommitProperties::default()
                    .with_application_transaction(Transaction::new(&app_id, source_version))
                    .with_metadata([(
                        crate::tombstones::DECIDED_AT.to_string(),
                        serde_json::json!(decided_at),
                    )]),
            )
            .await
            .map_err(|e| match e {
                e @ EngineError::Conflict { .. } => e,
                e => EngineError::Plan(format!("flow {}: committing events: {e}", flow.name)),
            })?;
            if version < 0 {
                run
            } else {
                version
            }
        }
        None => store_version,
    };
    phase("committed the events");
    // Written on a thread of its own while the target is written; joined when the run ends.
    let _digest_writer = state_digest
        .and_then(|d| snapshot::write_digest(setup, digest_dir.clone(), new_store_version, d));

    // The target: only keys whose rows change are rewritten.
    let target = match target {
        Some(t) if !table_files(&t)?.is_empty() => t,
        existing => {
            // No rows yet: everything folded is new, written with a plain append (which also
            // creates the table with its properties on the first run).
            report.keys_changed = report.keys_touched;
            report.rows_inserted = derived.num_rows();
            count_first_rows(setup, &derived, &mut report);
            let handle = match existing {
                Some(t) => t,
                None => {
                    warehouse::create_delta(
                        &wh.table_path(&flow.target),
                        &flow.target.name,
                        &setup.target_schema,
                        target_configuration(setup, target_properties),
                        None,
                        setup.timeline.partition_columns(),
                    )
                    .await?
                }
            };
            warehouse::append(
                &handle,
                vec![derived],
                Vec::new(),
                target_commit(new_store_version, &app_id, source_version),
            )
            .await?;
            phase("wrote the first rows of the target");
            return Ok(report);
        }
    };
    let current = match stored_only {
        Some(stored) => setup.fold_to_target(&stored)?.0,
        None => {
            register_table(&ctx, "__strata_target", &target, None).await?;
            read_slice(
                &ctx,
                setup,
                "__strata_target",
                &touched,
                &setup.target_schema,
                false,
            )
            .await?
        }
    };
    phase("found the target rows of the touched keys");
    update(format!(
        "writing the rows of {} key(s)",
        report.keys_touched
    ));
    let change = compare(setup, &current, &derived, &mut report)?;
    warehouse::step!(debug, steps, "compared them with the new rows");
    report.keys_changed = change.keys;
    report.rows_deleted = change.rows_deleted;
    report.rows_inserted = change.insert_rows.len();
    if change.keys == 0 {
        return Ok(report);
    }
    let inserts = compute::take_record_batch(&derived, &UInt32Array::from(change.insert_rows))
        .context(|| "selecting rows".into())?;
    let old_rows = compute::take_record_batch(&current, &UInt32Array::from(change.old_rows))
        .context(|| "selecting rows".into())?;
    drop(derived);
    if let Some(done) = crate::rewrite::replace_keys(
        &target,
        &setup.key_names,
        &old_rows,
        inserts.clone(),
        target_commit(new_store_version, &app_id, source_version),
    )
    .await
    .map_err(|e| match e {
        e @ EngineError::Conflict { .. } => e,
        e => EngineError::Plan(format!("flow {}: writing {}: {e}", flow.name, flow.target)),
    })? {
        phase(&format!(
            "replaced the changed keys' rows in the target ({done})"
        ));
        return Ok(report);
    }
    // A target the rewrite does not handle (partitioned by its start, or written by another
    // engine with column mapping or file-stored deletion vectors): a delta-rs MERGE.
    drop(old_rows);
    let props = target_commit(new_store_version, &app_id, source_version);
    let deletes = compute::take_record_batch(&current, &UInt32Array::from(change.delete_rows))
        .context(|| "selecting rows".into())?;
    let source_df = merge_source(&ctx, &inserts, &deletes)?;
    let mut predicate: Expr = col(Column::new(Some("source"), "__strata_action")).eq(lit("del"));
    for k in &setup.key_names {
        predicate = predicate.and(
            col(Column::new(Some("target"), k.as_str()))
                .eq(col(Column::new(Some("source"), k.as_str()))),
        );
    }
    let names: Vec<String> = setup
        .target_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    target
        .merge(source_df, predicate)
        .with_source_alias("source")
        .with_target_alias("target")
        .with_commit_properties(props)
        .when_matched_delete(|d| d)
        .context(|| "merge".into())?
        .when_not_matched_insert(|mut ins| {
            ins = ins.predicate(col(Column::new(Some("source"), "__strata_action")).eq(lit("ins")));
            for n in &names {
                ins = ins.set(n.as_str(), col(Column::new(Some("source"), n.as_str())));
            }
            ins
        })
        .context(|| "merge".into())?
        .await
        .context(|| format!("flow {}: merging into {}", flow.name, flow.target))?;
    phase("merged the changed keys into the target");
    Ok(report)
}

/// A target commit records the event-store version it reflects and the flow's source position.
fn target_commit(store_version: i64, app_id: &str, source_version: i64) -> CommitProperties {
    CommitProperties::default()
        .with_application_transaction(Transaction::new(EVENTS_APP_ID, store_version))
        .with_application_transaction(Transaction::new(app_id, source_version))
}

/// The MERGE source: new rows tagged `ins`, one row per changed key tagged `del`.
fn merge_source(
    ctx: &SessionContext,
    inserts: &RecordBatch,
    deletes: &RecordBatch,
) -> Result<deltalake::datafusion::prelude::DataFrame> {
    let tag = |b: &RecordBatch, t: &str| -> Result<RecordBatch> {
        let mut fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new("__strata_action", DataType::Utf8, false));
        let mut cols = b.columns().to_vec();
        cols.push(Arc::new(deltalake::arrow::array::StringArray::from(vec![
            t;
            b.num_rows()
        ])));
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).context(|| "merge source".into())
    };
    let (i, d) = (tag(inserts, "ins")?, tag(deletes, "del")?);
    let both = concat_batches(&i.schema(), &[i.clone(), d]).context(|| "merge source".into())?;
    ctx.read_batch(both).context(|| "merge source".into())
}

/// The table's version as Delta's signed transaction versions count it, -1 if none.
pub(crate) fn version_of(table: &DeltaTable) -> i64 {
    table.version().map_or(-1, |v| v as i64)
}

pub(crate) async fn txn_version(table: &DeltaTable, app_id: &str) -> Result<Option<i64>> {
    table
        .snapshot()
        .context(|| "reading table state".into())?
        .transaction_version(table.log_store().as_ref(), app_id)
        .await
        .context(|| format!("reading transaction {app_id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(fields: &[(&str, DataType, bool)]) -> Schema {
        Schema::new(
            fields
                .iter()
                .map(|(n, t, null)| Field::new(*n, t.clone(), *null))
                .collect::<Vec<_>>(),
        )
    }

    /// Only nullable columns added anywhere, with every old column kept in order and type,
    /// count as an evolution; anything else is refused.
    #[test]
    fn added_columns_accepts_only_additions() {
        use DataType::{Int64, Utf8};
        let before = schema(&[
            ("id", Int64, false),
            ("name", Utf8, true),
            ("__END_AT", Int64, true),
        ]);
        let same = added_columns(&before, &before);
        assert_eq!(same, Some(vec![]));
        let now = schema(&[
            ("id", Int64, false),
            ("name", Utf8, true),
            ("zip", Utf8, true),
            ("__END_AT", Int64, true),
            ("extra", Int64, true),
        ]);
        assert_eq!(
            added_columns(&before, &now),
            Some(vec!["zip".to_string(), "extra".to_string()])
        );
        let not_null = schema(&[
            ("id", Int64, false),
            ("zip", Utf8, false),
            ("name", Utf8, true),
            ("__END_AT", Int64, true),
        ]);
        assert_eq!(
            added_columns(&before, &not_null),
            None,
            "a NOT NULL addition"
        );
        let dropped = schema(&[("id", Int64, false), ("__END_AT", Int64, true)]);
        assert_eq!(added_columns(&before, &dropped), None, "a dropped column");
        let moved = schema(&[
            ("name", Utf8, true),
            ("id", Int64, false),
            ("__END_AT", Int64, true),
        ]);
        assert_eq!(added_columns(&before, &moved), None, "a reordered column");
        let retyped = schema(&[
            ("id", Int64, false),
            ("name", Int64, true),
            ("__END_AT", Int64, true),
        ]);
        assert_eq!(added_columns(&before, &retyped), None, "a retyped column");
    }
}
