//! Preparing a flow before anything runs: checking it against its source's schema
//! ([`prepare_flow`]) and against an existing event store and target ([`check_existing`]),
//! and the properties a new target gets.

use crate::error::{Context, EngineError, Result};
use crate::semantics::declared;
use crate::semantics::flow::FlowSetup;
use crate::semantics::fold::END_COL;
use crate::semantics::fold::OP_COL;
use crate::semantics::fold::RUN_COL;
use crate::semantics::fold::SEQ_COL;
use crate::semantics::fold::{FoldSpec, START_COL};
use crate::semantics::timeline::Timeline;
use crate::storage::warehouse::Warehouse;
use crate::util::arrow;
use crate::util::sql::quote_ident;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::DataType;
use deltalake::arrow::datatypes::Field;
use deltalake::arrow::datatypes::Schema;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::arrow::datatypes::TimeUnit;
use std::sync::Arc;
use strata_core::FoldOptions;
use strata_sql::CdcFlow;
use strata_sql::ColumnDef;
use strata_sql::ColumnSelection;
use strata_sql::FlowKind;
use strata_sql::ScdType;
use strata_sql::SequenceBy;

fn flow_err(flow: &CdcFlow, msg: impl std::fmt::Display) -> EngineError {
    EngineError::plan_at(format!("flow {}", flow.name), flow.location.line, msg)
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
///
/// ```text
///  output_columns ─▶ event_sql ─▶ plan_events ─▶ schemas ─▶ FlowSetup
///  (COLUMNS, KEYS,   (the SELECT   (planned over   (event store, fold
///   TRACK HISTORY)    of events)    an empty        and target, with
///                                   source)         the timeline)
/// ```
pub(crate) async fn prepare_flow(
    flow: &CdcFlow,
    source: &SchemaRef,
    target_properties: &std::collections::BTreeMap<String, String>,
    declared: Option<&[ColumnDef]>,
) -> Result<FlowSetup> {
    let output = with_hash_column(flow, output_columns(flow, source)?, target_properties)?;
    let Output {
        out_cols,
        tracked_names,
        exprs,
    } = match declared {
        Some(d) => conform_output(flow, source, output, d, target_properties)?,
        None => output,
    };
    let mut sql = event_sql(flow, &exprs, None);
    let mut planned = plan_events(flow, source, &sql, out_cols.len()).await?;
    if let Some(d) = declared.filter(|_| flow.stored_as.has_timeline()) {
        if let Some(cast) = timeline_cast(flow, &planned, d, target_properties)? {
            sql = event_sql(flow, &exprs, Some(&cast));
            planned = plan_events(flow, source, &sql, out_cols.len()).await?;
        }
    }
    let mut schemas = schemas(flow, &planned, &out_cols, target_properties)?;
    if let Some(d) = declared {
        schemas.target = with_declared_fields(&schemas.target, d);
    }

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
        select_sql: sql.select_sql,
        out_cols,
        key_names: flow.keys.clone(),
        event_schema: schemas.event,
        fold_schema: schemas.fold,
        target_schema: schemas.target,
        timeline: schemas.timeline,
        spec,
        source_feed: false,
        target_comment: None,
        target_partitions: Vec::new(),
        null_key_hint: null_key_hint(flow, source),
        tombstone_secs: match (&flow.kind, flow.stored_as) {
            (FlowKind::Snapshot { .. }, _) | (_, ScdType::Type2 | ScdType::Snapshots) => None,
            _ => Some(
                crate::eventstore::tombstones::threshold(target_properties)
                    .map_err(|e| flow_err(flow, format!("{}: {e}", flow.target)))?,
            ),
        },
    })
}

/// What to add to a NULL-key rejection (R4) of `flow`: a database change log's TRUNCATE
/// arrives as a row without a key, which only `APPLY AS TRUNCATE WHEN` makes a truncate.
fn null_key_hint(flow: &CdcFlow, source: &SchemaRef) -> Option<String> {
    let change_type = strata_sources::batch::meta::CHANGE_TYPE;
    (flow.truncate_when.is_none() && source.index_of(change_type).is_ok()).then(|| {
        format!(
            "; a TRUNCATE on the source arrives as such a row ({change_type} = 'truncate'): \
             add APPLY AS TRUNCATE WHEN {change_type} = 'truncate' to flow {} to empty an \
             SCD type 1 target there, or close every open version of an SCD type 2 one",
            flow.name
        )
    })
}

/// The columns a flow writes and those whose changes it tracks.
struct Output {
    out_cols: Vec<String>,
    tracked_names: Vec<String>,
    /// The SQL of each output column, aliased to its name.
    exprs: Vec<String>,
}

/// The flow's output made to match its target's declared columns (in their order, widened
/// to their types, with the generated columns computed), or an error naming the column.
fn conform_output(
    flow: &CdcFlow,
    source: &SchemaRef,
    output: Output,
    declared: &[ColumnDef],
    target_properties: &std::collections::BTreeMap<String, String>,
) -> Result<Output> {
    let produced: Vec<(String, DataType)> = output
        .out_cols
        .iter()
        .map(|c| {
            // A column not in the source is the hash column, a string.
            let t = source
                .field_with_name(c)
                .map(|f| arrow::storage_type(f.data_type()))
                .unwrap_or(DataType::Utf8);
            (c.clone(), t)
        })
        .collect();
    let expr_of = |name: &str| {
        output
            .out_cols
            .iter()
            .position(|c| c == name)
            .and_then(|i| output.exprs.get(i).cloned())
            .unwrap_or_else(|| quote_ident(name))
    };
    let timeline = match flow.stored_as.has_timeline() {
        true => Timeline::from_properties(target_properties)
            .map_err(|e| flow_err(flow, format!("target {}: {e}", flow.target)))?
            .column_names(),
        false => Vec::new(),
    };
    let conformed = declared::conform(
        &produced,
        declared,
        &timeline,
        &format!("flow {}", flow.name),
        &flow.target.to_string(),
    )
    .map_err(|e| flow_err(flow, e))?;
    let mut out_cols = Vec::new();
    let mut exprs = Vec::new();
    for (name, cast) in &conformed.columns {
        let expr = expr_of(name);
        exprs.push(match cast {
            Some(t) => {
                // The column's SQL without its alias, cast, then aliased again.
                let alias = format!(" AS {}", quote_ident(name));
                let bare = expr.strip_suffix(&alias).unwrap_or(&expr);
                format!("{}{alias}", cast_sql(bare, t))
            }
            None => expr,
        });
        out_cols.push(name.clone());
    }
    for (name, expr, t) in &conformed.generated {
        exprs.push(format!(
            "{} AS {}",
            cast_sql(&format!("({expr})"), t),
            quote_ident(name)
        ));
        out_cols.push(name.clone());
    }
    // Generated columns (and the hash column) follow the columns they are computed from:
    // they are not tracked themselves.
    Ok(Output {
        out_cols,
        tracked_names: output.tracked_names,
        exprs,
    })
}

/// The target property naming the column that holds a hash of each row's tracked values.
pub(crate) const HASH_COLUMN_PROPERTY: &str = "strata.scd.hashColumn";

/// With `strata.scd.hashColumn = 'name'` on the target, the output gains column `name`: the
/// MD5 (hex) of the row's tracked values other than the keys, each cast to a string (NULL as
/// the character U+0000), joined with U+001F. It is not tracked itself.
fn with_hash_column(
    flow: &CdcFlow,
    mut output: Output,
    target_properties: &std::collections::BTreeMap<String, String>,
) -> Result<Output> {
    let Some(name) = target_properties
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(HASH_COLUMN_PROPERTY))
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
    else {
        return Ok(output);
    };
    if output
        .out_cols
        .iter()
        .any(|c| c.eq_ignore_ascii_case(&name))
    {
        return Err(flow_err(
            flow,
            format!(
                "{HASH_COLUMN_PROPERTY} = '{name}' names a column the flow already writes; \
                 choose another name or leave it out with COLUMNS * EXCEPT ({name})"
            ),
        ));
    }
    let parts: Vec<String> = output
        .tracked_names
        .iter()
        .filter(|c| !flow.keys.contains(c))
        .map(|c| format!("coalesce(CAST({} AS VARCHAR), chr(0))", quote_ident(c)))
        .collect();
    let hashed = match parts.is_empty() {
        true => "''".to_string(),
        false => format!("concat_ws(chr(31), {})", parts.join(", ")),
    };
    output
        .exprs
        .push(format!("md5({hashed}) AS {}", quote_ident(&name)));
    output.out_cols.push(name);
    Ok(output)
}

/// `sql` cast to Arrow type `t` (DataFusion's `arrow_cast`, which reads Arrow's spelling).
fn cast_sql(sql: &str, t: &DataType) -> String {
    format!(
        "arrow_cast({sql}, {})",
        crate::util::sql::quote_str(&t.to_string())
    )
}

/// The type the sequence is cast to so that the target's declared timeline columns match
/// it, or an error naming the column and both types.
fn timeline_cast(
    flow: &CdcFlow,
    planned: &Planned,
    declared: &[ColumnDef],
    target_properties: &std::collections::BTreeMap<String, String>,
) -> Result<Option<DataType>> {
    let seq_type = arrow::storage_type(&planned.seq_type);
    let t = Timeline::from_properties(target_properties)
        .map_err(|e| flow_err(flow, format!("target {}: {e}", flow.target)))?;
    let sequence = match &flow.sequence_by {
        SequenceBy::Expr(e) => e.clone(),
        SequenceBy::Struct(fields) => format!(
            "STRUCT({})",
            fields
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    declared::conform_timeline(
        &t.fields(&seq_type),
        declared,
        &sequence,
        &seq_type,
        &flow.target.to_string(),
    )
    .map_err(|e| flow_err(flow, e))
}

/// The target's fields with the nullability, comments and generation expressions of its
/// declared columns.
fn with_declared_fields(target: &SchemaRef, declared: &[ColumnDef]) -> SchemaRef {
    let fields: Vec<Field> = target
        .fields()
        .iter()
        .map(|f| {
            match declared
                .iter()
                .find(|d| d.name.eq_ignore_ascii_case(f.name()))
            {
                Some(d) => declared::declared_field(d)
                    .with_name(f.name())
                    .with_data_type(f.data_type().clone()),
                None => f.as_ref().clone(),
            }
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// The flow's output columns (`COLUMNS`) among the source's, its keys among them, no
/// reserved name, and the tracked ones (`TRACK HISTORY ON`).
fn output_columns(flow: &CdcFlow, source: &SchemaRef) -> Result<Output> {
    let available: Vec<String> = source.fields().iter().map(|f| f.name().clone()).collect();
    let mut out_cols = select_columns(flow, "COLUMNS", &flow.columns, &available)?;
    if !matches!(flow.columns, ColumnSelection::Only(_)) {
        // Auto Loader's rescued data stays in the streaming table unless a flow names it.
        out_cols.retain(|c| c != declared::RESCUED_COLUMN);
    }
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
    Ok(Output {
        exprs: out_cols.iter().map(|c| quote_ident(c)).collect(),
        out_cols,
        tracked_names,
    })
}

/// The SQL that turns source rows into events.
#[derive(Debug)]
struct EventSql {
    /// The `SEQUENCE BY` expression.
    seq_sql: String,
    /// The output columns, the sequence and the operation, over the source placeholder.
    select_sql: String,
}

/// The flow's event SELECT: its output columns, `SEQUENCE BY` and the operation its
/// `APPLY AS TRUNCATE/DELETE WHEN` conditions give.
fn event_sql(flow: &CdcFlow, exprs: &[String], seq_cast: Option<&DataType>) -> EventSql {
    let seq_sql = match &flow.sequence_by {
        SequenceBy::Expr(e) => e.clone(),
        SequenceBy::Struct(fields) => format!(
            "named_struct({})",
            fields
                .iter()
                .map(|(name, e)| format!("{}, {e}", crate::util::sql::quote_str(name)))
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
        "SELECT {}, {} AS {}, {op_sql} AS {} FROM {}",
        exprs.join(", "),
        match seq_cast {
            Some(t) => cast_sql(&seq_sql, t),
            None => seq_sql.clone(),
        },
        quote_ident(SEQ_COL),
        quote_ident(OP_COL),
        strata_sql::SOURCE_PLACEHOLDER,
    );
    EventSql {
        seq_sql,
        select_sql,
    }
}

/// The event SELECT as planned.
struct Planned {
    /// The output columns' planned fields (then the sequence and the operation).
    planned: Schema,
    /// The type of the sequence (a snapshot flow's version).
    seq_type: DataType,
}

/// Plans the event SELECT over an empty source: unknown columns in expressions, conditions
/// that are not boolean and unorderable sequences are errors before anything runs.
async fn plan_events(
    flow: &CdcFlow,
    source: &SchemaRef,
    sql: &EventSql,
    n_out: usize,
) -> Result<Planned> {
    let seq_sql = &sql.seq_sql;
    let ctx = crate::storage::session::new_session();
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
                    format!(
                        "{clause} {c}: the condition is of type {}, not BOOLEAN",
                        strata_sql::sql_type_name(t)
                    ),
                ));
            }
        }
    }
    let df = ctx
        .sql(&sql.select_sql)
        .await
        .map_err(|e| flow_err(flow, format!("SEQUENCE BY {seq_sql}: {e}")))?;
    let planned: Schema = df.schema().as_arrow().clone();
    let mut seq_type = planned.field(n_out).data_type().clone();
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
            format!(
                "SEQUENCE BY {seq_sql}: values of type {} cannot be ordered",
                arrow::sql_type_name(&seq_type)
            ),
        ));
    }
    Ok(Planned { planned, seq_type })
}

/// The schemas a flow stores, and its target's timeline.
struct Schemas {
    event: SchemaRef,
    fold: SchemaRef,
    target: SchemaRef,
    timeline: Timeline,
}

/// The event-store, fold and target schemas of the planned output; with history, the
/// timeline from the target's properties, whose columns no output column may be named as.
fn schemas(
    flow: &CdcFlow,
    planned: &Planned,
    out_cols: &[String],
    target_properties: &std::collections::BTreeMap<String, String>,
) -> Result<Schemas> {
    // View types (DataFusion's in-memory string layout) are stored as plain strings.
    let seq_type = arrow::storage_type(&planned.seq_type);
    let mut fields: Vec<Field> = planned.planned.fields()[..out_cols.len()]
        .iter()
        .map(|f| Field::new(f.name(), arrow::storage_type(f.data_type()), true))
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
    Ok(Schemas {
        event: Arc::new(Schema::new(fields)),
        fold: Arc::new(Schema::new(fold_fields)),
        target: Arc::new(Schema::new(target_fields)),
        timeline,
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
pub(crate) fn deletion_vectors_by_default(
    setup: &FlowSetup,
    user: &std::collections::BTreeMap<String, String>,
) -> bool {
    !crate::storage::table::sets_property(user, crate::storage::dv::PROPERTY)
        && !setup.timeline.partition_by_start
        && setup.target_partitions.is_empty()
}

/// The Delta partition columns of the flow's target: those declared (`PARTITIONED BY`),
/// then the start column when `strata.scd.partitionBy = start`; checked against its schema.
pub(crate) fn target_partition_columns(setup: &FlowSetup) -> Result<Vec<String>> {
    let mut cols = setup.target_partitions.clone();
    for c in setup.timeline.partition_columns() {
        if !cols.contains(&c) {
            cols.push(c);
        }
    }
    crate::storage::table::check_partition_columns(&setup.target_schema, &cols).map_err(|e| {
        EngineError::plan(format!(
            "flow {} (into {}): {e}",
            setup.flow.name, setup.flow.target
        ))
    })?;
    Ok(cols)
}

/// Table properties every AUTO CDC target carries.
pub(crate) fn target_configuration(
    setup: &FlowSetup,
    user: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, Option<String>)> {
    let mut conf = crate::storage::table::table_configuration(user);
    if deletion_vectors_by_default(setup, user) {
        conf.push((
            crate::storage::dv::PROPERTY.to_string(),
            Some("true".to_string()),
        ));
    }
    conf.push((
        crate::storage::table::KEYS_PROPERTY.to_string(),
        Some(setup.key_names.join(",")),
    ));
    conf.push((
        "strata.scdType".to_string(),
        Some(scd_type_property(setup.flow.stored_as).to_string()),
    ));
    if !crate::storage::table::sets_property(user, crate::storage::write::PLAIN_COLUMNS_PROPERTY) {
        // Columns of nearly distinct values: the keys, and the timeline's (a boolean current
        // flag among them never gets a dictionary anyway).
        let mut plain = setup.key_names.clone();
        if setup.flow.stored_as.has_timeline() {
            plain.extend(setup.timeline.column_names());
        }
        conf.push((
            crate::storage::write::PLAIN_COLUMNS_PROPERTY.to_string(),
            Some(plain.join(",")),
        ));
    }
    conf
}

/// The columns `now` adds to `before`, when that is all it changes: every column of
/// `before` is still there, in the same order and with the same type, and the others are
/// nullable. `None` for any other change; empty when nothing changed.
pub(crate) fn added_columns(before: &Schema, now: &Schema) -> Option<Vec<String>> {
    let mut added = Vec::new();
    let mut old = before.fields().iter().peekable();
    for f in now.fields() {
        match old.peek() {
            Some(o) if o.name() == f.name() => {
                if !arrow::same_type(o.data_type(), f.data_type()) {
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

/// Checks an existing event store and target against the flow (R10) before anything runs.
pub(crate) async fn check_existing(wh: &Warehouse, setup: &FlowSetup) -> Result<()> {
    let flow = &setup.flow;
    if let Some(store) = wh.open_at(&wh.event_store_location(&flow.target)).await? {
        let schema = crate::storage::table::table_schema(&store)?;
        check_store_schema(setup, &schema)?;
    }
    if let Some(target) = wh.open_table(&flow.target).await? {
        let config = crate::storage::table::table_properties(&target)?;
        check_target_properties(setup, &config)?;
        let schema = crate::storage::table::table_schema(&target)?;
        if added_columns(&schema, &setup.target_schema).is_none() {
            return Err(flow_err(
                flow,
                format!(
                    "target {} has columns ({}) but the flow produces ({}); a full refresh is needed",
                    flow.target,
                    arrow::describe_fields(&schema),
                    arrow::describe_fields(&setup.target_schema)
                ),
            ));
        }
    }
    Ok(())
}

/// Checks the event store's schema against the flow's: the same key and sequence types,
/// and output columns changed only by additions.
fn check_store_schema(setup: &FlowSetup, schema: &Schema) -> Result<()> {
    let flow = &setup.flow;
    let mut key_and_seq: Vec<usize> = setup.spec.keys.clone();
    key_and_seq.push(setup.spec.n_out);
    for i in key_and_seq {
        let want = setup.event_schema.field(i);
        let stored = schema.field_with_name(want.name()).ok();
        if !stored.is_some_and(|f| arrow::same_type(f.data_type(), want.data_type())) {
            return Err(flow_err(flow, retyped_message(setup, i, stored)));
        }
    }
    if added_columns(schema, &setup.event_schema).is_none() {
        return Err(columns_changed(setup, schema));
    }
    Ok(())
}

/// Why a key column or the sequence (`column` of the event schema) no longer matches the
/// event store's `stored` field, and what to do.
fn retyped_message(setup: &FlowSetup, column: usize, stored: Option<&Field>) -> String {
    let want = setup.event_schema.field(column);
    let what = if column == setup.spec.n_out {
        "SEQUENCE BY".to_string()
    } else {
        format!("key column `{}`", want.name())
    };
    let was = stored.map_or("absent".to_string(), |f| {
        format!("stored as {}", arrow::sql_type_name(f.data_type()))
    });
    let ntz = DataType::Timestamp(TimeUnit::Microsecond, None);
    let keep = match stored {
        Some(f) if f.data_type() == &ntz && matches!(want.data_type(), DataType::Timestamp(..)) => {
            " (computed timestamps are TIMESTAMP, as in Spark; to keep the stored \
             TIMESTAMP_NTZ, cast the expression: CAST(... AS TIMESTAMP_NTZ))"
        }
        _ => "",
    };
    format!(
        "{what} changed type since the flow last ran: it is now {}, {was}{keep}; a full \
         refresh of {} is needed",
        arrow::sql_type_name(want.data_type()),
        setup.flow.target
    )
}

/// The error for output columns that changed other than by additions since the event store
/// (`schema`) was written, with advice on dropped columns.
fn columns_changed(setup: &FlowSetup, schema: &Schema) -> EngineError {
    let flow = &setup.flow;
    let n = setup.out_cols.len();
    let names = |s: &Schema, n: usize| -> Vec<String> {
        s.fields()
            .iter()
            .take(n)
            .map(|f| f.name().clone())
            .collect()
    };
    let stored_n = schema.fields().len().saturating_sub(3);
    let (now, before) = (names(&setup.event_schema, n), names(schema, stored_n));
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
    flow_err(
        flow,
        format!(
            "the output columns changed since the flow last ran (now {}; the target has {}); \
             {advice}",
            now.join(", "),
            before.join(", "),
        ),
    )
}

/// Checks the history mode and keys an existing target recorded in its properties.
fn check_target_properties(
    setup: &FlowSetup,
    config: &std::collections::HashMap<String, String>,
) -> Result<()> {
    let flow = &setup.flow;
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
    let recorded = config.get(crate::storage::table::KEYS_PROPERTY).cloned();
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::datatypes::{DataType, Field, Schema};

    fn schema(fields: &[(&str, DataType, bool)]) -> Schema {
        Schema::new(
            fields
                .iter()
                .map(|(n, t, null)| Field::new(*n, t.clone(), *null))
                .collect::<Vec<_>>(),
        )
    }

    fn flow(sql: &str) -> CdcFlow {
        let statements = strata_sql::parse_pipeline(sql).expect("parses").statements;
        statements
            .into_iter()
            .find_map(|s| match s {
                strata_sql::Statement::Flow(f) => Some(f),
                _ => None,
            })
            .expect("a flow")
    }

    /// The event SELECT: the output columns, the sequence, and the operation the
    /// conditions give (truncates before deletes).
    #[test]
    fn event_sql_selects_columns_sequence_and_operation() {
        let f = flow(
            "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(s) KEYS (id) \
             APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' \
             SEQUENCE BY ts STORED AS SCD TYPE 1;",
        );
        let sql = event_sql(&f, &[quote_ident("id"), quote_ident("name")], None);
        let SequenceBy::Expr(seq) = &f.sequence_by else {
            panic!("a plain sequence")
        };
        let (Some(delete), Some(truncate)) = (&f.delete_when, &f.truncate_when) else {
            panic!("both conditions")
        };
        assert_eq!(&sql.seq_sql, seq);
        assert_eq!(
            sql.select_sql,
            format!(
                "SELECT {}, {}, {seq} AS {}, CAST(CASE WHEN ({truncate}) THEN 2 WHEN ({delete}) \
                 THEN 1 ELSE 0 END AS TINYINT) AS {} FROM {}",
                quote_ident("id"),
                quote_ident("name"),
                quote_ident(SEQ_COL),
                quote_ident(OP_COL),
                strata_sql::SOURCE_PLACEHOLDER
            )
        );
        let plain =
            flow("CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(s) KEYS (id) SEQUENCE BY ts;");
        assert!(event_sql(&plain, &[quote_ident("id")], None)
            .select_sql
            .contains("CAST(0 AS TINYINT)"));
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
