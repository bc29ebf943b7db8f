//! The b-bit uniform quantizer (docs/theory.md, "Uniform quantization") and its block form
//! stored as Q4_1.
//!
//! The quantizer: for a > 0 and b >= 1 bits, the step is Δ = 2a/(2^b - 1) and the 2^b levels
//! are ℓ_j = -a + jΔ, j = 0..2^b - 1, evenly spaced over [-a, a]; Q(w) is the level nearest to
//! w. Its error: |w - Q(w)| <= Δ/2 on [-a, a]; ‖W - Q(W)‖_F <= (Δ/2)·sqrt(mn);
//! Δ_{b+1}/Δ_b = (2^b - 1)/(2^{b+1} - 1) < 1/2, tending to 1/2; under the uniform-error model
//! Var(e) = Δ²/12, so ‖W - Q(W)‖_F ≈ Δ·sqrt(mn/12).
//!
//! [`Uniform`] is the definition in f64. [`quantize_row_q4_1_uniform`] applies it per block
//! of 32 with b = 4, which Q4_1 (w = d·q + m) represents with m = -a and d = Δ. Q4_1 stores d
//! and m in f16 and the dequantizer forms d·q + m in f32, so the stored levels are not exactly
//! the ℓ_j; how that changes the bound is worked out on [`quantize_row_q4_1_uniform`].

use half::f16;

use crate::error::{Error, Result};
use crate::tensor::{BlockQ4_1, QK};

/// The b-bit uniform quantizer on [-a, a].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Uniform {
    a: f64,
    bits: u32,
}

/// Bits the f64 quantizer supports (levels are indexed exactly up to 2^52).
pub const MAX_BITS: u32 = 52;

impl Uniform {
    pub fn new(a: f64, bits: u32) -> Result<Uniform> {
        if !(a.is_finite() && a > 0.0) {
            return Err(Error::invalid_argument("a", format!("the range must be finite and > 0, got {a}")));
        }
        if !(1..=MAX_BITS).contains(&bits) {
            return Err(Error::invalid_argument("bits", format!("must be in 1..={MAX_BITS}, got {bits}")));
        }
        Ok(Uniform { a, bits })
    }

    pub fn a(&self) -> f64 {
        self.a
    }

    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// 2^b - 1, the number of steps between the end levels.
    fn intervals(&self) -> u64 {
        (1u64 << self.bits) - 1
    }

    /// 2^b.
    pub fn n_levels(&self) -> u64 {
        1u64 << self.bits
    }

    /// Δ = 2a/(2^b - 1).
    pub fn step(&self) -> f64 {
        2.0 * self.a / self.intervals() as f64
    }

    /// ℓ_j = -a + jΔ, computed as a·(2j - (2^b - 1))/(2^b - 1) so that it is the correctly
    /// rounded value when a is a power of two (exactly ±a at the ends, exactly 0 never).
    pub fn level(&self, j: u64) -> f64 {
        let l = self.intervals();
        assert!(j <= l, "level index {j} out of 0..={l}");
        self.a * (2.0 * j as f64 - l as f64) / l as f64
    }

    /// All 2^b levels in increasing order.
    pub fn levels(&self) -> Vec<f64> {
        (0..self.n_levels()).map(|j| self.level(j)).collect()
    }

    /// The index of the level nearest to w (w outside [-a, a] is first clipped to it). When w
    /// is exactly halfway, the definition allows either level; this picks the even index.
    pub fn index(&self, w: f64) -> u64 {
        let l = self.intervals();
        let w = w.clamp(-self.a, self.a);
        let t = (w + self.a) * l as f64 / (2.0 * self.a);
        let j = (t.round_ties_even().max(0.0) as u64).min(l);
        // Settle by the computed distances, so the answer is the nearest computed level.
        let candidates = [j.saturating_sub(1), j, (j + 1).min(l)];
        nearest(w, candidates.into_iter().map(|k| (k, self.level(k))))
    }

    /// Q(w).
    pub fn quantize(&self, w: f64) -> f64 {
        self.level(self.index(w))
    }
}

/// The index of the candidate level nearest to w; ties go to the even index.
fn nearest(w: f64, candidates: impl Iterator<Item = (u64, f64)>) -> u64 {
    let mut best: Option<(u64, f64)> = None;
    for (k, level) in candidates {
        let e = (w - level).abs();
        best = match best {
            Some((bk, be)) if be < e || (be == e && (bk % 2 == 0 || bk == k)) => Some((bk, be)),
            _ => Some((k, e)),
        };
    }
    best.expect("at least one candidate").0
}

/// The P-th percentile (0 < P <= 100) of `values` by linear interpolation between order
/// statistics (numpy's default): position (P/100)·(n - 1) in the sorted values. P = 100
/// gives the maximum exactly.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    assert!(!values.is_empty() && p > 0.0 && p <= 100.0);
    values.sort_by(f64::total_cmp);
    let pos = p / 100.0 * (values.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(values.len() - 1);
    let frac = pos - lo as f64;
    if frac == 0.0 {
        values[lo]
    } else {
        values[lo] + frac * (values[hi] - values[lo])
    }
}

/// The next f16 toward +infinity (x finite).
fn f16_up(x: f16) -> f16 {
    let bits = x.to_bits();
    if bits == 0x8000 {
        f16::from_bits(0x0001)
    } else if bits & 0x8000 != 0 {
        f16::from_bits(bits - 1)
    } else {
        f16::from_bits(bits + 1)
    }
}

/// The next f16 toward -infinity (x finite).
fn f16_down(x: f16) -> f16 {
    let bits = x.to_bits();
    if bits == 0x0000 {
        f16::from_bits(0x8001)
    } else if bits & 0x8000 != 0 {
        f16::from_bits(bits + 1)
    } else {
        f16::from_bits(bits - 1)
    }
}

/// The Q4_1 scale pair that represents the uniform quantizer with b = 4 on [-a, a] (a > 0): m
/// is the largest f16 <= -a and d the smallest f16 with m + 15d >= a. Rounding outward keeps
/// every w in [-a, a] inside the stored level range, at the price of a step d >= Δ = 2a/15
/// that is larger by a relative 2^-10 at most. None if a is beyond the f16 range.
pub fn q4_1_range(a: f64) -> Option<(f16, f16)> {
    let mut m = f16::from_f64(-a);
    if m.to_f64() > -a {
        m = f16_down(m);
    }
    if !m.is_finite() {
        return None;
    }
    // m and d have 11 significant bits, so m + 15d is exact in f64.
    let covers = |d: f16| m.to_f64() + 15.0 * d.to_f64() >= a;
    let mut d = f16::from_f64((a - m.to_f64()) / 15.0);
    while !covers(d) && d.is_finite() {
        d = f16_up(d);
    }
    d.is_finite().then_some((d, m))
}

/// The uniform quantizer with b = 4 on each block of 32, stored as Q4_1 (m = -a, d = Δ).
///
/// The range is a = max|w| of the block, or with `clip = Some(P)` the P-th [`percentile`] of
/// |w| (values beyond ±a are first clipped to ±a, so that outliers do not stretch the step).
/// A block with a = 0 is stored as d = m = 0.
///
/// How f16 storage changes the bound |w - Q(w)| <= Δ/2: d and m are rounded outward
/// ([`q4_1_range`]), so the stored levels m + jd cover [-a, a] with a step d >= Δ, and each
/// value gets the code of the stored level nearest to it, as the dequantizer computes that
/// level: fl32(d·j + m), where d·j is exact (11 x 4 bits) and the sum is rounded once. Hence for every w in [-a, a]
///
///   |w - Q(w)| <= d/2 + δ,   δ = 2^-24 · max(|m|, |m + 15d|),
///
/// the bound with the stored step d in place of Δ, plus at most half an f32 ulp of the
/// largest level (δ/d <= 2^-24·(a + 15d)/d ~ 2^-21). Returns the number of clipped values.
pub fn quantize_row_q4_1_uniform(x: &[f32], clip: Option<f64>, out: &mut [BlockQ4_1]) -> Result<usize> {
    assert_eq!(x.len(), out.len() * QK);
    let mut clipped = 0;
    let mut abs = [0.0f64; QK];
    for (xb, y) in x.chunks_exact(QK).zip(out) {
        for (a, &v) in abs.iter_mut().zip(xb) {
            *a = f64::from(v).abs();
        }
        let a = match clip {
            None => abs.iter().copied().fold(0.0, f64::max),
            Some(p) => percentile(&mut abs, p),
        };
        if a == 0.0 {
            clipped += xb.iter().filter(|&&v| v != 0.0).count();
            *y = BlockQ4_1 { d: [0; 2], m: [0; 2], qs: [0; QK / 2] };
            continue;
        }
        let (d, m) = q4_1_range(a).ok_or_else(|| {
            Error::Unsupported(format!("a block range of {a} is beyond the f16 scales of Q4_1"))
        })?;
        let (df, mf) = (d.to_f32(), m.to_f32());
        // The levels as the dequantizer computes them.
        let levels: [f64; 16] = std::array::from_fn(|j| f64::from(df * j as f32 + mf));
        let inv_d = 1.0 / f64::from(df);
        let mut codes = [0u8; QK];
        for (c, &v) in codes.iter_mut().zip(xb) {
            let w = f64::from(v);
            if w.abs() > a {
                clipped += 1;
            }
            let w = w.clamp(-a, a);
            // w lies between the exact levels m + jd and m + (j+1)d (up to the rounding of j),
            // and the stored levels are within δ << d of those, so the nearest stored level is
            // level j or j + 1: any other is at least d - 2δ away.
            // (Clamped to [0, 14] first, the cast truncates, which is floor.)
            let j = ((w - f64::from(mf)) * inv_d).clamp(0.0, 14.0) as usize;
            let (lo, hi) = ((w - levels[j]).abs(), (levels[j + 1] - w).abs());
            // Halfway: the even index. (Non-short-circuit ops: no branch to mispredict.)
            let up = (hi < lo) | ((hi == lo) & (j % 2 == 1));
            *c = (j + usize::from(up)) as u8;
        }
        let qs = std::array::from_fn(|j| codes[j] | (codes[j + QK / 2] << 4));
        *y = BlockQ4_1 { d: d.to_le_bytes(), m: m.to_le_bytes(), qs };
    }
    Ok(clipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_prefers_even_on_ties() {
        assert_eq!(nearest(0.0, [(3, -1.0), (4, 1.0)].into_iter()), 4);
        assert_eq!(nearest(0.0, [(4, -1.0), (5, 1.0)].into_iter()), 4);
        assert_eq!(nearest(0.9, [(4, -1.0), (5, 1.0)].into_iter()), 5);
        assert_eq!(nearest(0.0, [(2, 1.0), (2, 1.0)].into_iter()), 2);
    }

    #[test]
    fn percentile_matches_numpy_linear() {
        // numpy.percentile([1, 2, 3, 4], 50) == 2.5, (.., 100) == 4, (.., 25) == 1.75
        assert_eq!(percentile(&mut [4.0, 1.0, 3.0, 2.0], 50.0), 2.5);
        assert_eq!(percentile(&mut [4.0, 1.0, 3.0, 2.0], 100.0), 4.0);
        assert_eq!(percentile(&mut [4.0, 1.0, 3.0, 2.0], 25.0), 1.75);
    }

    #[test]
    fn f16_neighbours() {
        assert_eq!(f16_up(f16::from_f32(1.0)).to_f32(), 1.0 + 2f32.powi(-10));
        assert_eq!(f16_down(f16::from_f32(1.0)).to_f32(), 1.0 - 2f32.powi(-11));
        assert_eq!(f16_down(f16::from_f32(-1.0)).to_f32(), -(1.0 + 2f32.powi(-10)));
        assert_eq!(f16_up(f16::from_f32(-1.0)).to_f32(), -(1.0 - 2f32.powi(-11)));
        assert!(f16_up(f16::from_f32(0.0)).to_f32() > 0.0);
        assert!(f16_down(f16::from_f32(0.0)).to_f32() < 0.0);
    }

    #[test]
    fn range_is_outward_and_minimal() {
        for a in [1e-6, 0.013, 0.1, 0.5, 1.0, 3.7, 1000.0] {
            let (d, m) = q4_1_range(a).unwrap();
            let (d, m) = (d.to_f64(), m.to_f64());
            assert!(m <= -a && m + 15.0 * d >= a, "a={a}");
            assert!(d >= 2.0 * a / 15.0);
            let smaller = f16_down(f16::from_f64(d)).to_f64();
            assert!(m + 15.0 * smaller < a, "a={a}: d is not the smallest");
        }
        assert!(q4_1_range(1e6).is_none());
    }
}
