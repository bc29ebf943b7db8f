//! Decoding: greedy and narrow beams missing the most probable sequence on the toy models of
//! docs/theory.md, "Greedy decoding and beam search", beam width 1 = greedy, exhaustive beams =
//! brute force, EOS handling and the token loop.

use crate::toy;

use std::collections::HashMap;

use toy::{HashModel, TableModel, TestRng};
use reprolm::decode::{beam_search, generate, Finish, Generation, LanguageModel, GenerationSpec, StopConditions};
use reprolm::error::Error;
use reprolm::sampling::{log_softmax, Sampler, SamplerConfig};

const A: u32 = 0;
const B: u32 = 1;
const C: u32 = 2;

/// Greedy decoding misses the most probable sequence: V = {a, b}, n = 2.
fn greedy_counterexample() -> TableModel {
    let table = HashMap::from([(vec![], vec![0.6, 0.4]), (vec![A], vec![0.55, 0.45]), (vec![B], vec![0.9, 0.1])]);
    TableModel { vocab: 2, table }
}

/// Beam width 2 misses the most probable sequence: V = {a, b, c}, n = 2, B = 2.
fn beam_counterexample() -> TableModel {
    let table = HashMap::from([
        (vec![], vec![0.4, 0.35, 0.25]),
        (vec![A], vec![0.4, 0.3, 0.3]),
        (vec![B], vec![0.4, 0.3, 0.3]),
        (vec![C], vec![0.9, 0.05, 0.05]),
    ]);
    TableModel { vocab: 3, table }
}

/// [`generate`] of a request built from these arguments.
fn run_generate<M: LanguageModel + ?Sized>(
    model: &mut M,
    prompt: &[u32],
    sampler: &Sampler,
    max_tokens: usize,
    stop_token_ids: &[u32],
) -> Result<Generation, Error> {
    let stop = StopConditions { max_tokens, stop_token_ids: stop_token_ids.to_vec(), ..StopConditions::default() };
    generate(model, GenerationSpec::with_sampler(prompt.to_vec(), sampler.clone(), stop)?)
}

/// Greedy decoding of `max_tokens` tokens.
fn greedy(model: &mut impl LanguageModel, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let sampler = Sampler::new(SamplerConfig::greedy(), model.vocab_size()).unwrap();
    run_generate(model, prompt, &sampler, max_tokens, &[]).unwrap().ids
}

/// The most probable sequence of length n by enumeration (ties: lexicographically smallest),
/// with log-probabilities summed left to right in f64 like the beam search.
fn brute_force(model: &mut impl LanguageModel, prompt: &[u32], n: usize) -> (Vec<u32>, f64) {
    let vocab = model.vocab_size();
    let mut best: Option<(Vec<u32>, f64)> = None;
    for index in 0..vocab.pow(n as u32) {
        let sequence: Vec<u32> = (0..n).rev().map(|t| (index / vocab.pow(t as u32) % vocab) as u32).collect();
        let mut logprob = 0.0;
        for t in 0..n {
            let context = [prompt, &sequence[..t]].concat();
            logprob += log_softmax(&model.next_logits(&context).unwrap()).unwrap()[sequence[t] as usize];
        }
        if best.as_ref().is_none_or(|(_, b)| logprob > *b) {
            best = Some((sequence, logprob));
        }
    }
    best.unwrap()
}

#[test]
fn greedy_misses_the_most_probable_sequence() {
    let mut model = greedy_counterexample();
    assert_eq!(greedy(&mut model, &[0], 2), vec![A, A]);
    let (best, logprob) = brute_force(&mut model, &[0], 2);
    assert_eq!(best, vec![B, A]);
    assert!((logprob.exp() - 0.36).abs() < 1e-6);
    // B = 2 = |V|^(n-1) is exhaustive and finds ba; B = 1 is greedy.
    let beams = beam_search(&mut model, &[0], 2, 2, 0.0).unwrap();
    assert_eq!(beams.iter().map(|b| b.ids.clone()).collect::<Vec<_>>(), vec![vec![B, A], vec![A, A]]);
    assert!((beams[1].logprob.exp() - 0.33).abs() < 1e-6);
    assert_eq!(beam_search(&mut model, &[0], 1, 2, 0.0).unwrap()[0].ids, vec![A, A]);
}

#[test]
fn beam_width_2_misses_ca() {
    let mut model = beam_counterexample();
    assert_eq!(greedy(&mut model, &[0], 2), vec![A, A]);
    let narrow = beam_search(&mut model, &[0], 2, 2, 0.0).unwrap();
    assert_eq!(narrow[0].ids, vec![A, A]);
    assert!((narrow[0].logprob.exp() - 0.16).abs() < 1e-6);
    assert!(narrow.iter().all(|b| b.ids[0] != C), "c was pruned at step 1");
    let (best, logprob) = brute_force(&mut model, &[0], 2);
    assert_eq!(best, vec![C, A]);
    assert!((logprob.exp() - 0.225).abs() < 1e-6);
    // B = 3 = |V|^(n-1) finds it (an exhaustive width).
    assert_eq!(beam_search(&mut model, &[0], 3, 2, 0.0).unwrap()[0].ids, vec![C, A]);
}

#[test]
fn beam_width_1_is_greedy_on_random_models() {
    let mut rng = TestRng::new(31);
    for case in 0..200 {
        let vocab = 2 + rng.below(20);
        let eos = (case % 2 == 0).then(|| rng.below(vocab) as u32);
        let mut model = HashModel::new(vocab, eos, rng.next_u64());
        model.scale = rng.range(0.2, 4.0);
        let prompt = [rng.below(vocab) as u32];
        let max_tokens = rng.below(8);
        let beams = beam_search(&mut model, &prompt, 1, max_tokens, 0.0).unwrap();
        assert_eq!(beams.len(), 1);
        assert_eq!(beams[0].ids, greedy(&mut model, &prompt, max_tokens), "case {case}");
    }
}

#[test]
fn exhaustive_beam_width_finds_the_most_probable_sequence() {
    let mut rng = TestRng::new(33);
    for case in 0..150 {
        let vocab = 2 + rng.below(3);
        let n = 1 + rng.below(3);
        let mut model = HashModel::new(vocab, None, rng.next_u64());
        model.scale = rng.range(0.3, 3.0);
        let prompt = [rng.below(vocab) as u32, rng.below(vocab) as u32];
        let width = vocab.pow(n as u32 - 1) + rng.below(2);
        let beams = beam_search(&mut model, &prompt, width, n, 0.0).unwrap();
        let (best, logprob) = brute_force(&mut model, &prompt, n);
        assert_eq!((beams[0].ids.clone(), beams[0].logprob), (best, logprob), "case {case}");
        // Ranked by probability, every beam of length n, at most B of them.
        assert!(beams.len() <= width);
        assert!(beams.windows(2).all(|w| w[0].score >= w[1].score));
        assert!(beams.iter().all(|b| b.ids.len() == n && !b.finished && b.score == b.logprob));
    }
}

#[test]
fn beam_search_makes_at_most_n_times_b_model_calls() {
    let mut model = HashModel::new(50, None, 5);
    let (n, width) = (6, 3);
    beam_search(&mut model, &[1], width, n, 0.0).unwrap();
    // Each model call scores |V| candidates: n B |V| candidate probabilities in all.
    assert!(model.calls <= n * width, "{} calls", model.calls);
}

/// A model where EOS (id 0) is likely after two tokens: p(EOS | context) grows with length.
struct EndingModel;

impl LanguageModel for EndingModel {
    fn vocab_size(&self) -> usize {
        4
    }
    fn eos_id(&self) -> Option<u32> {
        Some(0)
    }
    fn next_logits(&mut self, context: &[u32]) -> reprolm::error::Result<Vec<f32>> {
        let generated = context.len() as f32 - 1.0;
        let last = *context.last().unwrap() as f32;
        Ok(vec![2.0 * generated - 3.0, 1.0 + 0.1 * last, 0.8, 0.5 - 0.2 * last])
    }
}

#[test]
fn finished_hypotheses_are_kept_aside_and_ranked_with_the_live_ones() {
    let beams = beam_search(&mut EndingModel, &[1], 3, 8, 0.0).unwrap();
    assert_eq!(beams.len(), 3);
    assert!(beams.iter().all(|b| b.finished && b.ids.last() == Some(&0)));
    assert!(beams.windows(2).all(|w| w[0].score > w[1].score || (w[0].score == w[1].score && w[0].ids < w[1].ids)));
    for beam in &beams {
        // The log-probability is the sum along the sequence.
        let mut context = vec![1];
        let mut logprob = 0.0;
        for &id in &beam.ids {
            logprob += log_softmax(&EndingModel.next_logits(&context).unwrap()).unwrap()[id as usize];
            context.push(id);
        }
        assert_eq!(beam.logprob, logprob);
    }
    // Greedy stops at EOS too, and width 1 agrees with it.
    let greedy_ids = greedy(&mut EndingModel, &[1], 8);
    assert_eq!(greedy_ids.last(), Some(&0));
    assert_eq!(beam_search(&mut EndingModel, &[1], 1, 8, 0.0).unwrap()[0].ids, greedy_ids);
}

#[test]
fn length_penalty_normalizes_scores() {
    let plain = beam_search(&mut EndingModel, &[1], 4, 8, 0.0).unwrap();
    let normalized = beam_search(&mut EndingModel, &[1], 4, 8, 1.0).unwrap();
    for beam in &normalized {
        assert_eq!(beam.score, beam.logprob / beam.ids.len() as f64);
    }
    // Dividing a negative log-probability by the length favours longer hypotheses, and a
    // negative exponent favours shorter ones.
    let shortened = beam_search(&mut EndingModel, &[1], 4, 8, -1.0).unwrap();
    assert_eq!(plain[0].ids, vec![1, 1, 0]);
    assert_eq!(normalized[0].ids, vec![1, 1, 1, 0]);
    assert_eq!(shortened[0].ids, vec![0]);
}

#[test]
fn generate_stops_on_eos_stop_tokens_or_length() {
    let mut model = EndingModel;
    let sampler = Sampler::new(SamplerConfig::greedy(), 4).unwrap();
    let run = run_generate(&mut model, &[1], &sampler, 20, &[]).unwrap();
    assert_eq!(run.finish, Finish::Eos);
    assert_eq!(run.ids.last(), Some(&0));
    assert_eq!(run.steps.len(), run.ids.len());
    let first = run.ids[0];
    let stopped = run_generate(&mut model, &[1], &sampler, 20, &[first]).unwrap();
    assert_eq!((stopped.ids, stopped.finish), (vec![first], Finish::StopToken(first)));
    let short = run_generate(&mut model, &[1], &sampler, 1, &[]).unwrap();
    assert_eq!((short.ids.len(), short.finish), (1, Finish::Length));
    let none = run_generate(&mut model, &[1], &sampler, 0, &[]).unwrap();
    assert_eq!((none.ids.len(), none.finish), (0, Finish::Length));
}

#[test]
fn generate_is_reproducible_and_seeded() {
    let config = SamplerConfig { temperature: 1.0, top_p: 0.9, seed: 99, ..SamplerConfig::default() };
    let run = |config: SamplerConfig| {
        let mut model = HashModel::new(200, None, 77);
        let sampler = Sampler::new(config, 200).unwrap();
        run_generate(&mut model, &[3, 4], &sampler, 40, &[]).unwrap()
    };
    let first = run(config.clone());
    assert_eq!(first, run(config.clone()));
    assert_ne!(first.ids, run(SamplerConfig { seed: 100, ..config }).ids);
}

#[test]
fn decoding_rejects_bad_arguments() {
    let mut model = HashModel::new(5, Some(4), 1);
    let sampler = Sampler::new(SamplerConfig::default(), 5).unwrap();
    assert!(matches!(run_generate(&mut model, &[], &sampler, 3, &[]), Err(Error::EmptyPrompt)));
    assert!(matches!(run_generate(&mut model, &[5], &sampler, 3, &[]), Err(Error::TokenOutOfRange { id: 5, .. })));
    let names = |result: Result<_, Error>| match result {
        Err(Error::InvalidArgument { name, .. }) => name,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert_eq!(names(run_generate(&mut model, &[1], &sampler, 3, &[9]).map(|_| ())), "stop_token_ids");
    let wrong = Sampler::new(SamplerConfig::default(), 6).unwrap();
    assert_eq!(names(run_generate(&mut model, &[1], &wrong, 3, &[]).map(|_| ())), "sampler");
    assert_eq!(names(beam_search(&mut model, &[1], 0, 3, 0.0).map(|_| ())), "beam_width");
    assert_eq!(names(beam_search(&mut model, &[1], 2, 3, f64::NAN).map(|_| ())), "length_penalty");
    assert!(matches!(beam_search(&mut model, &[], 2, 3, 0.0), Err(Error::EmptyPrompt)));
    model.eos = Some(7);
    assert_eq!(names(beam_search(&mut model, &[1], 2, 3, 0.0).map(|_| ())), "eos_id");
}
