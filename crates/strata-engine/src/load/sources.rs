//! Pipelines assembled from several SQL texts (a YAML spec's libraries and the SQL generated
//! from its table list), planned and run as one, with every error naming its text.
//!
//! Each text is parsed on its own, as if it stood at its place in the concatenation of all
//! of them (it is parsed behind as many empty lines as the texts before it have), so every
//! location in the merged plan is unique. [`SourceMap`] maps such a location back to its
//! text and local line; the parser and planner need to know nothing of several texts.

use crate::error::{EngineError, Result, Text};

use std::collections::BTreeMap;
use strata_sql::{
    CdcFlow, FlowKind, Location, Node, PipelinePlan, QuerySource, SequenceBy, SqlError, Statement,
};

/// Where a text comes from, which decides how errors point into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A file the user wrote: errors say `file:line:column: ...`.
    File,
    /// SQL generated from a spec entry: errors say `spec.yaml: tables[1] (name): ...` (a
    /// syntax error adds the line:column of the generated SQL and shows its line).
    Generated,
}

/// One named SQL text of a pipeline.
#[derive(Debug, Clone)]
pub struct PipelineSource {
    /// A file path, or the spec entry the text was generated from.
    pub name: String,
    pub text: String,
    pub kind: SourceKind,
}

/// Maps locations of the merged pipeline back to their text.
#[derive(Debug, Clone, Default)]
pub(crate) struct SourceMap {
    /// (first global line, name, kind) of each text, in order.
    starts: Vec<(u64, String, SourceKind)>,
}

impl SourceMap {
    fn find(&self, line: u64) -> Option<(&str, SourceKind, u64)> {
        self.starts
            .iter()
            .rev()
            .find(|(start, _, _)| *start <= line)
            .map(|(start, name, kind)| (name.as_str(), *kind, line - start + 1))
    }

    /// `file:line:column`, or `spec.yaml: tables[1] (name)` for generated SQL.
    fn place(&self, at: Location) -> String {
        match self.find(at.line) {
            Some((name, SourceKind::File, line)) => format!("{name}:{line}:{}", at.column),
            Some((name, SourceKind::Generated, _)) => name.to_string(),
            None => at.to_string(),
        }
    }

    /// The error of the merged plan, named by its text and local location.
    fn error(&self, e: SqlError) -> EngineError {
        let (at, first, rest) = match &e {
            // The snippet of a syntax error is the user's text: left as it is.
            SqlError::Syntax { location, .. } => {
                let shown = e.to_string();
                let rest = shown
                    .strip_prefix(&format!("{location}: "))
                    .unwrap_or(&shown)
                    .to_string();
                (*location, None, rest)
            }
            SqlError::Plan {
                location,
                message,
                first,
            } => (*location, *first, message.clone()),
        };
        let Some((name, kind, line)) = self.find(at.line) else {
            return EngineError::internal(format!("no pipeline text holds location {at}: {e}"));
        };
        let first = first
            .map(|f| format!(" (first at {})", self.place(f)))
            .unwrap_or_default();
        match (kind, &e) {
            (SourceKind::File, _) => {
                EngineError::Spec(format!("{name}:{line}:{}: {rest}{first}", at.column))
            }
            // The snippet that follows shows the generated line.
            (SourceKind::Generated, SqlError::Syntax { .. }) => EngineError::Spec(format!(
                "{name}: generated SQL {line}:{}: {rest}",
                at.column
            )),
            (SourceKind::Generated, SqlError::Plan { .. }) => {
                EngineError::Spec(format!("{name}: {rest}{first}"))
            }
        }
    }

    /// The text holding line `line` of the merged pipeline, and the line within it.
    pub(crate) fn text_of(&self, line: u64) -> Option<(Text, u64)> {
        let (name, kind, local) = self.find(line)?;
        Some(match kind {
            SourceKind::File => (Text::File(name.to_string()), local),
            SourceKind::Generated => (Text::Generated(name.to_string()), local),
        })
    }
}

/// A validated pipeline assembled from one or more texts.
#[derive(Debug, Clone)]
pub struct PlannedPipeline {
    pub plan: PipelinePlan,
    pub(crate) map: SourceMap,
}

/// Substitutes `configuration` into each text, parses each, and plans all statements as one
/// pipeline. Errors name the text and its local line:column. A single file gives the same
/// messages as [`crate::run_pipeline_file_with`].
pub fn plan_sources(
    sources: &[PipelineSource],
    configuration: &BTreeMap<String, String>,
    schema: &str,
    catalog: &str,
) -> Result<PlannedPipeline> {
    let mut map = SourceMap::default();
    let mut statements: Vec<Statement> = Vec::new();
    let mut offset: u64 = 0;
    for s in sources {
        let local = |e: SqlError| match s.kind {
            SourceKind::File => EngineError::Pipeline {
                file: s.name.clone(),
                source: Box::new(e),
            },
            SourceKind::Generated => EngineError::Spec(format!("{}: generated SQL {e}", s.name)),
        };
        let text = strata_sql::substitute(&s.text, configuration).map_err(local)?;
        let text = in_catalog(text, catalog)?;
        map.starts.push((offset + 1, s.name.clone(), s.kind));
        let padded = format!("{}{text}", "\n".repeat(offset as usize));
        let parsed = strata_sql::parse_pipeline_in(&padded, schema).map_err(|e| map.error(e))?;
        statements.extend(parsed.statements);
        offset += text.matches('\n').count() as u64 + 1;
    }
    let plan = strata_sql::plan_pipeline(strata_sql::Pipeline {
        statements,
        default_schema: schema.to_string(),
    })
    .map_err(|e| map.error(e))?;
    Ok(PlannedPipeline { plan, map })
}

/// `text` with three-part names in catalog `catalog` (the warehouse's name, when it is not
/// one the parser knows: `main`, `strata`) naming the warehouse as the parser knows it.
pub(crate) fn in_catalog(text: String, catalog: &str) -> Result<String> {
    if strata_sql::TableName::CATALOGS
        .iter()
        .any(|c| c.eq_ignore_ascii_case(catalog))
    {
        return Ok(text);
    }
    let renamed =
        crate::util::sql::rename_catalog(&text, &[catalog], strata_sql::TableName::CATALOGS[1])?;
    Ok(renamed.unwrap_or(text))
}

/// One node of a plan, for `strata plan`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PlanStep {
    /// `ingest`, `auto_cdc`, `snapshot`, `point_in_time`.
    pub kind: &'static str,
    /// The flow's name, else the table's.
    pub name: String,
    /// What it does, in words (`AUTO CDC, SCD TYPE 2, keys (id), sequence by ts`).
    pub detail: String,
    pub reads: Vec<String>,
    pub writes: String,
    /// The text it is declared in (`sql/gold.sql:3:1`, `spec.yaml: tables[0] (customers)`).
    pub origin: String,
}

impl PlannedPipeline {
    /// The plan's nodes in execution order.
    pub fn steps(&self) -> Vec<PlanStep> {
        self.plan
            .order
            .iter()
            .filter_map(|node| self.step(node))
            .collect()
    }

    /// The step of one node, `None` when the plan does not hold it.
    fn step(&self, node: &Node) -> Option<PlanStep> {
        let keys = |k: &[String]| k.join(", ");
        Some(match node {
            Node::Ingest(name) => {
                let t = self.plan.tables.get(name)?;
                let q = t.query.as_ref()?;
                let (detail, reads) = describe_source("streaming table", &q.source);
                PlanStep {
                    kind: "ingest",
                    name: name.to_string(),
                    detail,
                    reads,
                    writes: name.to_string(),
                    origin: self.origin(t.location),
                }
            }
            Node::Flow(i) => {
                let f = self.plan.flows.get(*i)?;
                let (kind, detail) = describe_flow(f);
                PlanStep {
                    kind,
                    name: f.name.clone(),
                    detail,
                    reads: vec![f.source.to_string()],
                    writes: f.target.to_string(),
                    origin: self.origin(f.location),
                }
            }
            Node::Append(i) => {
                let f = self.plan.appends.get(*i)?;
                let what = match f.once {
                    true => "once append flow",
                    false => "append flow",
                };
                let (detail, mut reads) = describe_source(what, &f.query.source);
                for t in self.plan.joined_tables(&f.query) {
                    if f.once && !reads.contains(&t.to_string()) {
                        reads.push(t.to_string());
                    }
                }
                PlanStep {
                    kind: "append",
                    name: f.name.clone(),
                    detail,
                    reads,
                    writes: f.target.to_string(),
                    origin: self.origin(f.location),
                }
            }
            Node::MaterializedView(name) => {
                let m = self.plan.materialized.get(name)?;
                PlanStep {
                    kind: "materialized_view",
                    name: name.to_string(),
                    detail: "materialized view".to_string(),
                    reads: self
                        .plan
                        .reads(node)
                        .iter()
                        .map(ToString::to_string)
                        .collect(),
                    writes: name.to_string(),
                    origin: self.origin(m.location),
                }
            }
            Node::PointInTime(i) => {
                let p = self.plan.pits.get(*i)?;
                PlanStep {
                    kind: "point_in_time",
                    name: p.name.to_string(),
                    detail: format!("point-in-time table, keys ({})", keys(&p.keys)),
                    reads: p.sources.iter().map(ToString::to_string).collect(),
                    writes: p.name.to_string(),
                    origin: self.origin(p.location),
                }
            }
        })
    }

    /// Where `at` of the combined text was written (`sql/gold.sql:3:1`, or the generated
    /// text's name).
    fn origin(&self, at: Location) -> String {
        match self.map.find(at.line) {
            Some((name, SourceKind::File, line)) => format!("{name}:{line}:{}", at.column),
            Some((name, SourceKind::Generated, _)) => name.to_string(),
            None => at.to_string(),
        }
    }
}

/// What a streaming query (of a `what`: a streaming table, an append flow) reads, in words
/// and as the plan's reads.
fn describe_source(what: &str, source: &QuerySource) -> (String, Vec<String>) {
    match source {
        QuerySource::ReadFiles(rf) => (
            format!(
                "{what} from read_files ({})",
                format!("{:?}", rf.format).to_ascii_lowercase()
            ),
            vec![format!("files {}", rf.path)],
        ),
        QuerySource::ReadDatabase(rd) => (
            format!("{what} from read_database"),
            vec![database_label(rd)],
        ),
        QuerySource::Table(src) => (format!("{what} from STREAM"), vec![src.to_string()]),
        QuerySource::Batch => (format!("{what}, a batch query"), Vec::new()),
        QuerySource::Changes(tc) => (
            format!("{what} from STREAM table_changes"),
            vec![match &tc.source {
                strata_sql::ChangeSource::Table(t) => t.to_string(),
                strata_sql::ChangeSource::Path(p) => format!("table {p}"),
            }],
        ),
    }
}

/// An AUTO CDC flow's kind of step and what it does, in words.
fn describe_flow(f: &CdcFlow) -> (&'static str, String) {
    let keys = f.keys.join(", ");
    match &f.kind {
        FlowKind::Changes => {
            let seq = match &f.sequence_by {
                SequenceBy::Expr(e) => e.clone(),
                SequenceBy::Struct(parts) => format!(
                    "STRUCT({})",
                    parts
                        .iter()
                        .map(|(_, e)| e.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            (
                "auto_cdc",
                format!(
                    "AUTO CDC flow, {}, keys ({}), sequence by {seq}{}",
                    f.stored_as,
                    keys,
                    if f.delete_when.is_some() {
                        ", deletes"
                    } else {
                        ""
                    }
                ),
            )
        }
        FlowKind::Snapshot { version_by } => (
            "snapshot",
            format!(
                "AUTO CDC FROM SNAPSHOT flow, {}, keys ({}), {}",
                f.stored_as,
                keys,
                match version_by {
                    Some(v) => format!("version by {v}"),
                    None => "versioned by run time".to_string(),
                }
            ),
        ),
    }
}

/// What a `read_database` source reads, for the plan: `database shop: public.orders`.
fn database_label(rd: &strata_sql::ReadDatabase) -> String {
    let what = rd
        .options
        .get("table")
        .cloned()
        .unwrap_or_else(|| "a query".to_string());
    format!("database {}: {what}", rd.connection)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of `sources` in the default schema, without configuration.
    fn plan(sources: &[PipelineSource]) -> Result<PlannedPipeline> {
        plan_sources(
            sources,
            &BTreeMap::new(),
            strata_sql::TableName::DEFAULT_SCHEMA,
            "main",
        )
    }

    /// The message of the planning error of `sources`.
    fn plan_error(sources: &[PipelineSource]) -> String {
        plan(sources).unwrap_err().to_string()
    }

    fn src(name: &str, kind: SourceKind, text: &str) -> PipelineSource {
        PipelineSource {
            name: name.into(),
            text: text.into(),
            kind,
        }
    }

    const BRONZE: &str = "CREATE STREAMING TABLE raw\nAS SELECT * FROM STREAM read_files('d', format => 'json', schema => 'id INT, ts INT');\n";

    #[test]
    fn errors_name_their_text_and_local_line() {
        let sources = [
            src("a.sql", SourceKind::File, BRONZE),
            src(
                "b.sql",
                SourceKind::File,
                "\n-- gold\nCREATE STREAMING TABLE gold AS SELECT * FROM STREAM(nope);\n",
            ),
        ];
        let e = plan_error(&sources);
        assert!(
            e.starts_with("b.sql:3:1: table default.gold reads STREAM(default.nope)"),
            "{e}"
        );

        let sources = [
            src("a.sql", SourceKind::File, BRONZE),
            src("spec.yaml: tables[0] (raw)", SourceKind::Generated, BRONZE),
        ];
        let e = plan_error(&sources);
        assert!(
            e.starts_with("spec.yaml: tables[0] (raw): table default.raw is declared twice (first at a.sql:1:1)"),
            "{e}"
        );

        let sources = [
            src("a.sql", SourceKind::File, BRONZE),
            src("b.sql", SourceKind::File, "\n\nCREATE STREAMING TABEL x;"),
        ];
        let e = plan_error(&sources);
        assert!(e.starts_with("b.sql:3:18: "), "{e}");
    }

    #[test]
    fn places_are_relocated_to_their_text() {
        let map = SourceMap {
            starts: vec![
                (1, "a.sql".into(), SourceKind::File),
                (4, "s.yaml: tables[0] (t)".into(), SourceKind::Generated),
                (9, "b.sql".into(), SourceKind::File),
            ],
        };
        let located = |line| {
            EngineError::plan_at("flow f", line, "x")
                .locate(|l| map.text_of(l))
                .to_string()
        };
        assert_eq!(located(10), "flow f (b.sql:2): x");
        assert_eq!(located(6), "flow f (s.yaml: tables[0] (t)): x");
        assert_eq!(located(2), "flow f (a.sql:2): x");
        // A duplicate names the earlier declaration in its own text.
        let e = map.error(SqlError::Plan {
            location: Location {
                line: 10,
                column: 1,
            },
            message: "table t is declared twice".into(),
            first: Some(Location { line: 2, column: 3 }),
        });
        assert_eq!(
            e.to_string(),
            "b.sql:2:1: table t is declared twice (first at a.sql:2:3)"
        );
    }

    #[test]
    fn steps_follow_the_execution_order() {
        let sources = [
            src(
                "gold.sql",
                SourceKind::File,
                "CREATE STREAMING TABLE gold AS SELECT * FROM STREAM(t);",
            ),
            src(
                "s.yaml: tables[0] (t)",
                SourceKind::Generated,
                &format!(
                    "{BRONZE}CREATE STREAMING TABLE t;\nCREATE FLOW t_flow AS AUTO CDC INTO t \
                     FROM STREAM(raw) KEYS (id) SEQUENCE BY ts STORED AS SCD TYPE 2;"
                ),
            ),
        ];
        let steps = plan(&sources).unwrap().steps();
        let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["default.raw", "t_flow", "default.gold"]);
        assert_eq!(
            steps[1].detail,
            "AUTO CDC flow, SCD TYPE 2, keys (id), sequence by ts"
        );
        assert_eq!(steps[1].origin, "s.yaml: tables[0] (t)");
        assert_eq!(steps[2].origin, "gold.sql:1:1");
    }
}
