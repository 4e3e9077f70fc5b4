//! Dataset names matched without regard to case, as Spark matches them.
//!
//! A pipeline may declare `Rides_Clean` and read it as `LIVE.RIDES_CLEAN`: before the
//! dataset graph is built, every name a statement reads or writes that is a declared
//! dataset's name in another case becomes the declared spelling, in the statement's fields
//! and in its SQL text (a table in a FROM clause keeps the name it was written with as its
//! alias, so `RIDES_CLEAN.km` still names its column). The SQL text's `LIVE.name` becomes
//! the pipeline's schema, which is what it means. Two datasets whose names differ only in
//! case are an error naming both. Column names are not touched: they are matched as
//! written.

use crate::ast::*;
use crate::error::{Result, SqlError};
use crate::lex::GENERIC;
use sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, Ident, ObjectName, ObjectNamePart, Query, TableAlias,
    TableFactor, Value, VisitMut, VisitorMut,
};
use sqlparser::parser::Parser;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;

/// A name's key: schema and name lower-cased.
fn key(t: &TableName) -> (String, String) {
    (t.schema.to_lowercase(), t.name.to_lowercase())
}

/// The pipeline's declared datasets by their key.
struct Declared {
    names: BTreeMap<(String, String), TableName>,
    default_schema: String,
}

impl Declared {
    /// The declared spelling of `t`, when it differs from `t`'s.
    fn spelling(&self, t: &TableName) -> Option<&TableName> {
        self.names.get(&key(t)).filter(|d| *d != t)
    }

    fn fix(&self, t: &mut TableName) {
        if let Some(d) = self.spelling(t) {
            *t = d.clone();
        }
    }
}

/// `pipeline` with its names in their declared spelling (see the module docs).
pub(crate) fn match_case(mut pipeline: Pipeline) -> Result<Pipeline> {
    let declared = declared(&pipeline)?;
    for s in pipeline.statements.iter_mut() {
        match s {
            Statement::StreamingTable(t) => {
                if let Some(q) = t.query.as_mut() {
                    source_query(&declared, q)?;
                }
            }
            Statement::Flow(f) => {
                declared.fix(&mut f.target);
                declared.fix(&mut f.source);
            }
            Statement::AppendFlow(f) => {
                declared.fix(&mut f.target);
                source_query(&declared, &mut f.query)?;
            }
            Statement::MaterializedView(m) => batch_query(&declared, &mut m.query)?,
            Statement::View(v) => batch_query(&declared, &mut v.query)?,
            Statement::PointInTime(p) => {
                p.sources.iter_mut().for_each(|t| declared.fix(t));
                if let Spine::Query(sql) = &mut p.spine {
                    *sql = rename_in_sql(&declared, sql)?;
                }
            }
            Statement::Connection(_) => {}
        }
    }
    Ok(pipeline)
}

/// Every dataset the pipeline declares; two differing only in case are an error at the
/// second, naming the first.
fn declared(pipeline: &Pipeline) -> Result<Declared> {
    let mut names: BTreeMap<(String, String), (TableName, Location)> = BTreeMap::new();
    for s in &pipeline.statements {
        let (name, at) = match s {
            Statement::StreamingTable(t) => (&t.name, t.location),
            Statement::MaterializedView(m) => (&m.name, m.location),
            Statement::View(v) => (&v.name, v.location),
            Statement::PointInTime(p) => (&p.name, p.location),
            Statement::Flow(_) | Statement::AppendFlow(_) | Statement::Connection(_) => continue,
        };
        match names.get(&key(name)) {
            // The same spelling twice is the planner's "declared twice".
            Some((first, first_at)) if first != name => {
                return Err(SqlError::Plan {
                    location: at,
                    message: format!(
                        "{name} and {first} differ only in case, and dataset names are \
                         matched without regard to case (as in Spark): rename one of them"
                    ),
                    first: Some(*first_at),
                })
            }
            Some(_) => {}
            None => {
                names.insert(key(name), (name.clone(), at));
            }
        }
    }
    Ok(Declared {
        names: names.into_iter().map(|(k, (t, _))| (k, t)).collect(),
        default_schema: pipeline.default_schema.clone(),
    })
}

fn source_query(declared: &Declared, q: &mut SourceQuery) -> Result<()> {
    match &mut q.source {
        QuerySource::Table(t)
        | QuerySource::Changes(TableChanges {
            source: ChangeSource::Table(t),
            ..
        }) => declared.fix(t),
        _ => {}
    }
    fix_reads(declared, &mut q.reads);
    q.sql = rename_in_sql(declared, &q.sql)?;
    Ok(())
}

fn batch_query(declared: &Declared, q: &mut BatchQuery) -> Result<()> {
    fix_reads(declared, &mut q.reads);
    q.sql = rename_in_sql(declared, &q.sql)?;
    Ok(())
}

fn fix_reads(declared: &Declared, reads: &mut Vec<TableName>) {
    let mut seen = BTreeSet::new();
    reads.iter_mut().for_each(|t| declared.fix(t));
    reads.retain(|t| seen.insert(t.clone()));
}

/// `sql` (a query this crate printed) with its tables in their declared spelling and
/// `LIVE.name` in the pipeline's schema; the same text when nothing changes.
fn rename_in_sql(declared: &Declared, sql: &str) -> Result<String> {
    let internal = |e: sqlparser::parser::ParserError| SqlError::Plan {
        location: Location::default(),
        message: format!("strata could not read back its own SQL {sql:?} (this is a bug): {e}"),
        first: None,
    };
    let mut query: Query = Parser::new(&GENERIC)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_query())
        .map(|q| *q)
        .map_err(internal)?;
    let mut renamer = Renamer {
        declared,
        ctes: BTreeSet::new(),
        changed: false,
    };
    let _ = query.visit(&mut renamer);
    Ok(match renamer.changed {
        true => query.to_string(),
        false => sql.to_string(),
    })
}

struct Renamer<'a> {
    declared: &'a Declared,
    /// CTE names (lower-cased): a one-part name among them is not a dataset.
    ctes: BTreeSet<String>,
    changed: bool,
}

impl Renamer<'_> {
    /// The table `parts` name, in its declared spelling, when the text should say it
    /// otherwise: another case, or a `LIVE.` prefix.
    fn rename(&self, parts: &[String]) -> Option<TableName> {
        if parts.len() == 1 && self.ctes.contains(&parts[0].to_lowercase()) {
            return None;
        }
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let t = TableName::from_parts(&refs, &self.declared.default_schema).ok()?;
        let live = parts.len() == 2 && parts[0].eq_ignore_ascii_case("live");
        match self.declared.spelling(&t) {
            Some(d) => Some(d.clone()),
            None if live => Some(t),
            None => None,
        }
    }
}

impl VisitorMut for Renamer<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, q: &mut Query) -> ControlFlow<()> {
        if let Some(with) = &q.with {
            for cte in &with.cte_tables {
                self.ctes.insert(cte.alias.name.value.to_lowercase());
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, f: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table {
            name, args, alias, ..
        } = f
        else {
            return ControlFlow::Continue(());
        };
        let parts: Vec<String> = name
            .0
            .iter()
            .filter_map(|p| match p {
                ObjectNamePart::Identifier(id) => Some(id.value.clone()),
                _ => None,
            })
            .collect();
        if parts.len() != name.0.len() {
            return ControlFlow::Continue(());
        }
        match args {
            None => {
                let Some(t) = self.rename(&parts) else {
                    return ControlFlow::Continue(());
                };
                if alias.is_none() {
                    if let Some(ObjectNamePart::Identifier(last)) = name.0.last() {
                        *alias = Some(TableAlias {
                            explicit: true,
                            name: last.clone(),
                            columns: Vec::new(),
                            at: None,
                        });
                    }
                }
                let quoted = |s: &str| ObjectNamePart::Identifier(Ident::with_quote('`', s));
                *name = ObjectName(match parts.len() {
                    1 if t.schema == self.declared.default_schema => vec![quoted(&t.name)],
                    _ => vec![quoted(&t.schema), quoted(&t.name)],
                });
                self.changed = true;
            }
            // `as_of('t', ...)`, `table_changes('t', ...)`: the table is the first argument.
            Some(a) => {
                let function = parts.last().map(|p| p.to_ascii_lowercase());
                if !matches!(function.as_deref(), Some("as_of" | "table_changes")) {
                    return ControlFlow::Continue(());
                }
                let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v)))) =
                    a.args.first_mut()
                else {
                    return ControlFlow::Continue(());
                };
                let Value::SingleQuotedString(text) = &mut v.value else {
                    return ControlFlow::Continue(());
                };
                let parts: Vec<String> = text.split('.').map(|p| p.trim().to_string()).collect();
                if let Some(t) = self.rename(&parts) {
                    *text = t.to_string();
                    self.changed = true;
                }
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline(text: &str) -> Pipeline {
        match_case(crate::parse_pipeline(text).expect("parses")).expect("matches")
    }

    #[test]
    fn reads_take_the_declared_spelling_and_keep_their_alias() {
        let p = pipeline(
            "CREATE STREAMING TABLE Raw AS SELECT * FROM STREAM read_files('in', format => 'json');
             CREATE MATERIALIZED VIEW m AS SELECT RAW.a, x.b FROM LIVE.RAW JOIN default.raw AS x ON RAW.a = x.a;
             CREATE MATERIALIZED VIEW n AS WITH raw AS (SELECT 1 AS a) SELECT * FROM raw;
             CREATE MATERIALIZED VIEW o AS SELECT * FROM as_of('RAW', TIMESTAMP '2024-01-01 00:00:00');",
        );
        let Statement::MaterializedView(m) = &p.statements[1] else {
            panic!("a materialized view")
        };
        assert_eq!(
            m.query.sql,
            "SELECT RAW.a, x.b FROM `default`.`Raw` AS RAW JOIN `default`.`Raw` AS x ON RAW.a = x.a"
        );
        assert_eq!(m.query.reads, vec![TableName::new(None, "Raw")]);
        // A CTE of the same name is not the dataset.
        let Statement::MaterializedView(n) = &p.statements[2] else {
            panic!("a materialized view")
        };
        assert_eq!(n.query.sql, "WITH raw AS (SELECT 1 AS a) SELECT * FROM raw");
        let Statement::MaterializedView(o) = &p.statements[3] else {
            panic!("a materialized view")
        };
        assert!(
            o.query.sql.contains("as_of('default.Raw'"),
            "{}",
            o.query.sql
        );
    }

    #[test]
    fn flows_and_streams_take_the_declared_spelling() {
        let p = pipeline(
            "CREATE STREAMING TABLE Raw AS SELECT * FROM STREAM read_files('in', format => 'json');
             CREATE STREAMING TABLE Target;
             CREATE FLOW f AS AUTO CDC INTO TARGET FROM STREAM(live.raw) KEYS (id) SEQUENCE BY ts;
             CREATE STREAMING TABLE copy AS SELECT * FROM STREAM(RAW);",
        );
        let Statement::Flow(f) = &p.statements[2] else {
            panic!("a flow")
        };
        assert_eq!(
            (&f.target, &f.source),
            (
                &TableName::new(None, "Target"),
                &TableName::new(None, "Raw")
            )
        );
        let Statement::StreamingTable(t) = &p.statements[3] else {
            panic!("a table")
        };
        let q = t.query.as_ref().expect("a query");
        assert_eq!(q.source, QuerySource::Table(TableName::new(None, "Raw")));
    }

    #[test]
    fn names_differing_only_in_case_are_refused_naming_both() {
        let err = match_case(
            crate::parse_pipeline(
                "CREATE MATERIALIZED VIEW orders AS SELECT 1 AS a;\nCREATE MATERIALIZED VIEW Orders AS SELECT 2 AS a;",
            )
            .expect("parses"),
        )
        .expect_err("refused");
        let text = err.to_string();
        assert!(
            text.starts_with("2:1: default.Orders and default.orders differ only in case"),
            "{text}"
        );
        assert!(text.ends_with("(first at 1:1)"), "{text}");
    }
}
