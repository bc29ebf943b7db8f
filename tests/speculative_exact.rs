//! Speculative sampling is exact in distribution: with toy target and draft models of known
//! distributions, the sequences generated over 200,000 seeds pass a chi-square test against
//! the target's exact sequence distribution (from the sampler pipeline's final q), for
//! drafters that are close, that have support the target lacks (top-k / top-p truncation), and
//! that are always wrong; and a deliberately wrong acceptance rule fails the same test.

use reprolm::decode::speculative::{self, Draft, DraftLength, DraftModel, Drafter, PromptLookup, Speculation};
use reprolm::decode::{LanguageModel, GenerationSpec, SequenceDecoder, StopConditions};
use reprolm::error::Result;
use reprolm::sampling::rng::{uniform_for, Purpose};
use reprolm::sampling::speculative::{draw_proportional, verify_draft};
use reprolm::sampling::{Sampler, SamplerConfig};

const VOCAB: usize = 4;
const LENGTH: usize = 3;
const RUNS: u64 = 200_000;

/// Logits that depend on the last token of the context and the context length: a small
/// Markov chain, so every sequence of `LENGTH` tokens has a known probability.
#[derive(Clone)]
struct Chain {
    /// `[position][last token][VOCAB]` logits.
    logits: Vec<[[f32; VOCAB]; VOCAB]>,
}

impl LanguageModel for Chain {
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn eos_id(&self) -> Option<u32> {
        None
    }
    fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>> {
        let position = (context.len() - 1).min(self.logits.len() - 1);
        Ok(self.logits[position][*context.last().unwrap() as usize].to_vec())
    }
}

fn chain(seed: u64, scale: f64) -> Chain {
    let mut n = 0;
    let mut next = || {
        n += 1;
        ((uniform_for(seed, n, Purpose::Select) - 0.5) * scale) as f32
    };
    Chain { logits: (0..LENGTH).map(|_| [(); VOCAB].map(|_| [(); VOCAB].map(|_| next()))).collect() }
}

/// A draft model that is always wrong: all its mass on `token`.
fn always(token: usize) -> Chain {
    let mut row = [f32::NEG_INFINITY; VOCAB];
    row[token] = 0.0;
    Chain { logits: vec![[row; VOCAB]; LENGTH] }
}

fn index(ids: &[u32]) -> usize {
    ids.iter().fold(0, |i, &t| i * VOCAB + t as usize)
}

/// The exact probability of every sequence under plain sampling of `target` with `config`:
/// the product of the final distributions q the sampler pipeline gives at each step.
fn exact(target: &mut Chain, config: &SamplerConfig, prompt: &[u32]) -> Vec<f64> {
    let mut sampler = Sampler::new(config.clone(), VOCAB).unwrap();
    let mut probs = vec![0.0; VOCAB.pow(LENGTH as u32)];
    for (i, p) in probs.iter_mut().enumerate() {
        let ids: Vec<u32> = (0..LENGTH).rev().map(|d| (i / VOCAB.pow(d as u32) % VOCAB) as u32).collect();
        let mut context = prompt.to_vec();
        *p = 1.0;
        for &t in &ids {
            let q = sampler.distribution(&target.next_logits(&context).unwrap(), &context, prompt.len()).unwrap();
            *p *= q[t as usize];
            context.push(t);
        }
    }
    probs
}

/// Pearson's chi-square statistic of `counts` against `probs` over the cells with expected
/// count >= 5 (the others pooled into one cell), and whether it is below the 1 - 1e-6 quantile
/// (Wilson-Hilferty). A sequence of probability 0 that occurs fails at once.
fn chi_square_passes(counts: &[u64], probs: &[f64]) -> (bool, f64) {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut cells, mut pooled_count, mut pooled_expected) = (0.0, 0usize, 0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        if p == 0.0 {
            if c > 0 {
                return (false, f64::INFINITY);
            }
            continue;
        }
        let expected = p * n as f64;
        if expected < 5.0 {
            pooled_count += c as f64;
            pooled_expected += expected;
        } else {
            stat += (c as f64 - expected).powi(2) / expected;
            cells += 1;
        }
    }
    if pooled_expected > 0.0 {
        stat += (pooled_count - pooled_expected).powi(2) / pooled_expected;
        cells += 1;
    }
    let dof = (cells - 1) as f64;
    let z = 4.753; // the standard normal's 1 - 1e-6 quantile
    let h = 2.0 / (9.0 * dof);
    let critical = dof * (1.0 - h + z * h.sqrt()).powi(3);
    (stat < critical, stat / critical)
}

fn request(config: &SamplerConfig, seed: u64, prompt: &[u32]) -> GenerationSpec {
    let stop = StopConditions { max_tokens: LENGTH, ..StopConditions::default() };
    GenerationSpec::new(prompt.to_vec(), SamplerConfig { seed, ..config.clone() }, stop, VOCAB).unwrap()
}

fn configs() -> Vec<(&'static str, SamplerConfig)> {
    let base = SamplerConfig { temperature: 1.0, ..SamplerConfig::default() };
    vec![
        ("plain", base.clone()),
        ("temperature 0.7, top-k 2", SamplerConfig { temperature: 0.7, top_k: 2, ..base.clone() }),
        ("top-p 0.8, presence penalty", SamplerConfig { top_p: 0.8, presence_penalty: 0.7, ..base }),
    ]
}

/// The product's driver over `RUNS` seeds: the counts of every generated sequence.
fn sample_sequences(target: &Chain, drafter: impl Fn(&Sampler) -> Box<dyn Drafter>, config: &SamplerConfig, k: usize, prompt: &[u32]) -> Vec<u64> {
    let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];
    let mut target = target.clone();
    for seed in 0..RUNS {
        let request = request(config, seed, prompt);
        let mut speculation = Speculation::new(drafter(&request.sampler), DraftLength::new(k, false).unwrap());
        let generation = speculative::generate(&mut target, request, &mut speculation).unwrap();
        counts[index(&generation.ids)] += 1;
    }
    counts
}

#[test]
fn speculative_sampling_with_a_draft_model_is_exact_in_distribution() {
    let target = chain(1, 4.0);
    let prompt = [2u32];
    let drafters: Vec<(&str, Chain)> =
        vec![("close", chain(1, 3.0)), ("unrelated", chain(7, 6.0)), ("always wrong (token 3)", always(3))];
    for (name, config) in configs() {
        let probs = exact(&mut target.clone(), &config, &prompt);
        for (d, (drafter_name, draft)) in drafters.iter().enumerate() {
            // k = 1 and k = 2, alternating, cover every row of a pass.
            let k = 1 + d % 2;
            let counts = sample_sequences(
                &target,
                |sampler| Box::new(DraftModel::new(draft.clone(), sampler, None).unwrap()),
                &config,
                k,
                &prompt,
            );
            let (passes, ratio) = chi_square_passes(&counts, &probs);
            assert!(passes, "{name}, drafter {drafter_name}, k {k}: chi-square / critical = {ratio:.2}");
        }
    }
}

#[test]
fn speculative_sampling_with_prompt_lookup_is_plain_sampling() {
    // A prompt that repeats, so lookup drafts at every step; its drafts are point masses,
    // verified by the target's own draw: the same sequence as plain sampling for every seed.
    let target = chain(3, 4.0);
    let prompt = [0u32, 1, 2, 0, 1, 2, 0, 1];
    let (_, config) = &configs()[1];
    let probs = exact(&mut target.clone(), config, &prompt);
    let counts = sample_sequences(&target, |_| Box::new(PromptLookup::new(1, 3).unwrap()), config, 4, &prompt);
    assert!(chi_square_passes(&counts, &probs).0);
    let mut t = target.clone();
    for seed in 0..200 {
        let plain = reprolm::decode::generate(&mut t, request(config, seed, &prompt)).unwrap();
        let mut speculation = Speculation::new(Box::new(PromptLookup::new(1, 3).unwrap()), DraftLength::new(4, true).unwrap());
        let fast = speculative::generate(&mut t, request(config, seed, &prompt), &mut speculation).unwrap();
        assert_eq!(plain, fast);
    }
}

/// An acceptance rule: (q, r, drafted, u_accept, u_residual) -> token.
type Rule = fn(&[f64], &[f64], u32, f64, f64) -> u32;

/// Accepts as it should, but on rejection draws from q instead of the residual: biased
/// towards the drafted tokens.
fn wrong_rule(q: &[f64], r: &[f64], drafted: u32, u_accept: f64, u_residual: f64) -> u32 {
    if u_accept * r[drafted as usize] < q[drafted as usize] {
        return drafted;
    }
    draw_proportional(q.iter().copied(), u_residual).unwrap()
}

/// Speculative sampling one position at a time with `rule`, the drafts drawn as the product's
/// draft model draws them.
fn sample_with_rule(target: &Chain, draft: &Chain, config: &SamplerConfig, prompt: &[u32], rule: Rule) -> Vec<u64> {
    let (mut target, mut draft) = (target.clone(), draft.clone());
    let mut counts = vec![0u64; VOCAB.pow(LENGTH as u32)];
    let mut q_sampler = Sampler::new(config.clone(), VOCAB).unwrap();
    let mut r_sampler = q_sampler.clone();
    for seed in 0..RUNS {
        let mut context = prompt.to_vec();
        for t in 0..LENGTH as u64 {
            let r = r_sampler.distribution(&draft.next_logits(&context).unwrap(), &context, prompt.len()).unwrap();
            let x = draw_proportional(r.iter().copied(), uniform_for(seed, t, Purpose::Draft)).unwrap();
            let q = q_sampler.distribution(&target.next_logits(&context).unwrap(), &context, prompt.len()).unwrap();
            let y = rule(&q, &r, x, uniform_for(seed, t, Purpose::Accept), uniform_for(seed, t, Purpose::Residual));
            context.push(y);
        }
        counts[index(&context[prompt.len()..])] += 1;
    }
    counts
}

#[test]
fn the_acceptance_rule_passes_and_a_wrong_one_fails() {
    let target = chain(1, 4.0);
    let draft = chain(7, 6.0);
    let prompt = [2u32];
    let (_, config) = &configs()[0];
    let probs = exact(&mut target.clone(), config, &prompt);
    let right = sample_with_rule(&target, &draft, config, &prompt, verify_draft);
    assert!(chi_square_passes(&right, &probs).0);
    let (passes, ratio) = chi_square_passes(&sample_with_rule(&target, &draft, config, &prompt, wrong_rule), &probs);
    assert!(!passes && ratio > 10.0, "the wrong rule passed: chi-square / critical = {ratio:.2}");
}

#[test]
fn sampled_tokens_do_not_depend_on_k() {
    // Every position is decided by its own draws (draft, accept, residual) whatever k is, so
    // one seed gives one sequence for k = 1..8, fixed or adaptive.
    let target = chain(1, 4.0);
    let draft = chain(1, 3.0);
    let prompt = [2u32];
    let (_, config) = &configs()[1];
    let mut t = target.clone();
    for seed in 0..300 {
        let runs: Vec<Vec<u32>> = [(1, false), (2, false), (3, true), (8, false), (8, true)]
            .iter()
            .map(|&(k, adaptive)| {
                let request = request(config, seed, &prompt);
                let drafter = DraftModel::new(draft.clone(), &request.sampler, None).unwrap();
                let mut speculation = Speculation::new(Box::new(drafter), DraftLength::new(k, adaptive).unwrap());
                speculative::generate(&mut t, request, &mut speculation).unwrap().ids
            })
            .collect();
        assert!(runs.iter().all(|ids| ids == &runs[0]), "seed {seed}: {runs:?}");
    }
}

/// A drafter whose draft claims a distribution in which the drafted token is impossible.
struct Liar;

impl Drafter for Liar {
    fn propose(&mut self, _seq: &SequenceDecoder, n: usize) -> Result<Draft> {
        let r = vec![1.0, 0.0, 0.0, 0.0];
        Ok(Draft { tokens: vec![1; n], distributions: vec![r; n] })
    }
    fn draws_from_distributions(&self, _seq: &SequenceDecoder) -> bool {
        true
    }
}

#[test]
fn inconsistent_drafts_and_draft_models_are_refused() {
    let mut target = chain(1, 4.0);
    let (_, config) = &configs()[0];
    let mut speculation = Speculation::new(Box::new(Liar), DraftLength::new(2, false).unwrap());
    let e = speculative::generate(&mut target, request(config, 0, &[1]), &mut speculation).unwrap_err();
    assert!(matches!(e, reprolm::Error::InvalidArgument { .. }), "{e}");
    let sampler = Sampler::new(config.clone(), VOCAB + 1).unwrap();
    assert!(DraftModel::new(target.clone(), &sampler, None).is_err());
    let sampler = Sampler::new(config.clone(), VOCAB).unwrap();
    assert!(DraftModel::new(target, &sampler, Some(0)).is_err());
    assert!(DraftLength::new(0, true).is_err());
}

/// A point-mass drafter that always proposes token 1.
struct Ones;

impl Drafter for Ones {
    fn propose(&mut self, _seq: &SequenceDecoder, n: usize) -> Result<Draft> {
        Ok(Draft { tokens: vec![1; n], distributions: Vec::new() })
    }
    fn draws_from_distributions(&self, _seq: &SequenceDecoder) -> bool {
        false
    }
}

#[test]
fn adaptive_drafting_pauses_a_drafter_that_keeps_failing() {
    // The target only ever emits token 0: every draft is rejected at once.
    let mut target = always(0);
    let stop = StopConditions { max_tokens: 40, ..StopConditions::default() };
    let request = || GenerationSpec::new(vec![2], SamplerConfig::greedy(), stop.clone(), VOCAB).unwrap();
    let plain = reprolm::decode::generate(&mut target, request()).unwrap();
    for (adaptive, most_drafting) in [(false, 40), (true, 10)] {
        let mut speculation = Speculation::new(Box::new(Ones), DraftLength::new(4, adaptive).unwrap());
        let fast = speculative::generate(&mut target, request(), &mut speculation).unwrap();
        assert_eq!(fast, plain);
        let stats = speculation.stats();
        assert_eq!((stats.accepted, stats.passes), (0, 40));
        assert!(stats.drafting_passes <= most_drafting, "{stats:?}");
        if adaptive {
            assert!(stats.drafting_passes >= 4, "drafting resumes after each pause: {stats:?}");
        }
    }
}
