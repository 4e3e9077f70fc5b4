//! Spark lexical rules on top of sqlparser's tokenizer, plus the token cursor the
//! statement parsers walk and the conversion of every error into [`SqlError::Syntax`].
//!
//! Pipeline text is tokenized once with [`SparkLexDialect`]: backticks quote identifiers,
//! a double-quoted token is a string literal (rewritten here to a single-quoted one, so that
//! the SQL printed back for DataFusion says `'DELETE'`, never the identifier `"DELETE"`),
//! backslash escapes work inside strings, and comments (which sqlparser reports as
//! whitespace) are dropped. Embedded expressions and queries are then parsed from those
//! tokens with sqlparser's parser in its generic dialect, whose printed form DataFusion reads.

use crate::ast::Location;
use crate::error::{Result, SqlError};
use sqlparser::ast::{visit_expressions_mut, Expr, Ident, VisitMut};
use sqlparser::dialect::{Dialect, GenericDialect};
use sqlparser::keywords::{
    Keyword, ALL_KEYWORDS, ALL_KEYWORDS_INDEX, RESERVED_FOR_COLUMN_ALIAS, RESERVED_FOR_IDENTIFIER,
};
use sqlparser::parser::{Parser, ParserError};
use sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer, Whitespace};
use std::ops::ControlFlow;

/// The dialect used to parse embedded expressions and queries. Its printed SQL is what
/// DataFusion's default dialect reads back.
pub(crate) static GENERIC: SparkParseDialect = SparkParseDialect;

/// sqlparser's generic dialect (DataFusion's default) with two of Spark's rules: a select
/// list has no trailing comma (so `SELECT id, offset, x` names a column `offset`), and no
/// word is kept from being a column name (`interval`, `struct`, `trim`, `exists` are
/// columns where they cannot start their special form). sqlparser sees it as the generic
/// dialect (`dialect()`), and every other behaviour is the generic dialect's.
#[derive(Debug)]
pub(crate) struct SparkParseDialect;

/// Forwards each named `fn(&self) -> bool` of [`Dialect`] to [`GenericDialect`].
macro_rules! generic_flags {
    ($($name:ident),* $(,)?) => {
        $(fn $name(&self) -> bool {
            GenericDialect {}.$name()
        })*
    };
}

impl Dialect for SparkParseDialect {
    fn dialect(&self) -> std::any::TypeId {
        std::any::TypeId::of::<GenericDialect>()
    }

    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        GenericDialect {}.is_delimited_identifier_start(ch)
    }

    fn is_identifier_start(&self, ch: char) -> bool {
        GenericDialect {}.is_identifier_start(ch)
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        GenericDialect {}.is_identifier_part(ch)
    }

    fn supports_projection_trailing_commas(&self) -> bool {
        false
    }

    fn is_reserved_for_identifier(&self, _keyword: Keyword) -> bool {
        false
    }

    // Every other flag the generic dialect sets (sqlparser 0.62's `dialect/generic.rs`).
    generic_flags!(
        supports_unicode_string_literal,
        supports_partition_by_after_order_by,
        supports_array_join_syntax,
        supports_group_by_expr,
        supports_group_by_with_modifier,
        supports_left_associative_joins_without_parens,
        supports_connect_by,
        supports_match_recognize,
        supports_pipe_operator,
        supports_start_transaction_modifier,
        supports_window_function_null_treatment_arg,
        supports_dictionary_syntax,
        supports_window_clause_named_window_reference,
        supports_parenthesized_set_variables,
        supports_select_wildcard_except,
        support_map_literal_syntax,
        allow_extract_custom,
        allow_extract_single_quotes,
        supports_extract_comma_syntax,
        supports_create_view_comment_syntax,
        supports_parens_around_table_factor,
        supports_values_as_table_factor,
        supports_create_index_with_clause,
        supports_explain_with_utility_options,
        supports_limit_comma,
        supports_update_order_by,
        supports_from_first_select,
        supports_asc_desc_in_column_definition,
        supports_try_convert,
        supports_bitwise_shift_operators,
        supports_comment_on,
        supports_load_extension,
        supports_named_fn_args_with_assignment_operator,
        supports_struct_literal,
        supports_empty_projections,
        supports_nested_comments,
        supports_multiline_comment_hints,
        supports_user_host_grantee,
        supports_string_escape_constant,
        supports_array_typedef_with_brackets,
        supports_match_against,
        supports_set_names,
        supports_comma_separated_set_assignments,
        supports_filter_during_aggregation,
        supports_select_wildcard_exclude,
        supports_data_type_signed_suffix,
        supports_interval_options,
        supports_quote_delimited_string,
        supports_select_wildcard_replace,
        supports_select_wildcard_ilike,
        supports_select_wildcard_rename,
        supports_optimize_table,
        supports_install,
        supports_detach,
        supports_prewhere,
        supports_with_fill,
        supports_limit_by,
        supports_interpolate,
        supports_settings,
        supports_select_format,
        supports_comment_optimizer_hint,
        supports_constraint_keyword_without_name,
        supports_key_column_option,
        supports_comma_separated_trim,
        supports_cte_without_as,
        supports_select_item_multi_column_alias,
        supports_xml_expressions,
    );
}

/// Whether an unquoted column named `name` would not read back in DataFusion's generic
/// dialect: the words it keeps from column names in a select list (`offset`, `limit`,
/// `end`, `values`, ...) or everywhere (`interval`, `struct`, `trim`, `exists`).
fn needs_quotes(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let Ok(at) = ALL_KEYWORDS.binary_search(&upper.as_str()) else {
        return false;
    };
    let keyword = ALL_KEYWORDS_INDEX[at];
    RESERVED_FOR_COLUMN_ALIAS.contains(&keyword) || RESERVED_FOR_IDENTIFIER.contains(&keyword)
}

/// Backticks around every column reference of `node` that [`needs_quotes`], so that the
/// SQL printed for DataFusion names the column (backticks keep the name's case as it is).
pub(crate) fn quote_keyword_columns<T: VisitMut>(node: &mut T) {
    let quote = |id: &mut Ident| {
        if id.quote_style.is_none() && needs_quotes(&id.value) {
            id.quote_style = Some('`');
        }
    };
    let _ = visit_expressions_mut(node, |e| {
        match e {
            Expr::Identifier(id) => quote(id),
            Expr::CompoundIdentifier(ids) => ids.iter_mut().for_each(quote),
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
}

/// Spark's lexical rules, for tokenizing only (the parser uses [`GENERIC`]).
#[derive(Debug)]
pub(crate) struct SparkLexDialect {
    /// The text holds `"""` or `'''`: read them as the quotes of one string. (Otherwise
    /// sqlparser's error for an unterminated string points after its quote.)
    triple_quotes: bool,
}

impl Dialect for SparkLexDialect {
    fn is_identifier_start(&self, ch: char) -> bool {
        ch.is_alphabetic() || ch == '_'
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        ch.is_alphanumeric() || ch == '_'
    }

    /// Only backticks: a double quote then starts a string literal, as in Spark.
    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        ch == '`'
    }

    fn supports_string_literal_backslash_escape(&self) -> bool {
        true
    }

    fn supports_nested_comments(&self) -> bool {
        true
    }

    /// `"""..."""` and `'''...'''`: strings that may hold the quote character, as pasted
    /// from Python notebooks (`spark.sql("""...""")`).
    fn supports_triple_quoted_string(&self) -> bool {
        self.triple_quotes
    }
}

/// The text being parsed, kept for error snippets.
pub(crate) struct Source<'a> {
    text: &'a str,
    /// The schema of unqualified table names.
    schema: &'a str,
}

impl<'a> Source<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Source {
            text,
            schema: crate::ast::TableName::DEFAULT_SCHEMA,
        }
    }

    /// A pipeline text whose unqualified table names belong to `schema`.
    pub(crate) fn in_schema(text: &'a str, schema: &'a str) -> Self {
        Source { text, schema }
    }

    pub(crate) fn schema(&self) -> &'a str {
        self.schema
    }

    /// A syntax error at `location`, with the source line and a caret under the column.
    pub(crate) fn error(&self, location: Location, message: impl Into<String>) -> SqlError {
        SqlError::Syntax {
            location,
            message: message.into(),
            snippet: self.snippet(location),
        }
    }

    fn snippet(&self, location: Location) -> String {
        let index = usize::try_from(location.line.saturating_sub(1)).unwrap_or(usize::MAX);
        let line = self.text.lines().nth(index).unwrap_or("");
        // Tabs are copied into the caret line so that the caret lines up however wide the
        // terminal draws a tab.
        let width = usize::try_from(location.column.saturating_sub(1)).unwrap_or(0);
        let mut caret: String = line
            .chars()
            .chain(std::iter::repeat(' '))
            .take(width)
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        caret.push('^');
        format!("{line}\n{caret}")
    }

    /// Just after the last non-blank character: where "end of input" errors point.
    pub(crate) fn end_location(&self) -> Location {
        let trimmed = self.text.trim_end();
        let line = trimmed.matches('\n').count() as u64 + 1;
        let last = trimmed.rsplit('\n').next().unwrap_or("");
        Location {
            line,
            column: last.chars().count() as u64 + 1,
        }
    }
}

pub(crate) fn location(l: sqlparser::tokenizer::Location) -> Location {
    Location {
        line: l.line,
        column: l.column,
    }
}

/// Tokenizes `text` with Spark's rules: no whitespace or comment tokens, and every
/// double-quoted token turned into a single-quoted string literal. A `-- COMMAND ----------`
/// line, the cell boundary of a Databricks notebook exported as a `.sql` file, ends a
/// statement as `;` does (each cell is a statement, and cells need no `;`).
pub(crate) fn tokenize(src: &Source, text: &str) -> Result<Vec<TokenWithSpan>> {
    let dialect = SparkLexDialect {
        triple_quotes: text.contains("\"\"\"") || text.contains("'''"),
    };
    let tokens = Tokenizer::new(&dialect, text)
        .tokenize_with_location()
        .map_err(|e| {
            let mut message = e.message;
            lower_first(&mut message);
            src.error(location(e.location), message)
        })?;
    if let Some((quote, at)) = tokens.iter().find_map(|t| match t.token {
        Token::Char(c @ ('\u{2018}' | '\u{2019}' | '\u{201C}' | '\u{201D}')) => {
            Some((c, t.span.start))
        }
        _ => None,
    }) {
        return Err(src.error(
            location(at),
            format!(
                "{quote} is a typographic (curly) quote, as web pages and word processors \
                 write them; SQL needs straight quotes: 'text' for a string, `name` for an \
                 identifier (replace every \u{2018} \u{2019} \u{201C} \u{201D} in the text)"
            ),
        ));
    }
    Ok(tokens
        .into_iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)) || is_notebook_cell_boundary(&t.token))
        .map(|t| {
            let token = match t.token {
                Token::Whitespace(_) => Token::SemiColon,
                Token::DoubleQuotedString(s)
                | Token::TripleDoubleQuotedString(s)
                | Token::TripleSingleQuotedString(s) => Token::SingleQuotedString(s),
                Token::Word(w) if w.quote_style == Some('"') => Token::SingleQuotedString(w.value),
                other => other,
            };
            TokenWithSpan::new(token, t.span)
        })
        .collect())
}

/// `-- COMMAND ----------`: the line between two cells of an exported Databricks notebook.
fn is_notebook_cell_boundary(token: &Token) -> bool {
    matches!(token, Token::Whitespace(Whitespace::SingleLineComment { comment, prefix })
        if prefix == "--" && comment.trim() == "COMMAND ----------")
}

fn lower_first(s: &mut String) {
    if let Some(first) = s.chars().next() {
        if first.is_ascii_uppercase() {
            s.replace_range(..1, &first.to_ascii_lowercase().to_string());
        }
    }
}

/// How a token is named in an error message: quoted, as written.
pub(crate) fn describe(token: &Token) -> String {
    match token {
        Token::EOF => "end of input".to_string(),
        Token::SingleQuotedString(s) => format!("string '{s}'"),
        other => format!("'{other}'"),
    }
}

/// What comes after the last token of a statement: its `;` or the end of the input.
#[derive(Debug, Clone)]
pub(crate) struct End {
    pub location: Location,
    /// How an error names it: `';'` or `end of input`.
    pub found: String,
}

/// A position in the tokens of one statement (whitespace already removed).
pub(crate) struct Cursor<'s, 't> {
    pub src: &'s Source<'s>,
    tokens: &'t [TokenWithSpan],
    pos: usize,
    pub end: End,
}

impl<'s, 't> Cursor<'s, 't> {
    pub(crate) fn new(src: &'s Source<'s>, tokens: &'t [TokenWithSpan], end: End) -> Self {
        Cursor {
            src,
            tokens,
            pos: 0,
            end,
        }
    }

    pub(crate) fn peek(&self) -> Option<&'t TokenWithSpan> {
        self.tokens.get(self.pos)
    }

    pub(crate) fn peek_nth(&self, n: usize) -> Option<&'t TokenWithSpan> {
        self.tokens.get(self.pos.saturating_add(n))
    }

    pub(crate) fn next(&mut self) -> Option<&'t TokenWithSpan> {
        let t = self.tokens.get(self.pos);
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    pub(crate) fn at_end(&self) -> bool {
        self.pos >= self.tokens.len()
    }

    /// The tokens not consumed yet.
    pub(crate) fn rest(&self) -> &'t [TokenWithSpan] {
        self.tokens.get(self.pos..).unwrap_or(&[])
    }

    /// Marks everything as consumed (after handing [`Cursor::rest`] to someone else).
    pub(crate) fn skip_rest(&mut self) {
        self.pos = self.tokens.len();
    }

    /// Location of the next token, or of the end of the statement.
    pub(crate) fn loc(&self) -> Location {
        self.peek()
            .map(|t| location(t.span.start))
            .unwrap_or(self.end.location)
    }

    pub(crate) fn error_at(&self, location: Location, message: impl Into<String>) -> SqlError {
        self.src.error(location, message)
    }

    /// `expected {what}, found '{next token}'` at the next token.
    pub(crate) fn expected(&self, what: &str) -> SqlError {
        let found = match self.peek() {
            Some(t) => describe(&t.token),
            None => self.end.found.clone(),
        };
        self.error_at(self.loc(), format!("expected {what}, found {found}"))
    }

    pub(crate) fn peek_keyword(&self, kw: &str) -> bool {
        self.peek().is_some_and(|t| is_keyword(&t.token, kw))
    }

    pub(crate) fn peek_nth_keyword(&self, n: usize, kw: &str) -> bool {
        self.peek_nth(n).is_some_and(|t| is_keyword(&t.token, kw))
    }

    pub(crate) fn eat_keyword(&mut self, kw: &str) -> bool {
        let hit = self.peek_keyword(kw);
        if hit {
            self.pos += 1;
        }
        hit
    }

    pub(crate) fn expect_keyword(&mut self, kw: &str) -> Result<()> {
        if self.eat_keyword(kw) {
            Ok(())
        } else {
            Err(self.expected(kw))
        }
    }

    pub(crate) fn peek_token(&self, token: &Token) -> bool {
        self.peek().is_some_and(|t| &t.token == token)
    }

    pub(crate) fn eat_token(&mut self, token: &Token) -> bool {
        let hit = self.peek_token(token);
        if hit {
            self.pos += 1;
        }
        hit
    }

    pub(crate) fn expect_token(&mut self, token: &Token) -> Result<()> {
        if self.eat_token(token) {
            Ok(())
        } else {
            Err(self.expected(&format!("'{token}'")))
        }
    }

    /// An identifier (a word, backticks already stripped) and where it starts.
    pub(crate) fn ident(&mut self, what: &str) -> Result<(String, Location)> {
        match self.peek() {
            Some(TokenWithSpan {
                token: Token::Word(w),
                span,
            }) => {
                self.pos += 1;
                Ok((w.value.clone(), location(span.start)))
            }
            _ => Err(self.expected(what)),
        }
    }

    /// A string literal (single- or double-quoted in the source).
    pub(crate) fn string(&mut self, what: &str) -> Result<String> {
        match self.peek() {
            Some(TokenWithSpan {
                token: Token::SingleQuotedString(s),
                ..
            }) => {
                self.pos += 1;
                Ok(s.clone())
            }
            _ => Err(self.expected(what)),
        }
    }

    /// Runs sqlparser's parser on the rest of the statement and moves past what it used.
    pub(crate) fn sql<T: VisitMut>(
        &mut self,
        f: impl FnOnce(&mut Parser) -> std::result::Result<T, ParserError>,
    ) -> Result<T> {
        let (value, used) = run_sqlparser(self.src, self.rest().to_vec(), &self.end, f)?;
        self.pos = self.pos.saturating_add(used).min(self.tokens.len());
        Ok(value)
    }
}

/// Whether `token` is the unquoted word `kw` (any case).
pub(crate) fn is_keyword(token: &Token, kw: &str) -> bool {
    matches!(token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(kw))
}

/// Runs `f` with a sqlparser parser over `tokens`; returns its value and how many tokens
/// it consumed. Errors become [`SqlError::Syntax`] in this crate's wording.
pub(crate) fn run_sqlparser<T: VisitMut>(
    src: &Source,
    tokens: Vec<TokenWithSpan>,
    end: &End,
    f: impl FnOnce(&mut Parser) -> std::result::Result<T, ParserError>,
) -> Result<(T, usize)> {
    let len = tokens.len();
    // Where the parser stopped, for errors that carry no location of their own.
    let fallback = |index: usize, tokens: &[TokenWithSpan]| {
        tokens
            .get(index)
            .map(|t| location(t.span.start))
            .unwrap_or(end.location)
    };
    let starts: Vec<TokenWithSpan> = tokens.clone();
    let mut parser = Parser::new(&GENERIC).with_tokens_with_locations(tokens);
    match f(&mut parser) {
        Ok(mut v) => {
            quote_keyword_columns(&mut v);
            Ok((v, parser.index().min(len)))
        }
        Err(e) => {
            let here = fallback(parser.index(), &starts);
            Err(convert_parser_error(src, e, here, end))
        }
    }
}

/// Rewrites sqlparser's `Expected: X, found: Y at Line: 1, Column: 2` into
/// `expected X, found 'Y'` at that location.
fn convert_parser_error(src: &Source, e: ParserError, here: Location, end: &End) -> SqlError {
    let raw = match e {
        ParserError::ParserError(m) | ParserError::TokenizerError(m) => m,
        ParserError::RecursionLimitExceeded => {
            return src.error(here, "expression is nested too deeply");
        }
    };
    let (mut message, loc) = match raw.rfind(" at Line: ") {
        Some(i) => {
            let (head, tail) = raw.split_at(i);
            match parse_line_column(tail) {
                Some(loc) => (head.to_string(), Some(loc)),
                None => (raw.clone(), None),
            }
        }
        None => (raw.clone(), None),
    };
    let mut at_end = false;
    if let Some(rest) = message.strip_prefix("Expected: ") {
        if let Some((expected, found)) = rest.split_once(", found: ") {
            let found = if found == "EOF" {
                at_end = true;
                end.found.clone()
            } else {
                format!("'{found}'")
            };
            message = format!("expected {expected}, found {found}");
        }
    }
    lower_first(&mut message);
    let location = match loc {
        Some(l) => l,
        None if at_end => end.location,
        None => here,
    };
    src.error(location, message)
}

fn parse_line_column(tail: &str) -> Option<Location> {
    let rest = tail.strip_prefix(" at Line: ")?;
    let (line, column) = rest.split_once(", Column: ")?;
    Some(Location {
        line: line.trim().parse().ok()?,
        column: column.trim().parse().ok()?,
    })
}
