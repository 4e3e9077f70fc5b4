//! SQL over a warehouse: sessions with every table ([`session`]), `as_of` ([`as_of`]),
//! `table_changes` ([`table_changes`]), `VERSION AS OF` / `TIMESTAMP AS OF`
//! ([`time_travel`]), `DESCRIBE`, `SHOW TABLES` ([`describe`]), three-part names and `USE`
//! ([`catalog`]), the pipeline's views ([`views`]), expectations ([`expect`]), and `strata
//! query` / `strata validate` ([`query`]; point-in-time tables in [`pit_check`]).

pub(crate) mod as_of;
pub(crate) mod catalog;
pub(crate) mod describe;
pub(crate) mod expect;
pub(crate) mod pit_check;
pub(crate) mod query;
pub(crate) mod session;
pub(crate) mod shapes;
pub(crate) mod table_changes;
pub(crate) mod time_travel;
pub(crate) mod views;
