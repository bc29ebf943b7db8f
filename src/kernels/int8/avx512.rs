//! [`IntLanes`] on one AVX-512 register: VNNI `vpdpbusd`.

use std::arch::x86_64::*;

use super::kinds::{Q5K_BLOCK, Q6K_BLOCK, Q6K_SCALES_AT, Q8_0_BLOCK};
use super::{by_type, chunk_scales, scale_add, wide_chunk_dots, Acts, IntLanes, Kind, PreparedChunk};
use crate::kernels::kquant::{q4k_scales_mins_x2, Q4K_HEADER};
use crate::kernels::lanes::{Avx512, Lanes16};
use crate::kernels::quantize_act::{QuantizedRows, CHUNK_BYTES, CHUNK_GROUPS};
use crate::kernels::RowsCall;
use crate::tensor::GgmlType;

/// # Safety
/// The CPU must have AVX-512 (F, BW, VL, VNNI), AVX2, FMA and F16C and the arguments must pass
/// the checks of `matmul_rows_int8` (which makes this call only if `Isa::int8_available`); no
/// other thread may touch the outputs during the call.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn matmul_rows(call: &RowsCall<QuantizedRows>) {
    // SAFETY: the caller's precondition is `by_type`'s, and the CPU has the features this
    // function enables.
    unsafe { by_type::<Vnni>(call) }
}

/// One AVX-512 register of 16 i32 lanes.
#[derive(Clone, Copy)]
pub(crate) struct Vnni(__m512i);

/// Word `j` (64 bytes: 4 per lane) of a chunk of `n` groups; missing lanes zero.
///
/// # Safety
/// The CPU must have AVX-512F, and `codes` be valid for the chunk's code words up to word `j`
/// (`4 n` bytes each).
#[inline(always)]
unsafe fn word512(codes: *const u8, j: usize, n: usize) -> __m512i {
    // SAFETY: word `j` of the chunk starts `4 n j` bytes into it, and `lanes512` reads within
    // its `4 n` bytes (this function's precondition).
    unsafe { lanes512(codes.add(4 * n * j), n) }
}

/// The first `n` (1 to 16) i32 lanes from `p`; the others zero.
///
/// # Safety
/// The CPU must have AVX-512F, and `p` be valid for `4 n` bytes (the first `n` lanes).
#[inline(always)]
unsafe fn lanes512(p: *const u8, n: usize) -> __m512i {
    // SAFETY: the CPU has AVX-512F; the load reads the first `n` lanes of `p` (the mask's),
    // within the caller's `4 n` bytes.
    unsafe {
        if n == 16 {
            _mm512_loadu_si512(p.cast())
        } else {
            _mm512_maskz_loadu_epi32(((1u32 << n) - 1) as __mmask16, p.cast())
        }
    }
}

/// Code words `j` and `j + 4` (`j < 4`) of a wide chunk of `n` groups as `vpdpbusd`'s
/// unsigned operand, against activation words `j` and `j + 4`: the low and high nibbles of
/// word `j` (Q4), or words `j` and `j + 4` biased (Q8_0, `q ^ 0x80 = q + 128`).
///
/// # Safety
/// The CPU must have AVX-512 (F, BW), and `codes` be valid for a wide chunk of `n` groups of
/// `K`'s codes.
#[inline(always)]
unsafe fn word_pair<K: Kind>(codes: *const u8, n: usize, j: usize) -> (__m512i, __m512i) {
    // SAFETY: the CPU has AVX-512 (F, BW) and `codes` holds words `j` and `j + 4` (this
    // function's precondition).
    unsafe {
        if K::CODE_BYTES == 16 {
            let mask = _mm512_set1_epi8(0x0F);
            let v = word512(codes, j, n);
            (_mm512_and_si512(v, mask), _mm512_and_si512(_mm512_srli_epi16(v, 4), mask))
        } else {
            let bias = _mm512_set1_epi8(0x80u8 as i8);
            (_mm512_xor_si512(word512(codes, j, n), bias), _mm512_xor_si512(word512(codes, j + 4, n), bias))
        }
    }
}

/// Q6_K's layout of sub-block scales (`[n][2]` i8 at `sub`) as (`sc_0`, `sc_1`) f32 lanes
/// (small integers, exact), zero past `n`.
///
/// # Safety
/// The CPU must have AVX-512 (F, BW), and `sub` be valid for `2 n` bytes.
#[inline(always)]
unsafe fn sub_scales512(sub: *const u8, n: usize) -> (__m512, __m512) {
    // SAFETY: the CPU has AVX-512 (F, BW); the masked load reads the first `n` pairs, the
    // caller's `2 n` bytes.
    unsafe { sub_scale_pairs(_mm256_maskz_loadu_epi16(((1u32 << n) - 1) as __mmask16, sub.cast())) }
}

/// [`sub_scales512`] of the 16 pairs of i8 in `pairs`.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
unsafe fn sub_scale_pairs(pairs: __m256i) -> (__m512, __m512) {
    // SAFETY: the CPU has AVX-512 F (this function's precondition).
    unsafe {
        // Lane l: the i16 `sc_1 * 256 + (sc_0 as u8)`, sign-extended.
        let pairs = _mm512_cvtepi16_epi32(pairs);
        let (sc0, sc1) = (_mm512_srai_epi32(_mm512_slli_epi32(pairs, 24), 24), _mm512_srai_epi32(pairs, 8));
        (_mm512_cvtepi32_ps(sc0), _mm512_cvtepi32_ps(sc1))
    }
}

/// `sc_0 a + sc_1 b` per lane, in f32: exact, since `a` and `b` (a group half's integer sum)
/// are below `2^16` in magnitude (the module docs' bounds), their products by `|sc| <= 128`
/// below `2^23` and the sum below `2^24`. Cheaper than `vpmulld`'s two micro-ops on the port
/// `vpdpbusd` needs.
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
unsafe fn scaled_halves(sc0: __m512, a: __m512i, sc1: __m512, b: __m512i) -> __m512 {
    // SAFETY: the CPU has AVX-512F (this function's precondition).
    unsafe { _mm512_fmadd_ps(sc1, _mm512_cvtepi32_ps(b), _mm512_mul_ps(sc0, _mm512_cvtepi32_ps(a))) }
}

/// 16 f32 lanes: lanes 0..8 lane `a` of `v`, lanes 8..16 lane `b` (a super-block's
/// value spread over its 8 groups).
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
unsafe fn spread8(v: __m128, a: i32, b: i32) -> __m512 {
    // SAFETY: the CPU has AVX-512F (this function's precondition).
    unsafe {
        let idx = _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b);
        _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
    }
}

/// Lanes 8..16 zeroed unless the chunk has 16 groups (two super-blocks).
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
unsafe fn first_lanes(v: __m512, n: usize) -> __m512 {
    // SAFETY: the CPU has AVX-512F (this function's precondition).
    unsafe {
        if n == 16 {
            v
        } else {
            _mm512_maskz_mov_ps(0x00FF, v)
        }
    }
}

/// Where code word `j` (bytes `4j..4j + 4`) of block `b` of a Q8_0 chunk sits after stage
/// `stage` of [`Vnni::q8_blocks`]'s transposition: (register, i32 lane). Stage 0 is the loads
/// (register `k` holds blocks `2k` and `2k + 1`), stage 3 the chunked order (register `j`, lane
/// `b`); each stage in between moves one bit of `b` out of the lane index into the register
/// index and one bit of `j` the other way.
const fn q8_place(stage: usize, b: usize, j: usize) -> (usize, usize) {
    match stage {
        0 => (b / 2, (b % 2) * 8 + j),
        1 => ((b / 4) * 2 + j % 2, (b % 4) * 4 + j / 2),
        2 => ((b / 8) * 4 + j % 4, (b % 8) * 2 + j / 4),
        _ => (j, b),
    }
}

/// Stage `stage` (1 to 3) of the transposition as `vpermt2d`s: for each output register, its
/// two source registers of the stage before and the lane indices (bit 4 set: the second
/// source). Each output register takes its 16 values from exactly two source registers (the
/// placement above moves one bit each way).
const fn q8_stage(stage: usize) -> [(usize, usize, [i32; 16]); 8] {
    let mut out = [(usize::MAX, usize::MAX, [0i32; 16]); 8];
    let mut b = 0;
    while b < 16 {
        let mut j = 0;
        while j < 8 {
            let ((v, i), (pv, pl)) = (q8_place(stage, b, j), q8_place(stage - 1, b, j));
            let o = &mut out[v];
            if o.0 == usize::MAX || o.0 == pv {
                o.0 = pv;
                o.2[i] = pl as i32;
            } else {
                assert!(o.1 == usize::MAX || o.1 == pv, "two sources per register");
                o.1 = pv;
                o.2[i] = pl as i32 + 16;
            }
            j += 1;
        }
        b += 1;
    }
    out
}

/// Lane indices of stage `stage` (1 to 3) of [`q8_blocks_dots`]' and [`q6k_blocks_dots`]'
/// reductions, which add two
/// two-source permutations of a pair of registers. Each source holds `G = 1 << stage` groups
/// of `P = 16 / G` partial sums (lane `q P + p`); the result holds the `2 G` groups of both
/// (the first source's, then the second's) with `P / 2` partials each, lane `q P / 2 + p`
/// taking partial `p` (`low`) or `p + P / 2` (not `low`) of its group. Bit 4 of an index
/// selects the second source.
const fn reduce_index(stage: u32, low: bool) -> [i32; 16] {
    let g = 1usize << stage;
    let half = 16 / g / 2;
    let mut idx = [0i32; 16];
    let mut lane = 0;
    while lane < 16 {
        let (q, p) = (lane / half, lane % half);
        let source = if q < g { 0 } else { 16 };
        idx[lane] = (source + (q % g) * 2 * half + p + if low { 0 } else { half }) as i32;
        lane += 1;
    }
    idx
}

/// Stage `stage` of [`reduce_index`]'s reduction on the register pair `a`, `b`.
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
unsafe fn reduce_pair<const STAGE: u32>(a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: the CPU has AVX-512F (this function's precondition).
    unsafe { picked_sums(a, b, &const { reduce_index(STAGE, true) }, &const { reduce_index(STAGE, false) }) }
}

/// Lane `l`: lane `lo[l]` plus lane `hi[l]` of `a` and `b` taken as one 32-lane source
/// (indices 16 and up select `b`).
///
/// # Safety
/// The CPU must have AVX-512F.
#[inline(always)]
unsafe fn picked_sums(a: __m512i, b: __m512i, lo: &[i32; 16], hi: &[i32; 16]) -> __m512i {
    // SAFETY: the CPU has AVX-512F (this function's precondition); the indices are 16 i32.
    unsafe {
        let lo = _mm512_permutex2var_epi32(a, _mm512_loadu_epi32(lo.as_ptr()), b);
        _mm512_add_epi32(lo, _mm512_permutex2var_epi32(a, _mm512_loadu_epi32(hi.as_ptr()), b))
    }
}

/// The 32 code bytes of Q8_0 blocks `2k` (low half) and `2k + 1` (high half) at `blocks`.
///
/// # Safety
/// The CPU must have AVX-512 F; `blocks` must be valid for blocks `0..2k + 2`.
#[inline(always)]
unsafe fn q8_block_pair(blocks: *const u8, k: usize) -> __m512i {
    // SAFETY: the two loads read the code bytes of blocks 2k and 2k + 1 (the precondition).
    unsafe {
        let low = _mm256_loadu_si256(blocks.add(Q8_0_BLOCK * 2 * k + 2).cast());
        let high = _mm256_loadu_si256(blocks.add(Q8_0_BLOCK * (2 * k + 1) + 2).cast());
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high)
    }
}

/// One token's integer sums (step 1) of a full chunk of 16 Q8_0 blocks at `blocks` against
/// the chunk's activation codes in group order (`xg`, 512 bytes) with their 16 code sums
/// `qsum`: each pair of blocks against 64 activation bytes by one `vpdpbusd` (codes biased as
/// `q8` biases them), then the 8 partial sums of each group added by three stages of
/// permutations into lane `l` = group `l`, and the bias times `qsum` subtracted. The sums are
/// exact, so they are `dot_q8`'s on the transposed codes.
///
/// # Safety
/// The CPU must have AVX-512 (F, BW, VNNI); `blocks` must be valid for 16 blocks, `xg` for
/// 512 bytes and `qsum` for 16 i32.
#[inline(always)]
unsafe fn q8_blocks_dots(blocks: *const u8, xg: *const i8, qsum: *const i32) -> Vnni {
    // SAFETY: the CPU has AVX-512 (F, BW, VNNI), and the loads stay within the 16 blocks'
    // codes, the 512 activation bytes and the 16 sums (this function's precondition).
    unsafe {
        let bias = _mm512_set1_epi8(0x80u8 as i8);
        // Register k: lanes 0..8 the partial sums of group 2k, lanes 8..16 of group 2k + 1.
        let s: [__m512i; 8] = per_index!(8, |k| {
            let w = q8_block_pair(blocks, k);
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(w, bias), _mm512_loadu_si512(xg.add(64 * k).cast()))
        });
        let s: [__m512i; 4] = per_index!(4, |k| reduce_pair::<1>(s[2 * k], s[2 * k + 1]));
        let s: [__m512i; 2] = per_index!(2, |k| reduce_pair::<2>(s[2 * k], s[2 * k + 1]));
        let sums = reduce_pair::<3>(s[0], s[1]);
        Vnni(_mm512_sub_epi32(sums, _mm512_slli_epi32(_mm512_loadu_si512(qsum.cast()), 7)))
    }
}

/// The 64 codes `u` (0..64) of values `64 i..64 i + 64` (`i` < 4) of the Q6_K super-block at
/// `block`, one byte each: groups `2 i` (bytes 0..32) and `2 i + 1`. Value `128 n + 32 t + l`
/// (`i = 2 n + t / 2`) has its low 4 bits in nibble `t / 2` of `ql[64 n + 32 (t % 2) + l]`
/// and bits 4 and 5 in bits `2 t..2 t + 2` of `qh[32 n + l]`, so one load of `ql` serves both
/// groups, and one of `qh` (into both halves) is shifted by `4 - 2 t` within each byte (an
/// immediate shift of both halves, then of the low or high half alone) and masked to bits 4
/// and 5 (the 16-bit shifts move no kept bit across a byte).
///
/// # Safety
/// The CPU must have AVX-512 (F, BW), and `block` be valid for a super-block.
#[inline(always)]
unsafe fn q6k_codes64(block: *const u8, i: usize) -> __m512i {
    // SAFETY: the loads read `ql[64 n..64 n + 64]` and `qh[32 n..32 n + 32]` of the super-block
    // (this function's precondition).
    unsafe {
        let n = i / 2;
        let ql = _mm512_loadu_si512(block.add(64 * n).cast());
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(128 + 32 * n).cast()));
        let (m4, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        let (low, high) = if i.is_multiple_of(2) {
            // t = 0 (shift left by 4), t = 1 (by 2).
            let by2 = _mm512_slli_epi16(qh, 2);
            (ql, _mm512_mask_slli_epi16(by2, LOW_HALF, by2, 2))
        } else {
            // t = 2 (no shift), t = 3 (right by 2).
            (_mm512_srli_epi16(ql, 4), _mm512_mask_srli_epi16(qh, !LOW_HALF, qh, 2))
        };
        // (low & 0x0F) | (high & 0x30)
        _mm512_ternarylogic_epi32::<0xEA>(low, m4, _mm512_and_si512(high, m30))
    }
}

/// The 64 codes `u` (0..32) of groups `2 j` (bytes 0..32) and `2 j + 1` (`j` < 4) of the Q5_K
/// super-block at `block`, one byte each: value `l` of group `k` has its low 4 bits in nibble
/// `k % 2` of `qs[32 (k / 2) + l]` and bit 4 in bit `k` of `qh[l]`. One load of each into both
/// halves, shifted within each byte by the half's nibble and bit (immediate shifts of both
/// halves, then of the high half alone; the 16-bit shifts move no kept bit across a byte),
/// masked.
///
/// # Safety
/// The CPU must have AVX-512 (F, BW), and `block` be valid for a super-block.
#[inline(always)]
unsafe fn q5k_codes64(block: *const u8, j: usize) -> __m512i {
    // SAFETY: the loads read `qh` and `qs[32 j..32 j + 32]` of the super-block (this function's
    // precondition).
    unsafe {
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(Q4K_HEADER).cast()));
        let qs = _mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(Q4K_HEADER + 32 + 32 * j).cast()));
        let low = _mm512_mask_srli_epi16(qs, !LOW_HALF, qs, 4);
        // Bit 2 j (low half) or 2 j + 1 (high half) of each byte moved to bit 4.
        let high = _mm512_mask_srli_epi16(qh, !LOW_HALF, qh, 1);
        let high = match j {
            0 => _mm512_slli_epi16(high, 4),
            1 => _mm512_slli_epi16(high, 2),
            2 => high,
            _ => _mm512_srli_epi16(high, 2),
        };
        // (low & 0x0F) | (high & 0x10)
        _mm512_ternarylogic_epi32::<0xEA>(low, _mm512_set1_epi8(0x0F), _mm512_and_si512(high, _mm512_set1_epi8(0x10)))
    }
}

/// One token's integer sums (step 1) of a full chunk of two Q5_K super-blocks at `blocks`
/// against the chunk's activation codes in group order (`xg`, 512 bytes): each two groups'
/// codes ([`q5k_codes64`]) against 64 activation bytes by one `vpdpbusd`, then the 8 partial
/// sums of each group added in pairs twice within 128-bit lanes ([`paired_lanes`]) and once
/// by permutations into lane `l` = group `l`. The sums are exact, so they are `dot_q5`'s on
/// the unpacked codes.
///
/// # Safety
/// The CPU must have AVX-512 (F, BW, VNNI); `blocks` must be valid for 2 super-blocks and `xg`
/// for 512 bytes.
#[inline(always)]
unsafe fn q5k_blocks_dots(blocks: *const u8, xg: *const i8) -> Vnni {
    // SAFETY: the CPU has AVX-512 (F, BW, VNNI), and the loads stay within the 2 super-blocks
    // and the 512 activation bytes (this function's precondition).
    unsafe {
        // Register k: lanes 0..8 the partial sums of group 2k, lanes 8..16 of group 2k + 1.
        let s: [__m512i; 8] = per_index!(8, |k| {
            let u = q5k_codes64(blocks.add(Q5K_BLOCK * (k / 4)), k % 4);
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(xg.add(64 * k).cast()))
        });
        // Each lane sums 4 products of `u <= 31` and `|x| <= 127`: at most 15748, and 31496
        // after the first pairing, so both pairings fit 16 bits ([`paired_lanes`]).
        let s: [__m512i; 4] = per_index!(4, |k| paired_lanes(s[2 * k], s[2 * k + 1]));
        let s: [__m512i; 2] = per_index!(2, |k| paired_lanes(s[2 * k], s[2 * k + 1]));
        // Register i, lane 4q + r: a partial of group 8i + 2r + q / 2.
        Vnni(picked_sums(s[0], s[1], &const { q5k_group_index(0) }, &const { q5k_group_index(1) }))
    }
}

/// Lanes of `a` and `b` added in adjacent pairs: lane `4 q + r` of the result is lanes
/// `4 q + 2 r` and `4 q + 2 r + 1` of `a` (`r < 2`) or `4 q + 2 (r - 2)` and `4 q + 2 (r - 2) + 1`
/// of `b` (`r >= 2`), by packing both to 16 bits and `vpmaddwd` with ones. Exact when every
/// lane of `a` and `b` is within `i16` (the packing saturates otherwise).
///
/// # Safety
/// The CPU must have AVX-512 (F, BW).
#[inline(always)]
unsafe fn paired_lanes(a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: the CPU has AVX-512 (F, BW) (this function's precondition).
    unsafe { _mm512_madd_epi16(_mm512_packs_epi32(a, b), _mm512_set1_epi16(1)) }
}

/// The lanes of [`q5k_blocks_dots`]'s two paired registers (index `16 i + m` for lane `m` of
/// register `i`) that hold partial `part` (0 or 1) of group `l`, for lane `l`: group
/// `8 i + 2 r + p` sits in lanes `4 (2 p + part) + r`.
const fn q5k_group_index(part: usize) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut g = 0;
    while g < 16 {
        let (i, rem) = (g / 8, g % 8);
        idx[g] = (16 * i + 4 * (2 * (rem % 2) + part) + rem / 2) as i32;
        g += 1;
    }
    idx
}

/// The 16-bit lanes of a register's low 256 bits.
const LOW_HALF: __mmask32 = 0x0000_FFFF;

/// Lane indices that put the activation code sums of super-block `b`'s 16 sub-blocks in
/// order from a chunk's first-half sums (first source) and second-half sums (second).
const fn sub_block_sums_index(b: usize) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut s = 0;
    while s < 16 {
        idx[s] = (8 * b + s / 2 + 16 * (s % 2)) as i32;
        s += 1;
    }
    idx
}

/// The lanes of a super-block's two paired registers in [`q6k_blocks_dots`] (index `16 h + m`
/// for lane `m` of the block's register `h`) that hold partial `part` (0 or 1) of sub-block
/// `j`, for lane `j`: sub-block `8 h + q` sits in lanes `4 q + part`, `8 h + 4 + q` in
/// `4 q + 2 + part`.
const fn q6k_sub_block_index(part: usize) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut j = 0;
    while j < 16 {
        let (h, q) = (j / 8, j % 8);
        idx[j] = (16 * h + 4 * (q % 4) + 2 * (q / 4) + part) as i32;
        j += 1;
    }
    idx
}

/// One token's integer sums (step 1) of a full chunk of two Q6_K super-blocks at `blocks`
/// against the chunk's activation codes in group order (`xg`, 512 bytes) with their 16 code
/// sums `qsum` and first-half sums `hsum`: each 64 codes ([`q6k_codes64`]) against 64
/// activation bytes by one `vpdpbusd`, the 4 partial sums of each sub-block of 16 values
/// added in pairs within 128-bit lanes ([`paired_lanes`]) and then by permutations into lane
/// `s` = sub-block `s` of each super-block, then
/// `sc_s (sum - 32 xsum_s)` (`xsum_s` the sub-block's activation code sum) and the two
/// sub-blocks of each group added by a third. The sums are exact, so they are `dot_q6`'s on the
/// unpacked codes.
///
/// # Safety
/// The CPU must have AVX-512 (F, BW, VNNI); `blocks` must be valid for 2 super-blocks, `xg`
/// for 512 bytes and `qsum`, `hsum` for 16 i32.
#[inline(always)]
unsafe fn q6k_blocks_dots(blocks: *const u8, xg: *const i8, qsum: *const i32, hsum: *const i32) -> Vnni {
    // SAFETY: the CPU has AVX-512 (F, BW, VNNI), and the loads stay within the 2 super-blocks,
    // the 512 activation bytes and the 16 sums (this function's precondition).
    unsafe {
        // Register k: values 64 k..64 k + 64 of the chunk, 4 sub-blocks of 4 partial sums.
        let s: [__m512i; 8] = per_index!(8, |k| {
            let u = q6k_codes64(blocks.add(Q6K_BLOCK * (k / 4)), k % 4);
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(xg.add(64 * k).cast()))
        });
        // Each lane sums 4 products of `u <= 63` and `|x| <= 127`: at most 32004, within 16
        // bits ([`paired_lanes`]). Register j, lane 4q + r: a partial of the chunk's sub-block
        // 8j + q (r < 2) or 8j + 4 + q (r >= 2).
        let s: [__m512i; 4] = per_index!(4, |k| paired_lanes(s[2 * k], s[2 * k + 1]));
        // Register b: lane j the sum of sub-block j of super-block b.
        let s: [__m512i; 2] = per_index!(2, |b| picked_sums(s[2 * b], s[2 * b + 1], &const { q6k_sub_block_index(0) }, &const { q6k_sub_block_index(1) }));
        let h = _mm512_loadu_si512(hsum.cast());
        let rest = _mm512_sub_epi32(_mm512_loadu_si512(qsum.cast()), h);
        let scaled: [__m512i; 2] = per_index!(2, |b| {
            let idx = const { [sub_block_sums_index(0), sub_block_sums_index(1)] };
            let xsum = _mm512_permutex2var_epi32(h, _mm512_loadu_epi32(idx[b].as_ptr()), rest);
            let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(blocks.add(Q6K_BLOCK * b + Q6K_SCALES_AT).cast()));
            _mm512_mullo_epi32(sc, _mm512_sub_epi32(s[b], _mm512_slli_epi32(xsum, 5)))
        });
        Vnni(reduce_pair::<3>(scaled[0], scaled[1]))
    }
}

/// The code registers `r` (register k: the 8 code words of groups `2 k` and `2 k + 1`) in the
/// chunked order ([`IntLanes::Q4`]'s: register j, lane l = word j of group l), by the three
/// stages of two-source permutations ([`q8_place`]).
///
/// # Safety
/// The CPU must have AVX-512 F.
#[inline(always)]
unsafe fn chunked_order(mut r: [__m512i; 8]) -> [__m512i; 8] {
    // SAFETY: the CPU has AVX-512 F (this function's precondition); the indices are 16 i32.
    unsafe {
        for stage in &Q8_STAGES {
            r = per_index!(8, |v| {
                let (a, b, idx) = &stage[v];
                _mm512_permutex2var_epi32(r[*a], _mm512_loadu_epi32(idx.as_ptr()), r[*b])
            });
        }
        r
    }
}

/// The three stages of [`Vnni::q8_blocks`]'s transposition.
const Q8_STAGES: [[(usize, usize, [i32; 16]); 8]; 3] = [q8_stage(1), q8_stage(2), q8_stage(3)];

impl IntLanes for Vnni {
    type F = Avx512;
    /// A full chunk: the 16 blocks' code bytes loaded two blocks per register, then moved into
    /// the chunked order by three stages of two-source permutations ([`q8_place`]), then
    /// biased as `q8` biases them. A partial last chunk takes the default copy.
    #[inline(always)]
    unsafe fn q8_blocks(blocks: *const u8, n: usize) -> Self::Q8 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `blocks` is valid for `n` blocks
        // (the `IntLanes` contract); the loads read the 32 code bytes of blocks `0..16`.
        unsafe {
            if n < 16 {
                return Self::q8(super::kinds::chunk_from_blocks(blocks, n).as_ptr(), n);
            }
            let r = chunked_order(per_index!(8, |k| q8_block_pair(blocks, k)));
            let bias = _mm512_set1_epi8(0x80u8 as i8);
            per_index!(8, |k| _mm512_xor_si512(r[k], bias))
        }
    }
    /// One gather of the blocks' first 4 bytes, narrowed to their low 16 bits (the scale).
    #[inline(always)]
    unsafe fn q8_block_scales(blocks: *const u8, n: usize) -> Avx512 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `blocks` is valid for `n` blocks
        // (the `IntLanes` contract); the gather reads 4 bytes at the start of each of them.
        unsafe {
            let b = Q8_0_BLOCK as i32;
            let offsets = _mm512_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b, 8 * b, 9 * b, 10 * b, 11 * b, 12 * b, 13 * b, 14 * b, 15 * b);
            let mask = if n == 16 { 0xFFFF } else { ((1u32 << n) - 1) as __mmask16 };
            let words = _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), mask, offsets, blocks.cast());
            Avx512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(words)))
        }
    }
    /// The trait's arithmetic in vectors: the 6-bit integers of both headers unpacked at once
    /// ([`q4k_scales_mins_x2`]), the f16 scales by `vcvtph2ps`, the (exact) products, the sign
    /// flipped.
    #[inline(always)]
    unsafe fn q4k_scales(h: *const u8, stride: usize, n: usize) -> (Avx512, Avx512) {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `h` is valid for the `n / 8`
        // headers, `stride` apart (the `IntLanes` contract).
        unsafe {
            let word = std::ptr::read_unaligned::<u32>;
            let (sc, m) = q4k_scales_mins_x2(h, stride, n == 16);
            let dd1 = if n == 16 { word(h.add(stride).cast()) } else { 0 };
            // [d_0, dmin_0, d_1, dmin_1]
            let f = _mm_cvtph_ps(_mm_set_epi32(0, 0, dd1 as i32, word(h.cast()) as i32));
            let dw = _mm512_mul_ps(spread8(f, 0, 2), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)));
            let dm = _mm512_mul_ps(spread8(f, 1, 3), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(m)));
            let mw = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(dm), _mm512_set1_epi32(i32::MIN)));
            (Avx512(first_lanes(dw, n)), Avx512(first_lanes(mw, n)))
        }
    }
    #[inline(always)]
    unsafe fn q6k_scales(d: *const u8, stride: usize, n: usize) -> Avx512 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `d` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe {
            let first = std::ptr::read_unaligned(d.cast::<u16>()) as u32;
            let bits = if n == 16 { first | (std::ptr::read_unaligned(d.add(stride).cast::<u16>()) as u32) << 16 } else { first };
            let f = _mm_cvtph_ps(_mm_set_epi32(0, 0, 0, bits as i32));
            Avx512(first_lanes(spread8(f, 0, 1), n))
        }
    }
    #[inline(always)]
    unsafe fn q5(codes: *const u8, n: usize) -> Self::Q4 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `codes` is valid for the bytes
        // this method names (the `IntLanes` contract).
        unsafe {
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
    }
    /// (`u` per word, `sc_0`, `sc_1` as f32)
    type Q6 = ([__m512i; 8], __m512, __m512);
    #[inline(always)]
    unsafe fn q6(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `codes` and `sub` are valid for
        // the bytes this method names (the `IntLanes` contract).
        unsafe {
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
    }
    /// Two super-blocks: their codes unpacked two groups per register ([`q5k_codes64`]), then
    /// moved into the chunked order ([`chunked_order`]). One super-block takes the default
    /// copy.
    #[inline(always)]
    unsafe fn q5k_blocks(blocks: *const u8, n: usize) -> Self::Q4 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `blocks` is valid for `n / 8`
        // super-blocks (the `IntLanes` contract).
        unsafe {
            if n < 16 {
                return super::kinds::q5k_by_packing::<Self>(blocks, n);
            }
            chunked_order(per_index!(8, |k| q5k_codes64(blocks.add(Q5K_BLOCK * (k / 4)), k % 4)))
        }
    }
    /// Two super-blocks: their codes unpacked 64 at a time ([`q6k_codes64`]), two groups per
    /// register, then moved into the chunked order ([`chunked_order`]); their 16 sub-block
    /// scales each are the chunk's 16 pairs. One super-block takes the default copy.
    #[inline(always)]
    unsafe fn q6_blocks(blocks: *const u8, n: usize) -> Self::Q6 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `blocks` is valid for `n / 8`
        // super-blocks (the `IntLanes` contract).
        unsafe {
            if n < 16 {
                return super::kinds::q6_by_packing::<Self>(blocks, n);
            }
            let w = chunked_order(per_index!(8, |k| q6k_codes64(blocks.add(Q6K_BLOCK * (k / 4)), k % 4)));
            let scales = blocks.add(Q6K_SCALES_AT);
            let (sc0, sc1) = sub_scale_pairs(_mm256_loadu2_m128i(scales.add(Q6K_BLOCK).cast(), scales.cast()));
            (w, sc0, sc1)
        }
    }
    #[inline(always)]
    unsafe fn q_low<const Q3: bool>(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `codes` and `sub` are valid for
        // the bytes this method names (the `IntLanes` contract).
        unsafe {
            let (m2, one) = (_mm512_set1_epi8(3), _mm512_set1_epi8(1));
            let bias = _mm512_set1_epi8(if Q3 { 28 } else { 32 });
            let low = [word512(codes, 0, n), word512(codes, 1, n)];
            // Q2_K has no bit 2: a zero word in its place.
            let high = if Q3 { word512(codes, 2, n) } else { _mm512_setzero_si512() };
            // Per byte: the 2-bit field moved down and masked, bit k moved to bit 2, plus 28
            // (Q3_K) or 32 (Q2_K) (at most 35: no carry into the next byte).
            let w = per_index!(8, |k| {
                let l = _mm512_and_si512(_mm512_srl_epi16(low[k / 4], _mm_cvtsi32_si128(2 * (k % 4) as i32)), m2);
                let h = _mm512_slli_epi16(_mm512_and_si512(_mm512_srl_epi16(high, _mm_cvtsi32_si128(k as i32)), one), 2);
                _mm512_add_epi8(_mm512_or_si512(l, h), bias)
            });
            let (sc0, sc1) = sub_scales512(sub, n);
            (w, sc0, sc1)
        }
    }
    #[inline(always)]
    unsafe fn t5(codes: *const u8, n: usize) -> Self::T4 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `codes` is valid for the bytes
        // this method names (the `IntLanes` contract).
        unsafe {
            let (m4, one) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(1));
            let v = lanes512(codes, 4 * n);
            // Lane 4g + w: group g's word of high bits, shifted right by w (half 0) or w + 4
            // (half 1), so bit 0 of byte b is bit 4 of the lane's value b.
            let idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            let high = _mm512_permutexvar_epi32(idx, lanes512(codes.add(16 * n), n));
            let shift = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
            let hb: [__m512i; 2] = per_index!(2, |i| {
                let s = _mm512_add_epi32(shift, _mm512_set1_epi32(4 * i as i32));
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi32(high, s), one), 4)
            });
            [_mm512_or_si512(_mm512_and_si512(v, m4), hb[0]), _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), hb[1])]
        }
    }
    /// Each half: 4 `vpdpbusd` of `u <= 63` and `|x| <= 127`, at most
    /// `16 * 63 * 127 = 128016`; then exact ([`scaled_halves`]).
    #[inline(always)]
    unsafe fn dot_q6(w: &Self::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> Avx512 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `x`, `qsum` and `hsum` are valid
        // for the bytes this method names (the `IntLanes` contract).
        unsafe {
            let (u, sc0, sc1) = w;
            let (mut a, mut b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in 0..4 {
                a = _mm512_dpbusd_epi32(a, u[k], _mm512_loadu_si512(x.add(64 * k).cast()));
                b = _mm512_dpbusd_epi32(b, u[k + 4], _mm512_loadu_si512(x.add(64 * k + 256).cast()));
            }
            let (q, h) = (_mm512_loadu_si512(qsum.cast()), _mm512_loadu_si512(hsum.cast()));
            let a = _mm512_sub_epi32(a, _mm512_slli_epi32(h, 5));
            let b = _mm512_sub_epi32(b, _mm512_slli_epi32(_mm512_sub_epi32(q, h), 5));
            Avx512(scaled_halves(*sc0, a, *sc1, b))
        }
    }
    type Q4 = [__m512i; 8];
    /// Codes biased to unsigned: `q ^ 0x80 = q + 128`.
    type Q8 = [__m512i; 8];
    #[inline(always)]
    unsafe fn q4(codes: *const u8, n: usize) -> Self::Q4 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `codes` is valid for the bytes
        // this method names (the `IntLanes` contract).
        unsafe {
            let mask = _mm512_set1_epi8(0x0F);
            let mut w = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let v = word512(codes, j, n);
                w[j] = _mm512_and_si512(v, mask);
                w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            }
            w
        }
    }
    #[inline(always)]
    unsafe fn q8(codes: *const u8, n: usize) -> Self::Q8 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `codes` is valid for the bytes
        // this method names (the `IntLanes` contract).
        unsafe {
            let bias = _mm512_set1_epi8(0x80u8 as i8);
            per_index!(8, |j| _mm512_xor_si512(word512(codes, j, n), bias))
        }
    }
    /// Two chains of 4 `vpdpbusd` each; every lane sums at most 32 products of
    /// `15 * 127`, far from overflow.
    #[inline(always)]
    unsafe fn dot_q4(w: &Self::Q4, x: *const i8) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `x` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe {
            let (mut a, mut b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in (0..8).step_by(2) {
                a = _mm512_dpbusd_epi32(a, w[k], _mm512_loadu_si512(x.add(64 * k).cast()));
                b = _mm512_dpbusd_epi32(b, w[k + 1], _mm512_loadu_si512(x.add(64 * k + 64).cast()));
            }
            Vnni(_mm512_add_epi32(a, b))
        }
    }
    /// `sum (q + 128) x - 128 sum x`; `|sum (q + 128) x| <= 32 * 255 * 127`.
    #[inline(always)]
    unsafe fn dot_q8(w: &Self::Q8, x: *const i8, qsum: *const i32) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `x` and `qsum` are valid for the
        // bytes this method names (the `IntLanes` contract).
        unsafe {
            let (mut a, mut b) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in (0..8).step_by(2) {
                a = _mm512_dpbusd_epi32(a, w[k], _mm512_loadu_si512(x.add(64 * k).cast()));
                b = _mm512_dpbusd_epi32(b, w[k + 1], _mm512_loadu_si512(x.add(64 * k + 64).cast()));
            }
            let bias = _mm512_slli_epi32(_mm512_loadu_si512(qsum.cast()), 7);
            Vnni(_mm512_sub_epi32(_mm512_add_epi32(a, b), bias))
        }
    }
    #[inline(always)]
    unsafe fn minus_8_qsum(self, qsum: *const i32) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `qsum` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe { Vnni(_mm512_sub_epi32(self.0, _mm512_slli_epi32(_mm512_loadu_si512(qsum.cast()), 3))) }
    }
    #[inline(always)]
    unsafe fn to_f32(self) -> Avx512 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI) (the `IntLanes` contract).
        unsafe { Avx512(_mm512_cvtepi32_ps(self.0)) }
    }
    type T4 = [__m512i; 2];
    /// Biased to unsigned like `Q8`.
    type T8 = [__m512i; 2];
    #[inline(always)]
    unsafe fn t4(codes: *const u8, n: usize) -> Self::T4 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `codes` is valid for the bytes
        // this method names (the `IntLanes` contract).
        unsafe {
            let mask = _mm512_set1_epi8(0x0F);
            let v = lanes512(codes, 4 * n);
            [_mm512_and_si512(v, mask), _mm512_and_si512(_mm512_srli_epi16(v, 4), mask)]
        }
    }
    #[inline(always)]
    unsafe fn t8(codes: *const u8, n: usize) -> Self::T8 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `codes` is valid for the bytes
        // this method names (the `IntLanes` contract).
        unsafe {
            let bias = _mm512_set1_epi8(0x80u8 as i8);
            per_index!(2, |h| _mm512_xor_si512(lanes512(codes.add(16 * n * h), 4 * n), bias))
        }
    }
    #[inline(always)]
    unsafe fn dot_t4(w: &Self::T4, x: *const i8) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `x` is valid for the bytes this
        // method names (the `IntLanes` contract).
        unsafe {
            let a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_loadu_si512(x.cast()));
            Vnni(_mm512_dpbusd_epi32(a, w[1], _mm512_loadu_si512(x.add(64).cast())))
        }
    }
    /// `sum (q + 128) x - 128 sum x` per lane, as `dot_q8`.
    #[inline(always)]
    unsafe fn dot_t8(w: &Self::T8, x: *const i8, lane_sum: *const i32) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `x` and `lane_sum` are valid for
        // the bytes this method names (the `IntLanes` contract).
        unsafe {
            let a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_loadu_si512(x.cast()));
            let a = _mm512_dpbusd_epi32(a, w[1], _mm512_loadu_si512(x.add(64).cast()));
            Vnni(_mm512_sub_epi32(a, _mm512_slli_epi32(_mm512_loadu_si512(lane_sum.cast()), 7)))
        }
    }
    #[inline(always)]
    unsafe fn spread4(v: Avx512) -> Avx512 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI) (the `IntLanes` contract).
        unsafe {
            let idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            Avx512(_mm512_permutexvar_ps(idx, v.0))
        }
    }
    /// One token over a full chunk of blocks read in place: [`q8_blocks_dots`] (Q8_0),
    /// [`q5k_blocks_dots`] (Q5_K) or [`q6k_blocks_dots`] (Q6_K) against the codes in group
    /// order.
    /// Several tokens: word by word, every `(row, token)` integer sum kept in a register,
    /// so a tile holds two code words per row instead of a whole chunk's eight, and each
    /// activation word is loaded once for all the tile's rows (`examples/int8_speed.rs` times
    /// it against `wide_chunk_dots`).
    #[inline(always)]
    unsafe fn wide_chunk<K: Kind, const NR: usize, const NT: usize>(
        rows: &[*const u8; NR],
        d_ptr: &[*const u8; NR],
        groups: usize,
        c: usize,
        x: &Acts,
        acc: &mut [[Avx512; NT]; NR],
    ) {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `rows`, `d_ptr` and `x` cover chunk
        // `c` of the tile as `wide_chunk_dots` asks (the `IntLanes` contract).
        unsafe {
            let g0 = c * CHUNK_GROUPS;
            let n = (groups - g0).min(CHUNK_GROUPS);
            if K::BLOCKS.is_some() && NR == 1 && NT == 1 && n == CHUNK_GROUPS {
                let (blocks, xg, qsum) = (K::codes(rows[0], g0), x.grouped.add(g0 * 32), x.qsum.add(g0));
                let isum = match K::BLOCKS {
                    Some(GgmlType::Q6_K) => q6k_blocks_dots(blocks, xg, qsum, x.hsum.add(g0)),
                    Some(GgmlType::Q5_K) => q5k_blocks_dots(blocks, xg),
                    _ => q8_blocks_dots(blocks, xg, qsum),
                };
                let (dw, mw) = chunk_scales::<Self, K, NR>(d_ptr, groups, g0, n);
                let sx = if K::OFFSET { Avx512::load(x.s.add(g0)) } else { Avx512::zero() };
                acc[0][0] = scale_add::<Avx512, K>(acc[0][0], isum.to_f32(), dw[0], Avx512::load(x.d.add(g0)), mw[0], sx);
                return;
            }
            if NT == 1 || !K::WORD_PAIRS {
                return wide_chunk_dots::<Self, K, NR, NT>(rows, d_ptr, groups, c, x, acc);
            }
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
    /// Four rows share each activation word: twice the integer sums per load of two.
    const FOUR_ROW_TILES: bool = true;
    /// All but Q4_0's and Q4_1's nibbles, which `wide_chunk` unpacks word by word for less
    /// than it costs to load them unpacked (Q4_K's are prepared for its scales).
    #[inline(always)]
    fn prepares<K: Kind>() -> bool {
        !(K::WORD_PAIRS && K::CODE_BYTES == 16) || K::SUPER_BLOCKS
    }
    /// Word by word like `wide_chunk`, on the unpacked words of the rows' prepared chunks:
    /// each activation word is loaded once for all the tile's rows. The sub-block scaled
    /// types take the two halves one after the other ([`halves_chunk`]).
    #[inline(always)]
    unsafe fn prepared_chunk<K: Kind, const NR: usize, const NT: usize>(p: &[&PreparedChunk<Self, K>; NR], c: usize, x: &Acts, acc: &mut [[Avx512; NT]; NR]) {
        // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `x` covers chunk `c` of the
        // tile's tokens (the `IntLanes` contract).
        unsafe {
            let g0 = c * CHUNK_GROUPS;
            let words = per_index!(NR, |r| K::vnni_words(&p[r].w));
            let isums: [[__m512; NT]; NR] = if K::HALVES {
                let codes = per_index!(NR, |r| words[r].0);
                let sc = per_index!(NR, |r| words[r].1.expect("the words of a type with HALVES carry its sub-block scales"));
                halves_chunk::<NR, NT>(&codes, &sc, c, x)
            } else {
                // [row][token]: the sums of all 8 words
                let mut sums = [[_mm512_setzero_si512(); NT]; NR];
                for j in 0..4 {
                    let w: [(__m512i, __m512i); NR] = per_index!(NR, |r| (words[r].0[j], words[r].0[j + 4]));
                    for t in 0..NT {
                        let xq = x.q.add(t * x.q_stride + c * CHUNK_BYTES);
                        let (xl, xh) = (_mm512_loadu_si512(xq.add(64 * j).cast()), _mm512_loadu_si512(xq.add(64 * (j + 4)).cast()));
                        for r in 0..NR {
                            sums[r][t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sums[r][t], w[r].0, xl), w[r].1, xh);
                        }
                    }
                }
                if let Some(k) = K::BIAS_LOG2 {
                    // The bias times the activation code sums: exact (bounds in `dot_q8`).
                    for t in 0..NT {
                        let qsum = _mm512_loadu_si512(x.qsum.add(t * x.lane_stride + g0).cast());
                        let bias = _mm512_sll_epi32(qsum, _mm_cvtsi32_si128(k as i32));
                        for r in 0..NR {
                            sums[r][t] = _mm512_sub_epi32(sums[r][t], bias);
                        }
                    }
                }
                per_index!(NR, |r| per_index!(NT, |t| _mm512_cvtepi32_ps(sums[r][t])))
            };
            for t in 0..NT {
                let lane = t * x.lane_stride + g0;
                let dx = Avx512::load(x.d.add(lane));
                let sx = if K::OFFSET { Avx512::load(x.s.add(lane)) } else { Avx512::zero() };
                let (qsum, hsum) = (x.qsum.add(lane), x.hsum.add(lane));
                for r in 0..NR {
                    acc[r][t] = scale_add::<Avx512, K>(acc[r][t], Avx512(isums[r][t]), p[r].dw, dx, p[r].mw, sx);
                    if K::MINS {
                        let msum = K::min_sum::<Self>(&p[r].w, qsum, hsum);
                        acc[r][t] = Avx512::fma(Avx512::mul(p[r].mw, dx), msum, acc[r][t]);
                    }
                }
            }
        }
    }
}

/// Wide chunk `c`'s integer sums of an `NR x NT` tile for the sub-block scaled types, as
/// `dot_q6` (in f32, exact), from the rows' unpacked codes and f32 sub-block scales. The
/// halves are summed one after the other, so that only one half's `NR x NT` sums are live at
/// a time (two halves of a 4 x 4 tile would fill the 32 registers).
///
/// # Safety
/// The CPU must have AVX-512 (F, BW, VL, VNNI), and `x` cover chunk `c` of `NT` tokens.
#[inline(always)]
unsafe fn halves_chunk<const NR: usize, const NT: usize>(codes: &[&[__m512i; 8]; NR], sc: &[(&__m512, &__m512); NR], c: usize, x: &Acts) -> [[__m512; NT]; NR] {
    // SAFETY: the CPU has AVX-512 (F, BW, VL, VNNI), and `x` covers chunk `c` of the tile's
    // tokens (this function's precondition).
    unsafe {
        let g0 = c * CHUNK_GROUPS;
        let mut isum = [[_mm512_setzero_ps(); NT]; NR];
        for h in 0..2 {
            // Each sum starts at `-32` times the half's activation code sum (`hsum`, or
            // `qsum - hsum`), so that it ends as `sum q x`.
            let start: [__m512i; NT] = per_index!(NT, |t| {
                let lane = t * x.lane_stride + g0;
                let hsum = _mm512_loadu_si512(x.hsum.add(lane).cast());
                let half = if h == 0 { hsum } else { _mm512_sub_epi32(_mm512_loadu_si512(x.qsum.add(lane).cast()), hsum) };
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(half, 5))
            });
            let mut sums = [start; NR];
            for j in 4 * h..4 * h + 4 {
                for t in 0..NT {
                    let xw = _mm512_loadu_si512(x.q.add(t * x.q_stride + c * CHUNK_BYTES + 64 * j).cast());
                    for r in 0..NR {
                        sums[r][t] = _mm512_dpbusd_epi32(sums[r][t], codes[r][j], xw);
                    }
                }
            }
            for t in 0..NT {
                for r in 0..NR {
                    // `scaled_halves`, a half at a time.
                    let part = _mm512_cvtepi32_ps(sums[r][t]);
                    isum[r][t] = if h == 0 { _mm512_mul_ps(*sc[r].0, part) } else { _mm512_fmadd_ps(*sc[r].1, part, isum[r][t]) };
                }
            }
        }
        isum
    }
}
