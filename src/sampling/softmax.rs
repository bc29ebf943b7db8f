//! The temperature stage: softmax of z / tau in f64, with its own `exp`.
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
//! argmax. This is the distribution the sampler then draws from; note that it differs from the
//! tau -> 0+ limit (uniform over the argmax set) when several logits tie for the maximum.

use crate::error::{Error, Result};
#[cfg(target_arch = "x86_64")]
use crate::sampling::has_avx512;
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
    let x = if x < EXP_MIN { EXP_MIN } else { x };
    let k = round_to_integer(x * EXP_SCALE);
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // q = floor(k / 32): (k - 15.5) / 32 is never a tie and lies within 1/2 of it.
    let q = round_to_integer((k - 15.5) * (1.0 / 32.0));
    let j = ((k - 32.0 * q) + ROUND).to_bits() as usize & 31;
    let polynomial = C2 + r * (C3 + r * (C4 + r * (C5 + r * C6)));
    let exp_r_minus_1 = r + r * r * polynomial;
    let (hi, lo) = (f64::from_bits(EXP2_TABLE[j].0), f64::from_bits(EXP2_TABLE[j].1));
    let scaled = hi + (hi * exp_r_minus_1 + lo);
    let q_half = round_to_integer(q * 0.5);
    scaled * power_of_two(q_half) * power_of_two(q - q_half)
}

/// Inputs below this give +0 (exp(-746) is below half the smallest subnormal).
const EXP_MIN: f64 = -746.0;
/// 32 / ln 2: x * EXP_SCALE rounded is k, the multiple of ln(2) / 32 nearest x.
const EXP_SCALE: f64 = 32.0 * std::f64::consts::LOG2_E;
/// ln(2) / 32 = LN2_HI + LN2_LO: ln 2 to 21 bits, / 32, and the rest of ln 2, / 32.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000) / 32.0;
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76) / 32.0;
/// Taylor coefficients 1/n! of exp(r) - 1 - r = r^2 (C2 + r (C3 + r (C4 + r (C5 + r C6)))).
const C2: f64 = 1.0 / 2.0;
const C3: f64 = 1.0 / 6.0;
const C4: f64 = 1.0 / 24.0;
const C5: f64 = 1.0 / 120.0;
const C6: f64 = 1.0 / 720.0;

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
    let mut sum = BlockedSum::default();
    values.chunks(SUM_BLOCK).for_each(|block| sum.add_block(block_lanes(block)));
    sum.total()
}

/// Values per block of [`blocked_sum`].
const SUM_BLOCK: usize = 32;

/// The 8 lane sums of one block: lane i adds block[i], block[i + 8], ... in order, from 0.
#[inline(always)]
fn block_lanes(block: &[f64]) -> [f64; 8] {
    let mut lanes = [0.0; 8];
    for chunk in block.chunks(8) {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            *lane += value;
        }
    }
    lanes
}

/// The TwoSum accumulation of block sums in [`blocked_sum`].
#[derive(Default)]
struct BlockedSum {
    total: f64,
    error: f64,
}

impl BlockedSum {
    /// Adds the block whose lane sums are `lanes`, reduced by a pairwise tree.
    #[inline(always)]
    fn add_block(&mut self, [a, b, c, d, e, f, g, h]: [f64; 8]) {
        let (sum, rounding) = two_sum(self.total, ((a + b) + (c + d)) + ((e + f) + (g + h)));
        self.total = sum;
        self.error += rounding;
    }

    #[inline(always)]
    fn total(&self) -> f64 {
        self.total + self.error
    }
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
    let inverse_temperature = inverse_temperature(temperature);
    for (out, &logit) in p.iter_mut().zip(z) {
        *out = exp_nonpositive((logit - max_logit) * inverse_temperature);
    }
    let normalizer = blocked_sum(p);
    normalize(p, normalizer);
    Normalization { max_logit, normalizer }
}

/// fl(1 / tau), capped so that a subnormal temperature gives 0 * MAX = 0 at the maximum, not
/// 0 * inf.
#[inline(always)]
fn inverse_temperature(temperature: f64) -> f64 {
    (1.0 / temperature).min(f64::MAX)
}

/// p_i = e_i * fl(1 / Z).
#[inline(always)]
fn normalize(p: &mut [f64], normalizer: f64) {
    let inverse_normalizer = 1.0 / normalizer;
    p.iter_mut().for_each(|value| *value *= inverse_normalizer);
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

/// The AVX-512 twin of [`exp_nonpositive`] and [`softmax_kernel`]: the same IEEE operations
/// on the same values, eight at a time, so the same bits. Where the instructions differ the
/// values are still the same:
///
/// - rounding to an integer is one `vroundscalepd` instead of adding and subtracting ROUND
///   (the same integer for |x| < 2^51), and q = floor(k / 32) is rounded down from the exact
///   k / 32 instead of to nearest from (k - 15.5) / 32;
/// - the table lookup 2^(j/32) is two in-register permutes of 16 entries and a blend instead
///   of a load (j is read from the low bits of k + ROUND, which are k mod 32 like those of
///   (k - 32 q) + ROUND);
/// - 2^q * scaled is one `vscalefpd`, which rounds the exact product once, as the two
///   multiplications of the portable code do (the first is exact: both factors are normal
///   and so is their product);
/// - the exponentials of each block of 32 are summed while they are in registers, lane by
///   lane in the order of [`block_lanes`], then reduced and accumulated like [`blocked_sum`].
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::*;

    /// The 32 (hi, lo) pairs of [`EXP2_TABLE`] as four registers each.
    struct Tables {
        hi: [__m512d; 4],
        lo: [__m512d; 4],
    }

    #[target_feature(enable = "avx512f")]
    fn tables() -> Tables {
        let column = |pick: fn(&(u64, u64)) -> u64, part: usize| {
            let bits: [u64; 8] = std::array::from_fn(|i| pick(&EXP2_TABLE[8 * part + i]));
            // SAFETY: reads 8 u64 from an array of 8.
            unsafe { _mm512_loadu_pd(bits.as_ptr().cast()) }
        };
        Tables {
            hi: std::array::from_fn(|part| column(|e| e.0, part)),
            lo: std::array::from_fn(|part| column(|e| e.1, part)),
        }
    }

    /// Entry j (0..32, one per lane) of a 32-entry table held in four registers.
    #[target_feature(enable = "avx512f")]
    fn lookup(table: &[__m512d; 4], j: __m512i) -> __m512d {
        let low = _mm512_permutex2var_pd(table[0], j, table[1]);
        let high = _mm512_permutex2var_pd(table[2], j, table[3]);
        _mm512_mask_blend_pd(_mm512_test_epi64_mask(j, _mm512_set1_epi64(16)), low, high)
    }

    /// [`exp_nonpositive`] of eight values.
    #[target_feature(enable = "avx512f")]
    fn exp8(x: __m512d, tables: &Tables) -> __m512d {
        let splat = _mm512_set1_pd;
        let x = _mm512_max_pd(x, splat(EXP_MIN));
        // Rounding to the nearest integer, ties to even, like round_to_integer.
        let k = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_pd(
            x,
            splat(EXP_SCALE),
        ));
        let r = _mm512_sub_pd(
            _mm512_sub_pd(x, _mm512_mul_pd(k, splat(LN2_HI))),
            _mm512_mul_pd(k, splat(LN2_LO)),
        );
        // q = floor(k / 32), the value the portable code computes; k / 32 is exact.
        let q = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_mul_pd(
            k,
            splat(1.0 / 32.0),
        ));
        // j = k mod 32 from the two's-complement integer in the low bits of k + ROUND.
        let j = _mm512_and_si512(_mm512_castpd_si512(_mm512_add_pd(k, splat(ROUND))), _mm512_set1_epi64(31));
        let mut polynomial = _mm512_add_pd(splat(C5), _mm512_mul_pd(r, splat(C6)));
        polynomial = _mm512_add_pd(splat(C4), _mm512_mul_pd(r, polynomial));
        polynomial = _mm512_add_pd(splat(C3), _mm512_mul_pd(r, polynomial));
        polynomial = _mm512_add_pd(splat(C2), _mm512_mul_pd(r, polynomial));
        let exp_r_minus_1 = _mm512_add_pd(r, _mm512_mul_pd(_mm512_mul_pd(r, r), polynomial));
        let (hi, lo) = (lookup(&tables.hi, j), lookup(&tables.lo, j));
        let scaled = _mm512_add_pd(hi, _mm512_add_pd(_mm512_mul_pd(hi, exp_r_minus_1), lo));
        _mm512_scalef_pd(scaled, q)
    }

    /// [`exp_nonpositive`] of each value, for testing.
    #[cfg(test)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn exp_all(x: &[f64]) -> Vec<f64> {
        let tables = tables();
        let mut out = vec![0.0; x.len()];
        for (out, x) in out.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
            // SAFETY: 8 values are read from and written to slices of 8.
            unsafe { _mm512_storeu_pd(out.as_mut_ptr(), exp8(_mm512_loadu_pd(x.as_ptr()), &tables)) };
        }
        let tail = x.len() / 8 * 8;
        out[tail..].iter_mut().zip(&x[tail..]).for_each(|(out, &x)| *out = exp_nonpositive(x));
        out
    }

    /// [`softmax_kernel`] with the exponentials and the sum in AVX-512.
    #[target_feature(enable = "avx512f")]
    pub(super) fn softmax_kernel(z: &[f64], temperature: f64, p: &mut [f64]) -> Normalization {
        let max_logit = max_of(z);
        let inverse_temperature = inverse_temperature(temperature);
        let tables = tables();
        let (max, scale) = (_mm512_set1_pd(max_logit), _mm512_set1_pd(inverse_temperature));
        let mut sum = BlockedSum::default();
        let full = z.len() / SUM_BLOCK * SUM_BLOCK;
        for (out, logits) in p[..full].chunks_exact_mut(SUM_BLOCK).zip(z[..full].chunks_exact(SUM_BLOCK)) {
            let mut lanes = _mm512_setzero_pd();
            for (out, logits) in out.chunks_exact_mut(8).zip(logits.chunks_exact(8)) {
                // SAFETY: 8 values are read from and written to slices of 8.
                let logit = unsafe { _mm512_loadu_pd(logits.as_ptr()) };
                let e = exp8(_mm512_mul_pd(_mm512_sub_pd(logit, max), scale), &tables);
                // SAFETY: as for the load.
                unsafe { _mm512_storeu_pd(out.as_mut_ptr(), e) };
                lanes = _mm512_add_pd(lanes, e);
            }
            let mut block = [0.0; 8];
            // SAFETY: writes 8 values to an array of 8.
            unsafe { _mm512_storeu_pd(block.as_mut_ptr(), lanes) };
            sum.add_block(block);
        }
        for (out, &logit) in p[full..].iter_mut().zip(&z[full..]) {
            *out = exp_nonpositive((logit - max_logit) * inverse_temperature);
        }
        if full < z.len() {
            sum.add_block(block_lanes(&p[full..]));
        }
        let normalizer = sum.total();
        normalize(p, normalizer);
        Normalization { max_logit, normalizer }
    }
}

/// Writes p_tau of the f64 logits `z` (-inf = excluded token) into `p`, for `temperature > 0`.
/// The caller guarantees that some logit is finite and none is NaN or +inf. Uses AVX-512 or
/// AVX2 when the CPU has them; the bits are the same on every path.
pub(crate) fn softmax_into(z: &[f64], temperature: f64, p: &mut [f64]) -> Normalization {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: AVX-512 support was just checked.
            return unsafe { avx512::softmax_kernel(z, temperature, p) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 support was just checked.
            return unsafe { softmax_kernel_avx2(z, temperature, p) };
        }
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

/// The distribution of temperature `temperature` for logits `z`, softmax(z / temperature), in f64.
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
        let mut counter = 0..;
        let mut unit = || crate::sampling::rng::uniform(9, counter.next().unwrap());
        for case in 0..300 {
            // Lengths around the block of 32 and the 8 lanes; logits from peaked to flat, with
            // masked tokens, and temperatures down to the subnormal range of the exponentials.
            let n = [1, 7, 8, 31, 32, 33, 100, 1003, 4096][case % 9];
            let spread = [0.5, 5.0, 60.0, 1e3][case % 4];
            let mut z: Vec<f64> = (0..n).map(|_| (unit() - 0.5) * spread).collect();
            if case % 5 == 0 {
                z[(unit() * n as f64) as usize] = f64::NEG_INFINITY;
            }
            z[0] = z[0].max(-1e3); // some entry is finite
            let temperature = [0.7, 1.0, 0.05, 3.3, 1e-3][case % 5];
            let (mut portable, mut dispatched) = (vec![0.0; n], vec![0.0; n]);
            let a = softmax_kernel(&z, temperature, &mut portable);
            let b = softmax_into(&z, temperature, &mut dispatched);
            assert_eq!(portable, dispatched, "case {case}");
            assert_eq!((a.max_logit.to_bits(), a.normalizer.to_bits()), (b.max_logit.to_bits(), b.normalizer.to_bits()));
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                let mut avx2 = vec![0.0; n];
                // SAFETY: AVX2 support was just checked.
                let c = unsafe { softmax_kernel_avx2(&z, temperature, &mut avx2) };
                assert_eq!(portable, avx2, "case {case}");
                assert_eq!(a.normalizer.to_bits(), c.normalizer.to_bits());
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_exp_gives_the_portable_bits() {
        if !has_avx512() {
            eprintln!("no AVX-512 on this CPU: nothing to compare");
            return;
        }
        let mut x: Vec<f64> = (0..2_000_000)
            .map(|i| {
                let scale = [1.0, 10.0, 100.0, 746.0, 800.0][i % 5];
                -crate::sampling::rng::uniform(13, i as u64) * scale
            })
            .collect();
        // Subnormal results, the cut-off, zeros, ties of the rounding and the table boundaries.
        x.extend((0..20_000).map(|i| -708.0 - i as f64 * 0.002));
        x.extend([0.0, -0.0, -1e-300, -f64::MIN_POSITIVE, -745.1, -745.2, -746.0, -746.1, f64::NEG_INFINITY]);
        x.extend((0..4096).map(|k| -(k as f64) * LN2_HI - (k as f64 + 0.5) / EXP_SCALE));
        // SAFETY: AVX-512F support was just checked.
        let simd = unsafe { avx512::exp_all(&x) };
        for (&x, simd) in x.iter().zip(simd) {
            assert_eq!(simd.to_bits(), exp_nonpositive(x).to_bits(), "x = {x:e}");
        }
    }

    #[test]
    fn extreme_temperatures_reach_the_limits() {
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
