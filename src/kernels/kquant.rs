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
pub fn pack_rows(ty: GgmlType, cols: usize, ggml: &[u8], out: &mut [u8]) {
    let row_bytes = ty.row_bytes(cols);
    assert!(cols.is_multiple_of(256) && ggml.len().is_multiple_of(row_bytes) && out.len() == ggml.len());
    let (groups, cb) = (cols / QK, code_bytes(ty));
    let decode = ty.spec().decode_groups.expect("K-quant types have a group decoder");
    let mut decoded = vec![Group::ZERO; groups];
    for (src, dst) in ggml.chunks_exact(row_bytes).zip(out.chunks_exact_mut(row_bytes)) {
        decode(src, &mut decoded);
        let (codes, scales) = dst.split_at_mut(groups * cb);
        for (g, group) in decoded.iter().enumerate() {
            let bytes = group_code_bytes(ty, group);
            for b in (0..cb).step_by(4) {
                let at = chunked_code_offset(cb, groups, g, b);
                codes[at..at + 4].copy_from_slice(&bytes[b..b + 4]);
            }
        }
        for (s, block) in src.chunks_exact(ty.block_bytes()).enumerate() {
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

/// One group's code bytes in the int8 layout (grouped order; module docs).
fn group_code_bytes(ty: GgmlType, group: &Group) -> [u8; 24] {
    let mut out = [0u8; 24];
    let u: [u8; 32] = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => group.codes.map(|c| c as u8),
        _ => group.codes.map(|c| (c + 32) as u8),
    };
    debug_assert!(u.iter().all(|&v| v < [16, 32, 64][(code_bytes(ty) - 16) / 4]));
    for i in 0..16 {
        out[i] = (u[i] & 0x0F) | ((u[16 + i] & 0x0F) << 4);
    }
    if ty == GgmlType::Q5_K {
        for b in 0..4 {
            out[16 + b] = (0..8).map(|k| ((u[4 * k + b] >> 4) & 1) << k).sum();
        }
    }
    if ty == GgmlType::Q6_K {
        for h in 0..2 {
            for b in 0..4 {
                out[16 + 4 * h + b] = (0..4).map(|m| ((u[4 * (4 * h + m) + b] >> 4) & 3) << (2 * m)).sum();
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
