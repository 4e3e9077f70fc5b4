//! Pipeline text to [`Pipeline`].
//!
//! The text is tokenized once (Spark lexical rules, see `lex.rs`) and split at `;`. Each
//! statement is walked by the recursive-descent code here, which knows strata's statement
//! keywords (`CREATE STREAMING TABLE`, `CREATE FLOW ... AUTO CDC`, `APPLY CHANGES INTO`).
//! Embedded expressions and the `AS SELECT` of a streaming table are handed to sqlparser
//! and kept as the SQL text it prints back.

use crate::ast::*;
use crate::error::Result;
use crate::lex::{self, is_keyword, location, run_sqlparser, Cursor, End, Source};
use crate::types::{parse_schema_string, parse_table_elements};
use sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, ObjectName, ObjectNamePart,
    Query, SetExpr, Spanned, TableAlias, TableFactor, TableFunctionArgs, TableWithJoins, Value,
};
use sqlparser::keywords::RESERVED_FOR_TABLE_ALIAS;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Location as SpLocation, Token, TokenWithSpan};
use std::collections::{BTreeMap, BTreeSet};

/// Parses a whole pipeline file; unqualified table names are in schema `default`.
pub fn parse_pipeline(text: &str) -> Result<Pipeline> {
    parse_pipeline_in(text, TableName::DEFAULT_SCHEMA)
}

/// Parses a whole pipeline file whose unqualified table names (and `LIVE.` names) are in
/// `schema`.
pub fn parse_pipeline_in(text: &str, schema: &str) -> Result<Pipeline> {
    let src = Source::in_schema(text, schema);
    let tokens = lex::tokenize(&src, text)?;
    let mut statements = Vec::new();
    let mut start = 0;
    for (i, t) in tokens.iter().enumerate() {
        if t.token == Token::SemiColon {
            let end = End {
                location: location(t.span.start),
                found: "';'".to_string(),
            };
            let body = tokens.get(start..i).unwrap_or(&[]);
            parse_one(&src, body, end, &mut statements)?;
            start = i + 1;
        }
    }
    let end = End {
        location: src.end_location(),
        found: "end of input".to_string(),
    };
    parse_one(
        &src,
        tokens.get(start..).unwrap_or(&[]),
        end,
        &mut statements,
    )?;
    Ok(Pipeline {
        statements,
        default_schema: schema.to_string(),
    })
}

/// Parses one statement's tokens (nothing for an empty statement such as `;;`).
fn parse_one(
    src: &Source,
    tokens: &[TokenWithSpan],
    end: End,
    out: &mut Vec<Statement>,
) -> Result<()> {
    if tokens.is_empty() {
        return Ok(());
    }
    let mut c = Cursor::new(src, tokens, end);
    let statements = parse_statement(&mut c)?;
    if !c.at_end() {
        return Err(c.expected("end of statement"));
    }
    out.extend(statements);
    Ok(())
}

/// One statement of the text, as the statements it declares: one, or two for an AUTO CDC
/// flow straight from a database change log (its change table, then the flow).
fn parse_statement(c: &mut Cursor) -> Result<Vec<Statement>> {
    let at = c.loc();
    if c.eat_keyword("CREATE") {
        if c.eat_keyword("OR") {
            c.expect_keyword("REFRESH")?;
        }
        let private_at = c.loc();
        if c.eat_keyword("PRIVATE") {
            return private_dataset(c, at, private_at);
        }
        if c.eat_keyword("STREAMING") {
            // `STREAMING LIVE TABLE` is the legacy DLT spelling of the same thing.
            c.eat_keyword("LIVE");
            c.expect_keyword("TABLE")?;
            return streaming_table(c, at).map(|t| vec![Statement::StreamingTable(t)]);
        }
        if c.eat_keyword("INCREMENTAL") {
            // `INCREMENTAL LIVE TABLE`: the oldest DLT spelling of a streaming table.
            c.expect_keyword("LIVE")?;
            c.expect_keyword("TABLE")?;
            return streaming_table(c, at).map(|t| vec![Statement::StreamingTable(t)]);
        }
        if c.eat_keyword("FLOW") {
            return flow(c, at);
        }
        if c.eat_keyword("CONNECTION") {
            return connection(c, at).map(|t| vec![Statement::Connection(t)]);
        }
        if c.eat_keyword("SINK") {
            return sink(c, at).map(|t| vec![Statement::StreamingTable(t)]);
        }
        if c.eat_keyword("POINT") {
            c.expect_keyword("IN")?;
            c.expect_keyword("TIME")?;
            c.expect_keyword("TABLE")?;
            return pit_table(c, at).map(|t| vec![Statement::PointInTime(t)]);
        }
        if c.eat_keyword("MATERIALIZED") {
            c.expect_keyword("VIEW")?;
            return materialized_view(c, at).map(|t| vec![Statement::MaterializedView(t)]);
        }
        // `CREATE LIVE TABLE` is the legacy DLT spelling of a materialized view.
        if c.peek_keyword("LIVE") && c.peek_nth_keyword(1, "TABLE") {
            c.next();
            c.next();
            return materialized_view(c, at).map(|t| vec![Statement::MaterializedView(t)]);
        }
        if c.eat_keyword("TEMPORARY") || c.peek_keyword("VIEW") || c.peek_keyword("LIVE") {
            c.eat_keyword("LIVE");
            c.expect_keyword("VIEW")?;
            return view(c, at).map(|t| vec![Statement::View(t)]);
        }
        return Err(c.expected(
            "STREAMING TABLE, MATERIALIZED VIEW, VIEW, FLOW, POINT IN TIME TABLE, SINK or CONNECTION",
        ));
    }
    if c.eat_keyword("SET") {
        // `SET key = value`: a configuration value, substituted for `${key}` in the text
        // after it before parsing (`config.rs`); `SET key` and `SET` alone display values
        // in a notebook. Nothing to declare.
        c.skip_rest();
        return Ok(Vec::new());
    }
    if c.eat_keyword("APPLY") {
        // Legacy standalone form: the flow is named after its target table.
        c.expect_keyword("CHANGES")?;
        let snapshot = from_snapshot(c);
        c.expect_keyword("INTO")?;
        return cdc_flow(c, None, at, snapshot).map(flow_statements);
    }
    Err(c.expected("CREATE, APPLY CHANGES or SET"))
}

/// `CREATE [OR REFRESH] PRIVATE STREAMING TABLE | MATERIALIZED VIEW | LIVE TABLE ...`
/// (after `PRIVATE`): the dataset, kept private to the pipeline.
fn private_dataset(c: &mut Cursor, at: Location, private_at: Location) -> Result<Vec<Statement>> {
    if c.eat_keyword("STREAMING") {
        c.eat_keyword("LIVE");
        c.expect_keyword("TABLE")?;
        let mut t = streaming_table(c, at)?;
        t.private = true;
        return Ok(vec![Statement::StreamingTable(t)]);
    }
    let materialized = if c.eat_keyword("MATERIALIZED") {
        c.expect_keyword("VIEW")?;
        true
    } else if c.peek_keyword("LIVE") && c.peek_nth_keyword(1, "TABLE") {
        // `LIVE TABLE`: the legacy DLT spelling of a materialized view.
        c.next();
        c.next();
        true
    } else {
        false
    };
    if materialized {
        let mut v = materialized_view(c, at)?;
        v.private = true;
        return Ok(vec![Statement::MaterializedView(v)]);
    }
    if c.peek_keyword("VIEW") || c.peek_keyword("TEMPORARY") || c.peek_keyword("FLOW") {
        return Err(c.error_at(
            private_at,
            "PRIVATE applies to a streaming table or a materialized view (a view is never \
             stored, and a flow writes the table it names)",
        ));
    }
    Err(c.expected("STREAMING TABLE or MATERIALIZED VIEW"))
}

// ---------------------------------------------------------------------------------------
// Names

/// `name`, `schema.name` or `LIVE.name` (the legacy prefix for the pipeline's own schema).
fn table_name(c: &mut Cursor, what: &str) -> Result<(TableName, Location)> {
    let (first, at) = c.ident(what)?;
    let mut parts = vec![first];
    while c.eat_token(&Token::Period) {
        parts.push(c.ident("a name after '.'")?.0);
    }
    resolve_table_name(&parts, c.src.schema())
        .map(|t| (t, at))
        .map_err(|m| c.error_at(at, m))
}

fn resolve_table_name(parts: &[String], default: &str) -> std::result::Result<TableName, String> {
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    TableName::from_parts(&parts, default)
}

/// `a, b, c`: one or more identifiers.
fn ident_list(c: &mut Cursor, what: &str) -> Result<Vec<String>> {
    let mut names = vec![c.ident(what)?.0];
    while c.eat_token(&Token::Comma) {
        names.push(c.ident(what)?.0);
    }
    Ok(names)
}

/// `IF NOT EXISTS`, when it is there.
fn if_not_exists(c: &mut Cursor) -> Result<()> {
    if c.eat_keyword("IF") {
        c.expect_keyword("NOT")?;
        c.expect_keyword("EXISTS")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// CREATE CONNECTION

/// `CREATE CONNECTION [IF NOT EXISTS] name TYPE kind OPTIONS (key 'value', ...) [COMMENT
/// '...']`, as Databricks writes it (`key = 'value'` is accepted too).
fn connection(c: &mut Cursor, at: Location) -> Result<Connection> {
    if_not_exists(c)?;
    let (name, _) = c.ident("a connection name")?;
    c.expect_keyword("TYPE")?;
    let (kind, _) = c.ident("a connection type (postgresql or mysql)")?;
    let options = options_clause(c)?;
    if c.eat_keyword("COMMENT") {
        c.string("a comment")?;
    }
    Ok(Connection {
        name,
        kind: kind.to_ascii_lowercase(),
        options,
        location: at,
    })
}

/// `[OPTIONS (key 'value', ...)]`: names lower-cased, values as written (`=` optional).
fn options_clause(c: &mut Cursor) -> Result<BTreeMap<String, String>> {
    let mut options = BTreeMap::new();
    if c.eat_keyword("OPTIONS") {
        c.expect_token(&Token::LParen)?;
        loop {
            let (key, key_at) = match c.peek().map(|t| &t.token) {
                Some(Token::SingleQuotedString(s)) => {
                    let key = (s.clone(), c.loc());
                    c.next();
                    key
                }
                _ => c.ident("an option name")?,
            };
            c.eat_token(&Token::Eq);
            let value = match c.peek().map(|t| &t.token) {
                Some(Token::SingleQuotedString(s)) => s.clone(),
                Some(Token::Number(n, _)) => n.clone(),
                _ => return Err(c.expected("a quoted option value")),
            };
            c.next();
            let key = key.to_ascii_lowercase();
            if options.insert(key.clone(), value).is_some() {
                return Err(c.error_at(key_at, format!("option '{key}' is set twice")));
            }
            if !c.eat_token(&Token::Comma) && c.peek_token(&Token::RParen) {
                break;
            }
        }
        c.expect_token(&Token::RParen)?;
    }
    Ok(options)
}

// ---------------------------------------------------------------------------------------
// CREATE SINK

/// `CREATE SINK name OPTIONS (path '...' | tableName 'schema.t' [, format 'delta'])`: a
/// Delta table outside the pipeline's datasets that flows write to, as Lakeflow's
/// `create_sink(name, "delta", {...})` declares one; or `OPTIONS (format 'postgresql',
/// connection 'c', table 'schema.t')`: a PostgreSQL table written through a declared
/// connection.
fn sink(c: &mut Cursor, at: Location) -> Result<StreamingTable> {
    if_not_exists(c)?;
    let (name, name_at) = table_name(c, "a sink name")?;
    let options = options_clause(c)?;
    let err = |m: String| c.error_at(name_at, format!("sink {}: {m}", name.name));
    let format = options
        .get("format")
        .map_or("delta", String::as_str)
        .to_ascii_lowercase();
    let known: &[&str] = match format.as_str() {
        "delta" => &["format", "path", "tablename"],
        "postgresql" | "postgres" => &["format", "connection", "table"],
        _ => {
            return Err(err(format!(
                "format '{format}' is not supported: strata writes Delta sinks (a path or a \
                 table name) and PostgreSQL sinks (format 'postgresql', connection, table); \
                 Kafka and Event Hubs sinks are not"
            )))
        }
    };
    if let Some(unknown) = options.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(err(format!(
            "unknown option '{unknown}' (a {format} sink takes {})",
            known.join(", ")
        )));
    }
    let target = if format == "delta" {
        match (options.get("path"), options.get("tablename")) {
            (Some(path), None) => SinkTarget::Path(path.clone()),
            (None, Some(table)) => SinkTarget::Table(
                resolve_table_name(
                    &table.split('.').map(str::to_string).collect::<Vec<_>>(),
                    c.src.schema(),
                )
                .map_err(&err)?,
            ),
            _ => return Err(err("give one of the options path and tableName".into())),
        }
    } else {
        match (options.get("connection"), options.get("table")) {
            (Some(connection), Some(table)) if !table.trim().is_empty() => SinkTarget::Database {
                connection: connection.clone(),
                table: table.trim().to_string(),
            },
            _ => {
                return Err(err(
                    "a PostgreSQL sink takes the options connection (a CREATE CONNECTION's \
                     name) and table ('schema.table')"
                        .into(),
                ))
            }
        }
    };
    Ok(StreamingTable {
        name,
        columns: None,
        expectations: Vec::new(),
        comment: None,
        // A Delta sink is read by other tools: its replaced rows are rewritten, not marked
        // in deletion vectors, which some Delta readers cannot read yet.
        properties: match target {
            SinkTarget::Path(_) | SinkTarget::Table(_) => BTreeMap::from([(
                "delta.enableDeletionVectors".to_string(),
                "false".to_string(),
            )]),
            SinkTarget::Database { .. } => BTreeMap::new(),
        },
        partitioned_by: Vec::new(),
        cluster_by: Vec::new(),
        query: None,
        private: false,
        sink: Some(target),
        location: at,
    })
}

// ---------------------------------------------------------------------------------------
// CREATE STREAMING TABLE

fn streaming_table(c: &mut Cursor, at: Location) -> Result<StreamingTable> {
    if_not_exists(c)?;
    let head = dataset_head(c)?;
    let query = if c.eat_keyword("AS") {
        Some(source_query(c)?)
    } else if c.at_end() {
        None
    } else {
        return Err(c.expected(head.what_next()));
    };
    Ok(StreamingTable {
        name: head.name,
        columns: head.columns,
        expectations: head.expectations,
        comment: head.comment,
        properties: head.properties.unwrap_or_default(),
        partitioned_by: head.partitioned_by.unwrap_or_default(),
        cluster_by: head.cluster_by.unwrap_or_default(),
        query,
        private: false,
        sink: None,
        location: at,
    })
}

/// What stored datasets share before `AS`: `name [(columns, constraints)] [COMMENT '...']
/// [TBLPROPERTIES (...)]`.
struct DatasetHead {
    name: TableName,
    columns: Option<Vec<ColumnDef>>,
    expectations: Vec<Expectation>,
    comment: Option<String>,
    properties: Option<BTreeMap<String, String>>,
    partitioned_by: Option<Vec<String>>,
    cluster_by: Option<Vec<String>>,
}

impl DatasetHead {
    fn what_next(&self) -> &'static str {
        if self.columns.is_none()
            && self.expectations.is_empty()
            && self.comment.is_none()
            && self.properties.is_none()
            && self.partitioned_by.is_none()
            && self.cluster_by.is_none()
        {
            "a column list, COMMENT, PARTITIONED BY, CLUSTER BY, TBLPROPERTIES, AS or end of statement"
        } else {
            "COMMENT, PARTITIONED BY, CLUSTER BY, TBLPROPERTIES, AS or end of statement"
        }
    }
}

fn dataset_head(c: &mut Cursor) -> Result<DatasetHead> {
    let (name, _) = table_name(c, "a table name")?;
    let (columns, expectations, keys) = if c.eat_token(&Token::LParen) {
        let elements = parse_table_elements(c, true)?;
        if !c.eat_token(&Token::RParen) {
            return Err(c.expected("',' or ')'"));
        }
        let cols = elements.columns;
        (
            (!cols.is_empty()).then_some(cols),
            elements.expectations,
            elements.keys,
        )
    } else {
        (None, Vec::new(), Vec::new())
    };
    let mut comment = None;
    let mut properties = None;
    let mut partitioned_by = None;
    let mut cluster_by = None;
    loop {
        let clause_at = c.loc();
        if c.eat_keyword("COMMENT") {
            let text = c.string("a comment string")?;
            once(c, &mut comment, text, "COMMENT", clause_at)?;
        } else if c.eat_keyword("PARTITIONED") {
            c.expect_keyword("BY")?;
            let cols = maybe_parenthesized_list(c)?;
            once(c, &mut partitioned_by, cols, "PARTITIONED BY", clause_at)?;
        } else if c.eat_keyword("CLUSTER") {
            c.expect_keyword("BY")?;
            let cols = maybe_parenthesized_list(c)?;
            once(c, &mut cluster_by, cols, "CLUSTER BY", clause_at)?;
        } else if c.eat_keyword("TBLPROPERTIES") {
            let props = tblproperties(c)?;
            once(c, &mut properties, props, "TBLPROPERTIES", clause_at)?;
        } else {
            break;
        }
    }
    // Informational key constraints are recorded with the table's properties.
    if !keys.is_empty() {
        let props = properties.get_or_insert_with(BTreeMap::new);
        for (name, text) in keys {
            props.insert(format!("{KEY_CONSTRAINT_PREFIX}{name}"), text);
        }
    }
    Ok(DatasetHead {
        name,
        columns,
        expectations,
        comment,
        properties,
        partitioned_by,
        cluster_by,
    })
}

// ---------------------------------------------------------------------------------------
// CREATE MATERIALIZED VIEW / CREATE VIEW

fn materialized_view(c: &mut Cursor, at: Location) -> Result<MaterializedView> {
    if_not_exists(c)?;
    let head = dataset_head(c)?;
    if !c.eat_keyword("AS") {
        return Err(c.expected(if head.what_next().starts_with("a column") {
            "a column list, COMMENT, PARTITIONED BY, CLUSTER BY, TBLPROPERTIES or AS"
        } else {
            "COMMENT, PARTITIONED BY, CLUSTER BY, TBLPROPERTIES or AS"
        }));
    }
    let query = batch_query(c, "a materialized view")?;
    Ok(MaterializedView {
        name: head.name,
        columns: head.columns,
        expectations: head.expectations,
        comment: head.comment,
        properties: head.properties.unwrap_or_default(),
        partitioned_by: head.partitioned_by.unwrap_or_default(),
        cluster_by: head.cluster_by.unwrap_or_default(),
        query,
        private: false,
        location: at,
    })
}

fn view(c: &mut Cursor, at: Location) -> Result<View> {
    if_not_exists(c)?;
    let (name, _) = table_name(c, "a view name")?;
    let clause_at = c.loc();
    if c.eat_keyword("COMMENT") {
        c.string("a comment string")?;
    } else if c.peek_token(&Token::LParen) {
        return Err(c.error_at(
            clause_at,
            "a view has no column list or expectations here; put expectations on the table that reads it",
        ));
    }
    c.expect_keyword("AS")?;
    let query = batch_query(c, "a view")?;
    Ok(View {
        name,
        query,
        location: at,
    })
}

/// The rest of the statement's tokens with each `STREAM` marker taken out, and where the
/// streaming sources they marked start (see [`strip_stream`]).
fn rest_without_stream(c: &Cursor) -> Result<(Vec<TokenWithSpan>, Vec<SpLocation>)> {
    strip_stream(c.rest()).map_err(|at| {
        c.error_at(
            location(at),
            "STREAM(...) takes a table name or read_files(...), not a query",
        )
    })
}

/// `tokens` as one query that ends the statement.
fn whole_query(c: &Cursor, tokens: Vec<TokenWithSpan>) -> Result<Box<Query>> {
    let (query, _) = run_sqlparser(c.src, tokens, &c.end, |p| {
        let q = p.parse_query()?;
        let next = p.peek_token();
        match next.token {
            Token::EOF => Ok(q),
            _ => p.expected("end of statement", next),
        }
    })?;
    Ok(query)
}

/// The rest of the statement as a batch query: no `STREAM`, tables read as they are.
fn batch_query(c: &mut Cursor, what: &str) -> Result<BatchQuery> {
    let (tokens, marks) = rest_without_stream(c)?;
    if let Some(first) = marks.first() {
        return Err(c.error_at(
            location(*first),
            format!(
                "{what} reads its tables in batch; STREAM(...) belongs in a streaming table \
                 or a flow"
            ),
        ));
    }
    c.skip_rest();
    let mut query = whole_query(c, tokens)?;
    let files = file_reads(c, &mut query)?;
    if let (Some(first), false) = (files.first(), what == "a materialized view") {
        return Err(c.error_at(
            first.spec.location,
            format!("{what} cannot read files yet; read them in a materialized view"),
        ));
    }
    let reads = query_reads(c, &query)?
        .into_iter()
        .filter(|t| !(0..files.len()).any(|i| t.name == files_placeholder(i)))
        .collect();
    Ok(BatchQuery {
        sql: query.to_string(),
        reads,
        files,
    })
}

/// The formats of Spark's direct file reads (``parquet.`path` ``).
const DIRECT_FORMATS: [(&str, FileFormat); 3] = [
    ("parquet", FileFormat::Parquet),
    ("json", FileFormat::Json),
    ("csv", FileFormat::Csv),
];

/// Each `read_files(...)` and Spark direct read (``parquet.`path` ``) of a batch query, its
/// table factor replaced by [`files_placeholder`] (an alias it had is kept).
fn file_reads(c: &Cursor, query: &mut Query) -> Result<Vec<FileRead>> {
    let mut factors = Vec::new();
    collect_query(query, &mut factors);
    let mut out = Vec::new();
    for factor in factors {
        let TableFactor::Table { name, args, .. } = factor else {
            continue;
        };
        let Ok((parts, start)) = name_parts(c, name) else {
            continue;
        };
        let at = start.map(location).unwrap_or_default();
        let read = match (args.as_ref(), parts.as_slice()) {
            (Some(a), [f]) if f.eq_ignore_ascii_case("read_files") => FileRead {
                spec: read_files(c.src, a, at)?,
                direct: false,
            },
            (None, [format, path]) => {
                let quoted = matches!(name.0.get(1), Some(ObjectNamePart::Identifier(id))
                    if id.quote_style == Some('`'));
                let Some((_, format)) = DIRECT_FORMATS
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(format))
                else {
                    continue;
                };
                if !quoted {
                    continue;
                }
                FileRead {
                    spec: ReadFiles {
                        path: path.clone(),
                        format: *format,
                        schema: None,
                        header: false,
                        delimiter: b',',
                        other_options: BTreeMap::new(),
                        location: at,
                    },
                    direct: true,
                }
            }
            _ => continue,
        };
        *name = ObjectName::from(vec![Ident::new(files_placeholder(out.len()))]);
        *args = None;
        out.push(read);
    }
    Ok(out)
}

/// The tables a batch query reads (see [`BatchQuery::reads`]).
fn query_reads(c: &Cursor, query: &Query) -> Result<Vec<TableName>> {
    use sqlparser::ast::{Visit, Visitor};
    use std::ops::ControlFlow;
    #[derive(Default)]
    struct Reads {
        ctes: BTreeSet<String>,
        tables: Vec<(Vec<String>, Option<SpLocation>)>,
        error: Option<(Option<SpLocation>, String)>,
    }
    impl Visitor for Reads {
        type Break = ();
        fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
            if let Some(with) = &q.with {
                for cte in &with.cte_tables {
                    self.ctes.insert(cte.alias.name.value.to_ascii_lowercase());
                }
            }
            ControlFlow::Continue(())
        }
        fn pre_visit_table_factor(&mut self, f: &TableFactor) -> ControlFlow<()> {
            let TableFactor::Table { name, args, .. } = f else {
                return ControlFlow::Continue(());
            };
            let mut parts = Vec::new();
            let mut start = None;
            for p in &name.0 {
                if let ObjectNamePart::Identifier(id) = p {
                    start.get_or_insert(id.span.start);
                    parts.push(id.value.clone());
                }
            }
            match args {
                None => self.tables.push((parts, start)),
                Some(a) => {
                    let function = parts.last().map(|p| p.to_ascii_lowercase());
                    if matches!(function.as_deref(), Some("table_changes" | "as_of")) {
                        let first = a.args.first().and_then(|arg| match arg {
                            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => literal_text(e),
                            _ => None,
                        });
                        match first {
                            Some(t) => self
                                .tables
                                .push((t.split('.').map(str::to_string).collect(), start)),
                            None => {
                                self.error = Some((
                                    start,
                                    format!(
                                        "{}(...) takes the table name as a string first",
                                        parts.join(".")
                                    ),
                                ))
                            }
                        }
                    }
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut v = Reads::default();
    let _ = query.visit(&mut v);
    if let Some((at, message)) = v.error {
        return Err(c.error_at(at.map(location).unwrap_or_default(), message));
    }
    let mut out: Vec<TableName> = Vec::new();
    for (parts, at) in v.tables {
        if parts.len() == 1 && v.ctes.contains(&parts[0].to_ascii_lowercase()) {
            continue;
        }
        let name = resolve_table_name(&parts, c.src.schema())
            .map_err(|m| c.error_at(at.map(location).unwrap_or_default(), m))?;
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(out)
}

/// `('k' = 'v', k.dotted = true, ...)`; the `=` is optional, as in Spark.
fn tblproperties(c: &mut Cursor) -> Result<BTreeMap<String, String>> {
    c.expect_token(&Token::LParen)?;
    let mut props = BTreeMap::new();
    if c.eat_token(&Token::RParen) {
        return Ok(props);
    }
    loop {
        let key_at = c.loc();
        let key = match c.peek().map(|t| &t.token) {
            Some(Token::SingleQuotedString(s)) => {
                c.next();
                s.clone()
            }
            Some(Token::Word(_)) => {
                let mut parts = vec![c.ident("a property name")?.0];
                while c.eat_token(&Token::Period) {
                    parts.push(c.ident("a name after '.'")?.0);
                }
                parts.join(".")
            }
            _ => return Err(c.expected("a property name")),
        };
        c.eat_token(&Token::Eq);
        let value = match c.peek().map(|t| &t.token) {
            Some(Token::SingleQuotedString(s)) => s.clone(),
            Some(Token::Number(n, _)) => n.clone(),
            Some(Token::Word(w)) if w.quote_style.is_none() => w.value.to_ascii_lowercase(),
            _ => return Err(c.expected("a property value")),
        };
        c.next();
        if props.insert(key.clone(), value).is_some() {
            return Err(c.error_at(key_at, format!("property '{key}' is set twice")));
        }
        if !c.eat_token(&Token::Comma) {
            break;
        }
    }
    if !c.eat_token(&Token::RParen) {
        return Err(c.expected("',' or ')'"));
    }
    Ok(props)
}

// ---------------------------------------------------------------------------------------
// The AS SELECT of a streaming table

/// The rest of the statement as a query reading from exactly one streaming source.
fn source_query(c: &mut Cursor) -> Result<SourceQuery> {
    query_with_source(c, false)
}

/// The rest of the statement as the batch query of a once flow (`INSERT INTO ONCE`): no
/// `STREAM`; at most one `read_files(...)`, which becomes its source (every file under the
/// path, read when the flow runs); without one, a query over tables
/// ([`QuerySource::Batch`]).
fn once_query(c: &mut Cursor) -> Result<SourceQuery> {
    query_with_source(c, true)
}

/// [`source_query`], or with `once` [`once_query`].
fn query_with_source(c: &mut Cursor, once: bool) -> Result<SourceQuery> {
    let query_at = c.loc();
    let (tokens, marks) = rest_without_stream(c)?;
    if let (true, Some(first)) = (once, marks.first()) {
        // At the STREAM word in front of the source.
        let stream = c
            .rest()
            .iter()
            .rfind(|t| is_keyword(&t.token, "STREAM") && t.span.start < *first)
            .map_or(*first, |t| t.span.start);
        return Err(c.error_at(
            location(stream),
            "a once flow (INSERT INTO ONCE) reads its input in batch, as Lakeflow requires: \
             remove STREAM (SELECT ... FROM read_files(...) or FROM a table)",
        ));
    }
    c.skip_rest();
    let mut query = whole_query(c, tokens)?;

    let mut factors = Vec::new();
    collect_query(&mut query, &mut factors);
    let mut found: Option<(QuerySource, usize)> = None;
    let mut used_marks = BTreeSet::new();
    for (i, factor) in factors.iter().enumerate() {
        let TableFactor::Table { name, args, .. } = &**factor else {
            continue;
        };
        let (parts, start) = name_parts(c, name)?;
        let marked = start.is_some_and(|s| marks.contains(&s));
        if marked {
            used_marks.insert(start);
        }
        let at = start.map(location).unwrap_or(query_at);
        let function = parts.last().map(|n| n.to_ascii_lowercase());
        let source = match (args, function.as_deref()) {
            (Some(args), Some("read_files")) => {
                QuerySource::ReadFiles(read_files(c.src, args, at)?)
            }
            (Some(_), Some("cloud_files")) if once => {
                return Err(c.error_at(
                    at,
                    "cloud_files(...) is Auto Loader's streaming source; a once flow (INSERT \
                     INTO ONCE) reads its input in batch: read_files('path', format => ...)",
                ));
            }
            // Legacy DLT's Auto Loader source: streaming with or without STREAM.
            (Some(args), Some("cloud_files")) => {
                QuerySource::ReadFiles(cloud_files(c.src, args, at)?)
            }
            (Some(_), Some("read_database")) if once => {
                return Err(c.error_at(
                    at,
                    "a once flow cannot read read_database(...) yet; read the database into a \
                     streaming table and insert from that table",
                ));
            }
            (Some(args), Some("read_database")) => {
                QuerySource::ReadDatabase(read_database(c.src, args, at)?)
            }
            // Unmarked, `table_changes(...)` is a batch read joined with the stream.
            (Some(args), Some("table_changes")) if marked => {
                QuerySource::Changes(table_changes(c.src, args, at)?)
            }
            (args, _) => match args {
                Some(_) if marked => {
                    return Err(c.error_at(
                    at,
                    format!(
                        "expected a table name or read_files(...) after STREAM, found function '{}'",
                        parts.join(".")
                    ),
                ));
                }
                None if marked => QuerySource::Table(
                    resolve_table_name(&parts, c.src.schema()).map_err(|m| c.error_at(at, m))?,
                ),
                // A plain (batch) table or another table function: not the streaming source.
                _ => continue,
            },
        };
        if found.is_some() {
            return Err(c.error_at(
                at,
                match once {
                    true => "a once flow reads at most one read_files(...); this is a second one",
                    false => {
                        "a streaming table reads exactly one streaming source; this is a second one"
                    }
                },
            ));
        }
        found = Some((source, i));
    }
    if let Some(unused) = marks.iter().find(|m| !used_marks.contains(&Some(**m))) {
        return Err(c.error_at(
            location(*unused),
            "STREAM may only name a source in the FROM clause of the query",
        ));
    }
    let (source, index) = match found {
        Some(found) => found,
        // A once flow without files reads tables in batch: it has no input of its own.
        None if once => (QuerySource::Batch, usize::MAX),
        None => {
            return Err(c.error_at(
                query_at,
                "the query of a streaming table needs a streaming source in its FROM: \
                 STREAM read_files(...) or STREAM(table)",
            ))
        }
    };
    if let Some(TableFactor::Table {
        name, args, alias, ..
    }) = factors.into_iter().nth(index)
    {
        // `SELECT raw.x FROM STREAM(raw)` names the table in its columns: keep that name
        // as the alias, so the query means the same once it reads the placeholder.
        if alias.is_none() && args.is_none() {
            if let Some(ObjectNamePart::Identifier(last)) = name.0.last() {
                *alias = Some(TableAlias {
                    explicit: true,
                    name: last.clone(),
                    columns: Vec::new(),
                    at: None,
                });
            }
        }
        // Any alias (and anything else on the factor) stays: only what is read changes.
        *name = ObjectName::from(vec![Ident::new(SOURCE_PLACEHOLDER)]);
        *args = None;
    }
    if !once && aggregates_source(&query) {
        return Err(c.error_at(
            query_at,
            "this query aggregates its streaming source (GROUP BY, DISTINCT, an aggregate or \
             window function): a streaming table takes only each run's new rows, so it would \
             append partial results every run, and Spark refuses an aggregation of a stream \
             without a watermark. Make it a materialized view (CREATE MATERIALIZED VIEW name AS \
             SELECT ... FROM source, without STREAM), which is recomputed over all the rows",
        ));
    }
    // Tables joined with the stream are read in batch, as they are when the table runs.
    let reads = query_reads(c, &query)?
        .into_iter()
        .filter(|t| t.name != SOURCE_PLACEHOLDER)
        .collect();
    Ok(SourceQuery {
        sql: query.to_string(),
        source,
        reads,
    })
}

/// Whether a SELECT of `query` that reads the streaming source (the placeholder, directly or
/// through a subquery or CTE) groups, deduplicates, aggregates or uses a window function.
fn aggregates_source(query: &Query) -> bool {
    use sqlparser::ast::{visit_expressions, GroupByExpr, SelectItem};
    use std::ops::ControlFlow;
    fn reads_source(query: &Query) -> bool {
        let ctes = query.with.iter().flat_map(|w| &w.cte_tables);
        ctes.into_iter().any(|c| reads_source(&c.query)) || body_reads_source(&query.body)
    }
    fn body_reads_source(body: &SetExpr) -> bool {
        match body {
            SetExpr::Select(s) => s.from.iter().any(|twj| {
                std::iter::once(&twj.relation)
                    .chain(twj.joins.iter().map(|j| &j.relation))
                    .any(factor_reads_source)
            }),
            SetExpr::Query(q) => reads_source(q),
            SetExpr::SetOperation { left, right, .. } => {
                body_reads_source(left) || body_reads_source(right)
            }
            _ => false,
        }
    }
    fn factor_reads_source(f: &TableFactor) -> bool {
        match f {
            TableFactor::Table { name, .. } => {
                name.0.len() == 1
                    && matches!(name.0.first(), Some(ObjectNamePart::Identifier(id))
                        if id.value == SOURCE_PLACEHOLDER)
            }
            TableFactor::Derived { subquery, .. } => reads_source(subquery),
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => std::iter::once(&table_with_joins.relation)
                .chain(table_with_joins.joins.iter().map(|j| &j.relation))
                .any(factor_reads_source),
            _ => false,
        }
    }
    fn aggregating_expr(e: &Expr) -> bool {
        visit_expressions(e, |e| match e {
            Expr::Function(f)
                if f.over.is_some()
                    || AGGREGATE_FUNCTIONS.iter().any(|a| {
                        f.name
                            .0
                            .last()
                            .and_then(ObjectNamePart::as_ident)
                            .is_some_and(|id| id.value.eq_ignore_ascii_case(a))
                    }) =>
            {
                ControlFlow::Break(())
            }
            // A subquery aggregates what it reads, which is checked on its own.
            Expr::Subquery(_) | Expr::InSubquery { .. } | Expr::Exists { .. } => {
                ControlFlow::Continue(())
            }
            _ => ControlFlow::Continue(()),
        })
        .is_break()
    }
    fn select_aggregates(body: &SetExpr) -> bool {
        let SetExpr::Select(s) = body else {
            return match body {
                SetExpr::Query(q) => query_aggregates(q),
                SetExpr::SetOperation { left, right, .. } => {
                    select_aggregates(left) || select_aggregates(right)
                }
                _ => false,
            };
        };
        let own = body_reads_source(body)
            && (s.distinct.is_some()
                || s.having.is_some()
                || match &s.group_by {
                    GroupByExpr::All(_) => true,
                    GroupByExpr::Expressions(exprs, _) => !exprs.is_empty(),
                }
                || s.projection.iter().any(|item| match item {
                    SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                        aggregating_expr(e)
                    }
                    _ => false,
                }));
        let derived = s.from.iter().any(|twj| {
            std::iter::once(&twj.relation)
                .chain(twj.joins.iter().map(|j| &j.relation))
                .any(|f| matches!(f, TableFactor::Derived { subquery, .. } if query_aggregates(subquery)))
        });
        own || derived
    }
    fn query_aggregates(query: &Query) -> bool {
        let ctes = query.with.iter().flat_map(|w| &w.cte_tables);
        ctes.into_iter().any(|c| query_aggregates(&c.query)) || select_aggregates(&query.body)
    }
    query_aggregates(query)
}

/// Spark's aggregate functions (by name, any case): in a SELECT that reads a stream, each
/// makes the query a streaming aggregation.
const AGGREGATE_FUNCTIONS: [&str; 33] = [
    "count",
    "count_if",
    "sum",
    "avg",
    "mean",
    "min",
    "max",
    "min_by",
    "max_by",
    "first",
    "first_value",
    "last",
    "last_value",
    "any_value",
    "collect_list",
    "collect_set",
    "array_agg",
    "string_agg",
    "listagg",
    "approx_count_distinct",
    "approx_percentile",
    "percentile",
    "percentile_approx",
    "median",
    "mode",
    "stddev",
    "stddev_pop",
    "stddev_samp",
    "variance",
    "var_pop",
    "var_samp",
    "bool_and",
    "bool_or",
];

/// The parts of a table name and where its first part starts.
fn name_parts(c: &Cursor, name: &ObjectName) -> Result<(Vec<String>, Option<SpLocation>)> {
    let mut parts = Vec::new();
    let mut start = None;
    for part in &name.0 {
        match part {
            ObjectNamePart::Identifier(id) => {
                start.get_or_insert(id.span.start);
                parts.push(id.value.clone());
            }
            ObjectNamePart::Function(f) => {
                return Err(c.error_at(
                    location(f.name.span.start),
                    format!("unsupported table name '{name}'"),
                ));
            }
        }
    }
    Ok((parts, start))
}

/// Removes the `STREAM` word (and the parentheses of `STREAM(x)`) in front of a source in a
/// FROM clause, so that sqlparser sees a plain table or `read_files(...)` call. Returns the
/// tokens and where each source marked by STREAM starts, or where a query is written
/// inside `STREAM(...)` (which reads a table or files, never a query).
fn strip_stream(
    tokens: &[TokenWithSpan],
) -> std::result::Result<(Vec<TokenWithSpan>, Vec<SpLocation>), SpLocation> {
    let mut out: Vec<TokenWithSpan> = Vec::with_capacity(tokens.len());
    let mut marks = Vec::new();
    let mut dropped_closers: Vec<usize> = Vec::new();
    // Per parenthesis depth: whether we are between FROM and the next clause, where a
    // comma introduces another source.
    let mut in_from: Vec<bool> = vec![false];
    let mut i = 0;
    while let Some(t) = tokens.get(i) {
        if dropped_closers.contains(&i) {
            i += 1;
            continue;
        }
        match &t.token {
            Token::LParen => in_from.push(false),
            Token::RParen if in_from.len() > 1 => {
                in_from.pop();
            }
            Token::Word(w) if w.quote_style.is_none() => {
                let word = w.value.to_ascii_uppercase();
                let top = in_from.last().copied().unwrap_or(false);
                match word.as_str() {
                    "FROM" => set_top(&mut in_from, true),
                    "SELECT" | "WHERE" | "GROUP" | "HAVING" | "ORDER" | "LIMIT" | "QUALIFY"
                    | "WINDOW" | "UNION" | "EXCEPT" | "INTERSECT" | "MINUS" => {
                        set_top(&mut in_from, false)
                    }
                    _ => {}
                }
                let source_position = match out.last().map(|p| &p.token) {
                    Some(prev) if is_keyword(prev, "FROM") || is_keyword(prev, "JOIN") => true,
                    Some(Token::Comma) => top,
                    _ => false,
                };
                if word == "STREAM" && source_position {
                    match tokens.get(i + 1).map(|n| &n.token) {
                        Some(Token::LParen) => {
                            if let (Some(close), Some(inner)) =
                                (matching_paren(tokens, i + 1), tokens.get(i + 2))
                            {
                                let is_query = ["SELECT", "WITH", "VALUES", "FROM"]
                                    .iter()
                                    .any(|kw| is_keyword(&inner.token, kw));
                                if is_query {
                                    return Err(inner.span.start);
                                }
                                if matches!(inner.token, Token::Word(_)) {
                                    marks.push(inner.span.start);
                                    dropped_closers.push(close);
                                    i += 2;
                                    continue;
                                }
                            }
                        }
                        Some(Token::Word(next))
                            if !RESERVED_FOR_TABLE_ALIAS.contains(&next.keyword) =>
                        {
                            if let Some(n) = tokens.get(i + 1) {
                                marks.push(n.span.start);
                            }
                            i += 1;
                            continue;
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        out.push(t.clone());
        i += 1;
    }
    Ok((out, marks))
}

fn set_top(stack: &mut [bool], value: bool) {
    if let Some(top) = stack.last_mut() {
        *top = value;
    }
}

/// Index of the `)` closing the `(` at `open`.
fn matching_paren(tokens: &[TokenWithSpan], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        match t.token {
            Token::LParen => depth += 1,
            Token::RParen => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Every table factor reachable through the FROM clauses of `query` (CTEs, set operations,
/// derived tables and nested joins included), in text order.
fn collect_query<'q>(query: &'q mut Query, out: &mut Vec<&'q mut TableFactor>) {
    if let Some(with) = query.with.as_mut() {
        for cte in with.cte_tables.iter_mut() {
            collect_query(&mut cte.query, out);
        }
    }
    collect_set_expr(&mut query.body, out);
}

fn collect_set_expr<'q>(body: &'q mut SetExpr, out: &mut Vec<&'q mut TableFactor>) {
    match body {
        SetExpr::Select(select) => {
            for twj in select.from.iter_mut() {
                collect_table_with_joins(twj, out);
            }
        }
        SetExpr::Query(q) => collect_query(q, out),
        SetExpr::SetOperation { left, right, .. } => {
            collect_set_expr(left, out);
            collect_set_expr(right, out);
        }
        _ => {}
    }
}

fn collect_table_with_joins<'q>(twj: &'q mut TableWithJoins, out: &mut Vec<&'q mut TableFactor>) {
    collect_factor(&mut twj.relation, out);
    for join in twj.joins.iter_mut() {
        collect_factor(&mut join.relation, out);
    }
}

fn collect_factor<'q>(factor: &'q mut TableFactor, out: &mut Vec<&'q mut TableFactor>) {
    if matches!(factor, TableFactor::Table { .. }) {
        out.push(factor);
        return;
    }
    match factor {
        TableFactor::Derived { subquery, .. } => collect_query(subquery, out),
        TableFactor::NestedJoin {
            table_with_joins, ..
        } => collect_table_with_joins(table_with_joins, out),
        _ => {}
    }
}

/// One argument of a table function: an expression by position, or `name => value`.
enum CallArg<'a> {
    Positional(&'a Expr, Location),
    Named(NamedArg<'a>),
}

/// A `name => value` argument; the name lower-cased.
struct NamedArg<'a> {
    key: String,
    key_at: Location,
    value: Option<&'a Expr>,
}

impl NamedArg<'_> {
    /// The value as literal text (a string, number or boolean) and its place, else an error
    /// there.
    fn literal(&self, src: &Source) -> Result<(String, Location)> {
        let not_literal = |at| src.error(at, format!("option '{}' must be a literal", self.key));
        let Some(expr) = self.value else {
            return Err(not_literal(self.key_at));
        };
        let at = expr_location(expr, self.key_at);
        literal_text(expr)
            .map(|v| (v, at))
            .ok_or_else(|| not_literal(at))
    }
}

/// The arguments of table function `function`, in order; anything else (`*`, a qualified
/// name before `=>`) is an error naming the function.
fn call_args<'a>(
    src: &Source,
    args: &'a TableFunctionArgs,
    at: Location,
    function: &str,
) -> Result<Vec<CallArg<'a>>> {
    args.args
        .iter()
        .map(|arg| match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => {
                Ok(CallArg::Positional(e, expr_location(e, at)))
            }
            FunctionArg::Named { name, arg, .. }
            | FunctionArg::ExprNamed {
                name: Expr::Identifier(name),
                arg,
                ..
            } => Ok(CallArg::Named(NamedArg {
                key: name.value.to_ascii_lowercase(),
                key_at: location(name.span.start),
                value: match arg {
                    FunctionArgExpr::Expr(e) => Some(e),
                    _ => None,
                },
            })),
            other => Err(src.error(at, format!("unsupported {function} argument '{other}'"))),
        })
        .collect()
}

/// Adds an option, refusing one given twice.
fn insert_once(
    src: &Source,
    options: &mut BTreeMap<String, String>,
    key: String,
    key_at: Location,
    value: String,
) -> Result<()> {
    if options.contains_key(&key) {
        return Err(src.error(key_at, format!("option '{key}' is given twice")));
    }
    options.insert(key, value);
    Ok(())
}

/// `read_files('path', format => 'json', schema => '...', header => true, sep => ',', ...)`.
fn read_files(src: &Source, args: &TableFunctionArgs, at: Location) -> Result<ReadFiles> {
    let mut path = None;
    let mut options = FileOptions::default();
    for arg in call_args(src, args, at, "read_files")? {
        let named = match arg {
            CallArg::Positional(e, arg_at) => {
                if path.is_some() {
                    return Err(src.error(
                        arg_at,
                        "read_files takes one path; write options as name => value",
                    ));
                }
                match string_literal(e) {
                    Some(s) => path = Some(s),
                    None => {
                        return Err(src.error(arg_at, "the path of read_files must be a string"))
                    }
                }
                continue;
            }
            CallArg::Named(named) => named,
        };
        options.first_time(src, &named.key, &named.key, named.key_at)?;
        let (value, value_at) = named.literal(src)?;
        options.set(src, &named.key, &named.key, value, value_at)?;
    }
    let Some(path) = path else {
        return Err(src.error(at, "read_files needs a path as its first argument"));
    };
    let Some(format) = options.format else {
        return Err(src.error(
            at,
            "read_files needs a format option: format => 'json', 'csv', 'parquet' or 'debezium'",
        ));
    };
    Ok(options.into_spec(path, format, at))
}

/// The options of a `read_files` (or `cloud_files`) call as they are read, by read_files'
/// names.
#[derive(Default)]
struct FileOptions {
    format: Option<FileFormat>,
    schema: Option<Vec<ColumnDef>>,
    header: Option<bool>,
    delimiter: Option<u8>,
    other: BTreeMap<String, String>,
    /// The options given so far (`sep` and `delimiter` are one).
    seen: BTreeSet<String>,
}

/// The options read_files hands to the engine as they are ([`ReadFiles::other_options`]),
/// lower-cased: those the engine's `read_files` takes besides `format`, `schema`, `header`
/// and `sep` (crates/strata-engine/src/ops/ingest/prepare.rs). `cloud_files` refuses the
/// others at their place.
const PASSED_FILE_OPTIONS: [&str; 9] = [
    "multiline",
    "inferschema",
    "encoding",
    "rescueddatacolumn",
    "infercolumntypes",
    "infertimestamp",
    "schemahints",
    "maxfilespertrigger",
    "maxbytespertrigger",
];

impl FileOptions {
    /// Notes option `key` (lower-cased), written `written` at `key_at`, refusing one given
    /// twice.
    fn first_time(
        &mut self,
        src: &Source,
        key: &str,
        written: &str,
        key_at: Location,
    ) -> Result<()> {
        // `sep` and `delimiter` are two names for one option.
        let canonical = if key == "sep" { "delimiter" } else { key };
        if !self.seen.insert(canonical.to_string()) {
            return Err(src.error(key_at, format!("option '{written}' is given twice")));
        }
        Ok(())
    }

    /// Sets read_files option `key` (lower-cased; `written` as the text names it) to
    /// `value`, found at `value_at`. An option of no meaning here is kept for the engine.
    fn set(
        &mut self,
        src: &Source,
        key: &str,
        written: &str,
        value: String,
        value_at: Location,
    ) -> Result<()> {
        match key {
            "format" => self.format = Some(file_format(src, &value, value_at)?),
            "schema" => self.schema = Some(parse_schema_string(src, &value, Some(value_at))?),
            "header" => {
                self.header = Some(match value.to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(src.error(
                            value_at,
                            format!("option '{written}' must be true or false, found '{value}'"),
                        ))
                    }
                })
            }
            "sep" | "delimiter" => {
                let mut chars = value.chars();
                match (chars.next(), chars.next()) {
                    (Some(ch), None) if ch.is_ascii() => self.delimiter = Some(ch as u8),
                    _ => {
                        return Err(src.error(
                            value_at,
                            format!(
                                "option '{written}' must be one ASCII character, found '{value}'"
                            ),
                        ))
                    }
                }
            }
            _ => {
                self.other.insert(key.to_string(), value);
            }
        }
        Ok(())
    }

    fn into_spec(self, path: String, format: FileFormat, at: Location) -> ReadFiles {
        ReadFiles {
            path,
            format,
            schema: self.schema,
            header: self.header.unwrap_or(false),
            delimiter: self.delimiter.unwrap_or(b','),
            other_options: self.other,
            location: at,
        }
    }
}

/// A `format` of read_files (or the second argument of cloud_files), in any case.
fn file_format(src: &Source, value: &str, value_at: Location) -> Result<FileFormat> {
    match value.to_ascii_lowercase().as_str() {
        "json" => Ok(FileFormat::Json),
        "csv" => Ok(FileFormat::Csv),
        "parquet" => Ok(FileFormat::Parquet),
        "debezium" => Ok(FileFormat::Debezium),
        _ => Err(src.error(
            value_at,
            format!("unknown format '{value}': expected json, csv, parquet or debezium"),
        )),
    }
}

/// The text of a string literal.
fn string_literal(e: &Expr) -> Option<String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// `cloud_files('path', 'format'[, map('name', 'value', ...)])`, legacy DLT's Auto Loader
/// source, streaming without `STREAM`: the same [`ReadFiles`] as `read_files('path', format
/// => 'format', name => 'value', ...)`. The map's names are read_files' options (`header`,
/// `sep`, `schema`, `rescuedDataColumn`, ...) or Auto Loader's `cloudFiles.*` options, those
/// read_files agrees with (see [`cloud_files_option`]); any other is an error at its place.
fn cloud_files(src: &Source, args: &TableFunctionArgs, at: Location) -> Result<ReadFiles> {
    let usage = "cloud_files takes a path, a format and a map of options: \
                 cloud_files('data/in', 'json', map('cloudFiles.inferColumnTypes', 'true'))";
    let mut positional = Vec::new();
    for arg in call_args(src, args, at, "cloud_files")? {
        match arg {
            CallArg::Positional(e, arg_at) => positional.push((e, arg_at)),
            CallArg::Named(named) => {
                return Err(src.error(
                    named.key_at,
                    format!("cloud_files takes no name => value arguments; {usage}"),
                ))
            }
        }
    }
    if let Some((_, extra_at)) = positional.get(3) {
        return Err(src.error(*extra_at, usage));
    }
    let Some(&(path, path_at)) = positional.first() else {
        return Err(src.error(at, "cloud_files needs a path as its first argument"));
    };
    let Some(path) = string_literal(path) else {
        return Err(src.error(path_at, "the path of cloud_files must be a string"));
    };
    let Some(&(format, format_at)) = positional.get(1) else {
        return Err(src.error(
            at,
            "cloud_files needs a format as its second argument: \
             cloud_files('path', 'json'), or 'csv', 'parquet' or 'debezium'",
        ));
    };
    let Some(format_text) = string_literal(format) else {
        return Err(src.error(
            format_at,
            "the format of cloud_files must be a string: 'json', 'csv', 'parquet' or 'debezium'",
        ));
    };
    let format = file_format(src, &format_text, format_at)?;
    let mut options = FileOptions {
        format: Some(format),
        ..FileOptions::default()
    };
    let mut evolution = None;
    if let Some(&(map, map_at)) = positional.get(2) {
        for option in option_map(src, map, map_at)? {
            cloud_files_option(
                src,
                &mut options,
                (format, &format_text),
                option,
                &mut evolution,
            )?;
        }
    }
    if let Some(option) = evolution {
        evolution_agrees(src, &options, option)?;
    }
    Ok(options.into_spec(path, format, at))
}

/// One `'name', 'value'` pair of `map(...)`, as written, with their places.
struct MapOption {
    name: String,
    name_at: Location,
    value: String,
    value_at: Location,
}

/// The pairs of the option map of cloud_files, `map('name', 'value', ...)`: each name a
/// string, each value a literal (a string, number or boolean).
fn option_map(src: &Source, e: &Expr, at: Location) -> Result<Vec<MapOption>> {
    let usage = "the third argument of cloud_files is a map of option names and values: \
                 map('header', 'true', 'sep', ';')";
    let list = match e {
        Expr::Function(f) if f.name.to_string().eq_ignore_ascii_case("map") => match &f.args {
            FunctionArguments::List(list)
                if list.duplicate_treatment.is_none() && list.clauses.is_empty() =>
            {
                list
            }
            _ => return Err(src.error(at, usage)),
        },
        _ => return Err(src.error(at, usage)),
    };
    let mut items = Vec::new();
    for arg in &list.args {
        match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => items.push((e, expr_location(e, at))),
            other => {
                let start = other.span().start;
                let arg_at = if start.line == 0 { at } else { location(start) };
                return Err(src.error(arg_at, usage));
            }
        }
    }
    let mut out = Vec::new();
    for pair in items.chunks(2) {
        let &(name, name_at) = &pair[0];
        let Some(name) = string_literal(name) else {
            return Err(src.error(
                name_at,
                format!("a cloud_files option name must be a string, found {name}"),
            ));
        };
        let Some(&(value, value_at)) = pair.get(1) else {
            return Err(src.error(
                name_at,
                format!(
                    "option '{name}' has no value: map(...) takes option names and values \
                     in pairs, map('{name}', 'value')"
                ),
            ));
        };
        let Some(value) = literal_text(value) else {
            return Err(src.error(value_at, format!("option '{name}' must be a literal")));
        };
        out.push(MapOption {
            name,
            name_at,
            value,
            value_at,
        });
    }
    Ok(out)
}

/// One option of cloud_files' map, names in any case: `cloudFiles.format` (or `format`)
/// must name the second argument's format; `cloudFiles.inferColumnTypes` (true or false) is
/// read_files' `inferColumnTypes`; `cloudFiles.schemaEvolutionMode` is kept in `evolution`
/// to be checked against what read_files does ([`evolution_agrees`]); read_files' own
/// options (`header`, `sep`, `delimiter`, `schema` and [`PASSED_FILE_OPTIONS`]) are set as
/// read_files sets them. Any other name is an error at its place.
fn cloud_files_option(
    src: &Source,
    options: &mut FileOptions,
    (format, format_text): (FileFormat, &str),
    option: MapOption,
    evolution: &mut Option<(String, String, Location)>,
) -> Result<()> {
    let lower = option.name.to_ascii_lowercase();
    let key = match lower.as_str() {
        "cloudfiles.format" => "format",
        "cloudfiles.infercolumntypes" => "infercolumntypes",
        "cloudfiles.schemahints" => "schemahints",
        "cloudfiles.maxfilespertrigger" => "maxfilespertrigger",
        "cloudfiles.maxbytespertrigger" => "maxbytespertrigger",
        other => other,
    };
    let known = matches!(
        key,
        "format" | "cloudfiles.schemaevolutionmode" | "header" | "sep" | "delimiter" | "schema"
    ) || PASSED_FILE_OPTIONS.contains(&key);
    if !known {
        return Err(src.error(
            option.name_at,
            format!(
                "cloud_files option '{}' is not supported: cloud_files takes the options of \
                 read_files (header, sep, delimiter, schema, multiLine, inferSchema, encoding, \
                 rescuedDataColumn, inferColumnTypes, inferTimestamp, schemaHints, \
                 maxFilesPerTrigger, maxBytesPerTrigger) and cloudFiles.format, \
                 cloudFiles.inferColumnTypes, cloudFiles.schemaHints, \
                 cloudFiles.maxFilesPerTrigger, cloudFiles.maxBytesPerTrigger and \
                 cloudFiles.schemaEvolutionMode",
                option.name
            ),
        ));
    }
    options.first_time(src, key, &option.name, option.name_at)?;
    let MapOption {
        name,
        value,
        value_at,
        ..
    } = option;
    match key {
        "format" => {
            if file_format(src, &value, value_at)? != format {
                return Err(src.error(
                    value_at,
                    format!(
                        "option '{name}' is '{value}', but the format of cloud_files (its \
                         second argument) is '{format_text}'"
                    ),
                ));
            }
        }
        "infercolumntypes" | "infertimestamp" => {
            if !value.eq_ignore_ascii_case("true") && !value.eq_ignore_ascii_case("false") {
                return Err(src.error(
                    value_at,
                    format!("option '{name}' must be true or false, found '{value}'"),
                ));
            }
            // `cloudFiles.inferColumnTypes` true is read_files' default: the same source as
            // read_files without it.
            let value = value.to_ascii_lowercase();
            if !(key == "infercolumntypes" && value == "true") {
                options.set(src, key, &name, value, value_at)?
            }
        }
        "cloudfiles.schemaevolutionmode" => *evolution = Some((name, value, value_at)),
        _ => options.set(src, key, &name, value, value_at)?,
    }
    Ok(())
}

/// `cloudFiles.schemaEvolutionMode` must name what read_files does: `addNewColumns` without
/// a schema (new columns are added), `none` with one (fields outside it are left out, or
/// rescued with `rescuedDataColumn`), `rescue` with one and `rescuedDataColumn`.
fn evolution_agrees(
    src: &Source,
    options: &FileOptions,
    (name, value, value_at): (String, String, Location),
) -> Result<()> {
    let declared = options.schema.is_some();
    let rescued = options.other.contains_key("rescueddatacolumn");
    let agrees = match value.to_ascii_lowercase().as_str() {
        "addnewcolumns" => !declared,
        "none" => declared,
        "rescue" => declared && rescued,
        _ => false,
    };
    if agrees {
        return Ok(());
    }
    Err(src.error(
        value_at,
        format!(
            "option '{name}' is '{value}', which read_files does not do here: without 'schema' \
             it adds new columns (addNewColumns); with 'schema' it leaves other fields out \
             (none), or rescues them with 'rescuedDataColumn' (rescue)"
        ),
    ))
}

/// `read_database('connection', name => value, ...)`: the connection's name, then options
/// (lower-cased names, literal values), each at most once.
fn read_database(src: &Source, args: &TableFunctionArgs, at: Location) -> Result<ReadDatabase> {
    let mut connection = None;
    let mut options = BTreeMap::new();
    for arg in call_args(src, args, at, "read_database")? {
        match arg {
            CallArg::Positional(e, arg_at) => {
                match (literal_text(e), &connection) {
                    (_, Some(_)) => return Err(src.error(
                        arg_at,
                        "read_database takes one connection name; write options as name => value",
                    )),
                    (Some(name), None) => connection = Some(name),
                    (None, None) => {
                        return Err(src.error(
                            arg_at,
                            "the first argument of read_database is a connection name",
                        ))
                    }
                }
            }
            CallArg::Named(named) => {
                let (value, _) = named.literal(src)?;
                insert_once(src, &mut options, named.key, named.key_at, value)?;
            }
        }
    }
    let Some(connection) = connection else {
        return Err(src.error(
            at,
            "read_database needs a connection name as its first argument: \
             read_database('shop', table => 'public.orders', watermark => 'updated_at')",
        ));
    };
    Ok(ReadDatabase {
        connection,
        options,
        location: at,
    })
}

/// `table_changes('orders' | 'path/to/table', [start,] name => value, ...)` after `STREAM`:
/// the source (a name, or a path when it holds a `/`), then a start and options.
fn table_changes(src: &Source, args: &TableFunctionArgs, at: Location) -> Result<TableChanges> {
    let usage = "STREAM table_changes takes a table name or path, then options: \
                 table_changes('orders', startingVersion => 0)";
    let mut source = None;
    let mut options = BTreeMap::new();
    for arg in call_args(src, args, at, "table_changes")? {
        let (key, key_at, value) = match arg {
            CallArg::Positional(e, arg_at) => match (&source, e) {
                (None, Expr::Value(v)) => match &v.value {
                    Value::SingleQuotedString(s) => {
                        source = Some((s.clone(), arg_at));
                        continue;
                    }
                    _ => return Err(src.error(arg_at, usage)),
                },
                (None, _) => return Err(src.error(arg_at, usage)),
                (Some(_), Expr::Value(v)) if matches!(v.value, Value::Number(..)) => {
                    ("startingversion".to_string(), arg_at, literal_text(e))
                }
                (Some(_), _) => ("startingtimestamp".to_string(), arg_at, literal_text(e)),
            },
            CallArg::Named(named) => {
                let (value, _) = named.literal(src)?;
                (named.key, named.key_at, Some(value))
            }
        };
        let Some(value) = value else {
            return Err(src.error(key_at, format!("option '{key}' must be a literal")));
        };
        insert_once(src, &mut options, key, key_at, value)?;
    }
    let Some((written, source_at)) = source else {
        return Err(src.error(at, usage));
    };
    let source = if written.contains('/') || written.contains('\\') {
        ChangeSource::Path(written)
    } else {
        ChangeSource::Table(
            resolve_table_name(
                &written.split('.').map(str::to_string).collect::<Vec<_>>(),
                src.schema(),
            )
            .map_err(|m| src.error(source_at, m))?,
        )
    };
    Ok(TableChanges {
        source,
        options,
        location: at,
    })
}

fn expr_location(e: &Expr, fallback: Location) -> Location {
    let start = e.span().start;
    if start.line == 0 {
        fallback
    } else {
        location(start)
    }
}

/// The text of a literal option value: a string, number, boolean or bare word.
fn literal_text(e: &Expr) -> Option<String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => Some(s.clone()),
            Value::Boolean(b) => Some(b.to_string()),
            Value::Number(..) => Some(v.value.to_string()),
            _ => None,
        },
        Expr::Identifier(id) => Some(id.value.clone()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// CREATE FLOW ... AS AUTO CDC INTO / APPLY CHANGES INTO

/// A parsed AUTO CDC flow as statements: its change table first, when it reads a database
/// change log itself.
fn flow_statements((flow, log): (CdcFlow, Option<StreamingTable>)) -> Vec<Statement> {
    log.map(Statement::StreamingTable)
        .into_iter()
        .chain([Statement::Flow(flow)])
        .collect()
}

fn flow(c: &mut Cursor, at: Location) -> Result<Vec<Statement>> {
    let (name, _) = c.ident("a flow name")?;
    c.expect_keyword("AS")?;
    let kind_at = c.loc();
    if c.eat_keyword("AUTO") {
        c.expect_keyword("CDC")?;
    } else if c.eat_keyword("APPLY") {
        c.expect_keyword("CHANGES")?;
    } else if c.eat_keyword("INSERT") {
        // `INSERT INTO ONCE target` (Lakeflow's SQL reference) or `INSERT ONCE INTO target`
        // (its newer spelling): a one-time flow. A table called `once` stays a table name.
        let mut once = eat_once(c);
        c.expect_keyword("INTO")?;
        let again_at = c.loc();
        if eat_once(c) {
            if once {
                return Err(c.error_at(again_at, "ONCE is written twice"));
            }
            once = true;
        }
        let (target, _) = table_name(c, "a target table name")?;
        let by_at = c.loc();
        if !(c.eat_keyword("BY") && c.eat_keyword("NAME")) {
            return Err(c.error_at(
                by_at,
                "an append flow matches columns by name: write INSERT INTO target BY NAME SELECT ...",
            ));
        }
        let query = match once {
            true => once_query(c)?,
            false => source_query(c)?,
        };
        return Ok(vec![Statement::AppendFlow(AppendFlow {
            name,
            target,
            query,
            once,
            location: at,
        })]);
    } else {
        return Err(c.error_at(kind_at, "expected AUTO CDC or INSERT INTO after AS"));
    }
    let once_at = c.loc();
    // `AUTO CDC ONCE INTO`: ONCE before INTO (or FROM SNAPSHOT) is never a table name.
    let once = c.peek_keyword("ONCE")
        && (c.peek_nth_keyword(1, "INTO") || c.peek_nth_keyword(1, "FROM"))
        && c.eat_keyword("ONCE");
    let snapshot = from_snapshot(c);
    c.expect_keyword("INTO")?;
    if once {
        if snapshot {
            return Err(c.error_at(
                once_at,
                "AUTO CDC ONCE applies change events; a one-time load of a snapshot is an \
                 AUTO CDC FROM SNAPSHOT flow that runs while its source holds the snapshot",
            ));
        }
        return once_cdc_flow(c, name, at);
    }
    cdc_flow(c, Some(name), at, snapshot).map(flow_statements)
}

/// `AUTO CDC ONCE INTO target FROM source KEYS ...` (after `INTO`): a one-time backfill of
/// the change events in table `source`, read in batch, into the target that streaming
/// AUTO CDC flows also feed, with the same semantics (late events, deletes, ties). It is
/// three statements: a private streaming table `__once_<flow>` (in the target's schema),
/// the once append flow `<flow>__backfill` that copies `source` into it in the first run
/// after it is declared, and the AUTO CDC flow `<flow>` from it into the target. A full
/// refresh of the target refreshes the private table too, so the backfill runs again.
fn once_cdc_flow(c: &mut Cursor, name: String, at: Location) -> Result<Vec<Statement>> {
    let (mut flow, log) = cdc_flow_of(c, Some(name), at, false, true)?;
    if log.is_some() {
        return Err(c.error_at(
            at,
            "AUTO CDC ONCE reads a table in batch; a database change log is read by a streaming \
             AUTO CDC flow (drop ONCE)",
        ));
    }
    let source = flow.source.clone();
    let staging = TableName::new(Some(&flow.target.schema), &format!("__once_{}", flow.name));
    let table = StreamingTable {
        name: staging.clone(),
        columns: None,
        expectations: Vec::new(),
        comment: Some(format!(
            "the change events of {source}, copied once for AUTO CDC ONCE flow {}",
            flow.name
        )),
        properties: BTreeMap::new(),
        partitioned_by: Vec::new(),
        cluster_by: Vec::new(),
        query: None,
        private: true,
        sink: None,
        location: at,
    };
    let backfill = AppendFlow {
        name: format!("{}__backfill", flow.name),
        target: staging.clone(),
        query: SourceQuery {
            sql: format!(
                "SELECT * FROM \"{}\".\"{}\"",
                source.schema.replace('"', "\"\""),
                source.name.replace('"', "\"\"")
            ),
            source: QuerySource::Batch,
            reads: vec![source],
        },
        once: true,
        location: at,
    };
    flow.source = staging;
    flow.once = true;
    Ok(vec![
        Statement::StreamingTable(table),
        Statement::AppendFlow(backfill),
        Statement::Flow(flow),
    ])
}

/// Eats the word `ONCE` of `INSERT [ONCE] INTO [ONCE] target`, unless it is the target's
/// name (`INSERT INTO once BY NAME ...`, `INSERT INTO once.t ...`).
fn eat_once(c: &mut Cursor) -> bool {
    let names_a_table =
        c.peek_nth_keyword(1, "BY") || c.peek_nth(1).is_some_and(|t| t.token == Token::Period);
    if c.peek_keyword("ONCE") && !names_a_table {
        c.next();
        return true;
    }
    false
}

/// Eats `FROM SNAPSHOT` (between `AUTO CDC` and `INTO`), saying whether it was there.
fn from_snapshot(c: &mut Cursor) -> bool {
    if c.peek_keyword("FROM") && c.peek_nth_keyword(1, "SNAPSHOT") {
        c.next();
        c.next();
        return true;
    }
    false
}

/// The version of a table-mode snapshot (no `SNAPSHOT VERSION BY`): the run's start time.
pub const TABLE_MODE_VERSION_SQL: &str = "now()";

/// Everything after `AUTO CDC INTO` / `APPLY CHANGES INTO`: the target, the source, the
/// keys, then the clauses in any order, each at most once; a database change log's defaults
/// fill what its flow leaves out.
fn cdc_flow(
    c: &mut Cursor,
    name: Option<String>,
    at: Location,
    snapshot: bool,
) -> Result<(CdcFlow, Option<StreamingTable>)> {
    cdc_flow_of(c, name, at, snapshot, false)
}

/// [`cdc_flow`]; `once`: of `AUTO CDC ONCE`, whose source is a table read in batch.
fn cdc_flow_of(
    c: &mut Cursor,
    name: Option<String>,
    at: Location,
    snapshot: bool,
    once: bool,
) -> Result<(CdcFlow, Option<StreamingTable>)> {
    let (target, _) = table_name(c, "a target table name")?;
    c.expect_keyword("FROM")?;
    if once && c.peek_keyword("STREAM") && !c.peek_nth_keyword(1, "KEYS") {
        return Err(c.error_at(
            c.loc(),
            "AUTO CDC ONCE reads its source in batch, as Lakeflow requires: remove STREAM \
             (FROM table)",
        ));
    }
    let log = change_log(c, &target, at)?;
    let source = match &log {
        Some(t) => t.name.clone(),
        None => stream_source(c)?,
    };
    let keys = flow_keys(c)?;
    let mut clauses = FlowClauses::default();
    while !c.at_end() {
        clauses.clause(c, snapshot)?;
    }
    if log.is_some() {
        if snapshot {
            return Err(c.error_at(
                at,
                "a database change log feeds AUTO CDC, not AUTO CDC FROM SNAPSHOT",
            ));
        }
        clauses.change_log_defaults();
    }
    let (kind, sequence_by) = clauses.kind_and_sequence(c, snapshot)?;
    let flow = CdcFlow {
        name: name.unwrap_or_else(|| target.name.clone()),
        kind,
        target,
        source,
        keys,
        ignore_null_updates: clauses.ignore_null_updates.unwrap_or(false),
        delete_when: clauses.delete_when,
        truncate_when: clauses.truncate_when,
        sequence_by,
        columns: clauses.columns.unwrap_or_default(),
        stored_as: clauses.stored_as.unwrap_or_default(),
        track_history: clauses.track_history,
        once: false,
        location: at,
    };
    Ok((flow, log))
}

/// `KEYS (a, b)`. `KEYS ()` parses; the planner reports it, with the other contradictions
/// of a flow.
fn flow_keys(c: &mut Cursor) -> Result<Vec<String>> {
    c.expect_keyword("KEYS")?;
    c.expect_token(&Token::LParen)?;
    if c.eat_token(&Token::RParen) {
        return Ok(Vec::new());
    }
    let keys = ident_list(c, "a key column")?;
    if !c.eat_token(&Token::RParen) {
        return Err(c.expected("',' or ')'"));
    }
    Ok(keys)
}

/// The clauses of an AUTO CDC flow after its keys, as written (each at most once).
#[derive(Default)]
struct FlowClauses {
    ignore_null_updates: Option<bool>,
    delete_when: Option<String>,
    truncate_when: Option<String>,
    sequence_by: Option<SequenceBy>,
    columns: Option<ColumnSelection>,
    stored_as: Option<ScdType>,
    track_history: Option<ColumnSelection>,
    version_by: Option<String>,
}

impl FlowClauses {
    /// Reads the next clause; `snapshot`: the flow is AUTO CDC FROM SNAPSHOT.
    fn clause(&mut self, c: &mut Cursor, snapshot: bool) -> Result<()> {
        let at = c.loc();
        if c.peek_keyword("SNAPSHOT") {
            c.next();
            c.expect_keyword("VERSION")?;
            c.expect_keyword("BY")?;
            if !snapshot {
                return Err(c.error_at(
                    at,
                    "SNAPSHOT VERSION BY belongs to AUTO CDC FROM SNAPSHOT flows; \
                     a change-event flow orders its events with SEQUENCE BY",
                ));
            }
            let v = expression(c)?;
            once(c, &mut self.version_by, v, "SNAPSHOT VERSION BY", at)
        } else if c.peek_keyword("IGNORE") {
            only_changes(c, snapshot, "IGNORE NULL UPDATES", at)?;
            c.next();
            c.expect_keyword("NULL")?;
            c.expect_keyword("UPDATES")?;
            once(
                c,
                &mut self.ignore_null_updates,
                true,
                "IGNORE NULL UPDATES",
                at,
            )
        } else if c.peek_keyword("APPLY") {
            only_changes(c, snapshot, "APPLY AS", at)?;
            c.next();
            self.apply_as(c, at)
        } else if c.peek_keyword("SEQUENCE") {
            only_changes(c, snapshot, "SEQUENCE BY", at)?;
            c.next();
            c.expect_keyword("BY")?;
            let seq = sequence(c)?;
            once(c, &mut self.sequence_by, seq, "SEQUENCE BY", at)
        } else if c.eat_keyword("COLUMNS") {
            let sel = column_selection(c)?;
            once(c, &mut self.columns, sel, "COLUMNS", at)
        } else if c.eat_keyword("STORED") {
            let scd = stored_as(c, snapshot, at)?;
            once(c, &mut self.stored_as, scd, "STORED AS", at)
        } else if c.eat_keyword("TRACK") {
            c.expect_keyword("HISTORY")?;
            c.expect_keyword("ON")?;
            let sel = column_selection(c)?;
            once(c, &mut self.track_history, sel, "TRACK HISTORY ON", at)
        } else {
            Err(c.expected(if snapshot {
                "SNAPSHOT VERSION BY, COLUMNS, STORED AS, TRACK HISTORY ON or end of statement"
            } else {
                "IGNORE NULL UPDATES, APPLY AS DELETE WHEN, APPLY AS TRUNCATE WHEN, \
                 SEQUENCE BY, COLUMNS, STORED AS SCD TYPE, TRACK HISTORY ON or end of statement"
            }))
        }
    }

    /// `APPLY AS DELETE WHEN cond` / `APPLY AS TRUNCATE WHEN cond` (after `APPLY`).
    fn apply_as(&mut self, c: &mut Cursor, at: Location) -> Result<()> {
        c.expect_keyword("AS")?;
        if c.eat_keyword("DELETE") {
            c.expect_keyword("WHEN")?;
            let cond = expression(c)?;
            once(c, &mut self.delete_when, cond, "APPLY AS DELETE WHEN", at)
        } else if c.eat_keyword("TRUNCATE") {
            c.expect_keyword("WHEN")?;
            let cond = expression(c)?;
            once(
                c,
                &mut self.truncate_when,
                cond,
                "APPLY AS TRUNCATE WHEN",
                at,
            )
        } else {
            Err(c.expected("DELETE or TRUNCATE"))
        }
    }

    /// What a database change log says by itself: it orders its changes exactly, says
    /// which are deletes and truncates, and its own columns stay in the change table.
    fn change_log_defaults(&mut self) {
        self.sequence_by.get_or_insert_with(|| {
            SequenceBy::Struct(
                ["_commit_lsn", "_change_seq"]
                    .iter()
                    .map(|c| (c.to_string(), c.to_string()))
                    .collect(),
            )
        });
        self.delete_when
            .get_or_insert_with(|| "_change_type = 'delete'".to_string());
        // A TRUNCATE on the source empties an SCD type 1 target at its position and closes
        // every open version of an SCD type 2 one there.
        self.truncate_when
            .get_or_insert_with(|| "_change_type = 'truncate'".to_string());
        let change_columns = CHANGE_COLUMNS.iter().map(|c| c.to_string());
        self.columns = Some(match self.columns.take().unwrap_or_default() {
            ColumnSelection::All => ColumnSelection::Except(change_columns.collect()),
            ColumnSelection::Except(mut except) => {
                except.extend(
                    change_columns
                        .filter(|c| !except.contains(c))
                        .collect::<Vec<_>>(),
                );
                ColumnSelection::Except(except)
            }
            only => only,
        });
    }

    /// The flow's kind and what orders its rows: `SEQUENCE BY` for change events (which
    /// need one), `SNAPSHOT VERSION BY` (else the run's start time) for snapshots.
    fn kind_and_sequence(&self, c: &Cursor, snapshot: bool) -> Result<(FlowKind, SequenceBy)> {
        if snapshot {
            let version_by = self.version_by.clone();
            let seq = SequenceBy::Expr(
                version_by
                    .clone()
                    .unwrap_or_else(|| TABLE_MODE_VERSION_SQL.to_string()),
            );
            return Ok((FlowKind::Snapshot { version_by }, seq));
        }
        let Some(sequence_by) = self.sequence_by.clone() else {
            return Err(c.expected("SEQUENCE BY (a flow needs one)"));
        };
        Ok((FlowKind::Changes, sequence_by))
    }
}

/// Refuses a change-event clause in an AUTO CDC FROM SNAPSHOT flow.
fn only_changes(c: &Cursor, snapshot: bool, clause: &str, at: Location) -> Result<()> {
    if snapshot {
        return Err(c.error_at(
            at,
            format!(
                "{clause} is not allowed in AUTO CDC FROM SNAPSHOT: a snapshot is a full \
                 extract, ordered by SNAPSHOT VERSION BY"
            ),
        ));
    }
    Ok(())
}

/// `STORED AS SCD TYPE 1 | SCD TYPE 2 | SNAPSHOTS` (after `STORED`).
fn stored_as(c: &mut Cursor, snapshot: bool, at: Location) -> Result<ScdType> {
    c.expect_keyword("AS")?;
    if c.eat_keyword("SNAPSHOTS") {
        if !snapshot {
            return Err(c.error_at(
                at,
                "STORED AS SNAPSHOTS needs snapshots: use it with AUTO CDC FROM SNAPSHOT",
            ));
        }
        return Ok(ScdType::Snapshots);
    }
    c.expect_keyword("SCD")?;
    c.expect_keyword("TYPE")?;
    let scd = match c.peek().map(|t| &t.token) {
        Some(Token::Number(n, _)) if n == "1" => ScdType::Type1,
        Some(Token::Number(n, _)) if n == "2" => ScdType::Type2,
        _ => return Err(c.expected("1 or 2")),
    };
    c.next();
    Ok(scd)
}

/// `FROM STREAM read_database('conn', table => ..., mode => 'cdc')` in an AUTO CDC flow:
/// the one-switch form of a replicated table. The flow reads a change table `<target>_changes`
/// that this declares (the database's changes, kept as they came), with the change log's
/// defaults (see `cdc_flow`). `None` for any other source.
fn change_log(c: &mut Cursor, target: &TableName, at: Location) -> Result<Option<StreamingTable>> {
    let is_log = c.peek_keyword("STREAM")
        && c.peek_nth(1)
            .is_some_and(|t| is_keyword(&t.token, "read_database"))
        && c.peek_nth(2).is_some_and(|t| t.token == Token::LParen);
    if !is_log {
        return Ok(None);
    }
    c.next();
    let fn_at = c.loc();
    // The call alone, up to its closing parenthesis: sqlparser would take `KEYS (id)` after
    // it for an alias.
    let mut depth = 0usize;
    let len = c
        .rest()
        .iter()
        .position(|t| {
            match t.token {
                Token::LParen => depth += 1,
                Token::RParen => depth = depth.saturating_sub(1),
                _ => return false,
            }
            depth == 0
        })
        .map_or(c.rest().len(), |i| i + 1);
    let call = c.rest()[..len].to_vec();
    let (factor, _) = run_sqlparser(c.src, call, &c.end, |p| p.parse_table_factor())?;
    for _ in 0..len {
        c.next();
    }
    let TableFactor::Table {
        args: Some(args), ..
    } = &factor
    else {
        return Err(c.error_at(fn_at, "expected read_database('connection', ...)"));
    };
    let read = read_database(c.src, args, fn_at)?;
    if read
        .options
        .get("mode")
        .map(|m| m.to_ascii_lowercase())
        .as_deref()
        != Some("cdc")
    {
        return Err(c.error_at(
            fn_at,
            "an AUTO CDC flow reads a database's change log: read_database(..., mode => 'cdc'); \
             a watermark load has no deletes: load it into a streaming table and AUTO CDC from it",
        ));
    }
    let name = TableName::new(Some(&target.schema), &format!("{}_changes", target.name));
    Ok(Some(StreamingTable {
        comment: Some(format!(
            "the changes of {} from connection {}, as the database sent them",
            read.options
                .get("table")
                .map_or("the table", String::as_str),
            read.connection
        )),
        name,
        columns: None,
        expectations: Vec::new(),
        properties: BTreeMap::new(),
        partitioned_by: Vec::new(),
        cluster_by: Vec::new(),
        query: Some(SourceQuery {
            sql: format!("SELECT * FROM {SOURCE_PLACEHOLDER}"),
            source: QuerySource::ReadDatabase(read),
            reads: Vec::new(),
        }),
        private: false,
        sink: None,
        location: at,
    }))
}

// ---------------------------------------------------------------------------------------
// CREATE POINT IN TIME TABLE

fn pit_table(c: &mut Cursor, at: Location) -> Result<PitTable> {
    let (name, _) = table_name(c, "a table name")?;
    let mut properties = None;
    let mut keys = None;
    let mut spine = None;
    let mut sources = None;
    while !c.at_end() {
        let clause_at = c.loc();
        if c.eat_keyword("TBLPROPERTIES") {
            let p = tblproperties(c)?;
            once(c, &mut properties, p, "TBLPROPERTIES", clause_at)?;
        } else if c.eat_keyword("KEYS") {
            c.expect_token(&Token::LParen)?;
            let k = ident_list(c, "a key column")?;
            if !c.eat_token(&Token::RParen) {
                return Err(c.expected("',' or ')'"));
            }
            once(c, &mut keys, k, "KEYS", clause_at)?;
        } else if c.eat_keyword("AS") {
            c.expect_keyword("OF")?;
            let sp = spine_clause(c)?;
            once(c, &mut spine, sp, "AS OF", clause_at)?;
        } else if c.eat_keyword("FROM") {
            let mut list = vec![table_name(c, "a historised table")?.0];
            while c.eat_token(&Token::Comma) {
                list.push(table_name(c, "a historised table")?.0);
            }
            once(c, &mut sources, list, "FROM", clause_at)?;
        } else {
            return Err(c.expected("TBLPROPERTIES, KEYS, AS OF, FROM or end of statement"));
        }
    }
    let Some(keys) = keys else {
        return Err(c.expected("KEYS (a point-in-time table needs its business key)"));
    };
    let Some(spine) = spine else {
        return Err(c.expected("AS OF (the as-of values)"));
    };
    let Some(sources) = sources else {
        return Err(c.expected("FROM (the historised tables)"));
    };
    Ok(PitTable {
        name,
        keys,
        spine,
        sources,
        properties: properties.unwrap_or_default(),
        location: at,
    })
}

/// `RANGE (start, stop, step)`, `(SELECT ...)` or `(v1, v2, ...)`.
fn spine_clause(c: &mut Cursor) -> Result<Spine> {
    let ranged = c.eat_keyword("RANGE");
    c.expect_token(&Token::LParen)?;
    if !ranged && (c.peek_keyword("SELECT") || c.peek_keyword("WITH")) {
        let q = c.sql(|p| p.parse_query())?;
        if !c.eat_token(&Token::RParen) {
            return Err(c.expected("')'"));
        }
        return Ok(Spine::Query(q.to_string()));
    }
    let at = c.loc();
    let exprs = c.sql(|p| p.parse_comma_separated(Parser::parse_expr))?;
    if !c.eat_token(&Token::RParen) {
        return Err(c.expected("',' or ')'"));
    }
    let mut exprs: Vec<String> = exprs.iter().map(ToString::to_string).collect();
    if !ranged {
        return Ok(Spine::List(exprs));
    }
    if exprs.len() != 3 {
        return Err(c.error_at(
            at,
            "AS OF RANGE takes a start, a stop and a step: RANGE (DATE '2024-01-01', \
             DATE '2024-12-31', INTERVAL 1 DAY)",
        ));
    }
    let step = exprs.pop().unwrap_or_default();
    let stop = exprs.pop().unwrap_or_default();
    let start = exprs.pop().unwrap_or_default();
    Ok(Spine::Range { start, stop, step })
}

/// Stores a clause's value, or fails if the clause was already given.
fn once<T>(c: &Cursor, slot: &mut Option<T>, value: T, clause: &str, at: Location) -> Result<()> {
    if slot.is_some() {
        return Err(c.error_at(at, format!("duplicate {clause} clause")));
    }
    *slot = Some(value);
    Ok(())
}

/// `STREAM(source)`, `STREAM source` or `source`.
fn stream_source(c: &mut Cursor) -> Result<TableName> {
    if c.peek_keyword("STREAM") {
        match c.peek_nth(1).map(|t| &t.token) {
            Some(Token::LParen) => {
                c.next();
                c.next();
                let (name, _) = table_name(c, "a source table name")?;
                c.expect_token(&Token::RParen)?;
                return Ok(name);
            }
            // `FROM stream KEYS` reads a table that is called `stream`.
            Some(t @ Token::Word(_)) if !is_keyword(t, "KEYS") => {
                c.next();
            }
            _ => {}
        }
    }
    Ok(table_name(c, "a source table name")?.0)
}

/// One SQL expression, printed back as SQL. sqlparser stops at the first token that cannot
/// continue the expression, which is the next strata keyword.
fn expression(c: &mut Cursor) -> Result<String> {
    Ok(c.sql(|p| p.parse_expr())?.to_string())
}

/// `SEQUENCE BY expr` or `SEQUENCE BY STRUCT(a, b, ...)`.
fn sequence(c: &mut Cursor) -> Result<SequenceBy> {
    let is_struct =
        c.peek_keyword("STRUCT") && c.peek_nth(1).is_some_and(|t| t.token == Token::LParen);
    if !is_struct {
        return Ok(SequenceBy::Expr(expression(c)?));
    }
    c.next();
    c.next();
    let exprs = c.sql(|p| p.parse_comma_separated(Parser::parse_expr))?;
    if !c.eat_token(&Token::RParen) {
        return Err(c.expected("',' or ')'"));
    }
    let fields = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let name = match e {
                Expr::Identifier(id) => id.value.clone(),
                Expr::CompoundIdentifier(parts) => match parts.last() {
                    Some(id) => id.value.clone(),
                    None => format!("c{i}"),
                },
                _ => format!("c{i}"),
            };
            (name, e.to_string())
        })
        .collect();
    Ok(SequenceBy::Struct(fields))
}

/// `a, b` / `(a, b)` / `*` / `* EXCEPT (a, b)` (parentheses optional after EXCEPT).
fn column_selection(c: &mut Cursor) -> Result<ColumnSelection> {
    if c.eat_token(&Token::Mul) {
        if !c.eat_keyword("EXCEPT") {
            return Ok(ColumnSelection::All);
        }
        return Ok(ColumnSelection::Except(maybe_parenthesized_list(c)?));
    }
    Ok(ColumnSelection::Only(maybe_parenthesized_list(c)?))
}

fn maybe_parenthesized_list(c: &mut Cursor) -> Result<Vec<String>> {
    if c.eat_token(&Token::LParen) {
        let names = ident_list(c, "a column name")?;
        if !c.eat_token(&Token::RParen) {
            return Err(c.expected("',' or ')'"));
        }
        Ok(names)
    } else {
        ident_list(c, "a column name")
    }
}
