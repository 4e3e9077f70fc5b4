//! Pipeline configuration values: `${name}` in the pipeline text is replaced by the value of
//! `name` before parsing (as Lakeflow does with its pipeline configuration), so a table's
//! history mode or a path can live in metadata: `STORED AS ${customers_mode}`.

use crate::ast::Location;
use crate::error::{Result, SqlError};
use std::collections::BTreeMap;

/// Replaces every `${name}` in `text` by `values[name]`. A reference to a name without a
/// value is an error at its line and column; `$${` stays as a literal `${`.
pub fn substitute(text: &str, values: &BTreeMap<String, String>) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let (mut line, mut column) = (1u64, 1u64);
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        for ch in rest[..pos].chars() {
            advance(&mut line, &mut column, ch);
        }
        out.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(lit) = after.strip_prefix("$${") {
            out.push_str("${");
            column += 3;
            rest = lit;
            continue;
        }
        let Some(body) = after.strip_prefix("${") else {
            out.push('$');
            column += 1;
            rest = &after[1..];
            continue;
        };
        let at = Location { line, column };
        let Some(end) = body.find('}') else {
            return Err(error(at, "`${` without a closing `}`", text));
        };
        let name = body[..end].trim();
        let value = values.get(name).ok_or_else(|| {
            let known = if values.is_empty() {
                "no configuration values are set; pass --conf name=value".to_string()
            } else {
                format!(
                    "set are: {}",
                    values.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            };
            error(
                at,
                &format!("configuration value `{name}` is not set ({known})"),
                text,
            )
        })?;
        out.push_str(value);
        for ch in after[..end + 3].chars() {
            advance(&mut line, &mut column, ch);
        }
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn advance(line: &mut u64, column: &mut u64, ch: char) {
    if ch == '\n' {
        *line += 1;
        *column = 1;
    } else {
        *column += 1;
    }
}

/// A map of names to values (a configuration, a table's options) from `(name, value)` pairs:
/// for the tests of this crate and of the crates above.
#[doc(hidden)]
pub fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn error(at: Location, message: &str, text: &str) -> SqlError {
    let src_line = text.lines().nth(at.line as usize - 1).unwrap_or("");
    SqlError::Syntax {
        location: at,
        message: message.to_string(),
        snippet: format!(
            "  {src_line}\n  {}^",
            " ".repeat(at.column.saturating_sub(1) as usize)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_known_names() {
        let c = string_map(&[("mode", "SCD TYPE 2"), ("dir", "data/x")]);
        assert_eq!(
            substitute("STORED AS ${mode} -- '${dir}' costs $5", &c).unwrap(),
            "STORED AS SCD TYPE 2 -- 'data/x' costs $5"
        );
        assert_eq!(substitute("a $${b}", &c).unwrap(), "a ${b}");
    }

    #[test]
    fn unknown_names_are_located() {
        let e = substitute("SELECT 1;\n  STORED AS ${mode}", &string_map(&[])).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("2:13: configuration value `mode` is not set"),
            "{text}"
        );
    }
}
