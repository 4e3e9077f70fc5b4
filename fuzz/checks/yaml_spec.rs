//! A YAML pipeline spec through `strata_engine::load_pipeline` and `plan_sources` (what
//! `strata run spec.yaml` and `strata plan` do before anything runs): nothing panics, and
//! every error names the spec file (docs/yaml-spec.md: "every error names the spec file")
//! or, for a library's SQL, that library.
//!
//! Shared by the cargo-fuzz target (fuzz/fuzz_targets/yaml_spec.rs) and the workspace
//! smoke test (crates/strata-engine/tests/fuzz_smoke.rs).

use std::collections::BTreeMap;

/// A library the fuzzed spec may name (`libraries: [lib.sql]`, as the seeds do).
const LIBRARY: &str = "CREATE OR REFRESH STREAMING TABLE orders_raw AS SELECT * FROM STREAM \
     read_files('${source_root}/orders', format => 'json', schema => 'id INT, amount INT, ts BIGINT');\n\
     CREATE MATERIALIZED VIEW totals AS SELECT sum(amount) AS total FROM orders_raw;\n";

/// The check on one input; a panic (on any thread) is a finding.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `libraries` are files read from disk: keep the harness away from devices and the
    // like, which may never end.
    if ["/dev", "/proc", "/sys", "\\\\"]
        .iter()
        .any(|p| text.contains(p))
    {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = dir.path().join("spec.yaml");
    std::fs::write(&spec, text).expect("write spec");
    std::fs::write(dir.path().join("lib.sql"), LIBRARY).expect("write library");
    let named = |message: &str| {
        message.contains("spec.yaml") || message.contains(".sql") || message.contains("tables[")
    };
    let conf = BTreeMap::new();
    let loaded = match strata_engine::load_pipeline(&spec, &conf) {
        Ok(l) => l,
        Err(e) => {
            let message = strata_engine::chain(&e);
            assert!(named(&message), "error names no file: {message}");
            return;
        }
    };
    // As `strata plan` does: the spec's catalog, else the default one.
    let catalog = loaded.catalog.as_deref().unwrap_or("main");
    match strata_engine::plan_sources(
        &loaded.sources,
        &loaded.configuration,
        &loaded.schema,
        catalog,
    ) {
        Ok(planned) => {
            let _ = planned.steps();
        }
        Err(e) => {
            let message = strata_engine::chain(&e);
            assert!(
                !matches!(e, strata_engine::EngineError::Internal(_)),
                "internal error: {message}"
            );
            let sources: Vec<&str> = loaded.sources.iter().map(|s| s.name.as_str()).collect();
            assert!(
                named(&message) || sources.iter().any(|s| message.contains(s)),
                "error names none of {sources:?}: {message}"
            );
        }
    }
}
