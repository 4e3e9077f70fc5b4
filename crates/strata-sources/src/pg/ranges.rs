//! Parallel watermark reads of PostgreSQL: the read is split into ranges of its leading
//! watermark column, each range read on a connection of its own, all in ONE exported
//! snapshot (as `pg_dump -j` does), and the batches handed out range after range, so the
//! caller sees exactly the rows, in exactly the order, of the single ordered query.
//!
//! Phases: [`plan`] (how many connections and ranges, and where the ranges split: the
//! table's statistics, else the minimum and maximum of the leading column), [`open`] (the
//! snapshot exported on the first connection and imported on the others), then one worker
//! per connection ([`work`]) taking the ranges in order, each range into a channel of its
//! own, drained in range order by the caller ([`RangeQueue`]). A serial read is one read
//! task ([`spawn`]) drained the same way.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::read::{value_literal, watermark_select, Described, PgRowReader, TextParam};
use super::types::watermark_value;
use crate::batch::SourceSchema;
use crate::conn::{pg_error_text, Resolved};
use crate::error::Result;
use crate::object::{pg_ident, SourceObject};
use crate::read::{BatchReceiver, WatermarkBatch, WatermarkRead};
use crate::value::WatermarkValue;

/// Below this estimated number of rows a read stays serial (one query).
pub const PARALLEL_MIN_ROWS: f64 = 1_000_000.0;
/// Rows per range when the number of ranges is chosen from the estimate.
pub const ROWS_PER_RANGE: f64 = 2_500_000.0;
/// At most this many ranges unless `parallel` asks for more.
pub const MAX_AUTO_RANGES: usize = 4;
/// At most this many connections, whatever `parallel` asks for.
pub const MAX_RANGES: usize = 32;
/// At most this many ranges.
pub const MAX_SMALL_RANGES: usize = 256;

/// How a read is split: `connections` read at once, `ranges` in all (read in order, each by
/// the next free connection), a range's channel holding `range_batches` batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub connections: usize,
    pub ranges: usize,
    pub range_batches: usize,
}

/// The shape of a read of about `estimated_rows` rows with `connections` connections: as
/// many ranges as connections, or, when the leading column is `indexed` (ranges are cheap
/// index range scans) and the size is known, ranges of about [`READ_AHEAD_BATCHES`] batches,
/// each fitting its channel, so that every connection reads while the caller takes the
/// ranges in order, with at most `connections + 1` ranges held.
pub(crate) fn shape(
    connections: usize,
    estimated_rows: Option<f64>,
    indexed: bool,
    batch_rows: usize,
) -> Shape {
    let batch_rows = batch_rows.max(1) as f64;
    match estimated_rows {
        Some(rows) if indexed && connections > 1 => {
            let ranges = ((rows / (READ_AHEAD_BATCHES as f64 * batch_rows)).ceil() as usize)
                .clamp(connections, MAX_SMALL_RANGES);
            let per_range = rows / ranges as f64;
            Shape {
                connections,
                ranges,
                range_batches: ((per_range / batch_rows).ceil() as usize + 1)
                    .clamp(READ_AHEAD_BATCHES, 4 * READ_AHEAD_BATCHES),
            }
        }
        _ => Shape {
            connections,
            ranges: connections,
            range_batches: READ_AHEAD_BATCHES,
        },
    }
}

/// A parallel read's plan: its shape, and the split points of its ranges (fewer than
/// `shape.ranges - 1` when the values allow fewer).
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub connections: usize,
    pub range_batches: usize,
    pub splits: Vec<WatermarkValue>,
}

/// The number of ranges a read is split into: `requested` (`parallel => N`) when given,
/// else one per [`ROWS_PER_RANGE`] estimated rows, at most [`MAX_AUTO_RANGES`], and 1 below
/// [`PARALLEL_MIN_ROWS`] or without an estimate.
pub(crate) fn range_count(estimated_rows: Option<f64>, requested: Option<usize>) -> usize {
    if let Some(n) = requested {
        return n.clamp(1, MAX_RANGES);
    }
    match estimated_rows {
        Some(rows) if rows >= PARALLEL_MIN_ROWS => {
            ((rows / ROWS_PER_RANGE).ceil() as usize).clamp(2, MAX_AUTO_RANGES)
        }
        _ => 1,
    }
}

/// At most `k - 1` split points from `sample`, values of the leading watermark column in
/// ascending order (a histogram's bounds: each a quantile): evenly spaced through it,
/// strictly increasing (a value repeated in the sample splits once).
pub(crate) fn pick_splits(sample: &[WatermarkValue], k: usize) -> Vec<WatermarkValue> {
    let mut out: Vec<WatermarkValue> = Vec::new();
    if k < 2 || sample.len() < 2 {
        return out;
    }
    for i in 1..k {
        let v = &sample[i * sample.len() / k];
        // A split at the sample's first value leaves an empty first range.
        if v != &sample[0] && out.last() != Some(v) {
            out.push(v.clone());
        }
    }
    out
}

/// At most `k - 1` split points evenly spaced between `min` and `max` (of one kind: a
/// number, a date or a timestamp), strictly increasing and above `min`; none for text,
/// booleans, or values of different kinds.
pub(crate) fn interpolate(
    min: &WatermarkValue,
    max: &WatermarkValue,
    k: usize,
) -> Vec<WatermarkValue> {
    use WatermarkValue as V;
    // Overflow (decimals near the limits of i128) gives no splits.
    let ints = |lo: i128, hi: i128, make: &dyn Fn(i128) -> WatermarkValue| {
        let mut out: Vec<WatermarkValue> = Vec::new();
        let mut last = lo;
        for i in 1..k as i128 {
            let Some(v) = hi
                .checked_sub(lo)
                .and_then(|d| d.checked_mul(i))
                .and_then(|d| lo.checked_add(d / k as i128))
            else {
                return vec![];
            };
            if v > last {
                out.push(make(v));
                last = v;
            }
        }
        out
    };
    if k < 2 {
        return vec![];
    }
    match (min, max) {
        (V::Int(a), V::Int(b)) => ints(*a as i128, *b as i128, &|v| V::Int(v as i64)),
        (V::Date(a), V::Date(b)) => ints(*a as i128, *b as i128, &|v| V::Date(v as i32)),
        (V::Timestamp(a), V::Timestamp(b)) => {
            ints(*a as i128, *b as i128, &|v| V::Timestamp(v as i64))
        }
        (V::TimestampUtc(a), V::TimestampUtc(b)) => {
            ints(*a as i128, *b as i128, &|v| V::TimestampUtc(v as i64))
        }
        (
            V::Decimal {
                unscaled: a,
                scale: sa,
            },
            V::Decimal {
                unscaled: b,
                scale: sb,
            },
        ) if sa == sb => {
            let scale = *sa;
            ints(*a, *b, &|v| V::Decimal { unscaled: v, scale })
        }
        (V::Float(a), V::Float(b)) if a.is_finite() && b.is_finite() && a < b => {
            let mut out: Vec<WatermarkValue> = Vec::new();
            let mut last = *a;
            for i in 1..k {
                let v = a + (b - a) * i as f64 / k as f64;
                if v > last {
                    out.push(V::Float(v));
                    last = v;
                }
            }
            out
        }
        _ => vec![],
    }
}

/// The conditions of range `j` of the ranges `splits` cut: the leading column at or above
/// the split before it, below the split after it.
pub(crate) fn range_conditions(lead: &str, splits: &[WatermarkValue], j: usize) -> Vec<String> {
    let mut cond = Vec::new();
    if j > 0 {
        cond.push(format!("{lead} >= {}", value_literal(&splits[j - 1])));
    }
    if j < splits.len() {
        cond.push(format!("{lead} < {}", value_literal(&splits[j])));
    }
    cond
}

/// The conditions a sample of the leading column (`lead`, an SQL expression) must meet:
/// set, and not below the read's lower bound (its leading value).
fn sample_conditions(lead: &str, read: &WatermarkRead) -> String {
    let mut cond = vec![format!("{lead} IS NOT NULL")];
    if let Some(v) = read
        .lower_bound
        .as_ref()
        .and_then(|lb| lb.watermark.values.first())
    {
        cond.push(format!("{lead} >= {}", value_literal(v)));
    }
    cond.join(" AND ")
}

/// How a read splits: `None` (one query) for a read too small to split or a leading column
/// that cannot be split.
pub(crate) async fn plan(
    client: &Client,
    r: &Resolved,
    read: &WatermarkRead,
    d: &Described,
) -> Result<Option<Plan>> {
    if read.parallel == Some(1) {
        return Ok(None);
    }
    let lead_idx = d.wm_idx[0];
    let decode = &d.decoders[lead_idx];
    let lead = pg_ident(&read.watermark_columns[0]);
    let query_error =
        |e: tokio_postgres::Error| r.query_error(read.object.label(), pg_error_text(&e));
    let decode_values = |rows: &[tokio_postgres::Row], col: usize| -> Vec<WatermarkValue> {
        rows.iter()
            .filter_map(|row| {
                let raw: Option<super::types::Raw> = row.try_get(col).ok()?;
                watermark_value(decode, raw.map(|r| r.0)).ok().flatten()
            })
            .collect()
    };
    // A table's statistics: its estimated rows and the histogram of the leading column,
    // restricted to the values not below the lower bound.
    let mut estimate = None;
    let mut sample = Vec::new();
    let mut indexed = false;
    if let SourceObject::Table(t) = &read.object {
        let stats = client
            .query_opt(
                "SELECT c.reltuples::float8, s.histogram_bounds::text, \
                        format_type(a.atttypid, a.atttypmod), \
                        (SELECT format('%I.%I', cn.nspname, co.collname) \
                         FROM pg_catalog.pg_collation co \
                         JOIN pg_catalog.pg_namespace cn ON cn.oid = co.collnamespace \
                         WHERE co.oid = a.attcollation), \
                        EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
                                WHERE i.indrelid = c.oid AND i.indkey[0] = a.attnum) \
                 FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = $2 \
                 LEFT JOIN pg_catalog.pg_stats s ON s.schemaname = n.nspname \
                      AND s.tablename = c.relname AND s.attname = a.attname AND NOT s.inherited \
                 WHERE c.oid = $1::regclass",
                &[
                    &TextParam(t.pg_sql()) as &(dyn ToSql + Sync),
                    &read.watermark_columns[0],
                ],
            )
            .await
            .map_err(query_error)?;
        if let Some(row) = stats {
            let reltuples: f64 = row.get(0);
            let histogram: Option<String> = row.get(1);
            let type_name: String = row.get(2);
            // Text sorts by the column's collation, as the read's ORDER BY does: the splits
            // must be in the read's order for the ranges to be disjoint.
            let collate = row
                .get::<_, Option<String>>(3)
                .map_or(String::new(), |c| format!(" COLLATE {c}"));
            indexed = row.get(4);
            if let Some(h) = histogram {
                let all = client
                    .query(
                        &format!(
                            "SELECT v FROM unnest($1::text::{type_name}[]) v WHERE {} \
                             ORDER BY v{collate}",
                            sample_conditions(&format!("v{collate}"), read)
                        ),
                        &[&TextParam(h.clone()) as &(dyn ToSql + Sync)],
                    )
                    .await
                    .map_err(query_error)?;
                let total = client
                    .query_one(
                        &format!("SELECT cardinality($1::text::{type_name}[])"),
                        &[&TextParam(h) as &(dyn ToSql + Sync)],
                    )
                    .await
                    .map_err(query_error)?;
                let total: i32 = total.get(0);
                sample = decode_values(&all, 0);
                if reltuples > 0.0 && total > 0 {
                    estimate = Some(reltuples * sample.len() as f64 / total as f64);
                }
            } else if reltuples > 0.0 {
                estimate = Some(reltuples);
            }
        }
    }
    let k = range_count(estimate, read.parallel);
    if k < 2 {
        return Ok(None);
    }
    let shape = shape(k, estimate, indexed, read.batch_rows);
    let planned = |splits: Vec<WatermarkValue>| {
        Some(Plan {
            connections: shape.connections.min(splits.len() + 1),
            range_batches: shape.range_batches,
            splits,
        })
        .filter(|p| !p.splits.is_empty())
    };
    let splits = pick_splits(&sample, shape.ranges);
    if !splits.is_empty() {
        return Ok(planned(splits));
    }
    // No statistics: between the smallest and the largest value read.
    let row = client
        .query_one(
            &format!(
                "SELECT min({lead}), max({lead}) FROM {} WHERE {}",
                super::read::from_clause(&read.object),
                sample_conditions(&lead, read)
            ),
            &[],
        )
        .await
        .map_err(query_error)?;
    let row = std::slice::from_ref(&row);
    let (min, max) = (decode_values(row, 0), decode_values(row, 1));
    Ok(match (min.first(), max.first()) {
        (Some(a), Some(b)) => planned(interpolate(a, b, shape.ranges)),
        _ => None,
    })
}

/// How the range connections' transactions plan their queries. A bounded range of an
/// indexed column, ordered, is one index range scan in the index's order; left to itself,
/// PostgreSQL plans a range of a few percent of the table as a parallel bitmap heap scan,
/// a sort and a gather (two more worker processes per range), which took the server twice
/// the CPU of the same rows read through the index (db_bench, 3M rows: 5.5 s against
/// 2.9 s for DuckDB's ctid ranges). The read is already parallel across connections.
const RANGE_PLANS: &str = "SET LOCAL max_parallel_workers_per_gather = 0; \
                           SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off";

/// Starts a parallel read of the ranges `plan` cuts, on `plan.connections` new connections:
/// the first one's snapshot exported and imported on the others, then one worker task per
/// connection taking the ranges in order ([`work`]). At most [`RangeQueue`]'s limit of
/// ranges are being read or waiting for the caller at once.
pub(crate) async fn open(
    r: &Resolved,
    read: &WatermarkRead,
    d: &Described,
    plan: &Plan,
    arrow: SchemaRef,
) -> Result<RangeQueue> {
    let clients = snapshot_connections(r, read, plan.connections, RANGE_PLANS).await?;
    let lead = pg_ident(&read.watermark_columns[0]);
    let ranges = plan.splits.len() + 1;
    let mut todo = VecDeque::new();
    let mut receivers = VecDeque::new();
    for j in 0..ranges {
        let (tx, rx) = tokio::sync::mpsc::channel(plan.range_batches);
        let select = watermark_select(
            read,
            &d.schema,
            &range_conditions(&lead, &plan.splits, j),
            true,
        );
        todo.push_back((select, tx));
        receivers.push_back(rx);
    }
    // The range the caller reads, and one more per connection.
    let permits = Arc::new(tokio::sync::Semaphore::new(plan.connections + 1));
    spawn_workers(clients, r, read, d, &arrow, todo, permits.clone());
    Ok(RangeQueue {
        receivers,
        permits: Some(permits),
    })
}

/// `n` new connections, each in a `REPEATABLE READ READ ONLY` transaction with `settings`
/// (`SET LOCAL ...`), all in the first one's snapshot (exported, then imported by the
/// others, as `pg_dump -j` does).
pub(super) async fn snapshot_connections(
    r: &Resolved,
    read: &WatermarkRead,
    n: usize,
    settings: &str,
) -> Result<Vec<Arc<Client>>> {
    let label = read.object.label();
    let query_error = |e: tokio_postgres::Error| r.query_error(label.clone(), pg_error_text(&e));
    const BEGIN: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";
    let first = Arc::new(r.pg_connect().await?);
    first
        .batch_execute(&format!("{BEGIN}; {settings}"))
        .await
        .map_err(query_error)?;
    let mut clients = vec![first.clone()];
    if n > 1 {
        let snapshot: String = first
            .query_one("SELECT pg_export_snapshot()", &[])
            .await
            .map_err(query_error)?
            .get(0);
        for _ in 1..n {
            let c = r.pg_connect().await?;
            c.batch_execute(&format!(
                "{BEGIN}; SET TRANSACTION SNAPSHOT {}; {settings}",
                super::read::sql_literal(&snapshot)
            ))
            .await
            .map_err(query_error)?;
            clients.push(Arc::new(c));
        }
    }
    Ok(clients)
}

/// Starts one worker ([`work`]) per connection of `clients`, in their snapshot, taking the
/// ranges of `todo` in order while `permits` allow.
pub(super) fn spawn_workers(
    clients: Vec<Arc<Client>>,
    r: &Resolved,
    read: &WatermarkRead,
    d: &Described,
    arrow: &SchemaRef,
    todo: VecDeque<Range>,
    permits: Arc<tokio::sync::Semaphore>,
) {
    let todo = Arc::new(std::sync::Mutex::new(todo));
    for client in clients {
        tokio::spawn(work(
            Worker {
                client,
                r: r.clone(),
                read: read.clone(),
                d: d.clone(),
                arrow: arrow.clone(),
            },
            todo.clone(),
            permits.clone(),
        ));
    }
}

/// What a worker reads with: its connection (in the snapshot) and the read.
struct Worker {
    client: Arc<Client>,
    r: Resolved,
    read: WatermarkRead,
    d: Described,
    arrow: SchemaRef,
}

/// A range to read: its query and where its batches go.
pub(super) type Range = (String, tokio::sync::mpsc::Sender<Result<WatermarkBatch>>);

/// The ranges not started yet, in order.
type Todo = std::sync::Mutex<VecDeque<Range>>;

/// A worker: takes the next range (once a permit says fewer than the limit are in flight),
/// reads it into its channel, and so on until none is left or the caller is gone (the
/// permits closed). Its connection, and the snapshot transaction, end with it.
async fn work(w: Worker, todo: Arc<Todo>, permits: Arc<tokio::sync::Semaphore>) {
    loop {
        let Ok(permit) = permits.acquire().await else {
            return;
        };
        // Given back by the caller when it has taken the range's last batch.
        permit.forget();
        let next = todo.lock().ok().and_then(|mut t| t.pop_front());
        let Some((select, tx)) = next else {
            return;
        };
        let reader = PgRowReader::copy(w.client.clone(), &w.r, &w.read, &w.d, &select).await;
        let mut reader = match reader {
            Ok(reader) => reader,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        loop {
            let next = reader.next_batch(&w.arrow, &w.d.schema).await;
            let stop = !matches!(next, Ok(Some(_)));
            let Some(item) = next.transpose() else {
                break;
            };
            if tx.send(item).await.is_err() {
                return;
            }
            if stop {
                return;
            }
        }
    }
}

/// Batches a serial reader may hold before the caller takes them.
pub const READ_AHEAD_BATCHES: usize = 4;

/// Reads `reader`'s batches in a task of its own, up to [`READ_AHEAD_BATCHES`] ahead of the
/// caller (decoding overlaps what the caller does with the batches). The task stops when the
/// caller drops the receiver.
pub(crate) fn spawn(
    mut reader: PgRowReader,
    schema: SourceSchema,
    arrow: SchemaRef,
) -> BatchReceiver {
    let (tx, rx) = tokio::sync::mpsc::channel(READ_AHEAD_BATCHES);
    tokio::spawn(async move {
        loop {
            let next = reader.next_batch(&arrow, &schema).await;
            let stop = !matches!(next, Ok(Some(_)));
            let Some(item) = next.transpose() else {
                return;
            };
            if tx.send(item).await.is_err() || stop {
                return;
            }
        }
    });
    rx
}

/// The batches of a read's ranges, taken range after range (one range for a serial read).
/// Finishing a range gives its permit back to the workers; dropping the queue stops them.
pub(crate) struct RangeQueue {
    receivers: VecDeque<BatchReceiver>,
    permits: Option<Arc<tokio::sync::Semaphore>>,
}

impl RangeQueue {
    /// One read task's batches.
    pub(crate) fn one(rx: BatchReceiver) -> RangeQueue {
        RangeQueue {
            receivers: VecDeque::from([rx]),
            permits: None,
        }
    }

    /// The batches of ranges read into one channel, `rx`, in the order they come; `permits`
    /// are closed when the queue is dropped, which stops the workers.
    pub(crate) fn shared(rx: BatchReceiver, permits: Arc<tokio::sync::Semaphore>) -> RangeQueue {
        RangeQueue {
            receivers: VecDeque::from([rx]),
            permits: Some(permits),
        }
    }

    /// The next batch, `None` after the last range's last.
    pub(crate) async fn next(&mut self) -> Option<Result<WatermarkBatch>> {
        loop {
            let rx = self.receivers.front_mut()?;
            match rx.recv().await {
                Some(item) => return Some(item),
                None => {
                    self.receivers.pop_front();
                    if let Some(p) = &self.permits {
                        p.add_permits(1);
                    }
                }
            }
        }
    }
}

impl Drop for RangeQueue {
    fn drop(&mut self) {
        if let Some(p) = &self.permits {
            p.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WatermarkValue as V;

    #[test]
    fn range_counts() {
        assert_eq!(range_count(None, None), 1);
        assert_eq!(range_count(Some(999_999.0), None), 1);
        assert_eq!(range_count(Some(1_000_000.0), None), 2);
        assert_eq!(range_count(Some(7_000_000.0), None), 3);
        assert_eq!(range_count(Some(1e9), None), MAX_AUTO_RANGES);
        assert_eq!(range_count(Some(1e9), Some(1)), 1);
        assert_eq!(range_count(None, Some(3)), 3);
        assert_eq!(range_count(None, Some(0)), 1);
        assert_eq!(range_count(None, Some(1000)), MAX_RANGES);
    }

    #[test]
    fn splits_from_a_sample_are_quantiles_without_repeats() {
        let s: Vec<V> = (0..101).map(V::Int).collect();
        assert_eq!(pick_splits(&s, 4), vec![V::Int(25), V::Int(50), V::Int(75)]);
        assert_eq!(pick_splits(&s, 1), vec![]);
        // A value filling half the histogram splits once; the minimum never splits.
        let s: Vec<V> = [1, 1, 1, 1, 1, 1, 2, 3, 3, 3]
            .into_iter()
            .map(V::Int)
            .collect();
        assert_eq!(pick_splits(&s, 5), vec![V::Int(2), V::Int(3)]);
        assert_eq!(pick_splits(&[V::Int(1)], 4), vec![]);
        let s: Vec<V> = ["a", "b", "c", "d"]
            .into_iter()
            .map(|x| V::Str(x.into()))
            .collect();
        assert_eq!(pick_splits(&s, 2), vec![V::Str("c".into())]);
    }

    #[test]
    fn interpolated_splits() {
        assert_eq!(
            interpolate(&V::Int(0), &V::Int(100), 4),
            vec![V::Int(25), V::Int(50), V::Int(75)]
        );
        // Fewer distinct values than ranges: no repeated or empty splits.
        assert_eq!(interpolate(&V::Int(5), &V::Int(6), 4), vec![]);
        assert_eq!(interpolate(&V::Int(5), &V::Int(7), 4), vec![V::Int(6)]);
        assert_eq!(interpolate(&V::Int(7), &V::Int(7), 4), vec![]);
        assert_eq!(
            interpolate(&V::Int(i64::MIN), &V::Int(i64::MAX), 2),
            vec![V::Int(-1)],
            "no overflow at the ends of bigint"
        );
        assert_eq!(
            interpolate(&V::TimestampUtc(0), &V::TimestampUtc(3_000_000), 3),
            vec![V::TimestampUtc(1_000_000), V::TimestampUtc(2_000_000)]
        );
        assert_eq!(
            interpolate(&V::Date(10), &V::Date(20), 2),
            vec![V::Date(15)]
        );
        assert_eq!(
            interpolate(
                &V::Decimal {
                    unscaled: 100,
                    scale: 2
                },
                &V::Decimal {
                    unscaled: 300,
                    scale: 2
                },
                2
            ),
            vec![V::Decimal {
                unscaled: 200,
                scale: 2
            }]
        );
        assert_eq!(
            interpolate(&V::Float(0.0), &V::Float(1.0), 4),
            vec![V::Float(0.25), V::Float(0.5), V::Float(0.75)]
        );
        assert_eq!(
            interpolate(&V::Str("a".into()), &V::Str("z".into()), 4),
            vec![]
        );
        assert_eq!(interpolate(&V::Int(1), &V::Date(9), 4), vec![]);
        assert_eq!(interpolate(&V::Int(0), &V::Int(100), 1), vec![]);
    }

    #[test]
    fn shapes() {
        // Without an index (or a size): one range per connection.
        let s = shape(4, Some(1e7), false, 65_536);
        assert_eq!(
            (s.connections, s.ranges, s.range_batches),
            (4, 4, READ_AHEAD_BATCHES)
        );
        assert_eq!(shape(3, None, true, 65_536).ranges, 3);
        // With one: ranges of about 256k rows, each fitting its channel.
        let s = shape(4, Some(1e7), true, 65_536);
        assert_eq!(s.ranges, 39, "about four batches a range");
        assert_eq!(s.range_batches, 5);
        // Small reads still have a range per connection; huge ones at most 256 ranges.
        assert_eq!(shape(4, Some(10.0), true, 65_536).ranges, 4);
        assert_eq!(shape(2, Some(1e12), true, 65_536).ranges, MAX_SMALL_RANGES);
        assert_eq!(
            shape(2, Some(1e12), true, 1000).range_batches,
            4 * READ_AHEAD_BATCHES
        );
    }

    #[test]
    fn ranges_cover_everything_once() {
        let splits = vec![V::Int(10), V::Int(20)];
        assert_eq!(range_conditions("\"k\"", &splits, 0), vec!["\"k\" < '10'"]);
        assert_eq!(
            range_conditions("\"k\"", &splits, 1),
            vec!["\"k\" >= '10'", "\"k\" < '20'"]
        );
        assert_eq!(range_conditions("\"k\"", &splits, 2), vec!["\"k\" >= '20'"]);
        assert!(range_conditions("\"k\"", &[], 0).is_empty());
    }
}
