//! The packed row layouts of quantized matrices, built once at load.
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
//! which takes exactly as many bytes as the ggml row (Q8_0, Q4_0, Q4_1; for the float32
//! kernels Q5_0 is held as Q8_0, its 5-bit codes in signed bytes).
//!
//! Types the kernels read as decoded groups ([`KernelGroup::Groups`]: Q5_1 and the
//! K-quants) are decoded at load into [`Group`]s and stored as
//!
//! ```text
//! [G][code bytes]       codes (one i8 each, or nibbles in Q4_0's order)
//! [G][S] f32 scale      native-endian; S = 2 (a scale per half of 16 values) or 1 (per group)
//! [G][S] f32 offset     if the format has offsets
//! ```
//!
//! so that a weight is `scale * code (+ offset)`: ggml's dequantized value bit for bit, with
//! the sub-block scale already multiplied by the super-block scale (exact, see each type).
//! These rows are larger than ggml's ([`packed_row_bytes`]); the int8 kernels do not read
//! them (matrices of these types run the float32 kernels in either precision).
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
//!
//! Q8_0, Q5_K and Q6_K need no packing for the int8 kernels: they read their ggml blocks in place
//! ([`Layout::Blocks`], [`reads_blocks_in_place`]), and their matrices are used from the file
//! map.
//!
//! The types of [`has_own_int8_layout`] (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, Q5_0, Q5_1) have a chunked
//! layout of their own, packed straight from ggml's blocks and exactly as large
//! ([`super::kquant`], [`super::kquant_low`], [`super::q5`]); their grouped layout (float32)
//! is the one above (decoded groups, or Q8_0's for Q5_0).

use crate::tensor::{as_blocks, dequantize_row, BlockQ4_0, BlockQ4_1, BlockQ8_0, Codes, GgmlType, Group, GroupFormat, KernelGroup, QK};

/// Whether matrices of this type are repacked (the quantized ones) or used as stored.
pub fn is_packed(ty: GgmlType) -> bool {
    !matches!(ty.kernel(), KernelGroup::F32 | KernelGroup::F16 | KernelGroup::Bf16)
}

/// Whether the int8 kernels can read matrices of this type (Q8_0, Q4_0, Q4_1 packed from
/// ggml blocks of 32, or a type of [`has_own_int8_layout`]).
pub fn is_int8_packable(ty: GgmlType) -> bool {
    matches!(ty.kernel(), KernelGroup::Q8_0 | KernelGroup::Q4_0 | KernelGroup::Q4_1) || has_own_int8_layout(ty)
}

/// The types whose int8 (chunked) layout is packed straight from ggml's blocks in exactly
/// ggml's bytes, not through the grouped layout: the K-quants of [`is_kquant_int8`], Q3_K and
/// Q2_K ([`super::kquant_low`]), Q5_0 and Q5_1 ([`super::q5`]).
pub fn has_own_int8_layout(ty: GgmlType) -> bool {
    is_kquant_int8(ty) || matches!(ty, GgmlType::Q3_K | GgmlType::Q2_K | GgmlType::Q5_0 | GgmlType::Q5_1)
}

/// The K-quant types with int8 kernels, packed for them straight from ggml's blocks into the
/// layout of [`super::kquant`] (as many bytes as ggml's), not through decoded groups.
pub fn is_kquant_int8(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Bytes of one row of `cols` values packed in `layout`: [`packed_row_bytes`], except for the
/// int8 layouts of [`has_own_int8_layout`] and ggml's blocks, which take exactly ggml's bytes.
pub fn layout_row_bytes(ty: GgmlType, layout: Layout, cols: usize) -> usize {
    if layout == Layout::Blocks || (layout == Layout::Chunked && has_own_int8_layout(ty)) {
        ty.row_bytes(cols)
    } else {
        packed_row_bytes(ty, cols)
    }
}

/// Whole ggml rows (`ggml.len()` a multiple of the row size) packed in `layout` into `out`
/// (exactly the packed size of those rows, [`layout_row_bytes`]): [`pack_rows_into`] for the
/// grouped layout; each type's chunked layout straight from ggml's blocks.
pub fn pack_rows_in(ty: GgmlType, layout: Layout, cols: usize, ggml: &[u8], out: &mut [u8]) {
    match layout {
        Layout::Chunked if is_kquant_int8(ty) => super::kquant::pack_rows(ty, cols, ggml, out),
        Layout::Chunked if matches!(ty, GgmlType::Q3_K | GgmlType::Q2_K) => super::kquant_low::pack_rows(ty, cols, ggml, out),
        Layout::Chunked if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) => super::q5::pack_rows(ty, cols, ggml, out),
        Layout::Chunked => {
            let row_bytes = packed_row_bytes(ty, cols);
            match ty {
                GgmlType::Q8_0 => chunk_blocks(as_blocks::<BlockQ8_0>(ggml), cols, row_bytes, out, |b| (bytemuck_i8(&b.qs), b.d, None)),
                GgmlType::Q4_0 => chunk_blocks(as_blocks::<BlockQ4_0>(ggml), cols, row_bytes, out, |b| (&b.qs[..], b.d, None)),
                GgmlType::Q4_1 => chunk_blocks(as_blocks::<BlockQ4_1>(ggml), cols, row_bytes, out, |b| (&b.qs[..], b.d, Some(b.m))),
                _ => panic!("{} has no int8 layout", ty.name()),
            }
        }
        Layout::Grouped => pack_rows_into(ty, cols, ggml, out),
        Layout::Blocks => out.copy_from_slice(ggml),
    }
}

/// The decoded-group format of the type, if the kernels read it as groups.
fn group_format(ty: GgmlType) -> Option<GroupFormat> {
    match ty.kernel() {
        KernelGroup::Groups(f) => Some(f),
        _ => None,
    }
}

/// Bytes of one row of `cols` values in the kernels' layout (as stored for float types).
pub fn packed_row_bytes(ty: GgmlType, cols: usize) -> usize {
    let group_bytes = match ty.kernel() {
        KernelGroup::F32 | KernelGroup::F16 | KernelGroup::Bf16 => return ty.row_bytes(cols),
        KernelGroup::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
        KernelGroup::Q4_0 => std::mem::size_of::<BlockQ4_0>(),
        KernelGroup::Q4_1 => std::mem::size_of::<BlockQ4_1>(),
        KernelGroup::Groups(f) => f.group_bytes(),
    };
    cols / QK * group_bytes
}

/// Repacks whole ggml rows (`ggml.len()` a multiple of the row size) into the packed layout.
pub fn pack_rows(ty: GgmlType, cols: usize, ggml: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; ggml.len() / ty.row_bytes(cols) * packed_row_bytes(ty, cols)];
    pack_rows_into(ty, cols, ggml, &mut out);
    out
}

/// [`pack_rows`] into `out` (exactly the packed size of the rows of `ggml`).
pub fn pack_rows_into(ty: GgmlType, cols: usize, ggml: &[u8], out: &mut [u8]) {
    let row_bytes = ty.row_bytes(cols);
    assert!(is_packed(ty) && ggml.len().is_multiple_of(row_bytes));
    let groups = cols / QK;
    let packed_bytes = packed_row_bytes(ty, cols);
    assert_eq!(out.len(), ggml.len() / row_bytes * packed_bytes);
    let mut decoded = vec![Group::ZERO; groups];
    for (src, dst) in ggml.chunks_exact(row_bytes).zip(out.chunks_exact_mut(packed_bytes)) {
        match ty.kernel() {
            // Another type held as Q8_0 (Q5_0): its codes as signed bytes, its f16 scale.
            KernelGroup::Q8_0 if ty != GgmlType::Q8_0 => {
                let decode = ty.spec().decode_groups.expect("types held as Q8_0 have a group decoder");
                decode(src, &mut decoded);
                pack_as_q8_0(&decoded, dst);
            }
            KernelGroup::Q8_0 => pack(as_blocks::<BlockQ8_0>(src), dst, groups, |b| (bytemuck_i8(&b.qs), b.d, None)),
            KernelGroup::Q4_0 => pack(as_blocks::<BlockQ4_0>(src), dst, groups, |b| (&b.qs[..], b.d, None)),
            KernelGroup::Q4_1 => pack(as_blocks::<BlockQ4_1>(src), dst, groups, |b| (&b.qs[..], b.d, Some(b.m))),
            KernelGroup::Groups(format) => {
                let decode = ty.spec().decode_groups.expect("group types have a group decoder");
                decode(src, &mut decoded);
                pack_groups(format, &decoded, dst);
            }
            KernelGroup::F32 | KernelGroup::F16 | KernelGroup::Bf16 => unreachable!("checked by is_packed"),
        }
    }
}

/// Writes one row of decoded groups with one f16-exact scale each (Q5_0) in Q8_0's packed
/// layout.
fn pack_as_q8_0(groups: &[Group], dst: &mut [u8]) {
    let (codes, scales) = dst.split_at_mut(groups.len() * QK);
    for (i, g) in groups.iter().enumerate() {
        for (b, &q) in codes[i * QK..(i + 1) * QK].iter_mut().zip(&g.codes) {
            *b = q as u8;
        }
        let d = half::f16::from_f32(g.scale[0]);
        debug_assert!(d.to_f32().to_bits() == g.scale[0].to_bits() || d.is_nan());
        scales[2 * i..2 * i + 2].copy_from_slice(&d.to_le_bytes());
    }
}

/// Writes one row of decoded groups in the group layout (module docs).
fn pack_groups(format: GroupFormat, groups: &[Group], dst: &mut [u8]) {
    let (cb, s) = (format.code_bytes(), format.scales());
    let (codes, rest) = dst.split_at_mut(groups.len() * cb);
    let (scales, offsets) = rest.split_at_mut(groups.len() * s * 4);
    for (i, g) in groups.iter().enumerate() {
        let c = &mut codes[i * cb..(i + 1) * cb];
        match format.codes {
            Codes::I8 => {
                for (b, &q) in c.iter_mut().zip(&g.codes) {
                    *b = q as u8;
                }
            }
            Codes::Nibbles { bias } => {
                for (l, b) in c.iter_mut().enumerate() {
                    let (lo, hi) = (g.codes[l] - bias, g.codes[l + 16] - bias);
                    debug_assert!((0..16).contains(&lo) && (0..16).contains(&hi));
                    *b = lo as u8 | ((hi as u8) << 4);
                }
            }
        }
        for h in 0..s {
            scales[(i * s + h) * 4..(i * s + h + 1) * 4].copy_from_slice(&g.scale[h].to_ne_bytes());
            if format.offset {
                offsets[(i * s + h) * 4..(i * s + h + 1) * 4].copy_from_slice(&g.offset[h].to_ne_bytes());
            }
        }
    }
}

/// Group `g` of a packed row in the group layout of `format` (`groups` groups).
pub fn packed_group(format: GroupFormat, row: &[u8], groups: usize, g: usize) -> Group {
    let (cb, s) = (format.code_bytes(), format.scales());
    let c = &row[g * cb..(g + 1) * cb];
    let mut out = Group::ZERO;
    match format.codes {
        Codes::I8 => {
            for (q, &b) in out.codes.iter_mut().zip(c) {
                *q = b as i8;
            }
        }
        Codes::Nibbles { bias } => {
            for (l, &b) in c.iter().enumerate() {
                out.codes[l] = (b & 0x0F) as i8 + bias;
                out.codes[l + 16] = (b >> 4) as i8 + bias;
            }
        }
    }
    let f32_at = |at: usize| f32::from_ne_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
    let scales = groups * cb;
    let offsets = scales + groups * s * 4;
    for h in 0..2 {
        let k = g * s + h.min(s - 1);
        out.scale[h] = f32_at(scales + 4 * k);
        if format.offset {
            out.offset[h] = f32_at(offsets + 4 * k);
        }
    }
    out
}

fn pack<B>(blocks: &[B], dst: &mut [u8], groups: usize, parts: impl Fn(&B) -> (&[u8], [u8; 2], Option<[u8; 2]>)) {
    let code_bytes = parts(&blocks[0]).0.len();
    let (codes, scales) = dst.split_at_mut(groups * code_bytes);
    for (g, b) in blocks.iter().enumerate() {
        codes[g * code_bytes..(g + 1) * code_bytes].copy_from_slice(parts(b).0);
    }
    write_scales(blocks, scales, parts);
}

/// A row's blocks' f16 scales (`[G]`), then their f16 offsets (`[G]`, if `parts` gives
/// them), into the scales part of the packed row (`parts`: a block's codes, d and m).
fn write_scales<B>(row: &[B], scales: &mut [u8], parts: impl Fn(&B) -> (&[u8], [u8; 2], Option<[u8; 2]>)) {
    let (d, m) = scales.split_at_mut(2 * row.len());
    for (g, b) in row.iter().enumerate() {
        let (_, bd, bm) = parts(b);
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
    /// ggml's blocks as the file stores them, which the int8 kernels read in place for the
    /// types of [`reads_blocks_in_place`]: nothing is packed.
    Blocks,
}

/// The types whose int8 kernels read ggml's blocks in place ([`Layout::Blocks`]): Q8_0, whose
/// block (an f16 scale, then 32 signed codes) the kernels transpose into the chunked order
/// as they read it, and Q5_K and Q6_K, whose super-blocks' codes they unpack into it; so at
/// int8 their matrices are used straight from the file map.
pub fn reads_blocks_in_place(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_K | GgmlType::Q6_K)
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

/// Bytes of codes per group of a packed type (in the chunked layout for the types of
/// [`has_own_int8_layout`]).
pub fn code_bytes(ty: GgmlType) -> usize {
    if is_kquant_int8(ty) {
        return super::kquant::code_bytes(ty);
    }
    match ty {
        GgmlType::Q3_K | GgmlType::Q2_K => return super::kquant_low::code_bytes(ty),
        GgmlType::Q5_0 | GgmlType::Q5_1 => return super::q5::CODE_BYTES,
        _ => {}
    }
    match ty.kernel() {
        KernelGroup::Q8_0 => QK,
        KernelGroup::Q4_0 | KernelGroup::Q4_1 => QK / 2,
        KernelGroup::Groups(f) => f.code_bytes(),
        KernelGroup::F32 | KernelGroup::F16 | KernelGroup::Bf16 => unreachable!("not a packed type"),
    }
}

/// Whole rows of ggml blocks of 32 values (Q8_0, Q4_0, Q4_1; `parts`: a block's codes, f16 d
/// and f16 m) in the chunked layout (rows of `row_bytes`): each block's code words moved
/// straight to their place in the chunk, the scales (and offsets) after the codes as in the
/// grouped layout.
fn chunk_blocks<B>(blocks: &[B], cols: usize, row_bytes: usize, out: &mut [u8], parts: impl Fn(&B) -> (&[u8], [u8; 2], Option<[u8; 2]>)) {
    let groups = cols / QK;
    assert!(blocks.len().is_multiple_of(groups) && out.len() == blocks.len() / groups * row_bytes);
    let Some(first) = blocks.first() else { return };
    let cb = parts(first).0.len();
    for (row, dst) in blocks.chunks_exact(groups).zip(out.chunks_exact_mut(row_bytes)) {
        let (codes, scales) = dst.split_at_mut(groups * cb);
        for (c, (chunk, out)) in row.chunks(CHUNK).zip(codes.chunks_mut(CHUNK * cb)).enumerate() {
            if chunk.len() > NARROW_MAX {
                // Word `j` of group `l` at `4 (j n + l)`: the chunk's words in order.
                let mut at = out.chunks_exact_mut(4);
                for j in 0..cb / 4 {
                    for b in chunk {
                        at.next().expect("a chunk holds n words per code word").copy_from_slice(&parts(b).0[4 * j..4 * j + 4]);
                    }
                }
            } else {
                for (l, b) in chunk.iter().enumerate() {
                    // Every layout keeps runs of 4 code bytes (one i32 lane) together.
                    for (j, word) in parts(b).0.chunks_exact(4).enumerate() {
                        let at = chunked_code_offset(cb, groups, c * CHUNK + l, 4 * j) - c * CHUNK * cb;
                        out[at..at + 4].copy_from_slice(word);
                    }
                }
            }
        }
        write_scales(row, scales, &parts);
    }
}

/// Dequantizes one packed row (grouped layout), with the same values (bit for bit) as
/// ggml's dequantization of the original row.
pub fn dequantize_packed_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    dequantize_packed_row_in(ty, Layout::Grouped, row, out)
}

/// [`dequantize_packed_row`] for a row in either layout.
pub fn dequantize_packed_row_in(ty: GgmlType, layout: Layout, row: &[u8], out: &mut [f32]) {
    assert!(is_packed(ty) && row.len() == layout_row_bytes(ty, layout, out.len()));
    if layout == Layout::Blocks {
        return dequantize_row(ty, row, out);
    }
    let groups = out.len() / QK;
    if layout == Layout::Chunked && has_own_int8_layout(ty) {
        for (g, o) in out.chunks_exact_mut(QK).enumerate() {
            match ty {
                GgmlType::Q3_K => super::kquant_low::group(ty, row, groups, g).values(false, o),
                GgmlType::Q2_K => super::kquant_low::group(ty, row, groups, g).values(true, o),
                GgmlType::Q5_0 | GgmlType::Q5_1 => super::q5::group(ty, row, groups, g).values(ty == GgmlType::Q5_1, o),
                _ => {
                    let format = group_format(ty).expect("K-quant types are group types");
                    super::kquant::group(ty, row, groups, g).values(format.offset, o);
                }
            }
        }
        return;
    }
    if let Some(format) = group_format(ty) {
        assert_eq!(layout, Layout::Grouped, "group types have no chunked layout");
        for (g, o) in out.chunks_exact_mut(QK).enumerate() {
            packed_group(format, row, groups, g).values(format.offset, o);
        }
        return;
    }
    // Q8_0's layout (also Q5_0's grouped one) or Q4_0's and Q4_1's.
    let cb = if matches!(ty.kernel(), KernelGroup::Q8_0) { QK } else { QK / 2 };
    let code = |g: usize, b: usize| match layout {
        Layout::Grouped => row[g * cb + b],
        Layout::Chunked => row[chunked_code_offset(cb, groups, g, b)],
        Layout::Blocks => unreachable!("returned above"),
    };
    let scales = &row[groups * cb..];
    let f16 = |bytes: &[u8], g: usize| half::f16::from_le_bytes([bytes[2 * g], bytes[2 * g + 1]]).to_f32();
    match ty.kernel() {
        KernelGroup::Q8_0 => {
            for (g, o) in out.chunks_exact_mut(QK).enumerate() {
                let dg = f16(scales, g);
                for (j, v) in o.iter_mut().enumerate() {
                    *v = dg * (code(g, j) as i8) as f32;
                }
            }
        }
        KernelGroup::Q4_0 | KernelGroup::Q4_1 => {
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
        _ => unreachable!("checked by is_packed and group_format"),
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
        // Blocks per row: chunks of 16 groups with a last chunk of every kind (one to four
        // groups, narrow; five or more; for the K-quants, one super-block or two).
        for (ty, blocks) in GgmlType::ALL.into_iter().filter(|&t| is_packed(t)).flat_map(|t| [1, 2, 3, 16, 17, 20, 21].map(|b| (t, b))) {
            let (rows, cols) = (3, blocks * ty.block_size());
            let mut ggml: Vec<u8> = (0..rows * ty.row_bytes(cols)).map(|_| byte()).collect();
            // Keep the f16 scales finite so the comparison is of numbers (NaN payloads may
            // depend on the operand order the compiler picks).
            for b in ggml.chunks_exact_mut(ty.block_bytes()) {
                for &at in ty.spec().f16_fields {
                    b[at + 1] &= 0x3F;
                }
            }
            let packed = pack_rows(ty, cols, &ggml);
            let (rb, pb) = (ty.row_bytes(cols), packed_row_bytes(ty, cols));
            assert_eq!(packed.len(), rows * pb);
            let cb = layout_row_bytes(ty, Layout::Chunked, cols);
            let mut chunked = vec![0u8; rows * cb];
            if is_int8_packable(ty) {
                pack_rows_in(ty, Layout::Chunked, cols, &ggml, &mut chunked);
            }
            for r in 0..rows {
                let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
                dequantize_row(ty, &ggml[r * rb..(r + 1) * rb], &mut a);
                dequantize_packed_row(ty, &packed[r * pb..(r + 1) * pb], &mut b);
                if let Some(i) = (0..cols).find(|&i| a[i].to_bits() != b[i].to_bits()) {
                    panic!("{} row {r} value {i}: {} vs {}", ty.name(), a[i], b[i]);
                }
                if is_int8_packable(ty) {
                    dequantize_packed_row_in(ty, Layout::Chunked, &chunked[r * cb..(r + 1) * cb], &mut b);
                    assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                }
            }
        }
    }
}
