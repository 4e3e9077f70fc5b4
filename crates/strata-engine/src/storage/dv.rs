//! Deletion vectors, stored inline in the Delta log.
//!
//! A target whose property `delta.enableDeletionVectors` is `true` has the rows a run
//! replaces marked as deleted in its data files instead of the files being rewritten
//! (`storage/replace.rs`). The marks are a deletion vector per file: the positions of its deleted
//! rows, in the protocol's `RoaringBitmapArray` format (a magic number, then a 64-bit roaring
//! treemap in the portable layout), Z85-encoded into the `add` action (`storageType = 'i'`).
//! Inline vectors keep a run to one commit and no extra files; a file's vector grows with
//! each run that deletes more of its rows, and `cardinality` counts them, until more than a
//! quarter of the file is deleted: `storage/replace.rs` then writes the rest to a new file.

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

/// The inline descriptor of a file whose rows at `deleted` are deleted.
pub(crate) fn inline(deleted: &RoaringTreemap) -> Result<DeletionVectorDescriptor> {
    let mut bytes = MAGIC.to_le_bytes().to_vec();
    deleted
        .serialize_into(&mut bytes)
        .map_err(|e| EngineError::internal(format!("serializing a deletion vector: {e}")))?;
    let size = i32::try_from(bytes.len())
        .map_err(|_| EngineError::internal("a deletion vector over 2 GiB"))?;
    Ok(DeletionVectorDescriptor {
        storage_type: StorageType::Inline,
        path_or_inline_dv: z85_encode(&bytes),
        offset: None,
        size_in_bytes: size,
        cardinality: deleted.len() as i64,
    })
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
    let (magic, rest) = bytes.split_at_checked(4).ok_or_else(|| bad("is empty"))?;
    if magic != MAGIC.to_le_bytes() {
        return Err(bad("has no RoaringBitmapArray magic number"));
    }
    let map = RoaringTreemap::deserialize_from(rest).map_err(|e| bad(&format!("is bad: {e}")))?;
    Ok(Some(map))
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
