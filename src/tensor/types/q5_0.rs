//! Q5_0: 32 values in 22 bytes `{d: f16, qh: u32, qs: [u8; 16]}`, w = d * (q - 16) with the
//! 5-bit q = nibble (value j < 16: low nibble of `qs[j]`, j + 16: high nibble) plus bit j of
//! `qh` as bit 4.
//!
//! The kernels hold Q5_0 as Q8_0 (`q - 16` as a signed byte, the same f16 `d`: 34 bytes per
//! 32 values), so both the float32 and the int8 kernels of Q8_0 run it, with exactly these
//! weights.

use crate::tensor::spec::{decode_groups, dequantize_groups, f16_at, Codes, Group, GroupFormat, GroupType, KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

pub struct Q5_0;

impl GroupType for Q5_0 {
    const FORMAT: GroupFormat = GroupFormat { codes: Codes::I8, halves: false, offset: false };
    const BLOCK_SIZE: usize = 32;
    const BLOCK_BYTES: usize = 22;
    fn decode(b: &[u8], groups: &mut [Group]) {
        let d = f16_at(&b[0..2]);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let g = &mut groups[0];
        for j in 0..32 {
            g.codes[j] = five_bits(&b[6..22], qh, j) as i8 - 16;
        }
        g.scale = [d; 2];
    }
}

/// Value j of a 32-value Q5 block: its nibble from `qs` and bit j of `qh` as bit 4.
#[inline(always)]
pub(super) fn five_bits(qs: &[u8], qh: u32, j: usize) -> u8 {
    ((qs[j % 16] >> (4 * (j / 16))) & 0x0F) | ((((qh >> j) & 1) as u8) << 4)
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q5_0,
    id: 6,
    name: "Q5_0",
    block_size: Q5_0::BLOCK_SIZE,
    block_bytes: Q5_0::BLOCK_BYTES,
    file_type: None,
    dequantize: dequantize_groups::<Q5_0>,
    f16_fields: &[0],
    kernel: KernelGroup::Q8_0,
    decode_groups: Some(decode_groups::<Q5_0>),
};
