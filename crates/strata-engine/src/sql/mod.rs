//! SQL over a warehouse: sessions with every table ([`session`]), `as_of` ([`as_of`]),
//! `table_changes` ([`table_changes`]), the pipeline's views ([`views`]), expectations
//! ([`expect`]), and `strata query` / `strata validate` ([`query`]).

pub(crate) mod as_of;
pub(crate) mod expect;
pub(crate) mod query;
pub(crate) mod session;
pub(crate) mod shapes;
pub(crate) mod table_changes;
pub(crate) mod views;
