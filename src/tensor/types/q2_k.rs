//! Q2_K: 256 values in 84 bytes `{scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16}`:
//! 16 sub-blocks of 16, each with a 4-bit scale (low nibble) and 4-bit min (high nibble);
//! w = (d * sc) * q - dmin * m, q the 2 bits at `2 * ((v / 32) % 4)` of
//! `qs[32 * (v / 128) + v % 32]`. Products have at most 11 + 4 + 2 significant bits: exact.

use crate::tensor::spec::{decode_groups, dequantize_groups, f16_at, Codes, Group, GroupFormat, GroupType, KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

pub struct Q2K;

impl GroupType for Q2K {
    const FORMAT: GroupFormat = GroupFormat { codes: Codes::Nibbles { bias: 0 }, halves: true, offset: true };
    const BLOCK_SIZE: usize = 256;
    const BLOCK_BYTES: usize = 84;
    fn decode(b: &[u8], groups: &mut [Group]) {
        let (scales, qs) = (&b[0..16], &b[16..80]);
        let (d, dmin) = (f16_at(&b[80..82]), f16_at(&b[82..84]));
        for (g, group) in groups.iter_mut().enumerate().take(8) {
            for l in 0..32 {
                let v = 32 * g + l;
                group.codes[l] = ((qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3) as i8;
            }
            for h in 0..2 {
                let s = scales[2 * g + h];
                group.scale[h] = d * (s & 0x0F) as f32;
                group.offset[h] = -(dmin * (s >> 4) as f32);
            }
        }
    }
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q2_K,
    id: 10,
    name: "Q2_K",
    block_size: Q2K::BLOCK_SIZE,
    block_bytes: Q2K::BLOCK_BYTES,
    file_type: None,
    dequantize: dequantize_groups::<Q2K>,
    f16_fields: &[80, 82],
    kernel: KernelGroup::Groups(Q2K::FORMAT),
    decode_groups: Some(decode_groups::<Q2K>),
};
