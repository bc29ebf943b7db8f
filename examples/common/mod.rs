//! What the kernel-timing examples share.

// Each example uses a part of this module.
#![allow(dead_code)]

use std::time::Instant;

use reprolm::kernels::aligned::AlignedBuf;
use reprolm::tensor::GgmlType;

/// The quantized types the examples time, each with the byte offsets of the f16 scales in
/// its ggml block.
pub const TYPES: [(GgmlType, &[usize]); 7] = [
    (GgmlType::Q4_0, &[0]),
    (GgmlType::Q4_1, &[0, 2]),
    (GgmlType::Q5_0, &[0]),
    (GgmlType::Q8_0, &[0]),
    (GgmlType::Q4_K, &[0, 2]),
    (GgmlType::Q5_K, &[0, 2]),
    (GgmlType::Q6_K, &[208]),
];

/// `rows` ggml rows of `cols` values of `ty`: pseudo-random code bytes, small finite f16
/// scales at the offsets `scales` of each block.
pub fn ggml_matrix(ty: GgmlType, scales: &[usize], rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * ty.row_bytes(cols);
    let block = ty.block_bytes();
    let mut ggml: Vec<u8> = (0..n).map(|i| ((i as u64).wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for b in 0..n / block {
        for &o in scales {
            ggml[b * block + o] = (b % 200) as u8;
            ggml[b * block + o + 1] = 0x20;
        }
    }
    ggml
}

/// A hash of `out`'s bits: equal hashes, equal bits (for comparing builds).
pub fn bits_hash(out: &[f32]) -> u64 {
    out.iter().fold(0u64, |h, v| h.rotate_left(5) ^ v.to_bits() as u64)
}

/// (rows, cols) from `ROWSxCOLS`.
pub fn parse_shape(s: &str) -> (usize, usize) {
    let (r, c) = s.split_once('x').expect("ROWSxCOLS, e.g. 8192x2048");
    (r.parse().expect("ROWS: a number"), c.parse().expect("COLS: a number"))
}

/// Median seconds of `reps` runs of `f` (after one warm-up run).
pub fn median_seconds(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[reps / 2]
}

/// `n_tokens` rows of `cols` activations, small values of both signs, on a cache line as the
/// model's buffers are.
pub fn activations(n_tokens: usize, cols: usize) -> AlignedBuf<f32> {
    let mut x = AlignedBuf::default();
    x.resize(n_tokens * cols, 0.0);
    for (i, v) in x.iter_mut().enumerate() {
        *v = ((i * 37 % 101) as f32 - 50.0) / 64.0;
    }
    x
}
