//! Tables on storage: where they live ([`warehouse`]; a local folder or an object store
//! prefix, [`location`]), opening and creating one and what it
//! records ([`table`]), writing ([`write`], with the columns a file writes without a dictionary: [`encoding`]), a commit as a value
//! with its positions ([`commit`]), DataFusion sessions over them
//! ([`session`], with Spark's datetime patterns: [`spark_functions`]), the change data feed ([`feed`]), replacing keys' rows in place
//! ([`replace`], with deletion vectors in [`dv`], reading and writing data files where the
//! table lives: [`data_file`]), the record of input files taken
//! ([`ledger`]), Parquet files taken into a table as they are ([`adopt`]) and what a table's
//! commits changed, told apart from upkeep such as OPTIMIZE ([`changes`]), and tables whose
//! rows a Python function produced, replaced whole before a run ([`staged`]).

pub(crate) mod adopt;
pub(crate) mod changes;
pub(crate) mod commit;
pub(crate) mod data_file;
pub(crate) mod dv;
pub(crate) mod encoding;
pub(crate) mod feed;
pub(crate) mod ledger;
pub(crate) mod location;
pub(crate) mod replace;
pub(crate) mod session;
pub(crate) mod spark_functions;
pub(crate) mod staged;
pub(crate) mod table;
pub(crate) mod warehouse;
pub(crate) mod write;
