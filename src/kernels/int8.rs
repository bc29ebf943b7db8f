//! The `precision = "int8"` kernels: packed quantized weight rows (Q4_0, Q4_1, Q8_0, codes
//! in the chunked layout of [`super::packed`]; Q5_0 and Q5_1 in that of [`super::q5`]; the
//! K-quants in those of [`super::kquant`] and [`super::kquant_low`]) against activation rows
//! quantized per group of 32 by [`super::quantize_act`].
//!
//! Canonical operation order for one output (weight row `w`, activation row `x`). Groups
//! come in chunks of 16; lane `l` of chunk `c` is group `g = 16c + l`. Per chunk:
//!
//! 1. `isum[l]` = the group's integer dot product, exact in i32:
//!    `sum_i q_w[i] * q_x[i]` with `q_w` the code (Q8_0: signed byte; Q4_1: nibble `0..15`;
//!    Q4_0: nibble minus 8; Q5_1: 5-bit `0..31`; Q5_0: 5-bit minus 16).
//!    `|isum| <= 32 * 128 * 127 < 2^24`, so `f32(isum)` is exact;
//! 2. `dd[l] = d_w[g] * d_x[g]` (f32 multiplication, `d_w` the f16 scale converted exactly);
//! 3. `acc = fma(dd, f32(isum), acc)`;
//! 4. Q4_1 and Q5_1 only: `acc = fma(m_w[g], s_x[g], acc)` (`s_x = d_x * qsum_x`, see
//!    `quantize_act`).
//!
//! `acc` (16 f32 lanes) starts at zero; lanes past the last group have `d_w = m_w = 0`,
//! `isum = 0`. A narrow last chunk (`n <= 4` groups, see `quantize_act`) has lane
//! `L = 4g + w` hold 8 values of group `g` (values `4w..4w + 4` and `16 + 4w..16 + 4w + 4`):
//! there step 1 is that lane's exact 8-value dot `psum[L]`, step 2 uses `d_w`, `d_x` of the
//! lane's group, step 3 is `acc = fma(dd, f32(psum), acc)`, and step 4 (Q4_1) is as for a
//! full chunk (lane `l` = group `16c + l`). The result is `reduce(acc)` with the fixed tree of
//! [`super::lanes::Lanes16::reduce`]. Integer sums may be formed in any order (they are
//! exact), so each ISA computes `isum` its own way:
//!
//! - scalar twin: the products summed directly;
//! - AVX-512 VNNI: `vpdpbusd` (u8 x s8, 4 products per i32 lane, no saturation). Q4 codes are
//!   unsigned already (Q4_0 subtracts `8 * qsum_x` after); Q8_0 codes are biased to
//!   unsigned with `q ^ 0x80 = q + 128` and `128 * qsum_x` is subtracted after;
//! - AVX2: `vpmaddubsw` (u8 x s8 pairs to saturating i16) then `vpmaddwd` with ones. Bounds
//!   are in the comments at each use; nothing saturates.
//!
//! Each output's sequence depends only on the shapes, never on the tile, the thread's rows
//! or the number of tokens in the call.
//!
//! The K-quant types (layout in [`super::kquant`]; rows are whole super-blocks of 8 groups,
//! so a last chunk has 8 or 16 groups and is never narrow) follow the same four steps:
//!
//! - Q4_K is Q4_1 with its group scale and offset computed in the kernel from the
//!   super-block header: `d_w = d * sc` and `m_w = -(dmin * m)` (f32 products of an f16 and
//!   a 6-bit integer: exact). Step 1 is the nibble dot `sum q x` (`q` in `0..16`), steps 2-4
//!   as for Q4_1.
//! - Q5_K is Q4_K with 5-bit codes `q` in `0..32` (bit 4 unpacked from a fifth code word):
//!   `|isum| <= 32 * 31 * 127`.
//! - Q6_K has two int8 scales per group (`sc_0` for values `0..16`, `sc_1` for `16..32`)
//!   and they are folded into the exact integer sum: step 1 is
//!   `isum = sc_0 * sum_{i<16} q_i x_i + sc_1 * sum_{i>=16} q_i x_i` with `q = u - 32` in
//!   `-32..32`. Each half sum is at most `16 * 32 * 127 = 65024` in magnitude and
//!   `|sc| <= 128`, so `|isum| <= 2 * 128 * 65024 = 16646144 < 2^24`: exact in i32 and in
//!   f32. Step 2 uses the super-block's `d_w = d` (f16, exact), step 3 as above, no step 4.
//!   Each ISA takes the unsigned `u` and subtracts `32 * ` the activation codes' half sums
//!   (`hsum` and `qsum - hsum` of [`super::quantize_act`]).
//! - Q3_K is Q6_K with 3-bit codes `c` in `-4..4` and 6-bit sub-block scales `sc` in
//!   `-32..32` (unpacked in the kernel from ggml's 12 bytes): step 1 is
//!   `isum = sc_0 * sum_{i<16} c_i x_i + sc_1 * sum_{i>=16} c_i x_i`, at most
//!   `2 * 32 * 16 * 4 * 127 = 520192` in magnitude; steps 2 and 3 as Q6_K's. The ISAs take
//!   `c + 32` as Q6_K's `u` and the same dot product.
//!
//! Q5_0 and Q5_1 (rows of groups of 32, so a last chunk may be narrow) are Q4_0 and Q4_1 with
//! 5-bit codes: `|isum| <= 32 * 31 * 127` (Q5_1), `32 * 16 * 127` (Q5_0); a narrow chunk's
//! lanes take the 5-bit codes of their 8 values.

// Lane, token and row indices address several arrays at once in these loops.
#![allow(clippy::needless_range_loop)]

use std::ops::Range;

use super::lanes::{Lanes16, Scalar16};
use super::kquant::{q4k_scales_mins, Q4K_HEADER, SUPER_GROUPS};
use super::packed::{code_bytes, is_int8_packable, layout_row_bytes, Layout};
use super::quantize_act::{narrow_groups, wide_chunks, QuantizedRows, CHUNK_BYTES, CHUNK_GROUPS};
use super::{check_out, f16_chunk, prefetch, Disjoint, Isa, MatRef, GROUP, PREFETCH_ROWS, TOKEN_BLOCK};
use super::{kquant_low, q5};
use crate::tensor::{GgmlType, KernelGroup};

/// `[e(0), e(1), ..., e(n - 1)]` for an expression `e` of the index, written in place rather
/// than in a closure: a closure does not inherit the caller's target features, so its
/// intrinsics can stay calls (a closure-taking helper here once compiled to one).
macro_rules! per_index {
    ($n:expr, |$i:ident| $e:expr) => {{
        let mut out = {
            let $i = 0;
            [$e; $n]
        };
        for $i in 1..$n {
            out[$i] = $e;
        }
        out
    }};
}

/// For every row `r` in `rows` and token `t`: `out[t * token_stride + r]` = row `r` of `w`
/// (packed, chunked layout) against token `t` of `act`, by the order in the module docs.
///
/// # Safety
/// No other thread may touch those elements of `out` during the call.
pub unsafe fn matmul_rows_int8(isa: Isa, w: &MatRef, act: &QuantizedRows, rows: Range<usize>, out: Disjoint<f32>, token_stride: usize) {
    assert_eq!(w.cols, act.cols);
    check_out(&out, token_stride, act.n_tokens, &rows);
    assert!(is_int8_packable(w.ty) && w.cols.is_multiple_of(w.ty.block_size().max(GROUP)) && rows.end <= w.rows);
    assert_eq!(w.data.len(), w.rows * layout_row_bytes(w.ty, Layout::Chunked, w.cols));
    let (qs, ls) = (act.q_stride(), act.lane_stride());
    assert!(act.q.len() >= act.n_tokens * qs);
    assert!(act.d.len() >= act.n_tokens * ls && act.s.len() >= act.n_tokens * ls && act.qsum.len() >= act.n_tokens * ls);
    assert!(act.hsum.len() >= act.n_tokens * ls);
    assert!(act.tail_d.len() >= act.n_tokens * CHUNK_GROUPS && act.tail_sum.len() >= act.n_tokens * CHUNK_GROUPS);
    assert!(isa.int8_available(), "the {} int8 kernels cannot run on this CPU", isa.name());
    crate::count::mults(rows.len() * act.n_tokens * w.cols);
    match isa {
        Isa::Scalar => by_type::<ScalarI32>(w, act, rows, out, token_stride),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2(w, act, rows, out, token_stride),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => x86::avx512(w, act, rows, out, token_stride),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no SIMD path on this architecture"),
    }
}

/// Sixteen i32 lanes (lane `l` = group `16c + l` of a chunk), one implementation per ISA.
pub(crate) trait IntLanes: Copy {
    /// The f32 lanes of the same ISA.
    type F: Lanes16;
    /// One chunk of nibble codes, unpacked to 8 words of 16 lanes x 4 bytes: word `k < 4`
    /// holds the low nibbles of code word `k` (values `4k..4k+4` of each group), word `k + 4`
    /// the high nibbles (values `16 + 4k..`), matching activation word `k`.
    type Q4: Copy;
    /// One chunk of Q8_0 codes, prepared for this ISA's dot product.
    type Q8: Copy;
    /// Nibble codes of a chunk of `n` (1 to 16) groups at `codes`; missing lanes are zero.
    unsafe fn q4(codes: *const u8, n: usize) -> Self::Q4;
    /// Q8_0 codes of a chunk of `n` (1 to 16) groups at `codes`; missing lanes are zero.
    unsafe fn q8(codes: *const u8, n: usize) -> Self::Q8;
    /// Lane `l`: `sum over the group's 32 values of code (0..15) * x` (one chunk of `x`).
    unsafe fn dot_q4(w: &Self::Q4, x: *const i8) -> Self;
    /// Lane `l`: `sum of signed code * x`; `qsum` is the chunk's 16 activation code sums.
    unsafe fn dot_q8(w: &Self::Q8, x: *const i8, qsum: *const i32) -> Self;
    /// 5-bit codes (`0..32`, Q5_K's and Q5_0's layout) of a wide chunk of `n` (1 to 16)
    /// groups at `codes`, unpacked to 8 words as `Q4`; missing lanes are zero.
    unsafe fn q5(codes: *const u8, n: usize) -> Self::Q4;
    /// The 5-bit codes of a narrow chunk of `n <= 4` groups ([`super::q5`]: `16 n` nibble
    /// bytes in the grouped order, then `n` words of high bits) as `t4` unpacks nibbles:
    /// lane `4g + w` of half 0 values `4w..4w + 4` of group `g`, of half 1 values `16 + 4w..`.
    unsafe fn t5(codes: *const u8, n: usize) -> Self::T4;
    /// Q3_K codes of a chunk of `n` (8 or 16) groups at `codes` ([`super::kquant_low`]) as
    /// Q6_K's: `u = c + 32`, with the sub-block scales at `sub` (`[n][2]` i8).
    unsafe fn q3(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6;
    /// Lane `l`: `sum of code (0..31) * x`; by default `dot_q4`'s sums, which have room for
    /// 5-bit codes unless an ISA overrides this.
    #[inline(always)]
    unsafe fn dot_q5(w: &Self::Q4, x: *const i8) -> Self {
        Self::dot_q4(w, x)
    }
    /// One chunk of Q6_K codes (`u = q + 32`, unpacked to 8 words as `Q4`) and the lanes'
    /// two sub-block scales.
    type Q6: Copy;
    /// Q6_K codes of a chunk of `n` (8 or 16) groups at `codes`, sub-block scales at `sub`
    /// (`[n][2]` i8); missing lanes are zero.
    unsafe fn q6(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6;
    /// Lane `l`: `sc_0 (sum_{i<16} u x - 32 hsum) + sc_1 (sum_{i>=16} u x - 32 (qsum - hsum))`.
    unsafe fn dot_q6(w: &Self::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> Self;
    /// Q4_K's `d_w = d * sc` and `m_w = -(dmin * m)` of a chunk of `n` (8 or 16) groups from
    /// the super-block headers at `h` (16 bytes each); zero past `n`. Every product is exact,
    /// so the default (plain code) and an ISA's own way give the same bits.
    #[inline(always)]
    unsafe fn q4k_scales(h: *const u8, n: usize) -> (Self::F, Self::F) {
        let (mut dw, mut mw) = ([0f32; 16], [0f32; 16]);
        for b in 0..n / SUPER_GROUPS {
            let h = h.add(Q4K_HEADER * b);
            let (sc, m) = q4k_scales_mins(h);
            let (d, dmin) = (f16_at(h), f16_at(h.add(2)));
            for j in 0..SUPER_GROUPS {
                dw[SUPER_GROUPS * b + j] = d * sc[j] as f32;
                mw[SUPER_GROUPS * b + j] = -(dmin * m[j] as f32);
            }
        }
        (<Self::F as Lanes16>::load(dw.as_ptr()), <Self::F as Lanes16>::load(mw.as_ptr()))
    }
    /// Q6_K's `d_w`: lane `l` the f16 `d` of super-block `l / 8` (at `d + 2 (l / 8)`), for a
    /// chunk of `n` (8 or 16) groups; zero past `n`.
    #[inline(always)]
    unsafe fn q6k_scales(d: *const u8, n: usize) -> Self::F {
        let mut dw = [0f32; 16];
        for b in 0..n / SUPER_GROUPS {
            dw[SUPER_GROUPS * b..SUPER_GROUPS * (b + 1)].fill(f16_at(d.add(2 * b)));
        }
        <Self::F as Lanes16>::load(dw.as_ptr())
    }
    /// `self - 8 * qsum` lane-wise.
    unsafe fn minus_8_qsum(self, qsum: *const i32) -> Self;
    /// `self - 16 * qsum` lane-wise (exact: the bounds in the module docs).
    #[inline(always)]
    unsafe fn minus_16_qsum(self, qsum: *const i32) -> Self {
        self.minus_8_qsum(qsum).minus_8_qsum(qsum)
    }
    /// Exact conversion (every value is below 2^24 in magnitude).
    unsafe fn to_f32(self) -> Self::F;
    /// A narrow chunk's nibble codes (`n <= 4` groups, `16n` bytes, lane `4g + w` = code
    /// bytes `16g + 4w..`): low nibbles (half 0), high nibbles (half 1).
    type T4: Copy;
    /// A narrow chunk's Q8_0 codes (half `h` at `codes + 16n h`), prepared.
    type T8: Copy;
    unsafe fn t4(codes: *const u8, n: usize) -> Self::T4;
    unsafe fn t8(codes: *const u8, n: usize) -> Self::T8;
    /// Lane `L`: the 8-value dot of the narrow chunk (`x`: its 128 activation bytes).
    unsafe fn dot_t4(w: &Self::T4, x: *const i8) -> Self;
    /// As `dot_t4` with signed codes; `lane_sum` holds the 16 lanes' activation code sums.
    unsafe fn dot_t8(w: &Self::T8, x: *const i8, lane_sum: *const i32) -> Self;
    /// Lane `L` of the result is lane `L / 4` of `v` (a narrow chunk's per-lane scales).
    unsafe fn spread4(v: Self::F) -> Self::F;
    /// Wide chunk `c` of an `NR x NT` tile into `acc`, as [`wide_chunk_dots`] (which an ISA
    /// may replace by any exact way of forming the integer sums).
    #[inline(always)]
    unsafe fn wide_chunk<K: Kind, const NR: usize, const NT: usize>(
        rows: &[*const u8; NR],
        d_ptr: &[*const u8; NR],
        groups: usize,
        c: usize,
        x: &Acts,
        acc: &mut [[Self::F; NT]; NR],
    ) {
        wide_chunk_dots::<Self, K, NR, NT>(rows, d_ptr, groups, c, x, acc)
    }
}

/// How one weight type's chunk enters the integer dot product.
pub(crate) trait Kind {
    const CODE_BYTES: usize;
    /// Q4_1's `m * s` term.
    const OFFSET: bool;
    /// Whether the codes are 8 words of one byte per value (Q8_0) or 4 of nibbles, which
    /// AVX-512's several-token path takes word by word (Q6_K's 6-bit codes are not).
    const WORD_PAIRS: bool = true;
    type W<D: IntLanes>: Copy;
    /// A chunk's codes at `codes` (`n` groups); `sub`: the chunk's sub-block scales
    /// ([`Kind::sub_ptr`]).
    unsafe fn prep<D: IntLanes>(codes: *const u8, sub: *const u8, n: usize) -> Self::W<D>;
    /// Where the sub-block scales of the chunk starting at group `g0` are, for a row whose
    /// scales part starts at `s` (`groups` groups): by default 2 bytes per group (Q6_K's).
    #[inline(always)]
    unsafe fn sub_ptr(s: *const u8, _groups: usize, g0: usize) -> *const u8 {
        s.add(2 * g0)
    }
    /// `qsum`, `hsum`: the chunk's 16 activation code sums and first-half sums.
    unsafe fn isum<D: IntLanes>(w: &Self::W<D>, x: *const i8, qsum: *const i32, hsum: *const i32) -> D;
    /// The chunk's weight scales `d_w` and offsets `m_w` (zero if none) of groups
    /// `g0..g0 + n` of a row whose scales part starts at `s` (`groups` groups); zero past `n`.
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        let d = f16_chunk::<D::F>(s.add(2 * g0), n);
        let m = if Self::OFFSET { f16_chunk::<D::F>(s.add(2 * groups + 2 * g0), n) } else { <D::F as Lanes16>::zero() };
        (d, m)
    }
    /// The narrow last chunk: codes, and per-lane dots (`sums`: per-lane activation sums).
    type T<D: IntLanes>: Copy;
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> Self::T<D>;
    unsafe fn psum<D: IntLanes>(w: &Self::T<D>, x: *const i8, sums: *const i32) -> D;
    /// `log2` of the bias of the unsigned codes the SIMD dot products take, whose
    /// `bias * qsum_x` is subtracted after: Q4_0's nibbles are `q + 8`, Q8_0's bytes are
    /// biased by 128 for `vpdpbusd`; Q4_1's nibbles are the codes.
    const BIAS_LOG2: Option<u32>;
}

struct KQ4_0;
impl Kind for KQ4_0 {
    const CODE_BYTES: usize = 16;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = Some(3);
    type W<D: IntLanes> = D::Q4;
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        D::q4(codes, n)
    }
    /// `sum (q - 8) x = sum q x - 8 sum x`.
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, qsum: *const i32, _hsum: *const i32) -> D {
        D::dot_q4(w, x).minus_8_qsum(qsum)
    }
    type T<D: IntLanes> = D::T4;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T4 {
        D::t4(codes, n)
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T4, x: *const i8, sums: *const i32) -> D {
        D::dot_t4(w, x).minus_8_qsum(sums)
    }
}

struct KQ4_1;
impl Kind for KQ4_1 {
    const CODE_BYTES: usize = 16;
    const OFFSET: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    type W<D: IntLanes> = D::Q4;
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        D::q4(codes, n)
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, _qsum: *const i32, _hsum: *const i32) -> D {
        D::dot_q4(w, x)
    }
    type T<D: IntLanes> = D::T4;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T4 {
        D::t4(codes, n)
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T4, x: *const i8, _sums: *const i32) -> D {
        D::dot_t4(w, x)
    }
}

struct KQ8_0;
impl Kind for KQ8_0 {
    const CODE_BYTES: usize = 32;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = Some(7);
    type W<D: IntLanes> = D::Q8;
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q8 {
        D::q8(codes, n)
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q8, x: *const i8, qsum: *const i32, _hsum: *const i32) -> D {
        D::dot_q8(w, x, qsum)
    }
    type T<D: IntLanes> = D::T8;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T8 {
        D::t8(codes, n)
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T8, x: *const i8, sums: *const i32) -> D {
        D::dot_t8(w, x, sums)
    }
}

/// Q4_K: Q4_1's arithmetic with `d_w = d * sc`, `m_w = -(dmin * m)` from the super-block
/// headers (`[S][16]` after the codes).
struct KQ4K;
impl Kind for KQ4K {
    const CODE_BYTES: usize = 16;
    const OFFSET: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    type W<D: IntLanes> = D::Q4;
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        D::q4(codes, n)
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, _qsum: *const i32, _hsum: *const i32) -> D {
        D::dot_q4(w, x)
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, _groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        D::q4k_scales(s.add(Q4K_HEADER * (g0 / SUPER_GROUPS)), n)
    }
    type T<D: IntLanes> = D::T4;
    unsafe fn prep_tail<D: IntLanes>(_codes: *const u8, _n: usize) -> D::T4 {
        unreachable!("K-quant rows have no narrow chunk")
    }
    unsafe fn psum<D: IntLanes>(_w: &D::T4, _x: *const i8, _sums: *const i32) -> D {
        unreachable!("K-quant rows have no narrow chunk")
    }
}

/// Q5_K: Q4_K's arithmetic on 5-bit codes (`[G][20]` code bytes, then Q4_K's headers).
struct KQ5K;
impl Kind for KQ5K {
    const CODE_BYTES: usize = 20;
    const OFFSET: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q4;
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        D::q5(codes, n)
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, _qsum: *const i32, _hsum: *const i32) -> D {
        D::dot_q5(w, x)
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, _groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        D::q4k_scales(s.add(Q4K_HEADER * (g0 / SUPER_GROUPS)), n)
    }
    type T<D: IntLanes> = D::T4;
    unsafe fn prep_tail<D: IntLanes>(_codes: *const u8, _n: usize) -> D::T4 {
        unreachable!("K-quant rows have no narrow chunk")
    }
    unsafe fn psum<D: IntLanes>(_w: &D::T4, _x: *const i8, _sums: *const i32) -> D {
        unreachable!("K-quant rows have no narrow chunk")
    }
}

/// Q6_K: the sub-block scales folded into the integer sum, `d_w = d` of the super-block
/// (`[G][2]` i8 sub-block scales, then `[S]` f16 `d`, after the codes).
struct KQ6K;
impl Kind for KQ6K {
    const CODE_BYTES: usize = 24;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q6;
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, sub: *const u8, n: usize) -> D::Q6 {
        D::q6(codes, sub, n)
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> D {
        D::dot_q6(w, x, qsum, hsum)
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        (D::q6k_scales(s.add(2 * groups + 2 * (g0 / SUPER_GROUPS)), n), <D::F as Lanes16>::zero())
    }
    type T<D: IntLanes> = D::T4;
    unsafe fn prep_tail<D: IntLanes>(_codes: *const u8, _n: usize) -> D::T4 {
        unreachable!("K-quant rows have no narrow chunk")
    }
    unsafe fn psum<D: IntLanes>(_w: &D::T4, _x: *const i8, _sums: *const i32) -> D {
        unreachable!("K-quant rows have no narrow chunk")
    }
}

/// Q5_0: Q4_0's arithmetic on 5-bit codes `u - 16` ([`super::q5`]: `[G][20]` code bytes,
/// `[G]` f16 `d`).
struct KQ5_0;
impl Kind for KQ5_0 {
    const CODE_BYTES: usize = q5::CODE_BYTES;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = Some(4);
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q4;
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        D::q5(codes, n)
    }
    /// `sum (u - 16) x = sum u x - 16 sum x`.
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, qsum: *const i32, _hsum: *const i32) -> D {
        D::dot_q5(w, x).minus_16_qsum(qsum)
    }
    type T<D: IntLanes> = D::T4;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T4 {
        D::t5(codes, n)
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T4, x: *const i8, sums: *const i32) -> D {
        D::dot_t4(w, x).minus_16_qsum(sums)
    }
}

/// Q5_1: Q4_1's arithmetic on 5-bit codes ([`super::q5`]: `[G][20]` code bytes, `[G]` f16
/// `d`, `[G]` f16 `m`).
struct KQ5_1;
impl Kind for KQ5_1 {
    const CODE_BYTES: usize = q5::CODE_BYTES;
    const OFFSET: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q4;
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        D::q5(codes, n)
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, _qsum: *const i32, _hsum: *const i32) -> D {
        D::dot_q5(w, x)
    }
    type T<D: IntLanes> = D::T4;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T4 {
        D::t5(codes, n)
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T4, x: *const i8, _sums: *const i32) -> D {
        D::dot_t4(w, x)
    }
}

/// Q3_K: Q6_K's arithmetic on 3-bit codes, the sub-block scales unpacked from ggml's 12
/// bytes per super-block ([`super::kquant_low`]: `[G][12]` code bytes, `[S][12]` scales,
/// `[S]` f16 `d`).
struct KQ3K;
impl Kind for KQ3K {
    const CODE_BYTES: usize = kquant_low::CODE_BYTES;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q6;
    #[inline(always)]
    unsafe fn sub_ptr(s: *const u8, _groups: usize, g0: usize) -> *const u8 {
        s.add(kquant_low::SCALE_BYTES * (g0 / SUPER_GROUPS))
    }
    /// `sub`: the packed scales of the chunk's first super-block (the second's follow).
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, sub: *const u8, n: usize) -> D::Q6 {
        let mut pairs = [0i8; 32];
        for b in 0..n / SUPER_GROUPS {
            // SAFETY: the row's scales part holds a chunk's (one or two) super-blocks' 12
            // bytes each from `sub` on; a byte array needs no alignment.
            let packed = &*sub.add(kquant_low::SCALE_BYTES * b).cast::<[u8; kquant_low::SCALE_BYTES]>();
            pairs[16 * b..16 * (b + 1)].copy_from_slice(&kquant_low::q3k_scales(packed));
        }
        D::q3(codes, pairs.as_ptr().cast(), n)
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> D {
        D::dot_q6(w, x, qsum, hsum)
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        let d = s.add(kquant_low::SCALE_BYTES * (groups / SUPER_GROUPS) + 2 * (g0 / SUPER_GROUPS));
        (D::q6k_scales(d, n), <D::F as Lanes16>::zero())
    }
    type T<D: IntLanes> = D::T4;
    unsafe fn prep_tail<D: IntLanes>(_codes: *const u8, _n: usize) -> D::T4 {
        unreachable!("K-quant rows have no narrow chunk")
    }
    unsafe fn psum<D: IntLanes>(_w: &D::T4, _x: *const i8, _sums: *const i32) -> D {
        unreachable!("K-quant rows have no narrow chunk")
    }
}

/// The f16 at `p` (little-endian), exactly converted.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_le_bytes([*p, *p.add(1)]).to_f32()
}

#[inline(always)]
unsafe fn by_type<D: IntLanes>(w: &MatRef, act: &QuantizedRows, rows: Range<usize>, out: Disjoint<f32>, token_stride: usize) {
    match w.ty {
        GgmlType::Q4_K => tiles::<D, KQ4K>(w, act, rows, out, token_stride),
        GgmlType::Q5_K => tiles::<D, KQ5K>(w, act, rows, out, token_stride),
        GgmlType::Q6_K => tiles::<D, KQ6K>(w, act, rows, out, token_stride),
        GgmlType::Q3_K => tiles::<D, KQ3K>(w, act, rows, out, token_stride),
        GgmlType::Q5_0 => tiles::<D, KQ5_0>(w, act, rows, out, token_stride),
        GgmlType::Q5_1 => tiles::<D, KQ5_1>(w, act, rows, out, token_stride),
        _ => match w.ty.kernel() {
            KernelGroup::Q4_0 => tiles::<D, KQ4_0>(w, act, rows, out, token_stride),
            KernelGroup::Q4_1 => tiles::<D, KQ4_1>(w, act, rows, out, token_stride),
            KernelGroup::Q8_0 => tiles::<D, KQ8_0>(w, act, rows, out, token_stride),
            _ => unreachable!("checked by is_int8_packable"),
        },
    }
}

/// Token blocks, then rows, then tiles of up to 2 rows x 4 tokens (as the f32 kernels).
#[inline(always)]
unsafe fn tiles<D: IntLanes, K: Kind>(w: &MatRef, act: &QuantizedRows, rows: Range<usize>, out: Disjoint<f32>, token_stride: usize) {
    debug_assert_eq!(K::CODE_BYTES, code_bytes(w.ty));
    let row_bytes = layout_row_bytes(w.ty, Layout::Chunked, w.cols);
    let tile_rows = if act.n_tokens > 1 { 2 } else { 1 };
    for t_block in (0..act.n_tokens).step_by(TOKEN_BLOCK) {
        let tokens = t_block..(t_block + TOKEN_BLOCK).min(act.n_tokens);
        let mut r = rows.start;
        while r < rows.end {
            let nr = tile_rows.min(rows.end - r);
            let row = w.data.as_ptr().add(r * row_bytes);
            let ahead = (r + nr + PREFETCH_ROWS).min(rows.end).saturating_sub(r + PREFETCH_ROWS);
            prefetch(row.add(PREFETCH_ROWS * row_bytes), ahead * row_bytes);
            let mut t = tokens.start;
            while t < tokens.end {
                let x = Acts::at(act, t);
                let o = out.at(t * token_stride + r);
                let (c, s) = (w.cols, token_stride);
                t += match (nr, tokens.end - t) {
                    (1, 1) => tile::<D, K, 1, 1>(row, row_bytes, c, &x, o, s),
                    (1, 2) => tile::<D, K, 1, 2>(row, row_bytes, c, &x, o, s),
                    (1, 3) => tile::<D, K, 1, 3>(row, row_bytes, c, &x, o, s),
                    (1, _) => tile::<D, K, 1, 4>(row, row_bytes, c, &x, o, s),
                    (_, 1) => tile::<D, K, 2, 1>(row, row_bytes, c, &x, o, s),
                    (_, 2) => tile::<D, K, 2, 2>(row, row_bytes, c, &x, o, s),
                    (_, 3) => tile::<D, K, 2, 3>(row, row_bytes, c, &x, o, s),
                    (_, _) => tile::<D, K, 2, 4>(row, row_bytes, c, &x, o, s),
                };
            }
            r += nr;
        }
    }
}

/// Pointers to the first token of a tile's quantized activations.
pub(crate) struct Acts {
    q: *const i8,
    d: *const f32,
    s: *const f32,
    qsum: *const i32,
    hsum: *const i32,
    tail_d: *const f32,
    tail_sum: *const i32,
    q_stride: usize,
    lane_stride: usize,
}

impl Acts {
    /// From token `t` of `act` on.
    #[inline(always)]
    unsafe fn at(act: &QuantizedRows, t: usize) -> Acts {
        let (qs, ls) = (act.q_stride(), act.lane_stride());
        Acts {
            q: act.q.as_ptr().add(t * qs),
            d: act.d.as_ptr().add(t * ls),
            s: act.s.as_ptr().add(t * ls),
            qsum: act.qsum.as_ptr().add(t * ls),
            hsum: act.hsum.as_ptr().add(t * ls),
            tail_d: act.tail_d.as_ptr().add(t * CHUNK_GROUPS),
            tail_sum: act.tail_sum.as_ptr().add(t * CHUNK_GROUPS),
            q_stride: qs,
            lane_stride: ls,
        }
    }
}

/// `NR` consecutive packed rows (from `row`, `row_bytes` apart) against `NT` consecutive
/// tokens, each output by the canonical order; returns `NT`.
#[inline(always)]
unsafe fn tile<D: IntLanes, K: Kind, const NR: usize, const NT: usize>(
    row: *const u8,
    row_bytes: usize,
    cols: usize,
    x: &Acts,
    out: *mut f32,
    out_stride: usize,
) -> usize {
    let groups = cols / GROUP;
    let rows: [*const u8; NR] = std::array::from_fn(|r| row.add(r * row_bytes));
    let d_ptr = rows.map(|p| p.add(groups * K::CODE_BYTES));
    let mut acc = [[<D::F as Lanes16>::zero(); NT]; NR];
    for c in 0..wide_chunks(cols) {
        D::wide_chunk::<K, NR, NT>(&rows, &d_ptr, groups, c, x, &mut acc);
    }
    let n = narrow_groups(cols);
    if n > 0 {
        let g0 = groups - n;
        let w: [K::T<D>; NR] = per_index!(NR, |r| K::prep_tail::<D>(rows[r].add(g0 * K::CODE_BYTES), n));
        let (mut dw, mw) = chunk_scales::<D, K, NR>(&d_ptr, groups, g0, n);
        // Lane 4g + w: the scale of group g (zero past the groups).
        for d in &mut dw {
            *d = D::spread4(*d);
        }
        for t in 0..NT {
            let xq = x.q.add(t * x.q_stride + (g0 / CHUNK_GROUPS) * CHUNK_BYTES);
            let dx = <D::F as Lanes16>::load(x.tail_d.add(t * CHUNK_GROUPS));
            let sums = x.tail_sum.add(t * CHUNK_GROUPS);
            let sx = if K::OFFSET { <D::F as Lanes16>::load(x.s.add(t * x.lane_stride + g0)) } else { <D::F as Lanes16>::zero() };
            for r in 0..NR {
                let psum = K::psum::<D>(&w[r], xq, sums);
                acc[r][t] = scale_add::<D::F, K>(acc[r][t], psum.to_f32(), dw[r], dx, mw[r], sx);
            }
        }
    }
    for r in 0..NR {
        for t in 0..NT {
            *out.add(t * out_stride + r) = acc[r][t].reduce();
        }
    }
    NT
}

/// Wide chunk `c` of an `NR x NT` tile into `acc` (steps 1 to 4 of the module docs), with
/// each `(row, token)` dot product formed whole by `K::isum`. `rows`: the tile's code rows;
/// `d_ptr`: their scales (then Q4_1's offsets); `groups`: per row.
#[inline(always)]
unsafe fn wide_chunk_dots<D: IntLanes, K: Kind, const NR: usize, const NT: usize>(
    rows: &[*const u8; NR],
    d_ptr: &[*const u8; NR],
    groups: usize,
    c: usize,
    x: &Acts,
    acc: &mut [[D::F; NT]; NR],
) {
    let g0 = c * CHUNK_GROUPS;
    let n = (groups - g0).min(CHUNK_GROUPS);
    let w: [K::W<D>; NR] = per_index!(NR, |r| K::prep::<D>(rows[r].add(g0 * K::CODE_BYTES), K::sub_ptr(d_ptr[r], groups, g0), n));
    let (dw, mw) = chunk_scales::<D, K, NR>(d_ptr, groups, g0, n);
    for t in 0..NT {
        let xq = x.q.add(t * x.q_stride + c * CHUNK_BYTES);
        let lane = t * x.lane_stride + g0;
        let dx = <D::F as Lanes16>::load(x.d.add(lane));
        let sx = if K::OFFSET { <D::F as Lanes16>::load(x.s.add(lane)) } else { <D::F as Lanes16>::zero() };
        for r in 0..NR {
            let isum = K::isum::<D>(&w[r], xq, x.qsum.add(lane), x.hsum.add(lane));
            acc[r][t] = scale_add::<D::F, K>(acc[r][t], isum.to_f32(), dw[r], dx, mw[r], sx);
        }
    }
}

/// The chunk's weight scales `d_w` and (Q4_1, Q4_K) offsets `m_w` of each row, zero past
/// `n` groups ([`Kind::scales`]).
#[inline(always)]
unsafe fn chunk_scales<D: IntLanes, K: Kind, const NR: usize>(d_ptr: &[*const u8; NR], groups: usize, g0: usize, n: usize) -> ([D::F; NR], [D::F; NR]) {
    let both: [(D::F, D::F); NR] = per_index!(NR, |r| K::scales::<D>(d_ptr[r], groups, g0, n));
    (both.map(|b| b.0), both.map(|b| b.1))
}

/// Steps 2 to 4: `acc = fma(d_w d_x, isum, acc)`, then (Q4_1) `acc = fma(m_w, s_x, acc)`.
#[inline(always)]
unsafe fn scale_add<F: Lanes16, K: Kind>(acc: F, isum: F, dw: F, dx: F, mw: F, sx: F) -> F {
    let a = F::fma(F::mul(dw, dx), isum, acc);
    if K::OFFSET {
        F::fma(mw, sx, a)
    } else {
        a
    }
}

/// The portable twin: plain integer arithmetic.
#[derive(Clone, Copy)]
pub(crate) struct ScalarI32([i32; 16]);

/// Lane `l`: the sum over words `k` and bytes `b < 4` of `w[k][4l + b] * x[64k + 4l + b]`
/// (the scalar twin's exact integer dot products, codes `u8` or `i8`).
#[inline(always)]
unsafe fn lane_dots<C: Copy + Into<i32>, const WORDS: usize>(w: &[[C; 64]; WORDS], x: *const i8) -> ScalarI32 {
    ScalarI32(std::array::from_fn(|l| {
        let mut s = 0i32;
        for (k, word) in w.iter().enumerate() {
            for b in 0..4 {
                s += word[4 * l + b].into() * *x.add(64 * k + 4 * l + b) as i32;
            }
        }
        s
    }))
}

/// Q6_K's two sub-block scales of each of a chunk's `n` groups (`sub`: `[n][2]` i8), zero
/// past `n`.
#[inline(always)]
unsafe fn q6_sub_scales(sub: *const u8, n: usize) -> ([i32; 16], [i32; 16]) {
    let (mut s0, mut s1) = ([0i32; 16], [0i32; 16]);
    for l in 0..n {
        s0[l] = *sub.add(2 * l) as i8 as i32;
        s1[l] = *sub.add(2 * l + 1) as i8 as i32;
    }
    (s0, s1)
}

impl IntLanes for ScalarI32 {
    type F = Scalar16;
    #[inline(always)]
    unsafe fn q5(codes: *const u8, n: usize) -> Self::Q4 {
        let mut w = [[0u8; 64]; 8];
        for j in 0..4 {
            for i in 0..4 * n {
                let (b, high) = (*codes.add(4 * n * j + i), *codes.add(16 * n + i));
                w[j][i] = (b & 0x0F) | (((high >> j) & 1) << 4);
                w[j + 4][i] = (b >> 4) | (((high >> (j + 4)) & 1) << 4);
            }
        }
        w
    }
    #[inline(always)]
    unsafe fn t5(codes: *const u8, n: usize) -> Self::T4 {
        let mut w = [[0u8; 64]; 2];
        for i in 0..16 * n {
            // Lane 4g + v / 4 (value v % 4 of it): group g, word v / 4 of its bytes.
            let (g, k, b) = (i / 16, (i % 16) / 4, i % 4);
            let (c, high) = (*codes.add(i), *codes.add(16 * n + 4 * g + b));
            w[0][i] = (c & 0x0F) | (((high >> k) & 1) << 4);
            w[1][i] = (c >> 4) | (((high >> (k + 4)) & 1) << 4);
        }
        w
    }
    #[inline(always)]
    unsafe fn q3(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
        let mut w = [[0u8; 64]; 8];
        for (k, word) in w.iter_mut().enumerate() {
            for i in 0..4 * n {
                let low = (*codes.add(4 * n * (k / 4) + i) >> (2 * (k % 4))) & 3;
                let high = (*codes.add(8 * n + i) >> k) & 1;
                word[i] = (low | (high << 2)) + 28;
            }
        }
        let (s0, s1) = q6_sub_scales(sub, n);
        (w, s0, s1)
    }
    /// ([word][lane * 4 + byte] of `u`, `sc_0` per lane, `sc_1` per lane)
    type Q6 = ([[u8; 64]; 8], [i32; 16], [i32; 16]);
    #[inline(always)]
    unsafe fn q6(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
        let mut w = [[0u8; 64]; 8];
        for j in 0..4 {
            for i in 0..4 * n {
                let b = *codes.add(4 * n * j + i);
                let high = |h: usize| ((*codes.add(4 * n * (4 + h) + i) >> (2 * j)) & 3) << 4;
                w[j][i] = (b & 0x0F) | high(0);
                w[j + 4][i] = (b >> 4) | high(1);
            }
        }
        let (s0, s1) = q6_sub_scales(sub, n);
        (w, s0, s1)
    }
    #[inline(always)]
    unsafe fn dot_q6(w: &Self::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> Self {
        let (u, s0, s1) = w;
        let lo: &[[u8; 64]; 4] = u[..4].try_into().unwrap();
        let hi: &[[u8; 64]; 4] = u[4..].try_into().unwrap();
        let (lo, hi) = (lane_dots(lo, x), lane_dots(hi, x.add(256)));
        ScalarI32(std::array::from_fn(|l| {
            let (q, h) = (*qsum.add(l), *hsum.add(l));
            s0[l] * (lo.0[l] - 32 * h) + s1[l] * (hi.0[l] - 32 * (q - h))
        }))
    }
    /// [word][lane * 4 + byte]
    type Q4 = [[u8; 64]; 8];
    /// [word][lane * 4 + byte]
    type Q8 = [[i8; 64]; 8];
    #[inline(always)]
    unsafe fn q4(codes: *const u8, n: usize) -> Self::Q4 {
        let mut w = [[0u8; 64]; 8];
        for j in 0..4 {
            for i in 0..4 * n {
                let b = *codes.add(4 * n * j + i);
                w[j][i] = b & 0x0F;
                w[j + 4][i] = b >> 4;
            }
        }
        w
    }
    #[inline(always)]
    unsafe fn q8(codes: *const u8, n: usize) -> Self::Q8 {
        let mut w = [[0i8; 64]; 8];
        for (j, word) in w.iter_mut().enumerate() {
            for (i, v) in word.iter_mut().enumerate().take(4 * n) {
                *v = *codes.add(4 * n * j + i) as i8;
            }
        }
        w
    }
    #[inline(always)]
    unsafe fn dot_q4(w: &Self::Q4, x: *const i8) -> Self {
        lane_dots(w, x)
    }
    #[inline(always)]
    unsafe fn dot_q8(w: &Self::Q8, x: *const i8, _qsum: *const i32) -> Self {
        lane_dots(w, x)
    }
    #[inline(always)]
    unsafe fn minus_8_qsum(self, qsum: *const i32) -> Self {
        ScalarI32(std::array::from_fn(|l| self.0[l] - 8 * *qsum.add(l)))
    }
    #[inline(always)]
    unsafe fn to_f32(self) -> Scalar16 {
        Scalar16(self.0.map(|v| v as f32))
    }
    /// [half][lane * 4 + byte]
    type T4 = [[u8; 64]; 2];
    /// [half][lane * 4 + byte]
    type T8 = [[i8; 64]; 2];
    #[inline(always)]
    unsafe fn t4(codes: *const u8, n: usize) -> Self::T4 {
        let mut w = [[0u8; 64]; 2];
        for i in 0..16 * n {
            let b = *codes.add(i);
            w[0][i] = b & 0x0F;
            w[1][i] = b >> 4;
        }
        w
    }
    #[inline(always)]
    unsafe fn t8(codes: *const u8, n: usize) -> Self::T8 {
        let mut w = [[0i8; 64]; 2];
        for (h, half) in w.iter_mut().enumerate() {
            for (i, v) in half.iter_mut().enumerate().take(16 * n) {
                *v = *codes.add(16 * n * h + i) as i8;
            }
        }
        w
    }
    #[inline(always)]
    unsafe fn dot_t4(w: &Self::T4, x: *const i8) -> Self {
        lane_dots(w, x)
    }
    #[inline(always)]
    unsafe fn dot_t8(w: &Self::T8, x: *const i8, _lane_sum: *const i32) -> Self {
        lane_dots(w, x)
    }
    #[inline(always)]
    unsafe fn spread4(v: Scalar16) -> Scalar16 {
        Scalar16(std::array::from_fn(|l| v.0[l / 4]))
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::kernels::lanes::{Avx2x2, Avx512};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn avx2(w: &MatRef, act: &QuantizedRows, rows: Range<usize>, out: Disjoint<f32>, token_stride: usize) {
        by_type::<Avx2I32>(w, act, rows, out, token_stride)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn avx512(w: &MatRef, act: &QuantizedRows, rows: Range<usize>, out: Disjoint<f32>, token_stride: usize) {
        by_type::<Vnni>(w, act, rows, out, token_stride)
    }

    /// One AVX-512 register of 16 i32 lanes.
    #[derive(Clone, Copy)]
    pub(crate) struct Vnni(__m512i);

    /// Word `j` (64 bytes: 4 per lane) of a chunk of `n` groups; missing lanes zero.
    #[inline(always)]
    unsafe fn word512(codes: *const u8, j: usize, n: usize) -> __m512i {
        lanes512(codes.add(4 * n * j), n)
    }

    /// The first `n` (1 to 16) i32 lanes from `p`; the others zero.
    #[inline(always)]
    unsafe fn lanes512(p: *const u8, n: usize) -> __m512i {
        if n == 16 {
            _mm512_loadu_si512(p.cast())
        } else {
            _mm512_maskz_loadu_epi32(((1u32 << n) - 1) as __mmask16, p.cast())
        }
    }

    /// Code words `j` and `j + 4` (`j < 4`) of a wide chunk of `n` groups as `vpdpbusd`'s
    /// unsigned operand, against activation words `j` and `j + 4`: the low and high nibbles of
    /// word `j` (Q4), or words `j` and `j + 4` biased (Q8_0, `q ^ 0x80 = q + 128`).
    #[inline(always)]
    unsafe fn word_pair<K: Kind>(codes: *const u8, n: usize, j: usize) -> (__m512i, __m512i) {
        if K::CODE_BYTES == 16 {
            let mask = _mm512_set1_epi8(0x0F);
            let v = word512(codes, j, n);
            (_mm512_and_si512(v, mask), _mm512_and_si512(_mm512_srli_epi16(v, 4), mask))
        } else {
            let bias = _mm512_set1_epi8(0x80u8 as i8);
            (_mm512_xor_si512(word512(codes, j, n), bias), _mm512_xor_si512(word512(codes, j + 4, n), bias))
        }
    }

    /// Q6_K's layout of sub-block scales (`[n][2]` i8 at `sub`) as (`sc_0`, `sc_1`) lanes,
    /// zero past `n`.
    #[inline(always)]
    unsafe fn sub_scales512(sub: *const u8, n: usize) -> (__m512i, __m512i) {
        // Lane l: the i16 `sc_1 * 256 + (sc_0 as u8)`, sign-extended.
        let pairs = _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(((1u32 << n) - 1) as __mmask16, sub.cast()));
        (_mm512_srai_epi32(_mm512_slli_epi32(pairs, 24), 24), _mm512_srai_epi32(pairs, 8))
    }

    /// 16 f32 lanes: lanes 0..8 lane `a` of `v`, lanes 8..16 lane `b` (a super-block's
    /// value spread over its 8 groups).
    #[inline(always)]
    unsafe fn spread8(v: __m128, a: i32, b: i32) -> __m512 {
        let idx = _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
        _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
    }

    /// The 16 bytes `a` then `b` as f32 lanes.
    #[inline(always)]
    unsafe fn ints(a: [u8; 8], b: [u8; 8]) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_set_epi64x(u64::from_le_bytes(b) as i64, u64::from_le_bytes(a) as i64)))
    }

    /// Lanes 8..16 zeroed unless the chunk has 16 groups (two super-blocks).
    #[inline(always)]
    unsafe fn first_lanes(v: __m512, n: usize) -> __m512 {
        if n == 16 {
            v
        } else {
            _mm512_maskz_mov_ps(0x00FF, v)
        }
    }

    impl IntLanes for Vnni {
        type F = Avx512;
        /// The trait's arithmetic in vectors: the 6-bit integers unpacked on 32-bit words, the
        /// f16 scales by `vcvtph2ps`, the (exact) products, the sign flipped.
        #[inline(always)]
        unsafe fn q4k_scales(h: *const u8, n: usize) -> (Avx512, Avx512) {
            let word = |p: *const u8| std::ptr::read_unaligned(p.cast::<u32>());
            let (sc0, m0) = q4k_scales_mins(h);
            let ((sc1, m1), dd1) = if n == 16 { (q4k_scales_mins(h.add(Q4K_HEADER)), word(h.add(Q4K_HEADER))) } else { (([0; 8], [0; 8]), 0) };
            // [d_0, dmin_0, d_1, dmin_1]
            let f = _mm_cvtph_ps(_mm_set_epi32(0, 0, dd1 as i32, word(h) as i32));
            let dw = _mm512_mul_ps(spread8(f, 0, 2), ints(sc0, sc1));
            let dm = _mm512_mul_ps(spread8(f, 1, 3), ints(m0, m1));
            let mw = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(dm), _mm512_set1_epi32(i32::MIN)));
            (Avx512(first_lanes(dw, n)), Avx512(first_lanes(mw, n)))
        }
        #[inline(always)]
        unsafe fn q6k_scales(d: *const u8, n: usize) -> Avx512 {
            let bits = if n == 16 { std::ptr::read_unaligned(d.cast::<u32>()) } else { std::ptr::read_unaligned(d.cast::<u16>()) as u32 };
            let f = _mm_cvtph_ps(_mm_set_epi32(0, 0, 0, bits as i32));
            Avx512(first_lanes(spread8(f, 0, 1), n))
        }
        #[inline(always)]
        unsafe fn q5(codes: *const u8, n: usize) -> Self::Q4 {
            let (m4, one) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(1));
            let high = word512(codes, 4, n);
            let mut w = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let v = word512(codes, j, n);
                // Bit 4 of each byte: bit k moved down to bit 0, masked, moved up by 4.
                let hb: [__m512i; 2] = per_index!(2, |h| _mm512_slli_epi16(_mm512_and_si512(_mm512_srl_epi16(high, _mm_cvtsi32_si128((j + 4 * h) as i32)), one), 4));
                w[j] = _mm512_or_si512(_mm512_and_si512(v, m4), hb[0]);
                w[j + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), hb[1]);
            }
            w
        }
        /// (`u` per word, `sc_0`, `sc_1`)
        type Q6 = ([__m512i; 8], __m512i, __m512i);
        #[inline(always)]
        unsafe fn q6(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
            let (m4, m2) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
            let high = [word512(codes, 4, n), word512(codes, 5, n)];
            let mut w = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let v = word512(codes, j, n);
                let shift = _mm_cvtsi32_si128(2 * j as i32);
                // Bits 4 and 5: the 2-bit field moved down to bits 0..2, masked, moved up by 4
                // (within each byte: nothing crosses into the next one).
                let hb: [__m512i; 2] = per_index!(2, |h| _mm512_slli_epi16(_mm512_and_si512(_mm512_srl_epi16(high[h], shift), m2), 4));
                w[j] = _mm512_or_si512(_mm512_and_si512(v, m4), hb[0]);
                w[j + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), hb[1]);
            }
            let (sc0, sc1) = sub_scales512(sub, n);
            (w, sc0, sc1)
        }
        #[inline(always)]
        unsafe fn q3(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
            let (m2, one, bias) = (_mm512_set1_epi8(3), _mm512_set1_epi8(1), _mm512_set1_epi8(28));
            let low = [word512(codes, 0, n), word512(codes, 1, n)];
            let high = word512(codes, 2, n);
            // Per byte: the 2-bit field moved down and masked, bit k moved to bit 2, plus 28
            // (at most 35: no carry into the next byte).
            let w = per_index!(8, |k| {
                let l = _mm512_and_si512(_mm512_srl_epi16(low[k / 4], _mm_cvtsi32_si128(2 * (k % 4) as i32)), m2);
                let h = _mm512_slli_epi16(_mm512_and_si512(_mm512_srl_epi16(high, _mm_cvtsi32_si128(k as i32)), one), 2);
                _mm512_add_epi8(_mm512_or_si512(l, h), bias)
            });
            let (sc0, sc1) = sub_scales512(sub, n);
            (w, sc0, sc1)
        }
        #[inline(always)]
        unsafe fn t5(codes: *const u8, n: usize) -> Self::T4 {
            let (m4, one) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(1));
            let v = lanes512(codes, 4 * n);
            // Lane 4g + w: group g's word of high bits, shifted right by w (half 0) or w + 4
            // (half 1), so bit 0 of byte b is bit 4 of the lane's value b.
            let idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            let high = _mm512_permutexvar_epi32(idx, lanes512(codes.add(16 * n), n));
            let shift = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
            let hb = |s: __m512i| _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi32(high, s), one), 4);
            let (h0, h1) = (hb(shift), hb(_mm512_add_epi32(shift, _mm512_set1_epi32(4))));
            [_mm512_or_si512(_mm512_and_si512(v, m4), h0), _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), h1)]
        }
        /// Each half: 4 `vpdpbusd` of `u <= 63` and `|x| <= 127`, at most
        /// `16 * 63 * 127 = 128016`; then exact (bounds in the module docs).
        #[inline(always)]
        unsafe fn dot_q6(w: &Self::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> Self {
            let (u, sc0, sc1) = w;
            let (mut a, mut b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in 0..4 {
                a = _mm512_dpbusd_epi32(a, u[k], _mm512_loadu_si512(x.add(64 * k).cast()));
                b = _mm512_dpbusd_epi32(b, u[k + 4], _mm512_loadu_si512(x.add(64 * k + 256).cast()));
            }
            let (q, h) = (_mm512_loadu_si512(qsum.cast()), _mm512_loadu_si512(hsum.cast()));
            let a = _mm512_sub_epi32(a, _mm512_slli_epi32(h, 5));
            let b = _mm512_sub_epi32(b, _mm512_slli_epi32(_mm512_sub_epi32(q, h), 5));
            Vnni(_mm512_add_epi32(_mm512_mullo_epi32(*sc0, a), _mm512_mullo_epi32(*sc1, b)))
        }
        type Q4 = [__m512i; 8];
        /// Codes biased to unsigned: `q ^ 0x80 = q + 128`.
        type Q8 = [__m512i; 8];
        #[inline(always)]
        unsafe fn q4(codes: *const u8, n: usize) -> Self::Q4 {
            let mask = _mm512_set1_epi8(0x0F);
            let mut w = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let v = word512(codes, j, n);
                w[j] = _mm512_and_si512(v, mask);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            }
            w
        }
        #[inline(always)]
        unsafe fn q8(codes: *const u8, n: usize) -> Self::Q8 {
            let bias = _mm512_set1_epi8(0x80u8 as i8);
            per_index!(8, |j| _mm512_xor_si512(word512(codes, j, n), bias))
        }
        /// Two chains of 4 `vpdpbusd` each; every lane sums at most 32 products of
        /// `15 * 127`, far from overflow.
        #[inline(always)]
        unsafe fn dot_q4(w: &Self::Q4, x: *const i8) -> Self {
            let (mut a, mut b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in (0..8).step_by(2) {
                a = _mm512_dpbusd_epi32(a, w[k], _mm512_loadu_si512(x.add(64 * k).cast()));
                b = _mm512_dpbusd_epi32(b, w[k + 1], _mm512_loadu_si512(x.add(64 * k + 64).cast()));
            }
            Vnni(_mm512_add_epi32(a, b))
        }
        /// `sum (q + 128) x - 128 sum x`; `|sum (q + 128) x| <= 32 * 255 * 127`.
        #[inline(always)]
        unsafe fn dot_q8(w: &Self::Q8, x: *const i8, qsum: *const i32) -> Self {
            let (mut a, mut b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in (0..8).step_by(2) {
                a = _mm512_dpbusd_epi32(a, w[k], _mm512_loadu_si512(x.add(64 * k).cast()));
                b = _mm512_dpbusd_epi32(b, w[k + 1], _mm512_loadu_si512(x.add(64 * k + 64).cast()));
            }
            let bias = _mm512_slli_epi32(_mm512_loadu_si512(qsum.cast()), 7);
            Vnni(_mm512_sub_epi32(_mm512_add_epi32(a, b), bias))
        }
        #[inline(always)]
        unsafe fn minus_8_qsum(self, qsum: *const i32) -> Self {
            Vnni(_mm512_sub_epi32(self.0, _mm512_slli_epi32(_mm512_loadu_si512(qsum.cast()), 3)))
        }
        #[inline(always)]
        unsafe fn to_f32(self) -> Avx512 {
            Avx512(_mm512_cvtepi32_ps(self.0))
        }
        type T4 = [__m512i; 2];
        /// Biased to unsigned like `Q8`.
        type T8 = [__m512i; 2];
        #[inline(always)]
        unsafe fn t4(codes: *const u8, n: usize) -> Self::T4 {
            let mask = _mm512_set1_epi8(0x0F);
            let v = lanes512(codes, 4 * n);
            [_mm512_and_si512(v, mask), _mm512_and_si512(_mm512_srli_epi16(v, 4), mask)]
        }
        #[inline(always)]
        unsafe fn t8(codes: *const u8, n: usize) -> Self::T8 {
            let bias = _mm512_set1_epi8(0x80u8 as i8);
            per_index!(2, |h| _mm512_xor_si512(lanes512(codes.add(16 * n * h), 4 * n), bias))
        }
        #[inline(always)]
        unsafe fn dot_t4(w: &Self::T4, x: *const i8) -> Self {
            let a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_loadu_si512(x.cast()));
            Vnni(_mm512_dpbusd_epi32(a, w[1], _mm512_loadu_si512(x.add(64).cast())))
        }
        /// `sum (q + 128) x - 128 sum x` per lane, as `dot_q8`.
        #[inline(always)]
        unsafe fn dot_t8(w: &Self::T8, x: *const i8, lane_sum: *const i32) -> Self {
            let a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_loadu_si512(x.cast()));
            let a = _mm512_dpbusd_epi32(a, w[1], _mm512_loadu_si512(x.add(64).cast()));
            Vnni(_mm512_sub_epi32(a, _mm512_slli_epi32(_mm512_loadu_si512(lane_sum.cast()), 7)))
        }
        #[inline(always)]
        unsafe fn spread4(v: Avx512) -> Avx512 {
            let idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            Avx512(_mm512_permutexvar_ps(idx, v.0))
        }
        /// Several tokens: word by word, every `(row, token)` integer sum kept in a register,
        /// so a tile holds two code words per row instead of a whole chunk's eight, and each
        /// activation word is loaded once for all the tile's rows (8-10% faster than
        /// `wide_chunk_dots` at 16 tokens, `examples/int8_speed.rs`).
        #[inline(always)]
        unsafe fn wide_chunk<K: Kind, const NR: usize, const NT: usize>(
            rows: &[*const u8; NR],
            d_ptr: &[*const u8; NR],
            groups: usize,
            c: usize,
            x: &Acts,
            acc: &mut [[Avx512; NT]; NR],
        ) {
            if NT == 1 || !K::WORD_PAIRS {
                return wide_chunk_dots::<Self, K, NR, NT>(rows, d_ptr, groups, c, x, acc);
            }
            let g0 = c * CHUNK_GROUPS;
            let n = (groups - g0).min(CHUNK_GROUPS);
            let mut sums = [[_mm512_setzero_si512(); NT]; NR];
            for j in 0..4 {
                let w: [(__m512i, __m512i); NR] = per_index!(NR, |r| word_pair::<K>(rows[r].add(g0 * K::CODE_BYTES), n, j));
                for t in 0..NT {
                    let xq = x.q.add(t * x.q_stride + c * CHUNK_BYTES);
                    let lo = _mm512_loadu_si512(xq.add(64 * j).cast());
                    let hi = _mm512_loadu_si512(xq.add(64 * (j + 4)).cast());
                    for r in 0..NR {
                        sums[r][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sums[r][t], w[r].0, lo), w[r].1, hi);
                    }
                }
            }
            let (dw, mw) = chunk_scales::<Self, K, NR>(d_ptr, groups, g0, n);
            for t in 0..NT {
                let lane = t * x.lane_stride + g0;
                let dx = Avx512::load(x.d.add(lane));
                let sx = if K::OFFSET { Avx512::load(x.s.add(lane)) } else { Avx512::zero() };
                for r in 0..NR {
                    // The bias times the activation code sums: exact (bounds in `dot_q8`).
                    let isum = match K::BIAS_LOG2 {
                        Some(k) => _mm512_sub_epi32(sums[r][t], _mm512_sll_epi32(_mm512_loadu_si512(x.qsum.add(lane).cast()), _mm_cvtsi32_si128(k as i32))),
                        None => sums[r][t],
                    };
                    let isum = Vnni(isum).to_f32();
                    acc[r][t] = scale_add::<Avx512, K>(acc[r][t], isum, dw[r], dx, mw[r], sx);
                }
            }
        }
    }

    /// Two AVX2 registers: lanes 0..8 and 8..16.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2I32(__m256i, __m256i);

    /// Half `h` (lanes `8h..8h + 8`) of word `j` of a chunk of `n` groups; missing lanes zero.
    #[inline(always)]
    unsafe fn word256(codes: *const u8, j: usize, n: usize, h: usize) -> __m256i {
        lanes256(codes.add(4 * n * j), n, h)
    }

    /// Lanes `8h..8h + 8` of the first `n` (1 to 16) i32 lanes from `p`; missing lanes zero.
    #[inline(always)]
    unsafe fn lanes256(p: *const u8, n: usize, h: usize) -> __m256i {
        let p = p.add(32 * h);
        let m = n.saturating_sub(8 * h).min(8);
        if m == 8 {
            _mm256_loadu_si256(p.cast())
        } else if m == 0 {
            _mm256_setzero_si256()
        } else {
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(m as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            _mm256_maskload_epi32(p.cast(), mask)
        }
    }

    impl IntLanes for Avx2I32 {
        type F = Avx2x2;
        #[inline(always)]
        unsafe fn q5(codes: *const u8, n: usize) -> Self::Q4 {
            let (m4, one) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(1));
            let mut w = [[_mm256_setzero_si256(); 2]; 8];
            for h in 0..2 {
                let high = word256(codes, 4, n, h);
                for j in 0..4 {
                    let v = word256(codes, j, n, h);
                    let hb: [__m256i; 2] = per_index!(2, |k| _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128((j + 4 * k) as i32)), one), 4));
                    w[j][h] = _mm256_or_si256(_mm256_and_si256(v, m4), hb[0]);
                    w[j + 4][h] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), hb[1]);
                }
            }
            w
        }
        /// `maddubs` of codes `0..31` and `|x| <= 127`: pair sums at most `2 * 31 * 127 = 7874`,
        /// four words added in i16 (`31496 < 32767`), then widened.
        #[inline(always)]
        unsafe fn dot_q5(w: &Self::Q4, x: *const i8) -> Self {
            let ones = _mm256_set1_epi16(1);
            let mut out = [_mm256_setzero_si256(); 2];
            for (h, o) in out.iter_mut().enumerate() {
                for k0 in [0, 4] {
                    let mut s = _mm256_setzero_si256();
                    for k in k0..k0 + 4 {
                        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[k][h], _mm256_loadu_si256(x.add(64 * k + 32 * h).cast())));
                    }
                    *o = _mm256_add_epi32(*o, _mm256_madd_epi16(s, ones));
                }
            }
            Avx2I32(out[0], out[1])
        }
        #[inline(always)]
        unsafe fn t5(codes: *const u8, n: usize) -> Self::T4 {
            let (m4, one) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(1));
            // The n (at most 4) words of high bits, as the AVX-512 `t5`.
            let high = lanes256(codes.add(16 * n), n, 0);
            let shift = _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3);
            let mut w = [[_mm256_setzero_si256(); 2]; 2];
            for h in 0..2 {
                let v = lanes256(codes, 4 * n, h);
                let (a, b) = (2 * h as i32, 2 * h as i32 + 1);
                let hw = _mm256_permutevar8x32_epi32(high, _mm256_setr_epi32(a, a, a, a, b, b, b, b));
                let hb0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi32(hw, shift), one), 4);
                let hb1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi32(hw, _mm256_add_epi32(shift, _mm256_set1_epi32(4))), one), 4);
                w[0][h] = _mm256_or_si256(_mm256_and_si256(v, m4), hb0);
                w[1][h] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), hb1);
            }
            w
        }
        #[inline(always)]
        unsafe fn q3(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
            let (m2, one, bias) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1), _mm256_set1_epi8(28));
            let mut w = [[_mm256_setzero_si256(); 2]; 8];
            for h in 0..2 {
                let low = [word256(codes, 0, n, h), word256(codes, 1, n, h)];
                let high = word256(codes, 2, n, h);
                // As the AVX-512 `q3`.
                for (k, word) in w.iter_mut().enumerate() {
                    let l = _mm256_and_si256(_mm256_srl_epi16(low[k / 4], _mm_cvtsi32_si128(2 * (k % 4) as i32)), m2);
                    let hb = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(k as i32)), one), 2);
                    word[h] = _mm256_add_epi8(_mm256_or_si256(l, hb), bias);
                }
            }
            let (s0, s1) = q6_sub_scales(sub, n);
            let load = |s: &[i32; 16], h: usize| _mm256_loadu_si256(s.as_ptr().add(8 * h).cast());
            (w, [load(&s0, 0), load(&s0, 1)], [load(&s1, 0), load(&s1, 1)])
        }
        /// ([word][half] of `u`, `sc_0` per half, `sc_1` per half)
        type Q6 = ([[__m256i; 2]; 8], [__m256i; 2], [__m256i; 2]);
        #[inline(always)]
        unsafe fn q6(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
            let (m4, m2) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
            let mut w = [[_mm256_setzero_si256(); 2]; 8];
            for h in 0..2 {
                let high = [word256(codes, 4, n, h), word256(codes, 5, n, h)];
                for j in 0..4 {
                    let v = word256(codes, j, n, h);
                    let shift = _mm_cvtsi32_si128(2 * j as i32);
                    // As the AVX-512 `q6`: bits 4 and 5 per byte.
                    let hb: [__m256i; 2] = per_index!(2, |k| _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(high[k], shift), m2), 4));
                    w[j][h] = _mm256_or_si256(_mm256_and_si256(v, m4), hb[0]);
                    w[j + 4][h] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), hb[1]);
                }
            }
            let (s0, s1) = q6_sub_scales(sub, n);
            let load = |s: &[i32; 16], h: usize| _mm256_loadu_si256(s.as_ptr().add(8 * h).cast());
            (w, [load(&s0, 0), load(&s0, 1)], [load(&s1, 0), load(&s1, 1)])
        }
        /// `maddubs` of `u <= 63` and `|x| <= 127`: pair sums at most `2 * 63 * 127 = 16002`,
        /// two words added in i16 (`32004 < 32767`), then widened.
        #[inline(always)]
        unsafe fn dot_q6(w: &Self::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> Self {
            let ones = _mm256_set1_epi16(1);
            let (u, sc0, sc1) = w;
            let mut out = [_mm256_setzero_si256(); 2];
            for (h, o) in out.iter_mut().enumerate() {
                // [first half of the values, second half]: words 0..4 and 4..8.
                let mut halves = [_mm256_setzero_si256(); 2];
                for k in (0..8).step_by(2) {
                    let x0 = _mm256_loadu_si256(x.add(64 * k + 32 * h).cast());
                    let x1 = _mm256_loadu_si256(x.add(64 * k + 64 + 32 * h).cast());
                    let s = _mm256_add_epi16(_mm256_maddubs_epi16(u[k][h], x0), _mm256_maddubs_epi16(u[k + 1][h], x1));
                    halves[k / 4] = _mm256_add_epi32(halves[k / 4], _mm256_madd_epi16(s, ones));
                }
                let q = _mm256_loadu_si256(qsum.add(8 * h).cast());
                let hs = _mm256_loadu_si256(hsum.add(8 * h).cast());
                let a = _mm256_sub_epi32(halves[0], _mm256_slli_epi32(hs, 5));
                let b = _mm256_sub_epi32(halves[1], _mm256_slli_epi32(_mm256_sub_epi32(q, hs), 5));
                *o = _mm256_add_epi32(_mm256_mullo_epi32(sc0[h], a), _mm256_mullo_epi32(sc1[h], b));
            }
            Avx2I32(out[0], out[1])
        }
        /// [word][half]
        type Q4 = [[__m256i; 2]; 8];
        /// ([word][half] of |q|, [word][half] of q): the sign trick.
        type Q8 = ([[__m256i; 2]; 8], [[__m256i; 2]; 8]);
        #[inline(always)]
        unsafe fn q4(codes: *const u8, n: usize) -> Self::Q4 {
            let mask = _mm256_set1_epi8(0x0F);
            let mut w = [[_mm256_setzero_si256(); 2]; 8];
            for j in 0..4 {
                for h in 0..2 {
                    let v = word256(codes, j, n, h);
                    w[j][h] = _mm256_and_si256(v, mask);
                    w[j + 4][h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                }
            }
            w
        }
        #[inline(always)]
        unsafe fn q8(codes: *const u8, n: usize) -> Self::Q8 {
            let mut raw = [[_mm256_setzero_si256(); 2]; 8];
            let mut abs = raw;
            for j in 0..8 {
                for h in 0..2 {
                    raw[j][h] = word256(codes, j, n, h);
                    // |-128| = 128 read as unsigned, which is right.
                    abs[j][h] = _mm256_abs_epi8(raw[j][h]);
                }
            }
            (abs, raw)
        }
        /// `maddubs` of codes `0..15` and `x` in `-127..=127` gives pair sums of at most
        /// `2 * 15 * 127 = 3810`; the i16 sum over all 8 words is at most
        /// `16 * 15 * 127 = 30480 < 32767`, so it is formed in i16 and widened once.
        #[inline(always)]
        unsafe fn dot_q4(w: &Self::Q4, x: *const i8) -> Self {
            let ones = _mm256_set1_epi16(1);
            let half = |h: usize| {
                let mut s = _mm256_maddubs_epi16(w[0][h], _mm256_loadu_si256(x.add(32 * h).cast()));
                for k in 1..8 {
                    let xk = _mm256_loadu_si256(x.add(64 * k + 32 * h).cast());
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[k][h], xk));
                }
                _mm256_madd_epi16(s, ones)
            };
            Avx2I32(half(0), half(1))
        }
        /// `|q| * sign(q) x`: `|q| <= 128`, `|sign(q) x| <= 127`, so each `maddubs` pair sum is
        /// at most `2 * 128 * 127 = 32512 < 32767`; each word is widened to i32 before adding.
        #[inline(always)]
        unsafe fn dot_q8(w: &Self::Q8, x: *const i8, _qsum: *const i32) -> Self {
            let ones = _mm256_set1_epi16(1);
            let (abs, raw) = w;
            let half = |h: usize| {
                let mut acc = _mm256_setzero_si256();
                for k in 0..8 {
                    let xk = _mm256_loadu_si256(x.add(64 * k + 32 * h).cast());
                    let p = _mm256_maddubs_epi16(abs[k][h], _mm256_sign_epi8(xk, raw[k][h]));
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
                }
                acc
            };
            Avx2I32(half(0), half(1))
        }
        #[inline(always)]
        unsafe fn minus_8_qsum(self, qsum: *const i32) -> Self {
            let q = |h: usize| _mm256_slli_epi32(_mm256_loadu_si256(qsum.add(8 * h).cast()), 3);
            Avx2I32(_mm256_sub_epi32(self.0, q(0)), _mm256_sub_epi32(self.1, q(1)))
        }
        #[inline(always)]
        unsafe fn to_f32(self) -> Avx2x2 {
            Avx2x2(_mm256_cvtepi32_ps(self.0), _mm256_cvtepi32_ps(self.1))
        }
        /// [nibble half][lane half]
        type T4 = [[__m256i; 2]; 2];
        /// ([code half][lane half] of |q|, the same of q)
        type T8 = ([[__m256i; 2]; 2], [[__m256i; 2]; 2]);
        #[inline(always)]
        unsafe fn t4(codes: *const u8, n: usize) -> Self::T4 {
            let mask = _mm256_set1_epi8(0x0F);
            let mut w = [[_mm256_setzero_si256(); 2]; 2];
            for h in 0..2 {
                let v = lanes256(codes, 4 * n, h);
                w[0][h] = _mm256_and_si256(v, mask);
                w[1][h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            }
            w
        }
        #[inline(always)]
        unsafe fn t8(codes: *const u8, n: usize) -> Self::T8 {
            let mut raw = [[_mm256_setzero_si256(); 2]; 2];
            let mut abs = raw;
            for k in 0..2 {
                for h in 0..2 {
                    raw[k][h] = lanes256(codes.add(16 * n * k), 4 * n, h);
                    abs[k][h] = _mm256_abs_epi8(raw[k][h]);
                }
            }
            (abs, raw)
        }
        /// Pair sums at most `2 * 31 * 127` (5-bit codes of `t5`; nibbles less), two of them
        /// added in i16: at most `4 * 31 * 127 = 15748`.
        #[inline(always)]
        unsafe fn dot_t4(w: &Self::T4, x: *const i8) -> Self {
            let ones = _mm256_set1_epi16(1);
            let mut out = [_mm256_setzero_si256(); 2];
            for (h, o) in out.iter_mut().enumerate() {
                let x0 = _mm256_loadu_si256(x.add(32 * h).cast());
                let x1 = _mm256_loadu_si256(x.add(64 + 32 * h).cast());
                let s = _mm256_add_epi16(_mm256_maddubs_epi16(w[0][h], x0), _mm256_maddubs_epi16(w[1][h], x1));
                *o = _mm256_madd_epi16(s, ones);
            }
            Avx2I32(out[0], out[1])
        }
        /// The sign trick of `dot_q8`: pair sums at most `2 * 128 * 127 = 32512`, widened
        /// before adding.
        #[inline(always)]
        unsafe fn dot_t8(w: &Self::T8, x: *const i8, _lane_sum: *const i32) -> Self {
            let ones = _mm256_set1_epi16(1);
            let (abs, raw) = w;
            let mut out = [_mm256_setzero_si256(); 2];
            for (h, o) in out.iter_mut().enumerate() {
                for k in 0..2 {
                    let xk = _mm256_loadu_si256(x.add(64 * k + 32 * h).cast());
                    let p = _mm256_maddubs_epi16(abs[k][h], _mm256_sign_epi8(xk, raw[k][h]));
                    *o = _mm256_add_epi32(*o, _mm256_madd_epi16(p, ones));
                }
            }
            Avx2I32(out[0], out[1])
        }
        #[inline(always)]
        unsafe fn spread4(v: Avx2x2) -> Avx2x2 {
            let lo = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
            let hi = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
            Avx2x2(_mm256_permutevar8x32_ps(v.0, lo), _mm256_permutevar8x32_ps(v.0, hi))
        }
    }
}
