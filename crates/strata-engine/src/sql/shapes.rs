//! The columns of the tables a query reads, for planning it before they have rows.

use deltalake::arrow::datatypes::SchemaRef;
use strata_sql::TableName;

/// The columns of the tables a query reads, by table: enough to plan the query before the
/// tables have rows (or exist), as a pipeline is checked before it runs.
pub(crate) type Shapes = std::collections::BTreeMap<TableName, SchemaRef>;
