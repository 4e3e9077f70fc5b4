//! The change data feed of a strata table, as `STREAM(t)` and `table_changes('t', ...)` read
//! it.
//!
//! strata rewrites a changed key of an AUTO CDC target by deleting its old rows and
//! inserting its new ones in one commit, so Delta's raw feed shows an update as a `delete`
//! and an `insert` of the same key in the same commit (only the rows that changed: rows
//! rewritten as they were are in neither). The feed read here restores what
//! happened, per key and commit: rows deleted and inserted together are an update
//! (`update_preimage`, `update_postimage`), rows only deleted a `delete`, rows only inserted
//! an `insert`. Keys come from the table's `strata.keys` property; a table without keys (an
//! append-only table) has inserts only.

use crate::error::{Context, EngineError, Result};
use crate::util::arrow;
use deltalake::arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use deltalake::arrow::compute::{concat_batches, filter_record_batch};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::datafusion::physical_plan::collect;
use deltalake::DeltaTable;
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) const CHANGE_TYPE: &str = "_change_type";
pub(crate) const COMMIT_VERSION: &str = "_commit_version";
pub(crate) const COMMIT_TIMESTAMP: &str = "_commit_timestamp";

/// The feed's schema: the table's columns, then `_change_type`, `_commit_version`,
/// `_commit_timestamp`.
pub(crate) fn feed_schema(table: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = table.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(CHANGE_TYPE, DataType::Utf8, true));
    fields.push(Field::new(COMMIT_VERSION, DataType::Int64, true));
    fields.push(Field::new(
        COMMIT_TIMESTAMP,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        true,
    ));
    Arc::new(Schema::new(fields))
}

/// The changes of `table` in the commits after `after` (all commits when `None`) up to
/// `until` included (the latest when `None`), in commit order. Pre-images are left out
/// unless `preimages`.
pub(crate) async fn read_feed(
    table: &DeltaTable,
    after: Option<i64>,
    until: Option<i64>,
    preimages: bool,
) -> Result<RecordBatch> {
    let schema = feed_schema(crate::storage::table::table_schema(table)?.as_ref());
    let latest = table.version().map_or(-1, |v| v as i64);
    let start = after.map_or(0, |a| a + 1);
    let end = until.unwrap_or(latest).min(latest);
    if start > end {
        return Ok(RecordBatch::new_empty(schema));
    }
    let ctx = crate::storage::session::new_session();
    let plan = table
        .clone()
        .scan_cdf()
        .with_starting_version(start as u64)
        .with_ending_version(end as u64)
        .build(&ctx.state(), None)
        .await
        .context(|| format!("reading the change data feed of {}", table.table_url()))?;
    let batches = collect(plan, ctx.task_ctx())
        .await
        .context(|| format!("reading the change data feed of {}", table.table_url()))?;
    let cast = batches
        .iter()
        .map(|b| by_name(b, &schema))
        .collect::<Result<Vec<_>>>()?;
    let raw = concat_batches(&schema, &cast).context(|| "change feed".into())?;
    let keys =
        crate::storage::table::recorded_keys(&crate::storage::table::table_properties(table)?)
            .unwrap_or_default();
    let feed = restore_updates(&raw, &keys)?;
    let feed = if preimages {
        feed
    } else {
        let types = change_types(&feed)?;
        let keep: deltalake::arrow::array::BooleanArray = (0..feed.num_rows())
            .map(|i| Some(types.value(i) != "update_preimage"))
            .collect();
        filter_record_batch(&feed, &keep).context(|| "change feed".into())?
    };
    sort_by_version(&feed)
}

/// The inserted rows of `feed` (as [`read_feed`] returns it), without the feed's columns:
/// the rows an append-only table gained.
pub(crate) fn inserted_rows(feed: &RecordBatch) -> Result<RecordBatch> {
    let types = change_types(feed)?;
    let keep: deltalake::arrow::array::BooleanArray = (0..feed.num_rows())
        .map(|i| Some(types.value(i) == "insert"))
        .collect();
    let rows = filter_record_batch(feed, &keep).context(|| "change feed".into())?;
    let n = rows.num_columns().saturating_sub(3);
    rows.project(&(0..n).collect::<Vec<_>>())
        .context(|| "change feed".into())
}

/// `batch`'s columns in `schema`'s order, found by name and cast.
fn by_name(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                EngineError::internal(format!("change feed has no column {}", f.name()))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    arrow::cast_columns(columns, schema)
}

fn change_types(batch: &RecordBatch) -> Result<&StringArray> {
    batch
        .column_by_name(CHANGE_TYPE)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| EngineError::internal("change feed without _change_type"))
}

fn versions(batch: &RecordBatch) -> Result<&Int64Array> {
    batch
        .column_by_name(COMMIT_VERSION)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .ok_or_else(|| EngineError::internal("change feed without _commit_version"))
}

/// Relabels a key's delete + insert in one commit as an update (see the module docs).
fn restore_updates(raw: &RecordBatch, keys: &[String]) -> Result<RecordBatch> {
    if keys.is_empty() || raw.num_rows() == 0 {
        return Ok(raw.clone());
    }
    let mut key_cols = Vec::with_capacity(keys.len() + 1);
    for k in keys {
        let c = raw
            .column_by_name(k)
            .ok_or_else(|| EngineError::internal(format!("change feed has no key column {k}")))?;
        key_cols.push(c.clone());
    }
    key_cols.push(Arc::new(versions(raw)?.clone()));
    let rows = arrow::rows(&key_cols)?;
    let types = change_types(raw)?;
    // Per (key, commit): (deleted, inserted).
    let mut seen: HashMap<&[u8], (bool, bool)> = HashMap::new();
    for i in 0..raw.num_rows() {
        let e = seen.entry(rows.row(i).data()).or_default();
        match types.value(i) {
            "delete" | "update_preimage" => e.0 = true,
            _ => e.1 = true,
        }
    }
    let relabelled: StringArray = (0..raw.num_rows())
        .map(|i| {
            let t = types.value(i);
            let both = seen
                .get(rows.row(i).data())
                .is_some_and(|(d, ins)| *d && *ins);
            Some(match (t, both) {
                ("delete", true) => "update_preimage",
                ("insert", true) => "update_postimage",
                (other, _) => other,
            })
        })
        .collect();
    let mut columns = raw.columns().to_vec();
    let at = raw
        .schema()
        .index_of(CHANGE_TYPE)
        .context(|| "change feed".into())?;
    columns[at] = Arc::new(relabelled);
    RecordBatch::try_new(raw.schema(), columns).context(|| "change feed".into())
}

/// Rows in commit order, otherwise in the order they were read (a stable sort).
fn sort_by_version(batch: &RecordBatch) -> Result<RecordBatch> {
    let v = versions(batch)?;
    let mut idx: Vec<u32> = (0..batch.num_rows() as u32).collect();
    idx.sort_by_key(|&i| v.value(i as usize));
    deltalake::arrow::compute::take_record_batch(
        batch,
        &deltalake::arrow::array::UInt32Array::from(idx),
    )
    .context(|| "change feed".into())
}
