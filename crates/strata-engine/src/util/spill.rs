//! Rows split into parts by a hash of their key columns and kept on local disk as Arrow IPC
//! files until each part is read back whole: how a bulk load folds more events than memory
//! holds, a part of whole keys at a time (`ops/cdc/bulk.rs`).
//!
//! ```text
//!  batches ─▶ part_ids (hash of the key) ─▶ a buffer per part ─▶ IPC files (a few MiB each)
//!  (any order, one Spiller per input)                             in a temp dir (TMPDIR)
//!  read_part(p) ◀── every file of part p, whatever input wrote it
//! ```
//!
//! Every key's rows land in one part, so each part folds on its own. The files go with the
//! [`SpillDir`] (removed when it is dropped, and in any case in no table).

use crate::error::{Context, EngineError, Result};
use deltalake::arrow::array::{RecordBatch, UInt32Array};
use deltalake::arrow::compute::take_record_batch;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::arrow::ipc::reader::FileReader;
use deltalake::arrow::ipc::writer::FileWriter;
use deltalake::datafusion::common::hash_utils::{create_hashes, RandomState};
use std::path::{Path, PathBuf};

/// The most parts a load is split into: past it the memory limit is too small for the load.
pub(crate) const MAX_PARTS: usize = 4096;

/// How many parts `events` events of about `event_bytes` bytes each (in memory, all copies
/// counted) take so that one part fits in `memory` with a quarter to spare for an uneven
/// split; an error naming the limit when that is more than [`MAX_PARTS`].
pub(crate) fn parts_for(events: u64, event_bytes: u64, memory: u64) -> Result<usize> {
    let need = events.saturating_mul(event_bytes).saturating_mul(5) / 4;
    let parts = need.div_ceil(memory.max(1)).max(1);
    match usize::try_from(parts) {
        Ok(p) if p <= MAX_PARTS => Ok(p),
        _ => Err(EngineError::BadInput(format!(
            "the memory limit ({}) is too small to load {events} event(s) a part at a time: \
             it would take {parts} parts, at most {MAX_PARTS} are made; raise it to at least \
             {} with --memory-limit or {}; nothing was committed",
            crate::util::memory::show_size(memory),
            crate::util::memory::show_size(need.div_ceil(MAX_PARTS as u64)),
            crate::util::memory::CONFIG_KEY
        ))),
    }
}

/// The part (of `parts`) of every row of `batch`, by a hash of its columns `keys`: equal keys
/// always go to the same part, whichever batch or process they are in.
pub(crate) fn part_ids(batch: &RecordBatch, keys: &[usize], parts: usize) -> Result<Vec<u32>> {
    if parts <= 1 {
        return Ok(vec![0; batch.num_rows()]);
    }
    let columns: Vec<_> = keys.iter().map(|&k| batch.column(k).clone()).collect();
    let mut hashes = vec![0u64; batch.num_rows()];
    create_hashes(&columns, &RandomState::with_seed(0), &mut hashes)
        .context(|| "hashing keys".into())?;
    // The hash scaled to [0, parts) by its high bits.
    Ok(hashes
        .into_iter()
        .map(|h| ((h as u128 * parts as u128) >> 64) as u32)
        .collect())
}

/// The temp dir a load's parts are written to; removed when dropped.
pub(crate) struct SpillDir {
    dir: tempfile::TempDir,
}

/// The name every spill dir starts with; the creating process's id follows.
const DIR_PREFIX: &str = "strata-bulk-";

impl SpillDir {
    /// A new dir in the temp dir (`TMPDIR`), after removing those that processes which no
    /// longer run left behind (a load killed with `kill -9` drops nothing).
    pub(crate) fn new() -> Result<SpillDir> {
        remove_orphans(&std::env::temp_dir());
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()
            .context(|| {
                format!(
                    "creating a temp dir in {} for a bulk load",
                    std::env::temp_dir().display()
                )
            })?;
        Ok(SpillDir { dir })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Removes the spill dirs in `temp` whose process is gone. Only where `/proc` tells which
/// processes run (Linux); elsewhere a killed load's dir stays until the temp dir is cleaned.
fn remove_orphans(temp: &Path) {
    let proc = Path::new("/proc/self");
    if !proc.exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// What was written to a [`SpillDir`]: the files, rows and bytes of each part.
#[derive(Debug, Default)]
pub(crate) struct Spilled {
    pub(crate) files: Vec<Vec<PathBuf>>,
    pub(crate) rows: Vec<usize>,
    pub(crate) bytes: u64,
}

impl Spilled {
    /// Both writers' files, part by part.
    pub(crate) fn merge(mut self, other: Spilled) -> Spilled {
        let parts = self.files.len().max(other.files.len());
        self.files.resize(parts, Vec::new());
        self.rows.resize(parts, 0);
        for (p, (files, rows)) in other.files.into_iter().zip(other.rows).enumerate() {
            self.files[p].extend(files);
            self.rows[p] += rows;
        }
        self.bytes += other.bytes;
        self
    }
}

/// Splits the batches of one input into parts and writes them to a [`SpillDir`], each part's
/// rows buffered up to `flush_bytes` and then written as one file.
pub(crate) struct Spiller {
    dir: PathBuf,
    input: usize,
    keys: Vec<usize>,
    schema: SchemaRef,
    flush_bytes: usize,
    buffers: Vec<(Vec<RecordBatch>, usize)>,
    written: Spilled,
    next_file: usize,
}

impl Spiller {
    /// A writer for input number `input` (file names stay apart) into `parts` parts.
    pub(crate) fn new(
        dir: &SpillDir,
        input: usize,
        parts: usize,
        keys: Vec<usize>,
        schema: SchemaRef,
        flush_bytes: usize,
    ) -> Spiller {
        Spiller {
            dir: dir.path().to_path_buf(),
            input,
            keys,
            schema,
            flush_bytes: flush_bytes.max(1),
            buffers: vec![(Vec::new(), 0); parts],
            written: Spilled {
                files: vec![Vec::new(); parts],
                rows: vec![0; parts],
                bytes: 0,
            },
            next_file: 0,
        }
    }

    /// Adds `batch`'s rows to their parts, writing the parts whose buffer is full.
    pub(crate) fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let parts = self.buffers.len();
        let ids = part_ids(batch, &self.keys, parts)?;
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); parts];
        for (i, p) in ids.into_iter().enumerate() {
            rows[p as usize].push(i as u32);
        }
        for (p, idx) in rows.into_iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            let part = match idx.len() == batch.num_rows() {
                true => batch.clone(),
                false => take_record_batch(batch, &UInt32Array::from(idx))
                    .context(|| "splitting rows into parts".into())?,
            };
            let bytes = crate::util::arrow::slice_bytes(&part);
            let buffer = &mut self.buffers[p];
            buffer.0.push(part);
            buffer.1 += bytes;
            if buffer.1 >= self.flush_bytes {
                self.flush(p)?;
            }
        }
        Ok(())
    }

    /// Writes every buffer out; what was written.
    pub(crate) fn finish(mut self) -> Result<Spilled> {
        for p in 0..self.buffers.len() {
            self.flush(p)?;
        }
        Ok(self.written)
    }

    fn flush(&mut self, p: usize) -> Result<()> {
        let (batches, _) = std::mem::take(&mut self.buffers[p]);
        if batches.is_empty() {
            return Ok(());
        }
        let path = self
            .dir
            .join(format!("{}-{p}-{}.arrow", self.input, self.next_file));
        self.next_file += 1;
        write_file(&path, &self.schema, &batches)?;
        self.written.bytes += std::fs::metadata(&path).map_or(0, |m| m.len());
        self.written.rows[p] += batches.iter().map(RecordBatch::num_rows).sum::<usize>();
        self.written.files[p].push(path);
        Ok(())
    }
}

/// `batches` as one IPC file, each as it is (reading a part concatenates them anyway).
fn write_file(path: &Path, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<()> {
    let what = || format!("writing {}", path.display());
    let file = std::fs::File::create(path).context(what)?;
    let mut writer = FileWriter::try_new(std::io::BufWriter::with_capacity(1 << 20, file), schema)
        .context(what)?;
    for batch in batches {
        writer.write(batch).context(what)?;
    }
    writer.finish().context(what)?;
    Ok(())
}

/// Every row of one part: the batches of `files`.
pub(crate) fn read_part(files: &[PathBuf]) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    for path in files {
        let file = std::fs::File::open(path).context(|| format!("reading {}", path.display()))?;
        let reader = FileReader::try_new(std::io::BufReader::new(file), None)
            .context(|| format!("reading {}", path.display()))?;
        for batch in reader {
            out.push(batch.context(|| format!("reading {}", path.display()))?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Array, Int64Array, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn batch(ids: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ]));
        let v: Vec<String> = ids.iter().map(|i| format!("v{i}")).collect();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(v)),
            ],
        )
        .expect("batch")
    }

    fn ids(batches: &[RecordBatch]) -> Vec<i64> {
        let mut out = Vec::new();
        for b in batches {
            let a = b
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("ints");
            out.extend((0..a.len()).map(|i| a.value(i)));
        }
        out
    }

    #[test]
    fn parts_fit_the_limit_with_room_to_spare() {
        // 40M events of 200 bytes in 3 GiB: 10 GB and a quarter, in 3 GiB parts.
        assert_eq!(parts_for(40_000_000, 200, 3 << 30).expect("parts"), 4);
        assert_eq!(parts_for(1, 200, 3 << 30).expect("parts"), 1);
        assert_eq!(parts_for(0, 200, 3 << 30).expect("parts"), 1);
        let e = parts_for(1 << 40, 200, 1 << 20)
            .expect_err("too many")
            .to_string();
        assert!(
            e.contains("memory limit (1 MiB) is too small") && e.contains("--memory-limit"),
            "{e}"
        );
    }

    /// Every row goes to one part, a key always to the same one, and the parts are used
    /// about evenly.
    #[test]
    fn equal_keys_go_to_one_part() {
        let keys: Vec<i64> = (0..10_000).map(|i| i % 2_500).collect();
        let b = batch(&keys);
        let ids = part_ids(&b, &[0], 4).expect("ids");
        let mut part_of = BTreeMap::new();
        let mut sizes = [0usize; 4];
        for (k, p) in keys.iter().zip(&ids) {
            assert_eq!(*part_of.entry(*k).or_insert(*p), *p, "key {k}");
            sizes[*p as usize] += 1;
        }
        for s in sizes {
            assert!((1_500..3_500).contains(&s), "{sizes:?}");
        }
        // In another batch, the same keys go to the same parts.
        let again = part_ids(&batch(&[7, 2_499]), &[0], 4).expect("ids");
        assert_eq!(again, [part_of[&7], part_of[&2_499]]);
    }

    /// Written in small files by two inputs, each part reads back exactly its rows.
    #[test]
    fn every_row_comes_back_in_its_part() {
        let dir = SpillDir::new().expect("dir");
        let schema = batch(&[]).schema();
        let mut all = Spilled::default();
        for input in 0..2 {
            let mut s = Spiller::new(&dir, input, 3, vec![0], schema.clone(), 64);
            for chunk in 0..5 {
                let base = (input * 5 + chunk) * 100;
                let rows: Vec<i64> = (base..base + 100).map(|i| i as i64 % 300).collect();
                s.push(&batch(&rows)).expect("push");
            }
            all = all.merge(s.finish().expect("finish"));
        }
        assert_eq!(all.rows.iter().sum::<usize>(), 1_000);
        let mut seen = Vec::new();
        for p in 0..3 {
            let back = ids(&read_part(&all.files[p]).expect("read"));
            assert_eq!(back.len(), all.rows[p]);
            let again = part_ids(&batch(&back), &[0], 3).expect("ids");
            assert!(again.iter().all(|&q| q as usize == p), "part {p}");
            seen.extend(back);
        }
        seen.sort();
        let mut expected: Vec<i64> = (0..1_000).map(|i| i % 300).collect();
        expected.sort();
        assert_eq!(seen, expected);
        assert!(all.bytes > 0);
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists(), "the files go with the dir");
    }

    /// A dir left by a process that no longer runs is removed when the next load starts; one
    /// of a running process (this one) is not.
    #[test]
    fn a_killed_loads_dir_is_removed_by_the_next() {
        let temp = tempfile::tempdir().expect("temp");
        // Above any pid Linux hands out (pid_max is at most 2^22).
        let dead = temp.path().join(format!("{DIR_PREFIX}4294967295-abc"));
        let alive = temp
            .path()
            .join(format!("{DIR_PREFIX}{}-abc", std::process::id()));
        let other = temp.path().join("strata-bulk-notapid");
        for d in [&dead, &alive, &other] {
            std::fs::create_dir_all(d.join("sub")).expect("dir");
        }
        remove_orphans(temp.path());
        if Path::new("/proc/self").exists() {
            assert!(!dead.exists());
        }
        assert!(alive.exists() && other.exists());
    }
}
