//! Gathering a column of variable-width values (strings, bytes) into a new row order.
//!
//! Putting a bulk load's events in key order gathers each column by a permutation of its
//! rows: for a string column of millions of rows, each value is two reads at a random place
//! (its offsets, then its bytes), each most likely a miss in every cache. Arrow's `take`
//! does one value after the other, so the processor waits on the misses of a few values at
//! a time; it was about an eighth of a 10M-event bulk load's CPU time. Here the offsets of a
//! value a little further on, and the bytes of a value nearer on, are asked for ahead
//! (prefetched), so that many misses are under way at once.

use deltalake::arrow::array::{Array, ArrayRef, GenericByteArray, UInt32Array};
use deltalake::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use deltalake::arrow::datatypes::ArrowNativeType;
use deltalake::arrow::datatypes::{
    BinaryType, ByteArrayType, DataType, LargeBinaryType, LargeUtf8Type, Utf8Type,
};
use std::sync::Arc;

/// How many values ahead the bytes of a value are asked for; the offsets, twice as far.
const AHEAD: usize = 16;

/// `array`'s rows `idx` (no NULL index), in that order, when `array` holds strings or bytes;
/// `None` for other types (the caller uses Arrow's `take`).
pub(crate) fn take_bytes(array: &ArrayRef, idx: &UInt32Array) -> Option<ArrayRef> {
    if idx.null_count() > 0 {
        return None;
    }
    let idx = idx.values();
    let out: ArrayRef = match array.data_type() {
        DataType::Utf8 => Arc::new(gather::<Utf8Type>(array.as_any().downcast_ref()?, idx)?),
        DataType::LargeUtf8 => Arc::new(gather::<LargeUtf8Type>(
            array.as_any().downcast_ref()?,
            idx,
        )?),
        DataType::Binary => Arc::new(gather::<BinaryType>(array.as_any().downcast_ref()?, idx)?),
        DataType::LargeBinary => Arc::new(gather::<LargeBinaryType>(
            array.as_any().downcast_ref()?,
            idx,
        )?),
        _ => return None,
    };
    Some(out)
}

/// The values of `array` at rows `idx`, in that order. `None` when a row number is out of
/// range or the result would not fit the array's offsets.
fn gather<T: ByteArrayType>(
    array: &GenericByteArray<T>,
    idx: &[u32],
) -> Option<GenericByteArray<T>> {
    let offsets = array.value_offsets();
    let values = array.value_data();
    let rows = array.len();
    if idx.iter().any(|&i| i as usize >= rows) {
        return None;
    }
    let at = |i: u32| offsets[i as usize].as_usize();
    let mut new_offsets: Vec<T::Offset> = Vec::with_capacity(idx.len() + 1);
    new_offsets.push(T::Offset::usize_as(0));
    let mut bytes: Vec<u8> = Vec::with_capacity(values.len().min(idx.len().saturating_mul(64)));
    for (n, &i) in idx.iter().enumerate() {
        if let Some(&far) = idx.get(n + 2 * AHEAD) {
            prefetch(offsets.as_ptr().wrapping_add(far as usize).cast());
        }
        if let Some(&near) = idx.get(n + AHEAD) {
            prefetch(values.as_ptr().wrapping_add(at(near)));
        }
        let (start, end) = (at(i), offsets[i as usize + 1].as_usize());
        bytes.extend_from_slice(&values[start..end]);
        new_offsets.push(T::Offset::from_usize(bytes.len())?);
    }
    let nulls = array.nulls().map(|n| {
        NullBuffer::new(BooleanBuffer::collect_bool(idx.len(), |r| {
            n.is_valid(idx[r] as usize)
        }))
    });
    // The offsets grow with each value, from 0, and each value's bytes are a whole value
    // of `array` (valid for its type).
    GenericByteArray::<T>::try_new(
        OffsetBuffer::new(ScalarBuffer::from(new_offsets)),
        Buffer::from_vec(bytes),
        nulls,
    )
    .ok()
}

/// Asks the processor to bring the cache line at `at` in, without waiting for it.
#[inline(always)]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is part of every x86_64 processor, and a prefetch is a hint: it reads
        // nothing into the program and never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{BinaryArray, LargeStringArray, StringArray};
    use deltalake::arrow::compute::take;

    /// The gather gives what Arrow's `take` gives, NULLs and empty values included, for
    /// each string and bytes type; other types and NULL row numbers are left to `take`.
    #[test]
    fn gathers_like_arrow_take() {
        let n = 1000u32;
        let idx = UInt32Array::from_iter_values((0..n).map(|i| i * 7919 % n));
        let values: Vec<Option<String>> = (0..n)
            .map(|i| match i % 11 {
                0 => None,
                1 => Some(String::new()),
                _ => Some(format!("value-{i}").repeat((i % 5) as usize)),
            })
            .collect();
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(values.clone())),
            Arc::new(LargeStringArray::from(values.clone())),
            Arc::new(BinaryArray::from_iter(
                values.iter().map(|v| v.as_ref().map(|s| s.as_bytes())),
            )),
        ];
        for a in &arrays {
            let got = take_bytes(a, &idx).expect("a bytes type");
            let want = take(a.as_ref(), &idx, None).unwrap();
            assert_eq!(got.as_ref(), want.as_ref(), "{}", a.data_type());
        }
        let ints: ArrayRef = Arc::new(UInt32Array::from_iter_values(0..n));
        assert!(take_bytes(&ints, &idx).is_none());
        let with_null = UInt32Array::from(vec![Some(1), None]);
        assert!(take_bytes(&arrays[0], &with_null).is_none());
        let out_of_range = UInt32Array::from(vec![n]);
        assert!(take_bytes(&arrays[0], &out_of_range).is_none());
    }
}
