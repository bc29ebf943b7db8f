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
//!   `|x_i / d| <= 127.00002` already (the code clamps the quotient to `[-128, 128]` before
//!   rounding, which gives the same result);
//! - `qsum = sum_i q_i` (exact in i32), and `hsum` the same over the group's first 16
//!   values (Q6_K's sub-blocks of 16 need both halves' sums);
//! - `s = d * qsum` as f32 (one rounding): the group sum of the *dequantized* activations
//!   `d * q_i`, used for Q4_1's offset term.
//!
//! This is ggml's Q8_1 scheme (ggml multiplies by `1/d` instead of dividing by `d`). It runs
//! once per matmul phase; rows may be split across threads. Each ISA computes a group by the
//! same IEEE operations (scalar code, the same code auto-vectorized for AVX2, and an explicit
//! AVX-512 twin tested against it), so every ISA, thread count and chunking sees the same
//! codes.
//!
//! Layout: groups come in *chunks* of 16 (lane `l` of a chunk is group `16c + l`); a token's
//! codes for chunk `c` are 512 bytes `[word k: 8][lane l: 16][byte b: 4]` holding
//! `q[32(16c + l) + 4k + b]`, so one 64-byte load of word `k` puts 4 consecutive codes of 16
//! different groups in the 16 i32 lanes of a vector. A last chunk of 5 to 15 groups is
//! zero-padded to 16 groups (codes, `d`, `s` and `qsum` all zero).
//!
//! A last chunk of `n = 1..=4` groups (SmolLM2's 576 = 16 + 2 groups) is *narrow*: 128 bytes
//! `[half h: 2][lane L: 16][byte b: 4]` holding `q[32(16c + g) + 16h + 4w + b]` for lane
//! `L = 4g + w` (`g < n`, `w < 4`; other lanes zero): each lane holds 8 codes of one group,
//! so two vectors cover the chunk instead of eight mostly empty ones. For it the rows also
//! carry, per lane, the group's `d` (`tail_d`) and the sum of the lane's 8 codes
//! (`tail_sum`).

use super::aligned::AlignedBuf;
use super::{Disjoint, Isa, GROUP};

/// Groups per chunk (one vector lane each).
pub const CHUNK_GROUPS: usize = 16;
/// Code bytes per chunk of one token.
pub const CHUNK_BYTES: usize = CHUNK_GROUPS * GROUP;
/// Largest last chunk that is narrow.
pub const NARROW_MAX: usize = 4;
/// Code bytes of a narrow chunk of one token.
pub const NARROW_BYTES: usize = 2 * CHUNK_GROUPS * 4;

/// Chunks of a row of `cols` values (the lanes of `d`, `s`, `qsum`: 16 per chunk).
pub fn chunks(cols: usize) -> usize {
    (cols / GROUP).div_ceil(CHUNK_GROUPS)
}

/// Groups in a narrow last chunk (0 if there is none).
pub fn narrow_groups(cols: usize) -> usize {
    let n = (cols / GROUP) % CHUNK_GROUPS;
    if n <= NARROW_MAX {
        n
    } else {
        0
    }
}

/// Chunks in the 8-word layout (all but a narrow last one).
pub fn wide_chunks(cols: usize) -> usize {
    chunks(cols) - (narrow_groups(cols) > 0) as usize
}

/// Byte offset, within one token's codes, of value `i` of a row of `cols` values.
#[inline]
pub fn code_offset(cols: usize, i: usize) -> usize {
    let (g, j) = (i / GROUP, i % GROUP);
    let (c, l) = (g / CHUNK_GROUPS, g % CHUNK_GROUPS);
    if c == wide_chunks(cols) {
        c * CHUNK_BYTES + ((j / 16) * CHUNK_GROUPS + 4 * l + (j % 16) / 4) * 4 + j % 4
    } else {
        c * CHUNK_BYTES + ((j / 4) * CHUNK_GROUPS + l) * 4 + j % 4
    }
}

/// `n_tokens` activation rows of `cols` values, quantized as documented above. Buffers
/// grow to the largest call and are reused (no allocation per token).
#[derive(Debug, Default, Clone)]
pub struct QuantizedRows {
    pub n_tokens: usize,
    pub cols: usize,
    /// [n_tokens][q_stride()] codes in the chunk layout
    pub q: AlignedBuf<i8>,
    /// [n_tokens][chunks(cols) * 16] scale `d` of each group (zero-padded)
    pub d: AlignedBuf<f32>,
    /// [n_tokens][chunks(cols) * 16] `s = d * qsum` of each group (zero-padded)
    pub s: AlignedBuf<f32>,
    /// [n_tokens][chunks(cols) * 16] `qsum` of each group (zero-padded)
    pub qsum: AlignedBuf<i32>,
    /// [n_tokens][chunks(cols) * 16] `hsum`: sum of the first 16 codes of each group
    /// (zero-padded)
    pub hsum: AlignedBuf<i32>,
    /// [n_tokens][16] narrow chunk: `d` of lane `L`'s group (zero past the groups)
    pub tail_d: AlignedBuf<f32>,
    /// [n_tokens][16] narrow chunk: sum of lane `L`'s 8 codes (zero past the groups)
    pub tail_sum: AlignedBuf<i32>,
    /// [n_tokens][cols] the same codes in group order (group `g`'s 32 codes at `32 g`), which
    /// a one-token kernel over ggml's blocks read in place dots directly
    pub grouped: AlignedBuf<i8>,
}

impl QuantizedRows {
    /// Code bytes per token.
    pub fn q_stride(&self) -> usize {
        wide_chunks(self.cols) * CHUNK_BYTES + if narrow_groups(self.cols) > 0 { NARROW_BYTES } else { 0 }
    }

    /// Per-group values per token.
    pub fn lane_stride(&self) -> usize {
        chunks(self.cols) * CHUNK_GROUPS
    }

    /// Quantizes the first `n_tokens` rows of `x` ([n_tokens][cols], `cols` a multiple of 32)
    /// with the kernels of `isa` (every ISA gives the same bytes).
    pub fn quantize(&mut self, isa: Isa, x: &[f32], cols: usize, n_tokens: usize) {
        let writer = self.writer(cols, n_tokens);
        // SAFETY: one writer, all rows.
        unsafe { writer.quantize(isa, x, 0..n_tokens) };
    }

    /// Sizes the buffers for `n_tokens` rows of `cols` values and returns a handle through
    /// which threads quantize disjoint rows (each row by the same code, so the same bytes
    /// whichever thread does it).
    pub fn writer(&mut self, cols: usize, n_tokens: usize) -> RowWriter<'_> {
        assert!(cols.is_multiple_of(GROUP));
        self.cols = cols;
        self.n_tokens = n_tokens;
        let (qs, ls) = (self.q_stride(), self.lane_stride());
        self.q.grow(n_tokens * qs, 0);
        self.d.grow(n_tokens * ls, 0.0);
        self.s.grow(n_tokens * ls, 0.0);
        self.qsum.grow(n_tokens * ls, 0);
        self.hsum.grow(n_tokens * ls, 0);
        self.tail_d.grow(n_tokens * CHUNK_GROUPS, 0.0);
        self.tail_sum.grow(n_tokens * CHUNK_GROUPS, 0);
        self.grouped.grow(n_tokens * cols, 0);
        RowWriter {
            q: Disjoint::new(&mut self.q),
            d: Disjoint::new(&mut self.d),
            s: Disjoint::new(&mut self.s),
            qsum: Disjoint::new(&mut self.qsum),
            hsum: Disjoint::new(&mut self.hsum),
            tail_d: Disjoint::new(&mut self.tail_d),
            tail_sum: Disjoint::new(&mut self.tail_sum),
            grouped: Disjoint::new(&mut self.grouped),
            cols,
            n_tokens,
        }
    }
}

/// Writes quantized rows into a [`QuantizedRows`] from several threads (see
/// [`QuantizedRows::writer`]).
pub struct RowWriter<'a> {
    q: Disjoint<'a, i8>,
    d: Disjoint<'a, f32>,
    s: Disjoint<'a, f32>,
    qsum: Disjoint<'a, i32>,
    hsum: Disjoint<'a, i32>,
    tail_d: Disjoint<'a, f32>,
    tail_sum: Disjoint<'a, i32>,
    grouped: Disjoint<'a, i8>,
    cols: usize,
    n_tokens: usize,
}

impl RowWriter<'_> {
    /// Quantizes rows `tokens` of `x` ([n_tokens][cols]) with the kernels of `isa` (an
    /// available one: the model's).
    ///
    /// # Safety
    /// No other thread may write the same rows at the same time.
    pub unsafe fn quantize(&self, isa: Isa, x: &[f32], tokens: std::ops::Range<usize>) {
        assert!(tokens.end <= self.n_tokens && x.len() >= tokens.end * self.cols && isa.available());
        // SAFETY: `isa` is available (asserted), and the caller gives this call rows `tokens`
        // alone, which is `quantize_rows`' precondition.
        unsafe {
            match isa {
                Isa::Scalar => self.quantize_rows::<false>(x, tokens),
                // The scalar code vectorized by the compiler: the same IEEE operations (Rust never
                // contracts to FMA), so the same codes.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => self.quantize_avx2(x, tokens),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => self.quantize_avx512(x, tokens),
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!("no SIMD path on this architecture"),
            }
        }
    }

    /// # Safety
    /// As for [`Self::quantize_rows`], on a CPU with AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn quantize_avx2(&self, x: &[f32], tokens: std::ops::Range<usize>) {
        // SAFETY: the caller's precondition is `quantize_rows`'.
        unsafe { self.quantize_rows::<false>(x, tokens) }
    }

    /// # Safety
    /// As for [`Self::quantize_rows`], on a CPU with AVX-512 (F, BW, VL).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    unsafe fn quantize_avx512(&self, x: &[f32], tokens: std::ops::Range<usize>) {
        // SAFETY: the caller's precondition is `quantize_rows`', and the CPU has AVX-512, which
        // its `AVX512` instance uses.
        unsafe { self.quantize_rows::<true>(x, tokens) }
    }

    /// # Safety
    /// `tokens.end <= self.n_tokens` and `x` holds them; no other thread may write rows
    /// `tokens` at the same time; if `AVX512`, the CPU must have AVX-512 (F, BW, VL).
    #[inline(always)]
    unsafe fn quantize_rows<const AVX512: bool>(&self, x: &[f32], tokens: std::ops::Range<usize>) {
        // SAFETY: rows `tokens` are the caller's alone (this function's precondition), so no
        // other thread accesses the slices of `Disjoint::slice` while they live.
        unsafe {
            let cols = self.cols;
            let (qs, ls, cg) = (wide_chunks(cols) * CHUNK_BYTES + if narrow_groups(cols) > 0 { NARROW_BYTES } else { 0 }, chunks(cols) * CHUNK_GROUPS, CHUNK_GROUPS);
            for t in tokens {
                let row = &x[t * cols..(t + 1) * cols];
                // SAFETY: row t's parts, which the caller gives this thread alone.
                let q = self.q.slice(t * qs..(t + 1) * qs);
                let (d, s, qsum) = (self.d.slice(t * ls..(t + 1) * ls), self.s.slice(t * ls..(t + 1) * ls), self.qsum.slice(t * ls..(t + 1) * ls));
                let hsum = self.hsum.slice(t * ls..(t + 1) * ls);
                let (tail_d, tail_sum) = (self.tail_d.slice(t * cg..(t + 1) * cg), self.tail_sum.slice(t * cg..(t + 1) * cg));
                let grouped = self.grouped.slice(t * cols..(t + 1) * cols);
                quantize_row::<AVX512>(row, [q, grouped], d, s, [qsum, hsum], tail_d, tail_sum);
            }
        }
    }
}

/// One row into its slices of the buffers (shapes as in [`QuantizedRows`], one token), its
/// groups by [`x86::quantize_group`] if `AVX512` (inlined into an AVX-512 caller), else by
/// [`quantize_group`].
#[inline(always)]
fn quantize_row<const AVX512: bool>(row: &[f32], codes_out: [&mut [i8]; 2], d: &mut [f32], s: &mut [f32], sums: [&mut [i32]; 2], tail_d: &mut [f32], tail_sum: &mut [i32]) {
    let ([q, grouped], [qsum, hsum]) = (codes_out, sums);
    let cols = row.len();
    // Padding of the last chunk.
    let wide = wide_chunks(cols);
    q[(cols / GROUP / CHUNK_GROUPS) * CHUNK_BYTES..].fill(0);
    d[cols / GROUP..].fill(0.0);
    s[cols / GROUP..].fill(0.0);
    qsum[cols / GROUP..].fill(0);
    hsum[cols / GROUP..].fill(0);
    tail_d.fill(0.0);
    tail_sum.fill(0);
    for (g, values) in row.chunks_exact(GROUP).enumerate() {
        let values = values.try_into().unwrap();
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX512 is set only by the AVX-512 caller.
        let (codes, dg) = if AVX512 { unsafe { x86::quantize_group(values) } } else { quantize_group(values) };
        #[cfg(not(target_arch = "x86_64"))]
        let (codes, dg) = quantize_group(values);
        grouped[GROUP * g..GROUP * (g + 1)].copy_from_slice(&codes);
        let (c, l) = (g / CHUNK_GROUPS, g % CHUNK_GROUPS);
        if c < wide {
            // Word k (codes 4k..4k + 4) goes to lane l of word k of the chunk.
            for k in 0..GROUP / 4 {
                let dst = c * CHUNK_BYTES + (k * CHUNK_GROUPS + l) * 4;
                q[dst..dst + 4].copy_from_slice(&codes[4 * k..4 * k + 4]);
            }
        } else {
            // Narrow: codes 16h + 4w .. + 4 go to lane 4l + w of half h.
            for h in 0..2 {
                let dst = c * CHUNK_BYTES + h * CHUNK_GROUPS * 4 + 16 * l;
                q[dst..dst + 16].copy_from_slice(&codes[16 * h..16 * h + 16]);
            }
            for w in 0..4 {
                tail_d[4 * l + w] = dg;
                tail_sum[4 * l + w] = (0..4).map(|b| codes[4 * w + b] as i32 + codes[16 + 4 * w + b] as i32).sum();
            }
        }
        let sum: i32 = codes.iter().map(|&c| c as i32).sum();
        d[g] = dg;
        qsum[g] = sum;
        hsum[g] = codes[..16].iter().map(|&c| c as i32).sum();
        s[g] = dg * sum as f32;
    }
}

/// One group's codes and scale `d`, by the definitions in the module docs.
#[inline(always)]
pub fn quantize_group(x: &[f32; GROUP]) -> ([i8; GROUP], f32) {
    // max is exact, so any order gives the same `a`; this one vectorizes.
    let mut m = [0f32; 8];
    for j in 0..GROUP / 8 {
        for l in 0..8 {
            m[l] = m[l].max(x[8 * j + l].abs());
        }
    }
    let a = m.iter().fold(0f32, |acc, &v| acc.max(v));
    let d = a / 127.0;
    let mut q = [0i8; GROUP];
    if d != 0.0 {
        for (q, &v) in q.iter_mut().zip(x) {
            let v = v / d;
            // NaN to 0, then into [-128, 128], where the rounding below is exact.
            let v = if v.is_nan() { 0.0 } else { v.clamp(-128.0, 128.0) };
            *q = round_half_away(v).clamp(-127, 127) as i8;
        }
    }
    (q, d)
}

/// [`quantize_group`] in AVX-512 instructions, operation for operation.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::GROUP;
    use std::arch::x86_64::*;

    /// The scalar [`super::quantize_group`]'s operations on two 16-lane halves: the same
    /// exact `max`, one division `a / 127`, the quotients `x / d` by one IEEE division each,
    /// NaN to 0, the clamp to `[-128, 128]`, and rounding half away from zero as truncation
    /// plus a step when the (exact) remainder is at least one half.
    ///
    /// # Safety
    /// The CPU must have AVX-512 (F, BW, VL).
    #[inline(always)]
    pub unsafe fn quantize_group(x: &[f32; GROUP]) -> ([i8; GROUP], f32) {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) (this function's precondition); the loads
        // read `x`'s 32 values.
        unsafe {
            let halves = [_mm512_loadu_ps(x.as_ptr()), _mm512_loadu_ps(x.as_ptr().add(16))];
            // (No closures here: they would not inherit the caller's target features.)
            let abs = [_mm512_abs_ps(halves[0]), _mm512_abs_ps(halves[1])];
            // maxps gives its second operand when one is NaN: the running maximum, which is never
            // NaN, so NaNs are skipped as by f32::max. max is exact: any order gives the same `a`.
            let m = _mm512_max_ps(abs[1], _mm512_max_ps(abs[0], _mm512_setzero_ps()));
            let a = _mm512_reduce_max_ps(m);
            let d = a / 127.0;
            let mut q = [0i8; GROUP];
            if d != 0.0 {
                let dv = _mm512_set1_ps(d);
                for (h, &v) in halves.iter().enumerate() {
                    let v = _mm512_div_ps(v, dv);
                    let v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v), v);
                    let v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-128.0)), _mm512_set1_ps(128.0));
                    let t = _mm512_cvttps_epi32(v);
                    let frac = _mm512_sub_ps(v, _mm512_cvtepi32_ps(t));
                    let one = _mm512_set1_epi32(1);
                    let t = _mm512_mask_add_epi32(t, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5)), t, one);
                    let t = _mm512_mask_sub_epi32(t, _mm512_cmp_ps_mask::<_CMP_LE_OQ>(frac, _mm512_set1_ps(-0.5)), t, one);
                    let t = _mm512_min_epi32(_mm512_max_epi32(t, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
                    _mm_storeu_si128(q.as_mut_ptr().add(16 * h).cast(), _mm512_cvtepi32_epi8(t));
                }
            }
            (q, d)
        }
    }
}

/// `v` (in `[-128, 128]`) rounded half away from zero, as `roundf`, in operations the
/// compiler can vectorize: truncate, then step away from zero when the remainder (exact for
/// any f32) is at least one half.
#[inline(always)]
fn round_half_away(v: f32) -> i32 {
    debug_assert!((-128.0..=128.0).contains(&v));
    // SAFETY: v is finite and in i32's range.
    let t = unsafe { v.to_int_unchecked::<i32>() };
    let frac = v - t as f32;
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}
