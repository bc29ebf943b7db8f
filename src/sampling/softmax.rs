//! The temperature stage: softmax of z / tau in f64 (definition 4.1), with its own `exp`.
//!
//! `p_i = e_i / Z` with `e_i = exp((z_i - z_max) / tau)` and `Z = sum_j e_j`, where
//!
//! - the exponent is computed as `(z_i - z_max) * fl(1 / tau)` and the normalization as
//!   `e_i * fl(1 / Z)`: multiplications, which cost a fraction of a division per token, at the
//!   price of one extra rounding each (the rounding of the exponent already moves e_i by
//!   |x_i| ulps, so this changes nothing that matters);
//! - `exp` is implemented here with `+ - *`, bit operations and a 32-entry table (no platform
//!   libm, no fused multiply-add), so the same inputs give the same bits on every IEEE-754
//!   machine and the loop vectorizes;
//! - `Z` is a blocked sum with TwoSum across blocks, in an operation order fixed by this code
//!   (not by the SIMD width or thread count), within a few ulps of the exact sum, so the p_i
//!   add up to 1 within a few ulps.
//!
//! Temperature 0 is not a division: it is the greedy branch, a point mass on the lowest-id
//! argmax (definition 3.2). This is the distribution the sampler then draws from; note that it
//! differs from the tau -> 0+ limit of theorem 4.2.1 when several logits tie for the maximum.

use crate::error::{Error, Result};
use crate::sampling::select::argmax;

/// `exp(x)` for `x <= 0` (including -inf), accurate to about one ulp (a test checks it against
/// the platform's libm on 10^6 arguments: never more than one ulp apart).
///
/// Tang's table-driven method: x = (32 q + j) ln(2) / 32 + r with integers q, j (0 <= j < 32)
/// and |r| <= ln(2) / 64 (Cody-Waite: k * LN2_HI / 32 is exact because LN2_HI has 32 trailing
/// zero bits); exp(r) - 1 = r + r^2 (1/2! + r/3! + ... + r^4/6!), whose truncation error is
/// below 2^-58; 2^(j/32) = hi + lo from [`EXP2_TABLE`]; the result is
/// 2^q * (hi + (hi * (exp(r) - 1) + lo)), scaled by two multiplications by powers of two (each
/// a normal number) so that subnormal results are rounded once. Inputs below -746 give +0.
/// Branch-free, so loops over it vectorize.
#[inline(always)]
fn exp_nonpositive(x: f64) -> f64 {
    const SCALE: f64 = 32.0 * std::f64::consts::LOG2_E;
    const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000) / 32.0; // ln 2 to 21 bits, / 32
    const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76) / 32.0; // the rest of ln 2, / 32
    let x = if x < -746.0 { -746.0 } else { x };
    let k = round_to_integer(x * SCALE);
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // q = floor(k / 32): (k - 15.5) / 32 is never a tie and lies within 1/2 of it.
    let q = round_to_integer((k - 15.5) * (1.0 / 32.0));
    let j = ((k - 32.0 * q) + ROUND).to_bits() as usize & 31;
    let polynomial = 1.0 / 2.0 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))));
    let exp_r_minus_1 = r + r * r * polynomial;
    let (hi, lo) = (f64::from_bits(EXP2_TABLE[j].0), f64::from_bits(EXP2_TABLE[j].1));
    let scaled = hi + (hi * exp_r_minus_1 + lo);
    let q_half = round_to_integer(q * 0.5);
    scaled * power_of_two(q_half) * power_of_two(q - q_half)
}

/// Bit patterns of (hi, lo) with hi the double nearest 2^(j/32) and lo the double nearest
/// 2^(j/32) - hi, for j = 0..32; generated with 50-digit arithmetic (mpmath).
const EXP2_TABLE: [(u64, u64); 32] = [
    (0x3FF0000000000000, 0x0000000000000000),
    (0x3FF059B0D3158574, 0x3C8D73E2A475B465),
    (0x3FF0B5586CF9890F, 0x3C98A62E4ADC610B),
    (0x3FF11301D0125B51, 0xBC96C51039449B3A),
    (0x3FF172B83C7D517B, 0xBC819041B9D78A76),
    (0x3FF1D4873168B9AA, 0x3C9E016E00A2643C),
    (0x3FF2387A6E756238, 0x3C99B07EB6C70573),
    (0x3FF29E9DF51FDEE1, 0x3C8612E8AFAD1255),
    (0x3FF306FE0A31B715, 0x3C86F46AD23182E4),
    (0x3FF371A7373AA9CB, 0xBC963AEABF42EAE2),
    (0x3FF3DEA64C123422, 0x3C8ADA0911F09EBC),
    (0x3FF44E086061892D, 0x3C489B7A04EF80D0),
    (0x3FF4BFDAD5362A27, 0x3C7D4397AFEC42E2),
    (0x3FF5342B569D4F82, 0xBC807ABE1DB13CAD),
    (0x3FF5AB07DD485429, 0x3C96324C054647AD),
    (0x3FF6247EB03A5585, 0xBC9383C17E40B497),
    (0x3FF6A09E667F3BCD, 0xBC9BDD3413B26456),
    (0x3FF71F75E8EC5F74, 0xBC816E4786887A99),
    (0x3FF7A11473EB0187, 0xBC841577EE04992F),
    (0x3FF82589994CCE13, 0xBC9D4C1DD41532D8),
    (0x3FF8ACE5422AA0DB, 0x3C96E9F156864B27),
    (0x3FF93737B0CDC5E5, 0xBC675FC781B57EBC),
    (0x3FF9C49182A3F090, 0x3C7C7C46B071F2BE),
    (0x3FFA5503B23E255D, 0xBC9D2F6EDB8D41E1),
    (0x3FFAE89F995AD3AD, 0x3C97A1CD345DCC81),
    (0x3FFB7F76F2FB5E47, 0xBC75584F7E54AC3B),
    (0x3FFC199BDD85529C, 0x3C811065895048DD),
    (0x3FFCB720DCEF9069, 0x3C7503CBD1E949DB),
    (0x3FFD5818DCFBA487, 0x3C82ED02D75B3707),
    (0x3FFDFC97337B9B5F, 0xBC91A5CD4F184B5C),
    (0x3FFEA4AFA2A490DA, 0xBC9E9C23179C2893),
    (0x3FFF50765B6E4540, 0x3C99D3E12DD8A18B),
];

/// 1.5 * 2^52: adding it to |x| < 2^51 rounds x to an integer (ties to even), held in the low
/// mantissa bits in two's complement.
const ROUND: f64 = 6_755_399_441_055_744.0;

/// x rounded to the nearest integer (ties to even), for |x| < 2^51.
#[inline(always)]
fn round_to_integer(x: f64) -> f64 {
    (x + ROUND) - ROUND
}

/// 2^k for an integer-valued k in [-1022, 1023], built from its exponent bits.
#[inline(always)]
fn power_of_two(k: f64) -> f64 {
    f64::from_bits((k + ROUND).to_bits().wrapping_add(1023) << 52)
}

/// Knuth's TwoSum: `a + b = s + e` exactly, with `s = fl(a + b)`.
#[inline(always)]
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let b_virtual = s - a;
    (s, (a - (s - b_virtual)) + (b - b_virtual))
}

/// Sum of non-negative `values`: blocks of 32 are summed in plain arithmetic by 8 interleaved
/// lanes (so the loop vectorizes) and a pairwise tree, and the block sums are accumulated
/// with TwoSum. A fixed operation sequence; each block sum is within 6 ulps and the total
/// within about 7 ulps of the exact sum, whatever the number of values.
#[inline(always)]
fn blocked_sum(values: &[f64]) -> f64 {
    let (mut total, mut error) = (0.0, 0.0);
    for block in values.chunks(32) {
        let mut lanes = [0.0; 8];
        for chunk in block.chunks(8) {
            for (lane, &value) in lanes.iter_mut().zip(chunk) {
                *lane += value;
            }
        }
        let [a, b, c, d, e, f, g, h] = lanes;
        let (sum, rounding) = two_sum(total, ((a + b) + (c + d)) + ((e + f) + (g + h)));
        total = sum;
        error += rounding;
    }
    total + error
}

/// The largest value (no NaN), by 8 independent lanes so that the loop vectorizes.
#[inline(always)]
fn max_of(values: &[f64]) -> f64 {
    let mut lanes = [f64::NEG_INFINITY; 8];
    let chunks = values.chunks_exact(8);
    for &value in chunks.remainder() {
        lanes[0] = if value > lanes[0] { value } else { lanes[0] };
    }
    for chunk in chunks {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            *lane = if value > *lane { value } else { *lane };
        }
    }
    lanes.into_iter().fold(f64::NEG_INFINITY, f64::max)
}

/// How [`softmax_into`] normalized: p_i = exp((z_i - max_logit) / temperature) / normalizer,
/// computed as exp((z_i - max_logit) * fl(1 / temperature)) * fl(1 / normalizer).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Normalization {
    /// The largest logit.
    pub max_logit: f64,
    /// Z, the sum of the exponentials; the largest p_i is fl(1 / Z).
    pub normalizer: f64,
}

/// The softmax computation; every operation is element-wise IEEE arithmetic or the fixed-order
/// sum, so its result does not depend on the SIMD instructions it is compiled to.
#[inline(always)]
fn softmax_kernel(z: &[f64], temperature: f64, p: &mut [f64]) -> Normalization {
    let max_logit = max_of(z);
    // Capped so that a subnormal temperature gives 0 * MAX = 0 at the maximum, not 0 * inf.
    let inverse_temperature = (1.0 / temperature).min(f64::MAX);
    for (out, &logit) in p.iter_mut().zip(z) {
        *out = exp_nonpositive((logit - max_logit) * inverse_temperature);
    }
    let normalizer = blocked_sum(p);
    let inverse_normalizer = 1.0 / normalizer;
    p.iter_mut().for_each(|value| *value *= inverse_normalizer);
    Normalization { max_logit, normalizer }
}

/// [`softmax_kernel`] compiled for AVX2 (four f64 lanes instead of SSE2's two).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax_kernel_avx2(z: &[f64], temperature: f64, p: &mut [f64]) -> Normalization {
    softmax_kernel(z, temperature, p)
}

/// Writes p_tau of the f64 logits `z` (-inf = excluded token) into `p`, for `temperature > 0`.
/// The caller guarantees that some logit is finite and none is NaN or +inf. Uses AVX2 when
/// the CPU has it; the bits are the same either way.
pub(crate) fn softmax_into(z: &[f64], temperature: f64, p: &mut [f64]) -> Normalization {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 support was just checked.
        return unsafe { softmax_kernel_avx2(z, temperature, p) };
    }
    softmax_kernel(z, temperature, p)
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
    let mut p = vec![0.0; z.len()];
    if temperature == 0.0 {
        p[argmax(z).expect("checked: some entry is finite") as usize] = 1.0;
    } else {
        softmax_into(z, temperature, &mut p);
    }
    Ok(p)
}

/// Natural-log probabilities `log softmax(z)_i = (z_i - z_max) - ln Z` at temperature 1, with
/// the same `exp` and normalizer as [`softmax`]. Used to score beam-search candidates.
pub fn log_softmax(z: &[f32]) -> Result<Vec<f64>> {
    let z: Vec<f64> = z.iter().map(|&v| v as f64).collect();
    check_logits(&z, "logits")?;
    let mut p = vec![0.0; z.len()];
    let Normalization { max_logit, normalizer } = softmax_into(&z, 1.0, &mut p);
    let log_normalizer = normalizer.ln();
    Ok(z.iter().map(|&v| (v - max_logit) - log_normalizer).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps_apart(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    #[test]
    fn exp_is_within_one_ulp_of_libm() {
        for i in 0..1_000_000 {
            let scale = [1.0, 10.0, 100.0, 746.0][i % 4];
            let x = -crate::sampling::rng::uniform(7, i as u64) * scale;
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
    fn the_normalizer_keeps_small_terms() {
        // A running sum loses every 2^-60 after the 1 (390 ulps in all); the blocked sum does not.
        let mut values = vec![2f64.powi(-60); 100_001];
        values[0] = 1.0;
        let expected = 1.0 + 100_000.0 * 2f64.powi(-60);
        assert_eq!(values.iter().sum::<f64>(), 1.0);
        assert!(ulps_apart(blocked_sum(&values), expected) <= 1);
    }

    #[test]
    fn simd_and_portable_kernels_give_the_same_bits() {
        let z: Vec<f64> = (0..1003).map(|i| ((i * 7919 % 1000) as f64 - 900.0) / 13.0).collect();
        let (mut portable, mut dispatched) = (vec![0.0; z.len()], vec![0.0; z.len()]);
        let a = softmax_kernel(&z, 0.7, &mut portable);
        let b = softmax_into(&z, 0.7, &mut dispatched);
        assert_eq!(portable, dispatched);
        assert_eq!((a.max_logit, a.normalizer), (b.max_logit, b.normalizer));
    }

    #[test]
    fn extreme_temperatures_reach_the_limits_of_theorem_4_2() {
        let z = [1.0, 3.0, -2.0, 3.0];
        assert_eq!(softmax(&z, 1e-310).unwrap(), vec![0.0, 0.5, 0.0, 0.5]);
        assert_eq!(softmax(&z, 1e300).unwrap(), vec![0.25; 4]);
        assert_eq!(softmax(&[-1e308, 1e308], 1.0).unwrap(), vec![0.0, 1.0]);
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
