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
//! - Q2_K is Q6_K with 2-bit codes `q` in `0..4` and 4-bit sub-block scales `sc` in `0..16`
//!   (step 1: `isum = sc_0 * sum_{i<16} q_i x_i + sc_1 * sum_{i>=16} q_i x_i`, at most
//!   `2 * 15 * 16 * 3 * 127 = 182880` in magnitude; the ISAs take `q + 32` as `u`), steps 2
//!   and 3 as Q6_K's, and then its 4-bit sub-block minimums `m_0`, `m_1` in a step of their
//!   own: `msum = m_0 hsum_x + m_1 (qsum_x - hsum_x)` (exact, at most `15 * 32 * 127` in
//!   magnitude), `acc = fma(m_w d_x, f32(msum), acc)` with `m_w = 0 - dmin` of the group's
//!   super-block (f16, exact).
//!
//! Q8_0, Q5_K and Q6_K may also be read in place, as ggml's blocks ([`Layout::Blocks`]: a
//! Q8_0 block is its f16 scale, then its 32 codes; a Q5_K super-block its header (as Q4_K's),
//! the codes' bit 4, their low 4 bits; a Q6_K super-block its codes' low 4 bits, their bits 4
//! and 5, 16 i8 sub-block scales and the f16 `d`). The codes then enter the same steps
//! with the same values: a chunk's blocks are unpacked into the chunked order as they are read
//! ([`IntLanes::q8_blocks`], [`IntLanes::q6_blocks`]), or, for one token on AVX-512 and AVX2,
//! the codes in ggml's order are dotted with the activation's codes in group order
//! ([`QuantizedRows::grouped`]) and the partial sums added into the group lanes (Q6_K's per
//! sub-block first, times its scale, then the halves); either way `isum` is the same exact
//! integer.
//!
//! Q5_0 and Q5_1 (rows of groups of 32, so a last chunk may be narrow) are Q4_0 and Q4_1 with
//! 5-bit codes: `|isum| <= 32 * 31 * 127` (Q5_1), `32 * 16 * 127` (Q5_0); a narrow chunk's
//! lanes take the 5-bit codes of their 8 values.

// Lane, token and row indices address several arrays at once in these loops.
#![allow(clippy::needless_range_loop)]

use std::ops::Range;

use super::lanes::Lanes16;
use super::kquant::{q4k_scales_mins, Q4K_HEADER, SUPER_GROUPS};
use super::packed::{code_bytes, is_int8_packable, layout_row_bytes, reads_blocks_in_place, Layout};
use super::quantize_act::{narrow_groups, wide_chunks, QuantizedRows, CHUNK_BYTES, CHUNK_GROUPS};
use super::{check_out, f16_chunk, Disjoint, Isa, MatRef, RowsCall, StreamAhead, GROUP, TOKEN_BLOCK};
use crate::tensor::{GgmlType, KernelGroup};

/// Tokens per tile: a tile is up to 4 rows ([`IntLanes::FOUR_ROW_TILES`]) x `TILE_TOKENS` tokens.
const TILE_TOKENS: usize = 4;

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

// After the macro: the ISA modules use it.
mod kinds;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

pub(crate) use kinds::Kind;
use kinds::{KQ2K, KQ3K, KQ4K, KQ4_0, KQ4_1, KQ5K, KQ5KBlocks, KQ5_0, KQ5_1, KQ6K, KQ6KBlocks, KQ8_0, KQ8_0Blocks};
use scalar::ScalarI32;

/// For every row `r` in `rows` and token `t`: `out[t * token_stride + r]` = row `r` of `w`
/// (packed in the chunked layout, or Q8_0's blocks as the file stores them) against token `t`
/// of `act`, by the order in the module docs.
///
/// # Safety
/// No other thread may touch those elements of `out` during the call.
pub unsafe fn matmul_rows_int8(isa: Isa, w: &MatRef, act: &QuantizedRows, rows: Range<usize>, out: Disjoint<f32>, token_stride: usize) {
    assert_eq!(w.cols, act.cols);
    check_out(&out, token_stride, act.n_tokens, &rows);
    assert!(is_int8_packable(w.ty) && w.cols.is_multiple_of(w.ty.block_size().max(GROUP)) && rows.end <= w.rows);
    assert!(w.layout == Layout::Chunked || (w.layout == Layout::Blocks && reads_blocks_in_place(w.ty)));
    assert_eq!(w.data.len(), w.rows * layout_row_bytes(w.ty, w.layout, w.cols));
    let (qs, ls) = (act.q_stride(), act.lane_stride());
    assert!(act.q.len() >= act.n_tokens * qs);
    assert!(act.d.len() >= act.n_tokens * ls && act.s.len() >= act.n_tokens * ls && act.qsum.len() >= act.n_tokens * ls);
    assert!(act.hsum.len() >= act.n_tokens * ls);
    assert!(act.tail_d.len() >= act.n_tokens * CHUNK_GROUPS && act.tail_sum.len() >= act.n_tokens * CHUNK_GROUPS);
    assert!(act.grouped.len() >= act.n_tokens * act.cols);
    assert!(isa.int8_available(), "the {} int8 kernels cannot run on this CPU", isa.name());
    crate::count::mults(rows.len() * act.n_tokens * w.cols);
    let call = &RowsCall { w, act, rows, out, token_stride };
    // SAFETY: the shapes, the buffer lengths and the CPU's features are checked above; the
    // outputs are this call's alone (this function's precondition).
    unsafe {
        match isa {
            Isa::Scalar => by_type::<ScalarI32>(call),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::matmul_rows(call),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::matmul_rows(call),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("no SIMD path on this architecture"),
        }
    }
}

/// Sixteen i32 lanes (lane `l` = group `16c + l` of a chunk), one implementation per ISA.
///
/// # Safety
/// Every method is `unsafe` because the SIMD implementations may only run on a CPU with
/// their features; callers reach them through [`matmul_rows_int8`], which checked them
/// ([`Isa::int8_available`]). Pointer arguments must be valid for the bytes a method names
/// (a chunk's codes of `n` groups, a chunk's 512 activation bytes or a narrow chunk's 128,
/// 16 lanes of sums).
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
    /// [`IntLanes::q8`]'s prepared codes of a chunk of `n` (1 to 16) groups read from ggml's
    /// Q8_0 blocks at `blocks` (34 bytes each: the f16 scale, then the 32 codes) instead of
    /// the chunked layout. By default the codes are copied into the chunked order first.
    #[inline(always)]
    unsafe fn q8_blocks(blocks: *const u8, n: usize) -> Self::Q8 {
        // SAFETY: `blocks` is valid for `n` blocks (the `IntLanes` contract), and the copy holds
        // the chunk's code words as `q8` reads them.
        unsafe { Self::q8(kinds::chunk_from_blocks(blocks, n).as_ptr(), n) }
    }
    /// The f16 scales of `n` (1 to 16) Q8_0 blocks at `blocks`, exactly converted; zero past
    /// `n`.
    #[inline(always)]
    unsafe fn q8_block_scales(blocks: *const u8, n: usize) -> Self::F {
        // SAFETY: `blocks` is valid for `n` blocks (the `IntLanes` contract); `d` holds 16 f16.
        unsafe {
            let mut d = [0u8; 32];
            for l in 0..n {
                std::ptr::copy_nonoverlapping(blocks.add(kinds::Q8_0_BLOCK * l), d.as_mut_ptr().add(2 * l), 2);
            }
            f16_chunk::<Self::F>(d.as_ptr(), n)
        }
    }
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
    /// Q3_K (`Q3`) or Q2_K codes of a chunk of `n` (8 or 16) groups at `codes`
    /// ([`super::kquant_low`]) as Q6_K's: `u = c + 32` (Q3_K's `c` in `-4..4`, Q2_K's `q` in
    /// `0..4`), with the sub-block scales at `sub` (`[n][2]` i8).
    unsafe fn q_low<const Q3: bool>(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6;
    /// Lane `l`: `sum of code (0..31) * x`; by default `dot_q4`'s sums, which have room for
    /// 5-bit codes unless an ISA overrides this.
    #[inline(always)]
    unsafe fn dot_q5(w: &Self::Q4, x: *const i8) -> Self {
        // SAFETY: `dot_q4` takes the same arguments (the `IntLanes` contract).
        unsafe { Self::dot_q4(w, x) }
    }
    /// One chunk of Q6_K codes (`u = q + 32`, unpacked to 8 words as `Q4`) and the lanes'
    /// two sub-block scales.
    type Q6: Copy;
    /// Q6_K codes of a chunk of `n` (8 or 16) groups at `codes`, sub-block scales at `sub`
    /// (`[n][2]` i8); missing lanes are zero.
    unsafe fn q6(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6;
    /// [`IntLanes::q6`]'s prepared codes and scales of a chunk of `n` (8 or 16) groups read
    /// from ggml's Q6_K super-blocks at `blocks` (210 bytes each) instead of the int8 layout.
    /// By default the chunk is packed into that layout first.
    #[inline(always)]
    unsafe fn q6_blocks(blocks: *const u8, n: usize) -> Self::Q6 {
        // SAFETY: `blocks` is valid for `n / 8` super-blocks (the `IntLanes` contract).
        unsafe { kinds::q6_by_packing::<Self>(blocks, n) }
    }
    /// [`IntLanes::q5`]'s unpacked codes of a chunk of `n` (8 or 16) groups read from ggml's
    /// Q5_K super-blocks at `blocks` (176 bytes each) instead of the int8 layout. By default
    /// the chunk is packed into that layout first.
    #[inline(always)]
    unsafe fn q5k_blocks(blocks: *const u8, n: usize) -> Self::Q4 {
        // SAFETY: `blocks` is valid for `n / 8` super-blocks (the `IntLanes` contract).
        unsafe { kinds::q5k_by_packing::<Self>(blocks, n) }
    }
    /// Lane `l`: `sc_0 (sum_{i<16} u x - 32 hsum) + sc_1 (sum_{i>=16} u x - 32 (qsum - hsum))`,
    /// as f32 (exact: the bounds in the module docs).
    unsafe fn dot_q6(w: &Self::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> Self::F;
    /// Q4_K's `d_w = d * sc` and `m_w = -(dmin * m)` of a chunk of `n` (8 or 16) groups from
    /// the super-block headers (16 bytes each) at `h` and, if `n` is 16, `h + stride`; zero
    /// past `n`. Every product is exact, so the default (plain code) and an ISA's own way give
    /// the same bits.
    #[inline(always)]
    unsafe fn q4k_scales(h: *const u8, stride: usize, n: usize) -> (Self::F, Self::F) {
        // SAFETY: `h` is valid for the chunk's `n / 8` headers of 16 bytes, `stride` apart (the
        // `IntLanes` contract); `dw` and `mw` hold 16 f32 each.
        unsafe {
            let (mut dw, mut mw) = ([0f32; 16], [0f32; 16]);
            for b in 0..n / SUPER_GROUPS {
                let h = h.add(stride * b);
                let (sc, m) = q4k_scales_mins(&*h.cast::<[u8; Q4K_HEADER]>());
                let (d, dmin) = (f16_at(h), f16_at(h.add(2)));
                for j in 0..SUPER_GROUPS {
                    dw[SUPER_GROUPS * b + j] = d * sc[j] as f32;
                    mw[SUPER_GROUPS * b + j] = -(dmin * m[j] as f32);
                }
            }
            (<Self::F as Lanes16>::load(dw.as_ptr()), <Self::F as Lanes16>::load(mw.as_ptr()))
        }
    }
    /// Q6_K's `d_w`: lane `l` the f16 `d` of super-block `l / 8` (at `d + stride (l / 8)`),
    /// for a chunk of `n` (8 or 16) groups; zero past `n`.
    #[inline(always)]
    unsafe fn q6k_scales(d: *const u8, stride: usize, n: usize) -> Self::F {
        // SAFETY: `d` is valid for `n / 8` f16 values, `stride` apart (the `IntLanes` contract);
        // `dw` holds 16 f32.
        unsafe {
            let mut dw = [0f32; 16];
            for b in 0..n / SUPER_GROUPS {
                dw[SUPER_GROUPS * b..SUPER_GROUPS * (b + 1)].fill(f16_at(d.add(stride * b)));
            }
            <Self::F as Lanes16>::load(dw.as_ptr())
        }
    }
    /// `self - 8 * qsum` lane-wise.
    unsafe fn minus_8_qsum(self, qsum: *const i32) -> Self;
    /// `self - 16 * qsum` lane-wise (exact: the bounds in the module docs).
    #[inline(always)]
    unsafe fn minus_16_qsum(self, qsum: *const i32) -> Self {
        // SAFETY: `qsum` is valid for 16 lanes (the `IntLanes` contract).
        unsafe { self.minus_8_qsum(qsum).minus_8_qsum(qsum) }
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
        // SAFETY: the arguments are those `wide_chunk_dots` asks for (the `IntLanes` contract).
        unsafe { wide_chunk_dots::<Self, K, NR, NT>(rows, d_ptr, groups, c, x, acc) }
    }
    /// Whether a token block of more tokens than one tile takes runs tiles of 4 rows (else
    /// 2). A constant, so that the other ISAs compile no 4-row tiles.
    const FOUR_ROW_TILES: bool = false;
    /// Whether a tile of several tokens takes `K`'s chunks prepared once per row and token
    /// block ([`PreparedChunk`]) rather than unpacking them itself ([`IntLanes::wide_chunk`]).
    #[inline(always)]
    fn prepares<K: Kind>() -> bool {
        true
    }
    /// Wide chunk `c` of an `NR x NT` tile into `acc` from the rows' prepared chunks, as
    /// [`chunk_dots`] (which an ISA may replace by any exact way of forming the integer sums).
    #[inline(always)]
    unsafe fn prepared_chunk<K: Kind, const NR: usize, const NT: usize>(p: &[&PreparedChunk<Self, K>; NR], c: usize, x: &Acts, acc: &mut [[Self::F; NT]; NR]) {
        // SAFETY: the arguments are those `chunk_dots` asks for (the `IntLanes` contract).
        unsafe {
            let (w, dw, mw) = (per_index!(NR, |r| &p[r].w), per_index!(NR, |r| p[r].dw), per_index!(NR, |r| p[r].mw));
            chunk_dots::<Self, K, NR, NT>(w, dw, mw, c, x, acc)
        }
    }
}

/// The f16 at `p` (little-endian), exactly converted.
///
/// # Safety
/// `p` must be valid for 2 bytes.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: `p` is valid for 2 bytes (this function's precondition).
    unsafe { half::f16::from_le_bytes([*p, *p.add(1)]).to_f32() }
}

/// Q6_K's two sub-block scales of each of a chunk's `n` groups (`sub`: `[n][2]` i8), zero
/// past `n`.
///
/// # Safety
/// `sub` must be valid for `2 n` bytes, `n <= 16`.
#[inline(always)]
unsafe fn q6_sub_scales(sub: *const u8, n: usize) -> ([i32; 16], [i32; 16]) {
    // SAFETY: `l < n`, so the reads are within the `2 n` bytes at `sub` (this function's
    // precondition).
    unsafe {
        let (mut s0, mut s1) = ([0i32; 16], [0i32; 16]);
        for l in 0..n {
            s0[l] = *sub.add(2 * l) as i8 as i32;
            s1[l] = *sub.add(2 * l + 1) as i8 as i32;
        }
        (s0, s1)
    }
}

/// # Safety
/// The CPU must have `D`'s ISA, the arguments must pass the checks of [`matmul_rows_int8`], and
/// no other thread may touch those elements of `out` during the call.
#[inline(always)]
unsafe fn by_type<D: IntLanes>(call: &RowsCall<QuantizedRows>) {
    // SAFETY: `K` is the kind of `w.ty`, so its layout is that of `w`'s rows; the rest is the
    // caller's precondition, which `tiles` asks for too.
    unsafe {
        let w = call.w;
        match w.ty {
            GgmlType::Q4_K => tiles::<D, KQ4K>(call),
            GgmlType::Q5_K if w.layout == Layout::Blocks => tiles::<D, KQ5KBlocks>(call),
            GgmlType::Q5_K => tiles::<D, KQ5K>(call),
            GgmlType::Q6_K if w.layout == Layout::Blocks => tiles::<D, KQ6KBlocks>(call),
            GgmlType::Q6_K => tiles::<D, KQ6K>(call),
            GgmlType::Q3_K => tiles::<D, KQ3K>(call),
            GgmlType::Q2_K => tiles::<D, KQ2K>(call),
            GgmlType::Q5_0 => tiles::<D, KQ5_0>(call),
            GgmlType::Q5_1 => tiles::<D, KQ5_1>(call),
            GgmlType::Q8_0 if w.layout == Layout::Blocks => tiles::<D, KQ8_0Blocks>(call),
            _ => match w.ty.kernel() {
                KernelGroup::Q4_0 => tiles::<D, KQ4_0>(call),
                KernelGroup::Q4_1 => tiles::<D, KQ4_1>(call),
                KernelGroup::Q8_0 => tiles::<D, KQ8_0>(call),
                _ => unreachable!("checked by is_int8_packable"),
            },
        }
    }
}

/// Token blocks, then rows, then tiles of up to 2 rows x [`TILE_TOKENS`] tokens (as the f32
/// kernels), or of 4 rows ([`IntLanes::FOUR_ROW_TILES`]) where a block has more tokens than
/// one tile. There, if the ISA asks for it ([`IntLanes::prepares`]), the tile's rows have their
/// chunks unpacked once for all the block's tiles ([`PreparedChunk`]); the sums are the same
/// either way.
///
/// # Safety
/// As for [`by_type`], with `K` the kind of `w.ty`.
#[inline(always)]
unsafe fn tiles<D: IntLanes, K: Kind>(call: &RowsCall<QuantizedRows>) {
    // SAFETY: rows `r..r + nr` are rows of `w` (`rows.end <= w.rows`) and tokens `t..` tokens
    // of `act`, so the row pointers and `Acts::at` stay in their buffers and `tile` reads and
    // writes what they hold; the outputs `t * token_stride + r..` are in `out` (`check_out`)
    // and this call's alone, and the CPU has `D`'s ISA (this function's precondition).
    unsafe {
        let &RowsCall { w, act, ref rows, out, token_stride } = call;
        debug_assert!(if w.layout == Layout::Blocks { K::BLOCKS == Some(w.ty) } else { K::BLOCKS.is_none() && K::CODE_BYTES == code_bytes(w.ty) });
        let row_bytes = layout_row_bytes(w.ty, w.layout, w.cols);
        let (groups, wide) = (w.cols / GROUP, wide_chunks(w.cols));
        let tile_rows = if act.n_tokens > 1 { 2 } else { 1 };
        // [row of the tile][wide chunk]
        let mut prepared: Vec<PreparedChunk<D, K>> = Vec::new();
        for t_block in (0..act.n_tokens).step_by(TOKEN_BLOCK) {
            let tokens = t_block..(t_block + TOKEN_BLOCK).min(act.n_tokens);
            // More tokens than one tile takes: each row's chunks are unpacked once for all of
            // the block's tiles.
            let prepare = tokens.len() > TILE_TOKENS && D::prepares::<K>();
            let ahead = &mut StreamAhead::new(&w.data[rows.start * row_bytes..rows.end * row_bytes]);
            let mut r = rows.start;
            while r < rows.end {
                // 4 rows where the ISA takes them and 4 remain, else 2 or the last one.
                let block_rows = if D::FOUR_ROW_TILES && tokens.len() > TILE_TOKENS { 4 } else { tile_rows };
                let nr = if block_rows <= rows.end - r { block_rows } else { tile_rows.min(rows.end - r) };
                let row = w.data.as_ptr().add(r * row_bytes);
                if act.n_tokens == 1 {
                    // One token: one row per tile, each read once at memory's pace; the
                    // tiles prefetch ahead of their walk ([`StreamAhead`]).
                    tile::<D, K, 1, 1>(row, row_bytes, w.cols, &Acts::at(act, 0), out.at(r), (token_stride, Some(&mut *ahead)), &[]);
                    r += 1;
                    continue;
                }
                prepared.clear();
                if prepare {
                    for i in 0..nr {
                        for c in 0..wide {
                            prepared.push(prepare_chunk::<D, K>(row.add(i * row_bytes), groups, c));
                        }
                    }
                }
                let p = &prepared[..];
                let mut t = tokens.start;
                while t < tokens.end {
                    let x = Acts::at(act, t);
                    let o = out.at(t * token_stride + r);
                    // The block's first tile over these rows reads them from memory: it walks
                    // the stream on; the others find them in the cache.
                    let stream = if t == tokens.start { Some(&mut *ahead) } else { None };
                    let (c, s) = (w.cols, (token_stride, stream));
                    // (The 4-row tiles exist only for the ISAs that take them.)
                    t += if D::FOUR_ROW_TILES && nr == 4 {
                        match tokens.end - t {
                            1 => tile::<D, K, 4, 1>(row, row_bytes, c, &x, o, s, p),
                            2 => tile::<D, K, 4, 2>(row, row_bytes, c, &x, o, s, p),
                            3 => tile::<D, K, 4, 3>(row, row_bytes, c, &x, o, s, p),
                            _ => tile::<D, K, 4, TILE_TOKENS>(row, row_bytes, c, &x, o, s, p),
                        }
                    } else {
                        match (nr, tokens.end - t) {
                            (1, 1) => tile::<D, K, 1, 1>(row, row_bytes, c, &x, o, s, p),
                            (1, 2) => tile::<D, K, 1, 2>(row, row_bytes, c, &x, o, s, p),
                            (1, 3) => tile::<D, K, 1, 3>(row, row_bytes, c, &x, o, s, p),
                            (1, _) => tile::<D, K, 1, TILE_TOKENS>(row, row_bytes, c, &x, o, s, p),
                            (_, 1) => tile::<D, K, 2, 1>(row, row_bytes, c, &x, o, s, p),
                            (_, 2) => tile::<D, K, 2, 2>(row, row_bytes, c, &x, o, s, p),
                            (_, 3) => tile::<D, K, 2, 3>(row, row_bytes, c, &x, o, s, p),
                            (_, _) => tile::<D, K, 2, TILE_TOKENS>(row, row_bytes, c, &x, o, s, p),
                        }
                    };
                }
                r += nr;
            }
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
    /// The codes in group order ([`QuantizedRows::grouped`]).
    grouped: *const i8,
    q_stride: usize,
    lane_stride: usize,
}

impl Acts {
    /// From token `t` of `act` on.
    ///
    /// # Safety
    /// `t` must be below `act.n_tokens`, and `act`'s buffers hold `n_tokens` tokens (checked by
    /// [`matmul_rows_int8`]).
    #[inline(always)]
    unsafe fn at(act: &QuantizedRows, t: usize) -> Acts {
        // SAFETY: `t < act.n_tokens`, and every buffer holds `n_tokens` tokens (this function's
        // precondition), so each offset is within its buffer.
        unsafe {
            let (qs, ls) = (act.q_stride(), act.lane_stride());
            Acts {
                q: act.q.as_ptr().add(t * qs),
                d: act.d.as_ptr().add(t * ls),
                s: act.s.as_ptr().add(t * ls),
                qsum: act.qsum.as_ptr().add(t * ls),
                hsum: act.hsum.as_ptr().add(t * ls),
                tail_d: act.tail_d.as_ptr().add(t * CHUNK_GROUPS),
                tail_sum: act.tail_sum.as_ptr().add(t * CHUNK_GROUPS),
                grouped: act.grouped.as_ptr().add(t * act.cols),
                q_stride: qs,
                lane_stride: ls,
            }
        }
    }
}

/// `NR` consecutive packed rows (from `row`, `row_bytes` apart) against `NT` consecutive
/// tokens, each output by the canonical order; returns `NT`.
///
/// # Safety
/// `row` must point at `NR` packed rows of `cols` values in `K`'s layout, `row_bytes` apart;
/// `x` at `NT` tokens of activations of `cols` values; `out` be valid for `NR` outputs of each
/// of `NT` tokens, `out_stride` apart, which no other thread touches during the call. The CPU
/// must have `D`'s ISA. With a stream (`ahead`), the tile advances it over its rows as it
/// reads them. `prepared`: empty, or the rows' wide chunks prepared (`[NR][wide chunks]`).
#[inline(always)]
unsafe fn tile<D: IntLanes, K: Kind, const NR: usize, const NT: usize>(
    row: *const u8,
    row_bytes: usize,
    cols: usize,
    x: &Acts,
    out: *mut f32,
    (out_stride, mut ahead): (usize, Option<&mut StreamAhead>),
    prepared: &[PreparedChunk<D, K>],
) -> usize {
    // SAFETY: `row`, `x` and `out` cover the rows, tokens and outputs this reads and writes:
    // the wide chunks and the narrow one of `cols` values (this function's precondition); the
    // CPU has `D`'s ISA.
    unsafe {
        let groups = cols / GROUP;
        let rows: [*const u8; NR] = std::array::from_fn(|r| row.add(r * row_bytes));
        let d_ptr = rows.map(|p| K::scales_part(p, groups));
        let mut acc = [[<D::F as Lanes16>::zero(); NT]; NR];
        let (wide, n) = (wide_chunks(cols), narrow_groups(cols));
        let pieces = wide + usize::from(n > 0);
        for c in 0..wide {
            if let Some(a) = ahead.as_deref_mut() {
                a.advance_piece(NR * row_bytes, pieces, c);
            }
            if prepared.is_empty() {
                D::wide_chunk::<K, NR, NT>(&rows, &d_ptr, groups, c, x, &mut acc);
            } else {
                let p: [&PreparedChunk<D, K>; NR] = per_index!(NR, |r| &prepared[r * wide + c]);
                D::prepared_chunk::<K, NR, NT>(&p, c, x, &mut acc);
            }
        }
        if n > 0 {
            if let Some(a) = ahead {
                a.advance_piece(NR * row_bytes, pieces, wide);
            }
            let g0 = groups - n;
            let w: [K::T<D>; NR] = per_index!(NR, |r| K::prep_tail::<D>(K::codes(rows[r], g0), n));
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
}

/// Wide chunk `c` of an `NR x NT` tile into `acc` (steps 1 to 4 of the module docs), with
/// each `(row, token)` dot product formed whole by `K::isum`. `rows`: the tile's code rows;
/// `d_ptr`: their scales (then Q4_1's offsets); `groups`: per row.
///
/// # Safety
/// `rows` and `d_ptr` must point at the codes and the scales part of `NR` packed rows of
/// `groups` groups in `K`'s layout, `c` be one of their wide chunks, and `x` point at `NT`
/// tokens of activations of as many groups; the CPU must have `D`'s ISA.
#[inline(always)]
unsafe fn wide_chunk_dots<D: IntLanes, K: Kind, const NR: usize, const NT: usize>(
    rows: &[*const u8; NR],
    d_ptr: &[*const u8; NR],
    groups: usize,
    c: usize,
    x: &Acts,
    acc: &mut [[D::F; NT]; NR],
) {
    // SAFETY: chunk `c` lies within every row and token (this function's precondition), and so
    // do its codes (`Kind::codes`), its scales and its activation lanes at `g0`.
    unsafe {
        let g0 = c * CHUNK_GROUPS;
        let n = (groups - g0).min(CHUNK_GROUPS);
        let w: [K::W<D>; NR] = per_index!(NR, |r| K::prep::<D>(K::codes(rows[r], g0), K::sub_ptr(d_ptr[r], groups, g0), n));
        let (dw, mw) = chunk_scales::<D, K, NR>(d_ptr, groups, g0, n);
        chunk_dots::<D, K, NR, NT>(per_index!(NR, |r| &w[r]), dw, mw, c, x, acc);
    }
}

/// One wide chunk of a packed row as the dot products take it: the codes unpacked by
/// [`Kind::prep`], the groups' scales and offsets by [`Kind::scales`].
pub(crate) struct PreparedChunk<D: IntLanes, K: Kind> {
    pub(crate) w: K::W<D>,
    pub(crate) dw: D::F,
    pub(crate) mw: D::F,
}

/// Wide chunk `c` of the packed row at `row` (`groups` groups), prepared.
///
/// # Safety
/// `row` must point at a packed row of `groups` groups in `K`'s layout with a wide chunk `c`;
/// the CPU must have `D`'s ISA.
#[inline(always)]
unsafe fn prepare_chunk<D: IntLanes, K: Kind>(row: *const u8, groups: usize, c: usize) -> PreparedChunk<D, K> {
    // SAFETY: the chunk's codes, sub-block scales and scales lie within the row (this
    // function's precondition).
    unsafe {
        let g0 = c * CHUNK_GROUPS;
        let n = (groups - g0).min(CHUNK_GROUPS);
        let d_ptr = K::scales_part(row, groups);
        let w = K::prep::<D>(K::codes(row, g0), K::sub_ptr(d_ptr, groups, g0), n);
        let (dw, mw) = K::scales::<D>(d_ptr, groups, g0, n);
        PreparedChunk { w, dw, mw }
    }
}

/// Wide chunk `c` of an `NR x NT` tile into `acc` (steps 1 to 4 of the module docs) from the
/// rows' prepared codes `w`, scales `dw` and offsets `mw` of the chunk.
///
/// # Safety
/// `x` must point at `NT` tokens of activations with a wide chunk `c`; the CPU must have `D`'s
/// ISA.
#[inline(always)]
unsafe fn chunk_dots<D: IntLanes, K: Kind, const NR: usize, const NT: usize>(
    w: [&K::W<D>; NR],
    dw: [D::F; NR],
    mw: [D::F; NR],
    c: usize,
    x: &Acts,
    acc: &mut [[D::F; NT]; NR],
) {
    // SAFETY: chunk `c` lies within every token (this function's precondition), and so do its
    // activation lanes at `g0`.
    unsafe {
        let g0 = c * CHUNK_GROUPS;
        for t in 0..NT {
            let xq = x.q.add(t * x.q_stride + c * CHUNK_BYTES);
            let lane = t * x.lane_stride + g0;
            let dx = <D::F as Lanes16>::load(x.d.add(lane));
            let sx = if K::OFFSET { <D::F as Lanes16>::load(x.s.add(lane)) } else { <D::F as Lanes16>::zero() };
            for r in 0..NR {
                let (qsum, hsum) = (x.qsum.add(lane), x.hsum.add(lane));
                let isum = K::isum::<D>(w[r], xq, qsum, hsum);
                acc[r][t] = scale_add::<D::F, K>(acc[r][t], isum, dw[r], dx, mw[r], sx);
                if K::MINS {
                    let msum = K::min_sum::<D>(w[r], qsum, hsum);
                    acc[r][t] = <D::F as Lanes16>::fma(<D::F as Lanes16>::mul(mw[r], dx), msum, acc[r][t]);
                }
            }
        }
    }
}

/// The chunk's weight scales `d_w` and (Q4_1, Q4_K) offsets `m_w` of each row, zero past
/// `n` groups ([`Kind::scales`]).
///
/// # Safety
/// `d_ptr` must point at the scales parts of packed rows of `groups` groups in `K`'s layout,
/// with groups `g0..g0 + n` among them; the CPU must have `D`'s ISA.
#[inline(always)]
unsafe fn chunk_scales<D: IntLanes, K: Kind, const NR: usize>(d_ptr: &[*const u8; NR], groups: usize, g0: usize, n: usize) -> ([D::F; NR], [D::F; NR]) {
    // SAFETY: `K::scales` asks, for each row, what this function's precondition gives.
    unsafe {
        let both: [(D::F, D::F); NR] = per_index!(NR, |r| K::scales::<D>(d_ptr[r], groups, g0, n));
        (both.map(|b| b.0), both.map(|b| b.1))
    }
}

/// Steps 2 to 4: `acc = fma(d_w d_x, isum, acc)`, then (Q4_1) `acc = fma(m_w, s_x, acc)`.
///
/// # Safety
/// The CPU must have `F`'s ISA.
#[inline(always)]
unsafe fn scale_add<F: Lanes16, K: Kind>(acc: F, isum: F, dw: F, dx: F, mw: F, sx: F) -> F {
    // SAFETY: the CPU has `F`'s ISA (this function's precondition).
    unsafe {
        let a = F::fma(F::mul(dw, dx), isum, acc);
        if K::OFFSET {
            F::fma(mw, sx, a)
        } else {
            a
        }
    }
}
