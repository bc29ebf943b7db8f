//! Batch invariance on the real model: rows of several sequences in one forward pass give the
//! bits of each sequence run alone, and the batch engine's requests give the tokens, log-
//! probabilities and texts of the single-sequence generator.

use crate::common;

use std::sync::Arc;

use reprolm::batch::{BatchEngine, BatchOptions, Event, Poll};
use reprolm::decode::stream::Generator;
use reprolm::decode::{Finish, GenerationSpec, StopConditions};
use reprolm::loaded_model::{LoadedModel, LoadOptions, Session};
use reprolm::kernels::{Isa, Precision};
use reprolm::model::{KvCache, LogitRows, Scratch, SeqInput};
use reprolm::sampling::SamplerConfig;
use reprolm::threads::ThreadPool;
use reprolm::Error;

/// Token ids for test prompts: `n` ids drawn from the vocabulary.
fn prompt(rng: &mut common::Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| (rng.next() % vocab as u64) as u32).collect()
}

#[test]
fn rows_of_several_sequences_have_the_bits_of_each_alone() {
    for precision in [Precision::Float32, Precision::Int8] {
        let isa = if precision == Precision::Int8 && !Isa::best().int8_available() { Isa::Avx2 } else { Isa::best() };
        if !isa.available() {
            continue;
        }
        let model = common::load_llama(isa, precision);
        let vocab = model.config.vocab_size;
        let mut rng = common::Rng(0x5eed);
        let prompts: Vec<Vec<u32>> = [1, 9, 33, 4].iter().map(|&n| prompt(&mut rng, n, vocab)).collect();
        // Alone: every position's logits of one pass over the whole prompt, one thread.
        let alone: Vec<Vec<f32>> =
            prompts.iter().map(|p| common::forward_logits(&model, 1, &[p], LogitRows::All)).collect();
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads).unwrap();
            let mut caches: Vec<KvCache> = prompts.iter().map(|_| KvCache::new(&model.config, 64).unwrap()).collect();
            let mut scratch = Scratch::default();
            let mut got: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
            // Passes that mix sequences at different offsets and chunk lengths: pass k takes
            // up to `quota[k % 3]` tokens of each unfinished sequence.
            let quota = [1, 5, 2];
            let mut k = 0;
            while caches.iter().zip(&prompts).any(|(c, p)| c.len() < p.len()) {
                let mut members = Vec::new();
                let mut inputs = Vec::new();
                for (i, (cache, p)) in caches.iter_mut().zip(&prompts).enumerate() {
                    let start = cache.len();
                    let n = (p.len() - start).min(quota[(k + i) % 3]);
                    if n > 0 {
                        members.push((i, n));
                        inputs.push(SeqInput { cache, tokens: &p[start..start + n], logits: LogitRows::All });
                    }
                }
                model.forward_batch(&pool, &mut scratch, &mut inputs).unwrap();
                let mut row = 0;
                for (i, n) in members {
                    got[i].extend_from_slice(&scratch.logits[row * vocab..(row + n) * vocab]);
                    row += n;
                }
                k += 1;
            }
            for (i, (a, b)) in alone.iter().zip(&got).enumerate() {
                assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "sequence {i}, {threads} threads, {precision:?}: batched logits differ from alone"
                );
            }
        }
    }
}

#[test]
fn forward_batch_checks_every_sequence_before_any_work() {
    let model = common::load_llama(Isa::best(), Precision::Float32);
    let pool = ThreadPool::new(1).unwrap();
    let mut a = KvCache::new(&model.config, 8).unwrap();
    let mut b = KvCache::new(&model.config, 2).unwrap();
    let mut scratch = Scratch::default();
    let err = model
        .forward_batch(
            &pool,
            &mut scratch,
            &mut [
                SeqInput { cache: &mut a, tokens: &[1, 2], logits: LogitRows::Last },
                SeqInput { cache: &mut b, tokens: &[1, 2, 3], logits: LogitRows::Last },
            ],
        )
        .unwrap_err();
    assert!(matches!(err, Error::ContextOverflow { requested: 3, allowed: 2 }), "{err:?}");
    assert_eq!((a.len(), b.len()), (0, 0), "nothing was appended");
}

fn loaded(threads: usize) -> Arc<LoadedModel> {
    let options = LoadOptions { threads: Some(threads), ..LoadOptions::default() };
    Arc::new(LoadedModel::load(common::model_path(), &options).expect("model loads"))
}

/// A request's events: (ids, logprobs, text, finish).
fn drain(handle: &reprolm::batch::RequestHandle) -> Result<(Vec<u32>, Vec<f64>, String, Finish), Error> {
    let (mut ids, mut logprobs, mut text) = (Vec::new(), Vec::new(), String::new());
    loop {
        match handle.next_event(None) {
            Poll::Event(Event::Token(step)) => {
                ids.push(step.selection.token);
                logprobs.push(step.selection.logprob);
                text.push_str(&step.text);
                if let Some(finish) = step.finish {
                    return Ok((ids, logprobs, text, finish));
                }
            }
            Poll::Event(Event::Finished(finish)) => return Ok((ids, logprobs, text, finish)),
            Poll::Event(Event::Error(e)) => return Err(e),
            Poll::Done | Poll::Pending => panic!("the stream ended without its last event"),
        }
    }
}

#[test]
fn the_batch_engine_gives_each_request_its_single_sequence_result() {
    let loaded = loaded(2);
    let vocab = loaded.config().vocab_size;
    let mut rng = common::Rng(42);
    let requests: Vec<GenerationSpec> = (0..10)
        .map(|i| {
            let sampler = match i % 3 {
                0 => SamplerConfig::greedy(),
                1 => SamplerConfig { temperature: 0.8, top_p: 0.9, seed: i as u64, ..SamplerConfig::default() },
                _ => SamplerConfig { temperature: 1.2, top_k: 40, seed: 7, ..SamplerConfig::default() },
            };
            let stop = StopConditions {
                max_tokens: [0, 3, 12, 20][i % 4],
                stop_strings: if i == 4 { vec!["e".into()] } else { Vec::new() },
                ..StopConditions::default()
            };
            let n = [1, 7, 40, 130][i % 4] + i;
            GenerationSpec::new(prompt(&mut rng, n, vocab), sampler, stop, vocab).unwrap()
        })
        .collect();
    let alone: Vec<_> = requests
        .iter()
        .map(|r| {
            let session = Session::new(Arc::clone(&loaded), r.positions_needed().max(1)).unwrap();
            let mut generator = Generator::new(session, r.clone()).unwrap();
            let (mut ids, mut logprobs, mut text) = (Vec::new(), Vec::new(), String::new());
            while let Some(step) = generator.next_step().unwrap() {
                ids.push(step.selection.token);
                logprobs.push(step.selection.logprob);
                text.push_str(&step.text);
            }
            (ids, logprobs, text, generator.finish().unwrap())
        })
        .collect();
    // Small passes, so that prompts are chunked and mixed with other sequences' decode rows.
    let options = BatchOptions { max_concurrent: 4, max_batch_tokens: 24, ..BatchOptions::defaults_for(&loaded) };
    for threads in [1, 3] {
        let batch = BatchEngine::new(Arc::clone(&self::loaded(threads)), options).unwrap();
        let handles: Vec<_> = requests.iter().map(|r| batch.submit(r.clone()).unwrap()).collect();
        for (i, (h, expected)) in handles.iter().zip(&alone).enumerate() {
            let got = drain(h).unwrap();
            assert_eq!(got.0, expected.0, "request {i}: ids");
            assert!(got.1.iter().zip(&expected.1).all(|(a, b)| a.to_bits() == b.to_bits()), "request {i}: logprobs");
            assert_eq!((&got.2, got.3), (&expected.2, expected.3), "request {i}: text and finish");
        }
    }
}

#[test]
fn cancelled_and_oversized_requests_fail_alone() {
    let loaded = loaded(2);
    let vocab = loaded.config().vocab_size;
    let options = BatchOptions { max_concurrent: 2, kv_memory: 300 * loaded.kv_bytes_per_position(reprolm::model::KvDtype::F32), ..BatchOptions::defaults_for(&loaded) };
    let batch = BatchEngine::new(Arc::clone(&loaded), options).unwrap();
    let request = |n: usize, max_tokens: usize| {
        let stop = StopConditions { max_tokens, ..StopConditions::default() };
        GenerationSpec::new(vec![1; n], SamplerConfig::greedy(), stop, vocab).unwrap()
    };
    // More than the whole cache memory: refused at once.
    // The pool holds whole blocks of 16 positions: 18 of them, 288 positions.
    assert!(matches!(batch.submit(request(200, 200)), Err(Error::ContextOverflow { requested: 400, allowed: 288 })));
    let long = batch.submit(request(100, 150)).unwrap();
    let cancelled = batch.submit(request(10, 100)).unwrap();
    let waiting = batch.submit(request(20, 100)).unwrap(); // waits for room (250 + 120 > 300)
    cancelled.cancel();
    assert!(matches!(drain(&cancelled), Err(Error::Cancelled)));
    let expected = {
        let mut session = Session::new(Arc::clone(&loaded), 120).unwrap();
        session.generate(request(20, 100)).unwrap().ids
    };
    assert_eq!(drain(&waiting).unwrap().0, expected);
    assert_eq!(drain(&long).unwrap().0.len(), 150);
}
