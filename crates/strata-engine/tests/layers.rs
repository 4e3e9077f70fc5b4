//! The engine's layers, checked over its source: each module names (`crate::...`) only
//! modules of its own layer or of the layers below it, no `ops` folder names another, and no
//! two files name each other, directly or through others. The layers, bottom up, are listed
//! in `LAYERS` and at the top of `src/lib.rs`.

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
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src_dir()).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The module paths `text` names as `crate::a::b` (as far as they go through modules:
/// lower-case segments), without test modules' lines.
fn references(text: &str) -> BTreeSet<Vec<String>> {
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let mut path = Vec::new();
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

#[test]
fn modules_name_only_their_layer_and_the_layers_below() {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    files.sort();
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.iter().map(|f| (module_path(f), f.clone())).collect();
    // The file a reference lands in: the longest module path that is a prefix of it.
    let resolve = |r: &[String]| -> Option<Vec<String>> {
        (1..=r.len())
            .rev()
            .map(|n| r[..n].to_vec())
            .find(|p| modules.contains_key(p))
    };
    let mut problems = Vec::new();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &modules {
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
        let text = std::fs::read_to_string(file).expect("readable");
        for r in references(&text) {
            let Some(target) = resolve(&r) else { continue };
            if &target == module || target.starts_with(module) {
                continue;
            }
            let Some(theirs) = layer_of(&target) else {
                continue;
            };
            if theirs > own {
                problems.push(format!(
                    "{}: names crate::{} of layer {}, above its own layer {}",
                    file.display(),
                    r.join("::"),
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
                    r.join("::")
                ));
            }
            edges.entry(module.clone()).or_default().insert(target);
        }
    }
    // No cycles: files of one layer import each other in one direction only.
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
        visit(m, &edges, &mut state, &mut Vec::new(), &mut problems);
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The checker itself finds what it looks for.
#[test]
fn references_are_read_from_use_lines_and_paths() {
    let text = "use crate::storage::table::{open, create};\nuse crate::{util, sql::query};\n\
                fn f() { crate::ops::cdc::run(); }\n#[cfg(test)]\nmod tests { use crate::runtime; }";
    let refs = references(text);
    assert!(refs.contains(&vec!["storage".into(), "table".into()]));
    assert!(refs.contains(&vec!["util".into()]));
    assert!(refs.contains(&vec!["sql".into()]));
    assert!(refs.contains(&vec!["ops".into(), "cdc".into(), "run".into()]));
    assert!(
        !refs.iter().any(|r| r[0] == "runtime"),
        "test code is not counted"
    );
}
