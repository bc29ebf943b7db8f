//! Q5_K: 256 values in 176 bytes `{d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32],
//! qs: [u8; 128]}`: Q4_K's sub-blocks, scales and nibbles, plus bit `j` of `qh[l]` as bit 4
//! of value `l` of sub-block `j`; w = (d * sc) * q - dmin * m, q in 0..32 (exact products as
//! in Q4_K: at most 11 + 6 + 5 significant bits).

use super::q4_k::sub_block_scales;
use crate::tensor::spec::{decode_groups, dequantize_groups, Codes, Group, GroupFormat, GroupType, KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

pub struct Q5K;

impl GroupType for Q5K {
    const FORMAT: GroupFormat = GroupFormat { codes: Codes::I8, halves: false, offset: true };
    const BLOCK_SIZE: usize = 256;
    const BLOCK_BYTES: usize = 176;
    fn decode(b: &[u8], groups: &mut [Group]) {
        sub_block_scales(b, groups);
        let (qh, qs) = (&b[16..48], &b[48..176]);
        for (j, g) in groups.iter_mut().enumerate().take(8) {
            for l in 0..32 {
                let low = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
                g.codes[l] = (low | (((qh[l] >> j) & 1) << 4)) as i8;
            }
        }
    }
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q5_K,
    id: 13,
    name: "Q5_K",
    block_size: Q5K::BLOCK_SIZE,
    block_bytes: Q5K::BLOCK_BYTES,
    file_type: None,
    dequantize: dequantize_groups::<Q5K>,
    f16_fields: &[0, 2],
    kernel: KernelGroup::Groups(Q5K::FORMAT),
    decode_groups: Some(decode_groups::<Q5K>),
};
