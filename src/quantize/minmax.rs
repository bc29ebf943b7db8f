//! ggml's reference quantizers (`quantize_row_q4_0_ref`, `quantize_row_q4_1_ref`,
//! `quantize_row_q8_0_ref` in ggml-quants.c), reproduced bit for bit: the same f32 operations
//! in the same order, the scale `d` rounded to f16 (round to nearest even) after the inverse
//! scale `1/d` was taken from the unrounded f32 `d`, and C's truncating float-to-int casts.
//! These are the "min-max" rules llama.cpp's `llama-quantize` uses without an importance
//! matrix, and the ones the `gguf` Python package implements.
//!
//! How these rules sit with the uniform quantizer's bound (|e| <= Δ/2 for values inside the
//! level range, docs/theory.md, "Uniform quantization"):
//! - Q4_0 puts the levels d(q - 8) at [-8, 7]·|d| on the side of the largest-magnitude value v
//!   (d = v/-8), so values on the other side beyond 7|d| are clipped, by up to one step.
//! - Codes are chosen with the f32 `d` but decoded with its f16 rounding d16, so a value inside
//!   the levels can miss Δ/2 by up to |q - q0|·|d - d16| <= 8·2^-11·|d| (Q4_0, Q8_0 up to
//!   127·2^-11·|d|, Q4_1 15·2^-11·|d| plus the rounding of m): worst ratios a little above 1,
//!   and end levels that can fall short of the block's extremes.
//!
//! The report in [`super::report`] measures both (values outside the levels, worst ratio).

use half::f16;

use crate::tensor::{BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};

/// C's `1.0f/d` guarded against a zero scale (`d ? 1.0f/d : 0.0f`).
#[inline]
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

#[inline]
fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// Packs 32 4-bit codes: value j < 16 in the low nibble of byte j, value j + 16 in the high.
#[inline]
fn pack_nibbles(codes: &[u8; QK]) -> [u8; QK / 2] {
    std::array::from_fn(|j| codes[j] | (codes[j + QK / 2] << 4))
}

/// Q4_0: d = v/-8 where v is the first value of largest magnitude; q = min(15, trunc(x/d + 8.5)).
pub fn quantize_row_q4_0(x: &[f32], out: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, y) in x.chunks_exact(QK).zip(out) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = inverse(d);
        // x*id lies in [-8, 8] up to rounding, so x*id + 8.5 is positive and the cast truncates.
        let codes: [u8; QK] = std::array::from_fn(|j| ((xb[j] * id + 8.5) as i8).min(15) as u8);
        *y = BlockQ4_0 { d: f16_bytes(d), qs: pack_nibbles(&codes) };
    }
}

/// Q4_1: d = (max - min)/15, m = min; q = min(15, trunc((x - min)/d + 0.5)).
pub fn quantize_row_q4_1(x: &[f32], out: &mut [BlockQ4_1]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, y) in x.chunks_exact(QK).zip(out) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in xb {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = inverse(d);
        let codes: [u8; QK] = std::array::from_fn(|j| (((xb[j] - min) * id + 0.5) as i8).min(15) as u8);
        *y = BlockQ4_1 { d: f16_bytes(d), m: f16_bytes(min), qs: pack_nibbles(&codes) };
    }
}

/// Q8_0: d = max|x|/127; q = roundf(x/d) (halves away from zero).
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), out.len() * QK);
    for (xb, y) in x.chunks_exact(QK).zip(out) {
        let amax = xb.iter().fold(0.0f32, |a, &v| if a > v.abs() { a } else { v.abs() });
        let d = amax / 127.0;
        let id = inverse(d);
        // |x*id| <= 127 up to rounding, so the rounded value fits in i8.
        let qs: [i8; QK] = std::array::from_fn(|j| (xb[j] * id).round() as i8);
        *y = BlockQ8_0 { d: f16_bytes(d), qs };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{as_blocks_mut, dequantize_row, GgmlType};

    fn ramp() -> Vec<f32> {
        (0..QK).map(|i| i as f32 - 10.0).collect()
    }

    #[test]
    fn q4_1_hand_example() {
        // min -10, max 21: d = 31/15, codes round((x + 10)/d).
        let x = ramp();
        let mut b = [BlockQ4_1 { d: [0; 2], m: [0; 2], qs: [0; 16] }];
        quantize_row_q4_1(&x, &mut b);
        assert_eq!(b[0].m(), -10.0);
        assert_eq!(b[0].d(), f16::from_f32(31.0 / 15.0).to_f32());
        let codes: Vec<u8> = (0..QK).map(|j| if j < 16 { b[0].qs[j] & 15 } else { b[0].qs[j - 16] >> 4 }).collect();
        let id = 1.0 / (31.0f32 / 15.0);
        let expected: Vec<u8> = x.iter().map(|&v| ((v + 10.0) * id + 0.5) as u8).collect();
        assert_eq!(codes, expected);
        assert_eq!((codes[0], codes[31]), (0, 15));
    }

    #[test]
    fn q4_0_clips_the_opposite_extreme() {
        // Largest magnitude is +21 (positive): d = -21/8, levels d*(q - 8) span [-18.375, 21].
        let x = ramp();
        let mut bytes = vec![0u8; 18];
        quantize_row_q4_0(&x, as_blocks_mut(&mut bytes));
        let mut y = vec![0.0; QK];
        dequantize_row(GgmlType::Q4_0, &bytes, &mut y);
        assert_eq!(y[31], 21.0);
        assert!(y.iter().all(|&v| v >= -18.375 - 1e-3));
    }

    #[test]
    fn zero_block_is_zero() {
        let x = [0.0f32; QK];
        let mut bytes = vec![0xffu8; 34];
        quantize_row_q8_0(&x, as_blocks_mut(&mut bytes));
        assert!(bytes.iter().all(|&b| b == 0));
        let mut bytes = vec![0xffu8; 18];
        quantize_row_q4_0(&x, as_blocks_mut(&mut bytes));
        let mut y = vec![1.0; QK];
        dequantize_row(GgmlType::Q4_0, &bytes, &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn q8_0_rounds_halves_away_from_zero() {
        // amax 127 gives d = 1 exactly; 2.5 -> 3 and -2.5 -> -3 (roundf), not to even.
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let mut b = [BlockQ8_0 { d: [0; 2], qs: [0; QK] }];
        quantize_row_q8_0(&x, &mut b);
        assert_eq!(b[0].d(), 1.0);
        assert_eq!(&b[0].qs[..3], &[127, 3, -3]);
    }
}
