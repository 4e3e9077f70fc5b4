//! Pipeline text through `${}` substitution, the parser and the planner: nothing panics, and
//! every error names a place (`line:column: message`, 1-based, inside the text or just past
//! its end), which is the contract of `strata_sql::SqlError`.
//!
//! Shared by the cargo-fuzz target (fuzz/fuzz_targets/sql_parse_plan.rs) and the workspace
//! smoke test (crates/strata-engine/tests/fuzz_smoke.rs).

use std::collections::BTreeMap;
use strata_sql::SqlError;

/// Configuration values the seeds use (and an empty one).
fn configuration() -> BTreeMap<String, String> {
    [
        ("mode", "SCD TYPE 2"),
        ("dir", "data/cdc"),
        ("source_root", "data"),
        ("root", "data"),
        ("currency", "EUR"),
        ("key", "id"),
        ("empty", ""),
        ("semi", "a; b"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn check_located(e: &SqlError, text: &str) {
    let location = match e {
        SqlError::Syntax { location, .. } | SqlError::Plan { location, .. } => *location,
    };
    let lines = text.split('\n').count() as u64;
    assert!(
        location.line >= 1 && location.column >= 1 && location.line <= lines,
        "error outside the text ({} lines): {e}",
        lines
    );
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("{location}: ")),
        "error does not start with its place: {shown}"
    );
}

/// The check on one input; a panic is a finding.
pub fn check(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let text = match strata_sql::substitute(raw, &configuration()) {
        Ok(t) => t,
        Err(e) => return check_located(&e, raw),
    };
    let parsed = match strata_sql::parse_pipeline(&text) {
        Ok(p) => p,
        Err(e) => return check_located(&e, &text),
    };
    // Statements print back (the AST's Debug walks everything the parser built).
    let _ = format!("{parsed:?}");
    match strata_sql::plan_pipeline(parsed) {
        Ok(plan) => {
            let _ = format!("{:?}", plan.order);
        }
        Err(e) => check_located(&e, &text),
    }
}
