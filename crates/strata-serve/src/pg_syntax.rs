//! PostgreSQL's own syntax in the catalog queries clients send, made plannable by DataFusion
//! (pure: text in, text or an answer out). psql's `\d TABLE` is the yardstick: it sends eight
//! queries over `pg_catalog` with `COLLATE pg_catalog.default`, `OPERATOR(pg_catalog.~)`,
//! casts to `regclass`/`regtype`/`regnamespace`, and scalar subqueries and joins over
//! catalog tables that a Delta warehouse never fills (defaults, collations, policies,
//! statistics objects, publications, inheritance, indexes, constraints, triggers).
//!
//! Only statements that name `pg_catalog` are looked at; everything else reaches the engine
//! as the client sent it.
//!
//! - `x COLLATE pg_catalog.default` is `x`; `a OPERATOR(pg_catalog.~) b` is `a ~ b` (and the
//!   other comparison and pattern operators likewise).
//! - `x::pg_catalog.regclass`, `::regtype` and `::regnamespace` call the catalog's
//!   `strata_regclass`, `format_type` and `strata_regnamespace`, which name the relation,
//!   type and schema an oid stands for; other `pg_catalog.` types lose their schema.
//! - A scalar subquery reading one of the [`EMPTY_RELATIONS`] is `NULL`, and a query each of
//!   whose branches inner-joins one of them has no rows: [`Adapted::NoRows`] names its
//!   columns, so the server answers without planning functions it does not have
//!   (`pg_get_expr`, `pg_get_statisticsobjdef_columns`, ...).

use deltalake::datafusion::sql::sqlparser::ast::{
    BinaryOperator, DataType, Expr, JoinOperator, SelectItem, SetExpr, Statement, TableFactor,
    TableWithJoins, VisitMut, VisitorMut,
};
use deltalake::datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use deltalake::datafusion::sql::sqlparser::parser::Parser;
use std::ops::ControlFlow;

/// `pg_catalog` relations that hold no rows for a Delta warehouse: no column defaults,
/// collations, row-level policies, extended statistics, publications, inheritance, indexes,
/// constraints, triggers or rules.
pub(crate) const EMPTY_RELATIONS: &[&str] = &[
    "pg_attrdef",
    "pg_collation",
    "pg_policy",
    "pg_statistic_ext",
    "pg_publication",
    "pg_publication_rel",
    "pg_publication_namespace",
    "pg_inherits",
    "pg_index",
    "pg_constraint",
    "pg_trigger",
    "pg_rewrite",
];

/// What a statement becomes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Adapted {
    /// Nothing to change: the text as it came.
    Same,
    /// The statement in syntax DataFusion plans.
    Sql(String),
    /// A query that reads an empty catalog relation on every branch: no rows, and these
    /// columns (text).
    NoRows(Vec<String>),
}

/// `sql` (one statement) adapted for DataFusion; see the module's documentation.
pub(crate) fn adapt(sql: &str) -> Adapted {
    if !sql.to_ascii_lowercase().contains("pg_catalog") {
        return Adapted::Same;
    }
    let Ok(mut statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return Adapted::Same;
    };
    let [Statement::Query(query)] = statements.as_mut_slice() else {
        return Adapted::Same;
    };
    if always_empty(&query.body) {
        return Adapted::NoRows(column_names(&query.body));
    }
    let mut rewrite = Rewrite { changed: false };
    let _ = query.visit(&mut rewrite);
    if rewrite.changed {
        Adapted::Sql(query.to_string())
    } else {
        Adapted::Same
    }
}

/// Whether every branch of `body` inner-joins (or cross-joins) an empty relation.
fn always_empty(body: &SetExpr) -> bool {
    match body {
        SetExpr::Select(select) => select.from.iter().any(reads_an_empty_relation),
        SetExpr::Query(query) => always_empty(&query.body),
        SetExpr::SetOperation { left, right, .. } => always_empty(left) && always_empty(right),
        _ => false,
    }
}

/// Whether `from` has no rows because an empty relation is its first relation or is
/// joined to it by an inner or cross join.
fn reads_an_empty_relation(from: &TableWithJoins) -> bool {
    is_empty_relation(&from.relation)
        || from.joins.iter().any(|join| {
            matches!(
                join.join_operator,
                JoinOperator::Join(_) | JoinOperator::Inner(_) | JoinOperator::CrossJoin(_)
            ) && is_empty_relation(&join.relation)
        })
}

fn is_empty_relation(factor: &TableFactor) -> bool {
    let TableFactor::Table { name, .. } = factor else {
        return false;
    };
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| p.to_string().trim_matches('"').to_ascii_lowercase())
        .collect();
    match parts.as_slice() {
        [table] | [_, table] => {
            (parts.len() == 1 || parts[0] == "pg_catalog")
                && EMPTY_RELATIONS.contains(&table.as_str())
        }
        _ => false,
    }
}

/// The names of the first branch's columns: aliases, else the column's last name, else
/// `?column?` (as PostgreSQL names them).
fn column_names(body: &SetExpr) -> Vec<String> {
    match body {
        SetExpr::Select(select) => select
            .projection
            .iter()
            .map(|item| match item {
                SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                SelectItem::UnnamedExpr(Expr::Identifier(ident)) => ident.value.clone(),
                SelectItem::UnnamedExpr(Expr::CompoundIdentifier(idents)) => idents
                    .last()
                    .map_or_else(|| "?column?".to_string(), |i| i.value.clone()),
                SelectItem::UnnamedExpr(Expr::Function(f)) => f
                    .name
                    .0
                    .last()
                    .map_or_else(|| "?column?".to_string(), |p| p.to_string()),
                _ => "?column?".to_string(),
            })
            .collect(),
        SetExpr::Query(query) => column_names(&query.body),
        SetExpr::SetOperation { left, .. } => column_names(left),
        _ => Vec::new(),
    }
}

/// The expression rewrites, after the children of each expression.
struct Rewrite {
    changed: bool,
}

impl VisitorMut for Rewrite {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Some(new) = rewritten(expr) {
            *expr = new;
            self.changed = true;
        }
        ControlFlow::Continue(())
    }
}

/// What `expr` becomes, if it is PostgreSQL's own syntax.
fn rewritten(expr: &Expr) -> Option<Expr> {
    match expr {
        Expr::Collate { expr, .. } => Some(nested(expr)),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::PGCustomBinaryOperator(path),
            right,
        } => {
            let op = match path.as_slice() {
                [schema, op] if schema.eq_ignore_ascii_case("pg_catalog") => op,
                _ => return None,
            };
            Some(Expr::BinaryOp {
                left: left.clone(),
                op: plain_operator(op)?,
                right: right.clone(),
            })
        }
        Expr::Cast {
            expr, data_type, ..
        } => cast(expr, data_type),
        Expr::Subquery(query) if always_empty(&query.body) => Some(parse_expr("NULL")),
        _ => None,
    }
}

/// `(expr)`, so that the expression keeps its place among operators.
fn nested(expr: &Expr) -> Expr {
    Expr::Nested(Box::new(expr.clone()))
}

/// The operator `OPERATOR(pg_catalog.op)` stands for.
fn plain_operator(op: &str) -> Option<BinaryOperator> {
    Some(match op {
        "~" => BinaryOperator::PGRegexMatch,
        "~*" => BinaryOperator::PGRegexIMatch,
        "!~" => BinaryOperator::PGRegexNotMatch,
        "!~*" => BinaryOperator::PGRegexNotIMatch,
        "~~" => BinaryOperator::PGLikeMatch,
        "!~~" => BinaryOperator::PGNotLikeMatch,
        "=" => BinaryOperator::Eq,
        "<>" | "!=" => BinaryOperator::NotEq,
        "<" => BinaryOperator::Lt,
        "<=" => BinaryOperator::LtEq,
        ">" => BinaryOperator::Gt,
        ">=" => BinaryOperator::GtEq,
        _ => return None,
    })
}

/// A cast to a `pg_catalog` type: the object-identifier types through the catalog's
/// functions, the others without their schema.
fn cast(expr: &Expr, data_type: &DataType) -> Option<Expr> {
    let name = catalog_type(data_type)?;
    let call = |f: &str, rest: &str| parse_expr(&format!("{f}({expr}{rest})"));
    Some(match name.as_str() {
        "regclass" => call("strata_regclass", ""),
        "regnamespace" => call("strata_regnamespace", ""),
        "regtype" => call("format_type", ", NULL"),
        "text" | "name" | "char" | "varchar" => parse_expr(&format!("CAST({expr} AS TEXT)")),
        "oid" | "int4" | "regproc" => parse_expr(&format!("CAST({expr} AS INT)")),
        "int2" => parse_expr(&format!("CAST({expr} AS SMALLINT)")),
        "int8" => parse_expr(&format!("CAST({expr} AS BIGINT)")),
        "bool" => parse_expr(&format!("CAST({expr} AS BOOLEAN)")),
        // Arrays of catalog types (`int2[]`, `oid[]`): the value as it is.
        _ if name.ends_with("[]") => nested(expr),
        _ => return None,
    })
}

/// `regclass` for `pg_catalog.regclass` (and `int2[]` for `pg_catalog.int2[]`); `None` for a
/// type outside `pg_catalog`.
fn catalog_type(data_type: &DataType) -> Option<String> {
    let text = data_type.to_string().to_ascii_lowercase();
    match text.strip_prefix("pg_catalog.") {
        Some(name) => Some(name.to_string()),
        None => matches!(text.as_str(), "regclass" | "regtype" | "regnamespace").then_some(text),
    }
}

/// `text` as an expression; the texts are built here from expressions that parsed.
fn parse_expr(text: &str) -> Expr {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(text)
        .and_then(|mut p| p.parse_expr())
        .unwrap_or_else(|_| Expr::Nested(Box::new(parse_null())))
}

fn parse_null() -> Expr {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql("NULL")
        .and_then(|mut p| p.parse_expr())
        .expect("NULL parses")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(text: &str) -> String {
        match adapt(text) {
            Adapted::Sql(s) => s,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn statements_without_pg_catalog_are_left_alone() {
        assert_eq!(adapt("SELECT a COLLATE \"C\" FROM t"), Adapted::Same);
        assert_eq!(adapt("SELECT * FROM pg_catalog.pg_class"), Adapted::Same);
        assert_eq!(adapt("not sql at all pg_catalog"), Adapted::Same);
    }

    #[test]
    fn psqls_lookup_of_a_table_by_name() {
        let out = sql(
            "SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c \
             LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relname OPERATOR(pg_catalog.~) '^(users)$' COLLATE pg_catalog.default \
             AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 2, 3",
        );
        assert!(out.contains("c.relname ~ ('^(users)$')"), "{out}");
        assert!(!out.contains("COLLATE"), "{out}");
    }

    #[test]
    fn object_identifier_casts_become_catalog_functions() {
        let out = sql("SELECT CASE WHEN c.reloftype = 0 THEN '' \
             ELSE c.reloftype::pg_catalog.regtype::pg_catalog.text END, \
             c.oid::pg_catalog.regclass FROM pg_catalog.pg_class c");
        assert!(
            out.contains("CAST(format_type(c.reloftype, NULL) AS TEXT)"),
            "{out}"
        );
        assert!(out.contains("strata_regclass(c.oid)"), "{out}");
    }

    #[test]
    fn subqueries_of_empty_relations_are_null() {
        let out = sql(
            "SELECT a.attname, (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid, true) \
             FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid) \
             FROM pg_catalog.pg_attribute a",
        );
        assert!(out.starts_with("SELECT a.attname, NULL FROM"), "{out}");
    }

    #[test]
    fn queries_of_empty_relations_have_no_rows_and_named_columns() {
        assert_eq!(
            adapt(
                "SELECT pol.polname, pol.polpermissive, \
                 pg_catalog.pg_get_expr(pol.polqual, pol.polrelid), \
                 CASE pol.polcmd WHEN 'r' THEN 'SELECT' END AS cmd \
                 FROM pg_catalog.pg_policy pol WHERE pol.polrelid = '16386' ORDER BY 1"
            ),
            Adapted::NoRows(vec![
                "polname".into(),
                "polpermissive".into(),
                "pg_get_expr".into(),
                "cmd".into()
            ])
        );
        // Every branch of a UNION, and a comma join.
        let union = "SELECT pubname, NULL FROM pg_catalog.pg_publication p \
                     JOIN pg_catalog.pg_publication_rel pr ON p.oid = pr.prpubid \
                     UNION SELECT pubname, NULL FROM pg_catalog.pg_publication p \
                     WHERE p.puballtables ORDER BY 1";
        assert!(matches!(adapt(union), Adapted::NoRows(c) if c.len() == 2));
        let comma = "SELECT c.oid::pg_catalog.regclass FROM pg_catalog.pg_class c, \
                     pg_catalog.pg_inherits i WHERE c.oid = i.inhparent";
        assert!(matches!(adapt(comma), Adapted::NoRows(_)));
        // A LEFT JOIN keeps the rows of its left side.
        let left = "SELECT c.relname FROM pg_catalog.pg_class c \
                    LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid \
                    WHERE c.relname COLLATE pg_catalog.default = 'x'";
        assert!(matches!(adapt(left), Adapted::Sql(_)));
    }
}
