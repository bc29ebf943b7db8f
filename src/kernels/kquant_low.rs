//! The int8 layouts of the low-bit K-quants, Q3_K and Q2_K: ggml's 256-value super-blocks
//! repacked at load for [`super::int8`], in exactly ggml's bytes per row (Q3_K 110, Q2_K 84
//! per 256 values).
//!
//! A row of `G` groups of 32 values (`G` a multiple of 8: `S = G / 8` super-blocks) holds
//! first the groups' code bytes in the chunked order of [`super::packed`] (chunks of 16
//! groups, code byte `4j + b` of group `16c + l` at `[word j][lane l][byte b]`; a last chunk
//! has 8 or 16 groups, so it is never narrow), then the scales. Q3_K:
//!
//! ```text
//! [G][12] codes    u = c + 4 in 0..8 (3 bits), c the signed code in -4..4.
//!                  Byte 4j + b (j < 2), bits 2m..2m + 2: bits 0..2 of value 4(4j + m) + b;
//!                  byte 8 + b, bit k: bit 2 of value 4k + b
//! [S][12] scales   ggml's 12 bytes of sixteen 6-bit sub-block scales, stored plus 32
//! [S] f16 d        the super-block scale
//! ```
//!
//! so code word `k` of a group (values `4k..4k + 4`, the activation word `k` of
//! [`super::quantize_act`]) is the 2-bit fields `2 (k % 4)` of word `k / 4` and bit `k` of
//! word 2. In ggml's block, `u`'s low two bits are `qs`'s field and its bit 2 the `hmask` bit.
//! The weights: `(d sc_h) c` for the group's half `h` (values `16h..16h + 16`), `sc_h` the
//! sub-block scale minus 32 (in `-32..32`); `d sc_h` is exact in f32 (an f16 times a 6-bit
//! integer), ggml's values bit for bit ([`group`]).
//!
//! Q2_K:
//!
//! ```text
//! [G][8] codes     q in 0..4 (2 bits): bytes 0..8 of Q3_K's code bytes (no bit 2)
//! [G][2] scales    ggml's sub-block bytes: sc_h in the low nibble, m_h in the high one
//! [S] f16 d        the super-block scale of the sub-block scales
//! [S] f16 dmin     the super-block scale of the sub-block minimums
//! ```
//!
//! The weights: `(d sc_h) q - dmin m_h` for the group's half `h`; `d sc_h` and `dmin m_h` are
//! exact in f32 (an f16 times a 4-bit integer), ggml's values bit for bit.

use crate::tensor::{GgmlType, Group, QK};

use super::packed::chunked_code_offset;

/// Groups per super-block.
pub const SUPER_GROUPS: usize = 8;
/// Q3_K's code bytes per group.
pub const CODE_BYTES: usize = 12;
/// Bytes of a Q3_K super-block's packed sub-block scales.
pub const SCALE_BYTES: usize = 12;
/// Q2_K's code bytes per group.
pub const Q2K_CODE_BYTES: usize = 8;

/// Code bytes per group of a type of this module's.
pub fn code_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q3_K => CODE_BYTES,
        GgmlType::Q2_K => Q2K_CODE_BYTES,
        _ => unreachable!("{} is not a low-bit K-quant", ty.name()),
    }
}

/// Packs whole ggml Q3_K or Q2_K rows of `cols` values into the int8 layout (`out`: as many
/// bytes).
pub fn pack_rows(ty: GgmlType, cols: usize, ggml: &[u8], out: &mut [u8]) {
    if ty == GgmlType::Q2_K {
        return pack_q2k_rows(cols, ggml, out);
    }
    assert_eq!(ty, GgmlType::Q3_K);
    let row_bytes = ty.row_bytes(cols);
    assert!(cols.is_multiple_of(256) && ggml.len().is_multiple_of(row_bytes) && out.len() == ggml.len());
    let groups = cols / QK;
    let supers = groups / SUPER_GROUPS;
    let decode = ty.spec().decode_groups.expect("Q3_K has a group decoder");
    let mut decoded = vec![Group::ZERO; groups];
    for (src, dst) in ggml.chunks_exact(row_bytes).zip(out.chunks_exact_mut(row_bytes)) {
        decode(src, &mut decoded);
        let (codes, scales) = dst.split_at_mut(groups * CODE_BYTES);
        for (g, group) in decoded.iter().enumerate() {
            let u = group.codes.map(|c| (c + 4) as u8);
            debug_assert!(u.iter().all(|&v| v < 8));
            let mut bytes = [0u8; CODE_BYTES];
            for j in 0..2 {
                for b in 0..4 {
                    bytes[4 * j + b] = (0..4).map(|m| (u[4 * (4 * j + m) + b] & 3) << (2 * m)).sum();
                }
            }
            for b in 0..4 {
                bytes[8 + b] = (0..8).map(|k| ((u[4 * k + b] >> 2) & 1) << k).sum();
            }
            for b in (0..CODE_BYTES).step_by(4) {
                let at = chunked_code_offset(CODE_BYTES, groups, g, b);
                codes[at..at + 4].copy_from_slice(&bytes[b..b + 4]);
            }
        }
        for (s, block) in src.chunks_exact(ty.block_bytes()).enumerate() {
            scales[SCALE_BYTES * s..SCALE_BYTES * (s + 1)].copy_from_slice(&block[96..108]);
            let d_at = SCALE_BYTES * supers + 2 * s;
            scales[d_at..d_at + 2].copy_from_slice(&block[108..110]);
        }
    }
}

/// [`pack_rows`] for Q2_K.
fn pack_q2k_rows(cols: usize, ggml: &[u8], out: &mut [u8]) {
    let ty = GgmlType::Q2_K;
    let row_bytes = ty.row_bytes(cols);
    assert!(cols.is_multiple_of(256) && ggml.len().is_multiple_of(row_bytes) && out.len() == ggml.len());
    let groups = cols / QK;
    let supers = groups / SUPER_GROUPS;
    let decode = ty.spec().decode_groups.expect("Q2_K has a group decoder");
    let mut decoded = vec![Group::ZERO; groups];
    for (src, dst) in ggml.chunks_exact(row_bytes).zip(out.chunks_exact_mut(row_bytes)) {
        decode(src, &mut decoded);
        let (codes, scales) = dst.split_at_mut(groups * Q2K_CODE_BYTES);
        for (g, group) in decoded.iter().enumerate() {
            debug_assert!(group.codes.iter().all(|&q| (0..4).contains(&q)));
            let mut bytes = [0u8; Q2K_CODE_BYTES];
            for j in 0..2 {
                for b in 0..4 {
                    bytes[4 * j + b] = (0..4).map(|m| (group.codes[4 * (4 * j + m) + b] as u8) << (2 * m)).sum();
                }
            }
            for b in (0..Q2K_CODE_BYTES).step_by(4) {
                let at = chunked_code_offset(Q2K_CODE_BYTES, groups, g, b);
                codes[at..at + 4].copy_from_slice(&bytes[b..b + 4]);
            }
        }
        for (s, block) in src.chunks_exact(ty.block_bytes()).enumerate() {
            scales[16 * s..16 * (s + 1)].copy_from_slice(&block[0..16]);
            let d_at = 2 * groups + 2 * s;
            scales[d_at..d_at + 2].copy_from_slice(&block[80..82]);
            let dmin_at = 2 * groups + 2 * supers + 2 * s;
            scales[dmin_at..dmin_at + 2].copy_from_slice(&block[82..84]);
        }
    }
}

/// The sixteen sub-block scales of a super-block minus 32, from its 12 packed bytes `h`:
/// ggml's unpacking of Q3_K's scales on 32-bit words.
#[inline(always)]
pub fn q3k_scales(h: &[u8; SCALE_BYTES]) -> [i8; 16] {
    const K1: u32 = 0x03030303;
    const K2: u32 = 0x0f0f0f0f;
    let w = |i: usize| u32::from_le_bytes([h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]]);
    let (a, b, t) = (w(0), w(1), w(2));
    let words = [
        (a & K2) | ((t & K1) << 4),
        (b & K2) | (((t >> 2) & K1) << 4),
        ((a >> 4) & K2) | (((t >> 4) & K1) << 4),
        ((b >> 4) & K2) | (((t >> 6) & K1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, word) in words.iter().enumerate() {
        for (j, byte) in word.to_le_bytes().iter().enumerate() {
            out[4 * i + j] = *byte as i8 - 32;
        }
    }
    out
}

/// Group `g` of a Q3_K or Q2_K row (`groups` groups) in the int8 layout, decoded: ggml's
/// values by [`Group::values`] (with the offsets for Q2_K).
pub fn group(ty: GgmlType, row: &[u8], groups: usize, g: usize) -> Group {
    if ty == GgmlType::Q2_K {
        return q2k_group(row, groups, g);
    }
    let byte = |i: usize| row[chunked_code_offset(CODE_BYTES, groups, g, i)];
    let scales = &row[groups * CODE_BYTES..];
    let supers = groups / SUPER_GROUPS;
    let s = g / SUPER_GROUPS;
    let mut out = Group::ZERO;
    for v in 0..QK {
        let k = v / 4;
        let low = (byte(4 * (k / 4) + v % 4) >> (2 * (k % 4))) & 3;
        let high = (byte(8 + v % 4) >> k) & 1;
        out.codes[v] = (low | (high << 2)) as i8 - 4;
    }
    let sc = q3k_scales(scales[SCALE_BYTES * s..SCALE_BYTES * (s + 1)].try_into().unwrap());
    let d_at = SCALE_BYTES * supers + 2 * s;
    let d = half::f16::from_le_bytes([scales[d_at], scales[d_at + 1]]).to_f32();
    let j = 2 * (g % SUPER_GROUPS);
    out.scale = [d * sc[j] as f32, d * sc[j + 1] as f32];
    out
}

/// [`group`] for Q2_K.
fn q2k_group(row: &[u8], groups: usize, g: usize) -> Group {
    let byte = |i: usize| row[chunked_code_offset(Q2K_CODE_BYTES, groups, g, i)];
    let scales = &row[groups * Q2K_CODE_BYTES..];
    let (supers, s) = (groups / SUPER_GROUPS, g / SUPER_GROUPS);
    let f16 = |at: usize| half::f16::from_le_bytes([scales[at], scales[at + 1]]).to_f32();
    let (d, dmin) = (f16(2 * groups + 2 * s), f16(2 * groups + 2 * supers + 2 * s));
    let mut out = Group::ZERO;
    for v in 0..QK {
        let k = v / 4;
        out.codes[v] = ((byte(4 * (k / 4) + v % 4) >> (2 * (k % 4))) & 3) as i8;
    }
    for h in 0..2 {
        let sm = scales[2 * g + h];
        out.scale[h] = d * (sm & 0x0F) as f32;
        out.offset[h] = -(dmin * (sm >> 4) as f32);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's scale of sub-block `j`: low 4 bits from nibble `j / 8` of byte `j % 8`, high 2
    /// bits from bits `2 (j / 4)` of byte `8 + j % 4`, minus 32.
    fn scale(s: &[u8], j: usize) -> i8 {
        let low = (s[j % 8] >> (4 * (j / 8))) & 0x0F;
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    }

    #[test]
    fn q3k_scales_is_ggml_unpacking() {
        let mut state = 0x2545F4914F6CDD1Du64;
        for _ in 0..2000 {
            let mut h = [0u8; 12];
            for b in &mut h {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = (state >> 32) as u8;
            }
            let sc = q3k_scales(&h);
            for (j, &v) in sc.iter().enumerate() {
                assert_eq!(v, scale(&h, j), "{j}");
            }
        }
    }
}
