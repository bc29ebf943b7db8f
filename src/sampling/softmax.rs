//! The temperature stage: softmax of z / tau in f64 (definition 4.1), with its own `exp`.
//!
//! `p_i = e_i / Z` with `e_i = exp((z_i - z_max) / tau)` and `Z = sum_j e_j`, where
//!
//! - `exp` is implemented here with `+ - * /` and bit operations only (no platform libm, no
//!   fused multiply-add), so the same inputs give the same bits on every IEEE-754 machine and
//!   the loop vectorizes;
//! - `Z` is a compensated (TwoSum) sum over 8 interleaved lanes, combined in a fixed order:
//!   the operation sequence is fixed by this code, not by the SIMD width or thread count, and
//!   the result is within about one ulp of the exact sum, so the p_i add up to 1 within a few
//!   ulps;
//! - `e_i / Z` is one correctly rounded division.
//!
//! Temperature 0 is not a division: it is the greedy branch, a point mass on the lowest-id
//! argmax (definition 3.2). This is the distribution the sampler then draws from; note that it
//! differs from the tau -> 0+ limit of theorem 4.2.1 when several logits tie for the maximum.

use crate::error::{Error, Result};
use crate::sampling::select::argmax;

/// `exp(x)` for `x <= 0` (including -inf), within one ulp of the true value.
///
/// Cody-Waite reduction x = k ln 2 + r with |r| <= ln(2)/2 (k * LN2_HI is exact because LN2_HI
/// has 32 trailing zero bits), exp(r) = 1 + r + r^2 (1/2! + r/3! + ... + r^11/13!) whose
/// truncation error is below 2^-57, and a scaling by 2^k done as two exact-range multiplications
/// by 2^(k/2) so that subnormal results are rounded once. Inputs below -746 give +0.
fn exp_nonpositive(x: f64) -> f64 {
    const LOG2_E: f64 = std::f64::consts::LOG2_E;
    const LN2_HI: f64 = 6.931_471_803_691_238_164_9e-1; // 0x3FE62E42FEE00000
    const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
    const ROUND: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52: adding it rounds to an integer
    const C: [f64; 12] = [
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5040.0,
        1.0 / 40320.0,
        1.0 / 362_880.0,
        1.0 / 3_628_800.0,
        1.0 / 39_916_800.0,
        1.0 / 479_001_600.0,
        1.0 / 6_227_020_800.0,
    ];
    let x = x.max(-746.0);
    let shifted = x * LOG2_E + ROUND;
    let k_float = shifted - ROUND;
    // The low bits of `shifted` hold k in two's complement.
    let k = shifted.to_bits() as i64 - ROUND.to_bits() as i64;
    let r = (x - k_float * LN2_HI) - k_float * LN2_LO;
    let tail = C.iter().rev().fold(0.0, |acc, &c| acc * r + c);
    let exp_r = 1.0 + (r + r * r * tail);
    let (k_half, k_rest) = (k >> 1, k - (k >> 1));
    let power_of_two = |e: i64| f64::from_bits(((e + 1023) as u64) << 52);
    exp_r * power_of_two(k_half) * power_of_two(k_rest)
}

/// Knuth's TwoSum: `a + b = s + e` exactly, with `s = fl(a + b)`.
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let b_virtual = s - a;
    (s, (a - (s - b_virtual)) + (b - b_virtual))
}

/// Replaces `x_i` by `exp((x_i - max) / temperature)` and returns their compensated sum.
fn exponentiate(x: &mut [f64], max: f64, temperature: f64) -> f64 {
    const LANES: usize = 8;
    let (mut sums, mut errors) = ([0.0; LANES], [0.0; LANES]);
    let mut chunks = x.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for lane in 0..LANES {
            chunk[lane] = exp_nonpositive((chunk[lane] - max) / temperature);
            let (s, e) = two_sum(sums[lane], chunk[lane]);
            sums[lane] = s;
            errors[lane] += e;
        }
    }
    for (lane, value) in chunks.into_remainder().iter_mut().enumerate() {
        *value = exp_nonpositive((*value - max) / temperature);
        let (s, e) = two_sum(sums[lane], *value);
        sums[lane] = s;
        errors[lane] += e;
    }
    let (mut total, mut error) = (0.0, 0.0);
    for lane in 0..LANES {
        let (s, e) = two_sum(total, sums[lane]);
        total = s;
        error += e + errors[lane];
    }
    total + error
}

/// Turns f64 logits (-inf = excluded token) into p_tau in place, for `temperature > 0`.
/// Returns `max_i p_i`. The caller guarantees that some entry is finite and none is NaN.
pub(crate) fn softmax_in_place(x: &mut [f64], temperature: f64) -> f64 {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let normalizer = exponentiate(x, max, temperature);
    x.iter_mut().for_each(|value| *value /= normalizer);
    1.0 / normalizer
}

/// Rejects NaN and +inf logits and the all -inf vector (no token could be chosen).
pub(crate) fn check_logits(z: &[f64], name: &str) -> Result<()> {
    if let Some(id) = z.iter().position(|v| v.is_nan() || *v == f64::INFINITY) {
        return Err(Error::invalid_argument(name, format!("entry {id} is {}", z[id])));
    }
    if z.iter().all(|v| *v == f64::NEG_INFINITY) {
        return Err(Error::invalid_argument(name, "every entry is -inf: no token can be chosen"));
    }
    Ok(())
}

/// Rejects temperatures that are negative, NaN or infinite.
pub(crate) fn check_temperature(temperature: f64) -> Result<()> {
    if temperature.is_finite() && temperature >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid_argument("temperature", format!("must be finite and >= 0, got {temperature}")))
    }
}

/// The distribution of temperature `temperature` for logits `z` (definition 4.1), in f64.
///
/// Entries of `z` may be -inf (probability 0) but not NaN or +inf. Temperature 0 gives the
/// greedy point mass on the lowest-id argmax. This is the exact code the sampler runs.
pub fn softmax(z: &[f64], temperature: f64) -> Result<Vec<f64>> {
    check_temperature(temperature)?;
    check_logits(z, "z")?;
    let mut p = z.to_vec();
    if temperature == 0.0 {
        let best = argmax(z).expect("checked: some entry is finite") as usize;
        p.iter_mut().enumerate().for_each(|(i, v)| *v = (i == best) as u8 as f64);
    } else {
        softmax_in_place(&mut p, temperature);
    }
    Ok(p)
}

/// Natural-log probabilities `log softmax(z)_i = (z_i - z_max) - ln Z` at temperature 1, with
/// the same `exp` and normalizer as [`softmax`]. Used to score beam-search candidates.
pub fn log_softmax(z: &[f32]) -> Result<Vec<f64>> {
    let mut x: Vec<f64> = z.iter().map(|&v| v as f64).collect();
    check_logits(&x, "logits")?;
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let shifted: Vec<f64> = x.iter().map(|&v| v - max).collect();
    let log_normalizer = exponentiate(&mut x, max, 1.0).ln();
    Ok(shifted.into_iter().map(|v| v - log_normalizer).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps_apart(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    #[test]
    fn exp_is_within_one_ulp_of_libm() {
        let mut state = 7u64;
        for i in 0..200_000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let scale = [1.0, 10.0, 100.0, 746.0][i % 4];
            let x = -((state >> 11) as f64 / 2f64.powi(53)) * scale;
            assert!(ulps_apart(exp_nonpositive(x), x.exp()) <= 1, "x = {x}");
        }
        for x in [0.0, -0.0, -1e-300, -0.5 * std::f64::consts::LN_2, -708.0, -744.0, -745.1] {
            assert!(ulps_apart(exp_nonpositive(x), x.exp()) <= 1, "x = {x}");
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-746.0), 0.0);
        assert_eq!(exp_nonpositive(f64::NEG_INFINITY), 0.0);
    }

    #[test]
    fn compensated_normalizer_is_nearly_exact() {
        // 1 + 2^-60 * 1000 is lost by a naive sum of the small terms after the large one.
        let mut x = vec![0.0; 1001];
        x[1..].iter_mut().for_each(|v| *v = -60.0 * std::f64::consts::LN_2);
        let total = exponentiate(&mut x, 0.0, 1.0);
        let expected = 1.0 + 1000.0 * 2f64.powi(-60);
        assert!(ulps_apart(total, expected) <= 1, "{total} vs {expected}");
    }

    #[test]
    fn masked_entries_get_probability_zero() {
        let p = softmax(&[0.0, f64::NEG_INFINITY, 0.0], 1.0).unwrap();
        assert_eq!(p, vec![0.5, 0.0, 0.5]);
    }

    #[test]
    fn log_softmax_matches_the_log_of_softmax() {
        let z = [2.0f32, 1.0, 0.0, -3.5];
        let p = softmax(&z.map(|v| v as f64), 1.0).unwrap();
        for (lp, p) in log_softmax(&z).unwrap().iter().zip(p) {
            assert!((lp - p.ln()).abs() < 1e-14);
        }
    }
}
