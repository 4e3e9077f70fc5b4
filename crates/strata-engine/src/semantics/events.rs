//! The events of a flow as batches: checking new ones (R4), giving them their run, and the
//! keys a batch touches.

use crate::error::{Context, EngineError, Result};
use crate::semantics::flow::FlowSetup;
use crate::semantics::fold;
use crate::util::arrow;
use deltalake::arrow::array::Array;
use deltalake::arrow::array::ArrayRef;
use deltalake::arrow::array::Int64Array;
use deltalake::arrow::array::Int8Array;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::array::StructArray;
use deltalake::arrow::array::UInt32Array;
use deltalake::arrow::compute;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::Field;
use deltalake::arrow::datatypes::Schema;
use deltalake::arrow::datatypes::SchemaRef;
use std::sync::Arc;
use strata_sql::SequenceBy;

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
            .ok_or_else(|| EngineError::internal("op column is not Int8"))?;
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
            let mut e = reject(format!("with a NULL key column `{name}`"), *count);
            if let (EngineError::BadInput(text), Some(hint)) = (&mut e, &setup.null_key_hint) {
                text.push_str(hint);
            }
            return Err(e);
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

/// The event schema without its last column, the run.
pub(crate) fn without_run(setup: &FlowSetup) -> SchemaRef {
    let fields = setup.event_schema.fields();
    Arc::new(Schema::new(fields[..fields.len() - 1].to_vec()))
}

/// `events` (as [`evaluate_events`] made them) as one batch of run `run`.
pub(crate) fn with_run(
    setup: &FlowSetup,
    events: Vec<RecordBatch>,
    run: i64,
) -> Result<RecordBatch> {
    let partial = without_run(setup);
    if let Some(b) = events.iter().find(|b| b.schema() != partial) {
        return Err(EngineError::internal(format!(
            "flow {}: events have ({}), expected ({})",
            setup.flow.name,
            arrow::describe_fields(&b.schema()),
            arrow::describe_fields(&partial)
        )));
    }
    let rows: usize = events.iter().map(RecordBatch::num_rows).sum();
    let width = partial.fields().len();
    // One integer key and no truncates: the events go in key order right away. The fold
    // then walks them in memory order, and the event store is written in that order, which
    // is what lets later runs read a key's events through the page index (`eventstore/pages.rs`).
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
        Err(events) => arrow::concat_columns(events, width)?,
    };
    columns.push(Arc::new(Int64Array::from(vec![run; rows])));
    RecordBatch::try_new(setup.event_schema.clone(), columns)
        .context(|| format!("flow {}: event batch", setup.flow.name))
}

/// Which keys to re-derive.
pub(crate) enum Touched {
    All,
    Keys(RecordBatch),
}

/// Distinct keys of the non-truncate rows of `events`, or `All` when a truncate is among them.
pub(crate) fn touched_keys(setup: &FlowSetup, events: &RecordBatch) -> Result<Touched> {
    let ops = events
        .column(setup.spec.n_out + 1)
        .as_any()
        .downcast_ref::<Int8Array>()
        .ok_or_else(|| EngineError::internal("op column is not Int8"))?;
    if ops.iter().any(|o| o == Some(2)) {
        return Ok(Touched::All);
    }
    let key_cols: Vec<ArrayRef> = setup
        .spec
        .keys
        .iter()
        .map(|&k| events.column(k).clone())
        .collect();
    let rows = arrow::rows(&key_cols)?;
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

pub(crate) fn merge_touched(a: Touched, b: Touched) -> Result<Touched> {
    Ok(match (a, b) {
        (Touched::All, _) | (_, Touched::All) => Touched::All,
        (Touched::Keys(x), Touched::Keys(y)) => {
            Touched::Keys(concat_batches(&x.schema(), &[x.clone(), y]).context(|| "keys".into())?)
        }
    })
}
