//! What an ingestion took and its commit: the rows written (the table created on its first
//! run, columns added when its schema evolves), then the downstream flows' events handed over.
//! The commit records what was taken: the files (`files_commit`), a source's version or
//! watermark, a once flow's run.

use crate::error::{Context, Result};
use crate::ops::ingest::autoload;
use crate::ops::ingest::IngestReport;
use crate::ops::ingest::IngestSetup;
use crate::ops::ingest::Source;
use crate::ops::ingest::KEEP_LOG_PROPERTY;
use crate::ops::Scope;
use crate::storage::adopt;
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::write::{write_rows, RowChange};
use crate::util::steps::{step, Steps};
use deltalake::arrow::array::RecordBatch;
use deltalake::DeltaTable;
use std::collections::HashMap;

/// Work that must wait until a take's commit is in, and never runs if it fails.
pub(super) type AfterCommit = Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send>;

/// What one ingestion takes, checked, before its commit.
pub(super) struct Taken {
    /// Rows to write (their files are written at the commit).
    pub(super) parts: Vec<RecordBatch>,
    /// Parquet input files taken into the table as they are (`storage/adopt.rs`).
    pub(super) reused: Vec<adopt::Reusable>,
    /// Data files the take already wrote into the table's folder (a first load written as
    /// it was read), committed with the rest.
    pub(super) written: Written,
    /// The downstream flows' events of the rows taken, handed over after the commit.
    pub(super) events: HashMap<String, Vec<RecordBatch>>,
    /// What the commit records (the files, source version or watermark taken).
    pub(super) commit: PendingCommit,
    /// What to do once the commit is in (a CDC source's slot is advanced).
    pub(super) after_commit: Option<AfterCommit>,
    /// The table as of the last chunk a take committed itself (a large watermark load),
    /// which this commit builds on: a writer that recorded the same position since then
    /// makes it conflict.
    pub(super) base: Option<DeltaTable>,
}

impl Taken {
    /// Rows to write and their flows' events, with what the commit records; no input file
    /// reused, nothing to do after the commit, no chunk committed before.
    pub(super) fn rows(
        parts: Vec<RecordBatch>,
        events: HashMap<String, Vec<RecordBatch>>,
        commit: PendingCommit,
    ) -> Self {
        Taken {
            parts,
            reused: Vec::new(),
            written: Written::default(),
            events,
            commit,
            after_commit: None,
            base: None,
        }
    }
}

/// Data files written before the commit, and the rows they hold.
#[derive(Default)]
pub(super) struct Written {
    pub(super) adds: Vec<deltalake::kernel::Add>,
    pub(super) rows: usize,
}

/// Commits what was taken in one commit (creating the table on its first run, adding
/// columns when its schema evolves), then hands the downstream flows' events over. Returns
/// the version committed.
pub(super) async fn commit_rows(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<DeltaTable>,
    mut taken: Taken,
    report: &mut IngestReport,
) -> Result<i64> {
    let name = &setup.table.name;
    report.rows += taken.parts.iter().map(RecordBatch::num_rows).sum::<usize>();
    report.rows += taken.written.rows;
    if taken.parts.is_empty() && taken.reused.is_empty() && taken.written.adds.is_empty() {
        // The input is taken even when the query keeps none of its rows.
        taken
            .parts
            .push(RecordBatch::new_empty(setup.schema.clone()));
    }
    let table = match existing {
        Some(t) => t,
        None => create_table(scope, setup).await?,
    };
    if setup.once {
        // A once flow's record (`once.rs`): at the version this commit creates, which it
        // must land on exactly (another writer first makes it a conflict).
        let next = crate::storage::table::version_of(&table) + 1;
        taken.commit = taken
            .commit
            .at(AppId::Once(setup.flow_name()), next)
            .exactly_next();
    }
    if setup.evolve {
        if !taken.written.adds.is_empty() {
            return Err(crate::error::EngineError::internal(
                "files written ahead of a commit that evolves the schema",
            ));
        }
        let written = write_rows(table, taken.parts, RowChange::AppendEvolving, &taken.commit)
            .await
            .context(|| format!("streaming table {name}: committing"))?;
        return Ok(written.version().map_or(-1, |v| v as i64));
    }
    // The version before, as a downstream flow's position counts it (`None`: no data files
    // yet); unknown when the table state cannot be read.
    let before = table
        .snapshot()
        .ok()
        .map(|s| (s.log_data().num_files() > 0).then(|| crate::storage::table::version_of(&table)));
    let steps = Steps::new(setup.flow_name(), "ingest: ");
    let table_dir = scope.wh.table_location(name);
    let mut adds = Vec::with_capacity(taken.reused.len());
    for f in &taken.reused {
        adds.push(adopt::copy_in(f, &table_dir).await?);
    }
    if !adds.is_empty() {
        step!(debug, steps, "copied the reused parquet files in");
    }
    adds.append(&mut taken.written.adds);
    let after = crate::storage::write::append(&table, taken.parts, adds, &taken.commit).await?;
    step!(debug, steps, "appended and committed");
    if let (Some(before), true) = (before, after >= 0) {
        scope.handoff.keep(name, before, after, taken.events);
    }
    Ok(after)
}

/// Creates the streaming table with its declared properties; one that takes files keeps
/// its whole log (see [`files_commit`]), for other writers (Spark, delta-rs) too.
pub(super) async fn create_table(scope: &Scope<'_>, setup: &IngestSetup) -> Result<DeltaTable> {
    let properties = &setup.table.properties;
    let mut configuration = crate::storage::table::table_configuration(properties);
    // A change-history table's log also records the source's table id next to its
    // position: kept like the record of files taken.
    let keeps_log = matches!(
        setup.source,
        Source::Files { .. } | Source::Database { .. } | Source::Changes(_)
    );
    if keeps_log && !crate::storage::table::sets_property(properties, KEEP_LOG_PROPERTY) {
        configuration.push((KEEP_LOG_PROPERTY.to_string(), Some("false".to_string())));
    }
    if let Source::Database { layout, .. } = &setup.source {
        for (property, columns) in layout.properties() {
            if !crate::storage::table::sets_property(properties, property) {
                configuration.push((property.to_string(), Some(columns)));
            }
        }
    }
    if matches!(setup.source, Source::Changes(_)) {
        match properties.get(APPEND_ONLY_PROPERTY) {
            Some(v) if !v.eq_ignore_ascii_case("true") => {
                return Err(setup.err(format!(
                    "'{APPEND_ONLY_PROPERTY}' = '{v}': a change-history table is append-only; \
                     leave the property out"
                )))
            }
            Some(_) => {}
            None => configuration.push((APPEND_ONLY_PROPERTY.to_string(), Some("true".into()))),
        }
    }
    let name = &setup.table.name;
    let partitions = &setup.table.partitioned_by;
    crate::storage::table::check_partition_columns(&setup.schema, partitions)
        .map_err(|e| setup.err(e))?;
    crate::storage::table::create_delta(
        &scope.wh.table_location(name),
        &name.name,
        &setup.schema,
        configuration,
        setup.table.comment.as_deref(),
        partitions.clone(),
    )
    .await
}

/// Delta's switch refusing every commit that removes or changes rows.
const APPEND_ONLY_PROPERTY: &str = "delta.appendOnly";

/// The commit of a run taking files `new`: the files (and the inferred input columns) in
/// its commit info, the next count of [`AppId::Files`], and a log that must not be trimmed:
/// the files taken are recorded only there (Delta writers delete expired commit files once
/// a checkpoint covers them, and the next run would take their files again).
pub(super) async fn files_commit(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    new: &[String],
) -> Result<PendingCommit> {
    let id = AppId::Files(setup.append_flow.as_deref());
    let previous = match existing {
        Some(t) => position(t, id).await?,
        None => None,
    };
    let mut commit = PendingCommit::of_run(scope.run_id)
        .keeping_log()
        .with_info(setup.files_key(), serde_json::json!(new))
        .at(id, previous.map_or(0, |v| v + 1));
    if let Source::Files {
        mode: autoload::Mode::Autoload { inferred: true, .. },
        input: Some(columns),
        ..
    } = &setup.source
    {
        commit = commit.with_info(
            setup.schema_key(),
            crate::storage::ledger::columns_to_json(columns),
        );
    }
    Ok(commit)
}
