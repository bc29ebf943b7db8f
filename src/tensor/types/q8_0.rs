//! Q8_0: 32 values in 34 bytes, w = d * q, q in -128..128.

use crate::tensor::blocks::{as_blocks, f16_le, Block, QK};
use crate::tensor::spec::{KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34 && std::mem::align_of::<BlockQ8_0>() == 1);
impl Block for BlockQ8_0 {}

impl BlockQ8_0 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q8_0,
    id: 8,
    name: "Q8_0",
    block_size: QK,
    block_bytes: 34,
    file_type: Some(7),
    dequantize,
    f16_fields: &[0],
    kernel: KernelGroup::Q8_0,
    decode_groups: None,
};

fn dequantize(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.chunks_exact_mut(QK).zip(as_blocks::<BlockQ8_0>(bytes)) {
        let d = b.d();
        for (v, &q) in o.iter_mut().zip(&b.qs) {
            *v = d * q as f32;
        }
    }
}
