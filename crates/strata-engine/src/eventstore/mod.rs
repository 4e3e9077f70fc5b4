//! The event store of an AUTO CDC target (`<warehouse>/_strata/<schema>/<target>/events`):
//! how source rows become events ([`evaluate`]), reading the stored events of the keys a
//! batch touches by page ([`pages`]) or through DataFusion ([`read`]), the state digest
//! snapshot flows diff against ([`digest`]), tombstone expiry ([`tombstones`]), compaction
//! ([`compact`]), and the hand-off of checked events from an ingestion to its flows within a
//! run ([`handoff`]).

pub(crate) mod compact;
pub(crate) mod digest;
pub(crate) mod evaluate;
pub(crate) mod handoff;
pub(crate) mod pages;
pub(crate) mod read;
pub(crate) mod tombstones;
