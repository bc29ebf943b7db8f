//! Truncation: top-k, top-p and min-p sets (definition 5.1) and restriction p_S.
//!
//! **Ranking.** Tokens are ranked by probability descending, ties by ascending id (definition
//! 5.1's pi). A candidate is stored as a *rank key*, a `u128` whose ascending order is exactly
//! that ranking: the high bits are the complement of the probability's bit pattern (the bit
//! patterns of non-negative doubles are ordered like their values), the low 32 bits the id.
//!
//! **Prefixes.** Each truncation keeps a prefix of the ranking: top-k the first k; top-p the
//! first k(rho), with k(rho) = min{ j : c_j >= rho }; min-p every token with p_i >= min_p *
//! p_max, a prefix because the ranking sorts by p. A later stage works on the renormalized
//! survivors of the earlier ones: top-p after a top-k that removed tokens compares the
//! cumulative sums with rho * p(S_k), i.e. c_j / p(S_k) >= rho. When top-p is the first
//! truncation, p is the distribution itself and c_j is compared with rho (definition 5.1
//! takes c_N = 1); if rounding left the exact total of the f64 probabilities below rho, no
//! prefix qualifies and the whole positive support is kept (theorem 5.4.5's S_1). min-p is
//! invariant under renormalization, and p_max always survives top-k and top-p.
//!
//! **Exactness.** Every c_j is an [`ExactSum`], and every threshold (rho, rho * p(S_k),
//! min_p * p_max) is compared exactly, so example 5.6 gives {0, 1, 2} for rho = 0.9.
//!
//! **Cost.** The sampler does not sort the vocabulary. Tokens below a floor that provably lies
//! under the nucleus ((1 - rho) / 2N: the tokens below it carry at most (1 - rho) / 2 of the
//! mass) are never gathered, the gathered candidates are ordered chunk by chunk (select, then
//! sort) only as far as the cumulative sum needs, and top-k keeps a running cut while
//! scanning. If a floor turns out too high (the exact checks say so), the stage is redone
//! over every positive token, so the fast path never changes the result.

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

/// Rank keys of the tokens with `p_i >= floor` and `p_i > 0`, limited to the `top_k` best
/// when `top_k > 0`: the first min(top_k, |{p_i >= floor}|) tokens of the ranking, unordered.
fn gather(p: &[f64], floor: f64, top_k: usize, keys: &mut Vec<u128>) {
    // Compact to the top k whenever this many candidates are buffered: amortized O(1) per token.
    let compact_at = 2 * top_k + 256;
    let mut cut = floor.max(f64::from_bits(1));
    keys.clear();
    for (id, &prob) in p.iter().enumerate() {
        if prob >= cut {
            keys.push(rank_key(prob, id as u32));
            if top_k > 0 && keys.len() == compact_at {
                keep_best(keys, top_k);
                // Later tokens need at least the k-th probability (equal ones lose on id).
                cut = key_probability(keys[top_k - 1]).max(cut);
            }
        }
    }
    if top_k > 0 {
        keep_best(keys, top_k);
    }
}

/// The top-p prefix length k(rho) within `keys` (a prefix of the ranking, in any order) and its
/// exact mass c_k, or `None` if no prefix of `keys` reaches the threshold. The threshold is rho
/// or, when `renormalizer = Some(p(S))`, rho * p(S). Orders `keys[..k]` by rank, sorting only
/// chunks of growing size as far as the cumulative sum needs.
fn nucleus(keys: &mut [u128], rho: f64, renormalizer: Option<&ExactSum>) -> Option<(usize, ExactSum)> {
    let threshold = renormalizer.map_or(ExactSum::of(rho), |mass| mass.scaled_ceil(rho));
    let mut cumulative = ExactSum::ZERO;
    let (mut sorted, mut chunk) = (0, 64);
    while sorted < keys.len() {
        let end = (sorted + chunk).min(keys.len());
        if end < keys.len() {
            keys[sorted..].select_nth_unstable(end - sorted - 1);
        }
        keys[sorted..end].sort_unstable();
        for (j, &key) in keys.iter().enumerate().take(end).skip(sorted) {
            cumulative.add(key_probability(key));
            if cumulative >= threshold {
                return Some((j + 1, cumulative));
            }
        }
        (sorted, chunk) = (end, chunk * 2);
    }
    None
}

/// What truncation kept: the survivors S (as rank keys, left in [`Truncation::survivors`]'s
/// buffer) and their exact mass p(S).
pub(crate) struct Kept {
    /// p(S), exactly.
    pub mass: ExactSum,
    /// Whether any token of positive probability was removed.
    pub removed_any: bool,
}

/// The truncation stage of a sampler: settings plus the reusable candidate buffer.
#[derive(Clone, Debug)]
pub(crate) struct Truncation {
    top_k: usize,
    top_p: f64,
    min_p: f64,
    /// Candidates as rank keys; after [`Truncation::apply`] exactly the survivors S.
    /// Capacity `[vocab_size]`, reserved once.
    survivors: Vec<u128>,
}

impl Truncation {
    /// The truncation settings of a validated configuration.
    pub(crate) fn new(config: &SamplerConfig, vocab_size: usize) -> Self {
        Truncation {
            top_k: config.top_k,
            top_p: config.top_p,
            min_p: config.min_p,
            survivors: Vec::with_capacity(vocab_size),
        }
    }

    /// The survivors S of the last [`Truncation::apply`], as rank keys.
    pub(crate) fn survivors(&mut self) -> &mut Vec<u128> {
        &mut self.survivors
    }

    /// Runs top-k, then top-p, then min-p on the post-temperature distribution `p`, whose
    /// largest entry is `p_max`, and leaves the survivors in [`Truncation::survivors`].
    pub(crate) fn apply(&mut self, p: &[f64], p_max: f64) -> Kept {
        let positive = p.iter().filter(|&&x| x > 0.0).count();
        let min_p_cut = if self.min_p > 0.0 {
            // The smallest double >= min_p * p_max, so `p_i >= cut` is the exact test.
            ExactSum::of(p_max).scaled_ceil(self.min_p).to_f64_ceil()
        } else {
            0.0
        };
        let mut mass = if self.top_p < 1.0 {
            self.top_k_then_top_p(p, positive)
        } else {
            gather(p, min_p_cut, self.top_k, &mut self.survivors);
            mass_of(&self.survivors)
        };
        let before = self.survivors.len();
        self.survivors.retain(|&key| key_probability(key) >= min_p_cut);
        if self.survivors.len() < before {
            mass = mass_of(&self.survivors);
        }
        Kept { mass, removed_any: self.survivors.len() < positive }
    }

    /// top-k (if on) then top-p; returns p(S) of the survivors.
    fn top_k_then_top_p(&mut self, p: &[f64], positive: usize) -> ExactSum {
        let mut floor = (1.0 - self.top_p) / (2.0 * p.len() as f64);
        loop {
            gather(p, floor, self.top_k, &mut self.survivors);
            let everything = floor == 0.0;
            let k_set_complete = self.top_k == 0 || self.survivors.len() >= self.top_k.min(positive);
            if !everything && !k_set_complete {
                // S_k reaches below the floor, and top-p needs p(S_k).
                floor = 0.0;
                continue;
            }
            let renormalizer = (self.top_k > 0 && positive > self.top_k).then(|| mass_of(&self.survivors));
            match nucleus(&mut self.survivors, self.top_p, renormalizer.as_ref()) {
                Some((len, mass)) => {
                    self.survivors.truncate(len);
                    return mass;
                }
                None if everything => return renormalizer.unwrap_or_else(|| mass_of(&self.survivors)),
                None => floor = 0.0,
            }
        }
    }
}

/// Writes `q_i = p_i / p(S)` for every survivor into `q` (the other entries are untouched), with
/// p(S) rounded once to f64.
pub(crate) fn restrict_into(q: &mut [f64], survivors: &[u128], mass: &ExactSum) {
    let total = mass.to_f64();
    for &key in survivors {
        q[key_id(key) as usize] = key_probability(key) / total;
    }
}

/// Rank keys of every token of `p` (zero-probability ones too), after checking `p`.
fn all_keys(p: &[f64]) -> Result<Vec<u128>> {
    check_distribution(p)?;
    Ok(p.iter().enumerate().map(|(id, &prob)| rank_key(prob, id as u32)).collect())
}

/// The top-k set S^(k) = {pi(1), ..., pi(k)} of definition 5.1, in rank order (probability
/// descending, ties by ascending id). `k` must be >= 1; k >= N gives every token.
pub fn top_k_set(p: &[f64], k: usize) -> Result<Vec<u32>> {
    if k == 0 {
        return Err(Error::invalid_argument("k", "must be at least 1"));
    }
    let mut keys = all_keys(p)?;
    keep_best(&mut keys, k);
    keys.sort_unstable();
    Ok(keys.into_iter().map(key_id).collect())
}

/// The top-p set S_rho = {pi(1), ..., pi(k(rho))} of definition 5.1, in rank order, with the
/// cumulative sums c_j computed exactly (so example 5.6 gives {0, 1, 2} for rho = 0.9).
/// `top_p` must be in (0, 1]. If the exact total of `p` falls short of rho (rounding), the
/// positive support is returned (theorem 5.4.5).
pub fn top_p_set(p: &[f64], top_p: f64) -> Result<Vec<u32>> {
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(Error::invalid_argument("top_p", format!("must be in (0, 1], got {top_p}")));
    }
    let mut keys = all_keys(p)?;
    keys.retain(|&key| key_probability(key) > 0.0);
    // Without a qualifying prefix `nucleus` has ranked every positive token: keep them all.
    if let Some((len, _)) = nucleus(&mut keys, top_p, None) {
        keys.truncate(len);
    }
    Ok(keys.into_iter().map(key_id).collect())
}

/// The restriction p_S of definition 5.1: p_i / p(S) on S, 0 elsewhere (repeated ids count
/// once). p(S) is summed exactly and rounded once. Requires p(S) > 0.
pub fn restrict(p: &[f64], set: &[u32]) -> Result<Vec<f64>> {
    let mut keys = all_keys(p)?;
    let mut member = vec![false; p.len()];
    for &id in set {
        let slot = member.get_mut(id as usize).ok_or(Error::TokenOutOfRange {
            id: id as i64,
            vocab_size: p.len(),
        })?;
        *slot = true;
    }
    keys.retain(|&key| member[key_id(key) as usize]);
    let mass = mass_of(&keys);
    if mass == ExactSum::ZERO {
        return Err(Error::invalid_argument("S", "p(S) = 0: cannot condition on a null set"));
    }
    let mut q = vec![0.0; p.len()];
    restrict_into(&mut q, &keys, &mass);
    Ok(q)
}
