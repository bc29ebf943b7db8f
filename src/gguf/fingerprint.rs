//! The model file's fingerprint: a hash of every byte of the file, defined over fixed pieces
//! of it so that threads can hash the pieces in parallel. It is computed when first asked for
//! (saving or restoring a session, starting the batch engine), not while loading: a load reads only the quantized
//! tensors, once, to pack them.
//!
//! The file is cut into **segments** ([`segments`]), a partition of `0..file_len` that depends
//! on the file's tensor list only:
//! - inside each tensor, runs of whole rows of at most [`SEGMENT_BYTES`] (one row if a row is
//!   longer), counted from the tensor's first byte (the runs the loader packs);
//! - everything else (the header, metadata and tensor infos, alignment padding, the tensors
//!   of types reprolm does not read, trailing bytes) in pieces of [`SEGMENT_BYTES`] from the
//!   start of each gap between tensors.
//!
//! The fingerprint is XXH64 (seed 0) of the segments' XXH64s (seed 0, each as 8 little-endian
//! bytes, in file order) followed by the file length (8 little-endian bytes): a function of
//! the bytes alone, whatever order or thread computes the segments' hashes. The same file
//! always gives the same fingerprint; changing any byte changes the hash of the segment that
//! holds it, and so the fingerprint, except with the probability of a 64-bit hash collision.

use std::ops::Range;

use super::GgufFile;
use crate::error::Result;
use crate::threads::{Disjoint, ThreadPool};
use crate::xxh64::xxh64;

/// The most bytes in one segment, unless one tensor row is longer.
pub const SEGMENT_BYTES: usize = 1 << 20;

/// Rows of `row_bytes` bytes per segment of a tensor (at least one).
pub fn rows_per_segment(row_bytes: usize) -> usize {
    (SEGMENT_BYTES / row_bytes.max(1)).max(1)
}

/// The file's segments, in file order: consecutive, non-empty, covering `0..file_len`.
pub fn segments(file: &GgufFile) -> Vec<Range<usize>> {
    let len = file.map().len();
    // Cut points: every tensor's row-run boundaries (its start and end included), then the
    // gaps between cuts that lie outside every tensor, in pieces of SEGMENT_BYTES.
    let mut cuts = vec![0, len];
    let mut inside: Vec<Range<usize>> = Vec::with_capacity(file.tensors().len());
    for t in file.tensors() {
        let rows: usize = t.dims.iter().skip(1).map(|&d| d as usize).product();
        if t.n_bytes == 0 || rows == 0 {
            continue;
        }
        let step = rows_per_segment(t.n_bytes / rows) * (t.n_bytes / rows);
        cuts.extend((t.offset..t.offset + t.n_bytes).step_by(step));
        cuts.push(t.offset + t.n_bytes);
        inside.push(t.offset..t.offset + t.n_bytes);
    }
    cuts.sort_unstable();
    cuts.dedup();
    inside.sort_unstable_by_key(|r| r.start);
    let mut out = Vec::with_capacity(cuts.len());
    let mut tensor = 0;
    for w in cuts.windows(2) {
        let (start, end) = (w[0], w[1]);
        while tensor < inside.len() && inside[tensor].end <= start {
            tensor += 1;
        }
        let in_a_tensor = inside[tensor..].iter().take_while(|r| r.start <= start).any(|r| r.end > start);
        if in_a_tensor {
            out.push(start..end);
        } else {
            out.extend((start..end).step_by(SEGMENT_BYTES).map(|s| s..(s + SEGMENT_BYTES).min(end)));
        }
    }
    out
}

/// XXH64 of one segment's bytes.
fn segment_hash(bytes: &[u8]) -> u64 {
    xxh64(bytes, 0)
}

/// The fingerprint from the hashes of all the file's segments in file order.
fn combine(segment_hashes: &[u64], file_len: usize) -> u64 {
    let mut bytes = Vec::with_capacity(8 * segment_hashes.len() + 8);
    for h in segment_hashes {
        bytes.extend_from_slice(&h.to_le_bytes());
    }
    bytes.extend_from_slice(&(file_len as u64).to_le_bytes());
    xxh64(&bytes, 0)
}

/// The fingerprint, its segments hashed in parallel on `pool`'s threads (the same number for
/// any thread count). Each segment's file pages are released once hashed, so that hashing
/// a file does not leave all of it mapped in the process.
pub fn fingerprint_on(file: &GgufFile, pool: &ThreadPool) -> Result<u64> {
    let map = &file.map()[..];
    let segments = segments(file);
    let mut hashes = vec![0u64; segments.len()];
    let out = Disjoint::new(&mut hashes[..]);
    pool.install(|| {
        pool.run(segments.len(), |i| {
            let bytes = segments[i].clone();
            // SAFETY: segment i alone writes hash i.
            unsafe { out.slice(i..i + 1)[0] = segment_hash(&map[bytes.clone()]) };
            file.release_bytes(bytes.start, bytes.len());
        })
    })?;
    Ok(combine(&hashes, map.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fingerprint by its definition, segment after segment on the calling thread.
    fn fingerprint(file: &GgufFile) -> u64 {
        let map = &file.map()[..];
        let hashes: Vec<u64> = segments(file).into_iter().map(|s| segment_hash(&map[s])).collect();
        combine(&hashes, map.len())
    }

    /// A committed K-quant model (Q4_K, Q6_K and F32 tensors).
    fn small_file() -> Vec<u8> {
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/synthetic/tiny.Q4_K_M.gguf")).unwrap()
    }

    #[test]
    fn segments_partition_the_file_and_split_tensors_at_row_runs() {
        let bytes = small_file();
        let file = GgufFile::from_bytes(&bytes).unwrap();
        let segs = segments(&file);
        assert_eq!(segs.first().unwrap().start, 0);
        assert_eq!(segs.last().unwrap().end, bytes.len());
        for w in segs.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        assert!(segs.iter().all(|s| !s.is_empty() && s.len() <= SEGMENT_BYTES));
        for t in file.tensors() {
            assert!(segs.iter().any(|s| s.start == t.offset), "{} starts a segment", t.name);
            assert!(segs.iter().any(|s| s.end == t.offset + t.n_bytes), "{} ends a segment", t.name);
        }
    }

    /// Any number of threads computes the sequential fingerprint, on every committed model.
    #[test]
    fn parallel_fingerprint_is_the_sequential_one() {
        for name in ["tiny.Q4_K_M.gguf", "tiny.Q6_K.gguf", "tiny.Q8_0.gguf", "tiny.Q4_0.gguf"] {
            let file = GgufFile::open(format!("{}/tests/data/synthetic/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
            let sequential = fingerprint(&file);
            for threads in [1, 2, 3] {
                assert_eq!(fingerprint_on(&file, &ThreadPool::new(threads).unwrap()).unwrap(), sequential, "{name}, {threads} threads");
            }
        }
    }

    #[test]
    fn every_byte_changes_the_fingerprint_and_nothing_else_does() {
        let bytes = small_file();
        let reference = fingerprint(&GgufFile::from_bytes(&bytes).unwrap());
        assert_eq!(fingerprint(&GgufFile::from_bytes(&bytes).unwrap()), reference);
        let whole_file = xxh64(&bytes, 0);
        assert_ne!(reference, whole_file, "a different definition than the plain hash of the file");
        let tensors = GgufFile::from_bytes(&bytes).unwrap().tensors().to_vec();
        // Header bytes (a key's text), the byte before the data, every tensor's first and
        // last byte, the file's last byte.
        let name_at = bytes.windows(18).position(|w| w == b"general.architectu").unwrap();
        let first_data = tensors.iter().map(|t| t.offset).min().unwrap();
        let mut positions = vec![name_at + 17, first_data - 1, bytes.len() - 1];
        for t in &tensors {
            positions.extend([t.offset, t.offset + t.n_bytes / 2, t.offset + t.n_bytes - 1]);
        }
        for p in positions {
            let mut changed = bytes.clone();
            changed[p] ^= 0x01;
            let file = GgufFile::from_bytes(&changed).unwrap();
            assert_ne!(fingerprint(&file), reference, "byte {p} changed");
        }
    }
}
