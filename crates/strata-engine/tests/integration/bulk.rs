//! Bulk loads in bounded memory (`ops/cdc/bulk.rs`): a first load of more events than the
//! run's memory limit holds is split into parts by a hash of the key on local disk, and
//! folded and written to the event store and the target a part at a time. Its targets, event store and later batches equal those of the in-memory path on
//! the same files; a target lost after the store's commit is rebuilt from the store.

use crate::common;

use deltalake::arrow::array::{ArrayRef, Int64Array, StringArray};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use strata_engine::Warehouse;

const PIPELINE: &str = "\
CREATE OR REFRESH STREAMING TABLE raw AS SELECT * FROM STREAM read_files('data', format => 'parquet');
CREATE OR REFRESH STREAMING TABLE t2;
CREATE FLOW f2 AS AUTO CDC INTO t2 FROM STREAM(raw) KEYS (id)
  APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)
  STORED AS SCD TYPE 2;
CREATE OR REFRESH STREAMING TABLE t1;
CREATE FLOW f1 AS AUTO CDC INTO t1 FROM STREAM(raw) KEYS (id, part)
  APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq);
";

/// A file of `events` change events over `keys` keys (id, part), in shuffled sequence
/// order (late events), with deletes, no-op repeats and exact duplicates.
fn write_events(path: &Path, events: usize, keys: u64, seq_base: i64, seed: u64) {
    let mut x = seed;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 17
    };
    let (mut id, mut part, mut v, mut seq, mut op) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..events {
        let r = next();
        let k = r % keys;
        id.push(k as i64);
        part.push(format!("p{}", k % 3));
        // Few values per key, so that many updates are no-ops.
        v.push(format!("v{}", (r >> 20) % 4));
        // Unique per event (no ties), in shuffled order.
        seq.push(seq_base + ((i as i64 * 7919) % events as i64));
        op.push(if (r >> 30) % 10 == 0 {
            "DELETE"
        } else {
            "UPSERT"
        });
    }
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from(id))),
        ("part", Arc::new(StringArray::from(part))),
        ("v", Arc::new(StringArray::from(v))),
        ("seq", Arc::new(Int64Array::from(seq))),
        ("op", Arc::new(StringArray::from(op))),
    ];
    common::write_parquet(path, columns, &[]);
}

/// Runs the pipeline with `memory` as the run's memory limit (`None`: the default).
async fn run(pipeline: &Path, wh: &Warehouse, memory: Option<&str>) -> strata_engine::RunReport {
    let mut conf = BTreeMap::new();
    if let Some(m) = memory {
        conf.insert(strata_engine::memory::CONFIG_KEY.to_string(), m.to_string());
    }
    strata_engine::run_pipeline_file_with(pipeline, wh, &conf)
        .await
        .unwrap_or_else(|e| panic!("run: {e}"))
}

/// Every table a run writes, as sorted text.
async fn contents(wh: &Warehouse) -> Vec<String> {
    let mut out = Vec::new();
    for sql in [
        "SELECT * FROM t2 ORDER BY id, __START_AT",
        "SELECT * FROM t1 ORDER BY id, part",
        "SELECT count(*) AS n, count(DISTINCT id) AS keys FROM t2 WHERE __END_AT IS NULL",
    ] {
        out.push(common::query_text(wh, sql).await);
    }
    out
}

/// The event store of `target`: its events as sorted text (the run numbers left out).
fn store_events(wh_dir: &Path, target: &str) -> Vec<String> {
    use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let dir = wh_dir.join("_strata/default").join(target).join("events");
    let mut rows = Vec::new();
    for e in std::fs::read_dir(&dir).expect("store") {
        let p = e.expect("entry").path();
        if p.extension().is_none_or(|x| x != "parquet") {
            continue;
        }
        let file = std::fs::File::open(&p).expect("open");
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet")
            .build()
            .expect("reader");
        for b in reader {
            let b = b.expect("batch");
            let shown: Vec<ArrayRef> = b.columns()[..b.num_columns() - 1].to_vec();
            let formatters: Vec<_> = shown
                .iter()
                .map(|a| {
                    deltalake::arrow::util::display::ArrayFormatter::try_new(
                        a.as_ref(),
                        &Default::default(),
                    )
                    .expect("formatter")
                })
                .collect();
            for i in 0..b.num_rows() {
                let row: Vec<String> = formatters.iter().map(|f| f.value(i).to_string()).collect();
                rows.push(row.join("|"));
            }
        }
    }
    rows.sort();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_load_in_a_small_memory_limit_equals_the_in_memory_load() {
    let (bounded_dir, pipeline, bounded_wh_dir, bounded) = common::project(PIPELINE);
    let (memory_dir, memory_pipeline, memory_wh_dir, in_memory) = common::project(PIPELINE);
    for (n, seed) in [(0, 7), (1, 11), (2, 13), (3, 19)] {
        for dir in [bounded_dir.path(), memory_dir.path()] {
            let file = dir.join(format!("data/{n:03}.parquet"));
            write_events(&file, 75_000, 20_000, n * 1_000_000, seed);
        }
    }
    // 300,000 events: in a 16 MiB limit the first load is a bulk load, split into parts;
    // with the default limit it is folded in memory.
    let report = run(&pipeline, &bounded, Some("16MiB")).await;
    assert_eq!(report.flows.len(), 2);
    for f in &report.flows {
        assert_eq!(f.events, 300_000, "{f:?}");
        assert!(f.versions_opened > 0 || f.keys_upserted > 0, "{f:?}");
        // 300,000 events at 200 bytes each, and a quarter to spare: 5 parts of 16 MiB.
        let note = f
            .notes
            .iter()
            .find(|n| n.starts_with("bulk load: 300000 event(s) folded in 5 part(s)"))
            .unwrap_or_else(|| panic!("a bulk load: {:?}", f.notes));
        assert!(note.contains("on local disk"), "{note}");
    }
    let report_in_memory = run(&memory_pipeline, &in_memory, None).await;
    assert!(
        report_in_memory
            .flows
            .iter()
            .all(|f| f.notes.iter().all(|n| !n.starts_with("bulk load"))),
        "the default limit folds 300,000 events in memory"
    );
    // By flow name: the two flows run side by side, in either order.
    let counts = |r: &strata_engine::RunReport| -> Vec<(String, usize, usize, usize, usize)> {
        let mut c: Vec<_> = r
            .flows
            .iter()
            .map(|f| {
                (
                    f.flow.clone(),
                    f.rows_inserted,
                    f.versions_opened,
                    f.keys_upserted,
                    f.keys_touched,
                )
            })
            .collect();
        c.sort();
        c
    };
    assert_eq!(counts(&report), counts(&report_in_memory));
    assert_eq!(contents(&bounded).await, contents(&in_memory).await);
    for t in ["t1", "t2"] {
        let (a, b) = (
            store_events(&bounded_wh_dir, t),
            store_events(&memory_wh_dir, t),
        );
        assert_eq!(a.len(), 300_000, "{t}: every event stored once");
        assert!(a == b, "{t}: the event stores differ");
    }
    let violations = strata_engine::validate(&bounded, "t2")
        .await
        .expect("validate");
    assert!(violations.is_empty(), "{violations:?}");

    // A later batch of late events and deletes over both: the stores serve it the same.
    for dir in [bounded_dir.path(), memory_dir.path()] {
        write_events(&dir.join("data/004.parquet"), 5_000, 25_000, -500_000, 17);
    }
    run(&pipeline, &bounded, Some("16MiB")).await;
    run(&memory_pipeline, &in_memory, None).await;
    assert_eq!(contents(&bounded).await, contents(&in_memory).await);

    // A bulk load killed after its event-store commit leaves no target rows: here the
    // targets are dropped after a fresh bulk load, and the next run rebuilds them from the
    // stores alone, in bounded memory.
    let (again_dir, again_pipeline, again_wh_dir, again) = common::project(PIPELINE);
    for n in 0..5 {
        std::fs::copy(
            bounded_dir.path().join(format!("data/{n:03}.parquet")),
            again_dir.path().join(format!("data/{n:03}.parquet")),
        )
        .expect("copy");
    }
    run(&again_pipeline, &again, Some("16MiB")).await;
    for t in ["t1", "t2"] {
        std::fs::remove_dir_all(again_wh_dir.join("default").join(t)).expect("drop target");
    }
    let rebuilt = run(&again_pipeline, &again, Some("16MiB")).await;
    assert!(
        rebuilt.flows.iter().all(|f| f.recovered),
        "{:?}",
        rebuilt.flows
    );
    assert_eq!(contents(&again).await, contents(&in_memory).await);
}

#[tokio::test]
async fn a_memory_limit_that_is_not_a_size_is_refused_by_name() {
    let (_dir, pipeline, _wh_dir, wh) = common::project(PIPELINE);
    let mut conf = BTreeMap::new();
    conf.insert(
        strata_engine::memory::CONFIG_KEY.to_string(),
        "plenty".to_string(),
    );
    let err = strata_engine::run_pipeline_file_with(&pipeline, &wh, &conf)
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("strata.memoryLimit") && text.contains("plenty"),
        "{text}"
    );
}
