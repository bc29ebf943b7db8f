//! Regression tests for what the fuzzers found (docs/guarantees.md, "Fuzzing"): each failed
//! before its fix.
//! The inputs themselves are also in fuzz/corpus/, replayed by `fuzz_corpora`.

use std::sync::Arc;

use reprolm::loaded_model::{LoadedModel, LoadOptions, Session};
use reprolm::error::Error;
use reprolm::model::KvDtype;
use reprolm::sampling::{Sampler, SamplerConfig};

use crate::common;

fn assert_logits_error<T: std::fmt::Debug>(result: reprolm::Result<T>) {
    match result {
        Err(Error::InvalidArgument { name, message }) => {
            assert_eq!(name, "logits");
            assert!(message.contains("too extreme"), "{message}");
        }
        other => panic!("expected a typed error, got {other:?}"),
    }
}

/// Found by the `sampler` target: a valid but extreme repetition penalty (5e-324) divides a
/// positive logit to +inf, and the sampler then panicked: "ExactSum takes values in [0, 1],
/// got inf" in debug builds, "p_max always survives" in release builds.
#[test]
fn penalties_that_overflow_a_logit_are_a_typed_error() {
    let cases = [
        SamplerConfig { repetition_penalty: 5e-324, top_p: 0.5, ..SamplerConfig::default() },
        SamplerConfig { repetition_penalty: 5e-324, ..SamplerConfig::greedy() },
        SamplerConfig { presence_penalty: -f64::MAX, frequency_penalty: -f64::MAX, ..SamplerConfig::default() },
        SamplerConfig { logit_bias: vec![(0, f64::MAX)], repetition_penalty: 1e-300, min_p: 0.1, ..SamplerConfig::default() },
    ];
    let logits = [3.0f32, 1.0, 0.0, -2.0];
    for config in cases {
        config.validate(4).expect("each setting is valid on its own");
        let mut sampler = Sampler::new(config.clone(), 4).unwrap();
        assert_logits_error(sampler.sample(&logits, &[0, 0], 1, 0));
        assert_logits_error(sampler.distribution(&logits, &[0, 0], 1));
        // The sampler stays usable: without the history the penalties touch nothing.
        if config.logit_bias.is_empty() {
            assert!(sampler.sample(&logits, &[], 0, 0).is_ok(), "{config:?}");
        }
    }
}

/// A session file of 104 bytes declaring a cache larger than the model's context length and
/// than half the available memory: it used to be allocated (lazily zeroed gigabytes), now it
/// is a typed error before any allocation.
#[test]
fn session_file_cannot_ask_for_a_huge_cache() {
    let loaded = Arc::new(LoadedModel::load(common::model_path(), &LoadOptions { threads: Some(1), ..Default::default() }).unwrap());
    let cfg = loaded.config().clone();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let available_kb: usize = meminfo
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    let per_position = loaded.kv_bytes_per_position(KvDtype::F32);
    let capacity = (available_kb * 1024 / per_position).max(cfg.context_length) + 1;

    let mut bytes = b"RPLMSESS".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&96u32.to_le_bytes());
    bytes.extend_from_slice(&loaded.fingerprint().unwrap().to_le_bytes());
    for v in [cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size] {
        bytes.extend_from_slice(&(v as u32).to_le_bytes());
    }
    bytes.extend_from_slice(&[0; 8]); // f32, error on overflow, float32, reserved
    for v in [0, capacity, 0, 0, 0, 0] {
        bytes.extend_from_slice(&(v as u64).to_le_bytes());
    }
    let checksum = reprolm::state::xxh64(&bytes, 0);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    match Session::from_state_bytes(Arc::clone(&loaded), &bytes) {
        Err(Error::StateFormat(m)) => assert!(m.contains("exceeds the model's context length"), "{m}"),
        Err(other) => panic!("{other:?}"),
        Ok(s) => panic!("loaded a cache of {} positions from {} bytes", s.capacity(), bytes.len()),
    }
    // The same file with a capacity within the context length loads.
    let small = cfg.context_length.min(64) as u64;
    let at = 96 - 40;
    bytes[at..at + 8].copy_from_slice(&small.to_le_bytes());
    let n = bytes.len() - 8;
    let checksum = reprolm::state::xxh64(&bytes[..n], 0);
    bytes[n..].copy_from_slice(&checksum.to_le_bytes());
    let session = Session::from_state_bytes(loaded, &bytes).unwrap();
    assert_eq!(session.capacity(), small as usize);
}

/// Found by the `grammar` target: SmolLM2's vocabulary has no token for some bytes (0x14 is
/// one), and the tokenizers skip such a byte. For a grammar that forces text with one, the
/// allowed set S was the forced text's tokens without it: a token the grammar then rejected.
/// Every token of S must now be accepted, and the text stops with a typed error at that byte.
#[test]
fn forced_text_with_a_byte_the_vocabulary_lacks_allows_only_tokens_it_accepts() {
    let loaded = LoadedModel::load(common::model_path(), &LoadOptions { threads: Some(1), ..Default::default() }).unwrap();
    let tok = &loaded.tokenizer;
    let lacks = |b: u8| (0..tok.vocab_size() as u32).all(|id| tok.token_bytes(id).unwrap() != [b]);
    assert!(lacks(0x14), "the case needs a byte without a token");
    for text in ["T\u{c}\u{10}\u{14}\u{18}\u{1c} $(", "ab\u{14}cd", "\u{14}x"] {
        let spec = reprolm::grammar::GrammarSpec::Choice(vec![text.to_string()]);
        let grammar = match loaded.compile_grammar(&spec) {
            Ok(grammar) => grammar,
            Err(e) => {
                assert!(text.starts_with('\u{14}'), "{text:?}: only a text that starts with the byte cannot start: {e}");
                continue;
            }
        };
        let mut state = grammar.start();
        let mut spelled = Vec::new();
        loop {
            let allowed = match state.allowed_ids() {
                Ok(allowed) => allowed,
                Err(Error::Grammar(_)) => break,
                Err(other) => panic!("{other:?}"),
            };
            for &id in &allowed {
                let mut next = state.clone();
                assert!(next.accept(id).is_ok(), "{text:?}: token {id} ({:?}) is in S but rejected", tok.token_bytes(id));
            }
            spelled.extend_from_slice(tok.token_bytes(allowed[0]).unwrap());
            state.accept(allowed[0]).unwrap();
        }
        let before = &text.as_bytes()[..text.find('\u{14}').unwrap()];
        assert_eq!(spelled, before, "{text:?}: the text up to the byte without a token");
    }
}
