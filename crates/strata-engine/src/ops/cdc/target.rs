//! Writing a flow's target.

use crate::error::{Context, Result};

/// The application id under which a target records the event-store version it reflects.
pub(crate) const EVENTS_APP_ID: &str = "strata-events";

use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::DataType;
use deltalake::arrow::datatypes::Field;
use deltalake::arrow::datatypes::Schema;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use std::sync::Arc;

/// A target commit records the event-store version it reflects and the flow's source position.
pub(crate) fn target_commit(
    store_version: i64,
    app_id: &str,
    source_version: i64,
) -> CommitProperties {
    CommitProperties::default()
        .with_application_transaction(Transaction::new(EVENTS_APP_ID, store_version))
        .with_application_transaction(Transaction::new(app_id, source_version))
}

/// The MERGE source: new rows tagged `ins`, one row per changed key tagged `del`.
pub(crate) fn merge_source(
    ctx: &SessionContext,
    inserts: &RecordBatch,
    deletes: &RecordBatch,
) -> Result<deltalake::datafusion::prelude::DataFrame> {
    let tag = |b: &RecordBatch, t: &str| -> Result<RecordBatch> {
        let mut fields: Vec<Field> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new("__strata_action", DataType::Utf8, false));
        let mut cols = b.columns().to_vec();
        cols.push(Arc::new(deltalake::arrow::array::StringArray::from(vec![
            t;
            b.num_rows()
        ])));
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).context(|| "merge source".into())
    };
    let (i, d) = (tag(inserts, "ins")?, tag(deletes, "del")?);
    let both = concat_batches(&i.schema(), &[i.clone(), d]).context(|| "merge source".into())?;
    ctx.read_batch(both).context(|| "merge source".into())
}
