//! Truncation: top-k, top-p and min-p sets and restriction p_S (docs/theory.md, "Ranking,
//! top-k and top-p" and "Truncation is conditioning").
//!
//! **Ranking.** Tokens are ranked by probability descending, ties by ascending id (the ranking
//! pi). A candidate is stored as a *rank key*, a `u128` whose ascending order is exactly that
//! ranking: the high bits are the complement of the probability's bit pattern (the bit
//! patterns of non-negative doubles are ordered like their values), the low 32 bits the id.
//!
//! **Prefixes.** Each truncation keeps a prefix of the ranking: top-k the first k; top-p the
//! first k(rho), with k(rho) = min{ j : c_j >= rho }; min-p every token with p_i >= min_p *
//! p_max, a prefix because the ranking sorts by p. A later stage works on the renormalized
//! survivors of the earlier ones: top-p after a top-k that removed tokens compares the
//! cumulative sums with rho * p(S_k), i.e. c_j / p(S_k) >= rho. When top-p is the first
//! truncation, p is the distribution itself and c_j is compared with rho (mathematically
//! c_N = 1); if rounding left the exact total of the f64 probabilities below rho, no prefix
//! qualifies and the whole positive support is kept (the top-p set for rho = 1). min-p is
//! invariant under renormalization, and p_max always survives top-k and top-p.
//!
//! **Exactness.** Every c_j is an [`ExactSum`], and every threshold (rho, rho * p(S_k),
//! min_p * p_max) is compared exactly, so p = (0.5, 0.2, 0.2, 0.1) gives {0, 1, 2} for
//! rho = 0.9.
//!
//! **Cost.** The sampler does not sort the vocabulary. Top-p only gathers the tokens above a
//! floor (a few guesses relative to p_max, then one that provably lies under the nucleus) and
//! finds the crossing by a quickselect on exact mass; top-k keeps a running cut while scanning.
//! A floor that turns out too high is detected (the exact checks say so) and lowered, so the
//! fast path never changes the result.

use crate::error::{Error, Result};
use crate::sampling::config::SamplerConfig;
use crate::sampling::exact_sum::ExactSum;
use crate::sampling::stats::check_distribution;

/// The rank key of token `id` with probability `p` (see the module docs).
pub(crate) fn rank_key(p: f64, id: u32) -> u128 {
    ((!p.to_bits()) as u128) << 32 | id as u128
}

/// The token id of a rank key.
pub(crate) fn key_id(key: u128) -> u32 {
    key as u32
}

/// The probability of a rank key.
pub(crate) fn key_probability(key: u128) -> f64 {
    f64::from_bits(!((key >> 32) as u64))
}

/// The exact total probability of a set of rank keys.
pub(crate) fn mass_of(keys: &[u128]) -> ExactSum {
    ExactSum::of_all(keys.iter().map(|&key| key_probability(key)))
}

/// Keeps the `k` best keys (unordered); `k >= 1`.
fn keep_best(keys: &mut Vec<u128>, k: usize) {
    if keys.len() > k {
        keys.select_nth_unstable(k - 1);
        keys.truncate(k);
    }
}

multiversion! {
/// Rank keys of the tokens with `p_i >= floor` and `p_i > 0`, limited to the `top_k` best
/// when `top_k > 0`: the first min(top_k, |{p_i >= floor}|) tokens of the ranking, unordered.
/// Returns the number of tokens with p_i > 0.
fn gather(p: &[f64], floor: f64, top_k: usize, keys: &mut Vec<u128>) -> usize {
    // Compact to the top k whenever this many candidates are buffered: amortized O(1) per token.
    let compact_at = 2 * top_k + 256;
    let mut cut = floor.max(f64::from_bits(1));
    let mut positive = 0;
    keys.clear();
    const BLOCK: usize = 16;
    for (start, block) in (0..).step_by(BLOCK).zip(p.chunks(BLOCK)) {
        // Branch-free counts and tests per block (they vectorize); most blocks hold no candidate.
        positive += block.iter().map(|&prob| (prob > 0.0) as usize).sum::<usize>();
        if !block.iter().fold(false, |any, &prob| any | (prob >= cut)) {
            continue;
        }
        for (id, &prob) in (start..).zip(block) {
            if prob >= cut {
                keys.push(rank_key(prob, id));
                if top_k > 0 && keys.len() == compact_at {
                    keep_best(keys, top_k);
                    // Later tokens need at least the k-th probability (equal ones lose on id).
                    cut = key_probability(keys[top_k - 1]).max(cut);
                }
            }
        }
    }
    if top_k > 0 {
        keep_best(keys, top_k);
    }
    positive
}
}

/// The top-p prefix length k(rho) within `keys` (a prefix of the ranking, in any order) and its
/// exact mass c_k, or `None` if no prefix of `keys` reaches the threshold. The threshold is rho
/// or, when `renormalizer = Some(p(S))`, rho * p(S). On success `keys[..k]` are the first k of
/// the ranking (unordered).
///
/// A quickselect on mass: the range `lo..hi` holds the crossing index while `keys[..lo]` are
/// the first `lo` of the ranking with exact mass `before`; each round splits the range at its
/// median rank and keeps the half that contains the crossing. Expected O(|keys|) comparisons
/// and exact additions; small ranges are sorted and walked.
fn nucleus(keys: &mut [u128], rho: f64, renormalizer: Option<&ExactSum>) -> Option<(usize, ExactSum)> {
    let threshold = renormalizer.map_or(ExactSum::of(rho), |mass| mass.scaled_ceil(rho));
    let (mut lo, mut hi, mut before) = (0, keys.len(), ExactSum::ZERO);
    while hi - lo > 64 {
        let mid = lo + (hi - lo) / 2;
        keys[lo..hi].select_nth_unstable(mid - lo);
        let mut through_mid = before;
        keys[lo..mid].iter().for_each(|&key| through_mid.add(key_probability(key)));
        if through_mid >= threshold {
            hi = mid;
        } else {
            (lo, before) = (mid, through_mid);
        }
    }
    keys[lo..hi].sort_unstable();
    let mut cumulative = before;
    for (j, &key) in keys.iter().enumerate().take(hi).skip(lo) {
        cumulative.add(key_probability(key));
        if cumulative >= threshold {
            return Some((j + 1, cumulative));
        }
    }
    None
}

/// The rank key just after every token of positive probability: `key <= EVERY_POSITIVE`
/// holds exactly for the tokens with p_i > 0.
const EVERY_POSITIVE: u128 = ((!1u64) as u128) << 32 | u32::MAX as u128;

/// What truncation kept: the survivors S, a prefix of the ranking.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kept {
    /// The normalizer of q = p / normalizer on S: exactly p(S) when a token of positive
    /// probability was removed, else 1 (q = p: p is the distribution, p(V) = 1).
    pub normalizer: ExactSum,
    /// Whether any token of positive probability was removed.
    pub removed_any: bool,
    /// The rank key of the last survivor: S = { i : p_i > 0, rank_key(p_i, i) <= boundary }.
    boundary: u128,
    /// Whether the truncation buffer lists S (else S is every positive token).
    listed: bool,
}

/// The truncation stage of a sampler: settings plus the reusable candidate buffer.
#[derive(Clone, Debug)]
pub(crate) struct Truncation {
    top_k: usize,
    top_p: f64,
    min_p: f64,
    /// Candidates as rank keys; after [`Truncation::apply`] the survivors S when
    /// `Kept::listed`. Capacity `[vocab_size]`, reserved once.
    candidates: Vec<u128>,
}

impl Truncation {
    /// The truncation settings of a validated configuration.
    pub(crate) fn new(config: &SamplerConfig, vocab_size: usize) -> Self {
        Truncation {
            // Keeping the k >= N best tokens removes nothing: that is top-k off.
            top_k: if config.top_k < vocab_size { config.top_k } else { 0 },
            top_p: config.top_p,
            min_p: config.min_p,
            candidates: Vec::with_capacity(vocab_size),
        }
    }

    /// Runs top-k, then top-p, then min-p on the post-temperature distribution `p`, whose
    /// largest entry is `p_max`.
    pub(crate) fn apply(&mut self, p: &[f64], p_max: f64) -> Kept {
        if self.top_k == 0 && self.top_p == 1.0 && self.min_p == 0.0 {
            let one = ExactSum::of(1.0);
            return Kept { normalizer: one, removed_any: false, boundary: EVERY_POSITIVE, listed: false };
        }
        let min_p_cut = if self.min_p > 0.0 {
            // The smallest double >= min_p * p_max, so `p_i >= cut` is the exact test.
            ExactSum::of(p_max).scaled_ceil(self.min_p).to_f64_ceil()
        } else {
            0.0
        };
        let (mut mass, positive) = if self.top_p < 1.0 {
            self.top_k_then_top_p(p, p_max)
        } else {
            let positive = gather(p, min_p_cut, self.top_k, &mut self.candidates);
            (mass_of(&self.candidates), positive)
        };
        let before = self.candidates.len();
        self.candidates.retain(|&key| key_probability(key) >= min_p_cut);
        if self.candidates.len() < before {
            mass = mass_of(&self.candidates);
        }
        let removed_any = self.candidates.len() < positive;
        Kept {
            normalizer: if removed_any { mass } else { ExactSum::of(1.0) },
            removed_any,
            boundary: self.candidates.iter().copied().max().expect("p_max always survives"),
            listed: true,
        }
    }

    /// top-k (if on) then top-p; returns p(S) of the survivors and the number of tokens with
    /// p_i > 0.
    ///
    /// With top-k the candidates are S_k, found in one scan. Without, they are gathered above
    /// a decreasing sequence of floors: p_max * 2^-8, 2^-16, 2^-32, then the safe floor
    /// (1 - rho) / 2N (the tokens below it carry at most (1 - rho) / 2 of the mass), then 0. A
    /// floor is abandoned when its candidates visibly carry less than rho or the exact walk
    /// finds no crossing among them.
    fn top_k_then_top_p(&mut self, p: &[f64], p_max: f64) -> (ExactSum, usize) {
        let safe = (1.0 - self.top_p) / (2.0 * p.len() as f64);
        let guesses = [8, 16, 32].map(|bits| p_max * 2f64.powi(-bits));
        let floors = guesses.into_iter().chain([safe]).filter(|&floor| self.top_k == 0 && floor >= safe);
        for floor in floors.chain([0.0]) {
            let positive = gather(p, floor, self.top_k, &mut self.candidates);
            if floor > 0.0 && self.candidates.iter().map(|&key| key_probability(key)).sum::<f64>() < self.top_p {
                continue;
            }
            let renormalizer = (self.top_k > 0 && positive > self.top_k).then(|| mass_of(&self.candidates));
            match nucleus(&mut self.candidates, self.top_p, renormalizer.as_ref()) {
                Some((len, mass)) => {
                    self.candidates.truncate(len);
                    return (mass, positive);
                }
                None if floor == 0.0 => {
                    return (renormalizer.unwrap_or_else(|| mass_of(&self.candidates)), positive);
                }
                None => {}
            }
        }
        unreachable!("the last floor is 0, which always returns")
    }

    /// The survivors of `kept`, ready to be listed in ascending id order.
    pub(crate) fn survivors<'a>(&'a mut self, p: &'a [f64], kept: &Kept) -> Survivors<'a> {
        // A list longer than an eighth of the vocabulary is not worth sorting: scan p instead.
        if kept.listed && self.candidates.len() <= p.len() / 8 {
            self.candidates.sort_unstable_by_key(|&key| key_id(key));
            Survivors { listed: &self.candidates, scanned: &[], boundary: kept.boundary }
        } else {
            Survivors { listed: &[], scanned: p, boundary: kept.boundary }
        }
    }

    /// The `n` most probable survivors as (id, ln(p_i / total)), in rank order.
    pub(crate) fn most_probable(&mut self, p: &[f64], kept: &Kept, n: usize, total: f64) -> Vec<(u32, f64)> {
        if n == 0 {
            return Vec::new();
        }
        if kept.listed {
            keep_best(&mut self.candidates, n);
        } else {
            gather(p, 0.0, n, &mut self.candidates);
        }
        self.candidates.sort_unstable();
        let best = self.candidates.iter().map(|&key| (key_id(key), (key_probability(key) / total).ln()));
        best.collect()
    }
}

/// The survivors S in ascending id order, from a list sorted by id or from a scan of p.
pub(crate) struct Survivors<'a> {
    /// S sorted by id, or empty when scanning.
    listed: &'a [u128],
    /// p when scanning, else empty.
    scanned: &'a [f64],
    /// S = { i : p_i > 0, rank_key(p_i, i) <= boundary }.
    boundary: u128,
}

impl Survivors<'_> {
    /// (id, p_i) for every survivor, in ascending id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, f64)> + '_ {
        let boundary = self.boundary;
        let listed = self.listed.iter().map(|&key| (key_id(key), key_probability(key)));
        let scanned = self.scanned.iter().enumerate().filter_map(move |(id, &prob)| {
            (prob > 0.0 && rank_key(prob, id as u32) <= boundary).then_some((id as u32, prob))
        });
        listed.chain(scanned)
    }
}

/// Writes `q_i = p_i / p(S)` for the members (id, p_i) of S into `q` (other entries are left
/// untouched), with p(S) given exactly and rounded once.
pub(crate) fn restrict_into(q: &mut [f64], members: impl Iterator<Item = (u32, f64)>, mass: &ExactSum) {
    let total = mass.to_f64();
    for (id, prob) in members {
        q[id as usize] = prob / total;
    }
}

/// Rank keys of every token of `p` (zero-probability ones too), after checking `p`.
fn all_keys(p: &[f64]) -> Result<Vec<u128>> {
    check_distribution(p)?;
    Ok(p.iter().enumerate().map(|(id, &prob)| rank_key(prob, id as u32)).collect())
}

/// The top-k set S^(k) = {pi(1), ..., pi(k)}, in rank order (probability descending, ties by
/// ascending id). `k` must be >= 1; k >= N gives every token.
pub fn top_k_set(p: &[f64], k: usize) -> Result<Vec<u32>> {
    if k == 0 {
        return Err(Error::invalid_argument("k", "must be at least 1"));
    }
    let mut keys = all_keys(p)?;
    keep_best(&mut keys, k);
    keys.sort_unstable();
    Ok(keys.into_iter().map(key_id).collect())
}

/// The top-p set S_rho = {pi(1), ..., pi(k(rho))} with k(rho) = min{ j : c_j >= rho }: the
/// shortest ranked prefix whose exact cumulative mass reaches rho, in rank order (so
/// p = (0.5, 0.2, 0.2, 0.1) gives {0, 1, 2} for rho = 0.9). `top_p` must be in (0, 1]. If the
/// exact total of `p` falls short of rho (rounding), the positive support is returned, the set
/// for rho = 1.
pub fn top_p_set(p: &[f64], top_p: f64) -> Result<Vec<u32>> {
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(Error::invalid_argument("top_p", format!("must be in (0, 1], got {top_p}")));
    }
    let mut keys = all_keys(p)?;
    keys.retain(|&key| key_probability(key) > 0.0);
    // Without a qualifying prefix every positive token is kept.
    if let Some((len, _)) = nucleus(&mut keys, top_p, None) {
        keys.truncate(len);
    }
    keys.sort_unstable();
    Ok(keys.into_iter().map(key_id).collect())
}

/// The restriction p_S, the conditional distribution given S: p_i / p(S) on S, 0 elsewhere
/// (repeated ids count once). p(S) is summed exactly and rounded once. Requires p(S) > 0.
pub fn restrict(p: &[f64], set: &[u32]) -> Result<Vec<f64>> {
    let mut keys = all_keys(p)?;
    let mut member = vec![false; p.len()];
    for &id in set {
        let slot = member.get_mut(id as usize).ok_or(Error::TokenOutOfRange { id: id as i64, vocab_size: p.len() })?;
        *slot = true;
    }
    keys.retain(|&key| member[key_id(key) as usize]);
    let mass = mass_of(&keys);
    if mass == ExactSum::ZERO {
        return Err(Error::invalid_argument("S", "p(S) = 0: cannot condition on a null set"));
    }
    let mut q = vec![0.0; p.len()];
    restrict_into(&mut q, keys.iter().map(|&key| (key_id(key), key_probability(key))), &mass);
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truncation(top_k: usize, top_p: f64, min_p: f64, vocab_size: usize) -> Truncation {
        let config = SamplerConfig { top_k, top_p, min_p, ..SamplerConfig::default() };
        Truncation::new(&config, vocab_size)
    }

    #[test]
    fn a_floor_that_is_too_high_is_detected_and_redone() {
        // p = (0.5, 0.25, 4096 x 2^-16): the tail is below the floor (1 - rho) / 2N, but only
        // because the vector sums to 0.8125 instead of 1 -- the exact walk notices, and the
        // stage is redone over every token.
        let mut p = vec![0.5, 0.25];
        p.extend([2f64.powi(-16); 4096]);
        let rho = 0.8125;
        assert!(p[2] < (1.0 - rho) / (2.0 * p.len() as f64));
        let mut stage = truncation(0, rho, 0.0, p.len());
        let kept = stage.apply(&p, 0.5);
        assert_eq!(stage.candidates.len(), p.len());
        assert!(!kept.removed_any);
        // Nothing removed: q = p, the normalizer is 1.
        assert_eq!(kept.normalizer, ExactSum::of(1.0));
    }

    #[test]
    fn a_crossing_that_only_rounding_suggested_is_rejected_by_the_exact_walk() {
        // 0.5 + a rounds up to rho = 0.75 + 2^-52, but exactly 0.5 + a = 0.75 + 3 * 2^-54 < rho:
        // the candidates above the floor pass the float screen, the exact walk says no, and
        // the tiny third token is needed.
        let a = 0.25 + 3.0 * 2f64.powi(-54);
        let rho = 0.75 + 2f64.powi(-52);
        assert!(0.5 + a >= rho);
        let p = [0.5, a, 2f64.powi(-54)];
        let mut stage = truncation(0, rho, 0.0, p.len());
        stage.apply(&p, 0.5);
        assert_eq!(stage.candidates.len(), 3);
    }

    #[test]
    fn top_p_after_top_k_compares_with_rho_times_the_survivors_mass_exactly() {
        // S_k = {0, 1, 2, 3} has mass 0.9375; c_2 = 0.75 = 0.8 * 0.9375 in real numbers, but the
        // double 0.8 is 0.8000000000000000444, so c_2 falls short and k(rho) = 3. Both float
        // shortcuts (fl(rho * 0.9375) = 0.75, fl(0.75 / 0.9375) = 0.8) would stop at 2.
        let p = [0.5, 0.25, 0.125, 0.0625, 0.0625];
        let (rho, mass) = std::hint::black_box((0.8, 0.9375));
        assert_eq!((rho * mass, 0.75 / mass), (0.75, 0.8));
        let mut stage = truncation(4, 0.8, 0.0, p.len());
        let kept = stage.apply(&p, 0.5);
        stage.candidates.sort_unstable();
        assert_eq!(stage.candidates.iter().map(|&k| key_id(k)).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(kept.normalizer, ExactSum::of(0.875));
    }

    #[test]
    fn rank_keys_order_by_probability_then_id() {
        let mut keys = [rank_key(0.25, 3), rank_key(0.5, 7), rank_key(0.25, 1), rank_key(0.0, 0)];
        keys.sort_unstable();
        assert_eq!(keys.iter().map(|&k| key_id(k)).collect::<Vec<_>>(), vec![7, 1, 3, 0]);
        assert_eq!(key_probability(keys[0]), 0.5);
    }

    #[test]
    fn gather_keeps_the_top_k_across_compactions() {
        // Increasing probabilities force many compactions; ties at the cut lose on id.
        let p: Vec<f64> = (0..5000).map(|i| (i / 3) as f64 / 5e6).collect();
        let mut keys = Vec::new();
        gather(&p, 0.0, 10, &mut keys);
        keys.sort_unstable();
        let ids: Vec<u32> = keys.iter().map(|&k| key_id(k)).collect();
        assert_eq!(ids, vec![4998, 4999, 4995, 4996, 4997, 4992, 4993, 4994, 4989, 4990]);
    }
}
