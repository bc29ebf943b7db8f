//! The last pipeline stage: choosing one token.

use crate::sampling::exact_sum::ExactSum;

/// Greedy choice: the lowest id among the maxima of `values`, or `None` when
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

/// Inverse-CDF sampling (docs/theory.md, "Drawing a token"): X = min{ j : C_j >= u } over the
/// survivors, listed by `support()` as (id, p_j) in ascending id order, where
/// q_j = p_j / normalizer and C_j = sum_{i <= j} q_i.
///
/// Exact: C_j >= u is decided as A_j = sum_{i <= j} p_i >= T = ceil(u * normalizer) with
/// [`ExactSum`] semantics, so no rounding of the cumulative sums or of the normalization can
/// move the boundary between two tokens. Cheaply: a float pass decides whenever the running
/// float sum is provably on one side of T, and only a too-close call (roughly one draw in
/// 10^7 for a flat distribution over 50,000 tokens) repeats the walk with exact sums.
///
/// `u` is in [0, 1); with u = 0 the first survivor is chosen, so a token outside the support
/// is never returned. With normalizer p(S) the last A_j is p(S) >= T. With normalizer 1
/// (nothing truncated, q = p) C_N is 1 by definition: if rounding left sum p_i below u, the
/// last token is the one with C_N >= u.
pub(crate) fn inverse_cdf<I>(mut support: impl FnMut() -> I, normalizer: &ExactSum, u: f64) -> u32
where
    I: Iterator<Item = (u32, f64)>,
{
    let threshold = normalizer.scaled_ceil(u);
    screened_search(support(), threshold.to_f64()).unwrap_or_else(|| exact_search(support(), &threshold))
}

/// The first id whose cumulative sum reaches T, decided in floating point, or `None` when a
/// partial sum is too close to T to tell. `target` is T rounded to nearest.
///
/// The recursive float sum s_j of non-negative terms satisfies |s_j - A_j| <= gamma_(j-1) A_j
/// <= 1.01 (j - 1) 2^-53 s_j (the standard bound for recursive summation), and |target - T|
/// <= 2^-53 target; the slack (j + 1) 2^-50 below covers both with a factor of 8 to spare for
/// the rounding of the checks themselves.
fn screened_search(support: impl Iterator<Item = (u32, f64)>, target: f64) -> Option<u32> {
    let margin = 2f64.powi(-50);
    let (target_low, target_high) = (target * (1.0 - margin), target * (1.0 + margin));
    let (mut sum, mut last) = (0.0, None);
    for (j, (id, prob)) in support.enumerate() {
        sum += prob;
        let slack = (j + 1) as f64 * margin;
        if sum * (1.0 + slack) < target_low {
            last = Some(id); // surely A_j < T
        } else if sum * (1.0 - slack) > target_high {
            return Some(id); // surely A_j >= T, and every earlier A_i < T
        } else {
            return None;
        }
    }
    last
}

/// [`inverse_cdf`] when the support is every token of positive probability in `p` (nothing
/// was truncated): the same token, found faster. The float screen first adds whole blocks of
/// 64 probabilities (in 8 lanes, so it vectorizes) and walks token by token only inside the
/// block where the cumulative sum crosses T. Its margin still holds: any summation order of
/// n non-negative terms errs by at most gamma_(n-1) times their sum, and a block is skipped
/// only when its end is surely below T, so every earlier cumulative sum is too.
pub(crate) fn inverse_cdf_dense(p: &[f64], normalizer: &ExactSum, u: f64) -> u32 {
    let threshold = normalizer.scaled_ceil(u);
    let positive = || p.iter().enumerate().filter(|&(_, &prob)| prob > 0.0).map(|(id, &prob)| (id as u32, prob));
    screened_search_dense(p, threshold.to_f64()).unwrap_or_else(|| exact_search(positive(), &threshold))
}

multiversion! {
/// [`screened_search`] over all of `p`, zeros included (they add nothing; counting them only
/// widens the margin).
fn screened_search_dense(p: &[f64], target: f64) -> Option<u32> {
    const BLOCK: usize = 64;
    let margin = 2f64.powi(-50);
    let (target_low, target_high) = (target * (1.0 - margin), target * (1.0 + margin));
    let mut sum = 0.0;
    for (start, block) in (0..).step_by(BLOCK).zip(p.chunks(BLOCK)) {
        let mut lanes = [0.0; 8];
        for chunk in block.chunks(8) {
            for (lane, &prob) in lanes.iter_mut().zip(chunk) {
                *lane += prob;
            }
        }
        let block_sum = lanes.iter().fold(0.0, |sum, &x| sum + x);
        let slack = (start + block.len()) as f64 * margin;
        if (sum + block_sum) * (1.0 + slack) < target_low {
            sum += block_sum; // surely A < T at the end of the block
            continue;
        }
        for (id, &prob) in (start..).zip(block) {
            sum += prob;
            let slack = (id + 1) as f64 * margin;
            if sum * (1.0 + slack) < target_low {
                continue; // surely A_id < T
            }
            // Surely A_id >= T while every earlier A < T: token id (which has p > 0, else the
            // previous sum would have decided), or too close to tell.
            return (sum * (1.0 - slack) > target_high && prob > 0.0).then_some(id as u32);
        }
        // Every token of the block was surely below T after all: on to the next block.
    }
    // Every cumulative sum is surely below T (rounding left sum p_i < u): C_N = 1, the last
    // token of positive probability.
    p.iter().rposition(|&prob| prob > 0.0).map(|id| id as u32)
}
}

/// The first id whose exact cumulative sum reaches `threshold`, or the last id if none does.
fn exact_search(support: impl Iterator<Item = (u32, f64)>, threshold: &ExactSum) -> u32 {
    let mut cumulative = ExactSum::ZERO;
    let mut last = None;
    for (id, prob) in support {
        cumulative.add(prob);
        if cumulative >= *threshold {
            return id;
        }
        last = Some(id);
    }
    last.expect("the support is never empty")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_lowest_id_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f64::NEG_INFINITY, -5.0]), Some(1));
        assert_eq!(argmax(&[f64::NEG_INFINITY; 3]), None);
    }

    #[test]
    fn inverse_cdf_switches_exactly_at_the_cumulative_sums() {
        // q = (0.25, 0.5, 0.25) on ids 2, 5, 7: C = (0.25, 0.75, 1).
        let support = [(2, 0.25), (5, 0.5), (7, 0.25)];
        let draw = |u: f64| inverse_cdf(|| support.into_iter(), &ExactSum::of(1.0), u);
        assert_eq!(draw(0.0), 2);
        assert_eq!(draw(0.25), 2);
        assert_eq!(draw(0.25f64.next_up()), 5);
        assert_eq!(draw(0.75), 5);
        assert_eq!(draw(0.75f64.next_up()), 7);
        assert_eq!(draw(1.0f64.next_down()), 7);
        // A deficit from rounding (sum 0.875 < u) goes to the last token: C_N = 1.
        let short = [(0, 0.5), (1, 0.375)];
        assert_eq!(inverse_cdf(|| short.into_iter(), &ExactSum::of(1.0), 0.9), 1);
    }

    #[test]
    fn inverse_cdf_compares_against_the_renormalized_mass() {
        // Survivors (0.375, 0.125) of a larger distribution: q = (0.75, 0.25), C_0 = 0.75.
        let support = [(0, 0.375), (1, 0.125)];
        let mass = ExactSum::of_all([0.375, 0.125]);
        assert_eq!(inverse_cdf(|| support.into_iter(), &mass, 0.75), 0);
        assert_eq!(inverse_cdf(|| support.into_iter(), &mass, 0.75f64.next_up()), 1);
    }

    #[test]
    fn the_dense_search_chooses_the_same_token_as_the_search_over_the_support() {
        let mut counter = 0..;
        let mut next = || crate::sampling::rng::uniform(12, counter.next().unwrap());
        for case in 0..3000 {
            // Lengths around the blocks of 64, zeros (masked tokens), one dominant token or a
            // flat vector, and a deficit (entries adding up to less than 1).
            let n = [1, 5, 63, 64, 65, 200, 1000, 5000][case % 8];
            let mut p: Vec<f64> = (0..n).map(|_| if next() < 0.3 { 0.0 } else { next() }).collect();
            if case % 3 == 0 {
                p[(next() * n as f64) as usize] = 1e3;
            }
            let id0 = (next() * n as f64) as usize;
            p[id0] = p[id0].max(1e-3);
            let total: f64 = p.iter().sum();
            let scale = if case % 7 == 0 { 0.999 } else { 1.0 };
            p.iter_mut().for_each(|x| *x = *x / total * scale);
            let support: Vec<(u32, f64)> =
                p.iter().enumerate().filter(|(_, &x)| x > 0.0).map(|(i, &x)| (i as u32, x)).collect();
            let one = ExactSum::of(1.0);
            let mut draws = vec![next(), 0.0, 1.0f64.next_down()];
            // Draws right at, just below and just above a cumulative sum.
            let cut = ExactSum::of_all(support[..support.len() / 2 + 1].iter().map(|&(_, x)| x)).to_f64();
            draws.extend([cut, cut.next_down(), cut.next_up()].into_iter().filter(|&u| u < 1.0));
            for u in draws {
                let expected = inverse_cdf(|| support.iter().copied(), &one, u);
                assert_eq!(inverse_cdf_dense(&p, &one, u), expected, "case {case}, u = {u}");
            }
        }
    }

    #[test]
    fn the_float_screen_agrees_with_exact_search_or_abstains() {
        let mut counter = 0..;
        let mut next = || crate::sampling::rng::uniform(11, counter.next().unwrap());
        let (mut decided, mut abstained) = (0, 0);
        for case in 0..2000 {
            let n = 1 + case % 300;
            let support: Vec<(u32, f64)> = (0..n as u32).map(|id| (id, next() / n as f64)).collect();
            let mass = ExactSum::of_all(support.iter().map(|&(_, p)| p));
            // A random draw, a draw right at a cumulative sum (the screen must abstain), 0.
            let prefix = ExactSum::of_all(support[..n / 2 + 1].iter().map(|&(_, p)| p));
            for u in [next(), prefix.to_f64() / mass.to_f64(), 0.0] {
                let threshold = mass.scaled_ceil(u.min(1.0f64.next_down()));
                let exact = exact_search(support.iter().copied(), &threshold);
                match screened_search(support.iter().copied(), threshold.to_f64()) {
                    Some(id) => {
                        assert_eq!(id, exact);
                        decided += 1;
                    }
                    None => abstained += 1,
                }
            }
        }
        assert!(decided >= 3990 && abstained > 0, "decided {decided}, abstained {abstained}");
    }
}
