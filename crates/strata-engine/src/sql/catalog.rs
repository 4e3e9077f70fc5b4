//! Three-part names in queries: the warehouse is one catalog, registered in DataFusion as
//! `strata` and known to users as `main` (Unity Catalog's default). A query's `main.s.t`
//! is rewritten to `strata.s.t` on its tokens, so that the catalog is registered once
//! (an alias catalog would list every table twice in `information_schema`).

use crate::error::Result;
use crate::util::sql::LineOffsets;
use deltalake::datafusion::sql::sqlparser::tokenizer::Token;
use strata_sql::TableName;

/// The catalog DataFusion knows the warehouse by.
const REGISTERED: &str = "strata";

/// `sql` with every `<alias>.schema.table` (an alias of [`TableName::CATALOGS`] other than
/// the registered one) naming the registered catalog; `None` when there is none.
pub(crate) fn rewrite_catalog(sql: &str) -> Result<Option<String>> {
    let aliases: Vec<&str> = TableName::CATALOGS
        .iter()
        .copied()
        .filter(|c| *c != REGISTERED)
        .collect();
    let lower = sql.to_ascii_lowercase();
    if !aliases.iter().any(|a| lower.contains(&format!("{a}."))) {
        return Ok(None);
    }
    let tokens = crate::util::sql::tokens_of(sql)?;
    let offsets = LineOffsets::new(sql);
    let token = |i: usize| tokens.get(i).map(|t| &t.token);
    let is_word = |i: usize| matches!(token(i), Some(Token::Word(_)));
    let mut out = String::with_capacity(sql.len());
    let mut done = 0;
    for (i, t) in tokens.iter().enumerate() {
        let Token::Word(w) = &t.token else { continue };
        let starts_name = i == 0 || token(i - 1) != Some(&Token::Period);
        if starts_name
            && aliases.iter().any(|a| w.value.eq_ignore_ascii_case(a))
            && token(i + 1) == Some(&Token::Period)
            && is_word(i + 2)
            && token(i + 3) == Some(&Token::Period)
            && is_word(i + 4)
        {
            let (start, end) = (offsets.at(t.span.start), offsets.at(t.span.end));
            out.push_str(&sql[done..start]);
            out.push_str(REGISTERED);
            done = end;
        }
    }
    let changed = done > 0;
    out.push_str(&sql[done..]);
    Ok(changed.then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn main_names_the_warehouse_and_nothing_else_changes() {
        assert_eq!(
            rewrite_catalog("SELECT main.x FROM main.default.users u JOIN MAIN.s.t ON true")
                .unwrap()
                .as_deref(),
            Some("SELECT main.x FROM strata.default.users u JOIN strata.s.t ON true")
        );
        assert_eq!(rewrite_catalog("SELECT 'main.a.b' AS s").unwrap(), None);
        assert_eq!(
            rewrite_catalog("SELECT 'it''s' FROM main.d.t")
                .unwrap()
                .as_deref(),
            Some("SELECT 'it''s' FROM strata.d.t")
        );
        assert_eq!(
            rewrite_catalog("SELECT * FROM default.users").unwrap(),
            None
        );
    }
}
