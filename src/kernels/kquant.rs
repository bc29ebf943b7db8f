//! The int8 layout of the K-quant types Q4_K, Q5_K and Q6_K: ggml's 256-value super-blocks
//! repacked at load for [`super::int8`], in exactly ggml's bytes per row.
//!
//! A row of `G` groups of 32 values (`G` a multiple of 8: `S = G / 8` super-blocks) holds
//! first the groups' code bytes in the chunked order of [`super::packed`] (chunks of 16
//! groups, code byte `4j + b` of group `16c + l` at `[word j][lane l][byte b]`; a last chunk
//! has 8 or 16 groups, so it is never narrow), then the scales:
//!
//! ```text
//! Q4_K (144 bytes per 256 values, as ggml)
//! [G][16] codes      byte i: value i (low nibble), value 16 + i (high nibble), q in 0..16
//! [S][16] headers    ggml's first 16 bytes of the block: f16 d, f16 dmin, 12 bytes of
//!                    6-bit sub-block scales and mins (ggml's `get_scale_min_k4` packing)
//!
//! Q5_K (176 bytes per 256 values, as ggml)
//! [G][20] codes      u in 0..32 (5 bits). Bytes 0..16: low 4 bits, as Q4_K;
//!                    byte 16 + b, bit k = bit 4 of value 4k + b
//! [S][16] headers    as Q4_K
//!
//! Q6_K (210 bytes per 256 values, as ggml)
//! [G][24] codes      u = q + 32 in 0..64 (6 bits). Bytes 0..16: low 4 bits, as Q4_K;
//!                    byte 16 + 4h + b: bits 2m..2m + 2 = bits 4..6 of value 4(4h + m) + b
//! [G][2] i8          the two sub-block scales (values 0..16, values 16..32)
//! [S] f16 d          the super-block scale
//! ```
//!
//! so code word `k` of a group (values `4k..4k + 4`, the activation word `k` of
//! [`super::quantize_act`]) is the low nibbles of word `k` (k < 4) or the high nibbles of
//! word `k - 4`; for Q5_K bit 4 is bit `k` of word 4, for Q6_K bits 4 and 5 come from word
//! `4 + k / 4`, shifted by `2 (k % 4)`.
//!
//! The weights: Q4_K and Q5_K value `(d sc) q - dmin m` (group scale `d sc`, offset
//! `-(dmin m)`, both exact in f32, see `tensor::types::q4_k`), Q6_K `(d sc_h) (u - 32)` for half `h`, ggml's
//! values bit for bit ([`group`]).

use crate::tensor::types::q4_k::scale_min;
use crate::tensor::{GgmlType, Group, QK};

use super::packed::chunked_code_offset;

/// Groups per super-block.
pub const SUPER_GROUPS: usize = 8;
/// Bytes of a Q4_K super-block header (d, dmin, 12 bytes of scales and mins).
pub const Q4K_HEADER: usize = 16;

/// Code bytes per group in the int8 layout.
pub fn code_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K => 16,
        GgmlType::Q5_K => 20,
        GgmlType::Q6_K => 24,
        _ => unreachable!("not a K-quant int8 type"),
    }
}

/// Packs whole ggml rows of `cols` values into the int8 layout (`out`: as many bytes).
///
/// The code words of each super-block come from ggml's fields eight bytes at a time
/// ([`super_block_words`]) and are stored word by word across the chunk's groups; the scales
/// and headers are copied as they are.
pub fn pack_rows(ty: GgmlType, cols: usize, ggml: &[u8], out: &mut [u8]) {
    let row_bytes = ty.row_bytes(cols);
    assert!(cols.is_multiple_of(256) && ggml.len().is_multiple_of(row_bytes) && out.len() == ggml.len());
    let (groups, cb, block_bytes) = (cols / QK, code_bytes(ty), ty.block_bytes());
    for (src, dst) in ggml.chunks_exact(row_bytes).zip(out.chunks_exact_mut(row_bytes)) {
        let (codes, scales) = dst.split_at_mut(groups * cb);
        // Chunks of 16 groups (two super-blocks; a row's last chunk may be one).
        for (chunk, (blocks, out)) in src.chunks(2 * block_bytes).zip(codes.chunks_mut(16 * cb)).enumerate() {
            // [group l][word j]
            let mut words = [[0u32; 6]; 16];
            for (half, (block, words)) in blocks.chunks_exact(block_bytes).zip(words.chunks_exact_mut(SUPER_GROUPS)).enumerate() {
                super_block_words(ty, block, words);
                let s = 2 * chunk + half;
                match ty {
                    GgmlType::Q4_K | GgmlType::Q5_K => scales[Q4K_HEADER * s..Q4K_HEADER * (s + 1)].copy_from_slice(&block[..Q4K_HEADER]),
                    GgmlType::Q6_K => {
                        scales[16 * s..16 * (s + 1)].copy_from_slice(&block[192..208]);
                        let d_at = 2 * groups + 2 * s;
                        scales[d_at..d_at + 2].copy_from_slice(&block[208..210]);
                    }
                    _ => unreachable!("not a K-quant int8 type"),
                }
            }
            // Word `j` of the chunk's group `l` at `4 (j n + l)`: the chunk's words in order.
            let n = out.len() / cb;
            let mut at = out.chunks_exact_mut(4);
            for j in 0..cb / 4 {
                for group in &words[..n] {
                    at.next().expect("a chunk holds n words per code word").copy_from_slice(&group[j].to_le_bytes());
                }
            }
        }
    }
}

/// The code words of the 8 groups of a ggml super-block in the int8 layout (grouped order,
/// module docs): `words[k][j]` holds code bytes `4j..4j + 4` of group `k` (values
/// `32k..32k + 32`), little-endian, from ggml's fields:
///
/// - Q4_K `{d, dmin, scales[12], qs[128]}`: value `l` of group `k` is nibble `k % 2` of
///   `qs[32 (k / 2) + l]`;
/// - Q5_K `{d, dmin, scales[12], qh[32], qs[128]}`: the same low 4 bits, and bit 4 is bit `k`
///   of `qh[l]`;
/// - Q6_K `{ql[128], qh[64], scales[16], d}`: with `k = 4n + t`, the low 4 bits are nibble
///   `t / 2` of `ql[64n + 32 (t % 2) + l]` and bits 4..6 are bits `2t..2t + 2` of
///   `qh[32n + l]` (`u = q + 32`, as stored).
///
/// Eight bytes at a time: the shifts and masks keep every bit in its byte.
#[inline(always)]
fn super_block_words(ty: GgmlType, block: &[u8], words: &mut [[u32; 6]]) {
    const LOW: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    let u64_at = |at: usize| u64::from_le_bytes(block[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_le_bytes(block[at..at + 4].try_into().expect("4 bytes"));
    // Code bytes 0..16 of a group: byte i is one nibble of `low[i]` under the same nibble of
    // `low[16 + i]`, for 32 bytes `low`. Words `j, j + 1` of the group of low nibbles and
    // of the group of high nibbles of the 32 bytes at `at`.
    let nibble_words = |at: usize, j: usize| {
        let (a, b) = (u64_at(at + 4 * j), u64_at(at + 16 + 4 * j));
        ((a & LOW) | ((b & LOW) << 4), ((a >> 4) & LOW) | (b & !LOW))
    };
    let mut set = |k: usize, j: usize, pair: u64| {
        words[k][j] = pair as u32;
        words[k][j + 1] = (pair >> 32) as u32;
    };
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let qs = if ty == GgmlType::Q4_K { 16 } else { 48 };
            for p in 0..4 {
                for j in [0, 2] {
                    let (lo, hi) = nibble_words(qs + 32 * p, j);
                    set(2 * p, j, lo);
                    set(2 * p + 1, j, hi);
                }
            }
        }
        GgmlType::Q6_K => {
            for n in 0..2 {
                for j in [0, 2] {
                    for half in 0..2 {
                        // Groups t = half (low nibbles) and t = half + 2 (high nibbles).
                        let (lo, hi) = nibble_words(64 * n + 32 * half, j);
                        set(4 * n + half, j, lo);
                        set(4 * n + half + 2, j, hi);
                    }
                }
            }
        }
        _ => unreachable!("not a K-quant int8 type"),
    }
    match ty {
        GgmlType::Q5_K => {
            // Bit m of byte b of group k's word 4 is bit k of qh[4m + b].
            let mut x: [u32; 8] = std::array::from_fn(|m| u32_at(16 + 4 * m));
            transpose_byte_fields(&mut x);
            for (w, x) in words.iter_mut().zip(x) {
                w[4] = x;
            }
        }
        GgmlType::Q6_K => {
            // Bits 2m..2m + 2 of byte b of group 4n + t's word 4 + h are bits 2t..2t + 2 of
            // qh[32n + 16h + 4m + b].
            for n in 0..2 {
                for h in 0..2 {
                    let mut x: [u32; 4] = std::array::from_fn(|m| u32_at(128 + 32 * n + 16 * h + 4 * m));
                    transpose_byte_fields(&mut x);
                    for (t, x) in x.into_iter().enumerate() {
                        words[4 * n + t][4 + h] = x;
                    }
                }
            }
        }
        _ => {}
    }
}

/// Transposes, in every byte, the `N x N` matrix of `8 / N`-bit fields whose row `m` is
/// `x[m]` (`N` = 4 or 8): afterwards field `m` of `x[t]` is what field `t` of `x[m]` was. Swaps
/// the off-diagonal halves of blocks of fields, from single fields up to half-bytes.
#[inline(always)]
fn transpose_byte_fields<const N: usize>(x: &mut [u32; N]) {
    let width = 8 / N as u32;
    let mut w = width;
    while w < 8 {
        let d = (w / width) as usize;
        let mask = match w {
            1 => 0x5555_5555,
            2 => 0x3333_3333,
            _ => 0x0F0F_0F0F,
        };
        for m in (0..N).filter(|m| m & d == 0) {
            let a = ((x[m] >> w) ^ x[m + d]) & mask;
            x[m + d] ^= a;
            x[m] ^= a << w;
        }
        w *= 2;
    }
}

/// Group `g` of a row (`groups` groups) in the int8 layout, decoded: ggml's values by
/// [`Group::values`].
pub fn group(ty: GgmlType, row: &[u8], groups: usize, g: usize) -> Group {
    let cb = code_bytes(ty);
    let byte = |i: usize| row[chunked_code_offset(cb, groups, g, i)];
    let scales = &row[groups * cb..];
    let mut out = Group::ZERO;
    for i in 0..16 {
        let (lo, hi) = (byte(i) & 0x0F, byte(i) >> 4);
        out.codes[i] = lo as i8;
        out.codes[16 + i] = hi as i8;
    }
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            if ty == GgmlType::Q5_K {
                for v in 0..32 {
                    let high = (byte(16 + v % 4) >> (v / 4)) & 1;
                    out.codes[v] |= (high << 4) as i8;
                }
            }
            let h = &scales[Q4K_HEADER * (g / SUPER_GROUPS)..];
            let (sc, m) = scale_min(&h[4..16], g % SUPER_GROUPS);
            out.scale = [f16(&h[0..2]) * sc as f32; 2];
            out.offset = [-(f16(&h[2..4]) * m as f32); 2];
        }
        GgmlType::Q6_K => {
            for v in 0..32 {
                let k = (v % 16) / 4 + 4 * (v / 16);
                let high = (byte(16 + 4 * (k / 4) + v % 4) >> (2 * (k % 4))) & 3;
                out.codes[v] = (out.codes[v] as u8 | (high << 4)) as i8 - 32;
            }
            let d = f16(&scales[2 * groups + 2 * (g / SUPER_GROUPS)..]);
            out.scale = [d * scales[2 * g] as i8 as f32, d * scales[2 * g + 1] as i8 as f32];
        }
        _ => unreachable!("not a K-quant int8 type"),
    }
    out
}

/// Q4_K: the 6-bit scales and mins of the 8 groups of a super-block header `h`, ggml's
/// `get_scale_min_k4` for all 8 at once on 32-bit words.
#[inline(always)]
pub fn q4k_scales_mins(h: &[u8; Q4K_HEADER]) -> ([u8; 8], [u8; 8]) {
    const K1: u32 = 0x3f3f3f3f;
    const K2: u32 = 0x0f0f0f0f;
    const K3: u32 = 0x03030303;
    let w = |i: usize| u32::from_le_bytes([h[4 + 4 * i], h[5 + 4 * i], h[6 + 4 * i], h[7 + 4 * i]]);
    let (a, b, c) = (w(0), w(1), w(2));
    let sc = [a & K1, (c & K2) | (((a >> 6) & K3) << 4)];
    let m = [b & K1, ((c >> 4) & K2) | (((b >> 6) & K3) << 4)];
    let bytes = |v: [u32; 2]| {
        let mut o = [0u8; 8];
        o[..4].copy_from_slice(&v[0].to_le_bytes());
        o[4..].copy_from_slice(&v[1].to_le_bytes());
        o
    };
    (bytes(sc), bytes(m))
}

/// [`q4k_scales_mins`] of the header at `h` and, if `both`, of the one `stride` bytes after it
/// (zero if not), in one vector each: bytes `0..8` the first header's scales (or mins),
/// `8..16` the second's. SSE2, which every x86-64 CPU has.
///
/// # Safety
/// `h` must be valid for one header's bytes, and if `both`, `h + stride` for another's.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn q4k_scales_mins_x2(h: *const u8, stride: usize, both: bool) -> (std::arch::x86_64::__m128i, std::arch::x86_64::__m128i) {
    use std::arch::x86_64::*;
    // SAFETY: the reads are within the one or two headers at `h` (this function's
    // precondition); SSE2 is part of x86-64.
    unsafe {
        let word = |b: usize, i: usize| std::ptr::read_unaligned::<u32>(h.add(stride * b + 4 * i).cast());
        // Header b's words `a` (bytes 4..8), `b` (8..12), `c` (12..16) as `q4k_scales_mins`
        // reads them.
        let [a1, b1, c1] = if both { [word(1, 1), word(1, 2), word(1, 3)] } else { [0; 3] };
        let (a0, b0, c0) = (word(0, 1), word(0, 2), word(0, 3));
        // Dwords [a_0, a_1, b_0, b_1] and [c_0, c_1, c_0 >> 4, c_1 >> 4]. Per byte: the low 6
        // bits of `a` (`b`) are scales (mins) 0..4; scales (mins) 4..8 are the low (high)
        // nibbles of `c` under bits 6..8 of `a` (`b`) moved to bits 4..6.
        let ab = _mm_set_epi32(b1 as i32, b0 as i32, a1 as i32, a0 as i32);
        let c = _mm_set_epi32((c1 >> 4) as i32, (c0 >> 4) as i32, c1 as i32, c0 as i32);
        let low = _mm_and_si128(ab, _mm_set1_epi8(0x3F));
        let high = _mm_or_si128(_mm_and_si128(c, _mm_set1_epi8(0x0F)), _mm_and_si128(_mm_srli_epi32(ab, 2), _mm_set1_epi8(0x30)));
        // [scales 0..4, 4..8 of header 0, of header 1] and the same of the mins.
        (_mm_unpacklo_epi32(low, high), _mm_unpackhi_epi32(low, high))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn q4k_scales_mins_x2_is_q4k_scales_mins_of_each_header() {
        let mut state = 0x9E3779B97F4A7C15u64;
        for _ in 0..2000 {
            let mut h = [0u8; 2 * Q4K_HEADER];
            for b in &mut h {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = (state >> 32) as u8;
            }
            let bytes = |v: std::arch::x86_64::__m128i| unsafe { std::mem::transmute::<_, [u8; 16]>(v) };
            let header = |b: usize| q4k_scales_mins(h[Q4K_HEADER * b..Q4K_HEADER * (b + 1)].try_into().unwrap());
            for both in [false, true] {
                // SAFETY: `h` holds two headers.
                let (sc, m) = unsafe { q4k_scales_mins_x2(h.as_ptr(), Q4K_HEADER, both) };
                let (sc, m) = (bytes(sc), bytes(m));
                let second = if both { header(1) } else { ([0; 8], [0; 8]) };
                assert_eq!((&sc[..8], &m[..8]), (&header(0).0[..], &header(0).1[..]));
                assert_eq!((&sc[8..], &m[8..]), (&second.0[..], &second.1[..]));
            }
        }
    }

    #[test]
    fn q4k_scales_mins_is_get_scale_min_k4() {
        let mut state = 0x2545F4914F6CDD1Du64;
        for _ in 0..2000 {
            let mut h = [0u8; 16];
            for b in &mut h {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = (state >> 32) as u8;
            }
            let (sc, m) = q4k_scales_mins(&h);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), scale_min(&h[4..16], j));
            }
        }
    }
}
