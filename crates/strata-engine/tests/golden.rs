//! Golden scenarios: every `tests/scenarios/*.scn` file at the repository root is run against
//! the real engine on real Delta tables in a temp dir. The format is documented in
//! `tests/scenarios/README.md`.
//!
//! `STRATA_SCENARIO=name cargo test -p strata-engine --test golden` runs only the scenarios
//! whose path contains `name`.

use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use std::path::{Path, PathBuf};
use strata_engine::Warehouse;

/// The checkout's scenarios. `cargo test` sets `CARGO_MANIFEST_DIR` when it runs the test,
/// which names the checkout being tested even when the binary was built from another clone
/// sharing the same `CARGO_TARGET_DIR`; the path compiled in is the fallback.
fn scenarios_dir() -> PathBuf {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    crate_dir.join("../../tests/scenarios")
}

/// Blocks of a scenario: a directive line and the lines under it up to a blank line.
fn blocks(text: &str) -> Vec<(usize, String, Vec<String>)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((n, line)) = lines.next() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let mut body = Vec::new();
        while let Some((_, l)) = lines.peek() {
            if l.trim().is_empty() {
                break;
            }
            body.push(l.to_string());
            lines.next();
        }
        out.push((n + 1, line.trim().to_string(), body));
    }
    out
}

async fn render(wh: &Warehouse, sql: &str) -> Result<Vec<String>, String> {
    let (_, batches) = strata_engine::query(wh, sql)
        .await
        .map_err(|e| e.to_string())?;
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in &batches {
        let f: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        for r in 0..b.num_rows() {
            rows.push(
                f.iter()
                    .map(|x| x.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            );
        }
    }
    Ok(rows)
}

async fn run_scenario(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let pipeline = dir.path().join("pipeline.sql");
    let wh = Warehouse::open(dir.path().join("warehouse")).map_err(|e| e.to_string())?;
    for (line, directive, body) in blocks(&text) {
        let at = |msg: String| format!("{}:{line}: {msg}", path.display());
        let (word, rest) = directive
            .split_once(' ')
            .map(|(a, b)| (a, b.trim()))
            .unwrap_or((directive.as_str(), ""));
        match word {
            "pipeline" => {
                std::fs::write(&pipeline, body.join("\n") + "\n").map_err(|e| e.to_string())?
            }
            "file" => {
                let p = dir.path().join(rest);
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
                }
                std::fs::write(&p, body.join("\n") + "\n").map_err(|e| e.to_string())?;
            }
            "run" => {
                // `run [select=NAME[+]] [full-refresh[=t1,t2]] [error TEXT]`
                let mut options = strata_engine::RunOptions::default();
                let mut run_path = pipeline.clone();
                let mut expect_error: Option<&str> = None;
                let mut remaining = rest;
                while !remaining.is_empty() {
                    if let Some(want) = remaining.strip_prefix("error") {
                        expect_error = Some(want);
                        break;
                    }
                    let (word, tail) = remaining
                        .split_once(' ')
                        .map(|(a, b)| (a, b.trim()))
                        .unwrap_or((remaining, ""));
                    if let Some(file) = word.strip_prefix("spec=") {
                        run_path = dir.path().join(file);
                    } else if let Some(sel) = word.strip_prefix("select=") {
                        options.select = Some(sel.parse().map_err(|e: String| at(e))?);
                    } else if word == "full-refresh" {
                        options.full_refresh = Some(Vec::new());
                    } else if let Some(list) = word.strip_prefix("full-refresh=") {
                        options.full_refresh = Some(list.split(',').map(str::to_string).collect());
                    } else {
                        return Err(at(format!("unknown run option `{word}`")));
                    }
                    remaining = tail;
                }
                let result = strata_engine::run_pipeline(&run_path, &wh, &options).await;
                match (expect_error, result) {
                    (None, Ok(_)) => {}
                    (None, Err(e)) => return Err(at(format!("run failed: {e}"))),
                    (Some(_), Ok(_)) => return Err(at("run succeeded, expected an error".into())),
                    (Some(want), Err(e)) => {
                        let msg = strata_engine::chain(&e);
                        if !msg.contains(want.trim()) {
                            return Err(at(format!(
                                "error `{msg}` does not contain `{}`",
                                want.trim()
                            )));
                        }
                    }
                }
            }
            "query" | "validate" => {
                let sep = body
                    .iter()
                    .position(|l| l == "----")
                    .ok_or_else(|| at("missing ----".into()))?;
                let mut want: Vec<String> = body[sep + 1..].to_vec();
                let mut sql = rest.to_string();
                for l in &body[..sep] {
                    sql.push(' ');
                    sql.push_str(l);
                }
                let mut got = if word == "validate" {
                    let v = strata_engine::validate(&wh, &sql)
                        .await
                        .map_err(|e| at(e.to_string()))?;
                    let mut got: Vec<String> = if v.is_empty() {
                        vec!["ok".to_string()]
                    } else {
                        v.into_iter()
                            .map(|v| format!("{}: {}", v.key, v.problem))
                            .collect()
                    };
                    got.sort();
                    want.sort();
                    got
                } else {
                    let (sorted, sql) = match sql.strip_prefix("rowsort ") {
                        Some(s) => (true, s.to_string()),
                        None => (false, sql.clone()),
                    };
                    let mut got = render(&wh, &sql).await.map_err(at)?;
                    if sorted {
                        got.sort();
                        want.sort();
                    }
                    got
                };
                if got != want {
                    got.truncate(200);
                    return Err(at(format!(
                        "{sql}\n--- expected\n{}\n--- got\n{}",
                        want.join("\n"),
                        got.join("\n")
                    )));
                }
            }
            other => return Err(at(format!("unknown directive `{other}`"))),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_scenarios() {
    // Every scenario also exercises the parallel fold and the parallel write, which large
    // inputs take (set before the engine first reads it).
    if std::env::var_os("STRATA_PARALLEL_MIN_ROWS").is_none() {
        std::env::set_var("STRATA_PARALLEL_MIN_ROWS", "1");
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(scenarios_dir())
        .expect("tests/scenarios exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "scn"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no scenarios found");
    let only = std::env::var("STRATA_SCENARIO").ok();
    let mut failures = Vec::new();
    let mut ran = 0;
    for f in &files {
        if only
            .as_ref()
            .is_some_and(|o| !f.to_string_lossy().contains(o.as_str()))
        {
            continue;
        }
        ran += 1;
        if let Err(e) = run_scenario(f).await {
            failures.push(e);
        }
    }
    println!("{ran} scenario(s) run, {} failed", failures.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}
