//! Unchanged TOASTed values in PostgreSQL changes. Under `REPLICA IDENTITY DEFAULT` an
//! update that leaves a large (TOASTed, stored out of line) value unchanged does not send
//! it: pgoutput marks it 'unchanged', and `strata-sources` gives the row NULL there and names
//! the column in `_unchanged_cols`. Left so, an SCD target would record NULL as the new
//! value. [`fill_unchanged`] puts back the value the key last had: from the change before
//! it in the same run, else from the streaming table's latest row for the key (the bronze
//! change table holds every value it was sent, filled the same way). A value found in
//! neither is an error naming the table, the column and the fix (`REPLICA IDENTITY FULL`).

use crate::error::{Context, EngineError, Result};
use deltalake::arrow::array::builder::ListBuilder;
use deltalake::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, ListArray, RecordBatch, StringBuilder,
};
use deltalake::arrow::compute::{cast, concat_batches, interleave};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::arrow::row::{OwnedRow, RowConverter, Rows, SortField};
use deltalake::arrow::util::display::array_value_to_string;
use deltalake::datafusion::datasource::MemTable;
use deltalake::DeltaTable;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use strata_sources::batch::meta;

/// What filling needs to know besides the rows.
pub(crate) struct Toast<'a> {
    /// `schema.table` in PostgreSQL, for errors.
    pub(crate) source: String,
    /// The key the server identifies rows by (primary key or replica identity index).
    pub(crate) key: Vec<String>,
    /// Where the key's last value is when no earlier change of this run has it.
    pub(crate) bronze: Bronze<'a>,
    /// The updates that changed their row's key, as (`_commit_lsn`, `_change_seq`): their
    /// unchanged values are the old key's, whose `delete` is the change just before
    /// (`strata_sources::pg::TableBatch::key_changes`).
    pub(crate) key_changes: HashSet<(i64, i64)>,
}

/// The rows a key's last value is looked up in.
pub(crate) enum Bronze<'a> {
    /// The streaming table the changes go to, as this run's last commit left it (a first
    /// run's snapshot is committed before its changes are read).
    Table(&'a DeltaTable),
    /// Nothing yet.
    Empty,
}

/// A value to put back: (batch, row, column).
type Fill = (usize, usize, String);

/// Where a filled value comes from.
#[derive(Clone, Copy, Debug)]
enum Origin {
    /// A row read earlier in this run: (batch, row).
    Run(usize, usize),
    /// The streaming table's latest row for the key (index into the rows looked up).
    Bronze(usize),
}

/// Whether any row of `batches` has a value the server did not send.
pub(crate) fn has_unchanged(batches: &[RecordBatch]) -> bool {
    batches.iter().any(|b| unchanged_list(b).is_some())
}

/// `batches` (change rows in commit order) with every unchanged TOASTed value put back.
/// Batches without one are returned as they are, and nothing is read when there is none.
pub(crate) async fn fill_unchanged(
    batches: Vec<RecordBatch>,
    toast: &Toast<'_>,
) -> Result<Vec<RecordBatch>> {
    let wanted = wanted_columns(&batches);
    if wanted.is_empty() {
        return Ok(batches);
    }
    if toast.key.is_empty() {
        return Err(unresolved(toast, &wanted, "the table has no primary key"));
    }
    let keys = KeyRows::new(&batches, &toast.key)?;
    let renamed = key_change_partners(&batches, &toast.key_changes)?;
    let (fills, from_bronze) = plan_fills(&keys, &wanted, &renamed);
    let bronze = match from_bronze.is_empty() {
        true => None,
        false => Some(bronze_rows(toast, &keys, &from_bronze, &wanted).await?),
    };
    let bronze_row = bronze_positions(bronze.as_ref(), &from_bronze);
    let sources = FillSources {
        batches: &batches,
        bronze: bronze.as_ref().map(|(found, _)| found),
        bronze_row: &bronze_row,
    };
    batches
        .iter()
        .enumerate()
        .map(|(b, batch)| fill_batch(b, batch, &fills, &sources, toast))
        .collect()
}

/// (batch, row) → the columns the server did not send for that row.
fn wanted_columns(batches: &[RecordBatch]) -> HashMap<(usize, usize), Vec<String>> {
    let mut wanted = HashMap::new();
    for (b, batch) in batches.iter().enumerate() {
        let Some(list) = unchanged_list(batch) else {
            continue;
        };
        for r in 0..batch.num_rows() {
            if list.is_valid(r) {
                let cols = list.value(r);
                let cols = cols.as_string::<i32>();
                wanted.insert((b, r), cols.iter().flatten().map(str::to_string).collect());
            }
        }
    }
    wanted
}

/// For each update of `key_changes` among `batches` (batch, row): the row of the `delete` of
/// its old key just before it (same `_commit_lsn`, `_change_seq` one less).
fn key_change_partners(
    batches: &[RecordBatch],
    key_changes: &HashSet<(i64, i64)>,
) -> Result<HashMap<(usize, usize), (usize, usize)>> {
    if key_changes.is_empty() {
        return Ok(HashMap::new());
    }
    let mut at: HashMap<(i64, i64), (usize, usize)> = HashMap::new();
    for (b, batch) in batches.iter().enumerate() {
        let int = |name: &str| -> Result<deltalake::arrow::array::Int64Array> {
            let col = batch
                .column_by_name(name)
                .ok_or_else(|| EngineError::internal(format!("a change batch without {name}")))?;
            Ok(cast(col, &DataType::Int64)
                .context(|| format!("reading {name}"))?
                .as_primitive::<deltalake::arrow::datatypes::Int64Type>()
                .clone())
        };
        let (lsn, seq) = (int(meta::COMMIT_LSN)?, int(meta::CHANGE_SEQ)?);
        for r in 0..batch.num_rows() {
            at.insert((lsn.value(r), seq.value(r)), (b, r));
        }
    }
    Ok(key_changes
        .iter()
        .filter_map(|&(lsn, seq)| Some((*at.get(&(lsn, seq))?, *at.get(&(lsn, seq - 1))?)))
        .collect())
}

/// Where each wanted value comes from, in commit order: the key's change before it in this
/// run, else the streaming table's row of the key (the keys to look up there, in order).
/// An update that changed its key (`renamed`: its row → the old key's `delete`) looks up
/// the old key as it was before that delete.
fn plan_fills(
    keys: &KeyRows,
    wanted: &HashMap<(usize, usize), Vec<String>>,
    renamed: &HashMap<(usize, usize), (usize, usize)>,
) -> (HashMap<Fill, Option<Origin>>, Vec<OwnedRow>) {
    let key_at = |(b, r): (usize, usize)| keys.rows[b].row(r).owned();
    let needed: HashSet<OwnedRow> = wanted
        .keys()
        .map(|&at| key_at(renamed.get(&at).copied().unwrap_or(at)))
        .collect();
    let deletes_of_renamed: HashSet<(usize, usize)> = renamed.values().copied().collect();
    // For each old key's delete: the key's row before it, if this run has one.
    let mut before_delete: HashMap<(usize, usize), Option<(usize, usize)>> = HashMap::new();
    let mut last: HashMap<OwnedRow, (usize, usize)> = HashMap::new();
    let mut fills: HashMap<Fill, Option<Origin>> = HashMap::new();
    let mut from_bronze: Vec<OwnedRow> = Vec::new();
    let mut bronze_index: HashMap<OwnedRow, usize> = HashMap::new();
    for (b, rows) in keys.rows.iter().enumerate() {
        for (r, key) in rows.iter().enumerate() {
            let key = key.owned();
            if !needed.contains(&key) && !renamed.contains_key(&(b, r)) {
                continue;
            }
            if deletes_of_renamed.contains(&(b, r)) {
                before_delete.insert((b, r), last.get(&key).copied());
            }
            if let Some(cols) = wanted.get(&(b, r)) {
                // The key whose last values fill this row, and its row before this one.
                let (lookup, earlier) = match renamed.get(&(b, r)) {
                    Some(&delete) => (
                        key_at(delete),
                        before_delete.get(&delete).copied().flatten(),
                    ),
                    None => (key.clone(), last.get(&key).copied()),
                };
                for c in cols {
                    let from = match earlier.as_ref() {
                        Some(&(pb, pr)) => match fills.get(&(pb, pr, c.clone())) {
                            Some(earlier) => *earlier,
                            None => Some(Origin::Run(pb, pr)),
                        },
                        None => {
                            let next = bronze_index.len();
                            let i = *bronze_index.entry(lookup.clone()).or_insert_with(|| {
                                from_bronze.push(lookup.clone());
                                next
                            });
                            Some(Origin::Bronze(i))
                        }
                    };
                    fills.insert((b, r, c.clone()), from);
                }
            }
            last.insert(key, (b, r));
        }
    }
    (fills, from_bronze)
}

/// The row of the streaming table's rows found for each key looked up, by its index in
/// `from_bronze` (`None`: the key is not there).
fn bronze_positions(
    bronze: Option<&(RecordBatch, Rows)>,
    from_bronze: &[OwnedRow],
) -> Vec<Option<usize>> {
    let Some((_, rows)) = bronze else {
        return Vec::new();
    };
    let at: HashMap<OwnedRow, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.owned(), i))
        .collect();
    from_bronze.iter().map(|k| at.get(k).copied()).collect()
}

/// Where filled values are taken from: the run's batches and the streaming table's rows.
struct FillSources<'a> {
    batches: &'a [RecordBatch],
    bronze: Option<&'a RecordBatch>,
    bronze_row: &'a [Option<usize>],
}

/// Batch `b` with its unchanged values put back and `_unchanged_cols` cleared.
fn fill_batch(
    b: usize,
    batch: &RecordBatch,
    fills: &HashMap<Fill, Option<Origin>>,
    sources: &FillSources<'_>,
    toast: &Toast<'_>,
) -> Result<RecordBatch> {
    let in_batch: Vec<(&Fill, &Option<Origin>)> =
        fills.iter().filter(|((fb, _, _), _)| *fb == b).collect();
    if in_batch.is_empty() {
        return Ok(batch.clone());
    }
    let schema = batch.schema();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    let mut touched: Vec<&str> = in_batch.iter().map(|((_, _, c), _)| c.as_str()).collect();
    touched.sort_unstable();
    touched.dedup();
    for c in touched {
        let Some(ci) = schema.index_of(c).ok() else {
            continue; // excluded from the read
        };
        columns[ci] = filled_column(b, batch, c, &columns[ci], &in_batch, sources, toast)?;
    }
    // Every value is back: the rows name no unchanged column any more.
    if let Ok(ui) = schema.index_of(meta::UNCHANGED_COLS) {
        columns[ui] = cleared_list(schema.field(ui), batch.num_rows())?;
    }
    RecordBatch::try_new(schema.clone(), columns).context(|| "filling unchanged values".into())
}

/// Column `c` of batch `b` (`current`) with the values of `in_batch` picked from their origin.
fn filled_column(
    b: usize,
    batch: &RecordBatch,
    c: &str,
    current: &ArrayRef,
    in_batch: &[(&Fill, &Option<Origin>)],
    sources: &FillSources<'_>,
    toast: &Toast<'_>,
) -> Result<ArrayRef> {
    let target = current.data_type();
    // Sources: 0 this batch, 1 + n batch n of the run, then the bronze rows.
    let mut arrays: Vec<ArrayRef> = vec![current.clone()];
    for x in sources.batches {
        arrays.push(match x.column_by_name(c) {
            Some(col) => cast(col, target).context(|| format!("filling {c}"))?,
            None => new_null_array(target, x.num_rows()),
        });
    }
    let bronze_col =
        match sources.bronze {
            Some(found) => match found.schema().index_of(c) {
                Ok(i) => Some(cast(found.column(i), target).context(|| {
                    format!("reading the last value of {c} from the streaming table")
                })?),
                Err(_) => None,
            },
            None => None,
        };
    if let Some(col) = &bronze_col {
        arrays.push(col.clone());
    }
    let bronze_at = arrays.len() - 1;
    let mut picks: Vec<(usize, usize)> = (0..batch.num_rows()).map(|r| (0, r)).collect();
    for ((_, r, fc), from) in in_batch {
        if fc != c {
            continue;
        }
        let pick = match from {
            Some(Origin::Run(pb, pr)) => Some((1 + pb, *pr)),
            Some(Origin::Bronze(i)) => sources
                .bronze_row
                .get(*i)
                .copied()
                .flatten()
                .filter(|_| bronze_col.is_some())
                .map(|row| (bronze_at, row)),
            None => None,
        };
        match pick {
            Some(p) => picks[*r] = p,
            None => {
                let one = HashMap::from([((b, *r), vec![c.to_string()])]);
                return Err(unresolved_with_key(
                    toast,
                    &one,
                    batch,
                    "neither an earlier change in this run nor the streaming table \
                     holds a value for it",
                ));
            }
        }
    }
    let refs: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
    interleave(&refs, &picks).context(|| format!("filling {c}"))
}

/// The `_unchanged_cols` column of a change batch.
fn unchanged_list(batch: &RecordBatch) -> Option<&ListArray> {
    let col = batch.column_by_name(meta::UNCHANGED_COLS)?;
    (col.null_count() < col.len())
        .then(|| col.as_list_opt::<i32>())
        .flatten()
}

/// An all-NULL `_unchanged_cols` of `rows` rows.
fn cleared_list(field: &Field, rows: usize) -> Result<ArrayRef> {
    let mut b = ListBuilder::new(StringBuilder::new());
    for _ in 0..rows {
        b.append_null();
    }
    let list: ArrayRef = Arc::new(b.finish());
    cast(&list, field.data_type()).context(|| "clearing _unchanged_cols".into())
}

/// The key columns of every batch, in Arrow's row format.
struct KeyRows {
    converter: RowConverter,
    types: Vec<DataType>,
    names: Vec<String>,
    rows: Vec<Rows>,
}

impl KeyRows {
    fn new(batches: &[RecordBatch], key: &[String]) -> Result<KeyRows> {
        let first = batches
            .first()
            .ok_or_else(|| EngineError::internal("no change rows"))?;
        let types = key
            .iter()
            .map(|k| {
                first
                    .schema()
                    .field_with_name(k)
                    .map(|f| f.data_type().clone())
                    .map_err(|_| {
                        EngineError::plan(format!(
                            "key column {k} is excluded from the read: the last values of \
                             unchanged TOASTed columns are found by it"
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let converter = RowConverter::new(types.iter().cloned().map(SortField::new).collect())
            .context(|| "comparing keys".into())?;
        let rows = batches
            .iter()
            .map(|b| {
                let cols = key
                    .iter()
                    .map(|k| {
                        b.column_by_name(k)
                            .cloned()
                            .unwrap_or_else(|| b.column(0).clone())
                    })
                    .collect::<Vec<_>>();
                converter
                    .convert_columns(&cols)
                    .context(|| "comparing keys".into())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KeyRows {
            converter,
            types,
            names: key.to_vec(),
            rows,
        })
    }
}

/// The streaming table's latest row (not a delete) for each of `keys`, and those rows'
/// keys in row format.
async fn bronze_rows(
    toast: &Toast<'_>,
    keys: &KeyRows,
    wanted_keys: &[OwnedRow],
    wanted: &HashMap<(usize, usize), Vec<String>>,
) -> Result<(RecordBatch, Rows)> {
    let no_history = |why: &str| unresolved(toast, wanted, why);
    let ctx = crate::storage::session::new_session();
    let bronze_schema = match &toast.bronze {
        Bronze::Table(table) => {
            crate::storage::session::register_table(&ctx, "__strata_bronze", table, None).await?;
            crate::storage::table::table_schema(table)?
        }
        Bronze::Empty => return Err(no_history("the streaming table holds no earlier row")),
    };
    for needed in keys.names.iter().map(String::as_str).chain([
        meta::CHANGE_TYPE,
        meta::COMMIT_LSN,
        meta::CHANGE_SEQ,
    ]) {
        if bronze_schema.field_with_name(needed).is_err() {
            return Err(no_history(&format!(
                "the streaming table has no column {needed} to find the key's last row by"
            )));
        }
    }
    let key_arrays = keys
        .converter
        .convert_rows(wanted_keys.iter().map(OwnedRow::row))
        .context(|| "reading keys".into())?;
    let key_schema = Arc::new(Schema::new(
        keys.names
            .iter()
            .zip(&keys.types)
            .map(|(n, t)| Field::new(format!("__k_{n}"), t.clone(), true))
            .collect::<Vec<_>>(),
    ));
    let key_batch =
        RecordBatch::try_new(key_schema.clone(), key_arrays).context(|| "reading keys".into())?;
    let mem = MemTable::try_new(key_schema, vec![vec![key_batch]])
        .context(|| "registering keys".into())?;
    ctx.register_table("__strata_keys", Arc::new(mem))
        .context(|| "registering keys".into())?;
    let q = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
    let on = keys
        .names
        .iter()
        .map(|n| format!("b.{} = k.{}", q(n), q(&format!("__k_{n}"))))
        .collect::<Vec<_>>()
        .join(" AND ");
    let partition = keys
        .names
        .iter()
        .map(|n| format!("b.{}", q(n)))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT * FROM (SELECT b.*, row_number() OVER (PARTITION BY {partition} ORDER BY \
         b.{lsn} DESC, b.{seq} DESC) AS __strata_rn FROM __strata_bronze b JOIN __strata_keys k \
         ON {on} WHERE b.{ct} <> 'delete') WHERE __strata_rn = 1",
        lsn = q(meta::COMMIT_LSN),
        seq = q(meta::CHANGE_SEQ),
        ct = q(meta::CHANGE_TYPE),
    );
    let read = || "reading the last values of unchanged TOASTed columns".to_string();
    let df = ctx.sql(&sql).await.context(read)?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let found = concat_batches(&schema, &df.collect().await.context(read)?).context(read)?;
    let cols = keys
        .names
        .iter()
        .zip(&keys.types)
        .map(|(n, t)| {
            let i = found.schema().index_of(n).context(read)?;
            cast(found.column(i), t).context(read)
        })
        .collect::<Result<Vec<_>>>()?;
    let rows = keys.converter.convert_columns(&cols).context(read)?;
    Ok((found, rows))
}

/// The error for values that cannot be put back, with the fix.
fn unresolved(
    toast: &Toast<'_>,
    wanted: &HashMap<(usize, usize), Vec<String>>,
    why: &str,
) -> EngineError {
    let mut cols: Vec<&str> = wanted.values().flatten().map(String::as_str).collect();
    cols.sort_unstable();
    cols.dedup();
    message(toast, &cols.join(", "), "", why)
}

fn unresolved_with_key(
    toast: &Toast<'_>,
    wanted: &HashMap<(usize, usize), Vec<String>>,
    batch: &RecordBatch,
    why: &str,
) -> EngineError {
    let Some(((_, r), cols)) = wanted.iter().next() else {
        return unresolved(toast, wanted, why);
    };
    let key = toast
        .key
        .iter()
        .filter_map(|k| {
            let col = batch.column_by_name(k)?;
            Some(format!("{k} = {}", array_value_to_string(col, *r).ok()?))
        })
        .collect::<Vec<_>>()
        .join(", ");
    message(toast, &cols.join(", "), &format!(" (key {key})"), why)
}

fn message(toast: &Toast<'_>, cols: &str, key: &str, why: &str) -> EngineError {
    EngineError::plan(format!(
        "table {source}: an update{key} left column {cols} unchanged, a TOASTed value \
         PostgreSQL does not send under REPLICA IDENTITY DEFAULT, and {why}. Run \
         `ALTER TABLE {source} REPLICA IDENTITY FULL` on the source, then copy the table again \
         with `strata run --full-refresh`",
        source = toast.source
    ))
}
