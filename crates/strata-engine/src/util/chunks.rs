//! Batches in key order cut into chunks that end between keys ([`KeyChunks`]), so that
//! every event of a key is in one chunk: how a sorted stream of events (an event store's
//! compaction, a bulk load's sort) is folded or written a chunk at a time.

use crate::error::{Context, Result};
use crate::util::arrow;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::compute::concat_batches;
use deltalake::arrow::datatypes::SchemaRef;

/// Batches in key order cut into chunks that end between keys, so that every event of a
/// key is in one chunk.
pub(crate) struct KeyChunks {
    schema: SchemaRef,
    keys: Vec<usize>,
    rows: usize,
    pending: Vec<RecordBatch>,
    pending_rows: usize,
}

impl KeyChunks {
    pub(crate) fn new(schema: SchemaRef, keys: Vec<usize>, rows: usize) -> Self {
        KeyChunks {
            schema,
            keys,
            rows,
            pending: Vec::new(),
            pending_rows: 0,
        }
    }

    /// Takes `batch`; returns the chunks now complete.
    pub(crate) fn push(&mut self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        self.pending_rows += batch.num_rows();
        self.pending.push(batch);
        if self.pending_rows < self.rows {
            return Ok(Vec::new());
        }
        let all = self.take_pending()?;
        let cut = last_key_start(&all, &self.keys)?;
        if cut == 0 {
            // One key so far: wait for the next one.
            self.pending_rows = all.num_rows();
            self.pending.push(all);
            return Ok(Vec::new());
        }
        let rest = all.slice(cut, all.num_rows() - cut);
        self.pending_rows = rest.num_rows();
        self.pending.push(rest);
        Ok(vec![all.slice(0, cut)])
    }

    /// The last chunk, when events remain.
    pub(crate) fn finish(&mut self) -> Result<Vec<RecordBatch>> {
        let all = self.take_pending()?;
        self.pending_rows = 0;
        Ok(match all.num_rows() {
            0 => Vec::new(),
            _ => vec![all],
        })
    }

    fn take_pending(&mut self) -> Result<RecordBatch> {
        let batches = std::mem::take(&mut self.pending);
        concat_batches(&self.schema, &batches).context(|| "gathering events".into())
    }
}

/// The first row of the last key of `batch` (sorted by `keys`).
fn last_key_start(batch: &RecordBatch, keys: &[usize]) -> Result<usize> {
    let n = batch.num_rows();
    if n == 0 {
        return Ok(0);
    }
    let columns: Vec<_> = keys.iter().map(|&k| batch.column(k).clone()).collect();
    let rows = arrow::rows(&columns)?;
    let last = rows.row(n - 1);
    let mut i = n - 1;
    while i > 0 && rows.row(i - 1) == last {
        i -= 1;
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Array, Int64Array};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn batch(keys: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(keys.to_vec()))])
            .expect("batch")
    }

    fn keys_of(chunks: &[RecordBatch]) -> Vec<Vec<i64>> {
        chunks
            .iter()
            .map(|c| {
                let a = c
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .expect("ints");
                (0..a.len()).map(|i| a.value(i)).collect()
            })
            .collect()
    }

    #[test]
    fn chunks_end_between_keys() {
        let b = batch(&[1]);
        let mut c = KeyChunks::new(b.schema(), vec![0], 4);
        assert!(c.push(batch(&[1, 1, 2])).expect("push").is_empty());
        // Four rows: cut before the last key (2), which may go on in the next batch.
        assert_eq!(
            keys_of(&c.push(batch(&[2, 2])).expect("push")),
            [vec![1, 1]]
        );
        assert!(c.push(batch(&[2])).expect("push").is_empty());
        assert_eq!(
            keys_of(&c.push(batch(&[3, 4])).expect("push")),
            [vec![2, 2, 2, 2, 3]]
        );
        assert_eq!(keys_of(&c.finish().expect("finish")), [vec![4]]);
        assert!(c.finish().expect("again").is_empty());
    }

    #[test]
    fn one_long_key_waits_for_the_next() {
        let b = batch(&[1]);
        let mut c = KeyChunks::new(b.schema(), vec![0], 2);
        assert!(c.push(batch(&[7, 7, 7])).expect("push").is_empty());
        assert!(c.push(batch(&[7])).expect("push").is_empty());
        assert_eq!(
            keys_of(&c.push(batch(&[8])).expect("push")),
            [vec![7, 7, 7, 7]]
        );
        assert_eq!(keys_of(&c.finish().expect("finish")), [vec![8]]);
    }

    #[test]
    fn null_keys_are_one_key() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(vec![Some(1), None, None]))],
        )
        .expect("batch");
        assert_eq!(last_key_start(&b, &[0]).expect("cut"), 1);
    }
}
