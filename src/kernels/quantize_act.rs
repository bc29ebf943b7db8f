//! Activation rows quantized to int8 for the `precision = "int8"` kernels ([`super::int8`]).
//!
//! Definitions, for group `g` of a row `x` (values `x_i`, `i` in `32g .. 32g + 32`, assumed
//! finite), all arithmetic in f32 with IEEE round-to-nearest-even unless said otherwise:
//!
//! - `a = max_i |x_i|` (exact);
//! - `d = a / 127` (one correctly rounded division);
//! - `q_i = 0` if `d == 0`, else `q_i = clamp(round(x_i / d), -127, 127)`, where `x_i / d` is
//!   one correctly rounded f32 division and `round` rounds half away from zero (C's `roundf`,
//!   Rust's `f32::round`). The clamp only acts when `d` is subnormal; normally
//!   `|x_i / d| <= 127.00002` already;
//! - `qsum = sum_i q_i` (exact in i32);
//! - `s = d * qsum` as f32 (one rounding): the group sum of the *dequantized* activations
//!   `d * q_i`, used for Q4_1's offset term.
//!
//! This is ggml's Q8_1 scheme (ggml multiplies by `1/d` instead of dividing by `d`). The
//! quantization is plain sequential scalar code, run once per matmul phase before the
//! threads start, so every ISA, thread count and chunking sees the same codes.
//!
//! Layout: groups come in *chunks* of 16 (lane `l` of a chunk is group `16c + l`); a token's
//! codes for chunk `c` are 512 bytes `[word k: 8][lane l: 16][byte b: 4]` holding
//! `q[32(16c + l) + 4k + b]`, so one 64-byte load of word `k` puts 4 consecutive codes of 16
//! different groups in the 16 i32 lanes of a vector. The last chunk is zero-padded to 16
//! groups (codes, `d`, `s` and `qsum` all zero).

use super::GROUP;

/// Groups per chunk (one vector lane each).
pub const CHUNK_GROUPS: usize = 16;
/// Code bytes per chunk of one token.
pub const CHUNK_BYTES: usize = CHUNK_GROUPS * GROUP;

/// Chunks of a row of `cols` values.
pub fn chunks(cols: usize) -> usize {
    (cols / GROUP).div_ceil(CHUNK_GROUPS)
}

/// Byte offset, within one token's codes, of value `i` of a row.
#[inline]
pub fn code_offset(i: usize) -> usize {
    let (g, j) = (i / GROUP, i % GROUP);
    let (c, l) = (g / CHUNK_GROUPS, g % CHUNK_GROUPS);
    c * CHUNK_BYTES + ((j / 4) * CHUNK_GROUPS + l) * 4 + j % 4
}

/// `n_tokens` activation rows of `cols` values, quantized as documented above. Buffers
/// grow to the largest call and are reused (no allocation per token).
#[derive(Debug, Default, Clone)]
pub struct QuantizedRows {
    pub n_tokens: usize,
    pub cols: usize,
    /// [n_tokens][chunks(cols) * CHUNK_BYTES] codes in the chunk layout
    pub q: Vec<i8>,
    /// [n_tokens][chunks(cols) * 16] scale `d` of each group (zero-padded)
    pub d: Vec<f32>,
    /// [n_tokens][chunks(cols) * 16] `s = d * qsum` of each group (zero-padded)
    pub s: Vec<f32>,
    /// [n_tokens][chunks(cols) * 16] `qsum` of each group (zero-padded)
    pub qsum: Vec<i32>,
}

impl QuantizedRows {
    /// Code bytes per token.
    pub fn q_stride(&self) -> usize {
        chunks(self.cols) * CHUNK_BYTES
    }

    /// Per-group values per token.
    pub fn lane_stride(&self) -> usize {
        chunks(self.cols) * CHUNK_GROUPS
    }

    /// Quantizes the first `n_tokens` rows of `x` ([n_tokens][cols], `cols` a multiple of 32).
    pub fn quantize(&mut self, x: &[f32], cols: usize, n_tokens: usize) {
        assert!(cols % GROUP == 0 && x.len() >= n_tokens * cols);
        self.cols = cols;
        self.n_tokens = n_tokens;
        let (qs, ls) = (self.q_stride(), self.lane_stride());
        grow(&mut self.q, n_tokens * qs, 0);
        grow(&mut self.d, n_tokens * ls, 0.0);
        grow(&mut self.s, n_tokens * ls, 0.0);
        grow(&mut self.qsum, n_tokens * ls, 0);
        for t in 0..n_tokens {
            let row = &x[t * cols..(t + 1) * cols];
            let q = &mut self.q[t * qs..(t + 1) * qs];
            let (d, s, qsum) =
                (&mut self.d[t * ls..(t + 1) * ls], &mut self.s[t * ls..(t + 1) * ls], &mut self.qsum[t * ls..(t + 1) * ls]);
            // Padding of the last chunk.
            q.fill(0);
            d.fill(0.0);
            s.fill(0.0);
            qsum.fill(0);
            for (g, values) in row.chunks_exact(GROUP).enumerate() {
                let (codes, dg) = quantize_group(values);
                for (j, &c) in codes.iter().enumerate() {
                    q[code_offset(g * GROUP + j)] = c;
                }
                let sum: i32 = codes.iter().map(|&c| c as i32).sum();
                d[g] = dg;
                qsum[g] = sum;
                s[g] = dg * sum as f32;
            }
        }
    }
}

fn grow<T: Copy>(v: &mut Vec<T>, n: usize, zero: T) {
    if v.len() < n {
        v.resize(n, zero);
    }
}

/// One group's codes and scale `d`, by the definitions in the module docs.
pub fn quantize_group(x: &[f32]) -> ([i8; GROUP], f32) {
    debug_assert_eq!(x.len(), GROUP);
    let a = x.iter().fold(0f32, |m, &v| m.max(v.abs()));
    let d = a / 127.0;
    let mut q = [0i8; GROUP];
    if d != 0.0 {
        for (q, &v) in q.iter_mut().zip(x) {
            *q = (v / d).round().clamp(-127.0, 127.0) as i8;
        }
    }
    (q, d)
}
