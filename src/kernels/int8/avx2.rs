//! [`IntLanes`] on two AVX2 registers: `vpmaddubsw` then `vpmaddwd` with ones.

use std::arch::x86_64::*;

use super::kinds::{Q5K_BLOCK, Q6K_BLOCK, Q6K_SCALES_AT, Q8_0_BLOCK};
use super::{by_type, chunk_scales, scale_add, wide_chunk_dots, Acts, IntLanes, Kind};
use crate::kernels::kquant::{q4k_scales_mins_x2, Q4K_HEADER, SUPER_GROUPS};
use crate::kernels::lanes::{Avx2x2, Lanes16};
use crate::kernels::quantize_act::{QuantizedRows, CHUNK_BYTES, CHUNK_GROUPS};
use crate::kernels::RowsCall;
use crate::tensor::GgmlType;

/// # Safety
/// The CPU must have AVX2, FMA and F16C and the arguments must pass the checks of
/// `matmul_rows_int8` (which makes this call only if `Isa::int8_available`); no other thread
/// may touch the outputs during the call.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matmul_rows(call: &RowsCall<QuantizedRows>) {
    // SAFETY: the caller's precondition is `by_type`'s, and the CPU has the features this
    // function enables.
    unsafe { by_type::<Avx2I32>(call) }
}

/// Two AVX2 registers: lanes 0..8 and 8..16.
#[derive(Clone, Copy)]
pub(crate) struct Avx2I32(__m256i, __m256i);

/// Half `h` (lanes `8h..8h + 8`) of word `j` of a chunk of `n` groups; missing lanes zero.
///
/// # Safety
/// The CPU must have AVX2, and `codes` be valid for the chunk's code words up to word `j`
/// (`4 n` bytes each).
#[inline(always)]
unsafe fn word256(codes: *const u8, j: usize, n: usize, h: usize) -> __m256i {
    // SAFETY: word `j` of the chunk starts `4 n j` bytes into it, and `lanes256` reads within
    // its `4 n` bytes (this function's precondition).
    unsafe { lanes256(codes.add(4 * n * j), n, h) }
}

/// Lanes `8h..8h + 8` of the first `n` (1 to 16) i32 lanes from `p`; missing lanes zero.
///
/// # Safety
/// The CPU must have AVX2, and `p` be valid for `4 n` bytes (the first `n` lanes).
#[inline(always)]
unsafe fn lanes256(p: *const u8, n: usize, h: usize) -> __m256i {
    // SAFETY: the CPU has AVX2; the load reads lanes `8h..8h + m` of `p`, all among the first
    // `n` (a masked load reads only those of the mask), within the caller's `4 n` bytes.
    unsafe {
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
}

/// The f16 at `p` in every lane.
///
/// # Safety
/// The CPU must have AVX2 and F16C, and `p` be valid for 2 bytes.
#[inline(always)]
unsafe fn splat_f16(p: *const u8) -> __m256 {
    // SAFETY: `p` is valid for 2 bytes and the CPU has AVX2 and F16C (this function's
    // precondition).
    unsafe {
        let bits = std::ptr::read_unaligned(p.cast::<u16>());
        _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }
}

/// Q6_K's sub-block scales of a chunk of `n` (8 or 16) groups at `sub` (`[n][2]` i8) as i16
/// pairs in i32 lanes, each array over lanes 0..8 and 8..16, zero past `n`: per half `h` of
/// the values, `(sc_h, sc_h)` (`vpmaddwd`'s factor of a half's pair sums), and `(sc_0, sc_1)`.
///
/// # Safety
/// The CPU must have AVX2, and `sub` be valid for `2 n` bytes.
#[inline(always)]
unsafe fn sub_scales256(sub: *const u8, n: usize) -> SubScales {
    // SAFETY: the loads read the `2 n` bytes at `sub` (16 per super-block), and the CPU has
    // AVX2 (this function's precondition).
    unsafe {
        let mut halves = [[_mm256_setzero_si256(); 2]; 2];
        let mut both = [_mm256_setzero_si256(); 2];
        for h in 0..n / 8 {
            // Lane l: the i16 pair (sc_0, sc_1) of group l.
            let mix = _mm256_cvtepi8_epi16(_mm_loadu_si128(sub.add(16 * h).cast()));
            both[h] = mix;
            // Each lane's first i16 (sc_0) or second (sc_1) in both of its places.
            halves[0][h] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(mix, 0xA0), 0xA0);
            halves[1][h] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(mix, 0xF5), 0xF5);
        }
        SubScales { halves, both }
    }
}

/// A chunk's sub-block scales as `dot_q6` takes them ([`sub_scales256`]).
#[derive(Clone, Copy)]
pub(crate) struct SubScales {
    /// [half of the values][lanes 0..8, 8..16]: `(sc_h, sc_h)` i16 pairs.
    halves: [[__m256i; 2]; 2],
    /// [lanes 0..8, 8..16]: `(sc_0, sc_1)` i16 pairs.
    both: [__m256i; 2],
}

/// Whether `K` is Q8_0 (the one type with 32 code bytes per group), and whether its codes are
/// nibbles taken as they are or less 8 (Q4_0, Q4_1, Q4_K): the types `wide_chunk` takes word
/// by word.
#[inline(always)]
fn word_by_word<K: Kind>() -> (bool, bool) {
    (K::CODE_BYTES == 32, K::CODE_BYTES == 16 && matches!(K::BIAS_LOG2, None | Some(3)))
}

/// One Q8_0 block (at `block`) against its group's 32 activation codes (at `x`): 8 partial
/// sums of `dot_q8`'s products (`|q| * sign(q) x` in i16 pairs, at most `2 * 128 * 127` in
/// magnitude, then widened).
///
/// # Safety
/// The CPU must have AVX2; `block` must be valid for one block, `x` for 32 bytes.
#[inline(always)]
unsafe fn q8_block_dot(block: *const u8, x: *const i8) -> __m256i {
    // SAFETY: the CPU has AVX2, and the loads read the block's codes and the 32 activation
    // bytes (this function's precondition).
    unsafe {
        let w = _mm256_loadu_si256(block.add(2).cast());
        let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(_mm256_loadu_si256(x.cast()), w));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }
}

/// 8 groups' partial sums (`v[i]`: 8 lanes of 4 values each, in value order) reduced to one
/// sum per group, lane `i` the sum of group `i`: pairwise horizontal adds in three levels, the
/// last one across the two 128-bit halves.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn group_sums8(v: [__m256i; 8]) -> __m256i {
    // SAFETY: the CPU has AVX2 (this function's precondition).
    unsafe {
        // Lanes [group 2i: sums of values 0..8, 8..16; group 2i + 1: the same | values 16..32].
        let s: [__m256i; 4] = per_index!(4, |i| _mm256_hadd_epi32(v[2 * i], v[2 * i + 1]));
        // Lanes [groups 0..4 (or 4..8): sums of values 0..16 | of values 16..32].
        let (t0, t1) = (_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(t0, t1), _mm256_permute2x128_si256::<0x31>(t0, t1))
    }
}

/// 8 consecutive blocks' dots ([`q8_block_dot`]) reduced to one sum per block
/// ([`group_sums8`]).
///
/// # Safety
/// The CPU must have AVX2; `blocks` must be valid for 8 blocks, `x` for 256 bytes.
#[inline(always)]
unsafe fn q8_blocks_dots8(blocks: *const u8, x: *const i8) -> __m256i {
    // SAFETY: the CPU has AVX2, and block `i < 8` and its 32 activation bytes are within the
    // caller's buffers (this function's precondition).
    unsafe { group_sums8(per_index!(8, |i| q8_block_dot(blocks.add(Q8_0_BLOCK * i), x.add(32 * i)))) }
}

/// One token's integer sums (step 1) of a full chunk of 16 Q8_0 blocks at `blocks` against
/// the chunk's activation codes in group order (`xg`, 512 bytes): exact, so `dot_q8`'s on the
/// transposed codes.
///
/// # Safety
/// The CPU must have AVX2; `blocks` must be valid for 16 blocks, `xg` for 512 bytes.
#[inline(always)]
unsafe fn q8_blocks_dots(blocks: *const u8, xg: *const i8) -> Avx2I32 {
    // SAFETY: the halves are blocks 0..8 and 8..16 with their activation bytes, within the
    // caller's buffers (this function's precondition).
    unsafe { Avx2I32(q8_blocks_dots8(blocks, xg), q8_blocks_dots8(blocks.add(8 * Q8_0_BLOCK), xg.add(256))) }
}

/// Group `g` (< 8) of the Q5_K super-block at `block` against its 32 activation codes (at
/// `x`): 8 partial sums of `u x` over 4 values each (`u` in i16 pairs, at most `2 * 31 * 127`
/// in magnitude, then widened). Value `l` has its low 4 bits in nibble `g % 2` of
/// `qs[32 (g / 2) + l]` and bit 4 in bit `g` of `qh[l]`.
///
/// # Safety
/// The CPU must have AVX2; `block` must be valid for a super-block, `x` for 32 bytes.
#[inline(always)]
unsafe fn q5k_group_dot(block: *const u8, g: usize, x: *const i8) -> __m256i {
    // SAFETY: the CPU has AVX2, and the loads read 32 bytes of the super-block's `qs`, its
    // `qh` and the 32 activation bytes (this function's precondition).
    unsafe {
        let qh = _mm256_loadu_si256(block.add(Q4K_HEADER).cast());
        let qs = _mm256_loadu_si256(block.add(Q4K_HEADER + 32 + 32 * (g / 2)).cast());
        let low = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(4 * (g % 2) as i32)), _mm256_set1_epi8(0x0F));
        let high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(g as i32)), _mm256_set1_epi8(1));
        let u = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256(x.cast())), _mm256_set1_epi16(1))
    }
}

/// One token's integer sums (step 1) of a full chunk of two Q5_K super-blocks at `blocks`
/// against the chunk's activation codes in group order (`xg`, 512 bytes): each group's partial
/// sums ([`q5k_group_dot`]) reduced to one per group ([`group_sums8`]). Exact, so `dot_q5`'s
/// sums on the unpacked codes.
///
/// # Safety
/// The CPU must have AVX2; `blocks` must be valid for 2 super-blocks, `xg` for 512 bytes.
#[inline(always)]
unsafe fn q5k_blocks_dots(blocks: *const u8, xg: *const i8) -> Avx2I32 {
    // SAFETY: group `g < 8` of each super-block and its 32 activation bytes are within the
    // caller's buffers (this function's precondition).
    unsafe {
        let half: [__m256i; 2] = per_index!(2, |b| group_sums8(per_index!(8, |g| q5k_group_dot(blocks.add(Q5K_BLOCK * b), g, xg.add(256 * b + 32 * g)))));
        Avx2I32(half[0], half[1])
    }
}

/// Group `g` (< 8) of the Q6_K super-block at `block` against its 32 activation codes (at
/// `x`): 8 partial sums of `(u - 32) x` over 4 values each, lanes 0..4 the group's first
/// sub-block of 16 values, 4..8 its second (`|u - 32| * sign(u - 32) x` in i16 pairs, at most
/// `2 * 32 * 127` in magnitude, then widened). Value `l` of group `g = 4 n + t` has its low 4
/// bits in nibble `t / 2` of `ql[64 n + 32 (t % 2) + l]` and bits 4 and 5 in bits
/// `2 t..2 t + 2` of `qh[32 n + l]` (the 16-bit shifts move no kept bit across a byte).
///
/// # Safety
/// The CPU must have AVX2; `block` must be valid for a super-block, `x` for 32 bytes.
#[inline(always)]
unsafe fn q6k_group_dot(block: *const u8, g: usize, x: *const i8) -> __m256i {
    // SAFETY: the CPU has AVX2, and the loads read 32 bytes of the super-block's `ql` and
    // `qh` and the 32 activation bytes (this function's precondition).
    unsafe {
        let (n, t) = (g / 4, g % 4);
        let ql = _mm256_loadu_si256(block.add(64 * n + 32 * (t % 2)).cast());
        let qh = _mm256_loadu_si256(block.add(128 + 32 * n).cast());
        let m4 = _mm256_set1_epi8(0x0F);
        let low = if t < 2 { _mm256_and_si256(ql, m4) } else { _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4) };
        let high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t as i32)), _mm256_set1_epi8(3));
        let w = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
        let p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(_mm256_loadu_si256(x.cast()), w));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }
}

/// One Q6_K super-block's 8 group sums `sc_0 sum_{i<16} (u - 32) x + sc_1 sum_{i>=16} (u - 32) x`
/// (lane `g` = group `g`) against its 256 activation codes in group order (`x`): the groups'
/// partial sums ([`q6k_group_dot`]) reduced to one per sub-block by two levels of horizontal
/// adds, times the sub-block scales, and the two 128-bit halves (first and second sub-blocks)
/// added. Exact, so `dot_q6`'s sums on the unpacked codes.
///
/// # Safety
/// The CPU must have AVX2; `block` must be valid for a super-block, `x` for 256 bytes.
#[inline(always)]
unsafe fn q6k_block_dots8(block: *const u8, x: *const i8) -> __m256i {
    // SAFETY: the CPU has AVX2, and group `g < 8` and its 32 activation bytes, and the 16
    // sub-block scales, are within the caller's buffers (this function's precondition).
    unsafe {
        let v: [__m256i; 8] = per_index!(8, |g| q6k_group_dot(block, g, x.add(32 * g)));
        let s: [__m256i; 4] = per_index!(4, |i| _mm256_hadd_epi32(v[2 * i], v[2 * i + 1]));
        // Lanes [groups 0..4 (or 4..8): first sub-block sums | second sub-block sums].
        let (t0, t1) = (_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        // The sub-block scales in the same lanes.
        let order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
        let sc = _mm_shuffle_epi8(_mm_loadu_si128(block.add(Q6K_SCALES_AT).cast()), order);
        let u0 = _mm256_mullo_epi32(t0, _mm256_cvtepi8_epi32(sc));
        let u1 = _mm256_mullo_epi32(t1, _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)));
        _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(u0, u1), _mm256_permute2x128_si256::<0x31>(u0, u1))
    }
}

/// One token's integer sums (step 1) of a full chunk of two Q6_K super-blocks at `blocks`
/// against the chunk's activation codes in group order (`xg`, 512 bytes).
///
/// # Safety
/// The CPU must have AVX2; `blocks` must be valid for 2 super-blocks, `xg` for 512 bytes.
#[inline(always)]
unsafe fn q6k_blocks_dots(blocks: *const u8, xg: *const i8) -> Avx2I32 {
    // SAFETY: the halves are the two super-blocks with their activation bytes, within the
    // caller's buffers (this function's precondition).
    unsafe { Avx2I32(q6k_block_dots8(blocks, xg), q6k_block_dots8(blocks.add(Q6K_BLOCK), xg.add(256))) }
}

impl IntLanes for Avx2I32 {
    type F = Avx2x2;
    /// Tiles of nibble codes (Q4_0, Q4_1, Q4_K) and of Q8_0 codes word by word: each code
    /// word is unpacked right before its `maddubs` and used for all the tile's tokens, so no
    /// unpacked chunk is held in registers (or spilled). The integer sums are `dot_q4`'s and
    /// `dot_q8`'s (in i16 within their bounds, then widened), so the result is
    /// `wide_chunk_dots`', which the other types take. One token over a full chunk of Q8_0's
    /// blocks read in place takes [`q8_blocks_dots`] (Q8_0), [`q5k_blocks_dots`] (Q5_K) or
    /// [`q6k_blocks_dots`] (Q6_K) against the codes in group order.
    #[inline(always)]
    unsafe fn wide_chunk<K: Kind, const NR: usize, const NT: usize>(
        rows: &[*const u8; NR],
        d_ptr: &[*const u8; NR],
        groups: usize,
        c: usize,
        x: &Acts,
        acc: &mut [[Avx2x2; NT]; NR],
    ) {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `rows`, `d_ptr` and `x` cover chunk `c`
        // of the tile as `wide_chunk_dots` asks (the `IntLanes` contract).
        unsafe {
            if K::BLOCKS.is_some() && NR == 1 && NT == 1 && groups - c * CHUNK_GROUPS >= CHUNK_GROUPS {
                let g0 = c * CHUNK_GROUPS;
                let (blocks, xg) = (K::codes(rows[0], g0), x.grouped.add(g0 * 32));
                let isum = match K::BLOCKS {
                    Some(GgmlType::Q6_K) => q6k_blocks_dots(blocks, xg),
                    Some(GgmlType::Q5_K) => q5k_blocks_dots(blocks, xg),
                    _ => q8_blocks_dots(blocks, xg),
                };
                let (dw, mw) = chunk_scales::<Self, K, NR>(d_ptr, groups, g0, CHUNK_GROUPS);
                let sx = if K::OFFSET { Avx2x2::load(x.s.add(g0)) } else { Avx2x2::zero() };
                acc[0][0] = scale_add::<Avx2x2, K>(acc[0][0], isum.to_f32(), dw[0], Avx2x2::load(x.d.add(g0)), mw[0], sx);
                return;
            }
            let (q8, nibbles) = word_by_word::<K>();
            if !q8 && !nibbles {
                return wide_chunk_dots::<Self, K, NR, NT>(rows, d_ptr, groups, c, x, acc);
            }
            let g0 = c * CHUNK_GROUPS;
            let n = (groups - g0).min(CHUNK_GROUPS);
            let (mask, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
            let codes: [*const u8; NR] = per_index!(NR, |r| rows[r].add(g0 * K::CODE_BYTES));
            let xq: [*const i8; NT] = per_index!(NT, |t| x.q.add(t * x.q_stride + c * CHUNK_BYTES));
            // [row][token][half]
            let mut sums = [[[_mm256_setzero_si256(); 2]; NT]; NR];
            for h in 0..2 {
                if q8 {
                    // As `dot_q8`: `|q| * sign(q) x`, each word widened to i32 before adding.
                    for j in 0..8 {
                        let w: [(__m256i, __m256i); NR] = per_index!(NR, |r| {
                            let raw = word256(codes[r], j, n, h);
                            (_mm256_abs_epi8(raw), raw)
                        });
                        for t in 0..NT {
                            let xj = _mm256_loadu_si256(xq[t].add(64 * j + 32 * h).cast());
                            for r in 0..NR {
                                let p = _mm256_maddubs_epi16(w[r].0, _mm256_sign_epi8(xj, w[r].1));
                                sums[r][t][h] = _mm256_add_epi32(sums[r][t][h], _mm256_madd_epi16(p, ones));
                            }
                        }
                    }
                    continue;
                }
                let mut s = [[_mm256_setzero_si256(); NT]; NR];
                for j in 0..4 {
                    let w: [(__m256i, __m256i); NR] = per_index!(NR, |r| {
                        let v = word256(codes[r], j, n, h);
                        (_mm256_and_si256(v, mask), _mm256_and_si256(_mm256_srli_epi16(v, 4), mask))
                    });
                    for t in 0..NT {
                        let x0 = _mm256_loadu_si256(xq[t].add(64 * j + 32 * h).cast());
                        let x1 = _mm256_loadu_si256(xq[t].add(64 * (j + 4) + 32 * h).cast());
                        for r in 0..NR {
                            let p = _mm256_add_epi16(_mm256_maddubs_epi16(w[r].0, x0), _mm256_maddubs_epi16(w[r].1, x1));
                            s[r][t] = _mm256_add_epi16(s[r][t], p);
                        }
                    }
                }
                for r in 0..NR {
                    for t in 0..NT {
                        sums[r][t][h] = _mm256_madd_epi16(s[r][t], ones);
                    }
                }
            }
            let (dw, mw) = chunk_scales::<Self, K, NR>(d_ptr, groups, g0, n);
            for t in 0..NT {
                let lane = t * x.lane_stride + g0;
                let dx = Avx2x2::load(x.d.add(lane));
                let sx = if K::OFFSET { Avx2x2::load(x.s.add(lane)) } else { Avx2x2::zero() };
                for r in 0..NR {
                    let mut isum = Avx2I32(sums[r][t][0], sums[r][t][1]);
                    // Q4_0's nibbles are `q + 8` (Q8_0's bias is for AVX-512 only).
                    if nibbles && K::BIAS_LOG2.is_some() {
                        isum = isum.minus_8_qsum(x.qsum.add(lane));
                    }
                    acc[r][t] = scale_add::<Avx2x2, K>(acc[r][t], isum.to_f32(), dw[r], dx, mw[r], sx);
                }
            }
        }
    }
    /// All but the types `wide_chunk` takes word by word.
    #[inline(always)]
    fn prepares<K: Kind>() -> bool {
        word_by_word::<K>() == (false, false)
    }
    /// The trait's arithmetic in vectors (as the AVX-512 `q4k_scales`): the 6-bit integers
    /// unpacked on 32-bit words, the f16 scales by `vcvtph2ps`, the (exact) products, the
    /// sign flipped.
    #[inline(always)]
    unsafe fn q4k_scales(h: *const u8, stride: usize, n: usize) -> (Avx2x2, Avx2x2) {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `h` is valid for the `n / 8` headers of
        // 16 bytes, `stride` apart (the `IntLanes` contract).
        unsafe {
            let sign = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
            let (sc, m) = q4k_scales_mins_x2(h, stride, n == 16);
            let mut dw = [_mm256_setzero_ps(); 2];
            let mut mw = [_mm256_setzero_ps(); 2];
            for b in 0..n / SUPER_GROUPS {
                // Header b's 8 bytes of each.
                let (sc, m) = if b == 0 { (sc, m) } else { (_mm_srli_si128(sc, 8), _mm_srli_si128(m, 8)) };
                let h = h.add(stride * b);
                dw[b] = _mm256_mul_ps(splat_f16(h), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
                mw[b] = _mm256_xor_ps(_mm256_mul_ps(splat_f16(h.add(2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m))), sign);
            }
            (Avx2x2(dw[0], dw[1]), Avx2x2(mw[0], mw[1]))
        }
    }
    #[inline(always)]
    unsafe fn q6k_scales(d: *const u8, stride: usize, n: usize) -> Avx2x2 {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `d` is valid for `n / 8` f16 values,
        // `stride` apart (the `IntLanes` contract).
        unsafe {
            let hi = if n == 16 { splat_f16(d.add(stride)) } else { _mm256_setzero_ps() };
            Avx2x2(splat_f16(d), hi)
        }
    }
    #[inline(always)]
    unsafe fn q5(codes: *const u8, n: usize) -> Self::Q4 {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `codes` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe {
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
    }
    /// `maddubs` of codes `0..31` and `|x| <= 127`: pair sums at most `2 * 31 * 127 = 7874`,
    /// four words added in i16 (`31496 < 32767`), then widened.
    #[inline(always)]
    unsafe fn dot_q5(w: &Self::Q4, x: *const i8) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `x` is valid for the bytes this method
        // names (the `IntLanes` contract).
        unsafe {
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
    }
    #[inline(always)]
    unsafe fn t5(codes: *const u8, n: usize) -> Self::T4 {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `codes` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe {
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
    }
    #[inline(always)]
    unsafe fn q_low<const Q3: bool>(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `codes` and `sub` are valid for the bytes
        // this method names (the `IntLanes` contract).
        unsafe {
            let (m2, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
            let bias = _mm256_set1_epi8(if Q3 { 28 } else { 32 });
            let mut w = [[_mm256_setzero_si256(); 2]; 8];
            for h in 0..2 {
                let low = [word256(codes, 0, n, h), word256(codes, 1, n, h)];
                let high = if Q3 { word256(codes, 2, n, h) } else { _mm256_setzero_si256() };
                // As the AVX-512 `q_low`.
                for (k, word) in w.iter_mut().enumerate() {
                    let l = _mm256_and_si256(_mm256_srl_epi16(low[k / 4], _mm_cvtsi32_si128(2 * (k % 4) as i32)), m2);
                    let hb = _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(k as i32)), one), 2);
                    word[h] = _mm256_add_epi8(_mm256_or_si256(l, hb), bias);
                }
            }
            (w, sub_scales256(sub, n))
        }
    }
    /// ([word][half] of `u`, the sub-block scales)
    type Q6 = ([[__m256i; 2]; 8], SubScales);
    #[inline(always)]
    unsafe fn q6(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `codes` and `sub` are valid for the bytes
        // this method names (the `IntLanes` contract).
        unsafe {
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
            (w, sub_scales256(sub, n))
        }
    }
    /// `maddubs` of `u <= 63` and `|x| <= 127`: pair sums at most `2 * 63 * 127 = 16002`,
    /// two words added in i16 (`32004 < 32767`), then widened by `vpmaddwd` with the half's
    /// sub-block scale (`2 * 32004 * 128` per word pair, at most `2^25` over all 32 values: far
    /// from overflow). Less `32 (sc_0 hsum + sc_1 (qsum - hsum))`, one `vpmaddwd` of the
    /// `(hsum, qsum - hsum)` pairs (each at most `16 * 127` in magnitude, an i16): the integer
    /// sum of the module docs, exactly.
    #[inline(always)]
    unsafe fn dot_q6(w: &Self::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> Self::F {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `x`, `qsum` and `hsum` are valid for the
        // bytes this method names (the `IntLanes` contract).
        unsafe {
            let (u, sc) = w;
            let mut out = [_mm256_setzero_si256(); 2];
            for (h, o) in out.iter_mut().enumerate() {
                let mut sum = _mm256_setzero_si256();
                for k in (0..8).step_by(2) {
                    let x0 = _mm256_loadu_si256(x.add(64 * k + 32 * h).cast());
                    let x1 = _mm256_loadu_si256(x.add(64 * k + 64 + 32 * h).cast());
                    let s = _mm256_add_epi16(_mm256_maddubs_epi16(u[k][h], x0), _mm256_maddubs_epi16(u[k + 1][h], x1));
                    // Words 0..4 are the first half of the values, 4..8 the second.
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(s, sc.halves[k / 4][h]));
                }
                let q = _mm256_loadu_si256(qsum.add(8 * h).cast());
                let hs = _mm256_loadu_si256(hsum.add(8 * h).cast());
                let pairs = _mm256_or_si256(_mm256_and_si256(hs, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(_mm256_sub_epi32(q, hs), 16));
                *o = _mm256_sub_epi32(sum, _mm256_slli_epi32(_mm256_madd_epi16(sc.both[h], pairs), 5));
            }
            Avx2I32(out[0], out[1]).to_f32()
        }
    }
    /// [word][half]
    type Q4 = [[__m256i; 2]; 8];
    /// ([word][half] of |q|, [word][half] of q): the sign trick.
    type Q8 = ([[__m256i; 2]; 8], [[__m256i; 2]; 8]);
    #[inline(always)]
    unsafe fn q4(codes: *const u8, n: usize) -> Self::Q4 {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `codes` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe {
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
    }
    #[inline(always)]
    unsafe fn q8(codes: *const u8, n: usize) -> Self::Q8 {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `codes` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe {
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
    }
    /// `maddubs` of codes `0..15` and `x` in `-127..=127` gives pair sums of at most
    /// `2 * 15 * 127 = 3810`; the i16 sum over all 8 words is at most
    /// `16 * 15 * 127 = 30480 < 32767`, so it is formed in i16 and widened once.
    #[inline(always)]
    unsafe fn dot_q4(w: &Self::Q4, x: *const i8) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `x` is valid for the bytes this method
        // names (the `IntLanes` contract).
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut out = [_mm256_setzero_si256(); 2];
            for (h, o) in out.iter_mut().enumerate() {
                let mut s = _mm256_maddubs_epi16(w[0][h], _mm256_loadu_si256(x.add(32 * h).cast()));
                for k in 1..8 {
                    let xk = _mm256_loadu_si256(x.add(64 * k + 32 * h).cast());
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[k][h], xk));
                }
                *o = _mm256_madd_epi16(s, ones);
            }
            Avx2I32(out[0], out[1])
        }
    }
    /// `|q| * sign(q) x`: `|q| <= 128`, `|sign(q) x| <= 127`, so each `maddubs` pair sum is
    /// at most `2 * 128 * 127 = 32512 < 32767`; each word is widened to i32 before adding.
    #[inline(always)]
    unsafe fn dot_q8(w: &Self::Q8, x: *const i8, _qsum: *const i32) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `x` is valid for the bytes this method
        // names (the `IntLanes` contract).
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let (abs, raw) = w;
            let mut out = [_mm256_setzero_si256(); 2];
            for (h, acc) in out.iter_mut().enumerate() {
                for k in 0..8 {
                    let xk = _mm256_loadu_si256(x.add(64 * k + 32 * h).cast());
                    let p = _mm256_maddubs_epi16(abs[k][h], _mm256_sign_epi8(xk, raw[k][h]));
                    *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, ones));
                }
            }
            Avx2I32(out[0], out[1])
        }
    }
    #[inline(always)]
    unsafe fn minus_8_qsum(self, qsum: *const i32) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `qsum` is valid for the bytes this method
        // names (the `IntLanes` contract).
        unsafe {
            let q: [__m256i; 2] = per_index!(2, |h| _mm256_slli_epi32(_mm256_loadu_si256(qsum.add(8 * h).cast()), 3));
            Avx2I32(_mm256_sub_epi32(self.0, q[0]), _mm256_sub_epi32(self.1, q[1]))
        }
    }
    #[inline(always)]
    unsafe fn to_f32(self) -> Avx2x2 {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `IntLanes` contract).
        unsafe { Avx2x2(_mm256_cvtepi32_ps(self.0), _mm256_cvtepi32_ps(self.1)) }
    }
    /// [nibble half][lane half]
    type T4 = [[__m256i; 2]; 2];
    /// ([code half][lane half] of |q|, the same of q)
    type T8 = ([[__m256i; 2]; 2], [[__m256i; 2]; 2]);
    #[inline(always)]
    unsafe fn t4(codes: *const u8, n: usize) -> Self::T4 {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `codes` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe {
            let mask = _mm256_set1_epi8(0x0F);
            let mut w = [[_mm256_setzero_si256(); 2]; 2];
            for h in 0..2 {
                let v = lanes256(codes, 4 * n, h);
                w[0][h] = _mm256_and_si256(v, mask);
                w[1][h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            }
            w
        }
    }
    #[inline(always)]
    unsafe fn t8(codes: *const u8, n: usize) -> Self::T8 {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `codes` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe {
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
    }
    /// Pair sums at most `2 * 31 * 127` (5-bit codes of `t5`; nibbles less), two of them
    /// added in i16: at most `4 * 31 * 127 = 15748`.
    #[inline(always)]
    unsafe fn dot_t4(w: &Self::T4, x: *const i8) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `x` is valid for the bytes this method
        // names (the `IntLanes` contract).
        unsafe {
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
    }
    /// The sign trick of `dot_q8`: pair sums at most `2 * 128 * 127 = 32512`, widened
    /// before adding.
    #[inline(always)]
    unsafe fn dot_t8(w: &Self::T8, x: *const i8, _lane_sum: *const i32) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `x` is valid for the bytes this method
        // names (the `IntLanes` contract).
        unsafe {
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
    }
    #[inline(always)]
    unsafe fn spread4(v: Avx2x2) -> Avx2x2 {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `IntLanes` contract).
        unsafe {
            let lo = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
            let hi = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
            Avx2x2(_mm256_permutevar8x32_ps(v.0, lo), _mm256_permutevar8x32_ps(v.0, hi))
        }
    }
}
