//! Q4_1: 32 values in 20 bytes, w = d * q + m, q in 0..16 (nibble order as Q4_0).

use crate::tensor::blocks::{as_blocks, f16_le, Block, QK};
use crate::tensor::spec::{KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20 && std::mem::align_of::<BlockQ4_1>() == 1);
impl Block for BlockQ4_1 {}

impl BlockQ4_1 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
    #[inline(always)]
    pub fn m(&self) -> f32 {
        f16_le(self.m)
    }
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q4_1,
    id: 3,
    name: "Q4_1",
    block_size: QK,
    block_bytes: 20,
    file_type: Some(3),
    dequantize,
    f16_fields: &[0, 2],
    kernel: KernelGroup::Q4_1,
    decode_groups: None,
};

fn dequantize(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.chunks_exact_mut(QK).zip(as_blocks::<BlockQ4_1>(bytes)) {
        let (d, m) = (b.d(), b.m());
        for j in 0..QK / 2 {
            o[j] = d * (b.qs[j] & 0x0F) as f32 + m;
            o[j + QK / 2] = d * (b.qs[j] >> 4) as f32 + m;
        }
    }
}
