//! The float types, used by the kernels as stored: F32, F16, BF16.

use half::{bf16, f16};

use crate::tensor::spec::{KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

pub const F32: TypeSpec = TypeSpec {
    ty: GgmlType::F32,
    id: 0,
    name: "F32",
    block_size: 1,
    block_bytes: 4,
    file_type: Some(0),
    dequantize: |bytes, out| {
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    },
    f16_fields: &[],
    kernel: KernelGroup::F32,
    decode_groups: None,
};

pub const F16: TypeSpec = TypeSpec {
    ty: GgmlType::F16,
    id: 1,
    name: "F16",
    block_size: 1,
    block_bytes: 2,
    file_type: Some(1),
    dequantize: |bytes, out| {
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
        }
    },
    f16_fields: &[],
    kernel: KernelGroup::F16,
    decode_groups: None,
};

pub const BF16: TypeSpec = TypeSpec {
    ty: GgmlType::BF16,
    id: 30,
    name: "BF16",
    block_size: 1,
    block_bytes: 2,
    file_type: Some(32),
    dequantize: |bytes, out| {
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
        }
    },
    f16_fields: &[],
    kernel: KernelGroup::Bf16,
    decode_groups: None,
};
