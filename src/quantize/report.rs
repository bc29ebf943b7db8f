//! Quantization error against the uniform quantizer's bounds (docs/theory.md, "Uniform
//! quantization"), per tensor.
//!
//! Each block i of 32 values has its own step Δ_i (the stored |d|), so the bounds
//! apply block by block: |e| <= Δ_i/2 for values inside the block's level range, and
//! ‖E‖_F² <= Σ_i 32·Δ_i²/4. With the tensor's step defined as the root mean square of the block
//! steps, step = sqrt(Σ_i 32·Δ_i² / mn), these sums are exactly the one-step expressions:
//! the Frobenius bound (step/2)·sqrt(mn) and the uniform-model estimate step·sqrt(mn/12).

use crate::tensor::{as_blocks, BlockQ4_0, BlockQ4_1, BlockQ8_0, GgmlType, QK};

/// Step and level range of one stored block: (Δ, lowest level, highest level).
fn block_geometry(ty: GgmlType, block: &[u8]) -> (f64, f64, f64) {
    match ty {
        GgmlType::Q4_0 => {
            let d = f64::from(as_blocks::<BlockQ4_0>(block)[0].d());
            // w = d(q - 8), q in 0..16.
            (d.abs(), (-8.0 * d).min(7.0 * d), (-8.0 * d).max(7.0 * d))
        }
        GgmlType::Q4_1 => {
            let b = &as_blocks::<BlockQ4_1>(block)[0];
            let (d, m) = (b.d(), b.m());
            // The end levels as the dequantizer computes them (d·q + m in f32).
            let (lo, hi) = (m, d * 15.0 + m);
            (f64::from(d).abs(), f64::from(lo.min(hi)), f64::from(lo.max(hi)))
        }
        GgmlType::Q8_0 => {
            let d = f64::from(as_blocks::<BlockQ8_0>(block)[0].d());
            // w = d·q, q in -128..128.
            (d.abs(), (-128.0 * d).min(127.0 * d), (-128.0 * d).max(127.0 * d))
        }
        _ => unreachable!("{} is not an output type of quantize", ty.name()),
    }
}

/// Error statistics of some rows of one tensor; rows are merged in index order.
#[derive(Debug, Clone, Default)]
pub struct ErrorStats {
    pub n_values: u64,
    pub n_blocks: u64,
    /// Σ_i 32·Δ_i².
    sum_step_sq: f64,
    pub max_step: f64,
    /// Σ e².
    sum_err_sq: f64,
    pub max_abs_error: f64,
    /// max over blocks with Δ_i > 0 of max|e| / (Δ_i/2), over values inside the level range.
    pub worst_bound_ratio: f64,
    /// Values inside their block's level range with |e| > Δ_i/2.
    pub n_over_bound: u64,
    /// Values outside their block's level range (clipped).
    pub n_outside: u64,
}

impl ErrorStats {
    /// Adds one row: `source` values, the `stored` bytes of type `ty` and their dequantized
    /// values `decoded` (as [`crate::tensor::dequantize_row`] gives them).
    pub fn add_row(&mut self, ty: GgmlType, source: &[f32], stored: &[u8], decoded: &[f32]) {
        let block_bytes = ty.block_bytes();
        for ((x, y), b) in source.chunks_exact(QK).zip(decoded.chunks_exact(QK)).zip(stored.chunks_exact(block_bytes)) {
            let (step, lo, hi) = block_geometry(ty, b);
            self.n_blocks += 1;
            self.sum_step_sq += QK as f64 * step * step;
            self.max_step = self.max_step.max(step);
            let mut block_max_inside = 0.0f64;
            for (&w, &q) in x.iter().zip(y) {
                let (w, q) = (f64::from(w), f64::from(q));
                let e = (w - q).abs();
                self.n_values += 1;
                self.sum_err_sq += e * e;
                self.max_abs_error = self.max_abs_error.max(e);
                if w < lo || w > hi {
                    self.n_outside += 1;
                    continue;
                }
                block_max_inside = block_max_inside.max(e);
                if e > step / 2.0 {
                    self.n_over_bound += 1;
                }
            }
            if step > 0.0 {
                self.worst_bound_ratio = self.worst_bound_ratio.max(block_max_inside / (step / 2.0));
            }
        }
    }

    /// Merges the statistics of the rows that follow.
    pub fn merge(&mut self, other: &ErrorStats) {
        self.n_values += other.n_values;
        self.n_blocks += other.n_blocks;
        self.sum_step_sq += other.sum_step_sq;
        self.max_step = self.max_step.max(other.max_step);
        self.sum_err_sq += other.sum_err_sq;
        self.max_abs_error = self.max_abs_error.max(other.max_abs_error);
        self.worst_bound_ratio = self.worst_bound_ratio.max(other.worst_bound_ratio);
        self.n_over_bound += other.n_over_bound;
        self.n_outside += other.n_outside;
    }

    /// The root mean square of the block steps, sqrt(Σ_i 32·Δ_i² / mn).
    pub fn step(&self) -> f64 {
        if self.n_values == 0 {
            0.0
        } else {
            (self.sum_step_sq / self.n_values as f64).sqrt()
        }
    }

    /// ‖W - Q(W)‖_F.
    pub fn frobenius_error(&self) -> f64 {
        self.sum_err_sq.sqrt()
    }

    /// (step/2)·sqrt(mn): the Frobenius bound, summed over the blocks.
    pub fn frobenius_bound(&self) -> f64 {
        self.step() / 2.0 * (self.n_values as f64).sqrt()
    }

    /// step·sqrt(mn/12): the Frobenius error when errors are uniform on [-Δ/2, Δ/2].
    pub fn frobenius_estimate(&self) -> f64 {
        self.step() * (self.n_values as f64 / 12.0).sqrt()
    }
}

/// One quantized tensor's line in the report.
#[derive(Debug, Clone)]
pub struct TensorReport {
    pub name: String,
    pub ggml_type: GgmlType,
    /// Dimensions with the contiguous (row) axis first.
    pub dims: Vec<u64>,
    pub stats: ErrorStats,
    /// Values clipped to ±a by `--clip` (uniform scheme), before quantization.
    pub n_clipped: u64,
}

/// Mean KL divergence of next-token distributions, source model ‖ quantized model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KlReport {
    pub mean: f64,
    pub max: f64,
    /// Positions (tokens of the text) averaged over.
    pub n_positions: usize,
}

/// What [`super::quantize_file`] reports.
#[derive(Debug, Clone)]
pub struct QuantizeReport {
    /// Every tensor written in a block-quantized type, in file order.
    pub tensors: Vec<TensorReport>,
    /// Present when a text was given.
    pub kl: Option<KlReport>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantize::minmax::quantize_row_q4_0;
    use crate::tensor::{as_blocks_mut, dequantize_row};

    #[test]
    fn q4_0_opposite_extreme_is_outside_the_levels() {
        // The extreme -1 gives d = 1/8 and levels (q - 8)/8 in [-1, 0.875]: 0.99 is clipped to
        // 0.875, an error of 0.115 > Δ/2, counted as outside rather than against the bound.
        let mut x = vec![0.0f32; QK];
        x[0] = -1.0;
        x[1] = 0.99;
        x[2] = 0.3;
        let mut bytes = vec![0u8; 18];
        quantize_row_q4_0(&x, as_blocks_mut(&mut bytes));
        let mut y = vec![0.0; QK];
        dequantize_row(GgmlType::Q4_0, &bytes, &mut y);
        let mut s = ErrorStats::default();
        s.add_row(GgmlType::Q4_0, &x, &bytes, &y);
        assert_eq!((s.n_values, s.n_blocks, s.n_outside, s.n_over_bound), (32, 1, 1, 0));
        assert_eq!(s.step(), 0.125);
        assert_eq!(s.max_abs_error, (0.99f32 - 0.875) as f64);
        // 0.3 -> 0.25: the worst value inside is 0.05 from its level, 0.8 of Δ/2.
        assert!((s.worst_bound_ratio - (0.3f32 as f64 - 0.25) / 0.0625).abs() < 1e-12);
        assert_eq!(s.frobenius_bound(), 0.0625 * 32f64.sqrt());
    }
}
