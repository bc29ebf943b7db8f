//! Speculative decoding on the real model: greedy output identical to plain greedy decoding
//! (token ids, and the logits of every position bit for bit) with prompt lookup and with a
//! draft model, for k in {1, 2, 4, 8}; and the edge cases (stop strings, stop tokens and
//! end-of-sequence inside a draft, max_tokens below k, a nearly full context) behaving as
//! without speculation.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use reprolm::decode::speculative::{DraftLength, DraftModel, Drafter, PromptLookup, Speculation, SpeculationStats, Target};
use reprolm::decode::stream::Generator;
use reprolm::decode::{Finish, GenerationSpec, SequenceDecoder, Step, StopConditions};
use reprolm::loaded_model::{LoadedModel, LoadOptions, Session};
use reprolm::error::Result;
use reprolm::sampling::SamplerConfig;

fn engines() -> (Arc<LoadedModel>, Arc<LoadedModel>) {
    let target = LoadedModel::load(common::model_path(), &LoadOptions::default()).expect("model loads");
    let int8 = LoadOptions { precision: Some("int8".into()), ..LoadOptions::default() };
    let draft = LoadedModel::load(common::model_path(), &int8).expect("model loads at int8");
    (Arc::new(target), Arc::new(draft))
}

fn ids(loaded: &LoadedModel, text: &str) -> Vec<u32> {
    loaded.tokenizer.encode(text, true).unwrap()
}

/// Chat prompts whose answers copy from the prompt (prompt lookup finds drafts) or not.
fn prompts(loaded: &LoadedModel) -> Vec<Vec<u32>> {
    let chat = |q: &str| ids(loaded, &format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"));
    vec![
        chat("Repeat this sentence exactly: The quick brown fox jumps over the lazy dog, and the lazy dog sleeps."),
        chat("Fix the typo in this code:\ndef add(a, b):\n    retrun a + b\n\nprint(add(1, 2))"),
        ids(loaded, "The capital of France is"),
    ]
}

/// Records the logits row the decoder used at each context length.
struct Recording<'a> {
    session: &'a mut Session,
    rows: BTreeMap<usize, Vec<f32>>,
    vocab: usize,
}

impl Target for Recording<'_> {
    fn score(&mut self, context: &[u32], drafted: &[u32]) -> Result<Vec<f32>> {
        let logits = self.session.score(context, drafted)?;
        for (i, row) in logits.chunks_exact(self.vocab).enumerate() {
            self.rows.insert(context.len() + i, row.to_vec());
        }
        Ok(logits)
    }
}

/// Plain decoding: the ids and the logits after each context length.
fn plain(loaded: &Arc<LoadedModel>, request: GenerationSpec) -> (Vec<u32>, BTreeMap<usize, Vec<f32>>) {
    let mut session = Session::new(Arc::clone(loaded), request.positions_needed()).unwrap();
    let mut seq = SequenceDecoder::new(request, loaded.config().eos_id);
    let mut rows = BTreeMap::new();
    while seq.finish().is_none() {
        let logits = session.next_logits(seq.context()).unwrap().to_vec();
        rows.insert(seq.context().len(), logits.clone());
        seq.accept(&logits, None).unwrap();
    }
    (seq.generated().to_vec(), rows)
}

/// Speculative decoding with the product's driver: the ids, the logits row each position's
/// token was chosen from, and the statistics.
fn speculative(
    loaded: &Arc<LoadedModel>,
    request: GenerationSpec,
    drafter: Box<dyn Drafter>,
    k: usize,
) -> (Vec<u32>, BTreeMap<usize, Vec<f32>>, SpeculationStats) {
    let mut session = Session::new(Arc::clone(loaded), request.positions_needed()).unwrap();
    let vocab = loaded.config().vocab_size;
    let mut seq = SequenceDecoder::new(request, loaded.config().eos_id);
    let mut speculation = Speculation::new(drafter, DraftLength::new(k, false).unwrap());
    let mut target = Recording { session: &mut session, rows: BTreeMap::new(), vocab };
    let mut used = BTreeMap::new();
    while seq.finish().is_none() {
        let before = seq.context().len();
        let steps = speculation.round(&mut seq, &mut target, None).unwrap();
        for p in before..before + steps.len() {
            used.insert(p, target.rows[&p].clone());
        }
    }
    (seq.generated().to_vec(), used, speculation.stats())
}

fn greedy_request(loaded: &LoadedModel, prompt: &[u32], max_tokens: usize) -> GenerationSpec {
    let stop = StopConditions { max_tokens, ..StopConditions::default() };
    GenerationSpec::new(prompt.to_vec(), SamplerConfig::greedy(), stop, loaded.config().vocab_size).unwrap()
}

fn draft_model(draft: &Arc<LoadedModel>, request: &GenerationSpec) -> Box<dyn Drafter> {
    let session = Session::new(Arc::clone(draft), request.positions_needed() + 1).unwrap();
    Box::new(DraftModel::new(session, &request.sampler, draft.config().eos_id).unwrap())
}

#[test]
fn greedy_speculation_gives_plain_greedy_ids_and_logits_bit_for_bit() {
    let (loaded, draft) = engines();
    let mut accepted = [0u64; 2];
    for prompt in prompts(&loaded) {
        let (want_ids, want_rows) = plain(&loaded, greedy_request(&loaded, &prompt, 24));
        for k in [1, 2, 4, 8] {
            let drafters: [(&str, Box<dyn Drafter>); 2] = [
                ("lookup", Box::new(PromptLookup::new(1, 3).unwrap())),
                ("draft model", draft_model(&draft, &greedy_request(&loaded, &prompt, 24))),
            ];
            for (d, (name, drafter)) in drafters.into_iter().enumerate() {
                let (ids, rows, stats) = speculative(&loaded, greedy_request(&loaded, &prompt, 24), drafter, k);
                assert_eq!(ids, want_ids, "{name}, k = {k}");
                assert_eq!(rows.len(), want_rows.len());
                for (p, row) in &rows {
                    let want = &want_rows[p];
                    assert!(row.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}, k = {k}, position {p}");
                }
                assert!(stats.passes <= ids.len() as u64);
                accepted[d] += stats.accepted;
            }
        }
    }
    // The drafts were verified, not ignored: both drafters had drafts accepted.
    assert!(accepted.iter().all(|&a| a > 20), "accepted drafts: {accepted:?}");
}

/// Runs `request` on a session of `capacity` positions through the streaming generator, with
/// or without speculation: the steps and the statistics.
fn stream(loaded: &Arc<LoadedModel>, request: GenerationSpec, capacity: usize, speculation: Option<Speculation<'static>>) -> (Vec<Step>, Option<SpeculationStats>) {
    let session = Session::new(Arc::clone(loaded), capacity).unwrap();
    let mut generator = Generator::new(session, request).unwrap();
    if let Some(s) = speculation {
        generator.speculate(s).unwrap();
    }
    let mut steps = Vec::new();
    while let Some(step) = generator.next_step().unwrap() {
        steps.push(step);
    }
    (steps, generator.speculation_stats())
}

fn lookup(k: usize) -> Speculation<'static> {
    Speculation::new(Box::new(PromptLookup::new(1, 3).unwrap()), DraftLength::new(k, false).unwrap())
}

/// A prompt whose greedy answer copies it: lookup drafts long runs.
fn copying_prompt(loaded: &LoadedModel) -> Vec<u32> {
    prompts(loaded).swap_remove(0)
}

fn request_with(loaded: &LoadedModel, prompt: &[u32], stop: StopConditions) -> GenerationSpec {
    GenerationSpec::new(prompt.to_vec(), SamplerConfig::greedy(), stop, loaded.config().vocab_size).unwrap()
}

#[test]
fn edge_cases_behave_as_without_speculation() {
    let (loaded, draft) = engines();
    let prompt = copying_prompt(&loaded);
    let (reference, _) = stream(&loaded, request_with(&loaded, &prompt, StopConditions { max_tokens: 40, ..Default::default() }), 512, None);
    let text: String = reference.iter().map(|s| s.text.as_str()).collect();
    assert!(text.contains("lazy dog"), "{text:?}");
    let same = |stop: StopConditions, capacity: usize, k: usize| {
        let (want, _) = stream(&loaded, request_with(&loaded, &prompt, stop.clone()), capacity, None);
        let (got, stats) = stream(&loaded, request_with(&loaded, &prompt, stop), capacity, Some(lookup(k)));
        assert_eq!(got, want);
        (got, stats.unwrap())
    };

    // A stop string inside a draft: the copied sentence is drafted in long runs.
    let stop = StopConditions { max_tokens: 40, stop_strings: vec!["lazy dog".into()], ..Default::default() };
    let (steps, stats) = same(stop, 512, 8);
    assert!(matches!(steps.last().unwrap().finish, Some(Finish::StopString(0))));
    assert!(stats.drafted > stats.accepted, "a draft ran past the stop string: {stats:?}");

    // A stop token inside a draft: the token of " lazy".
    let lazy = reference[reference.iter().position(|s| s.text.contains("lazy")).unwrap()].selection.token;
    let stop = StopConditions { max_tokens: 40, stop_token_ids: vec![lazy], ..Default::default() };
    let (steps, stats) = same(stop, 512, 8);
    assert_eq!(steps.last().unwrap().finish, Some(Finish::StopToken(lazy)));
    assert!(stats.drafted > stats.accepted, "{stats:?}");

    // max_tokens below k: at most max_tokens - 1 drafts are fed.
    for max_tokens in [1, 2, 3] {
        let (steps, _) = same(StopConditions { max_tokens, ..Default::default() }, 512, 8);
        assert_eq!(steps.len(), max_tokens);
    }

    // A nearly full context: the cache holds exactly prompt + max_tokens positions.
    let max_tokens = 9;
    let (steps, stats) = same(StopConditions { max_tokens, ..Default::default() }, prompt.len() + max_tokens, 8);
    assert_eq!((steps.len(), steps.last().unwrap().finish), (max_tokens, Some(Finish::Length)));
    assert!(stats.accepted >= 4, "{stats:?}");

    // End-of-sequence inside a draft: the answer ends, and the draft model drafts its end.
    let short = prompt;
    let stop = StopConditions { max_tokens: 64, ..Default::default() };
    let (want, _) = stream(&loaded, request_with(&loaded, &short, stop.clone()), 512, None);
    assert_eq!(want.last().unwrap().finish, Some(Finish::Eos));
    let request = request_with(&loaded, &short, stop);
    let drafter = draft_model(&draft, &request);
    let (got, stats) = stream(&loaded, request, 512, Some(Speculation::new(drafter, DraftLength::new(8, false).unwrap())));
    assert_eq!(got, want);
    assert!(stats.unwrap().accepted > 0);
}

#[test]
fn sampling_with_a_draft_model_is_reproducible_and_independent_of_k() {
    let (loaded, draft) = engines();
    let prompt = prompts(&loaded).swap_remove(1);
    let config = SamplerConfig { temperature: 0.7, top_p: 0.95, seed: 11, ..SamplerConfig::default() };
    let request = || {
        let stop = StopConditions { max_tokens: 20, ..Default::default() };
        GenerationSpec::new(prompt.clone(), config.clone(), stop, loaded.config().vocab_size).unwrap()
    };
    let runs: Vec<Vec<Step>> = [(1, false), (4, false), (8, true)]
        .iter()
        .map(|&(k, adaptive)| {
            let drafter = draft_model(&draft, &request());
            stream(&loaded, request(), 512, Some(Speculation::new(drafter, DraftLength::new(k, adaptive).unwrap()))).0
        })
        .collect();
    assert!(runs.iter().all(|r| r == &runs[0]));
    // Prompt lookup's drafts are point masses: sampled output is plain sampling's.
    let (want, _) = stream(&loaded, request(), 512, None);
    let (got, _) = stream(&loaded, request(), 512, Some(lookup(4)));
    assert_eq!(got, want);
}

#[test]
fn sliding_window_sessions_refuse_speculation() {
    let (loaded, _) = engines();
    let options = reprolm::loaded_model::SessionOptions {
        context_length: Some(64),
        overflow: reprolm::model::Overflow::SlidingWindow { n_keep: 4 },
        ..Default::default()
    };
    let session = Session::with_options(Arc::clone(&loaded), &options).unwrap();
    let request = greedy_request(&loaded, &[1, 2, 3], 8);
    let mut generator = Generator::new(session, request).unwrap();
    assert!(matches!(generator.speculate(lookup(4)), Err(reprolm::Error::InvalidArgument { .. })));
}
