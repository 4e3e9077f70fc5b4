//! Spark SQL type names (`INT`, `STRING`, `DECIMAL(10,2)`, ...) to Arrow types, and the
//! DDL column lists built from them.
//!
//! The same column-list parser serves three places: [`parse_ddl_schema`] (a standalone DDL
//! string), the `schema => '...'` option of `read_files`, and the column list of
//! `CREATE STREAMING TABLE name (...)`.

use crate::ast::{ColumnDef, ExpectAction, Expectation, Location};
use crate::error::Result;
use crate::lex::{self, location, Cursor, End, Source};
use arrow_schema::{DataType, Field, Fields, TimeUnit};
use sqlparser::tokenizer::{Location as SpLocation, Span, Token};
use std::sync::Arc;

/// Parses a DDL column list such as `userId INT, name STRING, ts TIMESTAMP`.
pub fn parse_ddl_schema(ddl: &str) -> Result<Vec<ColumnDef>> {
    let src = Source::new(ddl);
    parse_schema_string(&src, ddl, None)
}

/// Parses the DDL `ddl` that appears as a string literal in `src`, starting at `origin`
/// (the opening quote). Tokens are moved to their place in `src`, so that an error points
/// into the pipeline text, not into the string. With no origin, `ddl` is `src` itself.
pub(crate) fn parse_schema_string(
    src: &Source,
    ddl: &str,
    origin: Option<Location>,
) -> Result<Vec<ColumnDef>> {
    let shift = |l: SpLocation| -> SpLocation {
        match origin {
            None => l,
            // Column 1 of the string's first line is just after the opening quote.
            Some(o) if l.line <= 1 => SpLocation::new(o.line, o.column.saturating_add(l.column)),
            Some(o) => SpLocation::new(o.line.saturating_add(l.line - 1), l.column),
        }
    };
    let inner = Source::new(ddl);
    let tokens = lex::tokenize(&inner, ddl).map_err(|e| relocate(src, e, &shift))?;
    let tokens: Vec<_> = tokens
        .into_iter()
        .map(|mut t| {
            t.span = Span::new(shift(t.span.start), shift(t.span.end));
            t
        })
        .collect();
    let end_in_ddl = inner.end_location();
    let end = End {
        location: match origin {
            None => end_in_ddl,
            Some(_) => location(shift(SpLocation::new(end_in_ddl.line, end_in_ddl.column))),
        },
        found: if origin.is_some() {
            "end of schema string".to_string()
        } else {
            "end of input".to_string()
        },
    };
    let mut c = Cursor::new(src, &tokens, end);
    let columns = parse_column_defs(&mut c)?;
    if !c.at_end() {
        return Err(c.expected("',' or end of schema"));
    }
    Ok(columns)
}

/// Moves a syntax error found while tokenizing a schema string into the pipeline text.
fn relocate(
    src: &Source,
    e: crate::SqlError,
    shift: &dyn Fn(SpLocation) -> SpLocation,
) -> crate::SqlError {
    match e {
        crate::SqlError::Syntax {
            location: l,
            message,
            ..
        } => src.error(location(shift(SpLocation::new(l.line, l.column))), message),
        other => other,
    }
}

/// `name TYPE [NOT NULL] [COMMENT '...'], ...`: stops before the first token that does not
/// continue the list (the caller checks what comes next). Names must be unique, ignoring
/// case, as Spark resolves columns case-insensitively.
pub(crate) fn parse_column_defs(c: &mut Cursor) -> Result<Vec<ColumnDef>> {
    let elements = parse_table_elements(c, false)?;
    debug_assert!(elements.expectations.is_empty() && elements.keys.is_empty());
    Ok(elements.columns)
}

/// What a dataset's column list declares.
pub(crate) struct TableElements {
    pub columns: Vec<ColumnDef>,
    pub expectations: Vec<Expectation>,
    /// Informational `PRIMARY KEY` and `FOREIGN KEY` constraints: (name, text such as
    /// `PRIMARY KEY (id)`), recorded and not enforced, as Unity Catalog has them.
    pub keys: Vec<(String, String)>,
}

/// Whether the next tokens start a `PRIMARY KEY` or `FOREIGN KEY` constraint.
fn at_key_constraint(c: &Cursor) -> bool {
    (c.peek_keyword("PRIMARY") || c.peek_keyword("FOREIGN")) && c.peek_nth_keyword(1, "KEY")
}

/// `PRIMARY KEY [(cols)] [options]` or `FOREIGN KEY [(cols)] REFERENCES parent [(cols)]
/// [options]`, the columns in parentheses unless the constraint follows its `column`.
/// Returns its name (`name`, else `pk_<cols>` / `fk_<cols>`) and its text.
fn key_constraint(
    c: &mut Cursor,
    name: Option<String>,
    column: Option<&str>,
) -> Result<(String, String)> {
    let primary = c.eat_keyword("PRIMARY");
    if !primary {
        c.expect_keyword("FOREIGN")?;
    }
    c.expect_keyword("KEY")?;
    let paren_list = |c: &mut Cursor, what: &str| -> Result<Vec<String>> {
        c.expect_token(&Token::LParen)?;
        let mut names = Vec::new();
        loop {
            names.push(c.ident(what)?.0);
            c.eat_keyword("TIMESERIES");
            if !c.eat_token(&Token::Comma) {
                break;
            }
        }
        c.expect_token(&Token::RParen)?;
        Ok(names)
    };
    let columns = match column {
        Some(col) if !c.peek_token(&Token::LParen) => vec![col.to_string()],
        _ => paren_list(c, "a key column")?,
    };
    let mut text = format!(
        "{} KEY ({})",
        if primary { "PRIMARY" } else { "FOREIGN" },
        columns.join(", ")
    );
    if !primary {
        c.expect_keyword("REFERENCES")?;
        let mut parent = vec![c.ident("the referenced table")?.0];
        while c.eat_token(&Token::Period) {
            parent.push(c.ident("a name after '.'")?.0);
        }
        text.push_str(&format!(" REFERENCES {}", parent.join(".")));
        if c.peek_token(&Token::LParen) {
            let cols = paren_list(c, "a referenced column")?;
            text.push_str(&format!(" ({})", cols.join(", ")));
        }
    }
    // Options Unity Catalog records and does not enforce either.
    loop {
        let two = |c: &mut Cursor, a: &str, b: &str| {
            let hit = c.peek_keyword(a) && c.peek_nth_keyword(1, b);
            if hit {
                c.next();
                c.next();
            }
            hit
        };
        let three = |c: &mut Cursor, a: &str, b: &str, d: &str| {
            let hit = c.peek_keyword(a) && c.peek_nth_keyword(1, b) && c.peek_nth_keyword(2, d);
            if hit {
                c.next();
                c.next();
                c.next();
            }
            hit
        };
        let option = two(c, "NOT", "ENFORCED")
            || two(c, "NOT", "DEFERRABLE")
            || two(c, "INITIALLY", "DEFERRED")
            || two(c, "INITIALLY", "IMMEDIATE")
            || two(c, "MATCH", "FULL")
            || three(c, "ON", "UPDATE", "NO")
            || three(c, "ON", "DELETE", "NO")
            || c.eat_keyword("ACTION")
            || c.eat_keyword("DEFERRABLE")
            || c.eat_keyword("RELY")
            || c.eat_keyword("NORELY")
            || c.eat_keyword("ENFORCED");
        if !option {
            break;
        }
    }
    let name = name.unwrap_or_else(|| {
        format!(
            "{}_{}",
            if primary { "pk" } else { "fk" },
            columns.join("_")
        )
    });
    Ok((name, text))
}

/// The column list of a dataset: column definitions and, where `constraints` allows,
/// `CONSTRAINT name EXPECT (condition) [ON VIOLATION DROP ROW | FAIL UPDATE]` entries, in
/// any order. Expectation names must be unique within the dataset.
pub(crate) fn parse_table_elements(c: &mut Cursor, constraints: bool) -> Result<TableElements> {
    let mut columns: Vec<ColumnDef> = Vec::new();
    let mut expectations: Vec<Expectation> = Vec::new();
    let mut keys: Vec<(String, String)> = Vec::new();
    let mut key_columns: Vec<(String, crate::ast::Location)> = Vec::new();
    let mut add_key =
        |c: &Cursor, (name, text): (String, String), at: crate::ast::Location| -> Result<()> {
            if keys.iter().any(|(n, _)| n.eq_ignore_ascii_case(&name)) {
                return Err(c.error_at(at, format!("constraint '{name}' is declared twice")));
            }
            if text.starts_with("PRIMARY") {
                if keys.iter().any(|(_, t)| t.starts_with("PRIMARY")) {
                    return Err(c.error_at(at, "a table has one PRIMARY KEY; this is a second one"));
                }
                let inner = text
                    .trim_start_matches("PRIMARY KEY (")
                    .trim_end_matches(')');
                key_columns.extend(inner.split(", ").map(|k| (k.to_string(), at)));
            }
            keys.push((name, text));
            Ok(())
        };
    loop {
        if at_key_constraint(c) {
            let at = c.loc();
            if !constraints {
                return Err(c.error_at(at, "a key constraint is not allowed here"));
            }
            let key = key_constraint(c, None, None)?;
            add_key(c, key, at)?;
        } else if c.peek_keyword("CONSTRAINT") {
            let at = c.loc();
            if !constraints {
                return Err(c.error_at(at, "CONSTRAINT is not allowed here"));
            }
            c.next();
            if c.peek_nth_keyword(1, "PRIMARY") || c.peek_nth_keyword(1, "FOREIGN") {
                let (name, _) = c.ident("a constraint name")?;
                let key = key_constraint(c, Some(name), None)?;
                add_key(c, key, at)?;
                if !c.eat_token(&Token::Comma) {
                    break;
                }
                continue;
            }
            let e = parse_expectation(c, at)?;
            if expectations
                .iter()
                .any(|x| x.name.eq_ignore_ascii_case(&e.name))
            {
                return Err(c.error_at(at, format!("expectation '{}' is declared twice", e.name)));
            }
            expectations.push(e);
        } else {
            let (name, at) = c.ident("a column name or CONSTRAINT")?;
            if columns
                .iter()
                .any(|col| col.name.eq_ignore_ascii_case(&name))
            {
                return Err(c.error_at(at, format!("column '{name}' is declared twice")));
            }
            let data_type = parse_type(c)?;
            let mut column = ColumnDef::new(name, data_type);
            loop {
                if c.eat_keyword("NOT") {
                    c.expect_keyword("NULL")?;
                    column.nullable = false;
                } else if c.eat_keyword("COMMENT") {
                    column.comment = Some(c.string("a comment string")?);
                } else if c.peek_keyword("GENERATED") {
                    let at = c.loc();
                    if !constraints {
                        return Err(c.error_at(at, "GENERATED columns are not allowed here"));
                    }
                    c.next();
                    c.expect_keyword("ALWAYS")?;
                    c.expect_keyword("AS")?;
                    column.generated = Some(match c.sql(|p| p.parse_expr())? {
                        sqlparser::ast::Expr::Nested(inner) => inner.to_string(),
                        other => other.to_string(),
                    });
                } else if constraints
                    && (at_key_constraint(c)
                        || (c.peek_keyword("CONSTRAINT")
                            && (c.peek_nth_keyword(2, "PRIMARY")
                                || c.peek_nth_keyword(2, "FOREIGN"))))
                {
                    let key_at = c.loc();
                    let name = match c.eat_keyword("CONSTRAINT") {
                        true => Some(c.ident("a constraint name")?.0),
                        false => None,
                    };
                    let key = key_constraint(c, name, Some(&column.name))?;
                    add_key(c, key, key_at)?;
                } else {
                    break;
                }
            }
            columns.push(column);
        }
        if !c.eat_token(&Token::Comma) {
            break;
        }
    }
    if !columns.is_empty() {
        if let Some((k, at)) = key_columns
            .iter()
            .find(|(k, _)| !columns.iter().any(|col| col.name.eq_ignore_ascii_case(k)))
        {
            return Err(c.error_at(
                *at,
                format!("the PRIMARY KEY names column {k}, which the column list does not declare"),
            ));
        }
    }
    Ok(TableElements {
        columns,
        expectations,
        keys,
    })
}

/// After `CONSTRAINT`: `name EXPECT (condition) [ON VIOLATION DROP ROW | FAIL UPDATE]`.
fn parse_expectation(c: &mut Cursor, at: crate::ast::Location) -> Result<Expectation> {
    let (name, _) = c.ident("an expectation name")?;
    c.expect_keyword("EXPECT")?;
    let condition = match c.sql(|p| p.parse_expr())? {
        sqlparser::ast::Expr::Nested(inner) => inner.to_string(),
        other => other.to_string(),
    };
    let action = if c.eat_keyword("ON") {
        c.expect_keyword("VIOLATION")?;
        if c.eat_keyword("DROP") {
            c.expect_keyword("ROW")?;
            ExpectAction::Drop
        } else if c.eat_keyword("FAIL") {
            c.expect_keyword("UPDATE")?;
            ExpectAction::Fail
        } else {
            return Err(c.expected("DROP ROW or FAIL UPDATE"));
        }
    } else {
        ExpectAction::Warn
    };
    Ok(Expectation {
        name,
        condition,
        action,
        location: at,
    })
}

/// One Spark type name, with its `(n)` / `(p, s)` arguments where it takes them, or a
/// nested type: `ARRAY<T>`, `MAP<K, V>`, `STRUCT<name: T [NOT NULL] [COMMENT '...'], ...>`.
fn parse_type(c: &mut Cursor) -> Result<DataType> {
    let mut pending = 0;
    let t = parse_any_type(c, &mut pending)?;
    if pending > 0 {
        return Err(c.expected("a column type"));
    }
    Ok(t)
}

/// Ends a nested type's `<...>`. `>>` closes two: `pending` counts the `>` it closed
/// ahead (the tokenizer reads `ARRAY<ARRAY<INT>>` as a shift).
fn close_angle(c: &mut Cursor, pending: &mut usize) -> Result<()> {
    if *pending > 0 {
        *pending -= 1;
        return Ok(());
    }
    if c.eat_token(&Token::Gt) {
        return Ok(());
    }
    if c.eat_token(&Token::ShiftRight) {
        *pending += 1;
        return Ok(());
    }
    Err(c.expected("'>'"))
}

/// A nested type's element: the next type, unless a `>>` already closed its list.
fn parse_any_type(c: &mut Cursor, pending: &mut usize) -> Result<DataType> {
    if *pending > 0 {
        return Err(c.expected("a column type"));
    }
    let nested = match c.peek().map(|t| &t.token) {
        Some(Token::Word(w)) if w.quote_style.is_none() => w.value.to_ascii_uppercase(),
        _ => String::new(),
    };
    match nested.as_str() {
        "ARRAY" => {
            c.next();
            c.expect_token(&Token::Lt)?;
            let element = parse_any_type(c, pending)?;
            close_angle(c, pending)?;
            return Ok(DataType::List(Arc::new(Field::new(
                "element", element, true,
            ))));
        }
        "MAP" => {
            c.next();
            c.expect_token(&Token::Lt)?;
            let key = parse_any_type(c, pending)?;
            if *pending > 0 || !c.eat_token(&Token::Comma) {
                return Err(c.expected("',' and the map's value type"));
            }
            let value = parse_any_type(c, pending)?;
            close_angle(c, pending)?;
            let entries = Field::new(
                "key_value",
                DataType::Struct(Fields::from(vec![
                    Field::new("key", key, false),
                    Field::new("value", value, true),
                ])),
                false,
            );
            return Ok(DataType::Map(Arc::new(entries), false));
        }
        "STRUCT" => {
            c.next();
            // `STRUCT<>` is one token, `<>`.
            if c.eat_token(&Token::Neq) {
                return Ok(DataType::Struct(Fields::empty()));
            }
            c.expect_token(&Token::Lt)?;
            let mut fields: Vec<Field> = Vec::new();
            if !c.eat_token(&Token::Gt) {
                loop {
                    let (name, name_at) = c.ident("a field name")?;
                    if fields.iter().any(|f| f.name().eq_ignore_ascii_case(&name)) {
                        return Err(
                            c.error_at(name_at, format!("field '{name}' is declared twice"))
                        );
                    }
                    c.eat_token(&Token::Colon);
                    let t = parse_any_type(c, pending)?;
                    let mut nullable = true;
                    if *pending == 0 {
                        if c.eat_keyword("NOT") {
                            c.expect_keyword("NULL")?;
                            nullable = false;
                        }
                        if c.eat_keyword("COMMENT") {
                            c.string("a comment string")?;
                        }
                    }
                    fields.push(Field::new(name, t, nullable));
                    if *pending > 0 || !c.eat_token(&Token::Comma) {
                        break;
                    }
                }
                close_angle(c, pending)?;
            }
            return Ok(DataType::Struct(Fields::from(fields)));
        }
        _ => {}
    }
    scalar_type(c)
}

/// One scalar Spark type name.
fn scalar_type(c: &mut Cursor) -> Result<DataType> {
    let at = c.loc();
    let name = match c.peek().map(|t| &t.token) {
        Some(Token::Word(w)) if w.quote_style.is_none() => w.value.to_ascii_uppercase(),
        _ => return Err(c.expected("a column type")),
    };
    c.next();
    let data_type = match name.as_str() {
        "TINYINT" | "BYTE" => DataType::Int8,
        "SMALLINT" | "SHORT" => DataType::Int16,
        "INT" | "INTEGER" => DataType::Int32,
        "BIGINT" | "LONG" => DataType::Int64,
        "FLOAT" | "REAL" => DataType::Float32,
        "DOUBLE" => DataType::Float64,
        "BOOLEAN" => DataType::Boolean,
        "STRING" | "TEXT" => DataType::Utf8,
        "VARCHAR" | "CHAR" | "CHARACTER" => {
            // The length is a constraint Arrow strings do not carry.
            if c.peek_token(&Token::LParen) {
                type_args(c, 1, 1)?;
            }
            DataType::Utf8
        }
        "BINARY" => DataType::Binary,
        "DATE" => DataType::Date32,
        "TIMESTAMP" | "TIMESTAMP_LTZ" => {
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        }
        "TIMESTAMP_NTZ" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "DECIMAL" | "DEC" | "NUMERIC" => {
            let (precision, scale) = if c.peek_token(&Token::LParen) {
                let args = type_args(c, 1, 2)?;
                (
                    args.first().copied().unwrap_or(10),
                    args.get(1).copied().unwrap_or(0),
                )
            } else {
                (10, 0)
            };
            if !(1..=38).contains(&precision) || scale > precision {
                return Err(c.error_at(
                    at,
                    format!(
                        "invalid DECIMAL({precision},{scale}): precision must be 1 to 38 and scale at most the precision"
                    ),
                ));
            }
            // Both fit: precision <= 38 and scale <= precision.
            DataType::Decimal128(precision as u8, scale as i8)
        }
        _ => {
            return Err(c.error_at(at, format!("unknown column type '{name}'")));
        }
    };
    Ok(data_type)
}

/// An Arrow type as Spark SQL spells it (`INT`, `STRING`, `TIMESTAMP`, `DECIMAL(10,2)`,
/// `STRUCT<city: STRING>`, `ARRAY<INT>`, `MAP<STRING, INT>`): the inverse of the type names
/// [`parse_ddl_schema`] reads, for messages (users read SQL types, not Arrow's). Types with no
/// SQL name (unsigned integers, for one) keep Arrow's.
pub fn sql_type_name(t: &DataType) -> String {
    use DataType::*;
    match t {
        Int8 => "TINYINT".into(),
        Int16 => "SMALLINT".into(),
        Int32 => "INT".into(),
        Int64 => "BIGINT".into(),
        Float32 => "FLOAT".into(),
        Float64 => "DOUBLE".into(),
        Boolean => "BOOLEAN".into(),
        Utf8 | Utf8View | LargeUtf8 => "STRING".into(),
        Binary | BinaryView | LargeBinary | FixedSizeBinary(_) => "BINARY".into(),
        Date32 | Date64 => "DATE".into(),
        // Any unit: Delta has microseconds only, and a SQL type name has no unit.
        Timestamp(_, Some(_)) => "TIMESTAMP".into(),
        Timestamp(_, None) => "TIMESTAMP_NTZ".into(),
        Time32(_) | Time64(_) => "TIME".into(),
        Duration(_) | Interval(_) => "INTERVAL".into(),
        Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) | Decimal256(p, s) => {
            format!("DECIMAL({p},{s})")
        }
        List(f) | LargeList(f) | ListView(f) | LargeListView(f) | FixedSizeList(f, _) => {
            format!("ARRAY<{}>", sql_type_name(f.data_type()))
        }
        Map(entries, _) => match entries.data_type() {
            Struct(kv) if kv.len() == 2 => format!(
                "MAP<{}, {}>",
                sql_type_name(kv[0].data_type()),
                sql_type_name(kv[1].data_type())
            ),
            other => sql_type_name(other),
        },
        Struct(fields) => format!(
            "STRUCT<{}>",
            fields
                .iter()
                .map(|f| format!("{}: {}", f.name(), sql_type_name(f.data_type())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Dictionary(_, values) => sql_type_name(values),
        Null => "VOID".into(),
        other => other.to_string(),
    }
}

/// `(n)` or `(n, m)`: between `min` and `max` small unsigned integers.
fn type_args(c: &mut Cursor, min: usize, max: usize) -> Result<Vec<u32>> {
    c.expect_token(&Token::LParen)?;
    let mut args = Vec::new();
    loop {
        let value = match c.peek().map(|t| &t.token) {
            Some(Token::Number(n, _)) => n.parse::<u32>().ok(),
            _ => None,
        };
        match value {
            Some(v) if args.len() < max => {
                c.next();
                args.push(v);
            }
            _ => return Err(c.expected("a whole number")),
        }
        if !c.eat_token(&Token::Comma) {
            break;
        }
    }
    if args.len() < min {
        return Err(c.expected("a whole number"));
    }
    c.expect_token(&Token::RParen)?;
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqlError;

    #[test]
    fn spark_types_map_to_arrow() {
        let cols = parse_ddl_schema(
            "a TINYINT, b BYTE, c SMALLINT, d SHORT, e INT, f INTEGER, g BIGINT, h LONG, \
             i FLOAT, j REAL, k DOUBLE, l BOOLEAN, m STRING, n VARCHAR(10), o CHAR(3), p TEXT, \
             q BINARY, r DATE, s TIMESTAMP, t TIMESTAMP_NTZ, u DECIMAL(10,2), v NUMERIC, \
             w decimal NOT NULL COMMENT 'x', `x y` int",
        )
        .unwrap();
        let types: Vec<_> = cols.iter().map(|c| c.data_type.clone()).collect();
        assert_eq!(
            types,
            vec![
                DataType::Int8,
                DataType::Int8,
                DataType::Int16,
                DataType::Int16,
                DataType::Int32,
                DataType::Int32,
                DataType::Int64,
                DataType::Int64,
                DataType::Float32,
                DataType::Float32,
                DataType::Float64,
                DataType::Boolean,
                DataType::Utf8,
                DataType::Utf8,
                DataType::Utf8,
                DataType::Utf8,
                DataType::Binary,
                DataType::Date32,
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                DataType::Timestamp(TimeUnit::Microsecond, None),
                DataType::Decimal128(10, 2),
                DataType::Decimal128(10, 0),
                DataType::Decimal128(10, 0),
                DataType::Int32,
            ]
        );
        assert!(cols[..22].iter().all(|c| c.nullable));
        assert!(!cols[22].nullable);
        assert_eq!(cols[23].name, "x y");
    }

    #[test]
    fn nested_types_map_to_arrow() {
        let cols = parse_ddl_schema(
            "a ARRAY<INT>, b MAP<STRING, BIGINT>, c STRUCT<id: INT NOT NULL, tags ARRAY<STRING>>, \
             d ARRAY<ARRAY<INT>>, e MAP<STRING, STRUCT<x: DOUBLE>>, f STRUCT<>",
        )
        .unwrap();
        let list = |t: DataType| DataType::List(Arc::new(Field::new("element", t, true)));
        assert_eq!(cols[0].data_type, list(DataType::Int32));
        let DataType::Map(entries, false) = &cols[1].data_type else {
            panic!("{:?}", cols[1].data_type);
        };
        let DataType::Struct(kv) = entries.data_type() else {
            panic!("{entries:?}");
        };
        assert_eq!(
            (kv[0].data_type(), kv[1].data_type()),
            (&DataType::Utf8, &DataType::Int64)
        );
        assert_eq!(
            cols[2].data_type,
            DataType::Struct(Fields::from(vec![
                Field::new("id", DataType::Int32, false),
                Field::new("tags", list(DataType::Utf8), true),
            ]))
        );
        assert_eq!(cols[3].data_type, list(list(DataType::Int32)));
        assert!(matches!(cols[4].data_type, DataType::Map(..)));
        assert_eq!(cols[5].data_type, DataType::Struct(Fields::empty()));
        for bad in [
            "a ARRAY<INT",
            "a ARRAY<>",
            "a MAP<INT>",
            "a STRUCT<x INT, x INT>",
            "a ARRAY<INT>>",
            "a ARRAY<ARRAY<INT>>>",
        ] {
            assert!(parse_ddl_schema(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sql_type_names_read_back_as_the_same_type() {
        let ddl = "a TINYINT, b SMALLINT, c INT, d BIGINT, e FLOAT, f DOUBLE, g BOOLEAN, \
                   h STRING, i BINARY, j DATE, k TIMESTAMP, l TIMESTAMP_NTZ, m DECIMAL(12,3), \
                   n ARRAY<INT>, o MAP<STRING, ARRAY<BIGINT>>, \
                   p STRUCT<city: STRING, zip: STRING, tags: ARRAY<STRUCT<x: DOUBLE>>>, \
                   q STRUCT<>, r ARRAY<MAP<INT, DECIMAL(5,2)>>";
        let cols = parse_ddl_schema(ddl).unwrap();
        let names: Vec<String> = cols
            .iter()
            .map(|c| format!("{} {}", c.name, sql_type_name(&c.data_type)))
            .collect();
        assert_eq!(names.join(", "), ddl);
        // The names parse back into the same types.
        let again = parse_ddl_schema(&names.join(", ")).unwrap();
        assert_eq!(
            again.iter().map(|c| &c.data_type).collect::<Vec<_>>(),
            cols.iter().map(|c| &c.data_type).collect::<Vec<_>>()
        );
    }

    #[test]
    fn arrow_types_without_a_ddl_spelling_are_named() {
        use arrow_schema::IntervalUnit;
        let cases = [
            (DataType::LargeUtf8, "STRING"),
            (DataType::Utf8View, "STRING"),
            (
                DataType::Timestamp(TimeUnit::Nanosecond, Some("+02:00".into())),
                "TIMESTAMP",
            ),
            (
                DataType::Timestamp(TimeUnit::Millisecond, None),
                "TIMESTAMP_NTZ",
            ),
            (DataType::Time64(TimeUnit::Microsecond), "TIME"),
            (DataType::Interval(IntervalUnit::DayTime), "INTERVAL"),
            (DataType::Decimal256(50, 4), "DECIMAL(50,4)"),
            (
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                "STRING",
            ),
            (
                DataType::LargeList(Arc::new(Field::new("item", DataType::Date32, true))),
                "ARRAY<DATE>",
            ),
            (DataType::Null, "VOID"),
            (DataType::UInt32, "UInt32"),
        ];
        for (t, name) in cases {
            assert_eq!(sql_type_name(&t), name, "{t:?}");
        }
    }

    #[test]
    fn unknown_type_is_named() {
        let err = parse_ddl_schema("a INT, b FOO").unwrap_err();
        match err {
            SqlError::Syntax {
                location, message, ..
            } => {
                assert_eq!(message, "unknown column type 'FOO'");
                assert_eq!((location.line, location.column), (1, 10));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_ddl_is_an_error() {
        for ddl in [
            "",
            "a",
            "a INT,",
            "a INT b INT",
            "a DECIMAL(40,2)",
            "a DECIMAL(5,6)",
            "a DECIMAL(",
            "a INT, A STRING",
            "a VARCHAR(x)",
            "'a' INT",
        ] {
            assert!(parse_ddl_schema(ddl).is_err(), "{ddl}");
        }
    }
}
