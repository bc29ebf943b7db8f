//! Q5_1: 32 values in 24 bytes `{d: f16, m: f16, qh: u32, qs: [u8; 16]}`, w = d * q + m,
//! q as in Q5_0 (0..32, no bias).

use super::q5_0::five_bits;
use crate::tensor::spec::{decode_groups, dequantize_groups, f16_at, Codes, Group, GroupFormat, GroupType, KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

pub struct Q5_1;

impl GroupType for Q5_1 {
    const FORMAT: GroupFormat = GroupFormat { codes: Codes::I8, halves: false, offset: true };
    const BLOCK_SIZE: usize = 32;
    const BLOCK_BYTES: usize = 24;
    fn decode(b: &[u8], groups: &mut [Group]) {
        let (d, m) = (f16_at(&b[0..2]), f16_at(&b[2..4]));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let g = &mut groups[0];
        for j in 0..32 {
            g.codes[j] = five_bits(&b[8..24], qh, j) as i8;
        }
        g.scale = [d; 2];
        g.offset = [m; 2];
    }
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q5_1,
    id: 7,
    name: "Q5_1",
    block_size: Q5_1::BLOCK_SIZE,
    block_bytes: Q5_1::BLOCK_BYTES,
    file_type: None,
    dequantize: dequantize_groups::<Q5_1>,
    f16_fields: &[0, 2],
    kernel: KernelGroup::Groups(Q5_1::FORMAT),
    decode_groups: Some(decode_groups::<Q5_1>),
};
