//! Change-history tables: `STREAM table_changes('orders' | 'path/to/table', startingVersion
//! => 0)` reads the change data feed of any Delta table with `delta.enableChangeDataFeed =
//! true` and appends every change row (`insert`, `delete`, `update_preimage`,
//! `update_postimage`, with `_commit_version` and `_commit_timestamp`) to an append-only
//! table.
//!
//! ```text
//!  position (txn strata-history:<source>) ─▶ versions needed ─▶ still readable? ─┬─ yes: the feed
//!  + source table id (commit info)            (after it, up to                   └─ no: fail, or a
//!                                              the latest)                          snapshot of the
//!                                                                                   source (option)
//! ```
//!
//! The position and the source's table id are recorded in the commit that appends the rows,
//! so a crash before it leaves nothing and a re-run takes the same versions again. Before
//! reading, every version the table still needs is checked: its commit file must still be
//! in the source's log (log cleanup removes old ones) and the files the feed reads (change
//! files, or the data files added or removed) must still be on disk (VACUUM removes them);
//! the source's table id must be the one recorded (a table dropped and created again has a
//! new one, and versions that start again from 0). When anything is gone the run fails,
//! naming the versions and the ways out, unless `onMissingVersions => 'snapshot'`: then
//! the source's current rows are written with `_change_type = 'snapshot'` at its latest
//! version, the gap is reported (and recorded in the event log), and later runs go on from
//! there.

use crate::error::{Context, EngineError, Result};
use crate::ops::ingest::commit::Taken;
use crate::ops::ingest::rows::{checked_rows, Running};
use crate::ops::ingest::{IngestReport, IngestSetup, Source};
use crate::ops::Scope;
use crate::storage::changes::read_commit;
use crate::storage::commit::{position, AppId, PendingCommit};
use crate::storage::feed;
use crate::storage::location::Location;
use crate::storage::warehouse::Warehouse;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use deltalake::arrow::array::TimestampMicrosecondArray;
use deltalake::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::kernel::Action;
use deltalake::DeltaTable;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use strata_sql::{ChangeSource, TableChanges, TableName};

/// The commit-info entry recording the source's table id next to the position.
const TABLE_ID_KEY: &str = "strata.history.tableId";
/// `_change_type` of the rows of a snapshot taken over a gap.
pub(crate) const SNAPSHOT: &str = "snapshot";

/// A `table_changes` source, its options checked.
#[derive(Debug, Clone)]
pub(crate) struct ChangesSpec {
    /// The source as written (a table name, qualified, or a path): the position's id.
    pub(crate) label: String,
    pub(crate) at: ChangesAt,
    pub(crate) start: Start,
    pub(crate) on_missing: OnMissing,
}

#[derive(Debug, Clone)]
pub(crate) enum ChangesAt {
    Table(TableName),
    Path(Location),
}

/// Where the first run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// `startingVersion => v`: that version included.
    Version(i64),
    /// `startingTimestamp => '...'`: the first version committed at or after it.
    Timestamp(DateTime<Utc>),
    /// Neither (as Databricks' `readChangeFeed` stream): the source's current rows as
    /// `insert`s at its latest version, then its changes.
    Latest,
}

/// What a run does when versions it needs are gone from the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnMissing {
    Fail,
    Snapshot,
}

/// The option that chooses [`OnMissing`].
const ON_MISSING: &str = "onMissingVersions";

/// Checks the options of `tc`; paths resolve against the pipeline's folder `dir`.
pub(crate) fn spec_of(tc: &TableChanges, dir: &Path) -> std::result::Result<ChangesSpec, String> {
    let (label, at) = match &tc.source {
        ChangeSource::Table(t) => (t.to_string(), ChangesAt::Table(t.clone())),
        ChangeSource::Path(p) => {
            let at = match Location::parse(p, "table_changes path").map_err(|e| e.to_string())? {
                Location::Local(path) => Location::Local(dir.join(path)),
                object => object,
            };
            (p.clone(), ChangesAt::Path(at))
        }
    };
    let mut start = Start::Latest;
    let mut on_missing = OnMissing::Fail;
    for (key, value) in &tc.options {
        match key.as_str() {
            "startingversion" => {
                let v = value.trim().parse::<i64>().ok().filter(|v| *v >= 0);
                start = Start::Version(v.ok_or_else(|| {
                    format!("startingVersion => {value}: expected a version number (0 or more)")
                })?);
            }
            "startingtimestamp" => start = Start::Timestamp(parse_timestamp(value)?),
            "onmissingversions" => {
                on_missing = match value.to_ascii_lowercase().as_str() {
                    "fail" => OnMissing::Fail,
                    "snapshot" => OnMissing::Snapshot,
                    other => {
                        return Err(format!(
                            "{ON_MISSING} => '{other}': expected 'fail' (the default) or 'snapshot'"
                        ))
                    }
                }
            }
            other => {
                return Err(format!(
                    "table_changes option `{other}` is not supported (startingVersion, \
                     startingTimestamp, {ON_MISSING})"
                ))
            }
        }
    }
    if tc.options.contains_key("startingversion") && tc.options.contains_key("startingtimestamp") {
        return Err("give startingVersion or startingTimestamp, not both".into());
    }
    Ok(ChangesSpec {
        label,
        at,
        start,
        on_missing,
    })
}

/// `2024-05-01`, `2024-05-01 10:00:00[.fff]` (UTC) or RFC 3339.
fn parse_timestamp(text: &str) -> std::result::Result<DateTime<Utc>, String> {
    let t = text.trim();
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Ok(d.with_timezone(&Utc));
    }
    for f in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(d) = NaiveDateTime::parse_from_str(t, f) {
            return Ok(d.and_utc());
        }
    }
    if let Some(d) = NaiveDate::parse_from_str(t, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
    {
        return Ok(d.and_utc());
    }
    Err(format!(
        "startingTimestamp => '{text}': expected a timestamp such as '2024-05-01 10:00:00' (UTC)"
    ))
}

impl ChangesSpec {
    /// The source table; `None` when there is none yet.
    pub(crate) async fn open(&self, wh: &Warehouse) -> Result<Option<DeltaTable>> {
        match &self.at {
            ChangesAt::Table(t) => wh.open_table(t).await,
            ChangesAt::Path(p) => crate::storage::table::open_delta(p).await,
        }
    }
}

/// The columns the query reads: the source's (this run's schema of a table the pipeline
/// writes, else the table's own) and the feed's three; `None` when the source has none yet.
pub(crate) async fn input_schema(
    wh: &Warehouse,
    spec: &ChangesSpec,
    known: &BTreeMap<TableName, SchemaRef>,
) -> Result<Option<SchemaRef>> {
    if let ChangesAt::Table(t) = &spec.at {
        if let Some(s) = known.get(t) {
            return Ok(Some(feed::feed_schema(s)));
        }
    }
    Ok(match spec.open(wh).await? {
        Some(t) => Some(feed::feed_schema(
            crate::storage::table::table_schema(&t)?.as_ref(),
        )),
        None => None,
    })
}

/// A change-history table's schema: the table's columns, each still produced by the query
/// with the same type, and the query's new columns after them (schema evolution); an error
/// with the way out for a column the source dropped or retyped.
pub(crate) fn evolved_schema(
    setup: &IngestSetup,
    planned: &SchemaRef,
    existing: &SchemaRef,
) -> Result<(SchemaRef, bool)> {
    let mut fields: Vec<deltalake::arrow::datatypes::Field> = existing
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    for e in existing.fields() {
        match planned.field_with_name(e.name()) {
            Err(_) => {
                return Err(setup.err(format!(
                    "column `{}` of this change-history table is no longer produced: its source \
                     dropped or renamed it. A history table keeps every column it has held; \
                     to go on, add the column back to the source, or produce it in the query \
                     (`SELECT *, CAST(NULL AS {}) AS {} FROM STREAM table_changes(...)`), or \
                     start a new history table",
                    e.name(),
                    crate::semantics::declared::spark_name(e.data_type()),
                    e.name()
                )))
            }
            Ok(p) => {
                let stored = crate::util::arrow::storage_type(p.data_type());
                if !crate::util::arrow::same_type(&stored, e.data_type()) {
                    return Err(setup.err(format!(
                        "column `{}` is now {} in the source but {} in this change-history \
                         table: a history table does not change a column's type. To go on, \
                         cast it back in the query (`SELECT * EXCEPT ({}), CAST({} AS {}) AS \
                         {} ...`), or start a new history table",
                        e.name(),
                        p.data_type(),
                        e.data_type(),
                        e.name(),
                        e.name(),
                        crate::semantics::declared::spark_name(e.data_type()),
                        e.name()
                    )));
                }
            }
        }
    }
    let mut evolve = false;
    for p in planned.fields() {
        if existing.field_with_name(p.name()).is_err() {
            evolve = true;
            fields.push(deltalake::arrow::datatypes::Field::new(
                p.name(),
                crate::util::arrow::storage_type(p.data_type()),
                true,
            ));
        }
    }
    Ok((
        Arc::new(deltalake::arrow::datatypes::Schema::new(fields)),
        evolve,
    ))
}

/// What a run reads from the source.
enum Read {
    /// The feed of these versions (both included).
    Feed { first: i64, last: i64 },
    /// The source's rows at `version`, with this `_change_type`.
    Snapshot { version: i64, change_type: String },
}

/// Versions a run needs that the source cannot give any more.
struct Gap {
    first: i64,
    last: i64,
    why: String,
}

/// The changes of the source since the table last took them (or from its start), checked
/// for gaps, run through the query; `None` (the report says why) when there are none.
pub(super) async fn take_changes(
    scope: &Scope<'_>,
    setup: &IngestSetup,
    existing: Option<&DeltaTable>,
    report: &mut IngestReport,
) -> Result<Option<Taken>> {
    let Source::Changes(spec) = &setup.source else {
        return Err(EngineError::internal("not a table_changes source"));
    };
    let Some(source) = spec.open(scope.wh).await? else {
        report.skipped = Some(format!("source {} has no data yet", spec.label));
        return Ok(None);
    };
    check_feed_enabled(setup, spec, &source)?;
    let table_id = source
        .snapshot()
        .context(|| format!("reading {}", spec.label))?
        .metadata()
        .id()
        .to_string();
    let id = AppId::History(&spec.label);
    let taken = match existing {
        Some(t) => position(t, id).await?,
        None => None,
    };
    let Some(read) = plan_read(setup, spec, &source, existing, taken, &table_id, report).await?
    else {
        return Ok(None);
    };
    let Some((df, last, place)) = read_rows(spec, &source, read, report).await? else {
        return Ok(None);
    };
    let running = Running::new(scope.wh, setup).await?;
    let mut events = HashMap::new();
    let (parts, _) = checked_rows(setup, &running, df, &place, report, &mut events).await?;
    let commit = PendingCommit::of_run(scope.run_id)
        .keeping_log()
        .with_info(
            TABLE_ID_KEY,
            serde_json::json!({"source": spec.label, "tableId": table_id}),
        )
        .at(id, last);
    Ok(Some(Taken::rows(parts, events, commit)))
}

/// The source must record a change data feed.
fn check_feed_enabled(setup: &IngestSetup, spec: &ChangesSpec, source: &DeltaTable) -> Result<()> {
    let props = crate::storage::table::table_properties(source)?;
    if !props
        .get("delta.enableChangeDataFeed")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Err(setup.err(format!(
            "source {} does not record a change data feed: set \
             'delta.enableChangeDataFeed' = 'true' on it (changes made before that are not \
             recorded; start from the version that set it)",
            spec.label
        )));
    }
    Ok(())
}

/// What this run reads: the feed after the recorded position (or after the start the
/// query names on a first run), a snapshot of the source, or nothing new (`None`, the
/// reason in the report).
async fn plan_read(
    setup: &IngestSetup,
    spec: &ChangesSpec,
    source: &DeltaTable,
    existing: Option<&DeltaTable>,
    taken: Option<i64>,
    table_id: &str,
    report: &mut IngestReport,
) -> Result<Option<Read>> {
    let latest = crate::storage::table::version_of(source);
    Ok(Some(match taken {
        Some(p) => {
            let recorded = match existing {
                Some(t) => recorded_table_id(t).await?,
                None => None,
            };
            let recreated = recorded.as_ref().is_some_and(|r| *r != table_id) || p > latest;
            if recreated {
                let gap = Gap {
                    first: p + 1,
                    last: p + 1,
                    why: format!(
                        "the source was recreated (its table id changed; the versions after \
                         {p} of the old table are gone; table id {table_id}, was {})",
                        recorded.unwrap_or_else(|| "unknown".into())
                    ),
                };
                on_gap(setup, spec, gap, latest, report)?
            } else if p >= latest {
                report.skipped = Some("no new changes".into());
                return Ok(None);
            } else {
                checked_range(setup, spec, source, p + 1, latest, report).await?
            }
        }
        None => match spec.start {
            Start::Version(v) if v > latest => {
                report.skipped = Some(format!(
                    "startingVersion {v} is after the source's latest version {latest}"
                ));
                return Ok(None);
            }
            Start::Version(v) => checked_range(setup, spec, source, v, latest, report).await?,
            Start::Timestamp(ts) => match first_version_at(source, ts, latest).await? {
                Some(v) => checked_range(setup, spec, source, v, latest, report).await?,
                None => {
                    report.skipped =
                        Some(format!("no version of {} committed since {ts}", spec.label));
                    return Ok(None);
                }
            },
            Start::Latest => Read::Snapshot {
                version: latest,
                change_type: "insert".into(),
            },
        },
    }))
}

/// The rows of `read` as a DataFrame, the source version they reach and how errors name
/// them; `None` when the feed holds only upkeep commits.
async fn read_rows(
    spec: &ChangesSpec,
    source: &DeltaTable,
    read: Read,
    report: &mut IngestReport,
) -> Result<Option<(deltalake::datafusion::prelude::DataFrame, i64, String)>> {
    Ok(Some(match read {
        Read::Feed { first, last } => {
            let changes = crate::storage::changes::changes_since(source, Some(first - 1)).await?;
            if changes.only_upkeep {
                report.skipped =
                    Some("no new changes (only upkeep commits such as OPTIMIZE)".into());
                return Ok(None);
            }
            let rows = feed::read_feed(source, Some(first - 1), Some(last), true).await?;
            let ctx = crate::storage::session::new_session();
            let df = ctx
                .read_batch(rows)
                .context(|| "reading the change data feed".into())?;
            let place = format!(
                "the changes of {} in versions {first} to {last}",
                spec.label
            );
            (df, last, place)
        }
        Read::Snapshot {
            version,
            change_type,
        } => {
            let ctx = crate::storage::session::new_session();
            let rows = snapshot_rows(&ctx, source, version, &change_type).await?;
            let df = ctx
                .read_batch(rows)
                .context(|| "reading the source's rows".into())?;
            let place = format!("the rows of {} at version {version}", spec.label);
            (df, version, place)
        }
    }))
}

/// The feed of `first..=last`, or what the run does about the versions of it that are gone.
async fn checked_range(
    setup: &IngestSetup,
    spec: &ChangesSpec,
    source: &DeltaTable,
    first: i64,
    last: i64,
    report: &mut IngestReport,
) -> Result<Read> {
    match missing_versions(source, first, last).await? {
        None => Ok(Read::Feed { first, last }),
        Some(gap) => on_gap(setup, spec, gap, last, report),
    }
}

/// Fails naming the gap and the ways out, or (`onMissingVersions => 'snapshot'`) notes it
/// and reads a snapshot of the source at `latest`.
fn on_gap(
    setup: &IngestSetup,
    spec: &ChangesSpec,
    gap: Gap,
    latest: i64,
    report: &mut IngestReport,
) -> Result<Read> {
    let versions = match gap.first == gap.last {
        true => format!("version {}", gap.first),
        false => format!("versions {} to {}", gap.first, gap.last),
    };
    match spec.on_missing {
        OnMissing::Fail => Err(setup.err(format!(
            "{versions} of {} can no longer be read: {}. Nothing was written. Ways out: \
             add {ON_MISSING} => 'snapshot' to table_changes(...) to write the source's \
             current rows (as _change_type 'snapshot' at version {latest}) and go on from \
             there, the gap recorded in the event log; or start a new history table from a \
             version the source still has (startingVersion => ...). Keep change files \
             longer on the source (delta.logRetentionDuration, \
             delta.deletedFileRetentionDuration, a longer VACUUM retention) so this does not \
             happen again",
            spec.label, gap.why
        ))),
        OnMissing::Snapshot => {
            let note = format!(
                "gap: {versions} of {} could not be read ({}); took a snapshot of the source \
                 at version {latest} instead",
                spec.label, gap.why
            );
            tracing::warn!(table = %setup.table.name, "{note}");
            report.notes.push(note);
            Ok(Read::Snapshot {
                version: latest,
                change_type: SNAPSHOT.into(),
            })
        }
    }
}

/// The versions of `first..=last` the source's change feed cannot give any more: a commit
/// file gone from the log, or a file the feed reads gone from the table's folder or object
/// store prefix; `None` when all are there.
async fn missing_versions(source: &DeltaTable, first: i64, last: i64) -> Result<Option<Gap>> {
    let url = source.table_url();
    let place = match url.to_file_path() {
        Ok(dir) => Location::Local(dir),
        Err(()) => Location::parse(url.as_str(), "table_changes source")?,
    };
    let mut gone_log: Vec<i64> = Vec::new();
    let mut gone_files: Vec<i64> = Vec::new();
    for v in first..=last {
        let Some(actions) = read_commit(source, v).await? else {
            gone_log.push(v);
            continue;
        };
        let has_cdc = actions.iter().any(|a| matches!(a, Action::Cdc(_)));
        let needed = actions.iter().filter_map(|a| match a {
            Action::Cdc(c) => Some(c.path.as_str()),
            Action::Add(a) if !has_cdc && a.data_change => Some(a.path.as_str()),
            Action::Remove(r) if !has_cdc && r.data_change => Some(r.path.as_str()),
            _ => None,
        });
        for p in needed {
            let decoded = crate::storage::changes::percent_decoded(p);
            if !place.has_file(decoded.as_str()).await? {
                gone_files.push(v);
                break;
            }
        }
    }
    let versions = |vs: &[i64]| {
        let (a, b) = (vs[0], vs[vs.len() - 1]);
        match a == b {
            true => format!("version {a}"),
            false => format!("versions {a} to {b}"),
        }
    };
    let mut why = Vec::new();
    if !gone_log.is_empty() {
        why.push(format!(
            "the commits of {} are gone from the source's log (log cleanup)",
            versions(&gone_log)
        ));
    }
    if !gone_files.is_empty() {
        why.push(format!(
            "the change files of {} are gone (VACUUM)",
            versions(&gone_files)
        ));
    }
    let all: Vec<i64> = {
        let mut a = gone_log.clone();
        a.extend(&gone_files);
        a.sort();
        a
    };
    Ok(all.first().map(|first| Gap {
        first: *first,
        last: all[all.len() - 1],
        why: why.join("; "),
    }))
}

/// The first version of `source` committed at or after `ts`, up to `latest`.
async fn first_version_at(
    source: &DeltaTable,
    ts: DateTime<Utc>,
    latest: i64,
) -> Result<Option<i64>> {
    for v in 0..=latest {
        if let Some(at) = commit_time(source, v).await? {
            if at >= ts {
                return Ok(Some(v));
            }
        }
    }
    Ok(None)
}

/// When version `v` was committed, from its commit info; `None` when its commit is gone.
async fn commit_time(source: &DeltaTable, v: i64) -> Result<Option<DateTime<Utc>>> {
    let Some(actions) = read_commit(source, v).await? else {
        return Ok(None);
    };
    Ok(actions.iter().find_map(|a| match a {
        Action::CommitInfo(ci) => ci
            .in_commit_timestamp
            .or(ci.timestamp)
            .and_then(DateTime::from_timestamp_millis),
        _ => None,
    }))
}

/// The source's table id the history table recorded last, from the commit info of its
/// newest commit that took changes.
async fn recorded_table_id(table: &DeltaTable) -> Result<Option<String>> {
    let mut v = crate::storage::table::version_of(table);
    while v >= 0 {
        if let Some(actions) = read_commit(table, v).await? {
            for a in &actions {
                if let Action::CommitInfo(ci) = a {
                    if let Some(id) = ci.info.get(TABLE_ID_KEY) {
                        return Ok(id
                            .get("tableId")
                            .and_then(|t| t.as_str())
                            .map(str::to_string));
                    }
                }
            }
        }
        v -= 1;
    }
    Ok(None)
}

/// Every row of `source` at `version` in the feed's columns, with `change_type`, that
/// version and its commit time.
async fn snapshot_rows(
    ctx: &deltalake::datafusion::prelude::SessionContext,
    source: &DeltaTable,
    version: i64,
    change_type: &str,
) -> Result<RecordBatch> {
    let columns = crate::storage::table::table_schema(source)?;
    let schema = feed::feed_schema(&columns);
    crate::storage::session::register_table(ctx, "__strata_snapshot", source, None).await?;
    let batches = ctx
        .sql("SELECT * FROM __strata_snapshot")
        .await
        .context(|| "reading the source's rows".into())?
        .collect()
        .await
        .context(|| "reading the source's rows".into())?;
    let at = commit_time(source, version)
        .await?
        .map(|t| t.timestamp_micros());
    let mut out = Vec::new();
    for b in &batches {
        let n = b.num_rows();
        // The provider puts partition columns last: back into the table's order.
        let b = crate::util::arrow::in_layout(b, &columns)?;
        let mut columns: Vec<ArrayRef> = b.columns().to_vec();
        columns.push(Arc::new(StringArray::from(vec![change_type; n])));
        columns.push(Arc::new(Int64Array::from(vec![version; n])));
        columns.push(Arc::new(
            TimestampMicrosecondArray::from(vec![at; n]).with_timezone("UTC"),
        ));
        out.push(crate::util::arrow::cast_columns(columns, &schema)?);
    }
    deltalake::arrow::compute::concat_batches(&schema, &out).context(|| "snapshot rows".into())
}
