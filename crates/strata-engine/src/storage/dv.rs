//! Deletion vectors: inline in the Delta log while small, in files beside the data once not.
//!
//! A target whose property `delta.enableDeletionVectors` is `true` has the rows a run
//! replaces marked as deleted in its data files instead of the files being rewritten
//! (`storage/replace.rs`). The marks are a deletion vector per file: the positions of its deleted
//! rows, in the protocol's `RoaringBitmapArray` format (a magic number, then a 64-bit roaring
//! treemap in the portable layout). A file's vector grows with each run that deletes more of
//! its rows, and `cardinality` counts them, until more than a quarter of the file is
//! deleted: `storage/replace.rs` then writes the rest to a new file.
//!
//! A vector of at most [`INLINE_MAX_BYTES`] is Z85-encoded into the `add` action
//! (`storageType = 'i'`): a run stays one commit and no extra file. A larger one goes to a
//! deletion-vector file of the run (`deletion_vector_<uuid>.bin` in the table's folder,
//! `storageType = 'u'`), as Spark and Databricks write them: inline, the vectors of a 1%
//! batch into a 10M-row table made each commit 2.6 MB (the `remove` carries the old vector,
//! the `add` the new one), and every reader replays the commits since the last checkpoint.

use crate::error::{EngineError, Result};
use deltalake::kernel::{DeletionVectorDescriptor, StorageType};
use roaring::RoaringTreemap;

/// Delta's table property that turns deletion vectors on (`'true'`).
pub(crate) const PROPERTY: &str = "delta.enableDeletionVectors";

/// The first four bytes of a serialized `RoaringBitmapArray` (little endian).
const MAGIC: u32 = 1681511377;

/// Z85 (ZeroMQ's base 85), the alphabet of inline deletion vectors.
const Z85: &[u8; 85] =
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/// The largest vector (serialized) kept inline in the log; `STRATA_DV_INLINE_MAX_BYTES`
/// changes it (the tests set 0 to send every vector to a file).
pub(crate) const INLINE_MAX_BYTES: usize = 1024;

fn inline_max_bytes() -> usize {
    std::env::var("STRATA_DV_INLINE_MAX_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(INLINE_MAX_BYTES)
}

/// `deleted` as a `RoaringBitmapArray`: the magic number, then the portable treemap.
fn serialize(deleted: &RoaringTreemap) -> Result<Vec<u8>> {
    let mut bytes = MAGIC.to_le_bytes().to_vec();
    deleted
        .serialize_into(&mut bytes)
        .map_err(|e| EngineError::internal(format!("serializing a deletion vector: {e}")))?;
    Ok(bytes)
}

fn size_of(bytes: &[u8]) -> Result<i32> {
    i32::try_from(bytes.len()).map_err(|_| EngineError::internal("a deletion vector over 2 GiB"))
}

/// The inline descriptor of a vector of `cardinality` rows serialized as `bytes`.
fn inline_of(bytes: &[u8], cardinality: u64) -> Result<DeletionVectorDescriptor> {
    Ok(DeletionVectorDescriptor {
        storage_type: StorageType::Inline,
        path_or_inline_dv: z85_encode(bytes),
        offset: None,
        size_in_bytes: size_of(bytes)?,
        cardinality: cardinality as i64,
    })
}

/// The inline descriptor of a file whose rows at `deleted` are deleted.
#[cfg(test)]
fn inline(deleted: &RoaringTreemap) -> Result<DeletionVectorDescriptor> {
    inline_of(&serialize(deleted)?, deleted.len())
}

/// The rows of a serialized `RoaringBitmapArray` (`bad` names the vector in errors).
fn deserialize(bytes: &[u8], bad: impl Fn(&str) -> EngineError) -> Result<RoaringTreemap> {
    let (magic, rest) = bytes.split_at_checked(4).ok_or_else(|| bad("is empty"))?;
    if magic != MAGIC.to_le_bytes() {
        return Err(bad("has no RoaringBitmapArray magic number"));
    }
    RoaringTreemap::deserialize_from(rest).map_err(|e| bad(&format!("is bad: {e}")))
}

/// A deletion-vector file about to be written: its path in the table's folder and bytes.
pub(crate) struct VectorFile {
    pub(crate) path: String,
    pub(crate) bytes: Vec<u8>,
}

/// The descriptors of `vectors` (one per data file), in order: inline where small, the
/// others in one new deletion-vector file (returned, for the caller to write before it
/// commits): a version byte, then per vector its size (big endian), the vector and its
/// CRC-32 (big endian), the descriptor's offset at the size.
pub(crate) fn descriptors(
    vectors: &[RoaringTreemap],
) -> Result<(Vec<DeletionVectorDescriptor>, Option<VectorFile>)> {
    let max = inline_max_bytes();
    let id = uuid::Uuid::new_v4();
    let mut file: Vec<u8> = Vec::new();
    let mut out = Vec::with_capacity(vectors.len());
    for deleted in vectors {
        let bytes = serialize(deleted)?;
        if bytes.len() <= max {
            out.push(inline_of(&bytes, deleted.len())?);
            continue;
        }
        if file.is_empty() {
            file.push(1);
        }
        let offset = i32::try_from(file.len())
            .map_err(|_| EngineError::internal("a deletion-vector file over 2 GiB"))?;
        let size = size_of(&bytes)?;
        file.extend_from_slice(&(size as u32).to_be_bytes());
        file.extend_from_slice(&bytes);
        file.extend_from_slice(&crc32fast::hash(&bytes).to_be_bytes());
        out.push(DeletionVectorDescriptor {
            storage_type: StorageType::UuidRelativePath,
            path_or_inline_dv: z85_encode(id.as_bytes()),
            offset: Some(offset),
            size_in_bytes: size,
            cardinality: deleted.len() as i64,
        });
    }
    let file = (!file.is_empty()).then(|| VectorFile {
        path: format!("deletion_vector_{id}.bin"),
        bytes: file,
    });
    Ok((out, file))
}

/// Where the vector of a file-stored descriptor (`storageType = 'u'`) is: its file's path
/// in the table's folder (a prefix folder, then `deletion_vector_<uuid>.bin`) and the byte
/// range of its size, vector and checksum. `None` for other descriptors.
pub(crate) fn file_of(dv: &DeletionVectorDescriptor) -> Option<(String, std::ops::Range<u64>)> {
    if dv.storage_type != StorageType::UuidRelativePath {
        return None;
    }
    let s = dv.path_or_inline_dv.as_str();
    let (prefix, encoded) = s.split_at_checked(s.len().checked_sub(20)?)?;
    let id = uuid::Uuid::from_slice(&z85_decode(encoded)?).ok()?;
    let path = match prefix {
        "" => format!("deletion_vector_{id}.bin"),
        p => format!("{p}/deletion_vector_{id}.bin"),
    };
    let start = u64::try_from(dv.offset.unwrap_or(1)).ok()?;
    let end = start + 4 + u64::try_from(dv.size_in_bytes).ok()? + 4;
    Some((path, start..end))
}

/// The deleted row positions of a file-stored descriptor, from `bytes`, the range
/// [`file_of`] gives of its file (`path`, for errors).
pub(crate) fn read_stored(
    dv: &DeletionVectorDescriptor,
    path: &str,
    bytes: &[u8],
) -> Result<RoaringTreemap> {
    let bad = |why: &str| EngineError::internal(format!("deletion vector in {path}: {why}"));
    let size = dv.size_in_bytes as usize;
    let (head, rest) = bytes
        .split_at_checked(4)
        .ok_or_else(|| bad("the file is cut short"))?;
    if u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize != size {
        return Err(bad("its size differs from the log's"));
    }
    let (vector, crc) = rest
        .split_at_checked(size)
        .ok_or_else(|| bad("the file is cut short"))?;
    let crc = crc.get(..4).ok_or_else(|| bad("the checksum is missing"))?;
    if crc32fast::hash(vector).to_be_bytes() != crc {
        return Err(bad("its checksum does not match"));
    }
    deserialize(vector, bad)
}

/// The deleted row positions of an inline descriptor; `None` for one stored in a file
/// (written by another engine).
pub(crate) fn read_inline(dv: &DeletionVectorDescriptor) -> Result<Option<RoaringTreemap>> {
    if dv.storage_type != StorageType::Inline {
        return Ok(None);
    }
    let bad = |why: &str| EngineError::internal(format!("an inline deletion vector {why}"));
    let bytes = z85_decode(&dv.path_or_inline_dv).ok_or_else(|| bad("is not Z85"))?;
    let bytes = bytes
        .get(..dv.size_in_bytes as usize)
        .ok_or_else(|| bad("is shorter than its size"))?;
    deserialize(bytes, bad).map(Some)
}

/// Z85 of `bytes`, zero-padded to a multiple of four bytes (the descriptor's size says how
/// many are real).
fn z85_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(4) * 5);
    for chunk in bytes.chunks(4) {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        let mut v = u32::from_be_bytes(word);
        let mut digits = [0u8; 5];
        for d in digits.iter_mut().rev() {
            *d = Z85[(v % 85) as usize];
            v /= 85;
        }
        out.extend(digits.iter().map(|&b| b as char));
    }
    out
}

fn z85_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(5) {
        return None;
    }
    let mut value = [0u8; 256];
    for (i, &c) in Z85.iter().enumerate() {
        value[c as usize] = i as u8 + 1;
    }
    let mut out = Vec::with_capacity(text.len() / 5 * 4);
    for chunk in text.chunks(5) {
        let mut v: u64 = 0;
        for &c in chunk {
            let d = value[c as usize].checked_sub(1)?;
            v = v * 85 + u64::from(d);
        }
        out.extend_from_slice(&u32::try_from(v).ok()?.to_be_bytes());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ZeroMQ's reference vector, and a round trip of a vector with an unaligned size.
    #[test]
    fn z85_and_inline_vectors_round_trip() {
        let hello = [0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B];
        assert_eq!(z85_encode(&hello), "HelloWorld");
        assert_eq!(z85_decode("HelloWorld").as_deref(), Some(&hello[..]));
        let deleted: RoaringTreemap = [1u64, 3, 7, 70_000, 5_000_000_000].into_iter().collect();
        let dv = inline(&deleted).expect("encode");
        assert_eq!(dv.cardinality, 5);
        assert!(dv.path_or_inline_dv.len().is_multiple_of(5));
        assert_eq!(read_inline(&dv).expect("decode"), Some(deleted));
    }

    /// Small vectors stay inline; large ones share one file, each read back from its range.
    #[test]
    fn large_vectors_go_to_one_file_and_read_back() {
        let small: RoaringTreemap = [5u64].into_iter().collect();
        let large: RoaringTreemap = (0..400_000u64).step_by(3).collect();
        let other: RoaringTreemap = (7..300_000u64).step_by(5).collect();
        let vectors = [large.clone(), small.clone(), other.clone()];
        let (dvs, file) = descriptors(&vectors).expect("descriptors");
        let file = file.expect("a file");
        assert_eq!(file.bytes[0], 1, "version byte");
        assert_eq!(dvs[1].storage_type, StorageType::Inline);
        assert_eq!(read_inline(&dvs[1]).expect("inline"), Some(small));
        for (dv, want) in [(&dvs[0], &large), (&dvs[2], &other)] {
            let (path, range) = file_of(dv).expect("stored in a file");
            assert_eq!(path, file.path);
            assert_eq!(dv.cardinality as u64, want.len());
            let bytes = &file.bytes[range.start as usize..range.end as usize];
            assert_eq!(&read_stored(dv, &path, bytes).expect("read"), want);
            let mut broken = bytes.to_vec();
            broken[20] ^= 1;
            assert!(
                read_stored(dv, &path, &broken).is_err(),
                "a bad checksum is refused"
            );
        }
        assert_eq!(dvs[0].offset, Some(1));
    }

    /// The vector a Python writer (pyroaring) produced for rows 1, 3 and 7, which Polars,
    /// DuckDB and delta-rs read as those rows deleted.
    #[test]
    fn reads_a_vector_other_writers_produce() {
        let dv = DeletionVectorDescriptor {
            storage_type: StorageType::Inline,
            path_or_inline_dv: "^Bg9^0rr910000000000iXQKl0rr91000625c8Xg0rri42lj-7".into(),
            offset: None,
            size_in_bytes: 38,
            cardinality: 3,
        };
        let map = read_inline(&dv).expect("decode").expect("inline");
        assert_eq!(map.iter().collect::<Vec<_>>(), vec![1, 3, 7]);
    }
}
