//! The hand-off of checked events from an ingestion to the flows that read its table, in
//! the same run: an ingestion evaluates and checks its rows for every AUTO CDC flow that
//! reads the table before it commits them (a bad file is rejected by name); a flow whose
//! unread input is exactly that append takes those events from memory instead of reading
//! back and evaluating the files just written.

use deltalake::arrow::array::RecordBatch;
use std::collections::HashMap;
use std::sync::Mutex;
use strata_sql::TableName;

/// The events kept for the flows of one run, by the table they were appended to. Dropped
/// with the run: a reader that does not come in this run reads the files next time.
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    kept: Mutex<HashMap<TableName, Appended>>,
}

/// One append to a streaming table, as committed.
#[derive(Debug)]
struct Appended {
    /// The table's version before the append, `None` if it held no data files then.
    before: Option<i64>,
    /// The version the append committed.
    after: i64,
    /// Per reading flow (by name), the events it derives from the rows appended.
    events: HashMap<String, Vec<RecordBatch>>,
}

impl Handoff {
    /// Keeps, per flow that reads `table`, the events it derives from the rows just
    /// appended (committed as version `after`; `before`: the version before, `None` if the
    /// table had no data files). A newer append replaces what was kept.
    pub(crate) fn keep(
        &self,
        table: &TableName,
        before: Option<i64>,
        after: i64,
        events: HashMap<String, Vec<RecordBatch>>,
    ) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.insert(
                table.clone(),
                Appended {
                    before,
                    after,
                    events,
                },
            );
        }
    }

    /// The events kept for `flow` reading `table`, if they come from exactly its rows added
    /// after version `from` (`None`: from the start) up to `now`. They are handed over once;
    /// a later read goes to the files.
    pub(crate) fn take(
        &self,
        table: &TableName,
        flow: &str,
        from: Option<i64>,
        now: i64,
    ) -> Option<Vec<RecordBatch>> {
        let mut kept = self.kept.lock().ok()?;
        let a = kept.get_mut(table)?;
        if a.after != now || a.before != from {
            return None;
        }
        a.events.remove(flow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::Int64Array;
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    /// Events kept after an append are handed over only to their flow, when its unread
    /// input is exactly that append, only once.
    #[test]
    fn appended_events_go_to_their_flow_reading_exactly_that_append() {
        let handoff = Handoff::default();
        let t = TableName::new(None, "t");
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let rows = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))])
            .expect("batch");
        let events = || {
            HashMap::from([
                ("f".to_string(), vec![rows.clone()]),
                ("g".to_string(), vec![rows.slice(0, 1)]),
            ])
        };
        handoff.keep(&t, Some(3), 4, events());
        // A reader that last read version 2 (or the start), or a table now at version 5,
        // would miss rows: it reads the files.
        assert!(handoff.take(&t, "f", Some(2), 4).is_none());
        assert!(handoff.take(&t, "f", None, 4).is_none());
        assert!(handoff.take(&t, "f", Some(3), 5).is_none());
        assert!(handoff
            .take(&TableName::new(None, "u"), "f", Some(3), 4)
            .is_none());
        assert!(handoff.take(&t, "h", Some(3), 4).is_none(), "not its flow");
        let taken = handoff.take(&t, "f", Some(3), 4).expect("handed over");
        assert_eq!(taken[0].num_rows(), 2);
        assert!(handoff.take(&t, "f", Some(3), 4).is_none(), "taken once");
        let other = handoff.take(&t, "g", Some(3), 4).expect("its own");
        assert_eq!(other[0].num_rows(), 1);
        // A table that had no data files before the append: a reader from the start.
        handoff.keep(&t, None, 1, events());
        assert!(handoff.take(&t, "f", Some(0), 1).is_none());
        assert!(handoff.take(&t, "f", None, 1).is_some());
    }
}
