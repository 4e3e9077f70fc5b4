//! Databricks' time travel in queries: `t VERSION AS OF 3` and `t TIMESTAMP AS OF
//! '2024-05-01 10:00:00'` read the table as it was at that version, or at the last version
//! committed at or before that instant (UTC). Each such reference is replaced by a name the
//! table at that version is registered under in the session, keeping `t` as its alias.
//!
//! The rewrite works on tokens, so the rest of the query keeps DataFusion's dialect exactly.

use crate::error::{Context, EngineError, Result};
use crate::storage::warehouse::Warehouse;
use crate::util::sql::quote_ident;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::datafusion::sql::sqlparser::keywords::Keyword;
use deltalake::datafusion::sql::sqlparser::tokenizer::Token;
use strata_sql::TableName;

/// When a time-travel reference reads its table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AsOf {
    Version(u64),
    Timestamp(String),
}

/// One `name VERSION|TIMESTAMP AS OF value` in a query: the name's parts, when, and the
/// byte range it covers (name to value), and whether an alias follows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Travel {
    pub(crate) parts: Vec<String>,
    pub(crate) as_of: AsOf,
    pub(crate) range: std::ops::Range<usize>,
    pub(crate) aliased: bool,
}

/// Every time-travel reference of `sql`, in text order (pure: no I/O).
pub(crate) fn find_travels(sql: &str) -> Result<Vec<Travel>> {
    let upper = sql.to_ascii_uppercase();
    if !upper.contains(" AS OF") {
        return Ok(Vec::new());
    }
    let tokens = crate::util::sql::tokens_of(sql)?;
    let offsets = crate::util::sql::LineOffsets::new(sql);
    let keyword = |i: usize, k: Keyword| matches!(tokens.get(i).map(|t| &t.token), Some(Token::Word(w)) if w.keyword == k && w.quote_style.is_none());
    let mut out = Vec::new();
    for i in 1..tokens.len() {
        let version = keyword(i, Keyword::VERSION);
        if !(version || keyword(i, Keyword::TIMESTAMP))
            || !keyword(i + 1, Keyword::AS)
            || !keyword(i + 2, Keyword::OF)
        {
            continue;
        }
        let value = &tokens[i + 3..].first().ok_or_else(|| {
            EngineError::plan("query: VERSION AS OF / TIMESTAMP AS OF needs a value")
        })?;
        let as_of = match (&value.token, version) {
            (Token::Number(n, _), true) => AsOf::Version(n.parse().map_err(|_| {
                EngineError::plan(format!("query: VERSION AS OF {n}: not a table version"))
            })?),
            (Token::SingleQuotedString(s), false) => AsOf::Timestamp(s.clone()),
            (other, true) => {
                return Err(EngineError::plan(format!(
                    "query: VERSION AS OF takes a version number, found {other}"
                )))
            }
            (other, false) => {
                return Err(EngineError::plan(format!(
                    "query: TIMESTAMP AS OF takes a quoted timestamp ('2024-05-01 10:00:00'), found {other}"
                )))
            }
        };
        // The table name before it: word(.word)*.
        let mut first = i - 1;
        let mut parts = Vec::new();
        loop {
            match &tokens[first].token {
                Token::Word(w) => parts.push(w.value.clone()),
                other => {
                    return Err(EngineError::plan(format!(
                        "query: {} AS OF follows a table name, not {other}",
                        if version { "VERSION" } else { "TIMESTAMP" }
                    )))
                }
            }
            if first >= 2 && tokens[first - 1].token == Token::Period {
                first -= 2;
            } else {
                break;
            }
        }
        parts.reverse();
        let aliased = match tokens.get(i + 4).map(|t| &t.token) {
            Some(Token::Word(w)) => w.keyword == Keyword::AS || w.keyword == Keyword::NoKeyword,
            _ => false,
        };
        out.push(Travel {
            parts,
            as_of,
            range: offsets.at(tokens[first].span.start)..offsets.at(value.span.end),
            aliased,
        });
    }
    Ok(out)
}

/// `sql` with every time-travel reference replaced by the table at that version, registered
/// in `ctx`; `None` when there is none.
pub(crate) async fn rewrite_time_travel(
    wh: &Warehouse,
    ctx: &SessionContext,
    sql: &str,
    schema: &str,
) -> Result<Option<String>> {
    let travels = find_travels(sql)?;
    if travels.is_empty() {
        return Ok(None);
    }
    let mut out = String::with_capacity(sql.len());
    let mut done = 0;
    for (n, t) in travels.iter().enumerate() {
        let parts: Vec<&str> = t.parts.iter().map(String::as_str).collect();
        let name = TableName::from_parts(&parts, schema).map_err(EngineError::NotFound)?;
        let mut table = wh
            .open_table(&name)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("no table {name}")))?;
        match &t.as_of {
            AsOf::Version(v) => table
                .load_version(*v as deltalake::kernel::Version)
                .await
                .context(|| format!("{name} VERSION AS OF {v}"))?,
            AsOf::Timestamp(text) => {
                let at = parse_instant(text).ok_or_else(|| {
                    EngineError::plan(format!(
                        "{name} TIMESTAMP AS OF '{text}': not a timestamp \
                         (2024-05-01, 2024-05-01 10:00:00, or RFC 3339 with a zone)"
                    ))
                })?;
                table
                    .load_with_datetime(at)
                    .await
                    .context(|| format!("{name} TIMESTAMP AS OF '{text}'"))?
            }
        }
        let registered = format!("__strata_as_of_{n}");
        crate::storage::session::register_table(ctx, &registered, &table, None).await?;
        out.push_str(&sql[done..t.range.start]);
        out.push_str(&quote_ident(&registered));
        if !t.aliased {
            out.push_str(" AS ");
            out.push_str(&quote_ident(&name.name));
        }
        done = t.range.end;
    }
    out.push_str(&sql[done..]);
    Ok(Some(out))
}

/// `2024-05-01`, `2024-05-01 10:00:00[.fff]` (UTC) or RFC 3339.
fn parse_instant(text: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    use chrono::{NaiveDate, NaiveDateTime, TimeZone, Utc};
    let text = text.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Some(Utc.from_utc_datetime(&t));
        }
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| Utc.from_utc_datetime(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_found_with_their_names_values_and_ranges() {
        let sql = "SELECT u.id FROM main.default.users VERSION AS OF 3 u\nJOIN plans TIMESTAMP AS OF '2024-05-01' ON true";
        let t = find_travels(sql).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].parts, ["main", "default", "users"]);
        assert_eq!(t[0].as_of, AsOf::Version(3));
        assert_eq!(
            &sql[t[0].range.clone()],
            "main.default.users VERSION AS OF 3"
        );
        assert!(t[0].aliased);
        assert_eq!(t[1].parts, ["plans"]);
        assert_eq!(t[1].as_of, AsOf::Timestamp("2024-05-01".into()));
        assert_eq!(
            &sql[t[1].range.clone()],
            "plans TIMESTAMP AS OF '2024-05-01'"
        );
        assert!(!t[1].aliased);
        assert!(find_travels("SELECT 1 AS offset").unwrap().is_empty());
        assert!(find_travels("SELECT * FROM t VERSION AS OF 'x'").is_err());
    }

    #[test]
    fn instants_read_in_the_usual_spellings() {
        let day = parse_instant("2024-05-01").unwrap();
        assert_eq!(day.to_rfc3339(), "2024-05-01T00:00:00+00:00");
        assert_eq!(
            parse_instant("2024-05-01 10:00:00.5").unwrap().to_rfc3339(),
            "2024-05-01T10:00:00.500+00:00"
        );
        assert_eq!(
            parse_instant("2024-05-01T12:00:00+02:00")
                .unwrap()
                .to_rfc3339(),
            "2024-05-01T10:00:00+00:00"
        );
        assert!(parse_instant("May 1st").is_none());
    }
}
