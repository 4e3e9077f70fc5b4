//! Helpers shared by the engine's integration tests.

use deltalake::arrow::array::{ArrayRef, RecordBatch};
use deltalake::parquet::arrow::ArrowWriter;
use std::path::{Path, PathBuf};
use strata_engine::Warehouse;

/// A fresh project: (a temporary directory with an empty `data/` folder, its `pipeline.sql`
/// holding `pipeline`, its `warehouse/` directory, the warehouse opened there).
#[allow(dead_code)] // not every test binary sets up a project
pub fn project(pipeline: &str) -> (tempfile::TempDir, PathBuf, PathBuf, Warehouse) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir");
    let pipeline_path = dir.path().join("pipeline.sql");
    std::fs::write(&pipeline_path, pipeline).expect("write");
    let wh_dir = dir.path().join("warehouse");
    let wh = Warehouse::open(&wh_dir).expect("warehouse");
    (dir, pipeline_path, wh_dir, wh)
}

/// The result of `sql` over the warehouse as an aligned text grid (Arrow's pretty format).
pub async fn query_text(wh: &Warehouse, sql: &str) -> String {
    let (_, batches) = strata_engine::query(wh, sql).await.expect("query");
    deltalake::arrow::util::pretty::pretty_format_batches(&batches)
        .expect("format")
        .to_string()
}

/// Writes `columns` (name, values; all nullable unless `required` names them) to the
/// Parquet file `path`, as pyarrow or DuckDB would.
#[allow(dead_code)] // not every test binary writes Parquet
pub fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>, required: &[&str]) {
    use deltalake::arrow::datatypes::{Field, Schema};
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), !required.contains(n)))
        .collect();
    let schema = std::sync::Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns.into_iter().map(|c| c.1).collect())
        .expect("batch");
    let out = std::fs::File::create(path).expect("create");
    let mut writer = ArrowWriter::try_new(out, schema, None).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
}

/// Puts `data/NNN.json` (one row, `id` = `n`) beside the others, runs `pipeline`, and checks
/// that its one streaming table took exactly that file.
pub async fn run_adding(pipeline: &Path, wh: &Warehouse, data: &Path, n: usize) {
    std::fs::write(
        data.join(format!("{n:03}.json")),
        format!("{{\"id\": {n}}}\n"),
    )
    .expect("write");
    let report = strata_engine::run_pipeline_file(pipeline, wh)
        .await
        .unwrap_or_else(|e| panic!("run {n}: {e}"));
    assert_eq!(
        report.ingests[0].files,
        vec![format!("{n:03}.json")],
        "run {n} takes exactly its new file"
    );
}
