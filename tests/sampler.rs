//! The sampler pipeline: consistency with the free functions, faithfulness of the draws
//! (chi-square), statistics, determinism and validation.

use crate::toy;

use toy::TestRng;
use reprolm::error::Error;
use reprolm::sampling::{
    entropy, log_softmax, restrict, softmax, top_k_set, top_p_set, total_variation, LogprobsMode, Sampler,
    SamplerConfig,
};

/// The logits of docs/theory.md, "The sampler on one example" (with temperature 0.8).
const WORKED_EXAMPLE_LOGITS: [f32; 6] = [3.0, 2.5, 1.0, 0.2, -1.0, -2.0];

fn sampler(config: SamplerConfig, vocab: usize) -> Sampler {
    Sampler::new(config, vocab).unwrap()
}

fn to_f64(z: &[f32]) -> Vec<f64> {
    z.iter().map(|&v| v as f64).collect()
}

fn support(q: &[f64]) -> Vec<u32> {
    (0..q.len() as u32).filter(|&i| q[i as usize] > 0.0).collect()
}

fn sorted(mut ids: Vec<u32>) -> Vec<u32> {
    ids.sort_unstable();
    ids
}

#[test]
fn worked_example_at_temperature_0_8_and_top_p_0_95() {
    let config = SamplerConfig { temperature: 0.8, top_p: 0.95, ..SamplerConfig::default() };
    let q = sampler(config, 6).distribution(&WORKED_EXAMPLE_LOGITS, &[], 0).unwrap();
    let p = softmax(&to_f64(&WORKED_EXAMPLE_LOGITS), 0.8).unwrap();
    let round = |v: &[f64]| v.iter().map(|x| (x * 1e4).round() / 1e4).collect::<Vec<_>>();
    assert_eq!(round(&p), vec![0.6038, 0.3232, 0.0496, 0.0182, 0.0041, 0.0012]);
    assert_eq!(support(&q), vec![0, 1, 2]);
    assert_eq!(round(&q), vec![0.6183, 0.331, 0.0508, 0.0, 0.0, 0.0]);
    assert_eq!((total_variation(&p, &q).unwrap() * 1e4).round() / 1e4, 0.0235);
}

/// Upper 0.001 quantiles of the chi-square distribution with 1..=10 degrees of freedom.
const CHI_SQUARE_999: [f64; 10] = [10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588];

#[test]
fn draws_follow_q_by_chi_square_for_plain_top_k_top_p_and_min_p() {
    let base = SamplerConfig { temperature: 0.8, seed: 20261010, ..SamplerConfig::default() };
    let configs = [
        ("plain", base.clone()),
        ("top-k", SamplerConfig { top_k: 2, ..base.clone() }),
        ("top-p", SamplerConfig { top_p: 0.95, ..base.clone() }),
        ("min-p", SamplerConfig { min_p: 0.03, ..base.clone() }),
    ];
    let draws = 200_000;
    for (name, config) in configs {
        let mut s = sampler(config, 6);
        let q = s.distribution(&WORKED_EXAMPLE_LOGITS, &[], 0).unwrap();
        let mut counts = [0u64; 6];
        for step in 0..draws {
            counts[s.sample(&WORKED_EXAMPLE_LOGITS, &[], 0, step).unwrap().token as usize] += 1;
        }
        let support = support(&q);
        let chi_square: f64 = support
            .iter()
            .map(|&i| {
                let expected = q[i as usize] * draws as f64;
                (counts[i as usize] as f64 - expected).powi(2) / expected
            })
            .sum();
        let critical = CHI_SQUARE_999[support.len() - 2];
        assert!(chi_square < critical, "{name}: chi-square {chi_square} >= {critical}, counts {counts:?}, q {q:?}");
        assert_eq!(counts.iter().sum::<u64>(), draws);
        for i in 0..6 {
            if q[i] == 0.0 {
                assert_eq!(counts[i], 0, "{name}: token {i} is outside the support");
            }
        }
        assert!(support.len() >= 2, "{name}: the test should exercise a real distribution");
    }
}

/// Random logits of a given spread, with some ties.
fn random_logits(rng: &mut TestRng, vocab: usize, spread: f64) -> Vec<f32> {
    (0..vocab).map(|_| ((rng.normal() * spread * 8.0).round() / 8.0) as f32).collect()
}

/// The documented top-k then top-p set, from the free functions: top-p compares with rho on p
/// itself when top-k removed nothing, else on the renormalized survivors of top-k.
fn reference_set(p: &[f64], top_k: usize, top_p: f64) -> Vec<u32> {
    let positive = p.iter().filter(|&&x| x > 0.0).count();
    if top_k == 0 || top_k >= positive {
        return if top_p < 1.0 { top_p_set(p, top_p).unwrap() } else { (0..p.len() as u32).collect() };
    }
    let set = top_k_set(p, top_k).unwrap();
    if top_p < 1.0 {
        top_p_set(&restrict(p, &set).unwrap(), top_p).unwrap()
    } else {
        set
    }
}

#[test]
fn distribution_equals_the_free_functions_composed() {
    let mut rng = TestRng::new(61);
    for case in 0..300 {
        let vocab = [5, 50, 3000][case % 3];
        let z = random_logits(&mut rng, vocab, [0.5, 2.0, 5.0][case / 3 % 3]);
        let tau = rng.range(0.2, 2.0);
        let p = softmax(&to_f64(&z), tau).unwrap();
        let top_p = [0.3, 0.9, 0.95, 0.999, 1.0][rng.below(5)];
        let top_k = [0, 1, 2, 40, 2000][rng.below(5)];
        let config = SamplerConfig { temperature: tau, top_p, top_k, ..SamplerConfig::default() };
        let q = sampler(config, vocab).distribution(&z, &[], 0).unwrap();
        let set = reference_set(&p, top_k, top_p);
        assert_eq!(support(&q), sorted(set.clone()), "case {case}: vocab {vocab} top_k {top_k} top_p {top_p}");
        // Identical arithmetic, bit for bit: p itself when nothing was removed, else p_S.
        let expected = if support(&q).len() == support(&p).len() { p.clone() } else { restrict(&p, &set).unwrap() };
        assert_eq!(q, expected, "case {case}");
    }
}

#[test]
fn min_p_keeps_exactly_the_tokens_above_the_scaled_maximum() {
    let mut rng = TestRng::new(62);
    for case in 0..200 {
        let vocab = [10, 400][case % 2];
        let z = random_logits(&mut rng, vocab, 2.0);
        // Dyadic min_p makes min_p * p_max exact in f64, so the reference is a plain comparison.
        let min_p = [0.5, 0.125, 0.015625][rng.below(3)];
        let config = SamplerConfig { min_p, top_k: [0, 5][case % 2], ..SamplerConfig::default() };
        let q = sampler(config.clone(), vocab).distribution(&z, &[], 0).unwrap();
        let p = softmax(&to_f64(&z), 1.0).unwrap();
        let p_max = p.iter().copied().fold(0.0, f64::max);
        let mut expected: Vec<u32> = (0..vocab as u32).filter(|&i| p[i as usize] >= min_p * p_max).collect();
        if config.top_k > 0 {
            let top: Vec<u32> = top_k_set(&p, config.top_k).unwrap();
            expected.retain(|i| top.contains(i));
        }
        assert_eq!(support(&q), expected, "case {case}");
    }
}

#[test]
fn top_p_needs_every_token_when_the_mass_is_spread() {
    // Nearly uniform logits over a large vocabulary: the nucleus is most of it, and a top-k
    // larger than the gathered candidates forces the sampler off its fast path.
    let mut rng = TestRng::new(63);
    let vocab = 20_000;
    let z: Vec<f32> = (0..vocab).map(|_| rng.range(-0.1, 0.1) as f32).collect();
    let p = softmax(&to_f64(&z), 1.0).unwrap();
    for (top_k, top_p) in [(0, 0.95), (15_000, 0.95), (0, 1.0 - 1e-16), (3, 0.5)] {
        let config = SamplerConfig { top_k, top_p, ..SamplerConfig::default() };
        let q = sampler(config, vocab).distribution(&z, &[], 0).unwrap();
        assert_eq!(support(&q), sorted(reference_set(&p, top_k, top_p)), "top_k {top_k} top_p {top_p}");
    }
}

#[test]
fn top_k_reaching_below_the_top_p_floor_is_handled() {
    // A peaked distribution: a few likely tokens, thousands far below the top-p floor; a top-k
    // larger than the likely set needs those far tokens for p(S_k).
    let mut rng = TestRng::new(67);
    let vocab = 10_000;
    for case in 0..20 {
        let mut z: Vec<f32> = (0..vocab).map(|_| (rng.normal() - 30.0) as f32).collect();
        (0..5).for_each(|_| z[rng.below(vocab)] = rng.range(0.0, 4.0) as f32);
        let (top_k, top_p) = ([100, 7, 3][case % 3], [0.9, 0.99, 0.5][case % 3]);
        let config = SamplerConfig { top_k, top_p, ..SamplerConfig::default() };
        let q = sampler(config, vocab).distribution(&z, &[], 0).unwrap();
        let p = softmax(&to_f64(&z), 1.0).unwrap();
        assert_eq!(support(&q), sorted(reference_set(&p, top_k, top_p)), "case {case}");
    }
}

#[test]
fn selection_statistics_describe_q() {
    let mut rng = TestRng::new(64);
    for case in 0..100 {
        let vocab = 300;
        let z = random_logits(&mut rng, vocab, 2.5);
        let config = SamplerConfig {
            temperature: 0.9,
            top_p: [1.0, 0.8][case % 2],
            top_logprobs: 5,
            seed: case as u64,
            ..SamplerConfig::default()
        };
        let mut s = sampler(config, vocab);
        let q = s.distribution(&z, &[], 0).unwrap();
        let p = softmax(&to_f64(&z), 0.9).unwrap();
        let selection = s.sample(&z, &[], 0, 7).unwrap();
        assert!(q[selection.token as usize] > 0.0);
        assert_eq!(selection.logprob, q[selection.token as usize].ln());
        assert!((selection.entropy - entropy(&q).unwrap()).abs() < 1e-12);
        // Mass removed = 1 - p(S) = TV(p, q) (restriction is conditioning); exactly 0 when nothing is.
        let removed = total_variation(&p, &q).unwrap();
        assert!((selection.removed_mass - removed).abs() < 1e-14, "{} vs {removed}", selection.removed_mass);
        if case % 2 == 0 {
            assert_eq!(selection.removed_mass, 0.0);
        }
        // Alternatives: the five most probable tokens of q, in rank order.
        let mut ranked = top_k_set(&q, 5).unwrap();
        ranked.retain(|&i| q[i as usize] > 0.0); // fewer when q has fewer than 5 tokens
        let alternative_ids: Vec<u32> = selection.alternatives.iter().map(|a| a.0).collect();
        assert_eq!(alternative_ids, ranked);
        for &(id, logprob) in &selection.alternatives {
            assert_eq!(logprob, q[id as usize].ln());
        }
    }
}

#[test]
fn greedy_takes_the_lowest_id_argmax_and_ignores_truncation() {
    let z = [1.0, 4.0, -2.0, 4.0];
    let config = SamplerConfig { top_p: 0.1, top_k: 3, min_p: 0.5, top_logprobs: 3, ..SamplerConfig::greedy() };
    let mut s = sampler(config, 4);
    assert_eq!(s.distribution(&z, &[], 0).unwrap(), vec![0.0, 1.0, 0.0, 0.0]);
    let selection = s.sample(&z, &[], 0, 0).unwrap();
    assert_eq!((selection.token, selection.logprob, selection.entropy), (1, 0.0, 0.0));
    assert_eq!(selection.removed_mass, 0.0);
    assert_eq!(selection.alternatives, vec![(1, 0.0)]);
    // Temperature 0 with infinite and masked logits still works (no division anywhere).
    let mut masked = sampler(SamplerConfig { banned_token_ids: vec![1], ..SamplerConfig::greedy() }, 4);
    assert_eq!(masked.sample(&[f32::NEG_INFINITY, 4.0, -2.0, 4.0], &[], 0, 0).unwrap().token, 3);
}

#[test]
fn masks_restrict_to_the_allowed_set_as_conditioning() {
    let mut rng = TestRng::new(65);
    for _ in 0..100 {
        let vocab = 40;
        let z = random_logits(&mut rng, vocab, 2.0);
        let allowed: Vec<u32> = (0..vocab as u32).filter(|_| rng.below(3) > 0).chain([0]).collect();
        let banned = vec![allowed[rng.below(allowed.len())]];
        let config = SamplerConfig {
            allowed_token_ids: Some(allowed.clone()),
            banned_token_ids: banned.clone(),
            ..SamplerConfig::default()
        };
        let Ok(mut s) = Sampler::new(config, vocab) else {
            continue;
        }; // everything banned
        let q = s.distribution(&z, &[], 0).unwrap();
        let set: Vec<u32> = allowed.into_iter().filter(|i| !banned.contains(i)).collect();
        let expected = restrict(&softmax(&to_f64(&z), 1.0).unwrap(), &set).unwrap();
        for (a, b) in q.iter().zip(&expected) {
            assert!((a - b).abs() <= 2e-15 * b, "{a} vs {b}");
        }
    }
}

#[test]
fn penalties_and_bias_change_the_distribution_as_documented() {
    // Logits (2, -1, 0.5, 1); history: prompt [0, 1], generated [2, 2, 0].
    let z = [2.0f32, -1.0, 0.5, 1.0];
    let history = [0, 1, 2, 2, 0];
    let config = SamplerConfig {
        repetition_penalty: 2.0,
        penalty_window: Some(4), // [1, 2, 2, 0]: tokens 0, 1, 2
        presence_penalty: 0.25,
        frequency_penalty: 0.5,
        logit_bias: vec![(3, -1.5), (1, 0.75)],
        ..SamplerConfig::default()
    };
    let z64 = to_f64(&z);
    let adjusted = [
        z64[0] / 2.0 - 1.0 * 0.5 - 0.25, // token 0: repeated (positive: divided), generated once
        z64[1] * 2.0 + 0.75,             // token 1: repeated (negative: multiplied), biased
        z64[2] / 2.0 - 2.0 * 0.5 - 0.25, // token 2: repeated, generated twice
        z64[3] - 1.5,                    // token 3: biased
    ];
    let q = sampler(config, 4).distribution(&z, &history, 2).unwrap();
    assert_eq!(q, softmax(&adjusted, 1.0).unwrap());
}

#[test]
fn same_seed_same_draws_in_any_order_and_thread_count() {
    let mut rng = TestRng::new(66);
    let vocab = 1000;
    let steps: Vec<Vec<f32>> = (0..64).map(|_| random_logits(&mut rng, vocab, 2.0)).collect();
    let config = SamplerConfig { temperature: 0.9, top_p: 0.95, seed: 1234, ..SamplerConfig::default() };
    let run = |range: std::ops::Range<usize>| -> Vec<u32> {
        let mut s = sampler(config.clone(), vocab);
        range.map(|t| s.sample(&steps[t], &[], 0, t as u64).unwrap().token).collect()
    };
    let reference = run(0..64);
    for threads in [1, 2, 4] {
        let chunk = 64 / threads;
        let parts: Vec<Vec<u32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads).map(|i| scope.spawn(move || run(i * chunk..(i + 1) * chunk))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(parts.concat(), reference, "threads = {threads}");
    }
    // Steps in reverse order give the same draw per step.
    let mut s = sampler(config.clone(), vocab);
    let reversed: Vec<u32> = (0..64).rev().map(|t| s.sample(&steps[t], &[], 0, t as u64).unwrap().token).collect();
    assert_eq!(reversed.into_iter().rev().collect::<Vec<_>>(), reference);
    // Another seed gives other draws.
    let mut other = sampler(SamplerConfig { seed: 1235, ..config }, vocab);
    let different: Vec<u32> = (0..64).map(|t| other.sample(&steps[t], &[], 0, t as u64).unwrap().token).collect();
    assert_ne!(different, reference);
}

/// Asserts that `result` is an `InvalidArgument` naming `name`.
fn assert_names<T: std::fmt::Debug>(result: Result<T, Error>, name: &str) {
    match result {
        Err(Error::InvalidArgument { name: actual, .. }) => assert_eq!(actual, name),
        other => panic!("expected InvalidArgument for {name}, got {other:?}"),
    }
}

#[test]
fn every_invalid_setting_is_rejected_by_name() {
    let d = SamplerConfig::default;
    let cases: Vec<(SamplerConfig, &str)> = vec![
        (SamplerConfig { temperature: -0.5, ..d() }, "temperature"),
        (SamplerConfig { temperature: f64::NAN, ..d() }, "temperature"),
        (SamplerConfig { temperature: f64::INFINITY, ..d() }, "temperature"),
        (SamplerConfig { top_p: 0.0, ..d() }, "top_p"),
        (SamplerConfig { top_p: 1.5, ..d() }, "top_p"),
        (SamplerConfig { top_p: f64::NAN, ..d() }, "top_p"),
        (SamplerConfig { min_p: -0.1, ..d() }, "min_p"),
        (SamplerConfig { min_p: 1.1, ..d() }, "min_p"),
        (SamplerConfig { min_p: f64::NAN, ..d() }, "min_p"),
        (SamplerConfig { repetition_penalty: 0.0, ..d() }, "repetition_penalty"),
        (SamplerConfig { repetition_penalty: -1.0, ..d() }, "repetition_penalty"),
        (SamplerConfig { repetition_penalty: f64::NAN, ..d() }, "repetition_penalty"),
        (SamplerConfig { repetition_penalty: f64::INFINITY, ..d() }, "repetition_penalty"),
        (SamplerConfig { presence_penalty: f64::NAN, ..d() }, "presence_penalty"),
        (SamplerConfig { frequency_penalty: f64::NEG_INFINITY, ..d() }, "frequency_penalty"),
        (SamplerConfig { logit_bias: vec![(10, 1.0)], ..d() }, "logit_bias"),
        (SamplerConfig { logit_bias: vec![(1, f64::NAN)], ..d() }, "logit_bias"),
        (SamplerConfig { logit_bias: vec![(1, 1.0), (1, 2.0)], ..d() }, "logit_bias"),
        (SamplerConfig { allowed_token_ids: Some(vec![3, 10]), ..d() }, "allowed_token_ids"),
        (SamplerConfig { allowed_token_ids: Some(vec![]), ..d() }, "allowed_token_ids"),
        (
            SamplerConfig { allowed_token_ids: Some(vec![2, 3]), banned_token_ids: vec![3, 2], ..d() },
            "allowed_token_ids",
        ),
        (SamplerConfig { banned_token_ids: vec![99], ..d() }, "banned_token_ids"),
        (SamplerConfig { banned_token_ids: (0..10).collect(), ..d() }, "banned_token_ids"),
    ];
    for (config, name) in cases {
        assert_names(Sampler::new(config, 10), name);
    }
    assert_names(Sampler::new(d(), 0), "vocab_size");

    let mut s = sampler(d(), 3);
    assert_names(s.sample(&[0.0, 1.0], &[], 0, 0), "logits");
    assert_names(s.sample(&[0.0, f32::NAN, 1.0], &[], 0, 0), "logits");
    assert_names(s.sample(&[0.0, f32::INFINITY, 1.0], &[], 0, 0), "logits");
    assert_names(s.sample(&[f32::NEG_INFINITY; 3], &[], 0, 0), "logits");
    assert_names(s.distribution(&[0.0; 3], &[1, 2], 3), "n_prompt");
    assert!(matches!(s.sample(&[0.0; 3], &[1, 3], 1, 0), Err(Error::TokenOutOfRange { id: 3, vocab_size: 3 })));

    assert_names(softmax(&[1.0], -1.0), "temperature");
    assert_names(softmax(&[f64::NAN], 1.0), "z");
    assert_names(top_p_set(&[1.0], 0.0), "top_p");
    assert_names(top_p_set(&[0.5, 0.6], 0.5), "p");
    assert_names(top_k_set(&[1.0], 0), "k");
    assert_names(entropy(&[-0.5, 1.5]), "p");
    assert_names(total_variation(&[1.0], &[0.5, 0.5]), "q");
    assert_names(restrict(&[1.0, 0.0], &[1]), "S");
    assert!(matches!(restrict(&[1.0], &[4]), Err(Error::TokenOutOfRange { id: 4, vocab_size: 1 })));
}

#[test]
fn raw_logprobs_report_the_models_distribution_and_never_change_the_token() {
    let mut rng = TestRng::new(41);
    let vocab = 200;
    for case in 0..60 {
        let z = random_logits(&mut rng, vocab, 3.0);
        let history: Vec<u32> = (0..8).map(|_| rng.below(vocab) as u32).collect();
        let config = SamplerConfig {
            temperature: [0.0, 0.6, 1.3][case % 3],
            top_k: [0, 5][case % 2],
            repetition_penalty: 1.4,
            logit_bias: vec![(7, 2.5)],
            banned_token_ids: vec![(case % vocab) as u32],
            top_logprobs: 4,
            seed: case as u64,
            ..SamplerConfig::default()
        };
        let processed = sampler(config.clone(), vocab).sample(&z, &history, 4, 3).unwrap();
        let raw_config = SamplerConfig { logprobs_mode: LogprobsMode::Raw, ..config };
        let raw = sampler(raw_config, vocab).sample(&z, &history, 4, 3).unwrap();
        assert_eq!(raw.token, processed.token, "case {case}");
        assert_eq!((raw.entropy, raw.removed_mass), (processed.entropy, processed.removed_mass));
        // ln softmax(z) of the logits as given: no penalty, bias, mask, temperature or truncation
        let reference = log_softmax(&z).unwrap();
        assert_eq!(raw.logprob, reference[raw.token as usize]);
        let mut ranked: Vec<u32> = (0..vocab as u32).collect();
        ranked.sort_by(|&a, &b| reference[b as usize].total_cmp(&reference[a as usize]).then(a.cmp(&b)));
        let expected: Vec<(u32, f64)> = ranked[..4].iter().map(|&i| (i, reference[i as usize])).collect();
        assert_eq!(raw.alternatives, expected, "case {case}");
    }
    assert_eq!(LogprobsMode::from_name("raw").unwrap(), LogprobsMode::Raw);
    match LogprobsMode::from_name("softmax") {
        Err(Error::InvalidArgument { name, .. }) => assert_eq!(name, "logprobs_mode"),
        other => panic!("{other:?}"),
    }
}
