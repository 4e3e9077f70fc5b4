//! DataFusion's datetime functions that take a format, reading Spark's datetime patterns
//! as Databricks SQL writes them: `to_timestamp(s, 'yyyy-MM-dd HH:mm:ss')`,
//! `to_date(s, 'dd/MM/yyyy')`, `date_format(ts, 'yyyy-MM')`. Each is DataFusion's own
//! function, whose format arguments are first turned into chrono's
//! ([`strata_sql::spark_datetime_pattern`]; a chrono pattern, with `%`, is read as it is).

use deltalake::arrow::array::{Array, ArrayRef, StringArray};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, FieldRef};
use deltalake::datafusion::common::config::ConfigOptions;
use deltalake::datafusion::common::{exec_err, Result, ScalarValue};
use deltalake::datafusion::logical_expr::{
    ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature,
};
use deltalake::datafusion::prelude::SessionContext;
use std::sync::Arc;

/// The functions whose arguments after the first are formats.
const WITH_FORMATS: [&str; 7] = [
    "to_timestamp",
    "to_timestamp_seconds",
    "to_timestamp_millis",
    "to_timestamp_micros",
    "to_timestamp_nanos",
    "to_date",
    "to_char",
];

/// Replaces, in `ctx`, each function of [`WITH_FORMATS`] by one that reads Spark patterns.
pub(crate) fn register(ctx: &SessionContext) {
    for name in WITH_FORMATS {
        if let Some(inner) = ctx.state().scalar_functions().get(name).cloned() {
            ctx.register_udf(ScalarUDF::new_from_impl(SparkFormats { inner }));
        }
    }
}

/// A datetime function whose format arguments may be Spark patterns.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SparkFormats {
    inner: Arc<ScalarUDF>,
}

impl ScalarUDFImpl for SparkFormats {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let inner = self.inner.inner().with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(SparkFormats {
            inner: Arc::new(inner),
        }))
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        for value in args.args.iter_mut().skip(1) {
            *value = chrono_formats(self.name(), std::mem::replace(value, null()))?;
        }
        self.inner.invoke_with_args(args)
    }
}

fn null() -> ColumnarValue {
    ColumnarValue::Scalar(ScalarValue::Null)
}

/// A format argument (a string, or a column of them) with Spark patterns made chrono's.
fn chrono_formats(function: &str, value: ColumnarValue) -> Result<ColumnarValue> {
    let translate = |p: &str| match strata_sql::spark_datetime_pattern(p) {
        Ok(chrono) => Ok(chrono),
        Err(why) => exec_err!("{function}: {why}"),
    };
    Ok(match value {
        ColumnarValue::Scalar(
            ScalarValue::Utf8(Some(p))
            | ScalarValue::LargeUtf8(Some(p))
            | ScalarValue::Utf8View(Some(p)),
        ) => ColumnarValue::Scalar(ScalarValue::Utf8(Some(translate(&p)?))),
        ColumnarValue::Array(a) if is_string(a.data_type()) => {
            let strings = cast(&a, &DataType::Utf8)?;
            let strings = strings
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("cast to Utf8 gives a StringArray");
            let translated = strings
                .iter()
                .map(|p| p.map(translate).transpose())
                .collect::<Result<StringArray>>()?;
            ColumnarValue::Array(Arc::new(translated) as ArrayRef)
        }
        other => other,
    })
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

#[cfg(test)]
mod tests {
    use crate::storage::session::new_session;

    async fn one(sql: &str) -> String {
        let batches = new_session()
            .sql(sql)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        deltalake::arrow::util::display::array_value_to_string(batches[0].column(0), 0).unwrap()
    }

    #[tokio::test]
    async fn datetime_functions_read_spark_patterns() {
        assert_eq!(
            one("SELECT to_timestamp('05/12/2026 14:30', 'dd/MM/yyyy HH:mm')").await,
            "2026-12-05T14:30:00"
        );
        assert_eq!(
            one("SELECT to_date('05/12/2026', 'dd/MM/yyyy')").await,
            "2026-12-05"
        );
        assert_eq!(
            one("SELECT date_format(TIMESTAMP '2026-12-05 14:30:00', 'yyyy-MM')").await,
            "2026-12"
        );
        // A chrono pattern is read as it is.
        assert_eq!(
            one("SELECT to_date('2026/12/05', '%Y/%m/%d')").await,
            "2026-12-05"
        );
        let e = new_session()
            .sql("SELECT to_timestamp('x', 'GGGG')")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("to_timestamp") && e.contains("'GGGG'"), "{e}");
    }
}
