//! Q4_K: 256 values in 144 bytes `{d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]}`:
//! 8 sub-blocks of 32 with 6-bit scales `sc` and mins `m` ([`scale_min`]);
//! w = (d * sc) * q - dmin * m, q in 0..16. Sub-block `2i` is the low nibbles of
//! `qs[32i..32i + 32]`, sub-block `2i + 1` their high nibbles.
//!
//! `d * sc` and `dmin * m` are exact in f32: an f16 has at most 11 significant bits and a
//! 6-bit integer 6, so each product has at most 17 (and cannot overflow or underflow f32);
//! `(d * sc) * q` then has at most 21. Only the final subtraction rounds, as in ggml.

use crate::tensor::spec::{decode_groups, dequantize_groups, f16_at, Codes, Group, GroupFormat, GroupType, KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

pub struct Q4K;

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from the 12
/// packed bytes (j < 4: low 6 bits of bytes j and j + 4; j >= 4: nibbles of byte j + 4 and
/// the top 2 bits of bytes j - 4 and j).
pub fn scale_min(q: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The scale `d * sc` and offset `-(dmin * m)` of each of the 8 sub-blocks of 32 (both exact).
pub(super) fn sub_block_scales(b: &[u8], groups: &mut [Group]) {
    let (d, dmin) = (f16_at(&b[0..2]), f16_at(&b[2..4]));
    for (j, g) in groups.iter_mut().enumerate().take(8) {
        let (sc, m) = scale_min(&b[4..16], j);
        g.scale = [d * sc as f32; 2];
        g.offset = [-(dmin * m as f32); 2];
    }
}

impl GroupType for Q4K {
    const FORMAT: GroupFormat = GroupFormat { codes: Codes::Nibbles { bias: 0 }, halves: false, offset: true };
    const BLOCK_SIZE: usize = 256;
    const BLOCK_BYTES: usize = 144;
    fn decode(b: &[u8], groups: &mut [Group]) {
        sub_block_scales(b, groups);
        let qs = &b[16..144];
        for (j, g) in groups.iter_mut().enumerate().take(8) {
            for l in 0..32 {
                g.codes[l] = ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F) as i8;
            }
        }
    }
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q4_K,
    id: 12,
    name: "Q4_K",
    block_size: Q4K::BLOCK_SIZE,
    block_bytes: Q4K::BLOCK_BYTES,
    file_type: None,
    dequantize: dequantize_groups::<Q4K>,
    f16_fields: &[0, 2],
    kernel: KernelGroup::Groups(Q4K::FORMAT),
    decode_groups: Some(decode_groups::<Q4K>),
};
