//! PostgreSQL: type mapping, reads, and log-based CDC.

pub mod cdc;
pub(crate) mod copy;
pub(crate) mod pgoutput;
pub(crate) mod ranges;
pub(crate) mod read;
pub(crate) mod scan;
pub mod sink;
pub(crate) mod types;
