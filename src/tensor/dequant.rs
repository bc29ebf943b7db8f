//! Dequantization to f32, bit-exact with ggml's reference (and the `gguf` Python package):
//! products and sums are separately rounded f32 operations, never fused.

use half::{bf16, f16};

use super::blocks::{as_blocks, BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};
use super::GgmlType;

/// Dequantizes one row: `bytes` holds `out.len()` values of type `ty`.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), ty.row_bytes(out.len()), "row byte length does not match {} values", out.len());
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes(b.try_into().unwrap());
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(as_blocks::<BlockQ4_0>(bytes)) {
                let d = b.d();
                for j in 0..QK / 2 {
                    o[j] = d * ((b.qs[j] & 0x0F) as i32 - 8) as f32;
                    o[j + QK / 2] = d * ((b.qs[j] >> 4) as i32 - 8) as f32;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(as_blocks::<BlockQ4_1>(bytes)) {
                let (d, m) = (b.d(), b.m());
                for j in 0..QK / 2 {
                    o[j] = d * (b.qs[j] & 0x0F) as f32 + m;
                    o[j + QK / 2] = d * (b.qs[j] >> 4) as f32 + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(QK).zip(as_blocks::<BlockQ8_0>(bytes)) {
                let d = b.d();
                for (v, &q) in o.iter_mut().zip(&b.qs) {
                    *v = d * q as f32;
                }
            }
        }
    }
}
