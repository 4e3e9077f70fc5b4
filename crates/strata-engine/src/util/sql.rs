//! SQL text: quoting names and strings, finding and rewriting table-function calls.

use crate::error::{EngineError, Result};

/// `name` as a double-quoted SQL identifier (DataFusion's default dialect).
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `s` as a single-quoted SQL string literal.
pub(crate) fn quote_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The arguments of `factor` if it calls the table function `function` (any case):
/// `Some(None)` when an argument is named (`f(x => 1)`), which strata's table functions do
/// not take; `None` for any other factor.
pub(crate) fn table_function_args<'a>(
    factor: &'a deltalake::datafusion::sql::sqlparser::ast::TableFactor,
    function: &str,
) -> Option<Option<Vec<&'a deltalake::datafusion::sql::sqlparser::ast::Expr>>> {
    use deltalake::datafusion::sql::sqlparser::ast::{FunctionArg, FunctionArgExpr, TableFactor};
    let TableFactor::Table {
        name,
        args: Some(args),
        ..
    } = factor
    else {
        return None;
    };
    if !name.to_string().eq_ignore_ascii_case(function) {
        return None;
    }
    Some(
        args.args
            .iter()
            .map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                _ => None,
            })
            .collect(),
    )
}

/// The statements of `sql` if it mentions `function` (any case), for a rewrite of that table
/// function; `None` when it cannot hold a call.
pub(crate) fn statements_calling(
    sql: &str,
    function: &str,
) -> Result<Option<Vec<deltalake::datafusion::sql::sqlparser::ast::Statement>>> {
    use deltalake::datafusion::sql::sqlparser::{dialect::GenericDialect, parser::Parser};
    if !sql.to_ascii_lowercase().contains(function) {
        return Ok(None);
    }
    Parser::parse_sql(&GenericDialect {}, sql)
        .map(Some)
        .map_err(|e| EngineError::plan(format!("query: {e}")))
}

/// Rewritten statements back to one SQL text.
pub(crate) fn statements_sql(
    statements: &[deltalake::datafusion::sql::sqlparser::ast::Statement],
) -> String {
    statements
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Byte offsets of line starts, to turn token locations (1-based line and column in
/// characters) into byte offsets.
pub(crate) struct LineOffsets<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineOffsets<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        LineOffsets { text, starts }
    }

    pub(crate) fn at(
        &self,
        l: deltalake::datafusion::sql::sqlparser::tokenizer::Location,
    ) -> usize {
        let start = self
            .starts
            .get((l.line as usize).saturating_sub(1))
            .copied()
            .unwrap_or(self.text.len());
        let line = &self.text[start..];
        start
            + line
                .char_indices()
                .nth((l.column as usize).saturating_sub(1))
                .map_or(line.len(), |(i, _)| i)
    }
}

/// The tokens of `sql` (DataFusion's default dialect) with their places, whitespace left out.
pub(crate) fn tokens_of(
    sql: &str,
) -> Result<Vec<deltalake::datafusion::sql::sqlparser::tokenizer::TokenWithSpan>> {
    use deltalake::datafusion::sql::sqlparser::{
        dialect::GenericDialect,
        tokenizer::{Token, Tokenizer},
    };
    Ok(Tokenizer::new(&GenericDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| EngineError::plan(format!("query: {e}")))?
        .into_iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect())
}

/// `sql` with every three-part name whose catalog is one of `aliases` (any case) naming
/// catalog `to` instead, rewritten on its tokens (strings and comments untouched); `None`
/// when there is none.
pub(crate) fn rename_catalog(sql: &str, aliases: &[&str], to: &str) -> Result<Option<String>> {
    use deltalake::datafusion::sql::sqlparser::tokenizer::Token;
    let lower = sql.to_ascii_lowercase();
    if !aliases
        .iter()
        .any(|a| lower.contains(&format!("{}.", a.to_ascii_lowercase())))
    {
        return Ok(None);
    }
    let tokens = tokens_of(sql)?;
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
            out.push_str(to);
            done = end;
        }
    }
    let changed = done > 0;
    out.push_str(&sql[done..]);
    Ok(changed.then_some(out))
}
