//! First loads of a PostgreSQL table in the order its rows lie on disk: no sort and no
//! index walk on the server, the table split into ranges of its pages (TID range scans,
//! PostgreSQL 14 and newer), each read on a connection of its own, all in ONE exported
//! snapshot, the batches handed out as they come. The highest watermark is asked of the
//! server in the same snapshot, so the caller can record it with the rows. This is how
//! `pg_dump -j` and DuckDB's postgres scanner read a whole table.
//!
//! Phases: [`layout`] (the table's kind, size and the server's version), [`page_ranges`]
//! (pure: where the ranges split), [`open`] (the snapshot, the highest watermark, then the
//! workers of `ranges.rs` reading the ranges into one channel).

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::ranges::{
    range_count, snapshot_connections, spawn_workers, RangeQueue, READ_AHEAD_BATCHES,
};
use super::read::{max_watermark_select, watermark_select, Described, TextParam};
use super::types::{watermark_value, Raw};
use crate::conn::{pg_error_text, Resolved};
use crate::error::{Result, SourceError};
use crate::object::SourceObject;
use crate::read::WatermarkRead;
use crate::value::Watermark;

/// Ranges per connection: the workers take the next range when done, so one slow range
/// does not leave the other connections idle at the end.
pub const RANGES_PER_CONNECTION: u64 = 4;

/// The first PostgreSQL version with TID range scans (`ctid >= '(p,0)' AND ctid < ...`
/// reads just those pages; before, every range would read the whole table).
const TID_RANGE_SCAN_VERSION: i32 = 140_000;

/// What the scan needs to know of the table: whether its pages can be split
/// (`splittable`: a plain table on a server with TID range scans), its size in pages and
/// its estimated rows (`None`: never analyzed).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Layout {
    pub splittable: bool,
    pub pages: u64,
    pub estimated_rows: Option<f64>,
}

/// The table's [`Layout`], from the catalog.
pub(crate) async fn layout(client: &Client, r: &Resolved, read: &WatermarkRead) -> Result<Layout> {
    let SourceObject::Table(t) = &read.object else {
        return Err(SourceError::Watermark {
            detail: format!(
                "{}: only a table is read as it lies on disk",
                read.object.label()
            ),
        });
    };
    let row = client
        .query_one(
            "SELECT c.relkind::text, c.reltuples::float8, \
                    (pg_catalog.pg_relation_size(c.oid) \
                     / pg_catalog.current_setting('block_size')::int8)::int8, \
                    pg_catalog.current_setting('server_version_num')::int4 \
             FROM pg_catalog.pg_class c WHERE c.oid = $1::regclass",
            &[&TextParam(t.pg_sql()) as &(dyn ToSql + Sync)],
        )
        .await
        .map_err(|e| r.query_error(read.object.label(), pg_error_text(&e)))?;
    let kind: String = row.get(0);
    let reltuples: f64 = row.get(1);
    let pages: i64 = row.get(2);
    let version: i32 = row.get(3);
    Ok(Layout {
        splittable: kind == "r" && version >= TID_RANGE_SCAN_VERSION,
        pages: pages.max(0) as u64,
        // -1 (PostgreSQL 14+) or 0 (before): never vacuumed or analyzed.
        estimated_rows: (reltuples > 0.0).then_some(reltuples),
    })
}

/// The conditions of each range when `pages` pages are read in `ranges` ranges: the first
/// open below, the last open above (pages added since the size was read are still read),
/// none at all for one range.
pub(crate) fn page_ranges(pages: u64, ranges: u64) -> Vec<Vec<String>> {
    let n = ranges.clamp(1, pages.max(1));
    let bound = |j: u64| pages * j / n;
    (0..n)
        .map(|j| {
            let mut cond = Vec::new();
            if j > 0 {
                cond.push(format!("ctid >= '({},0)'::tid", bound(j)));
            }
            if j + 1 < n {
                cond.push(format!("ctid < '({},0)'::tid", bound(j + 1)));
            }
            cond
        })
        .collect()
}

/// How the scan's transactions plan their queries: one process per connection (the read
/// is already split across connections).
const SCAN_PLANS: &str = "SET LOCAL max_parallel_workers_per_gather = 0";

/// Starts reading the whole of `read`'s table in any order on new connections (one
/// unless the table is large or `parallel` asks for more): returns the batches as they
/// come and the highest watermark of the rows read (`None`: no row has one).
pub(crate) async fn open(
    r: &Resolved,
    read: &WatermarkRead,
    d: &Described,
    layout: &Layout,
    arrow: SchemaRef,
) -> Result<(RangeQueue, Option<Watermark>)> {
    let connections = if layout.splittable {
        range_count(layout.estimated_rows, read.parallel)
    } else {
        1
    };
    let clients = snapshot_connections(r, read, connections, SCAN_PLANS).await?;
    let max = highest_watermark(&clients[0], r, read, d).await?;
    let conditions = if connections > 1 {
        page_ranges(layout.pages, connections as u64 * RANGES_PER_CONNECTION)
    } else {
        vec![vec![]]
    };
    let (tx, rx) = tokio::sync::mpsc::channel(connections * READ_AHEAD_BATCHES);
    let todo: VecDeque<_> = conditions
        .iter()
        .map(|cond| (watermark_select(read, &d.schema, cond, false), tx.clone()))
        .collect();
    drop(tx);
    // Every range may be in flight: the one channel bounds what waits for the caller.
    let permits = Arc::new(tokio::sync::Semaphore::new(todo.len()));
    spawn_workers(clients, r, read, d, &arrow, todo, permits.clone());
    Ok((RangeQueue::shared(rx, permits), max))
}

/// The highest watermark of the rows `read` reads, asked on `client` (in the read's
/// snapshot).
async fn highest_watermark(
    client: &Client,
    r: &Resolved,
    read: &WatermarkRead,
    d: &Described,
) -> Result<Option<Watermark>> {
    let row = client
        .query_opt(&max_watermark_select(read), &[])
        .await
        .map_err(|e| r.query_error(read.object.label(), pg_error_text(&e)))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let mut values = Vec::with_capacity(d.wm_idx.len());
    for (k, &i) in d.wm_idx.iter().enumerate() {
        let raw: Option<Raw> = row
            .try_get(k)
            .map_err(|e| r.query_error(read.object.label(), pg_error_text(&e)))?;
        let value = watermark_value(&d.decoders[i], raw.map(|r| r.0)).map_err(|detail| {
            SourceError::Watermark {
                detail: format!(
                    "{}: column {}: {detail}",
                    read.object.label(),
                    read.watermark_columns[k]
                ),
            }
        })?;
        match value {
            Some(v) => values.push(v),
            None => return Ok(None),
        }
    }
    Ok(Some(Watermark {
        columns: read.watermark_columns.clone(),
        values,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_ranges_cover_every_page_once() {
        assert_eq!(page_ranges(100, 1), vec![Vec::<String>::new()]);
        let r = page_ranges(100, 4);
        assert_eq!(r.len(), 4);
        assert_eq!(r[0], vec!["ctid < '(25,0)'::tid"]);
        assert_eq!(r[1], vec!["ctid >= '(25,0)'::tid", "ctid < '(50,0)'::tid"]);
        assert_eq!(r[3], vec!["ctid >= '(75,0)'::tid"]);
        // More ranges than pages: one per page; an empty table: one open range.
        assert_eq!(page_ranges(3, 8).len(), 3);
        assert_eq!(page_ranges(0, 8), vec![Vec::<String>::new()]);
    }

    #[test]
    fn page_ranges_split_uneven_sizes_without_gaps() {
        let r = page_ranges(10, 3);
        assert_eq!(r[0], vec!["ctid < '(3,0)'::tid"]);
        assert_eq!(r[1], vec!["ctid >= '(3,0)'::tid", "ctid < '(6,0)'::tid"]);
        assert_eq!(r[2], vec!["ctid >= '(6,0)'::tid"]);
    }
}
