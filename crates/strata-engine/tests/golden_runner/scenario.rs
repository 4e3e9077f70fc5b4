//! A scenario file parsed into its blocks, refusing what cannot be a scenario. The format is
//! documented in `tests/scenarios/README.md`.

use strata_engine::Selection;

/// A parsed scenario: its blocks, and the file's lines (completion rewrites some of them).
pub struct Scenario {
    pub lines: Vec<String>,
    pub ends_with_newline: bool,
    pub blocks: Vec<Block>,
}

/// One block: the directive's line (1-based, for messages) and what it does.
pub struct Block {
    pub line: usize,
    pub step: Step,
}

pub enum Step {
    /// `pipeline`: the text of `pipeline.sql`.
    Pipeline(String),
    /// `file PATH`: an input file relative to the scenario's temp dir.
    File {
        path: String,
        content: String,
    },
    Run(Run),
    /// `expire PATH [changes]`: what log cleanup and VACUUM do to the Delta table at PATH
    /// (relative to the temp dir): a checkpoint at its latest version, the commit files
    /// before it deleted, and its change files (`_change_data/`) deleted; with `changes`,
    /// only the change files.
    Expire {
        path: String,
        log: bool,
    },
    /// `query [rowsort] SQL`: the expected output is a header line, then the rows.
    Query {
        sql: String,
        rowsort: bool,
        expected: Expected,
    },
    /// `validate TABLE`: `ok` or one `key: problem` line per violation, in any order.
    Validate {
        table: String,
        expected: Expected,
    },
}

/// `run [spec=FILE] [select=NAME[+]] [full-refresh[=t1,t2]] [committed=t1,t2] [error TEXT]`.
pub struct Run {
    pub spec: Option<String>,
    /// Tables a failing run may still commit to: datasets before the failing one that took
    /// their input in that run (each dataset commits on its own, as in Lakeflow), as
    /// `name` (schema `default`) or `schema.name`.
    pub committed: Vec<String>,
    pub select: Option<Selection>,
    pub full_refresh: Option<Vec<String>>,
    /// `Some` when the run must fail with a message containing the text. The text is empty
    /// only in completion mode (completion fills it in).
    pub error: Option<String>,
    /// The directive line up to `error` (completion writes `{prefix}error TEXT`).
    pub error_prefix: String,
}

/// The expected lines under `----`: the 0-based index of the first in the file, and the lines.
pub struct Expected {
    pub start: usize,
    pub lines: Vec<String>,
}

/// Parses `text`; errors name `display:line`. `complete` accepts what completion fills in: a
/// `run error` without text and a query or validate block with nothing under `----`.
pub fn parse(display: &str, text: &str, complete: bool) -> Result<Scenario, String> {
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = &lines[i];
        if line.trim().is_empty() || line.starts_with('#') {
            i += 1;
            continue;
        }
        let start = i;
        let mut end = i + 1;
        while end < lines.len() && !lines[end].trim().is_empty() {
            end += 1;
        }
        let at = |msg: &str| format!("{display}:{}: {msg}", start + 1);
        let step = parse_block(&lines, start, end, complete).map_err(|m| at(&m))?;
        blocks.push(Block {
            line: start + 1,
            step,
        });
        i = end;
    }
    let checks = blocks
        .iter()
        .filter(|b| match &b.step {
            Step::Query { .. } | Step::Validate { .. } => true,
            Step::Run(r) => r.error.is_some(),
            _ => false,
        })
        .count();
    if checks == 0 {
        return Err(format!(
            "{display}:1: the scenario checks nothing: it needs a query or validate block, or a \
             `run error TEXT`"
        ));
    }
    Ok(Scenario {
        ends_with_newline: text.ends_with('\n'),
        lines,
        blocks,
    })
}

/// The block of `lines[start..end]`: the directive line and its body.
fn parse_block(lines: &[String], start: usize, end: usize, complete: bool) -> Result<Step, String> {
    let directive = lines[start].trim();
    let body = &lines[start + 1..end];
    let (word, rest) = directive
        .split_once(' ')
        .map(|(a, b)| (a, b.trim()))
        .unwrap_or((directive, ""));
    let no_body = |what: &str| -> Result<(), String> {
        if body.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "`{what}` takes no lines under it (found `{}`; blocks are separated by a blank \
                 line)",
                body[0]
            ))
        }
    };
    match word {
        "pipeline" => {
            if !rest.is_empty() {
                return Err(format!("`pipeline` takes no argument (found `{rest}`)"));
            }
            if body.is_empty() {
                return Err("`pipeline` without SQL under it".into());
            }
            Ok(Step::Pipeline(body.join("\n") + "\n"))
        }
        "file" => {
            if rest.is_empty() {
                return Err("`file` needs a path".into());
            }
            Ok(Step::File {
                path: rest.to_string(),
                content: body.join("\n") + "\n",
            })
        }
        "expire" => {
            no_body("expire")?;
            let (path, log) = match rest.split_once(' ') {
                None if !rest.is_empty() => (rest, true),
                Some((p, "changes")) => (p, false),
                _ => return Err("`expire` takes a table path, then optionally `changes`".into()),
            };
            Ok(Step::Expire {
                path: path.to_string(),
                log,
            })
        }
        "run" => {
            no_body("run")?;
            let raw = &lines[start];
            parse_run(raw, rest, complete).map(Step::Run)
        }
        "query" | "validate" => {
            let sep = body
                .iter()
                .position(|l| l == "----")
                .ok_or_else(|| format!("`{word}` block without a `----` line"))?;
            let expected = Expected {
                start: start + 1 + sep + 1,
                lines: body[sep + 1..].to_vec(),
            };
            if expected.lines.is_empty() && !complete {
                return Err(format!(
                    "`{word}` block with nothing under `----` (STRATA_GOLDEN_COMPLETE=1 fills \
                     it in)"
                ));
            }
            if word == "validate" {
                if rest.is_empty() || rest.contains(' ') || sep != 0 {
                    return Err("`validate` takes one table name, then `----`".into());
                }
                return Ok(Step::Validate {
                    table: rest.to_string(),
                    expected,
                });
            }
            let mut sql = rest.to_string();
            for l in &body[..sep] {
                sql.push(' ');
                sql.push_str(l);
            }
            let (rowsort, sql) = match sql.strip_prefix("rowsort ") {
                Some(s) => (true, s.trim().to_string()),
                None => (false, sql.trim().to_string()),
            };
            if sql.is_empty() {
                return Err("`query` without SQL".into());
            }
            Ok(Step::Query {
                sql,
                rowsort,
                expected,
            })
        }
        other => Err(format!(
            "unknown directive `{other}` (pipeline, file, run, expire, query, validate)"
        )),
    }
}

fn parse_run(raw: &str, rest: &str, complete: bool) -> Result<Run, String> {
    let mut run = Run {
        spec: None,
        committed: Vec::new(),
        select: None,
        full_refresh: None,
        error: None,
        error_prefix: String::new(),
    };
    let mut remaining = rest;
    while !remaining.is_empty() {
        if remaining == "error" || remaining.starts_with("error ") {
            let want = remaining["error".len()..].trim();
            if want.is_empty() && !complete {
                return Err(
                    "`run error` without the expected error text (STRATA_GOLDEN_COMPLETE=1 \
                     fills it in)"
                        .into(),
                );
            }
            run.error = Some(want.to_string());
            // `remaining` is a slice of `raw` (trimmed and split, never copied).
            let at = remaining.as_ptr() as usize - raw.as_ptr() as usize;
            run.error_prefix = raw[..at].to_string();
            break;
        }
        let (word, tail) = remaining
            .split_once(' ')
            .map(|(a, b)| (a, b.trim()))
            .unwrap_or((remaining, ""));
        if let Some(file) = word.strip_prefix("spec=") {
            run.spec = Some(file.to_string());
        } else if let Some(sel) = word.strip_prefix("select=") {
            run.select = Some(
                sel.parse()
                    .map_err(|e: String| format!("select={sel}: {e}"))?,
            );
        } else if let Some(list) = word.strip_prefix("committed=") {
            run.committed = list.split(',').map(str::to_string).collect();
        } else if word == "full-refresh" {
            run.full_refresh = Some(Vec::new());
        } else if let Some(list) = word.strip_prefix("full-refresh=") {
            run.full_refresh = Some(list.split(',').map(str::to_string).collect());
        } else {
            return Err(format!(
                "unknown run option `{word}` (spec=FILE, select=NAME[+], \
                 full-refresh[=t1,t2], committed=t1,t2, error TEXT)"
            ));
        }
        remaining = tail;
    }
    Ok(run)
}
