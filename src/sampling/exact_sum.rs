//! Error-free sums of probabilities and exact comparisons against scaled thresholds.
//!
//! Every finite `f64` is an integer multiple of 2^-1074 (the smallest subnormal). [`ExactSum`]
//! is therefore a plain unsigned fixed-point integer in units of 2^-1074: adding a double
//! places its 53-bit significand at the right bit offset, with no rounding at all. This is the
//! "fixed-point superaccumulator" approach; it makes the cumulative sums c_j of top-p and C_j
//! of inverse-CDF sampling exact, whatever their order and magnitudes.
//!
//! Thresholds such as `top_p * p(S)` or `u * p(S)` are products of a double in [0, 1] and an
//! exact sum. Because every sum is an integer in the same unit, `A >= x * B` holds exactly
//! when `A >= ceil(x * B)`, and [`ExactSum::scaled_ceil`] computes that ceiling with integer
//! arithmetic. A single double `a` satisfies `a >= T` exactly when `a >= T.to_f64_ceil()`, so
//! per-token threshold tests (min-p) reduce to one float comparison.

use std::cmp::Ordering;

/// Number of 64-bit limbs: 1152 bits in units of 2^-1074, so sums up to 2^78 fit. Inputs are
/// probabilities (each at most 1), so any realistic count of them fits with a wide margin.
const LIMBS: usize = 18;

/// Exponent of the unit: the value is `limbs` (little-endian) times 2^-1074.
const UNIT_EXPONENT: i32 = -1074;

/// An exact, non-negative sum of doubles in [0, 1], kept as a fixed-point integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExactSum {
    /// Little-endian 64-bit limbs of the integer value in units of 2^-1074.
    limbs: [u64; LIMBS],
}

/// Splits a finite non-negative double into (significand, shift) with value = significand *
/// 2^(shift - 1074), i.e. `significand << shift` units.
fn split(x: f64) -> (u64, u32) {
    debug_assert!((0.0..=1.0).contains(&x), "ExactSum takes values in [0, 1], got {x}");
    let bits = x.to_bits();
    let biased_exponent = (bits >> 52) as u32;
    let fraction = bits & ((1 << 52) - 1);
    if biased_exponent == 0 {
        (fraction, 0)
    } else {
        (fraction | 1 << 52, biased_exponent - 1)
    }
}

impl ExactSum {
    /// The empty sum.
    pub(crate) const ZERO: ExactSum = ExactSum { limbs: [0; LIMBS] };

    /// The exact value of one double in [0, 1].
    pub(crate) fn of(x: f64) -> Self {
        let mut sum = Self::ZERO;
        sum.add(x);
        sum
    }

    /// The exact sum of a sequence of doubles in [0, 1].
    pub(crate) fn of_all(values: impl IntoIterator<Item = f64>) -> Self {
        let mut sum = Self::ZERO;
        values.into_iter().for_each(|x| sum.add(x));
        sum
    }

    /// Adds a double in [0, 1] exactly.
    pub(crate) fn add(&mut self, x: f64) {
        let (significand, shift) = split(x);
        let (limb, offset) = ((shift / 64) as usize, shift % 64);
        let addend = (significand as u128) << offset;
        let current = self.limbs[limb] as u128 | (self.limbs[limb + 1] as u128) << 64;
        let (total, mut carry) = current.overflowing_add(addend);
        self.limbs[limb] = total as u64;
        self.limbs[limb + 1] = (total >> 64) as u64;
        let mut next = limb + 2;
        while carry {
            let (limb_value, overflow) = self.limbs[next].overflowing_add(1);
            self.limbs[next] = limb_value;
            carry = overflow;
            next += 1;
        }
    }

    /// `ceil(x * self)` in the same unit, for a double `x` in [0, 1], computed exactly.
    ///
    /// With x = m * 2^(s - 1074) (m the integer significand), x * self = m * self / 2^(1074 - s)
    /// units; the product m * self is formed limb by limb in 128-bit arithmetic and the
    /// division by a power of two is a right shift that rounds up if any bit is shifted out.
    pub(crate) fn scaled_ceil(&self, x: f64) -> ExactSum {
        let (significand, shift) = split(x);
        let mut product = [0u64; LIMBS + 1];
        let mut carry = 0u128;
        for (out, &limb) in product.iter_mut().zip(&self.limbs) {
            let wide = limb as u128 * significand as u128 + carry;
            *out = wide as u64;
            carry = wide >> 64;
        }
        product[LIMBS] = carry as u64;

        let right_shift = (-UNIT_EXPONENT) as u32 - shift;
        let (limb_shift, bit_shift) = ((right_shift / 64) as usize, right_shift % 64);
        let mut result = Self::ZERO;
        for (i, out) in result.limbs.iter_mut().enumerate() {
            let low = product.get(i + limb_shift).copied().unwrap_or(0);
            let high = product.get(i + limb_shift + 1).copied().unwrap_or(0);
            *out = if bit_shift == 0 { low } else { low >> bit_shift | high << (64 - bit_shift) };
        }
        let dropped_limbs = product[..limb_shift].iter().any(|&limb| limb != 0);
        let dropped_bits = bit_shift > 0 && product[limb_shift] & ((1u64 << bit_shift) - 1) != 0;
        if dropped_limbs || dropped_bits {
            result.increment();
        }
        result
    }

    /// The double nearest to the sum (ties to even).
    pub(crate) fn to_f64(self) -> f64 {
        self.round(|significand, half, below_half| half && (below_half || significand & 1 == 1))
    }

    /// The smallest double greater than or equal to the sum.
    pub(crate) fn to_f64_ceil(self) -> f64 {
        self.round(|_, half, below_half| half || below_half)
    }

    /// Rounds to a double: keeps the top 53 bits and asks `round_up(significand, half bit,
    /// any bit below the half bit)` whether to add one unit in the last place.
    fn round(self, round_up: impl Fn(u64, bool, bool) -> bool) -> f64 {
        let Some(top) = self.highest_bit() else { return 0.0 };
        // Values below 2^53 units are subnormal or the smallest normal binade: exact, and
        // their bit pattern equals the integer itself.
        let low = top.saturating_sub(52);
        let significand = self.bits_from(low) & ((1 << 53) - 1);
        let half = low > 0 && self.bit(low - 1);
        let below_half = low > 1 && self.any_below(low - 1);
        // Exponent field (low) plus the significand with its hidden bit encodes the value.
        let bits = ((low as u64) << 52) + significand;
        f64::from_bits(bits + round_up(significand, half, below_half) as u64)
    }

    fn increment(&mut self) {
        for limb in &mut self.limbs {
            let (value, overflow) = limb.overflowing_add(1);
            *limb = value;
            if !overflow {
                return;
            }
        }
    }

    fn highest_bit(&self) -> Option<u32> {
        let i = self.limbs.iter().rposition(|&limb| limb != 0)?;
        Some(i as u32 * 64 + 63 - self.limbs[i].leading_zeros())
    }

    fn bit(&self, position: u32) -> bool {
        self.limbs[(position / 64) as usize] >> (position % 64) & 1 == 1
    }

    /// The 64 bits starting at `position` (zeros past the top).
    fn bits_from(&self, position: u32) -> u64 {
        let (limb, offset) = ((position / 64) as usize, position % 64);
        let low = self.limbs[limb] >> offset;
        let high = match (offset, self.limbs.get(limb + 1)) {
            (0, _) | (_, None) => 0,
            (_, Some(&next)) => next << (64 - offset),
        };
        low | high
    }

    /// Whether any bit strictly below `position` is set.
    fn any_below(&self, position: u32) -> bool {
        let (limb, offset) = ((position / 64) as usize, position % 64);
        self.limbs[..limb].iter().any(|&l| l != 0) || (offset > 0 && self.limbs[limb] & ((1u64 << offset) - 1) != 0)
    }
}

impl Ord for ExactSum {
    fn cmp(&self, other: &Self) -> Ordering {
        self.limbs.iter().rev().cmp(other.limbs.iter().rev())
    }
}

impl PartialOrd for ExactSum {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::sampling::rng::uniform;

    /// The i-th test draw, an integer below 2^bits (bits <= 53).
    fn draw(i: u64, bits: i32) -> u64 {
        (uniform(1, i) * 2f64.powi(bits)) as u64
    }

    #[test]
    fn top_p_example_prefix_is_exactly_the_threshold() {
        // Naive float summation gives 0.8999999999999999 < 0.9; the exact sum of the three
        // doubles equals the double 0.9.
        assert!(std::hint::black_box(0.5) + 0.2 + 0.2 < 0.9);
        let sum = ExactSum::of_all([0.5, 0.2, 0.2]);
        assert_eq!(sum, ExactSum::of(0.9));
        assert_eq!(sum.to_f64(), 0.9);
    }

    #[test]
    fn sums_of_dyadic_values_match_integer_arithmetic() {
        // Values k * 2^-60 with k < 2^56 a multiple of 8 (exact doubles; n <= 16 of them, so
        // the sum stays below 1): the exact sum is an integer number of 2^-60 units, in u128.
        let mut i = 0..;
        for _ in 0..2000 {
            let n = draw(i.next().unwrap(), 4) as usize + 1;
            let ks: Vec<u64> = (0..n).map(|_| draw(i.next().unwrap(), 53) << 3).collect();
            let sum = ExactSum::of_all(ks.iter().map(|&k| k as f64 * 2f64.powi(-60)));
            let exact: u128 = ks.iter().map(|&k| k as u128).sum();
            assert_eq!(sum.to_f64(), exact as f64 * 2f64.powi(-60));
            assert!(sum.to_f64_ceil() >= sum.to_f64());
            // x * sum with x = m * 2^-53 is exactly m * exact * 2^-113: no rounding at all.
            let m = draw(i.next().unwrap(), 53);
            let scaled = sum.scaled_ceil(m as f64 * 2f64.powi(-53));
            assert_eq!(scaled, ExactSum::of_all(pieces(m as u128 * exact)));
        }
    }

    /// A count (below 2^120) of 2^-113 units as four exactly representable doubles in [0, 1].
    fn pieces(units: u128) -> [f64; 4] {
        std::array::from_fn(|i| ((units >> (30 * i)) & ((1 << 30) - 1)) as f64 * 2f64.powi(30 * i as i32 - 113))
    }

    #[test]
    fn tiny_terms_are_not_lost() {
        let tiny = f64::from_bits(1); // 2^-1074
        let mut sum = ExactSum::of(1.0);
        sum.add(tiny);
        assert!(sum > ExactSum::of(1.0));
        assert_eq!(sum.to_f64(), 1.0);
        assert_eq!(sum.to_f64_ceil(), 1.0f64.next_up());
        assert_eq!(ExactSum::of(tiny).to_f64(), tiny);
        assert_eq!(ExactSum::of_all([tiny; 3]).to_f64(), 3.0 * tiny);
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        let one = ExactSum::of(1.0);
        let half_ulp = 2f64.powi(-53);
        // 1 + 2^-53 is a tie between 1 and 1 + 2^-52: even is 1.
        let mut tie = one;
        tie.add(half_ulp);
        assert_eq!(tie.to_f64(), 1.0);
        // Anything above the tie rounds up.
        let mut above = tie;
        above.add(f64::from_bits(1));
        assert_eq!(above.to_f64(), 1.0 + 2.0 * half_ulp);
    }

    #[test]
    fn scaled_ceil_is_exact_at_the_edges() {
        let p = ExactSum::of_all([0.25, 0.5]);
        assert_eq!(p.scaled_ceil(1.0), p);
        assert_eq!(p.scaled_ceil(0.0), ExactSum::ZERO);
        assert_eq!(p.scaled_ceil(0.5), ExactSum::of(0.375));
        // 0.9 * 1: the product is exactly the double 0.9.
        assert_eq!(ExactSum::of(1.0).scaled_ceil(0.9), ExactSum::of(0.9));
        // The smallest subnormal times anything in (0, 1) rounds up to one unit.
        let tiny = ExactSum::of(f64::from_bits(1));
        assert_eq!(tiny.scaled_ceil(0.3), tiny);
        // 3 units * 0.5 = 1.5 units: rounded up to 2.
        assert_eq!(ExactSum::of(f64::from_bits(3)).scaled_ceil(0.5), ExactSum::of(f64::from_bits(2)));
    }
}
