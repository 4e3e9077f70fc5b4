//! Sorting integer keys together with their row numbers, on several threads.
//!
//! The hot paths put millions of integer keys in order (a snapshot's keys for its digest,
//! a batch's event keys before the fold, each part of the fold's input) and need, for each position of the result, the
//! row the key came from, rows of equal keys in row order. [`sorted_rows`] and
//! [`sorted_carrying`] do it in
//! three steps, each split over the threads:
//!
//! 1. each thread deals its share of the rows into buckets by the key's top bits (a
//!    counting sort into a buffer of its own);
//! 2. each thread takes a run of whole buckets (about the same number of rows per
//!    thread), copies its buckets' pieces from every share in share order, and sorts each
//!    bucket by the key's remaining bits with a least-significant-digit radix sort; a
//!    bucket holds a few thousand keys, so those passes run in the CPU cache;
//! 3. the sorted keys are unpacked into keys and rows (a value carried along is gathered
//!    into their order first).
//!
//! A key and its row are packed into one `u64` when the key range and the row count fit in
//! 64 bits together (the common case); else sorted as (key, row) pairs. Every step is
//! stable, so equal keys keep their row order.

use crate::error::Result;
use crate::util::threads::on_threads;
use std::ops::Range;

/// Keys per bucket the bucket count aims at: small enough that a bucket's radix passes
/// stay in the CPU cache.
const BUCKET_ROWS: usize = 2048;
/// At most this many bits of buckets (256): dealing rows into more streams at once than
/// the TLB and write buffers keep track of costs more than larger buckets do.
const MAX_BUCKET_BITS: u32 = 8;
/// Buckets smaller than this are sorted by comparison instead of by radix passes.
const SMALL_BUCKET: usize = 64;

/// The rows of `values` in ascending order of their values (rows of equal values in row
/// order), using up to `threads` threads.
pub(crate) fn sorted_rows(values: Vec<u64>, threads: usize) -> Result<Vec<u32>> {
    Ok(sort(values, threads, false, None)?.0 .1)
}

/// `values` in ascending order with the row each came from (as [`sorted_rows`] orders them),
/// and a value per row that `carried` makes (in row order) put in the same order.
/// `carried` runs once the sort's own buffers are freed and before the rows are split out
/// of the sorted items, so the row-order values, the sorted ones and the sort's
/// items are the most it holds at once (for 10M rows 240 MB, where sorting first and then
/// gathering held 280).
pub(crate) fn sorted_carrying(
    values: Vec<u64>,
    threads: usize,
    carried: impl FnOnce() -> Result<Vec<u64>>,
) -> Result<(Vec<u64>, Vec<u32>, Vec<u64>)> {
    let ((values, rows), carried) = sort(values, threads, true, Some(Box::new(carried)))?;
    Ok((values, rows, carried.unwrap_or_default()))
}

/// A value per row, made when a sort asks for it ([`sorted_carrying`]).
type Carried<'a> = Box<dyn FnOnce() -> Result<Vec<u64>> + 'a>;

/// What `carried` makes (a value per row), gathered into the order of the sorted `items`
/// (`row(item)` the row of each) on up to `threads` threads; `None` without `carried`.
fn carry<T: Copy + Sync>(
    carried: Option<Carried<'_>>,
    items: &[T],
    threads: usize,
    row: impl Fn(T) -> usize + Sync,
) -> Result<Option<Vec<u64>>> {
    let Some(carried) = carried else {
        return Ok(None);
    };
    let by_row = carried()?;
    let mut out = vec![0u64; items.len()];
    let per = items.len().div_ceil(threads.max(1)).max(1);
    let jobs: Vec<_> = items.chunks(per).zip(out.chunks_mut(per)).collect();
    on_threads(jobs, "gather", |(src, dst)| {
        for (&t, d) in src.iter().zip(dst.iter_mut()) {
            *d = by_row[row(t)];
        }
    })?;
    Ok(Some(out))
}

/// The sorted values (when `keep_values`, else none) and their rows, and what `carried`
/// makes in the same order.
#[allow(clippy::type_complexity)]
fn sort(
    values: Vec<u64>,
    threads: usize,
    keep_values: bool,
    carried: Option<Carried<'_>>,
) -> Result<((Vec<u64>, Vec<u32>), Option<Vec<u64>>)> {
    let n = values.len();
    let (mut min, mut max, mut ascending) = (u64::MAX, 0, true);
    let mut last = 0;
    for &v in &values {
        ascending &= last <= v;
        (min, max, last) = (min.min(v), max.max(v), v);
    }
    if ascending {
        let values = if keep_values { values } else { Vec::new() };
        let carried = carried.map(|c| c()).transpose()?;
        return Ok(((values, (0..n as u32).collect()), carried));
    }
    let value_bits = 64 - (max - min).leading_zeros();
    let row_bits = 64 - (n as u64).leading_zeros();
    let threads = threads.clamp(1, n.max(1));
    if value_bits + row_bits <= 64 {
        let mut packed = bucket_sort(
            n,
            |i| ((values[i] - min) << row_bits) | i as u64,
            |p| p >> row_bits,
            value_bits,
            threads,
        )?;
        drop(values);
        let mask = (1u64 << row_bits) - 1;
        let carried = carry(carried, &packed, threads, |p| (p & mask) as usize)?;
        // Unpacked in place: the sorted values take the packed integers' memory.
        let mut rows = vec![0u32; n];
        let per = n.div_ceil(threads).max(1);
        let jobs: Vec<_> = packed.chunks_mut(per).zip(rows.chunks_mut(per)).collect();
        on_threads(jobs, "sort", |(ps, rs)| {
            for (p, r) in ps.iter_mut().zip(rs.iter_mut()) {
                *r = (*p & mask) as u32;
                *p = (*p >> row_bits) + min;
            }
        })?;
        return Ok((
            (if keep_values { packed } else { Vec::new() }, rows),
            carried,
        ));
    }
    let pairs = bucket_sort(
        n,
        |i| (values[i] - min, i as u32),
        |(v, _)| v,
        value_bits,
        threads,
    )?;
    drop(values);
    let carried = carry(carried, &pairs, threads, |(_, r)| r as usize)?;
    Ok((
        unpack(&pairs, threads, keep_values, |(v, r)| (v + min, r))?,
        carried,
    ))
}

/// The `n` items `make(0..n)` sorted stably by `key(item)`, which is below `2^bits`.
fn bucket_sort<T, M, K>(n: usize, make: M, key: K, bits: u32, threads: usize) -> Result<Vec<T>>
where
    T: Copy + Default + Send + Sync,
    M: Fn(usize) -> T + Sync,
    K: Fn(T) -> u64 + Sync + Copy,
{
    let wanted = (n / BUCKET_ROWS).max(1);
    let bucket_bits = (usize::BITS - (wanted - 1).leading_zeros())
        .min(MAX_BUCKET_BITS)
        .min(bits);
    let low_bits = bits - bucket_bits;
    let buckets = 1usize << bucket_bits;
    let bucket_of = move |t: T| key(t).checked_shr(low_bits).unwrap_or(0) as usize;

    // 1. Each share of the rows, dealt into buckets: (items by bucket, bucket starts).
    let per = n.div_ceil(threads).max(1);
    let shares: Vec<Range<usize>> = (0..n).step_by(per).map(|s| s..(s + per).min(n)).collect();
    let dealt: Vec<(Vec<T>, Vec<usize>)> = on_threads(shares, "sort", |rows| {
        let mut starts = vec![0usize; buckets + 1];
        for i in rows.clone() {
            starts[bucket_of(make(i)) + 1] += 1;
        }
        for b in 0..buckets {
            starts[b + 1] += starts[b];
        }
        let mut next = starts[..buckets].to_vec();
        let mut out = vec![T::default(); rows.len()];
        for i in rows {
            let t = make(i);
            let b = bucket_of(t);
            out[next[b]] = t;
            next[b] += 1;
        }
        (out, starts)
    })?;

    // 2. Runs of whole buckets with about n / threads rows each, one per thread.
    let size = |b: usize| -> usize { dealt.iter().map(|(_, s)| s[b + 1] - s[b]).sum() };
    let mut runs: Vec<Range<usize>> = Vec::with_capacity(threads);
    let (mut first, mut taken, mut done) = (0, 0, 0);
    for b in 0..buckets {
        taken += size(b);
        if done + taken >= (runs.len() + 1) * n / threads && runs.len() + 1 < threads {
            runs.push(first..b + 1);
            (first, done, taken) = (b + 1, done + taken, 0);
        }
    }
    runs.push(first..buckets);
    let mut out = vec![T::default(); n];
    let mut jobs: Vec<(Range<usize>, &mut [T])> = Vec::with_capacity(runs.len());
    let mut rest: &mut [T] = &mut out;
    for run in runs {
        let len: usize = run.clone().map(size).sum();
        let (mine, tail) = rest.split_at_mut(len);
        jobs.push((run, mine));
        rest = tail;
    }
    let dealt = &dealt;
    on_threads(jobs, "sort", |(run, slice)| {
        let mut scratch: Vec<T> = Vec::new();
        let mut at = 0;
        for b in run {
            let start = at;
            for (items, starts) in dealt {
                let piece = &items[starts[b]..starts[b + 1]];
                slice[at..at + piece.len()].copy_from_slice(piece);
                at += piece.len();
            }
            sort_low_bits(&mut slice[start..at], &mut scratch, key, low_bits);
        }
    })?;
    Ok(out)
}

/// `items` (one bucket: equal bits above `bits`) sorted stably by the low `bits` of their key.
fn sort_low_bits<T: Copy + Default>(
    items: &mut [T],
    scratch: &mut Vec<T>,
    key: impl Fn(T) -> u64,
    bits: u32,
) {
    let len = items.len();
    if len < 2 || bits == 0 {
        return;
    }
    let mask = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    if len < SMALL_BUCKET {
        items.sort_by_key(|&t| key(t) & mask);
        return;
    }
    let (lo, hi) = items.iter().fold((u64::MAX, 0), |(lo, hi), &t| {
        let k = key(t) & mask;
        (lo.min(k), hi.max(k))
    });
    let span = 64 - (hi - lo).leading_zeros();
    if span == 0 {
        return;
    }
    // Digits of at most 11 bits: a pass's counts stay in the L1 cache.
    let passes = span.div_ceil(11);
    let digit_bits = span.div_ceil(passes);
    let digits = 1usize << digit_bits;
    scratch.clear();
    scratch.resize(len, T::default());
    let mut counts = vec![0usize; digits];
    let mut in_items = true;
    for pass in 0..passes {
        let shift = pass * digit_bits;
        let digit = |t: T| (((key(t) & mask) - lo) >> shift) as usize & (digits - 1);
        let (src, dst): (&[T], &mut [T]) = if in_items {
            (&*items, &mut scratch[..])
        } else {
            (&scratch[..], &mut *items)
        };
        counts.iter_mut().for_each(|c| *c = 0);
        for &t in src {
            counts[digit(t)] += 1;
        }
        let mut sum = 0;
        for c in counts.iter_mut() {
            (*c, sum) = (sum, sum + *c);
        }
        for &t in src {
            let d = digit(t);
            dst[counts[d]] = t;
            counts[d] += 1;
        }
        in_items = !in_items;
    }
    if !in_items {
        items.copy_from_slice(scratch);
    }
}

/// Splits sorted `items` into values (when `keep_values`, else none) and rows with `split`,
/// on up to `threads` threads.
fn unpack<T: Copy + Sync>(
    items: &[T],
    threads: usize,
    keep_values: bool,
    split: impl Fn(T) -> (u64, u32) + Sync,
) -> Result<(Vec<u64>, Vec<u32>)> {
    let n = items.len();
    let mut values = vec![0u64; if keep_values { n } else { 0 }];
    let mut rows = vec![0u32; n];
    let per = n.div_ceil(threads.max(1)).max(1);
    let mut value_chunks: Vec<&mut [u64]> = values.chunks_mut(per).collect();
    value_chunks.resize_with(items.chunks(per).len(), Default::default);
    let jobs: Vec<_> = items
        .chunks(per)
        .zip(value_chunks.into_iter().zip(rows.chunks_mut(per)))
        .collect();
    on_threads(jobs, "sort", |(src, (vals, rws))| {
        for (i, (&t, r)) in src.iter().zip(rws.iter_mut()).enumerate() {
            let (v, row) = split(t);
            *r = row;
            if let Some(slot) = vals.get_mut(i) {
                *slot = v;
            }
        }
    })?;
    Ok((values, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 7
    }

    /// Packed (values and rows fit in 64 bits) or not, few or many distinct values, values
    /// come out sorted with their rows, equal values in row order, on one thread or several.
    #[test]
    fn values_are_sorted_with_their_rows() {
        let mut x: u64 = 11;
        for (n, spread, threads) in [
            (40_000usize, 1_000u64, 1),
            (40_000, 1_000, 2),
            (40_000, 1 << 40, 2),
            (40_000, u64::MAX, 2),
            (300_000, 1 << 40, 3),
            (300_000, 7, 2),
            (5, 100, 4),
            (0, 100, 2),
        ] {
            let mut values: Vec<u64> = (0..n).map(|_| lcg(&mut x) % spread.max(1)).collect();
            if spread == u64::MAX {
                values.push(u64::MAX);
                values.push(0);
            }
            let mut want: Vec<(u64, u32)> = values
                .iter()
                .enumerate()
                .map(|(i, &v)| (v, i as u32))
                .collect();
            want.sort();
            let rows_only = sorted_rows(values.clone(), threads).unwrap();
            // A carried value per row (here its row times three) comes out in the rows' order.
            let (_, carried_rows, carried) = sorted_carrying(values.clone(), threads, || {
                Ok((0..values.len() as u64).map(|r| r * 3).collect())
            })
            .unwrap();
            let thrice: Vec<u64> = carried_rows.iter().map(|&r| r as u64 * 3).collect();
            assert_eq!(carried, thrice);
            let (sorted, rows) = sort(values, threads, true, None).unwrap().0;
            assert_eq!(rows_only, rows);
            let got: Vec<(u64, u32)> = sorted.into_iter().zip(rows).collect();
            assert_eq!(got, want, "n {n}, spread {spread}, {threads} thread(s)");
        }
    }

    /// Keys crowded into one bucket (one outlier stretches the range) still sort exactly.
    #[test]
    fn skewed_keys_sort_exactly() {
        let mut x: u64 = 5;
        let mut values: Vec<u64> = (0..100_000).map(|_| lcg(&mut x) % 5_000).collect();
        values.push(1 << 39);
        let mut want = values.clone();
        want.sort();
        let (sorted, rows) = sort(values.clone(), 2, true, None).unwrap().0;
        assert_eq!(sorted, want);
        assert!(rows
            .iter()
            .zip(&sorted)
            .all(|(&r, &v)| values[r as usize] == v));
        assert!(rows
            .windows(2)
            .zip(sorted.windows(2))
            .all(|(r, v)| v[0] < v[1] || r[0] < r[1]));
    }
}
