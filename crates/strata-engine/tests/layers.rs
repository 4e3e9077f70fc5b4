//! The engine's layers, checked over its source: each module names (`crate::...` or
//! `super::...`) only modules of its own layer or of the layers below it, no `ops` folder
//! names another, and no two files name each other, directly or through others. The layers,
//! bottom up, are listed in `LAYERS` and at the top of `src/lib.rs`. The database sources
//! crate (`strata-sources`) is held to the same rule on cycles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom up. `error` is below everything; `lib.rs` above everything.
const LAYERS: [&str; 10] = [
    "error",
    "util",
    "semantics",
    "load",
    "storage",
    "sources",
    "eventstore",
    "sql",
    "ops",
    "runtime",
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn sources_src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../strata-sources/src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `storage/table.rs` -> `["storage", "table"]`; `ops/cdc/mod.rs` -> `["ops", "cdc"]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The module paths `text` (the file of `module`, see [`module_path`]) names as
/// `crate::a::b` or `super::b` (as far as they go through modules: lower-case segments),
/// without test modules' lines.
fn references(text: &str, module: &[String]) -> BTreeSet<Vec<String>> {
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    // Comments (doc links among them) import nothing.
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let code = code.as_str();
    let mut out = BTreeSet::new();
    let mut starts: Vec<(usize, Vec<String>)> = code
        .match_indices("crate::")
        .filter(|(i, _)| !code[..*i].ends_with("super::"))
        .map(|(i, m)| (i + m.len(), Vec::new()))
        .collect();
    for (i, _) in code.match_indices("super::") {
        if code[..i].ends_with("super::") {
            continue; // counted from the first `super::` of the chain
        }
        let mut rest = i;
        let mut ups = 0;
        while code[rest..].starts_with("super::") {
            rest += "super::".len();
            ups += 1;
        }
        // `super` is the parent of the module (of the folder, for a `mod.rs`).
        let base = module.len().saturating_sub(ups);
        starts.push((rest, module[..base].to_vec()));
    }
    for (at, base) in starts {
        let rest = &code[at..];
        let mut path = base;
        for seg in rest.split("::") {
            let name: String = seg
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let is_module = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                && seg.len() >= name.len();
            if name.is_empty() || !is_module {
                break;
            }
            path.push(name.clone());
            if seg.len() > name.len() {
                break;
            }
        }
        if !path.is_empty() {
            out.insert(path);
        }
    }
    // `use crate::{a, b::c}` groups.
    for (i, _) in code.match_indices("use crate::{") {
        let rest = &code[i + "use crate::{".len()..];
        let group = &rest[..rest.find("};").unwrap_or(rest.len())];
        for item in group.split(',') {
            let first: String = item
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if first.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                out.insert(vec![first]);
            }
        }
    }
    out
}

fn layer_of(path: &[String]) -> Option<usize> {
    LAYERS
        .iter()
        .position(|l| path.first().is_some_and(|p| p == l))
}

/// Every module of the crate at `src` and the modules it names (its own submodules and
/// modules outside the crate left out).
struct ImportGraph {
    modules: BTreeMap<Vec<String>, PathBuf>,
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn import_graph(src: &Path) -> ImportGraph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_path(src, f), f.clone()))
        .collect();
    // The file a reference lands in: the longest module path that is a prefix of it.
    let resolve = |r: &[String]| -> Option<Vec<String>> {
        (1..=r.len())
            .rev()
            .map(|n| r[..n].to_vec())
            .find(|p| modules.contains_key(p))
    };
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &modules {
        if module.is_empty() || module == &["lib"] {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("readable");
        for r in references(&text, module) {
            let Some(target) = resolve(&r) else { continue };
            if &target == module || target.starts_with(module) {
                continue;
            }
            edges.entry(module.clone()).or_default().insert(target);
        }
    }
    ImportGraph { modules, edges }
}

/// Import cycles between files, each as `a -> b -> a`.
fn cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut state: BTreeMap<Vec<String>, u8> = BTreeMap::new();
    fn visit(
        m: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
        problems: &mut Vec<String>,
    ) {
        match state.get(m) {
            Some(2) => return,
            Some(1) => {
                let from = stack.iter().position(|s| s == m).unwrap_or(0);
                let cycle: Vec<String> = stack[from..]
                    .iter()
                    .chain(std::iter::once(m))
                    .map(|s| s.join("::"))
                    .collect();
                problems.push(format!("import cycle: {}", cycle.join(" -> ")));
                return;
            }
            _ => {}
        }
        state.insert(m.clone(), 1);
        stack.push(m.clone());
        for n in edges.get(m).into_iter().flatten() {
            // A module and its own submodules (a folder's mod.rs and its files) are one.
            if n.starts_with(m) || m.starts_with(n) {
                continue;
            }
            visit(n, edges, state, stack, problems);
        }
        stack.pop();
        state.insert(m.clone(), 2);
    }
    for m in edges.keys() {
        visit(m, edges, &mut state, &mut Vec::new(), &mut problems);
    }
    problems
}

#[test]
fn modules_name_only_their_layer_and_the_layers_below() {
    let graph = import_graph(&src_dir());
    let mut problems = Vec::new();
    for (module, file) in &graph.modules {
        if module.is_empty() || module == &["lib"] {
            continue;
        }
        let Some(own) = layer_of(module) else {
            problems.push(format!(
                "{}: not in a layer ({})",
                file.display(),
                LAYERS.join(", ")
            ));
            continue;
        };
        for target in graph.edges.get(module).into_iter().flatten() {
            let Some(theirs) = layer_of(target) else {
                continue;
            };
            if theirs > own {
                problems.push(format!(
                    "{}: names crate::{} of layer {}, above its own layer {}",
                    file.display(),
                    target.join("::"),
                    LAYERS[theirs],
                    LAYERS[own]
                ));
            }
            if own == theirs
                && LAYERS[own] == "ops"
                && module.get(1) != target.get(1)
                && target.len() > 1
            {
                problems.push(format!(
                    "{}: names crate::{}, another ops folder (share it through a lower layer)",
                    file.display(),
                    target.join("::")
                ));
            }
        }
    }
    problems.extend(cycles(&graph.edges));
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_database_sources_crate_has_no_import_cycle() {
    let graph = import_graph(&sources_src_dir());
    assert!(graph.modules.len() > 5, "read strata-sources' files");
    let problems = cycles(&graph.edges);
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The checker itself finds what it looks for.
#[test]
fn references_are_read_from_use_lines_and_paths() {
    let text = "use crate::storage::table::{open, create};\nuse crate::{util, sql::query};\n\
                fn f() { crate::ops::cdc::run(); }\n#[cfg(test)]\nmod tests { use crate::runtime; }";
    let refs = references(text, &["sql".into(), "query".into()]);
    assert!(refs.contains(&vec!["storage".into(), "table".into()]));
    assert!(refs.contains(&vec!["util".into()]));
    assert!(refs.contains(&vec!["sql".into()]));
    assert!(refs.contains(&vec!["ops".into(), "cdc".into(), "run".into()]));
    assert!(
        !refs.iter().any(|r| r[0] == "runtime"),
        "test code is not counted"
    );
}

#[test]
fn super_paths_resolve_against_the_file_and_a_cycle_is_found() {
    let runtime = |m: &str| vec!["runtime".to_string(), m.to_string()];
    // A file's `super` is its folder; a folder's mod.rs's `super` is the folder's parent.
    let refs = references("use super::store_upkeep::Forget;", &runtime("upkeep"));
    assert!(refs.contains(&runtime("store_upkeep")), "{refs:?}");
    let refs = references(
        "use super::super::ingest::files;",
        &["ops".into(), "cdc".into(), "run".into()],
    );
    assert!(
        refs.contains(&vec!["ops".into(), "ingest".into(), "files".into()]),
        "{refs:?}"
    );
    // In `pg/mod.rs` (module `pg`), `super` is the crate root.
    let refs = references("use super::lsn::Lsn;", &["pg".into()]);
    assert!(refs.contains(&vec!["lsn".into()]), "{refs:?}");
    let edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = [
        (runtime("upkeep"), [runtime("store_upkeep")].into()),
        (runtime("store_upkeep"), [runtime("upkeep")].into()),
    ]
    .into();
    assert_eq!(cycles(&edges).len(), 1);
}
