//! What the data means, as pure functions over Arrow batches (no I/O): the fold of a key's
//! events into its rows ([`fold`], on `strata-core`), a flow's shape ([`flow`]), its
//! events ([`events`]), the timeline conventions ([`timeline`]), the comparison of a key's
//! rows before and after a run ([`compare`]), snapshot diffs and pins ([`snapshot`]), declared schemas ([`declared`]), the
//! SCD2 integrity check ([`integrity`]) and point-in-time tables
//! ([`pit`]: which as-of values a refresh computes, and their SQL).

pub(crate) mod compare;
pub(crate) mod declared;
pub(crate) mod events;
pub(crate) mod flow;
pub(crate) mod fold;
pub(crate) mod integrity;
pub(crate) mod pit;
pub(crate) mod snapshot;
pub(crate) mod timeline;
