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
/// Byte shuffles straight from ggml's blocks (their value order: [`group_code_bytes`]); the
/// scales and headers are copied as they are.
pub fn pack_rows(ty: GgmlType, cols: usize, ggml: &[u8], out: &mut [u8]) {
    let row_bytes = ty.row_bytes(cols);
    assert!(cols.is_multiple_of(256) && ggml.len().is_multiple_of(row_bytes) && out.len() == ggml.len());
    let (groups, cb) = (cols / QK, code_bytes(ty));
    for (src, dst) in ggml.chunks_exact(row_bytes).zip(out.chunks_exact_mut(row_bytes)) {
        let (codes, scales) = dst.split_at_mut(groups * cb);
        // Chunks of 16 groups (two super-blocks; a row's last chunk may be one): word `j` of
        // the chunk's group `l` at `4 (j n + l)`.
        for (chunk, (blocks, out)) in src.chunks(2 * ty.block_bytes()).zip(codes.chunks_mut(16 * cb)).enumerate() {
            let n = out.len() / cb;
            for (half, block) in blocks.chunks_exact(ty.block_bytes()).enumerate() {
                for k in 0..SUPER_GROUPS {
                    let (l, bytes) = (SUPER_GROUPS * half + k, group_code_bytes(ty, block, k));
                    for j in 0..cb / 4 {
                        out[4 * (j * n + l)..][..4].copy_from_slice(&bytes[4 * j..4 * j + 4]);
                    }
                }
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
        }
    }
}

/// The code bytes of group `k` (values `32k..32k + 32`) of a ggml super-block in the int8
/// layout (grouped order; module docs), from ggml's fields:
///
/// - Q4_K `{d, dmin, scales[12], qs[128]}`: value `l` of group `k` is nibble `k % 2` of
///   `qs[32 (k / 2) + l]`;
/// - Q5_K `{d, dmin, scales[12], qh[32], qs[128]}`: the same low 4 bits, and bit 4 is bit `k`
///   of `qh[l]`;
/// - Q6_K `{ql[128], qh[64], scales[16], d}`: with `k = 4n + t`, the low 4 bits are nibble
///   `t / 2` of `ql[64n + 32 (t % 2) + l]` and bits 4..6 are bits `2t..2t + 2` of
///   `qh[32n + l]` (`u = q + 32`, as stored).
#[inline(always)]
fn group_code_bytes(ty: GgmlType, block: &[u8], k: usize) -> [u8; 24] {
    let mut out = [0u8; 24];
    let (low, high): (&[u8], Option<(&[u8], u32)>) = match ty {
        GgmlType::Q4_K => (&block[16 + 32 * (k / 2)..][..32], None),
        GgmlType::Q5_K => (&block[48 + 32 * (k / 2)..][..32], Some((&block[16..48], k as u32))),
        GgmlType::Q6_K => {
            let (n, t) = (k / 4, k % 4);
            (&block[64 * n + 32 * (t % 2)..][..32], Some((&block[128 + 32 * n..][..32], 2 * t as u32)))
        }
        _ => unreachable!("not a K-quant int8 type"),
    };
    let nibble_shift = match ty {
        GgmlType::Q6_K => 4 * ((k % 4) / 2),
        _ => 4 * (k % 2),
    };
    for i in 0..16 {
        out[i] = ((low[i] >> nibble_shift) & 0x0F) | (((low[16 + i] >> nibble_shift) & 0x0F) << 4);
    }
    // Four code bytes at once: byte b of qh word m is qh[4m + b].
    let word = |qh: &[u8], m: usize| u32::from_le_bytes([qh[4 * m], qh[4 * m + 1], qh[4 * m + 2], qh[4 * m + 3]]);
    match (ty, high) {
        (GgmlType::Q5_K, Some((qh, bit))) => {
            let bits = (0..8).fold(0u32, |acc, m| acc | (((word(qh, m) >> bit) & 0x0101_0101) << m));
            out[16..20].copy_from_slice(&bits.to_le_bytes());
        }
        (GgmlType::Q6_K, Some((qh, shift))) => {
            for h in 0..2 {
                let bits = (0..4).fold(0u32, |acc, m| acc | (((word(qh, 4 * h + m) >> shift) & 0x0303_0303) << (2 * m)));
                out[16 + 4 * h..20 + 4 * h].copy_from_slice(&bits.to_le_bytes());
            }
        }
        _ => {}
    }
    out
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

/// [`q4k_scales_mins`] of the header at `h` and, if `both`, of the next one (zero if not), in
/// one vector each: bytes `0..8` the first header's scales (or mins), `8..16` the second's.
/// SSE2, which every x86-64 CPU has.
///
/// # Safety
/// `h` must be valid for one header's bytes, or two if `both`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn q4k_scales_mins_x2(h: *const u8, both: bool) -> (std::arch::x86_64::__m128i, std::arch::x86_64::__m128i) {
    use std::arch::x86_64::*;
    // SAFETY: the reads are within the one or two headers at `h` (this function's
    // precondition); SSE2 is part of x86-64.
    unsafe {
        let word = |b: usize, i: usize| std::ptr::read_unaligned::<u32>(h.add(Q4K_HEADER * b + 4 * i).cast());
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
                let (sc, m) = unsafe { q4k_scales_mins_x2(h.as_ptr(), both) };
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
