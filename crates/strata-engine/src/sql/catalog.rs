//! Three-part names in queries: the warehouse is one catalog, registered in DataFusion as
//! `strata` and known to users as `main` (Unity Catalog's default). A query's `main.s.t`
//! is rewritten to `strata.s.t` on its tokens, so that the catalog is registered once
//! (an alias catalog would list every table twice in `information_schema`).

use crate::error::{EngineError, Result};
use deltalake::datafusion::sql::sqlparser::tokenizer::Token;
use strata_sql::TableName;

/// The catalog DataFusion knows the warehouse by.
const REGISTERED: &str = "strata";

/// The names a warehouse whose catalog is `catalog` answers to: `catalog`, `main` (Unity
/// Catalog's default) and `strata`.
pub(crate) fn catalog_names(catalog: &str) -> Vec<&str> {
    let mut names = vec![catalog];
    for c in TableName::CATALOGS {
        if !names.iter().any(|n| n.eq_ignore_ascii_case(c)) {
            names.push(c);
        }
    }
    names
}

/// `sql` with every `<name>.schema.table` (a name of the warehouse's catalog other than the
/// registered one) naming the registered catalog; `None` when there is none.
pub(crate) fn rewrite_catalog(sql: &str, catalog: &str) -> Result<Option<String>> {
    let aliases: Vec<&str> = catalog_names(catalog)
        .into_iter()
        .filter(|c| !c.eq_ignore_ascii_case(REGISTERED))
        .collect();
    crate::util::sql::rename_catalog(sql, &aliases, REGISTERED)
}

/// The leading `USE CATALOG c;`, `USE SCHEMA s;` (`USE DATABASE s`, `USE s`, `USE c.s`)
/// statements of a query: the schema they select (`None`: unchanged) and the rest of the
/// query. A catalog other than the warehouse's is an error naming it.
pub(crate) fn leading_use<'a>(sql: &'a str, catalog: &str) -> Result<(Option<String>, &'a str)> {
    let mut rest = sql;
    let mut schema = None;
    loop {
        let trimmed = rest.trim_start();
        let is_use = trimmed
            .get(..3)
            .is_some_and(|w| w.eq_ignore_ascii_case("use"))
            && trimmed[3..].starts_with(|c: char| c.is_whitespace());
        if !is_use {
            return Ok((schema, rest));
        }
        let (statement, after) = match trimmed.find(';') {
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => (trimmed, ""),
        };
        let words: Vec<String> = crate::util::sql::tokens_of(statement)?
            .into_iter()
            .filter_map(|t| match t.token {
                Token::Word(w) => Some(w.value),
                Token::Period => Some(".".into()),
                _ => None,
            })
            .skip(1)
            .collect();
        let kind = words.first().map(|w| w.to_ascii_uppercase());
        let names: Vec<&String> = match kind.as_deref() {
            Some("CATALOG" | "SCHEMA" | "DATABASE") => words[1..].iter().collect(),
            _ => words.iter().collect(),
        };
        let parts: Vec<&str> = names
            .iter()
            .map(|s| s.as_str())
            .filter(|s| *s != ".")
            .collect();
        let known = |c: &str| {
            catalog_names(catalog)
                .iter()
                .any(|n| n.eq_ignore_ascii_case(c))
        };
        let refuse = |c: &str| {
            EngineError::NotFound(format!(
                "USE: catalog {c} is not this warehouse; its catalog is called {}",
                catalog_names(catalog).join(" or ")
            ))
        };
        match (kind.as_deref(), parts.as_slice()) {
            (Some("CATALOG"), [c]) => {
                if !known(c) {
                    return Err(refuse(c));
                }
            }
            (_, [c, s]) if kind.as_deref() != Some("CATALOG") => {
                if !known(c) {
                    return Err(refuse(c));
                }
                schema = Some(s.to_string());
            }
            (_, [s]) => schema = Some(s.to_string()),
            _ => {
                return Err(EngineError::plan(format!(
                    "query: `{}` is not USE CATALOG name, USE SCHEMA name or USE name",
                    statement.trim()
                )))
            }
        }
        rest = after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn main_names_the_warehouse_and_nothing_else_changes() {
        assert_eq!(
            rewrite_catalog(
                "SELECT main.x FROM main.default.users u JOIN MAIN.s.t ON true",
                "main"
            )
            .unwrap()
            .as_deref(),
            Some("SELECT main.x FROM strata.default.users u JOIN strata.s.t ON true")
        );
        assert_eq!(
            rewrite_catalog("SELECT 'main.a.b' AS s", "main").unwrap(),
            None
        );
        assert_eq!(
            rewrite_catalog("SELECT 'it''s' FROM main.d.t", "main")
                .unwrap()
                .as_deref(),
            Some("SELECT 'it''s' FROM strata.d.t")
        );
        assert_eq!(
            rewrite_catalog("SELECT * FROM default.users", "main").unwrap(),
            None
        );
    }

    #[test]
    fn a_named_catalog_is_the_warehouse_too() {
        assert_eq!(
            rewrite_catalog("SELECT * FROM prod.gold.t JOIN main.gold.u", "prod")
                .unwrap()
                .as_deref(),
            Some("SELECT * FROM strata.gold.t JOIN strata.gold.u")
        );
        assert_eq!(
            rewrite_catalog("SELECT * FROM dev.gold.t", "prod").unwrap(),
            None
        );
    }

    #[test]
    fn leading_use_statements_select_the_schema() {
        assert_eq!(
            leading_use("USE CATALOG main; USE SCHEMA gold; SELECT 1", "main").unwrap(),
            (Some("gold".to_string()), " SELECT 1")
        );
        assert_eq!(
            leading_use("use prod.silver;SELECT 1", "prod").unwrap(),
            (Some("silver".to_string()), "SELECT 1")
        );
        assert_eq!(
            leading_use("USE gold", "main").unwrap(),
            (Some("gold".to_string()), "")
        );
        assert_eq!(leading_use("SELECT 1", "main").unwrap(), (None, "SELECT 1"));
        assert_eq!(
            leading_use("user_table", "main").unwrap(),
            (None, "user_table")
        );
        let e = leading_use("USE CATALOG dev; SELECT 1", "prod").unwrap_err();
        assert!(
            e.to_string().contains("catalog dev is not this warehouse"),
            "{e}"
        );
    }
}
