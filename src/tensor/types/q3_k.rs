//! Q3_K: 256 values in 110 bytes `{hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16}`:
//! 16 sub-blocks of 16 with 6-bit scales `sc` stored biased by 32; w = (d * (sc - 32)) * c
//! with c = q - 4 (bit clear) or q (bit set), q the 2 bits at `2 * ((v / 32) % 4)` of
//! `qs[32 * (v / 128) + v % 32]` and the bit `v / 32` of `hmask[v % 32]`. `d * (sc - 32)`
//! has at most 11 + 6 significant bits, times `|c| <= 4` at most 20: all exact in f32.

use crate::tensor::spec::{decode_groups, dequantize_groups, f16_at, Codes, Group, GroupFormat, GroupType, KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

pub struct Q3K;

/// The 6-bit scale of sub-block `j` (0..16), minus 32: low 4 bits from nibble `j / 8` of
/// byte `j % 8`, high 2 bits from bits `2 * (j / 4)` of byte `8 + j % 4`.
fn scale(s: &[u8], j: usize) -> i32 {
    let low = (s[j % 8] >> (4 * (j / 8))) & 0x0F;
    let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

impl GroupType for Q3K {
    // Codes -4..4 stored as nibbles 0..8 with bias -4.
    const FORMAT: GroupFormat = GroupFormat { codes: Codes::Nibbles { bias: -4 }, halves: true, offset: false };
    const BLOCK_SIZE: usize = 256;
    const BLOCK_BYTES: usize = 110;
    fn decode(b: &[u8], groups: &mut [Group]) {
        let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
        let d = f16_at(&b[108..110]);
        for (g, group) in groups.iter_mut().enumerate().take(8) {
            for l in 0..32 {
                let v = 32 * g + l;
                let q = (qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3;
                let set = (hmask[v % 32] >> (v / 32)) & 1 == 1;
                group.codes[l] = q as i8 - if set { 0 } else { 4 };
            }
            group.scale = [d * scale(scales, 2 * g) as f32, d * scale(scales, 2 * g + 1) as f32];
        }
    }
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q3_K,
    id: 11,
    name: "Q3_K",
    block_size: Q3K::BLOCK_SIZE,
    block_bytes: Q3K::BLOCK_BYTES,
    file_type: None,
    dequantize: dequantize_groups::<Q3K>,
    f16_fields: &[108],
    kernel: KernelGroup::Groups(Q3K::FORMAT),
    decode_groups: Some(decode_groups::<Q3K>),
};
