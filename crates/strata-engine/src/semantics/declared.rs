//! Declared schemas: a dataset's column list (`CREATE STREAMING TABLE t (id BIGINT NOT NULL
//! COMMENT '...', ...)`) is its schema. What a flow produces is checked against it column by
//! column: a column on one side only is an error, a type that fits the declared one is
//! widened to it, any other type is an error naming both. Pure functions, no I/O.

use deltalake::arrow::datatypes::{DataType, Field, TimeUnit};
use std::collections::HashMap;
use strata_sql::ColumnDef;

/// Auto Loader's rescued-data column: kept in the streaming table, never carried into a
/// target by `COLUMNS *` (a flow names it to keep it).
pub(crate) const RESCUED_COLUMN: &str = "_rescued_data";
/// Delta's field metadata key for a column comment (as Spark writes it).
pub(crate) const COMMENT_KEY: &str = "comment";
/// The field metadata key for a generated column's expression. Not Delta's own
/// `delta.generationExpression`: with that key, deltalake 1.1 re-derives generated columns on
/// every write through a projection that lower-cases column names, which fails on a target's
/// `__START_AT`. strata computes the column itself in the flow's output; Delta readers see
/// a plain column.
pub(crate) const GENERATION_KEY: &str = "strata.generationExpression";

/// The Delta field of a declared column: its type, nullability, comment and generation
/// expression.
pub(crate) fn declared_field(c: &ColumnDef) -> Field {
    let mut metadata = HashMap::new();
    if let Some(comment) = &c.comment {
        metadata.insert(COMMENT_KEY.to_string(), comment.clone());
    }
    if let Some(expr) = &c.generated {
        metadata.insert(GENERATION_KEY.to_string(), expr.clone());
    }
    Field::new(&c.name, c.data_type.clone(), c.nullable).with_metadata(metadata)
}

/// Whether every value of `from` is a value of `to` (a safe widening, or the same type up
/// to the spelling of a time zone).
pub(crate) fn fits(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    if crate::util::arrow::same_type(from, to) {
        return true;
    }
    let int_bits = |t: &DataType| match t {
        Int8 => Some(8),
        Int16 => Some(16),
        Int32 => Some(32),
        Int64 => Some(64),
        _ => None,
    };
    // Decimal digits an integer type needs.
    let int_digits = |t: &DataType| match t {
        Int8 => Some(3),
        Int16 => Some(5),
        Int32 => Some(10),
        Int64 => Some(19),
        _ => None,
    };
    match (from, to) {
        (Null, _) => true,
        // DataFusion's timestamp expressions (CAST(x AS TIMESTAMP), to_timestamp(x),
        // literals) are nanoseconds; Delta's TIMESTAMP is microseconds in UTC and
        // TIMESTAMP_NTZ microseconds without a zone: the value a Delta table can hold.
        (Timestamp(_, _), Timestamp(TimeUnit::Microsecond, _)) => true,
        (Date32, Timestamp(TimeUnit::Microsecond, _)) => true,
        (a, b) if int_bits(a).is_some() && int_bits(b).is_some() => int_bits(a) <= int_bits(b),
        (Int8 | Int16 | Int32, Float64) | (Int8 | Int16, Float32) | (Float32, Float64) => true,
        (a, Decimal128(p, s)) if int_digits(a).is_some() => {
            int_digits(a).is_some_and(|d| d <= i32::from(*p) - i32::from(*s))
        }
        (Decimal128(p1, s1), Decimal128(p2, s2)) => {
            s2 >= s1 && i32::from(*p2) - i32::from(*s2) >= i32::from(*p1) - i32::from(*s1)
        }
        (Date32, Timestamp(_, _)) => true,
        (Utf8View | LargeUtf8, Utf8) | (BinaryView | LargeBinary, Binary) => true,
        _ => false,
    }
}

pub(crate) use crate::util::arrow::sql_type_name as spark_name;

/// What a flow's output must become to match its target's declaration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Conformed {
    /// The output columns in the declared order, each with the type it is cast to when it
    /// differs from the produced one.
    pub columns: Vec<(String, Option<DataType>)>,
    /// Declared generated columns (name, expression, type), computed with the output.
    pub generated: Vec<(String, String, DataType)>,
}

/// Checks `produced` (a flow's output columns and their types) against `declared`, leaving
/// out the `timeline` columns, which the target adds itself. `who` names the producer in
/// messages (`flow f`), `table` the target.
pub(crate) fn conform(
    produced: &[(String, DataType)],
    declared: &[ColumnDef],
    timeline: &[String],
    who: &str,
    table: &str,
) -> Result<Conformed, String> {
    let is_timeline = |n: &str| timeline.iter().any(|t| t.eq_ignore_ascii_case(n));
    for (name, t) in produced {
        if !declared.iter().any(|d| d.name.eq_ignore_ascii_case(name)) {
            return Err(format!(
                "{who} produces column `{name}` ({}), which the declared columns of {table} do \
                 not have; declare it, or leave it out with COLUMNS * EXCEPT ({name})",
                spark_name(t)
            ));
        }
    }
    let mut columns = Vec::new();
    let mut generated = Vec::new();
    for d in declared.iter().filter(|d| !is_timeline(&d.name)) {
        if let Some(expr) = &d.generated {
            generated.push((d.name.clone(), expr.clone(), d.data_type.clone()));
            continue;
        }
        let Some((name, t)) = produced
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(&d.name))
        else {
            return Err(format!(
                "{table} declares column `{}` ({}), which {who} does not produce (it produces {})",
                d.name,
                spark_name(&d.data_type),
                produced
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        if !fits(t, &d.data_type) {
            return Err(format!(
                "column `{name}`: {table} declares it {} but {who} produces {}, which does not \
                 fit; declare {} or cast it in the source",
                spark_name(&d.data_type),
                spark_name(t),
                spark_name(t)
            ));
        }
        let cast = (!crate::util::arrow::same_type(t, &d.data_type)).then(|| d.data_type.clone());
        columns.push((name.clone(), cast));
    }
    Ok(Conformed { columns, generated })
}

/// Checks the declared timeline columns of an SCD type 2 (or `SNAPSHOTS`) target against
/// the fields the target's convention gives them (typed like the sequence). `Ok(Some(t))`
/// when the sequence must be cast to `t` for them to match.
pub(crate) fn conform_timeline(
    fields: &[Field],
    declared: &[ColumnDef],
    sequence: &str,
    seq_type: &DataType,
    table: &str,
) -> Result<Option<DataType>, String> {
    let mut cast: Option<DataType> = None;
    for f in fields {
        let Some(d) = declared
            .iter()
            .find(|d| d.name.eq_ignore_ascii_case(f.name()))
        else {
            return Err(format!(
                "{table} keeps history: its declared columns need `{}` ({}, the type of SEQUENCE \
                 BY {sequence})",
                f.name(),
                spark_name(f.data_type())
            ));
        };
        if crate::util::arrow::same_type(f.data_type(), &d.data_type) {
            continue;
        }
        let typed_like_seq = crate::util::arrow::same_type(f.data_type(), seq_type);
        if typed_like_seq && fits(seq_type, &d.data_type) {
            cast = Some(d.data_type.clone());
            continue;
        }
        return Err(format!(
            "column `{}`: {table} declares it {} but the timeline columns take the type of \
             SEQUENCE BY {sequence}, {}; declare `{}` {} or sequence by a {} value",
            d.name,
            spark_name(&d.data_type),
            spark_name(f.data_type()),
            d.name,
            spark_name(f.data_type()),
            spark_name(&d.data_type),
        ));
    }
    Ok(cast)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, t: DataType) -> ColumnDef {
        ColumnDef::new(name, t)
    }

    fn produced(cols: &[(&str, DataType)]) -> Vec<(String, DataType)> {
        cols.iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect()
    }

    #[test]
    fn widenings_fit_and_narrowings_do_not() {
        use DataType::*;
        assert!(fits(&Int32, &Int64));
        assert!(!fits(&Int64, &Int32));
        assert!(fits(&Float32, &Float64));
        assert!(fits(&Int32, &Decimal128(12, 2)));
        assert!(!fits(&Int64, &Decimal128(12, 2)));
        assert!(fits(&Decimal128(10, 2), &Decimal128(12, 4)));
        assert!(!fits(&Decimal128(10, 2), &Decimal128(10, 4)));
        assert!(fits(&Utf8View, &Utf8));
        assert!(!fits(&Utf8, &Int64));
        assert!(!fits(
            &Int64,
            &Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        ));
        // DataFusion's nanosecond timestamps fit Delta's microsecond TIMESTAMP and
        // TIMESTAMP_NTZ; a type name never shows a unit.
        let delta_ts = Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        assert!(fits(&Timestamp(TimeUnit::Nanosecond, None), &delta_ts));
        assert!(fits(
            &Timestamp(TimeUnit::Nanosecond, Some("+00:00".into())),
            &Timestamp(TimeUnit::Microsecond, None)
        ));
        assert!(fits(&Date32, &delta_ts));
        assert!(!fits(&delta_ts, &Date32));
        assert_eq!(
            spark_name(&Timestamp(TimeUnit::Nanosecond, None)),
            "TIMESTAMP_NTZ"
        );
        assert_eq!(
            spark_name(&Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))),
            "TIMESTAMP"
        );
        let map = Map(
            std::sync::Arc::new(Field::new(
                "entries",
                Struct(
                    vec![
                        Field::new("key", Utf8, false),
                        Field::new("value", Int64, true),
                    ]
                    .into(),
                ),
                false,
            )),
            false,
        );
        assert_eq!(spark_name(&map), "MAP<STRING, BIGINT>");
    }

    #[test]
    fn conform_orders_by_declaration_and_casts_what_widens() {
        let got = conform(
            &produced(&[("name", DataType::Utf8), ("id", DataType::Int32)]),
            &[
                col("id", DataType::Int64),
                col("name", DataType::Utf8),
                col("__START_AT", DataType::Int64),
            ],
            &["__START_AT".to_string()],
            "flow f",
            "t",
        )
        .unwrap();
        assert_eq!(
            got.columns,
            vec![
                ("id".to_string(), Some(DataType::Int64)),
                ("name".to_string(), None)
            ]
        );
    }

    #[test]
    fn conform_names_the_column_on_each_side() {
        let extra = conform(
            &produced(&[("id", DataType::Int64), ("_rescued_data", DataType::Utf8)]),
            &[col("id", DataType::Int64)],
            &[],
            "flow f",
            "t",
        )
        .unwrap_err();
        assert!(extra.contains("`_rescued_data` (STRING)"), "{extra}");
        let missing = conform(
            &produced(&[("id", DataType::Int64)]),
            &[col("id", DataType::Int64), col("name", DataType::Utf8)],
            &[],
            "flow f",
            "t",
        )
        .unwrap_err();
        assert!(
            missing.contains("declares column `name` (STRING)"),
            "{missing}"
        );
        let narrowed = conform(
            &produced(&[("id", DataType::Int64)]),
            &[col("id", DataType::Int32)],
            &[],
            "flow f",
            "t",
        )
        .unwrap_err();
        assert!(
            narrowed.contains("declares it INT but flow f produces BIGINT"),
            "{narrowed}"
        );
    }

    #[test]
    fn timeline_columns_take_the_sequence_type() {
        let ts = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let fields = [
            Field::new("__START_AT", DataType::Int64, true),
            Field::new("__END_AT", DataType::Int64, true),
        ];
        let declared = [col("__START_AT", ts.clone()), col("__END_AT", ts)];
        let e = conform_timeline(&fields, &declared, "seq", &DataType::Int64, "t").unwrap_err();
        assert!(
            e.contains("declares it TIMESTAMP but the timeline columns take the type of SEQUENCE BY seq, BIGINT"),
            "{e}"
        );
        let int_fields = [
            Field::new("__START_AT", DataType::Int32, true),
            Field::new("__END_AT", DataType::Int32, true),
        ];
        let wide = [
            col("__START_AT", DataType::Int64),
            col("__END_AT", DataType::Int64),
        ];
        assert_eq!(
            conform_timeline(&int_fields, &wide, "seq", &DataType::Int32, "t"),
            Ok(Some(DataType::Int64))
        );
        let e = conform_timeline(&fields, &wide[..1], "seq", &DataType::Int64, "t").unwrap_err();
        assert!(e.contains("need `__END_AT` (BIGINT"), "{e}");
    }
}
