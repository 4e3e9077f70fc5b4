//! Expectations: `CONSTRAINT name EXPECT (condition) [ON VIOLATION DROP ROW | FAIL UPDATE]`.
//!
//! A row passes an expectation when its condition is TRUE; FALSE and NULL are violations
//! (a condition that cannot be decided does not vouch for the row). Every expectation is
//! counted on every row, so the counts of one expectation do not depend on another's
//! action. Then `FAIL UPDATE` expectations with a violation fail the batch (nothing of it is
//! committed), and rows violating any `DROP ROW` expectation are removed.

use crate::error::{Context, EngineError, Result};
use deltalake::arrow::array::{Array, BooleanArray, RecordBatch};
use deltalake::arrow::compute::{and, filter_record_batch, is_not_null};
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use strata_sql::{ExpectAction, Expectation};

/// How many rows passed and failed one expectation (in one run of one dataset).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExpectationCount {
    pub name: String,
    #[serde(serialize_with = "action_name")]
    pub action: ExpectAction,
    pub passed: usize,
    pub failed: usize,
}

/// An expectation's action as the event log writes it (`warn`, `drop`, `fail`).
fn action_name<S: serde::Serializer>(
    a: &ExpectAction,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(a.as_str())
}

/// Adds `more` to `totals` (same expectations, same order; `totals` empty at first).
pub(crate) fn accumulate(totals: &mut Vec<ExpectationCount>, more: Vec<ExpectationCount>) {
    if totals.is_empty() {
        *totals = more;
        return;
    }
    for (t, m) in totals.iter_mut().zip(more) {
        t.passed += m.passed;
        t.failed += m.failed;
    }
}

/// How many failing rows a `FAIL UPDATE` error shows.
const SAMPLE_ROWS: usize = 3;

/// Checks `rows` of `dataset` (read from `place`) against `expectations`: the rows to keep
/// and the counts, or an error for a violated `FAIL UPDATE` expectation.
pub(crate) async fn apply(
    expectations: &[Expectation],
    dataset: &str,
    place: &str,
    rows: RecordBatch,
) -> Result<(RecordBatch, Vec<ExpectationCount>)> {
    if expectations.is_empty() {
        return Ok((rows, Vec::new()));
    }
    let ctx = crate::storage::session::new_session();
    ctx.register_batch("__strata_rows", rows.clone())
        .context(|| "registering rows".into())?;
    let select = expectations
        .iter()
        .enumerate()
        .map(|(i, e)| format!("({}) IS TRUE AS e{i}", e.condition))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!("SELECT {select} FROM __strata_rows");
    let df = ctx.sql(&sql).await.map_err(|e| {
        EngineError::plan(format!(
            "{dataset}: an expectation's condition does not apply to its rows: {e}"
        ))
    })?;
    let batches = df
        .collect()
        .await
        .context(|| format!("{dataset}: evaluating expectations"))?;
    let verdicts = match batches.first() {
        Some(first) => deltalake::arrow::compute::concat_batches(&first.schema(), &batches)
            .context(|| "expectations".into())?,
        None => return Ok((rows, zero_counts(expectations))),
    };
    let mut counts = Vec::with_capacity(expectations.len());
    let mut keep: Option<BooleanArray> = None;
    for (i, e) in expectations.iter().enumerate() {
        let pass = verdicts
            .column(i)
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| EngineError::internal("expectation verdict is not boolean"))?;
        let passed = pass.true_count();
        let failed = rows.num_rows() - passed;
        counts.push(ExpectationCount {
            name: e.name.clone(),
            action: e.action,
            passed,
            failed,
        });
        match e.action {
            ExpectAction::Fail if failed > 0 => {
                return Err(EngineError::BadInput(format!(
                    "expectation {} on {dataset} failed (ON VIOLATION FAIL UPDATE): {failed} of {} \
                     row(s) of {place} violate ({}); nothing of this batch was written. \
                     First failing rows: {}",
                    e.name,
                    rows.num_rows(),
                    e.condition,
                    sample(&rows, pass)?
                )));
            }
            ExpectAction::Drop => {
                keep = Some(match keep {
                    None => pass.clone(),
                    Some(k) => and(&k, pass).context(|| "expectations".into())?,
                });
            }
            _ => {}
        }
    }
    let kept = match keep {
        Some(k) => {
            // `IS TRUE` never yields NULL, but keep the filter exact regardless.
            let k = and(&k, &is_not_null(&k).context(|| "expectations".into())?)
                .context(|| "expectations".into())?;
            filter_record_batch(&rows, &k).context(|| "dropping rows".into())?
        }
        None => rows,
    };
    Ok((kept, counts))
}

/// Every expectation with no row checked.
pub(crate) fn zero_counts(expectations: &[Expectation]) -> Vec<ExpectationCount> {
    expectations
        .iter()
        .map(|e| ExpectationCount {
            name: e.name.clone(),
            action: e.action,
            passed: 0,
            failed: 0,
        })
        .collect()
}

/// The first failing rows as `{a: 1, b: x}`, separated by `; `.
fn sample(rows: &RecordBatch, pass: &BooleanArray) -> Result<String> {
    let options = FormatOptions::default().with_null("NULL");
    let formatters = rows
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<std::result::Result<Vec<_>, _>>()
        .context(|| "formatting rows".into())?;
    let schema = rows.schema();
    let mut out = Vec::new();
    for i in (0..rows.num_rows())
        .filter(|&i| !pass.value(i))
        .take(SAMPLE_ROWS)
    {
        let fields: Vec<String> = schema
            .fields()
            .iter()
            .zip(&formatters)
            .map(|(f, fmt)| format!("{}: {}", f.name(), fmt.value(i)))
            .collect();
        out.push(format!("{{{}}}", fields.join(", ")));
    }
    Ok(out.join("; "))
}
