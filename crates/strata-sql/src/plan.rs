//! The dataset graph of a parsed pipeline.
//!
//! Checks what a single statement cannot: that every table a statement names is declared
//! in the pipeline, that no name is declared twice, that the flows agree with each other
//! and with their targets, and that the graph has no cycle. Then orders the work so that
//! everything runs after what it reads.

use crate::ast::*;
use crate::error::{Result, SqlError};
use std::collections::{BTreeMap, BTreeSet};

/// One unit of work in execution order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// Run the `AS SELECT` of this streaming table (ingestion).
    Ingest(TableName),
    /// Run this AUTO CDC flow (index into [`PipelinePlan::flows`]).
    Flow(usize),
    /// Run this append flow (index into [`PipelinePlan::appends`]).
    Append(usize),
    /// Recompute this materialized view.
    MaterializedView(TableName),
    /// Refresh this point-in-time table (index into [`PipelinePlan::pits`]); these run after
    /// every ingestion and flow.
    PointInTime(usize),
}

/// A validated pipeline: every referenced table is defined, the graph is acyclic, every
/// flow's options agree with each other. `order` runs every node after the nodes that
/// write what it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelinePlan {
    pub tables: BTreeMap<TableName, StreamingTable>,
    pub flows: Vec<CdcFlow>,
    pub appends: Vec<AppendFlow>,
    pub materialized: BTreeMap<TableName, MaterializedView>,
    pub views: BTreeMap<TableName, View>,
    pub pits: Vec<PitTable>,
    /// `CREATE CONNECTION`s by name.
    pub connections: BTreeMap<String, Connection>,
    pub order: Vec<Node>,
    /// The schema of unqualified names in the pipeline's SQL (queries of materialized views,
    /// views and point-in-time spines are run with it as their default schema).
    pub default_schema: String,
}

impl PipelinePlan {
    /// The datasets declared `PRIVATE`: stored where only this pipeline reads them.
    pub fn private_tables(&self) -> std::collections::BTreeSet<TableName> {
        let tables = self
            .tables
            .iter()
            .filter(|(_, t)| t.private)
            .map(|(n, _)| n);
        let views = self
            .materialized
            .iter()
            .filter(|(_, v)| v.private)
            .map(|(n, _)| n);
        tables.chain(views).cloned().collect()
    }

    /// The tables `node` writes.
    pub fn writes(&self, node: &Node) -> Option<TableName> {
        match node {
            Node::Ingest(t) | Node::MaterializedView(t) => Some(t.clone()),
            Node::Flow(i) => self.flows.get(*i).map(|f| f.target.clone()),
            Node::Append(i) => self.appends.get(*i).map(|f| f.target.clone()),
            Node::PointInTime(i) => self.pits.get(*i).map(|p| p.name.clone()),
        }
    }

    /// The datasets `node` reads, views resolved to the tables behind them.
    pub fn reads(&self, node: &Node) -> Vec<TableName> {
        match node {
            Node::Ingest(t) => self
                .tables
                .get(t)
                .and_then(|t| t.query.as_ref())
                .map(|q| self.source_query_reads(q))
                .unwrap_or_default(),
            Node::Flow(i) => self
                .flows
                .get(*i)
                .map(|f| vec![f.source.clone()])
                .unwrap_or_default(),
            Node::Append(i) => self
                .appends
                .get(*i)
                .map(|f| self.source_query_reads(&f.query))
                .unwrap_or_default(),
            Node::MaterializedView(t) => self
                .materialized
                .get(t)
                .map(|m| expand_views(&m.query.reads, &self.views))
                .unwrap_or_default(),
            Node::PointInTime(i) => self
                .pits
                .get(*i)
                .map(|p| p.sources.clone())
                .unwrap_or_default(),
        }
    }

    /// The tables a streaming query joins in batch, views resolved to the tables behind them.
    pub fn joined_tables(&self, q: &SourceQuery) -> Vec<TableName> {
        expand_views(&q.reads, &self.views)
    }

    /// The streaming source of `q` (when it is a table) and the tables it joins in batch,
    /// views resolved.
    fn source_query_reads(&self, q: &SourceQuery) -> Vec<TableName> {
        let mut out = match &q.source {
            QuerySource::Table(src) => vec![src.clone()],
            QuerySource::Changes(TableChanges {
                source: ChangeSource::Table(src),
                ..
            }) => vec![src.clone()],
            QuerySource::ReadFiles(_)
            | QuerySource::ReadDatabase(_)
            | QuerySource::Changes(_)
            | QuerySource::Batch => Vec::new(),
        };
        for t in self.joined_tables(q) {
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }

    /// A short name for messages: `flow users_flow`, `table default.users`, ...
    pub fn describe(&self, node: &Node) -> String {
        match node {
            Node::Ingest(t) => format!("table {t}"),
            Node::Flow(i) => format!(
                "flow {}",
                self.flows.get(*i).map(|f| f.name.as_str()).unwrap_or("?")
            ),
            Node::Append(i) => format!(
                "flow {}",
                self.appends.get(*i).map(|f| f.name.as_str()).unwrap_or("?")
            ),
            Node::MaterializedView(t) => format!("materialized view {t}"),
            Node::PointInTime(i) => format!(
                "point-in-time table {}",
                self.pits
                    .get(*i)
                    .map(|p| p.name.to_string())
                    .unwrap_or_default()
            ),
        }
    }
}

/// `reads` with every view replaced by what it reads, recursively (views are acyclic once
/// planned), without repeats.
fn expand_views(reads: &[TableName], views: &BTreeMap<TableName, View>) -> Vec<TableName> {
    let mut out: Vec<TableName> = Vec::new();
    let mut stack: Vec<TableName> = reads.iter().rev().cloned().collect();
    let mut seen = BTreeSet::new();
    while let Some(t) = stack.pop() {
        if !seen.insert(t.clone()) {
            continue;
        }
        match views.get(&t) {
            Some(v) => stack.extend(v.query.reads.iter().rev().cloned()),
            None => out.push(t),
        }
    }
    out
}

fn plan_error(location: Location, message: impl Into<String>) -> SqlError {
    SqlError::Plan {
        location,
        message: message.into(),
        first: None,
    }
}

/// Validates the graph of `pipeline`.
pub fn plan_pipeline(pipeline: Pipeline) -> Result<PipelinePlan> {
    let pipeline = crate::names::match_case(pipeline)?;
    let (mut plan, stmt_of) = declare_all(pipeline)?;
    check_connections(&plan)?;
    check_streaming_tables(&plan)?;
    check_sinks(&plan)?;
    check_append_flows(&plan)?;
    check_self_reads(&plan)?;
    check_views(&plan.views)?;
    check_flows(&plan)?;
    for (i, p) in plan.pits.iter().enumerate() {
        check_pit(p, &plan.pits[..i], &plan.tables, &plan.flows)?;
    }
    plan.order = order(&plan, stmt_of)?;
    Ok(plan)
}

/// The first pass: every statement's dataset, flow or connection in the plan (a name
/// declared twice refused), with the statement index of each node, the tie-breaker of the
/// execution order. The plan's `order` is still empty.
fn declare_all(pipeline: Pipeline) -> Result<(PipelinePlan, Vec<(Node, usize)>)> {
    let mut plan = PipelinePlan {
        tables: BTreeMap::new(),
        flows: Vec::new(),
        appends: Vec::new(),
        materialized: BTreeMap::new(),
        views: BTreeMap::new(),
        pits: Vec::new(),
        connections: BTreeMap::new(),
        order: Vec::new(),
        default_schema: pipeline.default_schema,
    };
    let mut stmt_of: Vec<(Node, usize)> = Vec::new();
    // Every dataset and flow name with where it was declared.
    let mut names = Declared::new("table");
    let mut flow_names = Declared::new("flow");
    for (i, statement) in pipeline.statements.into_iter().enumerate() {
        match statement {
            Statement::PointInTime(p) => {
                names.declare(&p.name, p.location)?;
                stmt_of.push((Node::PointInTime(plan.pits.len()), i));
                plan.pits.push(p)
            }
            Statement::StreamingTable(mut t) => {
                names.declare(&t.name, t.location)?;
                clustering(
                    &mut t.properties,
                    &t.partitioned_by,
                    &t.cluster_by,
                    t.location,
                )?;
                stmt_of.push((Node::Ingest(t.name.clone()), i));
                plan.tables.insert(t.name.clone(), t);
            }
            Statement::Flow(f) => {
                flow_names.declare(&f.name, f.location)?;
                stmt_of.push((Node::Flow(plan.flows.len()), i));
                plan.flows.push(f);
            }
            Statement::AppendFlow(f) => {
                flow_names.declare(&f.name, f.location)?;
                stmt_of.push((Node::Append(plan.appends.len()), i));
                plan.appends.push(f);
            }
            Statement::MaterializedView(mut m) => {
                names.declare(&m.name, m.location)?;
                clustering(
                    &mut m.properties,
                    &m.partitioned_by,
                    &m.cluster_by,
                    m.location,
                )?;
                stmt_of.push((Node::MaterializedView(m.name.clone()), i));
                plan.materialized.insert(m.name.clone(), m);
            }
            Statement::View(v) => {
                names.declare(&v.name, v.location)?;
                plan.views.insert(v.name.clone(), v);
            }
            Statement::Connection(c) => {
                if let Some(first) = plan.connections.get(&c.name) {
                    return Err(SqlError::Plan {
                        location: c.location,
                        message: format!("connection {} is declared twice", c.name),
                        first: Some(first.location),
                    });
                }
                plan.connections.insert(c.name.clone(), c);
            }
        }
    }
    Ok((plan, stmt_of))
}

/// Names declared so far (of datasets, or of flows), with where: a second declaration of
/// one is an error pointing at both.
struct Declared<K> {
    what: &'static str,
    first: BTreeMap<K, Location>,
}

impl<K: Ord + Clone + std::fmt::Display> Declared<K> {
    fn new(what: &'static str) -> Self {
        Declared {
            what,
            first: BTreeMap::new(),
        }
    }

    fn declare<Q>(&mut self, name: &Q, at: Location) -> Result<()>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized + std::fmt::Display + ToOwned<Owned = K>,
    {
        if let Some(first) = self.first.get(name) {
            return Err(SqlError::Plan {
                location: at,
                message: format!("{} {name} is declared twice", self.what),
                first: Some(*first),
            });
        }
        self.first.insert(name.to_owned(), at);
        Ok(())
    }
}

/// Every `read_database` names a declared connection.
fn check_connections(plan: &PipelinePlan) -> Result<()> {
    let queries = plan
        .tables
        .values()
        .filter_map(|t| t.query.as_ref())
        .chain(plan.appends.iter().map(|f| &f.query));
    for q in queries {
        let QuerySource::ReadDatabase(rd) = &q.source else {
            continue;
        };
        if plan.connections.contains_key(&rd.connection) {
            continue;
        }
        let known = match plan
            .connections
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
        {
            k if k.is_empty() => "no connection is declared".to_string(),
            k => format!("declared: {}", k.join(", ")),
        };
        return Err(plan_error(
            rd.location,
            format!(
                "read_database names connection '{}', which is not declared ({known}); \
                 declare it with CREATE CONNECTION {} TYPE postgresql OPTIONS (...)",
                rd.connection, rd.connection
            ),
        ));
    }
    Ok(())
}

/// A streaming table's `STREAM(src)` names a stream; an AUTO CDC target has no expectations.
fn check_streaming_tables(plan: &PipelinePlan) -> Result<()> {
    for t in plan.tables.values() {
        if let Some(SourceQuery {
            source: QuerySource::Table(src),
            ..
        }) = &t.query
        {
            check_stream_source(
                src,
                &format!("table {}", t.name),
                t.location,
                &plan.tables,
                &plan.materialized,
                &plan.views,
            )?;
        }
        if !t.expectations.is_empty() && plan.flows.iter().any(|f| f.target == t.name) {
            return Err(plan_error(
                t.expectations[0].location,
                format!(
                    "{} is the target of an AUTO CDC flow; expectations belong on the table \
                     the flow reads (they check rows before the flow applies them)",
                    t.name
                ),
            ));
        }
    }
    Ok(())
}

/// A sink is read by nothing, as in Lakeflow; a PostgreSQL sink writes through a declared
/// PostgreSQL connection.
fn check_sinks(plan: &PipelinePlan) -> Result<()> {
    let sinks: Vec<&StreamingTable> = plan.tables.values().filter(|t| t.sink.is_some()).collect();
    for sink in &sinks {
        if let Some(SinkTarget::Database { connection, .. }) = &sink.sink {
            match plan.connections.get(connection) {
                Some(c) if matches!(c.kind.as_str(), "postgresql" | "postgres") => {}
                Some(c) => {
                    return Err(plan_error(
                        sink.location,
                        format!(
                            "sink {} writes through connection {connection}, a {} connection; \
                             a database sink writes PostgreSQL tables",
                            sink.name, c.kind
                        ),
                    ))
                }
                None => {
                    return Err(plan_error(
                        sink.location,
                        format!(
                            "sink {} writes through connection {connection}, which is not \
                             declared (CREATE CONNECTION {connection} TYPE postgresql OPTIONS \
                             (...))",
                            sink.name
                        ),
                    ))
                }
            }
        }
        let reader = plan
            .tables
            .values()
            .filter_map(|t| Some((t.location, t.query.as_ref()?, t.name.to_string())))
            .chain(
                plan.appends
                    .iter()
                    .map(|f| (f.location, &f.query, format!("flow {}", f.name))),
            )
            .find(|(_, q, _)| {
                matches!(&q.source, QuerySource::Table(t) if *t == sink.name)
                    || q.reads.contains(&sink.name)
            })
            .map(|(at, _, who)| (at, who))
            .or_else(|| {
                plan.materialized
                    .values()
                    .find(|m| m.query.reads.contains(&sink.name))
                    .map(|m| (m.location, format!("materialized view {}", m.name)))
            });
        if let Some((at, who)) = reader {
            return Err(plan_error(
                at,
                format!(
                    "{who} reads sink {}; a sink is written, not read, by its pipeline (read \
                     the Delta table it writes from another pipeline or `strata query`)",
                    sink.name
                ),
            ));
        }
    }
    Ok(())
}

/// An append flow inserts into a declared streaming table no AUTO CDC flow writes, from a
/// stream.
fn check_append_flows(plan: &PipelinePlan) -> Result<()> {
    for f in &plan.appends {
        match plan.tables.get(&f.target) {
            None => {
                return Err(plan_error(
                    f.location,
                    format!(
                        "flow {} inserts into {}, which is not declared; declare it with \
                         CREATE STREAMING TABLE {}",
                        f.name, f.target, f.target.name
                    ),
                ))
            }
            Some(_) if plan.flows.iter().any(|g| g.target == f.target) => {
                return Err(plan_error(
                    f.location,
                    format!(
                        "flow {} inserts into {}, which an AUTO CDC flow writes; give the \
                         appended rows their own streaming table",
                        f.name, f.target
                    ),
                ))
            }
            Some(_) => {}
        }
        if let QuerySource::Table(src) = &f.query.source {
            check_stream_source(
                src,
                &format!("flow {}", f.name),
                f.location,
                &plan.tables,
                &plan.materialized,
                &plan.views,
            )?;
        }
    }
    Ok(())
}

/// No dataset reads what it writes: a streaming table its own changes or itself, an append
/// flow its target, a materialized view itself.
fn check_self_reads(plan: &PipelinePlan) -> Result<()> {
    let joins_itself =
        |q: &SourceQuery, table: &TableName| expand_views(&q.reads, &plan.views).contains(table);
    for t in plan.tables.values() {
        if let Some(QuerySource::Changes(TableChanges {
            source: ChangeSource::Table(src),
            location,
            ..
        })) = t.query.as_ref().map(|q| &q.source)
        {
            if *src == t.name {
                return Err(plan_error(
                    *location,
                    format!("streaming table {} reads its own changes", t.name),
                ));
            }
        }
        if t.query.as_ref().is_some_and(|q| joins_itself(q, &t.name)) {
            return Err(plan_error(
                t.location,
                format!("streaming table {} reads itself in its query", t.name),
            ));
        }
    }
    for f in &plan.appends {
        if joins_itself(&f.query, &f.target) {
            return Err(plan_error(
                f.location,
                format!(
                    "flow {} reads {}, the table it inserts into",
                    f.name, f.target
                ),
            ));
        }
    }
    for m in plan.materialized.values() {
        if m.query.reads.contains(&m.name) {
            return Err(plan_error(
                m.location,
                format!("materialized view {} reads itself", m.name),
            ));
        }
    }
    Ok(())
}

/// Each AUTO CDC flow on its own ([`check_flow`]), then flows into one table: they share its
/// layout and merge semantics, so they must agree.
fn check_flows(plan: &PipelinePlan) -> Result<()> {
    let flows = &plan.flows;
    for (i, f) in flows.iter().enumerate() {
        // A change-event flow from a materialized view or a view gets the reason, not "not
        // declared" (it streams its source; a snapshot flow reads it whole).
        let streams = matches!(f.kind, FlowKind::Changes);
        if streams
            && (plan.materialized.contains_key(&f.source) || plan.views.contains_key(&f.source))
        {
            let reader = format!("flow {}", f.name);
            check_stream_source(
                &f.source,
                &reader,
                f.location,
                &plan.tables,
                &plan.materialized,
                &plan.views,
            )?;
        }
        check_flow(f, &plan.tables)?;
        let Some(other) = flows[..i].iter().find(|g| g.target == f.target) else {
            continue;
        };
        let snapshot = |g: &CdcFlow| matches!(g.kind, FlowKind::Snapshot { .. });
        if snapshot(other) != snapshot(f) {
            return Err(plan_error(
                f.location,
                format!(
                    "flows {} and {} cannot share a target: {} is written by both an AUTO CDC \
                     FROM SNAPSHOT flow and a change-event AUTO CDC flow; give each its own table",
                    other.name, f.name, f.target
                ),
            ));
        }
        if snapshot(f) {
            return Err(plan_error(
                f.location,
                format!(
                    "flows {} and {} cannot share a target: {} already receives snapshots from {}; \
                     a snapshot flow must be the only flow into its target",
                    other.name, f.name, f.target, other.name
                ),
            ));
        }
        if other.stored_as != f.stored_as || !same_keys(&other.keys, &f.keys) {
            return Err(plan_error(
                f.location,
                format!(
                    "flows {} and {} both write {} but with different keys or SCD type; \
                     flows into one table must agree on both",
                    other.name, f.name, f.target
                ),
            ));
        }
    }
    Ok(())
}

/// `STREAM(src)` must name a streaming table of the pipeline (an append-only table or the
/// target of AUTO CDC flows, whose change feed is read).
/// The property `strata optimize` reads its Z-order columns from.
pub const ZORDER_PROPERTY: &str = "pipelines.autoOptimize.zOrderCols";

/// Records `CLUSTER BY (cols)` as the table's Z-order columns
/// (`pipelines.autoOptimize.zOrderCols`), refusing it next to `PARTITIONED BY` (as
/// Databricks does) or next to a different value of that property.
fn clustering(
    properties: &mut BTreeMap<String, String>,
    partitioned_by: &[String],
    cluster_by: &[String],
    at: Location,
) -> Result<()> {
    if cluster_by.is_empty() {
        return Ok(());
    }
    if !partitioned_by.is_empty() {
        return Err(plan_error(
            at,
            "PARTITIONED BY and CLUSTER BY cannot be used together; choose one",
        ));
    }
    let cols = cluster_by.join(",");
    match properties.get(ZORDER_PROPERTY) {
        Some(v) if v.replace(' ', "") != cols => Err(plan_error(
            at,
            format!(
                "CLUSTER BY ({}) and TBLPROPERTIES '{ZORDER_PROPERTY}' = '{v}' disagree; \
                 CLUSTER BY sets that property, keep one of them",
                cluster_by.join(", ")
            ),
        )),
        _ => {
            properties.insert(ZORDER_PROPERTY.to_string(), cols);
            Ok(())
        }
    }
}

fn check_stream_source(
    src: &TableName,
    reader: &str,
    at: Location,
    tables: &BTreeMap<TableName, StreamingTable>,
    materialized: &BTreeMap<TableName, MaterializedView>,
    views: &BTreeMap<TableName, View>,
) -> Result<()> {
    if tables.contains_key(src) {
        return Ok(());
    }
    let why = if materialized.contains_key(src) {
        "is a materialized view, which is recomputed rather than appended to; read it in batch \
         from a materialized view, or stream from the streaming table behind it"
    } else if views.contains_key(src) {
        "is a view; STREAM reads streaming tables"
    } else {
        "is not declared in this pipeline"
    };
    Err(plan_error(
        at,
        format!("{reader} reads STREAM({src}), which {why}"),
    ))
}

/// Views may read each other but not in a cycle.
fn check_views(views: &BTreeMap<TableName, View>) -> Result<()> {
    for v in views.values() {
        let mut stack: Vec<(TableName, Vec<TableName>)> =
            vec![(v.name.clone(), vec![v.name.clone()])];
        while let Some((t, path)) = stack.pop() {
            let Some(view) = views.get(&t) else { continue };
            for r in &view.query.reads {
                if r == &v.name {
                    let names: Vec<String> = path.iter().map(|p| format!("view {p}")).collect();
                    return Err(plan_error(
                        v.location,
                        format!(
                            "the pipeline has a cycle: {} -> view {} (each reads the next)",
                            names.join(" -> "),
                            v.name
                        ),
                    ));
                }
                if !path.contains(r) && views.contains_key(r) {
                    let mut p = path.clone();
                    p.push(r.clone());
                    stack.push((r.clone(), p));
                }
            }
        }
    }
    Ok(())
}

fn check_flow(f: &CdcFlow, tables: &BTreeMap<TableName, StreamingTable>) -> Result<()> {
    let err = |m: String| Err(plan_error(f.location, m));
    match tables.get(&f.target) {
        None => {
            return err(format!(
            "flow {} writes {}, which is not declared; declare it with CREATE STREAMING TABLE {}",
            f.name, f.target, f.target.name
        ))
        }
        Some(t) if t.query.is_some() => {
            return err(format!(
                "flow {} writes {}, but that table is filled by its own AS query; \
                 the target of AUTO CDC must be a streaming table without a query",
                f.name, f.target
            ))
        }
        Some(_) => {}
    }
    if !tables.contains_key(&f.source) {
        return err(format!(
            "flow {} reads {}, which is not declared in this pipeline",
            f.name, f.source
        ));
    }
    if f.keys.is_empty() {
        return err(format!("flow {} has no KEYS", f.name));
    }
    let mut seen = BTreeSet::new();
    for k in &f.keys {
        if !seen.insert(k.to_ascii_lowercase()) {
            return err(format!(
                "flow {}: column {k} is listed twice in KEYS",
                f.name
            ));
        }
    }
    if f.track_history.is_some() && f.stored_as != ScdType::Type2 {
        return err(format!(
            "flow {}: TRACK HISTORY needs STORED AS SCD TYPE 2; {} keeps no versions to track",
            f.name, f.stored_as
        ));
    }
    Ok(())
}

fn check_pit(
    p: &PitTable,
    earlier: &[PitTable],
    tables: &BTreeMap<TableName, StreamingTable>,
    flows: &[CdcFlow],
) -> Result<()> {
    let err = |m: String| Err(plan_error(p.location, m));
    if tables.contains_key(&p.name) || earlier.iter().any(|e| e.name == p.name) {
        return err(format!("table {} is declared twice", p.name));
    }
    if p.keys.is_empty() {
        return err(format!("point-in-time table {} has no KEYS", p.name));
    }
    if p.sources.is_empty() {
        return err(format!("point-in-time table {} reads no table", p.name));
    }
    for (i, s) in p.sources.iter().enumerate() {
        if p.sources[..i].contains(s) {
            return err(format!(
                "point-in-time table {}: {s} is listed twice in FROM",
                p.name
            ));
        }
        let writer = flows.iter().find(|f| &f.target == s);
        match writer {
            Some(f) if f.stored_as.has_timeline() => {}
            Some(f) => {
                return err(format!(
                    "point-in-time table {}: {s} is stored as {} and keeps no history; \
                     FROM takes SCD TYPE 2 or SNAPSHOTS tables",
                    p.name, f.stored_as
                ))
            }
            None => {
                return err(format!(
                    "point-in-time table {} reads {s}, which is not the target of an AUTO CDC \
                     flow of this pipeline",
                    p.name
                ))
            }
        }
    }
    Ok(())
}

/// Keys compare as sets of names, ignoring case (Spark resolves columns that way).
fn same_keys(a: &[String], b: &[String]) -> bool {
    let set =
        |v: &[String]| -> BTreeSet<String> { v.iter().map(|k| k.to_ascii_lowercase()).collect() };
    set(a) == set(b)
}

/// Topological order of the work: a node runs after every node that writes what it reads
/// (point-in-time tables after every ingestion and flow, as their spine query may read any
/// table). Among the nodes that are ready, the one declared first runs first, so the order
/// is deterministic and follows the file where the graph allows.
fn order(plan: &PipelinePlan, mut stmt_of: Vec<(Node, usize)>) -> Result<Vec<Node>> {
    // Streaming tables without a query are written only by their flows.
    stmt_of.retain(|(n, _)| match n {
        Node::Ingest(t) => plan.tables.get(t).is_some_and(|t| t.query.is_some()),
        _ => true,
    });
    stmt_of.sort_by_key(|(_, s)| *s);
    let items: Vec<Node> = stmt_of.into_iter().map(|(n, _)| n).collect();
    let writes: Vec<Option<TableName>> = items.iter().map(|n| plan.writes(n)).collect();
    let is_stream_writer =
        |n: &Node| matches!(n, Node::Ingest(_) | Node::Flow(_) | Node::Append(_));
    // deps[i]: the items that must run before item i (the writers of what it reads).
    let deps: Vec<Vec<usize>> = items
        .iter()
        .map(|it| {
            let reads = plan.reads(it);
            (0..items.len())
                .filter(|&j| {
                    let w = writes[j].as_ref();
                    w.is_some_and(|w| reads.contains(w))
                        || (matches!(it, Node::PointInTime(_)) && is_stream_writer(&items[j]))
                })
                .collect()
        })
        .collect();
    let mut done = vec![false; items.len()];
    let mut order = Vec::with_capacity(items.len());
    while order.len() < items.len() {
        let ready = (0..items.len()).find(|&i| !done[i] && deps[i].iter().all(|&d| done[d]));
        match ready {
            Some(i) => {
                done[i] = true;
                order.push(items[i].clone());
            }
            None => {
                // Every node left waits on another node left: follow the waits from the
                // first one until a node repeats, which names one actual cycle.
                let first = (0..items.len()).find(|&i| !done[i]).unwrap_or(0);
                let mut path = vec![first];
                let mut current = first;
                let cycle = loop {
                    let next = deps
                        .get(current)
                        .and_then(|d| d.iter().copied().find(|&j| !done[j]));
                    match next {
                        Some(j) => match path.iter().position(|&p| p == j) {
                            Some(pos) => break path.split_off(pos),
                            None => {
                                path.push(j);
                                current = j;
                            }
                        },
                        None => break path,
                    }
                };
                let names: Vec<String> = cycle
                    .iter()
                    .rev()
                    .map(|&i| plan.describe(&items[i]))
                    .collect();
                let location = cycle
                    .iter()
                    .map(|&i| node_location(plan, &items[i]))
                    .min_by_key(|l| (l.line, l.column))
                    .unwrap_or_default();
                return Err(plan_error(
                    location,
                    format!(
                        "the pipeline has a cycle: {} -> {} (each reads what the one before writes)",
                        names.join(" -> "),
                        names.first().map(String::as_str).unwrap_or("?")
                    ),
                ));
            }
        }
    }
    Ok(order)
}

fn node_location(plan: &PipelinePlan, node: &Node) -> Location {
    match node {
        Node::Ingest(t) => plan.tables.get(t).map(|t| t.location),
        Node::Flow(i) => plan.flows.get(*i).map(|f| f.location),
        Node::Append(i) => plan.appends.get(*i).map(|f| f.location),
        Node::MaterializedView(t) => plan.materialized.get(t).map(|m| m.location),
        Node::PointInTime(i) => plan.pits.get(*i).map(|p| p.location),
    }
    .unwrap_or_default()
}
