//! Helpers every layer uses, with no knowledge of tables or pipelines: Arrow arrays and
//! schemas ([`arrow`]), Spark's file globs ([`glob`]), sorted batches cut between keys ([`chunks`]), sets of integer keys ([`keyset`]), the run's memory limit ([`memory`]), SQL text ([`sql`]), work on every core ([`threads`]), the parallel
//! sort of integer keys ([`sort`]), rows split into parts by key on local disk ([`spill`]) and
//! timed phase logs ([`steps`]).

pub(crate) mod arrow;
pub(crate) mod chunks;
pub(crate) mod gather;
pub(crate) mod glob;
pub(crate) mod keyset;
pub mod memory;
pub(crate) mod sort;
pub(crate) mod spill;
pub(crate) mod sql;
pub(crate) mod steps;
pub(crate) mod threads;
