//! Constrained decoding in the Rust API: the grammar mask is the sampler's restriction (the
//! same bits as `allowed_token_ids` with the same set), the token trie is the tokenizer's own
//! bytes, and every driver follows the grammar.

use std::sync::Arc;

use crate::common;
use crate::toy::TestRng;
use reprolm::batch::{BatchEngine, BatchOptions, Event, Poll};
use reprolm::decode::stream::Generator;
use reprolm::decode::{GenerationSpec, StopConditions};
use reprolm::loaded_model::{LoadedModel, LoadOptions, Session};
use reprolm::error::Error;
use reprolm::grammar::{Grammar, GrammarSpec, GrammarVocabulary};
use reprolm::sampling::{Sampler, SamplerConfig};

fn loaded() -> Arc<LoadedModel> {
    Arc::new(LoadedModel::load(common::model_path(), &LoadOptions::default()).expect("model loads"))
}

#[test]
fn a_bit_mask_restricts_exactly_like_allowed_token_ids() {
    let vocab: usize = 300;
    let mut rng = TestRng::new(5);
    for trial in 0..40 {
        let logits: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 3.0) as f32).collect();
        let allowed: Vec<u32> = (0..vocab as u32).filter(|_| rng.unit() < 0.3).collect();
        let mut bits = vec![0u32; vocab.div_ceil(32)];
        allowed.iter().for_each(|&id| bits[id as usize / 32] |= 1 << (id % 32));
        let config = SamplerConfig { temperature: 0.8, top_k: 20, top_p: 0.9, seed: trial, top_logprobs: 5, ..Default::default() };
        let with_ids = SamplerConfig { allowed_token_ids: Some(allowed.clone()), ..config.clone() };
        let mut masked = Sampler::new(config, vocab).unwrap();
        let mut listed = Sampler::new(with_ids, vocab).unwrap();
        assert_eq!(
            masked.distribution_restricted(&logits, &[1], 1, Some(&bits)).unwrap(),
            listed.distribution(&logits, &[1], 1).unwrap()
        );
        assert_eq!(
            masked.sample_restricted(&logits, &[1], 1, trial, Some(&bits)).unwrap(),
            listed.sample(&logits, &[1], 1, trial).unwrap()
        );
    }
}

#[test]
fn the_trie_holds_each_tokens_exact_bytes_and_no_special_token_as_text() {
    let loaded = loaded();
    let tokenizer = &loaded.tokenizer;
    // Each single token's bytes, as a one-string choice: the first step's S holds the token
    // itself (the grammar sees the same bytes as the tokenizer).
    for id in [17u32, 260, 1000, 12345, 49151] {
        let text = String::from_utf8(tokenizer.token_bytes(id).unwrap().to_vec()).unwrap();
        let grammar = loaded.compile_grammar(&GrammarSpec::Choice(vec![text.clone()])).unwrap();
        let allowed = grammar.start().allowed_ids().unwrap();
        assert!(allowed.contains(&id), "token {id} ({text:?}) not allowed: {allowed:?}");
    }
    // A special token's text is not that token under a grammar.
    let im_end = loaded.config().eos_id.unwrap();
    let text = String::from_utf8(tokenizer.token_bytes(im_end).unwrap().to_vec()).unwrap();
    let mut state = loaded.compile_grammar(&GrammarSpec::Choice(vec![text])).unwrap().start();
    assert!(!state.allowed_ids().unwrap().contains(&im_end));
}

fn request(loaded: &LoadedModel, prompt: &str, spec: &GrammarSpec, config: SamplerConfig, max_tokens: usize) -> GenerationSpec {
    let vocab = loaded.config().vocab_size;
    let prompt = loaded.tokenizer.encode(prompt, false).unwrap();
    let stop = StopConditions { max_tokens, ..Default::default() };
    GenerationSpec::new(prompt, config, stop, vocab).unwrap().with_grammar(loaded.compile_grammar(spec).unwrap()).unwrap()
}

#[test]
fn every_driver_follows_the_grammar_with_the_same_bits() {
    let loaded = loaded();
    let spec = GrammarSpec::Regex("[0-9]{3}-[0-9]{4}".into());
    let config = SamplerConfig { temperature: 1.0, seed: 3, ..Default::default() };
    let make = || request(&loaded, "Call me at ", &spec, config.clone(), 20);

    // decode::generate (ids only) on a session.
    let mut session = Session::new(Arc::clone(&loaded), 64).unwrap();
    let generated = session.generate(make()).unwrap();
    let eos = loaded.config().eos_id.unwrap();
    assert_eq!(generated.ids.last(), Some(&eos));
    let text = loaded.tokenizer.decode(&generated.ids[..generated.ids.len() - 1]).unwrap();
    assert!(text.len() == 8 && text.as_bytes()[3] == b'-', "{text:?}");

    // The streaming generator.
    let streamed: Vec<_> = Generator::new(Session::new(Arc::clone(&loaded), 64).unwrap(), make())
        .unwrap()
        .map(|s| s.unwrap())
        .collect();
    assert_eq!(streamed.iter().map(|s| s.selection.clone()).collect::<Vec<_>>(), generated.steps);
    assert_eq!(streamed.iter().map(|s| s.text.as_str()).collect::<String>(), text);

    // The batch engine, beside an unconstrained request.
    let batch = BatchEngine::new(Arc::clone(&loaded), BatchOptions::defaults_for(&loaded)).unwrap();
    let stop = StopConditions { max_tokens: 12, ..Default::default() };
    let unconstrained = GenerationSpec::new(vec![1, 2, 3], SamplerConfig::default(), stop, loaded.config().vocab_size).unwrap();
    let other = batch.submit(unconstrained).unwrap();
    let handle = batch.submit(make()).unwrap();
    let mut selections = Vec::new();
    while let Poll::Event(event) = handle.next_event(None) {
        match event {
            Event::Token(step) => selections.push(step.selection),
            Event::Finished(_) => break,
            Event::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!(selections, generated.steps);
    other.cancel();
}

#[test]
fn bad_grammars_are_grammar_errors() {
    let loaded = loaded();
    for spec in [
        GrammarSpec::JsonSchema("{".into()),
        GrammarSpec::JsonSchema(r#"{"type": "object", "propertyNames": {}}"#.into()),
        GrammarSpec::Regex("(".into()),
        GrammarSpec::Lark("start: nothing".into()),
        GrammarSpec::Choice(vec![]),
        // Byte 0x04 has no token in SmolLM2's vocabulary: nothing can start this.
        GrammarSpec::Regex(r"\x04".into()),
    ] {
        assert!(matches!(loaded.compile_grammar(&spec), Err(Error::Grammar(_))), "{spec:?}");
    }
    assert!(Grammar::check(&GrammarSpec::Regex(r"\x04".into())).is_ok(), "only the model's vocabulary lacks it");
}

/// The mask computed in parts on several threads (one trie walk per part of the vocabulary,
/// the parts' sets OR-ed) is the mask computed whole, at every step of random walks through
/// JSON Schema, regex, Lark and choice grammars: S does not depend on the thread count.
#[test]
fn the_mask_in_parts_is_the_whole_mask() {
    let loaded = loaded();
    let vocabulary = |parts| GrammarVocabulary::new(Arc::clone(&loaded.tokenizer), loaded.config().eos_id, parts).unwrap();
    let (whole, two, three) = (vocabulary(1), vocabulary(2), vocabulary(3));
    let eos = loaded.config().eos_id.unwrap();
    let specs = [
        GrammarSpec::JsonSchema(
            r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "tags": {"type": "array", "items": {"enum": ["a", "b c", "d"]}, "maxItems": 3},
                "email": {"type": "string", "format": "email"}},
                "required": ["name", "age"]}"#
                .into(),
        ),
        GrammarSpec::JsonSchema(r#"{"anyOf": [{"type": "number"}, {"type": "string", "pattern": "^[a-z]+$"}]}"#.into()),
        GrammarSpec::Regex(r"(?:[A-Z][a-z]{0,12},? ){3,30}[a-z]{1,12}\.".into()),
        GrammarSpec::Regex(r"[0-9]{3}-[A-Za-z ]+\n?".into()),
        GrammarSpec::Lark("start: item (\", \" item)*\nitem: NAME \": \" NUMBER\nNAME: /[a-z]{1,10}/\nNUMBER: /[0-9]{1,5}/\n".into()),
        GrammarSpec::Choice(vec!["yes".into(), "no".into(), "maybe not".into()]),
    ];
    let mut rng = TestRng::new(14);
    for spec in &specs {
        let grammars: Vec<Grammar> = [&whole, &two, &three].iter().map(|v| Grammar::compile(spec, v).unwrap()).collect();
        for walk in 0..3 {
            let mut states: Vec<_> = grammars.iter().map(Grammar::start).collect();
            for step in 0..40 {
                let allowed = states[0].allowed_ids().unwrap();
                for state in &mut states[1..] {
                    assert_eq!(state.allowed_ids().unwrap(), allowed, "{spec:?}, walk {walk}, step {step}");
                }
                let token = allowed[(rng.unit() * allowed.len() as f64) as usize];
                if token == eos {
                    break;
                }
                states.iter_mut().for_each(|s| s.accept(token).unwrap());
            }
        }
    }
}
