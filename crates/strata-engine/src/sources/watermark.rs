//! The position a database-reading streaming table has reached (a watermark, or a CDC
//! source's LSN), kept in the commit info of
//! the commit that appended the rows up to it (`strata.watermark`, or
//! `strata.watermark.<flow>` for an append flow): the rows and the watermark are one atomic
//! commit, so a crash never skips or doubles rows. The table keeps its whole log (as file
//! ingestion does) so that the commit holding the watermark is never cleaned up. A CDC
//! source's LSN is read back with its first copy's progress (`sources/resume.rs`).

use crate::error::{Context, EngineError, Result};
use deltalake::DeltaTable;
use futures::StreamExt;
use serde_json::Value;
use strata_sources::Watermark;

/// The commit-info key of the watermark.
pub(crate) const WATERMARK_KEY: &str = "strata.watermark";

/// The key an ingestion's watermark is stored under: the table's own query, or an append
/// flow.
pub(crate) fn key(append_flow: Option<&str>) -> String {
    match append_flow {
        None => WATERMARK_KEY.to_string(),
        Some(f) => format!("{WATERMARK_KEY}.{f}"),
    }
}

/// The commit-info key of a CDC source's LSN (`strata.lsn`, `strata.lsn.<flow>`): the
/// position after which the next run reads changes.
pub(crate) fn lsn_key(append_flow: Option<&str>) -> String {
    match append_flow {
        None => "strata.lsn".to_string(),
        Some(f) => format!("strata.lsn.{f}"),
    }
}

/// The newest watermark `table` recorded under `key` (newest commit first; the commits
/// after it that record none are the ones other writers and upkeep made). `None` before
/// the first load.
pub(crate) async fn stored(table: &DeltaTable, key: &str) -> Result<Option<Watermark>> {
    let Some(json) = newest_info(table, key).await? else {
        return Ok(None);
    };
    Watermark::from_json(&json).map(Some).map_err(|e| {
        EngineError::internal(format!(
            "the watermark recorded in the table's log does not read back: {e}"
        ))
    })
}

/// The text the newest commit that has commit-info entry `key` recorded there.
async fn newest_info(table: &DeltaTable, key: &str) -> Result<Option<String>> {
    let mut history = table.history(None);
    while let Some(info) = history.next().await {
        let info = info.context(|| "reading table history".into())?;
        match info.info.get(key) {
            Some(Value::String(text)) => return Ok(Some(text.clone())),
            Some(other) => {
                return Err(EngineError::internal(format!(
                    "the position recorded in the table's log under {key} is not text: {other}"
                )))
            }
            None => {}
        }
    }
    Ok(None)
}
