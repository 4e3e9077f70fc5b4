//! Running a parsed scenario against the real engine, its warehouse and input in a temp dir
//! or in an object store (`place.rs`): each check compares, or in completion mode records
//! the lines that would make it pass.

use super::place::{Place, Storage};
use super::scenario::{Expected, Run, Scenario, Step};
use deltalake::arrow::array::{Array, AsArray};
use deltalake::arrow::datatypes::{DataType, Schema};
use deltalake::arrow::record_batch::RecordBatch;
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use std::collections::BTreeMap;
use std::path::Path;
use strata_engine::Warehouse;

/// Replace the file's lines `start..end` (0-based) with `lines`.
pub struct Edit {
    pub start: usize,
    pub end: usize,
    pub lines: Vec<String>,
}

/// Runs `scenario`. Without `complete`, the first check that fails is the error; with it, a
/// query, validate or `run error` whose expected text differs from the actual output gives an
/// edit instead (anything else that fails is still an error).
pub async fn run(
    scenario: &Scenario,
    name: &str,
    display: &str,
    storage: &Storage,
    complete: bool,
) -> Result<Vec<Edit>, String> {
    let place = Place::new(storage, name)?;
    let pipeline = place.dir().join("pipeline.sql");
    let wh = Warehouse::open(place.warehouse()).map_err(|e| strata_engine::chain(&e))?;
    let mut edits = Vec::new();
    for block in &scenario.blocks {
        let at = |msg: String| format!("{display}:{}: {msg}", block.line);
        match &block.step {
            Step::Pipeline(text) => std::fs::write(&pipeline, place.sources_text(text))
                .map_err(|e| at(e.to_string()))?,
            Step::File { path, content } => place.write_file(path, content).await.map_err(at)?,
            Step::Expire { path, log } => place.expire(path, *log).await.map_err(at)?,
            Step::Run(run) => {
                let before = match run.error {
                    Some(_) => Some(place.warehouse_files().await.map_err(at)?),
                    None => None,
                };
                let run_path = match &run.spec {
                    Some(file) => place.dir().join(file),
                    None => pipeline.clone(),
                };
                let options = strata_engine::RunOptions {
                    select: run.select.clone(),
                    full_refresh: run.full_refresh.clone(),
                    ..Default::default()
                };
                let result = strata_engine::run_pipeline(&run_path, &wh, &options).await;
                match (&run.error, result) {
                    (None, Ok(_)) => {}
                    (None, Err(e)) => {
                        return Err(at(format!("run failed: {}", strata_engine::chain(&e))))
                    }
                    (Some(_), Ok(_)) => return Err(at("run succeeded, expected an error".into())),
                    (Some(want), Err(e)) => {
                        let msg = strata_engine::chain(&e);
                        if want.is_empty() || !msg.contains(want.as_str()) {
                            if !complete {
                                return Err(at(format!("error `{msg}` does not contain `{want}`")));
                            }
                            edits.push(error_edit(run, block.line, &msg, place.dir()).map_err(at)?);
                        }
                        let after = place.warehouse_files().await.map_err(at)?;
                        let may_write: Vec<String> = run
                            .committed
                            .iter()
                            .map(|t| match t.split_once('.') {
                                Some((schema, name)) => format!("{schema}/{name}/"),
                                None => format!("default/{t}/"),
                            })
                            .collect();
                        let written: Vec<String> =
                            differences(before.as_ref().expect("taken above"), &after)
                                .into_iter()
                                .filter(|line| {
                                    !may_write.iter().any(|p| {
                                        line.contains(&format!(" {p}"))
                                            || line.contains(&format!(" _strata/{p}"))
                                    })
                                })
                                .collect();
                        if !written.is_empty() {
                            return Err(at(format!(
                                "the failing run wrote to the warehouse (a failing run must \
                                 leave it as it was, but for the tables of committed=... and \
                                 _strata/event_log):\n{}",
                                written.join("\n")
                            )));
                        }
                    }
                }
            }
            Step::Query {
                sql,
                rowsort,
                expected,
            } => {
                let (schema, batches) = strata_engine::query(&wh, sql).await.map_err(|e| {
                    at(format!("query failed: {}\n{sql}", strata_engine::chain(&e)))
                })?;
                let header = header(&schema);
                let rows = rows(&batches).map_err(|e| at(format!("{e}\n{sql}")))?;
                if let Some(edit) =
                    compare_query(sql, *rowsort, expected, &header, rows, complete).map_err(at)?
                {
                    edits.push(edit);
                }
            }
            Step::Validate { table, expected } => {
                let v = strata_engine::validate(&wh, table)
                    .await
                    .map_err(|e| at(format!("validate failed: {}", strata_engine::chain(&e))))?;
                let mut got: Vec<String> = if v.is_empty() {
                    vec!["ok".to_string()]
                } else {
                    v.into_iter()
                        .map(|v| format!("{}: {}", v.key, v.problem))
                        .collect()
                };
                got.sort();
                let mut want = expected.lines.clone();
                want.sort();
                if got != want {
                    if !complete {
                        return Err(at(format!(
                            "validate {table}\n--- expected\n{}\n--- got\n{}",
                            want.join("\n"),
                            got.join("\n")
                        )));
                    }
                    edits.push(Edit {
                        start: expected.start,
                        end: expected.start + expected.lines.len(),
                        lines: got,
                    });
                }
            }
        }
    }
    place.clear().await?;
    Ok(edits)
}

/// Compares a query's output with its block; `Ok(Some(edit))` in completion mode when they
/// differ. The rows written down are kept when only the header differs (or is missing).
fn compare_query(
    sql: &str,
    rowsort: bool,
    expected: &Expected,
    header: &str,
    mut got: Vec<String>,
    complete: bool,
) -> Result<Option<Edit>, String> {
    if rowsort {
        got.sort();
    }
    let same_rows = |want: &[String]| {
        let mut want = want.to_vec();
        if rowsort {
            want.sort();
        }
        want == got
    };
    let (want_header, want_rows) = match expected.lines.split_first() {
        Some((h, rows)) => (Some(h.as_str()), rows),
        None => (None, &[][..]),
    };
    let header_ok = want_header == Some(header);
    let rows_ok = same_rows(want_rows);
    if header_ok && rows_ok {
        return Ok(None);
    }
    if !complete {
        let hint = "(STRATA_GOLDEN_COMPLETE=1 rewrites the block from the actual output for \
                    review; see tests/scenarios/README.md)";
        if !header_ok {
            return Err(format!(
                "column names or types differ {hint}\n{sql}\n--- expected header\n{}\n--- got \
                 header\n{header}",
                want_header.unwrap_or("")
            ));
        }
        let first = want_rows
            .iter()
            .zip(&got)
            .position(|(w, g)| w != g)
            .unwrap_or(want_rows.len().min(got.len()));
        got.truncate(200);
        return Err(format!(
            "rows differ (first at row {}{}) {hint}\n{sql}\n--- expected\n{}\n--- got\n{}",
            first + 1,
            if rowsort { ", rows sorted" } else { "" },
            want_rows.join("\n"),
            got.join("\n")
        ));
    }
    let mut lines = vec![header.to_string()];
    if rows_ok {
        lines.extend(want_rows.iter().cloned());
    } else if same_rows(&expected.lines) {
        // No header line yet: the lines written are the rows.
        lines.extend(expected.lines.iter().cloned());
    } else {
        lines.extend(got);
    }
    Ok(Some(Edit {
        start: expected.start,
        end: expected.start + expected.lines.len(),
        lines,
    }))
}

/// The edit giving a `run error` line the actual error: its first line, or when that names
/// the scenario's temp dir (which differs on every run), its longest part that does not.
fn error_edit(run: &Run, line: usize, msg: &str, tmp: &Path) -> Result<Edit, String> {
    let first = msg.lines().next().unwrap_or("");
    let mut parts = vec![first.to_string()];
    for t in [tmp.to_path_buf(), tmp.canonicalize().unwrap_or_default()] {
        let t = t.to_string_lossy().to_string();
        if !t.is_empty() {
            parts = parts
                .iter()
                .flat_map(|p| p.split(t.as_str()).map(str::to_string).collect::<Vec<_>>())
                .collect();
        }
    }
    let text = parts
        .iter()
        .map(|p| p.trim().trim_start_matches('/').trim())
        .max_by_key(|p| p.len())
        .unwrap_or("");
    if text.is_empty() {
        return Err(format!(
            "cannot complete: the error has no stable text: `{msg}`"
        ));
    }
    Ok(Edit {
        start: line - 1,
        end: line,
        lines: vec![format!("{}error {text}", run.error_prefix)],
    })
}

/// `name:type|...` of a query's columns.
pub fn header(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}:{}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join("|")
}

/// One line per row, values joined with `|`; SQL NULL is `NULL`, and a string that could be
/// read as something else (exactly `NULL`, empty, with `|`, a leading `"`, space around it
/// or a control character) is quoted with Rust's escapes (`"NULL"`, `""`, `"a|b"`).
pub fn rows(batches: &[RecordBatch]) -> Result<Vec<String>, String> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for b in batches {
        let columns: Vec<Column> = b
            .columns()
            .iter()
            .map(|c| Column::new(c.as_ref(), &options))
            .collect::<Result<_, _>>()?;
        for r in 0..b.num_rows() {
            out.push(
                columns
                    .iter()
                    .map(|c| c.value(r))
                    .collect::<Vec<_>>()
                    .join("|"),
            );
        }
    }
    Ok(out)
}

enum Column<'a> {
    Text(&'a dyn Array),
    Other(ArrayFormatter<'a>),
}

impl<'a> Column<'a> {
    fn new(array: &'a dyn Array, options: &'a FormatOptions<'a>) -> Result<Self, String> {
        match array.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Ok(Column::Text(array)),
            _ => ArrayFormatter::try_new(array, options)
                .map(Column::Other)
                .map_err(|e| e.to_string()),
        }
    }

    fn value(&self, row: usize) -> String {
        match self {
            Column::Other(f) => f.value(row).to_string(),
            Column::Text(a) if a.is_null(row) => "NULL".to_string(),
            Column::Text(a) => {
                let s = match a.data_type() {
                    DataType::Utf8 => a.as_string::<i32>().value(row),
                    DataType::LargeUtf8 => a.as_string::<i64>().value(row),
                    _ => a.as_string_view().value(row),
                };
                text(s)
            }
        }
    }
}

/// A string value as written in an expected row.
pub fn text(s: &str) -> String {
    let plain = !s.is_empty()
        && s != "NULL"
        && !s.contains('|')
        && !s.starts_with('"')
        && s.trim() == s
        && !s.chars().any(char::is_control);
    if plain {
        s.to_string()
    } else {
        format!("{s:?}")
    }
}

/// `new: PATH`, `changed: PATH`, `removed: PATH` lines, one per file that differs.
fn differences(
    before: &BTreeMap<String, (u64, u64)>,
    after: &BTreeMap<String, (u64, u64)>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (path, v) in after {
        match before.get(path) {
            None => out.push(format!("  new: {path} ({} bytes)", v.0)),
            Some(b) if b != v => out.push(format!("  changed: {path} ({} -> {} bytes)", b.0, v.0)),
            Some(_) => {}
        }
    }
    for path in before.keys().filter(|p| !after.contains_key(*p)) {
        out.push(format!("  removed: {path}"));
    }
    out
}
