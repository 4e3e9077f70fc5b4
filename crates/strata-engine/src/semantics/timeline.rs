//! Table conventions: how a historised target (SCD type 2 or `SNAPSHOTS`) names and fills its
//! timeline columns.
//!
//! The engine folds events into rows with an internal `__START_AT` / `__END_AT` pair (NULL end
//! = open). A [`Timeline`], read from the target's table properties, maps those rows to the
//! table's own layout just before they are compared with and written to the target:
//!
//! ```text
//! data columns | surrogate key | updated-at | valid-from | valid-to | current flag
//!              | md5(key|start) | = start   | = start    | end or   | end is open
//!              |  (optional)    | (optional)|            | open-end | (optional)
//! ```
//!
//! Properties (`TBLPROPERTIES` of the target): `strata.scd.convention` picks a preset
//! (`databricks`, `dbt`, `kimball`); `strata.scd.validFrom`, `strata.scd.validTo`,
//! `strata.scd.currentFlag`, `strata.scd.surrogateKey`, `strata.scd.updatedAt` (a column name,
//! empty for none) and `strata.scd.openEnd` (`null` or a literal such as `9999-12-31`) override
//! it. See `docs/conventions.md`.

use crate::error::{Context, EngineError, Result};
use deltalake::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, StringBuilder};
use deltalake::arrow::compute::is_null;
use deltalake::arrow::compute::kernels::{cmp, nullif, zip};
use deltalake::arrow::datatypes::{DataType, Field, SchemaRef};
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use deltalake::datafusion::scalar::ScalarValue;
use md5::{Digest, Md5};
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) const PREFIX: &str = "strata.scd.";
const KEYS: [&str; 9] = [
    "convention",
    "validfrom",
    "validto",
    "currentflag",
    "surrogatekey",
    "updatedat",
    "openend",
    "partitionby",
    "hashcolumn",
];
pub(crate) const PRESETS: [&str; 3] = ["databricks", "dbt", "kimball"];

/// The timeline columns of one historised table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Timeline {
    pub surrogate_key: Option<String>,
    pub updated_at: Option<String>,
    pub valid_from: String,
    pub valid_to: String,
    pub current_flag: Option<String>,
    /// The open-end marker as written (`None`: open rows end in NULL).
    pub open_end: Option<String>,
    /// `strata.scd.partitionBy = 'start'`: the table is partitioned by its start column.
    pub partition_by_start: bool,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            surrogate_key: None,
            updated_at: None,
            valid_from: "__START_AT".into(),
            valid_to: "__END_AT".into(),
            current_flag: None,
            open_end: None,
            partition_by_start: false,
        }
    }
}

impl Timeline {
    fn preset(name: &str) -> Option<Timeline> {
        let s = |v: &str| v.to_string();
        Some(match name {
            "databricks" => Timeline::default(),
            "dbt" => Timeline {
                surrogate_key: Some(s("dbt_scd_id")),
                updated_at: Some(s("dbt_updated_at")),
                valid_from: s("dbt_valid_from"),
                valid_to: s("dbt_valid_to"),
                current_flag: None,
                open_end: None,
                partition_by_start: false,
            },
            "kimball" => Timeline {
                surrogate_key: Some(s("surrogate_key")),
                updated_at: None,
                valid_from: s("valid_from"),
                valid_to: s("valid_to"),
                current_flag: Some(s("is_current")),
                open_end: Some(s("9999-12-31")),
                partition_by_start: false,
            },
            _ => return None,
        })
    }

    /// Reads the convention from table properties (keys compared without case). Unknown
    /// `strata.scd.*` keys and unknown presets are errors, so a typo is not silently ignored.
    pub fn from_properties<'a>(
        properties: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<Timeline> {
        let mut props: BTreeMap<String, String> = BTreeMap::new();
        for (k, v) in properties {
            let lower = k.to_ascii_lowercase();
            if let Some(rest) = lower.strip_prefix(PREFIX) {
                if !KEYS.contains(&rest) {
                    return Err(EngineError::plan(format!(
                        "unknown table property {k}; the timeline properties are {}",
                        KEYS.iter()
                            .map(|k| format!("{PREFIX}{k}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                props.insert(rest.to_string(), v.clone());
            }
        }
        let preset = props
            .get("convention")
            .map(|c| c.to_ascii_lowercase())
            .unwrap_or_else(|| "databricks".to_string());
        let mut t = Timeline::preset(&preset).ok_or_else(|| {
            EngineError::plan(format!(
                "{PREFIX}convention = '{preset}' is not a known convention; use one of {}",
                PRESETS.join(", ")
            ))
        })?;
        let optional = |v: &String| (!v.trim().is_empty()).then(|| v.trim().to_string());
        let required = |key: &str, v: &String| -> Result<String> {
            optional(v).ok_or_else(|| EngineError::plan(format!("{PREFIX}{key} cannot be empty")))
        };
        if let Some(v) = props.get("validfrom") {
            t.valid_from = required("validFrom", v)?;
        }
        if let Some(v) = props.get("validto") {
            t.valid_to = required("validTo", v)?;
        }
        if let Some(v) = props.get("currentflag") {
            t.current_flag = optional(v);
        }
        if let Some(v) = props.get("surrogatekey") {
            t.surrogate_key = optional(v);
        }
        if let Some(v) = props.get("updatedat") {
            t.updated_at = optional(v);
        }
        if let Some(v) = props.get("openend") {
            t.open_end = optional(v).filter(|v| !v.eq_ignore_ascii_case("null"));
        }
        if let Some(v) = props.get("partitionby") {
            t.partition_by_start = match v.trim().to_ascii_lowercase().as_str() {
                "start" => true,
                "" | "none" => false,
                other => {
                    return Err(EngineError::plan(format!(
                        "{PREFIX}partitionBy = '{other}': the one partitioning strata offers for \
                         a historised table is by its start column ('start'), or 'none'"
                    )))
                }
            };
        }
        let names = t.column_names();
        for (i, a) in names.iter().enumerate() {
            if names[..i].iter().any(|b| b.eq_ignore_ascii_case(a)) {
                return Err(EngineError::plan(format!(
                    "the timeline properties name column {a} twice"
                )));
            }
        }
        Ok(t)
    }

    /// Whether rows need no mapping (the `databricks` layout).
    pub fn is_internal(&self) -> bool {
        Timeline {
            partition_by_start: false,
            ..self.clone()
        } == Timeline::default()
    }

    /// The Delta partition columns of the table.
    pub fn partition_columns(&self) -> Vec<String> {
        if self.partition_by_start {
            vec![self.valid_from.clone()]
        } else {
            Vec::new()
        }
    }

    /// The timeline columns in table order.
    pub fn column_names(&self) -> Vec<String> {
        let mut v = Vec::new();
        v.extend(self.surrogate_key.clone());
        v.extend(self.updated_at.clone());
        v.push(self.valid_from.clone());
        v.push(self.valid_to.clone());
        v.extend(self.current_flag.clone());
        v
    }

    /// The timeline fields for a version of type `seq`.
    pub fn fields(&self, seq: &DataType) -> Vec<Field> {
        let mut v = Vec::new();
        if let Some(n) = &self.surrogate_key {
            v.push(Field::new(n, DataType::Utf8, true));
        }
        if let Some(n) = &self.updated_at {
            v.push(Field::new(n, seq.clone(), true));
        }
        v.push(Field::new(&self.valid_from, seq.clone(), true));
        v.push(Field::new(&self.valid_to, seq.clone(), true));
        if let Some(n) = &self.current_flag {
            v.push(Field::new(n, DataType::Boolean, true));
        }
        v
    }

    /// The open-end marker as a value of `seq`, checked to fit.
    pub fn open_end_value(&self, seq: &DataType) -> Result<Option<ScalarValue>> {
        let Some(text) = &self.open_end else {
            return Ok(None);
        };
        let value = ScalarValue::try_from_string(text.clone(), seq)
            .ok()
            .filter(|v| !v.is_null())
            .ok_or_else(|| {
                EngineError::plan(format!(
                    "the open-end marker '{text}' ({PREFIX}openEnd) is not a value of the \
                     version type {}; set {PREFIX}openEnd to one that is, or to null",
                    strata_sql::sql_type_name(seq)
                ))
            })?;
        Ok(Some(value))
    }

    /// Maps folded rows (`n_out` data columns, then `__START_AT`, `__END_AT`) to `target`'s
    /// layout. `keys` index the key columns among the data columns.
    pub fn apply(
        &self,
        rows: &RecordBatch,
        n_out: usize,
        keys: &[usize],
        target: &SchemaRef,
    ) -> Result<RecordBatch> {
        if self.is_internal() {
            return Ok(rows.clone());
        }
        let (start, end) = (rows.column(n_out).clone(), rows.column(n_out + 1).clone());
        let mut cols: Vec<ArrayRef> = rows.columns()[..n_out].to_vec();
        if self.surrogate_key.is_some() {
            cols.push(surrogate_keys(rows, keys, &start)?);
        }
        if self.updated_at.is_some() {
            cols.push(start.clone());
        }
        cols.push(start);
        cols.push(match self.open_end_value(end.data_type())? {
            None => end.clone(),
            Some(marker) => {
                let marker = marker.to_scalar().context(|| "open-end marker".into())?;
                zip::zip(&is_null(&end).context(|| "open end".into())?, &marker, &end)
                    .context(|| "open end".into())?
            }
        });
        if self.current_flag.is_some() {
            cols.push(Arc::new(is_null(&end).context(|| "current flag".into())?));
        }
        RecordBatch::try_new(target.clone(), cols).context(|| "timeline columns".into())
    }

    /// `column` (a valid-to column of this table) with the open-end marker turned into NULL.
    pub fn open_as_null(&self, column: &ArrayRef) -> Result<ArrayRef> {
        match self.open_end_value(column.data_type())? {
            None => Ok(column.clone()),
            Some(marker) => {
                let marker = marker.to_scalar().context(|| "open-end marker".into())?;
                let is_open: BooleanArray =
                    cmp::eq(column, &marker).context(|| "open end".into())?;
                nullif::nullif(column, &is_open).context(|| "open end".into())
            }
        }
    }
}

/// dbt's `md5(coalesce(cast(k as varchar), '') || '|' || ... || coalesce(cast(start as
/// varchar), ''))`, with timestamps printed the way PostgreSQL casts them (`2016-07-01
/// 00:00:00`), so that dbt snapshot tables can be taken over.
fn surrogate_keys(rows: &RecordBatch, keys: &[usize], start: &ArrayRef) -> Result<ArrayRef> {
    let options = FormatOptions::default()
        .with_null("")
        .with_timestamp_format(Some("%Y-%m-%d %H:%M:%S%.f"))
        .with_timestamp_tz_format(Some("%Y-%m-%d %H:%M:%S%.f"))
        .with_datetime_format(Some("%Y-%m-%d %H:%M:%S%.f"));
    let mut parts: Vec<&ArrayRef> = keys.iter().map(|&k| rows.column(k)).collect();
    parts.push(start);
    let fmts = parts
        .iter()
        .map(|a| ArrayFormatter::try_new(a.as_ref(), &options))
        .collect::<std::result::Result<Vec<_>, _>>()
        .context(|| "surrogate key".into())?;
    let mut out = StringBuilder::with_capacity(rows.num_rows(), rows.num_rows() * 32);
    let mut text = String::new();
    for i in 0..rows.num_rows() {
        text.clear();
        for (j, f) in fmts.iter().enumerate() {
            if j > 0 {
                text.push('|');
            }
            if parts[j].is_valid(i) {
                use std::fmt::Write;
                let _ = write!(text, "{}", f.value(i));
            }
        }
        let digest = Md5::digest(text.as_bytes());
        let mut hex = String::with_capacity(32);
        for b in digest {
            use std::fmt::Write;
            let _ = write!(hex, "{b:02x}");
        }
        out.append_value(&hex);
    }
    Ok(Arc::new(out.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{StringArray, TimestampMicrosecondArray};
    use deltalake::arrow::datatypes::Schema;

    #[test]
    fn dbt_hash_matches_dbt() {
        let key: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
        // 2016-07-01 00:00:00 UTC in microseconds.
        let start: ArrayRef = Arc::new(
            TimestampMicrosecondArray::from(vec![1_467_331_200_000_000]).with_timezone("UTC"),
        );
        let rows = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("k", DataType::Utf8, true),
                Field::new("s", start.data_type().clone(), true),
            ])),
            vec![key, start.clone()],
        )
        .unwrap();
        let sk = surrogate_keys(&rows, &[0], &start).unwrap();
        let sk = sk.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(sk.value(0), "927354aa091feffd9437ead0bdae7ae1");
    }

    #[test]
    fn presets_and_overrides() {
        let p = |pairs: &[(&str, &str)]| Timeline::from_properties(&strata_sql::string_map(pairs));
        assert!(p(&[]).unwrap().is_internal());
        let k = p(&[("strata.scd.convention", "kimball")]).unwrap();
        assert_eq!(
            k.column_names(),
            ["surrogate_key", "valid_from", "valid_to", "is_current"]
        );
        let o = p(&[
            ("strata.scd.convention", "kimball"),
            ("strata.scd.openEnd", "null"),
            ("strata.scd.currentFlag", ""),
        ])
        .unwrap();
        assert_eq!(o.open_end, None);
        assert_eq!(o.current_flag, None);
        assert!(p(&[("strata.scd.convention", "scd")]).is_err());
        assert!(p(&[("strata.scd.validfrm", "x")]).is_err());
    }
}
