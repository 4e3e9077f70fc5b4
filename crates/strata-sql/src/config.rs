//! Pipeline configuration values: `${name}` in the pipeline text is replaced by the value of
//! `name` before parsing (as Lakeflow does with its pipeline configuration), so a table's
//! history mode or a path can live in metadata: `STORED AS ${customers_mode}`.

use crate::ast::Location;
use crate::error::{Result, SqlError};
use std::collections::BTreeMap;

/// Replaces every `${name}` in `text` by `values[name]`. A reference to a name without a
/// value is an error at its line and column; `$${` stays as a literal `${`.
///
/// A line `SET name = value` (a statement of its own, as Spark and Lakeflow take it) sets
/// `name` for the text after it, over `values`: the value is the rest of the statement,
/// trimmed, as written (`SET start = '2024-01-01'` makes `${start}` a quoted literal).
pub fn substitute(text: &str, values: &BTreeMap<String, String>) -> Result<String> {
    let sets = set_statements(text);
    let mut values = values.clone();
    let mut next_set = sets.iter().peekable();
    let mut out = String::with_capacity(text.len());
    let (mut line, mut column) = (1u64, 1u64);
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        let here = text.len() - rest.len() + pos;
        while let Some((_, name, value)) = next_set.next_if(|(end, _, _)| *end <= here) {
            values.insert(name.clone(), value.clone());
        }
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

/// The `SET name = value` lines of `text`: where each ends (a byte offset), the name and
/// the value (up to a `;`, trimmed). `SET name` alone (which shows a value) sets nothing.
fn set_statements(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        offset += line.len();
        let trimmed = line.trim_start();
        let is_set = trimmed
            .get(..4)
            .is_some_and(|w| w.eq_ignore_ascii_case("set ") || w.eq_ignore_ascii_case("set\t"));
        if !is_set {
            continue;
        }
        let statement = trimmed[4..].split(';').next().unwrap_or_default();
        let Some((name, value)) = statement.split_once('=') else {
            continue;
        };
        let name = name.trim();
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if plain {
            out.push((offset, name.to_string(), value.trim().to_string()));
        }
    }
    out
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
    fn set_lines_give_values_to_the_text_after_them() {
        let c = string_map(&[("start", "'2020-01-01'"), ("dir", "data/x")]);
        let text = "SELECT ${start};\nSET start = '2024-01-01';\nset tbl=orders\n-- ${start} ${tbl} ${dir}";
        assert_eq!(
            substitute(text, &c).unwrap(),
            "SELECT '2020-01-01';\nSET start = '2024-01-01';\nset tbl=orders\n-- '2024-01-01' orders data/x"
        );
        // Before its SET, a name has no value.
        let e = substitute("SELECT ${tbl};\nSET tbl = t;", &string_map(&[])).unwrap_err();
        assert!(
            e.to_string().starts_with("1:8: configuration value `tbl`"),
            "{e}"
        );
        // `SET name` shows a value and sets none; a `SET` inside a line is not a statement.
        assert!(substitute("SET tbl;\nSELECT ${tbl}", &string_map(&[])).is_err());
        assert!(substitute("SELECT 1 -- SET tbl = t\n${tbl}", &string_map(&[])).is_err());
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
