//! Pipeline texts into plans, before anything runs: one SQL file ([`file`]), several texts
//! planned as one with errors naming each ([`sources`]), and YAML pipeline specs ([`spec`]);
//! a run's retries and notifications ([`settings`]).

pub(crate) mod file;
pub(crate) mod graph;
pub(crate) mod settings;
pub(crate) mod sources;
pub(crate) mod spec;
