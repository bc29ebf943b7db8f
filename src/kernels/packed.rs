//! The packed row layout of quantized matrices, built once at load.
//!
//! ggml interleaves each block's f16 scale (and offset) with its codes. The kernels want
//! the codes of a row contiguous and the row's scales together, so they can convert 16
//! scales with one instruction. A packed row of `G` groups is
//!
//! ```text
//! [G][code bytes]  codes, in ggml's order within each group
//! [G] f16 d        scales
//! [G] f16 m        offsets (Q4_1 only)
//! ```
//!
//! which takes exactly as many bytes as the ggml row.
//!
//! The int8 kernels ([`super::int8`]) use the same row with its codes in the *chunked*
//! order ([`Layout::Chunked`]): groups in chunks of 16 (the last chunk has `n = G mod 16`
//! groups if that is not 0, else 16), and chunk `c`'s `16 * code bytes` bytes, at the same
//! place as in the grouped order, are `[word j: code bytes / 4][group l: n][byte b: 4]`
//! holding code byte `4j + b` of group `16c + l`. One 64-byte load of word `j` then gives 4
//! code bytes of each of 16 groups, matching the activation layout of
//! [`super::quantize_act`]. A last chunk of `n <= 4` groups is *narrow*: Q4 codes stay in
//! the grouped order (lane `4g + w` of one vector = code bytes `16g + 4w ..`), Q8_0 codes
//! are `[half h: 2][group g: n][16 bytes]` holding code byte `16h + i` of group `g` at `i`.
//! Scales and offsets are unchanged.

use crate::tensor::{as_blocks, BlockQ4_0, BlockQ4_1, BlockQ8_0, GgmlType, QK};

/// Whether matrices of this type are repacked (the quantized ones) or used as stored.
pub fn is_packed(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// Repacks whole ggml rows (`ggml.len()` a multiple of the row size) into the packed layout.
pub fn pack_rows(ty: GgmlType, cols: usize, ggml: &[u8]) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols);
    assert!(is_packed(ty) && ggml.len().is_multiple_of(row_bytes));
    let groups = cols / QK;
    let mut out = vec![0u8; ggml.len()];
    for (src, dst) in ggml.chunks_exact(row_bytes).zip(out.chunks_exact_mut(row_bytes)) {
        match ty {
            GgmlType::Q8_0 => pack(as_blocks::<BlockQ8_0>(src), dst, groups, |b| (bytemuck_i8(&b.qs), b.d, None)),
            GgmlType::Q4_0 => pack(as_blocks::<BlockQ4_0>(src), dst, groups, |b| (&b.qs[..], b.d, None)),
            GgmlType::Q4_1 => pack(as_blocks::<BlockQ4_1>(src), dst, groups, |b| (&b.qs[..], b.d, Some(b.m))),
            _ => unreachable!("checked by is_packed"),
        }
    }
    out
}

fn pack<B>(blocks: &[B], dst: &mut [u8], groups: usize, parts: impl Fn(&B) -> (&[u8], [u8; 2], Option<[u8; 2]>)) {
    let code_bytes = parts(&blocks[0]).0.len();
    let (codes, scales) = dst.split_at_mut(groups * code_bytes);
    let (d, m) = scales.split_at_mut(groups * 2);
    for (g, b) in blocks.iter().enumerate() {
        let (q, bd, bm) = parts(b);
        codes[g * code_bytes..(g + 1) * code_bytes].copy_from_slice(q);
        d[2 * g..2 * g + 2].copy_from_slice(&bd);
        if let Some(bm) = bm {
            m[2 * g..2 * g + 2].copy_from_slice(&bm);
        }
    }
}

fn bytemuck_i8(q: &[i8; QK]) -> &[u8] {
    // SAFETY: i8 and u8 have the same size and alignment.
    unsafe { std::slice::from_raw_parts(q.as_ptr().cast::<u8>(), QK) }
}

/// The order of the codes within a packed row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Each group's code bytes together, groups in order (the f32 kernels).
    Grouped,
    /// Chunks of 16 groups, interleaved 4 bytes at a time (the int8 kernels).
    Chunked,
}

/// Groups per chunk of the chunked layout.
const CHUNK: usize = 16;
/// Largest narrow last chunk (as in `quantize_act`).
const NARROW_MAX: usize = super::quantize_act::NARROW_MAX;

/// Offset in a row's codes of code byte `byte` of group `g`, for a row of `groups` groups
/// of `code_bytes` bytes each in the chunked layout.
#[inline]
pub fn chunked_code_offset(code_bytes: usize, groups: usize, g: usize, byte: usize) -> usize {
    let (c, l) = (g / CHUNK, g % CHUNK);
    let n = (groups - c * CHUNK).min(CHUNK);
    let base = c * CHUNK * code_bytes;
    if n > NARROW_MAX {
        base + ((byte / 4) * n + l) * 4 + byte % 4
    } else if code_bytes == QK / 2 {
        base + l * code_bytes + byte
    } else {
        base + (byte / 16) * 16 * n + 16 * l + byte % 16
    }
}

/// Bytes of codes per group of a packed type.
pub fn code_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 => QK,
        GgmlType::Q4_0 | GgmlType::Q4_1 => QK / 2,
        _ => unreachable!("not a packed type"),
    }
}

/// Reorders the codes of whole packed rows (grouped layout) into the chunked layout, in place.
pub fn chunk_rows(ty: GgmlType, cols: usize, packed: &mut [u8]) {
    let row_bytes = ty.row_bytes(cols);
    assert!(is_packed(ty) && packed.len().is_multiple_of(row_bytes));
    let (groups, cb) = (cols / QK, code_bytes(ty));
    let mut grouped = vec![0u8; groups * cb];
    for row in packed.chunks_exact_mut(row_bytes) {
        grouped.copy_from_slice(&row[..groups * cb]);
        for g in 0..groups {
            // Every layout keeps runs of 4 code bytes (one i32 lane) together.
            for b in (0..cb).step_by(4) {
                let at = chunked_code_offset(cb, groups, g, b);
                row[at..at + 4].copy_from_slice(&grouped[g * cb + b..g * cb + b + 4]);
            }
        }
    }
}

/// Dequantizes one packed row (grouped layout), with the same values (bit for bit) as
/// ggml's dequantization of the original row.
pub fn dequantize_packed_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    dequantize_packed_row_in(ty, Layout::Grouped, row, out)
}

/// [`dequantize_packed_row`] for a row in either layout.
pub fn dequantize_packed_row_in(ty: GgmlType, layout: Layout, row: &[u8], out: &mut [f32]) {
    assert!(is_packed(ty) && row.len() == ty.row_bytes(out.len()));
    let groups = out.len() / QK;
    let cb = code_bytes(ty);
    let code = |g: usize, b: usize| match layout {
        Layout::Grouped => row[g * cb + b],
        Layout::Chunked => row[chunked_code_offset(cb, groups, g, b)],
    };
    let scales = &row[groups * cb..];
    let f16 = |bytes: &[u8], g: usize| half::f16::from_le_bytes([bytes[2 * g], bytes[2 * g + 1]]).to_f32();
    match ty {
        GgmlType::Q8_0 => {
            for (g, o) in out.chunks_exact_mut(QK).enumerate() {
                let dg = f16(scales, g);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = dg * (code(g, j) as i8) as f32;
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (d, m) = scales.split_at(groups * 2);
            for (g, o) in out.chunks_exact_mut(QK).enumerate() {
                let dg = f16(d, g);
                for j in 0..QK / 2 {
                    let q = code(g, j);
                    let (lo, hi) = ((q & 0x0F) as f32, (q >> 4) as f32);
                    if ty == GgmlType::Q4_0 {
                        o[j] = dg * (lo - 8.0);
                        o[j + QK / 2] = dg * (hi - 8.0);
                    } else {
                        let mg = f16(m, g);
                        o[j] = dg * lo + mg;
                        o[j + QK / 2] = dg * hi + mg;
                    }
                }
            }
        }
        _ => unreachable!("checked by is_packed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::dequantize_row;

    #[test]
    fn packed_rows_dequantize_to_the_same_bits() {
        let mut state = 0x9E3779B97F4A7C15u64;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        };
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1] {
            let (rows, cols) = (3, 21 * QK);
            let mut ggml: Vec<u8> = (0..rows * ty.row_bytes(cols)).map(|_| byte()).collect();
            // Keep the f16 scales finite so the comparison is of numbers.
            for b in ggml.chunks_exact_mut(ty.block_bytes()) {
                b[1] &= 0x3F;
                if ty == GgmlType::Q4_1 {
                    b[3] &= 0x3F;
                }
            }
            let packed = pack_rows(ty, cols, &ggml);
            let mut chunked = packed.clone();
            chunk_rows(ty, cols, &mut chunked);
            let rb = ty.row_bytes(cols);
            for r in 0..rows {
                let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
                dequantize_row(ty, &ggml[r * rb..(r + 1) * rb], &mut a);
                dequantize_packed_row(ty, &packed[r * rb..(r + 1) * rb], &mut b);
                assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                dequantize_packed_row_in(ty, Layout::Chunked, &chunked[r * rb..(r + 1) * rb], &mut b);
                assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            }
        }
    }
}
