//! Q4_0: 32 values in 18 bytes, w = d * (q - 8), q in 0..16.

use crate::tensor::blocks::{as_blocks, f16_le, Block, QK};
use crate::tensor::spec::{KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

/// Value j < 16 is `qs[j] & 0xF`, value j + 16 is `qs[j] >> 4`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18 && std::mem::align_of::<BlockQ4_0>() == 1);
impl Block for BlockQ4_0 {}

impl BlockQ4_0 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q4_0,
    id: 2,
    name: "Q4_0",
    block_size: QK,
    block_bytes: 18,
    file_type: Some(2),
    dequantize,
    f16_fields: &[0],
    kernel: KernelGroup::Q4_0,
    decode_groups: None,
};

fn dequantize(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.chunks_exact_mut(QK).zip(as_blocks::<BlockQ4_0>(bytes)) {
        let d = b.d();
        for j in 0..QK / 2 {
            o[j] = d * ((b.qs[j] & 0x0F) as i32 - 8) as f32;
            o[j + QK / 2] = d * ((b.qs[j] >> 4) as i32 - 8) as f32;
        }
    }
}
