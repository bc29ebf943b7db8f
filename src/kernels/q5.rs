//! The int8 layout of Q5_0 and Q5_1: ggml's 32-value blocks repacked at load for
//! [`super::int8`], in exactly ggml's bytes per row (22 and 24 bytes per 32 values).
//!
//! A row of `G` groups of 32 values holds first the groups' code bytes, then the scales:
//!
//! ```text
//! [G][20] codes   u in 0..32 (5 bits). Bytes 0..16: ggml's `qs` (byte i: low 4 bits of
//!                 value i in the low nibble, of value 16 + i in the high nibble);
//!                 byte 16 + b, bit k: bit 4 of value 4k + b (ggml's `qh` regrouped)
//! [G] f16 d       the scales
//! [G] f16 m       the offsets (Q5_1 only)
//! ```
//!
//! The codes are in the chunked order of [`super::packed`] (chunks of 16 groups, code byte
//! `4j + b` of group `16c + l` at `[word j][lane l][byte b]` of the chunk), except in a
//! *narrow* last chunk of `n <= 4` groups, which matches the narrow activation layout of
//! [`super::quantize_act`]: its `16 n` nibble bytes in the grouped order (group `g`'s bytes
//! at `16 g`, so lane `4g + w` of one vector holds bytes `16g + 4w..`), then its `n` words of
//! high bits (group `g`'s at `16 n + 4 g`, where the wide layout has them too).
//!
//! The weights: Q5_0 `d (u - 16)`, Q5_1 `d u + m`, ggml's values bit for bit ([`group`]).

use crate::tensor::{GgmlType, Group, QK};

use super::quantize_act::NARROW_MAX;

/// Code bytes per group.
pub const CODE_BYTES: usize = 20;
/// Groups per chunk.
const CHUNK: usize = 16;

/// Offset in a row's codes of code byte `byte` of group `g`, for a row of `groups` groups
/// (module docs).
#[inline]
pub fn code_offset(groups: usize, g: usize, byte: usize) -> usize {
    let (c, l) = (g / CHUNK, g % CHUNK);
    let n = (groups - c * CHUNK).min(CHUNK);
    let base = c * CHUNK * CODE_BYTES;
    if n <= NARROW_MAX && byte < 16 {
        base + 16 * l + byte
    } else {
        base + ((byte / 4) * n + l) * 4 + byte % 4
    }
}

/// The ggml block's parts: (`d`, `m` (Q5_1), `qh`, `qs`).
fn block_parts(ty: GgmlType, b: &[u8]) -> ([u8; 2], Option<[u8; 2]>, u32, &[u8]) {
    match ty {
        GgmlType::Q5_0 => ([b[0], b[1]], None, u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &b[6..22]),
        GgmlType::Q5_1 => ([b[0], b[1]], Some([b[2], b[3]]), u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24]),
        _ => unreachable!("not Q5_0 or Q5_1"),
    }
}

/// Packs whole ggml rows of `cols` values into the int8 layout (`out`: as many bytes).
pub fn pack_rows(ty: GgmlType, cols: usize, ggml: &[u8], out: &mut [u8]) {
    let row_bytes = ty.row_bytes(cols);
    assert!(cols.is_multiple_of(QK) && ggml.len().is_multiple_of(row_bytes) && out.len() == ggml.len());
    let groups = cols / QK;
    for (src, dst) in ggml.chunks_exact(row_bytes).zip(out.chunks_exact_mut(row_bytes)) {
        let (codes, scales) = dst.split_at_mut(groups * CODE_BYTES);
        let (d, m) = scales.split_at_mut(2 * groups);
        for (g, block) in src.chunks_exact(ty.block_bytes()).enumerate() {
            let (bd, bm, qh, qs) = block_parts(ty, block);
            let mut bytes = [0u8; CODE_BYTES];
            bytes[..16].copy_from_slice(qs);
            for b in 0..4 {
                bytes[16 + b] = (0..8).map(|k| (((qh >> (4 * k + b)) & 1) as u8) << k).sum();
            }
            for b in (0..CODE_BYTES).step_by(4) {
                let at = code_offset(groups, g, b);
                codes[at..at + 4].copy_from_slice(&bytes[b..b + 4]);
            }
            d[2 * g..2 * g + 2].copy_from_slice(&bd);
            if let Some(bm) = bm {
                m[2 * g..2 * g + 2].copy_from_slice(&bm);
            }
        }
    }
}

/// Group `g` of a row (`groups` groups) in the int8 layout, decoded: ggml's values by
/// [`Group::values`] (with offsets for Q5_1).
pub fn group(ty: GgmlType, row: &[u8], groups: usize, g: usize) -> Group {
    let byte = |i: usize| row[code_offset(groups, g, i)];
    let scales = &row[groups * CODE_BYTES..];
    let f16 = |at: usize| half::f16::from_le_bytes([scales[at], scales[at + 1]]).to_f32();
    let bias = if ty == GgmlType::Q5_0 { 16 } else { 0 };
    let mut out = Group::ZERO;
    for v in 0..QK {
        let low = (byte(v % 16) >> (4 * (v / 16))) & 0x0F;
        let high = (byte(16 + v % 4) >> (v / 4)) & 1;
        out.codes[v] = (low | (high << 4)) as i8 - bias;
    }
    out.scale = [f16(2 * g); 2];
    if ty == GgmlType::Q5_1 {
        out.offset = [f16(2 * groups + 2 * g); 2];
    }
    out
}
