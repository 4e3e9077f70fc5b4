//! A batch that changes 20,000 keys, run from a test thread (a small stack):
//! the key predicate of the target rewrite is walked recursively by delta-rs, so the engine
//! runs that write on deep-stack threads of its own. Before it did, this overflowed.

use strata_engine::Warehouse;

#[tokio::test]
async fn a_batch_changing_20k_keys_runs_on_a_small_stack() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    let pipeline = dir.path().join("pipeline.sql");
    std::fs::write(
        &pipeline,
        "CREATE OR REFRESH STREAMING TABLE raw AS SELECT * FROM STREAM read_files('data', \
         format => 'csv', header => true, schema => 'id BIGINT, v STRING, seq BIGINT');\n\
         CREATE OR REFRESH STREAMING TABLE t;\n\
         CREATE FLOW f AS AUTO CDC INTO t FROM STREAM(raw) KEYS (id) SEQUENCE BY seq \
         COLUMNS * EXCEPT (seq);\n",
    )
    .expect("write");
    let wh = Warehouse::open(dir.path().join("warehouse")).expect("warehouse");
    let n = 20_000;
    for (file, value, seq) in [("001.csv", "a", 1), ("002.csv", "b", 2)] {
        let mut csv = String::from("id,v,seq\n");
        for i in 0..n {
            csv.push_str(&format!("{i},{value},{seq}\n"));
        }
        std::fs::write(dir.path().join("data").join(file), csv).expect("write");
        let report = strata_engine::run_pipeline_file(&pipeline, &wh)
            .await
            .expect("run");
        assert_eq!(report.flows[0].keys_changed, n);
    }
    let (_, batches) = strata_engine::query(&wh, "SELECT v, count(*) AS n FROM t GROUP BY v")
        .await
        .expect("query");
    let rows: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            let text =
                deltalake::arrow::util::pretty::pretty_format_batches(std::slice::from_ref(b))
                    .expect("format")
                    .to_string();
            text.lines()
                .filter(|l| l.starts_with("| b") || l.starts_with("| a"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(rows, vec![format!("| b | {n} |")]);
}
