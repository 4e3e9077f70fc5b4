//! Database sources: a pipeline's `CREATE CONNECTION`s turned into what `strata-sources`
//! connects with, and the watermark a streaming table keeps in its own commits.
//!
//! This layer sits beside `storage/`: it reads databases (through `strata-sources`) and
//! reads back the positions `storage` committed; it never writes a table itself.

pub(crate) mod connection;
pub(crate) mod overlap;
pub(crate) mod read;
pub(crate) mod resume;
pub(crate) mod toast;
pub(crate) mod watermark;
