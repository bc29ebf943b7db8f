//! One row of f32 values to the bytes of a ggml type: the inverse of
//! [`crate::tensor::dequantize_row`].

use half::{bf16, f16};

use super::minmax::{quantize_row_q4_0, quantize_row_q4_1, quantize_row_q8_0};
use super::options::Scheme;
use super::uniform::quantize_row_q4_1_uniform;
use crate::tensor::{as_blocks_mut, GgmlType};

/// Why a row could not be encoded (the caller names the tensor).
#[derive(Debug)]
pub enum RowError {
    /// A NaN or infinite source value at this index of the row.
    NonFinite(usize),
    /// A block scale or value beyond the f16 (or bf16) range.
    Overflow,
}

/// Encodes `x` as `ty` into `out` (exactly `ty.row_bytes(x.len())` bytes). `scheme` chooses
/// the Q4_1 rule; Q4_0 and Q8_0 always use ggml's. Returns the number of values clipped by the
/// uniform scheme's range.
pub fn encode_row(ty: GgmlType, scheme: Scheme, x: &[f32], out: &mut [u8]) -> std::result::Result<usize, RowError> {
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(RowError::NonFinite(i));
    }
    let mut clipped = 0;
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                let h = f16::from_f32(v);
                if h.is_infinite() {
                    return Err(RowError::Overflow);
                }
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                let h = bf16::from_f32(v);
                if h.is_infinite() {
                    return Err(RowError::Overflow);
                }
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
        GgmlType::Q4_0 => quantize_row_q4_0(x, as_blocks_mut(out)),
        GgmlType::Q8_0 => quantize_row_q8_0(x, as_blocks_mut(out)),
        GgmlType::Q4_1 => match scheme {
            Scheme::MinMax => quantize_row_q4_1(x, as_blocks_mut(out)),
            Scheme::Uniform { clip } => {
                clipped = quantize_row_q4_1_uniform(x, clip, as_blocks_mut(out)).map_err(|_| RowError::Overflow)?
            }
        },
        // The options admit only the types above (quantize/options.rs).
        _ => unreachable!("{} is not an output type of quantize", ty.name()),
    }
    if ty.is_quantized() && !scales_finite(ty, out) {
        return Err(RowError::Overflow);
    }
    Ok(clipped)
}

/// Whether every block's f16 scale (and Q4_1's offset) is finite.
fn scales_finite(ty: GgmlType, bytes: &[u8]) -> bool {
    let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).is_finite();
    bytes.chunks_exact(ty.block_bytes()).all(|b| f16_at(b, 0) && (ty != GgmlType::Q4_1 || f16_at(b, 2)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::dequantize_row;

    #[test]
    fn float_types_round_trip() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) * 0.37).collect();
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let mut bytes = vec![0u8; ty.row_bytes(x.len())];
            encode_row(ty, Scheme::MinMax, &x, &mut bytes).unwrap();
            let mut y = vec![0.0; x.len()];
            dequantize_row(ty, &bytes, &mut y);
            let mut again = vec![0u8; bytes.len()];
            encode_row(ty, Scheme::MinMax, &y, &mut again).unwrap();
            assert_eq!(bytes, again, "{ty:?}: encode(decode(b)) != b");
        }
    }

    #[test]
    fn rejects_non_finite_and_overflow() {
        let mut x = vec![0.5f32; 32];
        x[7] = f32::NAN;
        let mut out = vec![0u8; 20];
        assert!(matches!(encode_row(GgmlType::Q4_1, Scheme::MinMax, &x, &mut out), Err(RowError::NonFinite(7))));
        let mut x = vec![0.5f32; 32];
        x[0] = -1e6;
        assert!(matches!(encode_row(GgmlType::Q4_1, Scheme::MinMax, &x, &mut out), Err(RowError::Overflow)));
        let mut out = vec![0u8; 64];
        assert!(matches!(encode_row(GgmlType::F16, Scheme::MinMax, &x, &mut out), Err(RowError::Overflow)));
        let mut out = vec![0u8; 34];
        x[0] = 1e7;
        assert!(matches!(encode_row(GgmlType::Q8_0, Scheme::MinMax, &x, &mut out), Err(RowError::Overflow)));
    }
}
