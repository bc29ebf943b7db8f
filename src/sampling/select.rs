//! The last pipeline stage: choosing one token.

use crate::sampling::exact_sum::ExactSum;
use crate::sampling::truncation::{key_id, key_probability};

/// Greedy choice (definition 3.2): the lowest id among the maxima of `values`, or `None` when
/// every value is -inf (or the slice is empty). `values` contains no NaN.
pub(crate) fn argmax(values: &[f64]) -> Option<u32> {
    let mut best: Option<(u32, f64)> = None;
    for (id, &value) in values.iter().enumerate() {
        if value > best.map_or(f64::NEG_INFINITY, |(_, b)| b) {
            best = Some((id as u32, value));
        }
    }
    best.map(|(id, _)| id)
}

/// Inverse-CDF sampling (proposition 6.1): X = min{ j : C_j >= u } over the survivors in
/// ascending id order, where q_j = p_j / p(S) and C_j = sum_{i <= j} q_i.
///
/// Exact: C_j >= u is evaluated as sum_{i <= j} p_i >= ceil(u * p(S)) on [`ExactSum`]s, so no
/// rounding of the cumulative sums or of the normalization can move the boundary between two
/// tokens. `support` holds the survivors' rank keys sorted by id, `mass` is their exact total
/// and `u` is in [0, 1). With u = 0 the first survivor is chosen, so a token outside the
/// support is never returned.
pub(crate) fn inverse_cdf(support: &[u128], mass: &ExactSum, u: f64) -> u32 {
    let threshold = mass.scaled_ceil(u);
    let mut cumulative = ExactSum::ZERO;
    let chosen = support.iter().find(|&&key| {
        cumulative.add(key_probability(key));
        cumulative >= threshold
    });
    // The full sum is p(S) >= ceil(u p(S)) because u < 1, so `find` always succeeds.
    key_id(*chosen.or(support.last()).expect("the support is never empty"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::truncation::rank_key;

    #[test]
    fn argmax_takes_the_lowest_id_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f64::NEG_INFINITY, -5.0]), Some(1));
        assert_eq!(argmax(&[f64::NEG_INFINITY; 3]), None);
    }

    #[test]
    fn inverse_cdf_switches_exactly_at_the_cumulative_sums() {
        // q = (0.25, 0.5, 0.25) on ids 2, 5, 7: C = (0.25, 0.75, 1).
        let support = [rank_key(0.25, 2), rank_key(0.5, 5), rank_key(0.25, 7)];
        let mass = ExactSum::of(1.0);
        assert_eq!(inverse_cdf(&support, &mass, 0.0), 2);
        assert_eq!(inverse_cdf(&support, &mass, 0.25), 2);
        assert_eq!(inverse_cdf(&support, &mass, 0.25f64.next_up()), 5);
        assert_eq!(inverse_cdf(&support, &mass, 0.75), 5);
        assert_eq!(inverse_cdf(&support, &mass, 0.75f64.next_up()), 7);
        assert_eq!(inverse_cdf(&support, &mass, 1.0f64.next_down()), 7);
    }

    #[test]
    fn inverse_cdf_compares_against_the_renormalized_mass() {
        // Survivors (0.375, 0.125) of a larger distribution: q = (0.75, 0.25), C_0 = 0.75.
        let support = [rank_key(0.375, 0), rank_key(0.125, 1)];
        let mass = ExactSum::of_all([0.375, 0.125]);
        assert_eq!(inverse_cdf(&support, &mass, 0.75), 0);
        assert_eq!(inverse_cdf(&support, &mass, 0.75f64.next_up()), 1);
    }
}
