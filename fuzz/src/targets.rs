//! What each fuzz target does with one input. Shared by the libFuzzer binaries
//! (`fuzz/fuzz_targets/*.rs`) and the corpus replay in the cargo tests
//! (`tests/fuzz_corpora.rs`), so a corpus file exercises the same code either way.
//!
//! Every target may return errors (that is the point: typed errors), but must not panic,
//! hang, or allocate beyond the bound it checks; checked properties are `assert!`s.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use reprolm::chat::{map, ChatTemplate, Message, Value};
use reprolm::loaded_model::{LoadedModel, LoadOptions, Session};
use reprolm::gguf::GgufFile;
use reprolm::grammar::{Grammar, GrammarSpec, GrammarVocabulary};
use reprolm::model::ModelConfig;
use reprolm::sampling::{Sampler, SamplerConfig};
use reprolm::tokenizer::{StreamDecoder, Tokenizer, TokenizerSpec};

use super::alloc::peak_during;

/// Allocation bound of [`GgufFile::from_bytes`] (the README's Guarantees): per byte of input.
pub const GGUF_BYTES_PER_BYTE: usize = 48;
/// ... plus a constant.
pub const GGUF_BYTES_CONSTANT: usize = 64 << 10;

/// The default model: `REPROLM_MODEL`, else `~/.cache/reprolm` (as the tests find it).
pub fn model_path() -> PathBuf {
    if let Ok(p) = std::env::var("REPROLM_MODEL") {
        return PathBuf::from(p);
    }
    let cache = std::env::var("REPROLM_CACHE").map(PathBuf::from).unwrap_or_else(|_| {
        let base = std::env::var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache"));
        base.join("reprolm")
    });
    cache.join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The default model, loaded once per process (one thread: targets run serially).
pub fn loaded() -> &'static Arc<LoadedModel> {
    static ENGINE: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let options = LoadOptions { threads: Some(1), ..Default::default() };
        let loaded = LoadedModel::load(model_path(), &options).expect("the default model (run `python -m reprolm download`)");
        // Computed now, not inside a target's measured memory peak.
        loaded.fingerprint().expect("the model file's fingerprint");
        Arc::new(loaded)
    })
}

/// GGUF reader: any bytes parse to a file or a typed error within the allocation bound; a
/// file that parses is then read as a model config and a tokenizer, as `LoadedModel::load` does.
pub fn gguf(data: &[u8]) {
    let (file, peak) = peak_during(|| GgufFile::from_bytes(data));
    if let Some(peak) = peak {
        let bound = GGUF_BYTES_PER_BYTE * data.len() + GGUF_BYTES_CONSTANT;
        assert!(peak <= bound, "parsing {} bytes allocated {peak} bytes (bound {bound})", data.len());
    }
    let Ok(file) = file else { return };
    for (key, value) in file.metadata() {
        let _ = (key.len(), value.summary(), value.as_f64(), value.as_str());
    }
    for t in file.tensors() {
        assert!(t.offset + t.n_bytes <= file.file_len());
        assert_eq!(file.tensor_bytes(t).len(), t.n_bytes);
        let _ = file.usable_tensor(&t.name);
    }
    for t in file.foreign_tensors() {
        assert!(t.offset + t.n_bytes <= file.file_len());
        assert!(file.usable_tensor(&t.name).is_err());
    }
    let _ = file.check_all_supported();
    let _ = ModelConfig::from_gguf(&file);
    let Ok(spec) = TokenizerSpec::from_gguf(&file) else { return };
    let Ok(tokenizer) = Tokenizer::from_spec(spec) else { return };
    for special in [false, true] {
        if let Ok(ids) = tokenizer.encode("Hello, world! 12345 <|im_start|>user\n\u{e9}\u{1F600}", special) {
            tokenizer.decode(&ids).expect("encode gives ids in the vocabulary");
        }
    }
}

/// The default model's tokenizer (built once per process).
fn tokenizer() -> &'static Tokenizer {
    &loaded().tokenizer
}

/// llama.cpp's Llama 2 SentencePiece vocabulary (tests/data/vocab/), built once per process.
fn sentencepiece_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        // The repository root is this crate's directory (cargo tests) or its parent (fuzz/).
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let path = [root.join("tests/data/vocab"), root.join("../tests/data/vocab")]
            .into_iter()
            .map(|dir| dir.join("ggml-vocab-llama-spm.gguf"))
            .find(|path| path.exists())
            .expect("tests/data/vocab/ggml-vocab-llama-spm.gguf");
        let spec = TokenizerSpec::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
        Tokenizer::from_spec(spec).unwrap()
    })
}

/// Tokenizer: byte 0 picks the mode, the rest is text (encode with or without special
/// tokens, then decode) or little-endian u32 ids (decode, and stream-decode one at a time).
/// Mode bit 0x40 picks the SentencePiece vocabulary instead of the default model's BPE.
pub fn tokenizer_target(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let sentencepiece = mode & 0x40 != 0;
    let tok = if sentencepiece { sentencepiece_tokenizer() } else { tokenizer() };
    if mode & 1 == 0 {
        let text = String::from_utf8_lossy(rest);
        let special = mode & 2 != 0;
        let ids = tok.encode(&text, special).expect("encoding never fails");
        assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
        let decoded = tok.decode(&tok.encode_with(&text, special, false).unwrap()).expect("encoded ids decode");
        if sentencepiece {
            // Every byte has a byte token; decoding keeps the space put before the text, and
            // gives a space for a `▁` in the text.
            if !special && !text.contains('\u{2581}') && !text.is_empty() {
                assert_eq!(decoded, format!(" {text}"), "plain text must round-trip");
            }
        } else if !special && text.bytes().all(|b| single_byte_tokens()[b as usize]) {
            // Bytes without a token of their own are skipped (as llama.cpp does): only text
            // made of bytes the vocabulary has must come back unchanged.
            assert_eq!(decoded, text, "plain text must round-trip");
        }
        stream_equals_decode(tok, &ids);
    } else {
        let ids: Vec<u32> = rest.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        // Mostly ids near the vocabulary (the high bit of the mode byte keeps them raw).
        let n = tok.vocab_size() as u32 + 2;
        let ids: Vec<u32> = if mode & 0x80 != 0 { ids } else { ids.iter().map(|id| id % n).collect() };
        match tok.decode(&ids) {
            Ok(_) => stream_equals_decode(tok, &ids),
            Err(_) => assert!(ids.iter().any(|&id| id as usize >= tok.vocab_size())),
        }
        let mut stream = StreamDecoder::new();
        for &id in &ids {
            let _ = stream.push(tok, id);
            let _ = tok.is_special(id);
        }
        stream.finish();
    }
}

/// Which bytes the default vocabulary has a one-byte token for.
fn single_byte_tokens() -> &'static [bool; 256] {
    static HAS: OnceLock<[bool; 256]> = OnceLock::new();
    HAS.get_or_init(|| {
        let tok = tokenizer();
        let mut has = [false; 256];
        for id in 0..tok.vocab_size() as u32 {
            if let [b] = tok.token_bytes(id).unwrap() {
                if !tok.is_special(id) {
                    has[*b as usize] = true;
                }
            }
        }
        has
    })
}

/// The stream decoder's pieces add up to `decode` (its documented property).
fn stream_equals_decode(tok: &Tokenizer, ids: &[u32]) {
    let mut stream = StreamDecoder::new();
    let mut text = String::new();
    for &id in ids {
        text.push_str(&stream.push(tok, id).expect("ids in the vocabulary"));
    }
    text.push_str(&stream.finish());
    assert_eq!(text, tok.decode(ids).unwrap());
}


/// Session state loader. Byte 0 is the mode: unless bit 0 is set the fuzzer's bytes get the
/// default model's fingerprint at 16..24, unless bit 1 is set a valid checksum is appended
/// (so the fuzzer gets past both checks to the fields); the rest is the file. A file that
/// loads must save back to the same bytes.
pub fn state(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let loaded = loaded();
    let mut bytes = rest.to_vec();
    if mode & 1 == 0 && bytes.len() >= 24 {
        bytes[16..24].copy_from_slice(&loaded.fingerprint().unwrap().to_le_bytes());
    }
    if mode & 2 == 0 {
        let checksum = reprolm::state::xxh64(&bytes, 0);
        bytes.extend_from_slice(&checksum.to_le_bytes());
    }
    let per_position = loaded.kv_bytes_per_position(reprolm::model::KvDtype::F32);
    let (session, peak) = peak_during(|| Session::from_state_bytes(Arc::clone(loaded), &bytes));
    if let Ok(session) = session {
        assert_eq!(session.state_bytes().unwrap(), bytes, "a loaded state saves back to the same bytes");
        if let Some(peak) = peak {
            let bound = 2 * bytes.len() + session.capacity() * per_position + (64 << 10);
            assert!(peak <= bound, "loading {} bytes allocated {peak} (bound {bound})", bytes.len());
        }
    }
}

/// Chat templates. The input is split at NUL bytes: the template, then (role, content) pairs.
/// Content `\x01` is a message without `content`, `\x02` a `none` content, and content that
/// starts with `\x03` a list of strings; the first byte of the template, if it is `\x04`,
/// asks for `add_generation_prompt = false`.
pub fn chat(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let template = parts.next().unwrap_or_default();
    let (add_generation_prompt, template) = match template.strip_prefix('\u{4}') {
        Some(t) => (false, t),
        None => (true, template),
    };
    let rest: Vec<&str> = parts.collect();
    let mut plain = Vec::new();
    let mut values = Vec::new();
    for pair in rest.chunks(2) {
        let role = pair[0];
        let content = pair.get(1).copied().unwrap_or("");
        plain.push(Message::new(role, content));
        let mut fields = vec![("role".to_string(), Value::from(role))];
        match content.as_bytes().first() {
            Some(1) => {}
            Some(2) => fields.push(("content".into(), Value::from(()))),
            Some(3) => fields.push(("content".into(), Value::from_iter(content[1..].split(' ').map(Value::from)))),
            _ => fields.push(("content".into(), Value::from(content))),
        }
        values.push(map(fields));
    }
    let t = ChatTemplate::new(template).with_special_tokens("<s>", "</s>");
    let start = std::time::Instant::now();
    let _ = t.render(&plain, add_generation_prompt);
    let extra = vec![("tools".to_string(), Value::from_iter([map([("name".into(), Value::from("f"))])]))];
    let _ = t.render_value(Value::from(values), add_generation_prompt, extra);
    let elapsed = start.elapsed();
    assert!(elapsed.as_secs() < 10, "two renders took {elapsed:?}");
}

/// A little reader of fuzz bytes: each call takes what it needs, zeros past the end.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    /// A float: mostly from a table of edge cases and small values, else raw bits.
    fn f64(&mut self) -> f64 {
        const TABLE: [f64; 16] =
            [0.0, -0.0, 1.0, 0.5, 2.0, -1.0, 1e-300, 1e300, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, f64::MIN_POSITIVE, 0.999999, 1.0000001, 5e-324, 100.0];
        let b = self.u8();
        if b < 0xF0 {
            TABLE[(b & 15) as usize]
        } else {
            f64::from_bits(((self.u32() as u64) << 32) | self.u32() as u64)
        }
    }
    fn f32(&mut self) -> f32 {
        const TABLE: [f32; 16] =
            [0.0, -0.0, 1.0, -1.0, 3.0, -30.0, 1e-38, 3e38, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX, f32::MIN, 1e-45, 88.7, -88.7];
        let b = self.u8();
        if b < 0xC0 {
            TABLE[(b & 15) as usize] + (b >> 4) as f32 * 0.25
        } else {
            f32::from_bits(self.u32())
        }
    }
}

/// Sampler settings and one sampling step on arbitrary logits and history: validation
/// rejects or the step gives a token of the vocabulary with sane statistics.
pub fn sampler(data: &[u8]) {
    let mut b = Bytes(data);
    let vocab = 1 + (b.u8() as usize % 64) * (1 + b.u8() as usize % 8);
    let id = |b: &mut Bytes| b.u32() % (vocab as u32 + 2);
    let mut config = SamplerConfig {
        temperature: b.f64(),
        top_k: b.u8() as usize,
        top_p: b.f64(),
        min_p: b.f64(),
        repetition_penalty: b.f64(),
        penalty_window: match b.u8() {
            0..=127 => None,
            n => Some(n as usize - 128),
        },
        presence_penalty: b.f64(),
        frequency_penalty: b.f64(),
        seed: b.u32() as u64,
        top_logprobs: b.u8() as usize % 16,
        ..SamplerConfig::default()
    };
    for _ in 0..b.u8() % 4 {
        config.logit_bias.push((id(&mut b), b.f64()));
    }
    if b.u8() & 1 == 1 {
        config.allowed_token_ids = Some((0..b.u8() % 8).map(|_| id(&mut b)).collect());
    }
    for _ in 0..b.u8() % 4 {
        config.banned_token_ids.push(id(&mut b));
    }
    let n_history = b.u8() as usize % 32;
    let history: Vec<u32> = (0..n_history).map(|_| b.u32() % vocab as u32).collect();
    let n_prompt = b.u8() as usize % (n_history + 1);
    let step = b.u32() as u64;
    let n_logits = if b.u8() == 0xFF { vocab - 1 } else { vocab };
    let logits: Vec<f32> = (0..n_logits).map(|_| b.f32()).collect();

    let valid = config.validate(vocab).is_ok();
    let Ok(mut sampler) = Sampler::new(config.clone(), vocab) else {
        assert!(!valid);
        return;
    };
    assert!(valid);
    let selection = sampler.sample(&logits, &history, n_prompt, step);
    let q = sampler.distribution(&logits, &history, n_prompt);
    match (selection, q) {
        (Ok(s), Ok(q)) => {
            assert!((s.token as usize) < vocab);
            assert!(q[s.token as usize] > 0.0, "sampled a token of probability 0: {s:?}");
            let total: f64 = q.iter().sum();
            assert!((total - 1.0).abs() < 1e-9, "q sums to {total}");
            assert!(q.iter().all(|&p| (0.0..=1.0).contains(&p)));
            assert!(s.logprob <= 1e-12 && !s.logprob.is_nan(), "{s:?}");
            assert!(s.entropy >= 0.0 && s.entropy.is_finite(), "{s:?}");
            assert!((0.0..=1.0).contains(&s.removed_mass), "{s:?}");
            assert!(s.alternatives.len() <= config.top_logprobs);
        }
        (Err(_), Err(_)) => {}
        (s, q) => panic!("sample and distribution disagree: {s:?} / {:?}", q.map(|_| ())),
    }
}

/// Tokens kept from the default model's vocabulary for the `grammar` target: its special
/// tokens, its 256 byte tokens and its highest-priority merges, so S is quick to compute.
const GRAMMAR_VOCAB: usize = 1024;

/// The default model's tokenizer cut to its first [`GRAMMAR_VOCAB`] tokens (the merges among
/// them kept, in order), as a grammar vocabulary in one part and in two: a small real
/// byte-level BPE vocabulary, built once per process without loading the model's weights.
fn grammar_vocabularies() -> &'static (GrammarVocabulary, GrammarVocabulary) {
    static VOCABULARIES: OnceLock<(GrammarVocabulary, GrammarVocabulary)> = OnceLock::new();
    VOCABULARIES.get_or_init(|| {
        let mut spec = TokenizerSpec::from_gguf(&GgufFile::open(model_path()).expect("the default model")).unwrap();
        spec.tokens.truncate(GRAMMAR_VOCAB);
        if let Some(types) = &mut spec.token_types {
            types.truncate(GRAMMAR_VOCAB);
        }
        if let Some(scores) = &mut spec.scores {
            scores.truncate(GRAMMAR_VOCAB);
        }
        let kept: std::collections::HashSet<&str> = spec.tokens.iter().map(String::as_str).collect();
        let merges: Vec<String> = spec
            .merges
            .iter()
            .filter(|m| {
                let (left, right) = m.split_once(' ').unwrap_or((m, ""));
                kept.contains(left) && kept.contains(right) && kept.contains(format!("{left}{right}").as_str())
            })
            .cloned()
            .collect();
        spec.merges = merges;
        let tokenizer = Arc::new(Tokenizer::from_spec(spec).expect("the cut vocabulary is consistent"));
        let eos = tokenizer.eos_id();
        let whole = GrammarVocabulary::new(Arc::clone(&tokenizer), eos, 1).unwrap();
        let halves = GrammarVocabulary::new(tokenizer, eos, 2).unwrap();
        (whole, halves)
    })
}

/// The end-of-sequence token of the `grammar` target's vocabulary.
fn grammar_eos() -> u32 {
    static EOS: OnceLock<u32> = OnceLock::new();
    *EOS.get_or_init(|| {
        let spec = TokenizerSpec::from_gguf(&GgufFile::open(model_path()).unwrap()).unwrap();
        spec.eos_id.expect("the default model has an end-of-sequence token")
    })
}

/// Grammars: a JSON Schema, regular expression, Lark grammar or choice compiled for a small
/// real vocabulary, then up to 16 steps of S and a fuzzer-chosen token. Byte 0 is the mode:
/// bits 0-1 the kind (schema, regex, Lark, choice: one string per line), bit 2 also compiles
/// it for the vocabulary in two parts, whose S must be the same at every step. The grammar's
/// text runs to the first NUL; each byte after it picks the next token: below 0xF0 an allowed
/// one (by index into S), else a raw id from the next two bytes, which must be accepted
/// exactly when it is in S. Picking the end-of-sequence token ends the text, as in the engine.
pub fn grammar(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let text = String::from_utf8_lossy(&rest[..end]).into_owned();
    let mut steps = Bytes(rest.get(end + 1..).unwrap_or_default());
    let spec = match mode & 3 {
        0 => GrammarSpec::JsonSchema(text),
        1 => GrammarSpec::Regex(text),
        2 => GrammarSpec::Lark(text),
        _ => GrammarSpec::Choice(text.split('\n').map(str::to_string).collect()),
    };
    let (whole, halves) = grammar_vocabularies();
    let Ok(grammar) = Grammar::compile(&spec, whole) else { return };
    assert_eq!(grammar.vocab_size(), whole.vocab_size());
    let mut state = grammar.start();
    let mut twin = if mode & 4 != 0 {
        let twin = Grammar::compile(&spec, halves).expect("compiles for the whole vocabulary, so for its parts");
        Some(twin.start())
    } else {
        None
    };
    let eos = grammar_eos();
    for _ in 0..16 {
        let Ok(allowed) = state.allowed_ids() else {
            if let Some(twin) = &mut twin {
                assert!(twin.allowed_ids().is_err(), "S failed for one part but not for two");
            }
            return;
        };
        assert!(!allowed.is_empty() && allowed.iter().all(|&id| (id as usize) < whole.vocab_size()));
        assert!(allowed.windows(2).all(|w| w[0] < w[1]), "S is ascending");
        let accepting = state.is_accepting();
        assert_eq!(allowed.contains(&eos), accepting, "EOS is in S exactly where the grammar accepts");
        if let Some(twin) = &mut twin {
            assert_eq!(twin.allowed_ids().expect("S for two parts"), allowed, "S does not depend on the parts");
        }
        let pick = steps.u8();
        let token = if pick < 0xF0 {
            allowed[pick as usize % allowed.len()]
        } else {
            u16::from_le_bytes([steps.u8(), steps.u8()]) as u32 % (whole.vocab_size() as u32 + 2)
        };
        let in_s = allowed.binary_search(&token).is_ok();
        if in_s && token == eos {
            return; // the end of the text: the loaded feeds it to no grammar
        }
        let accepted = state.accept(token);
        assert_eq!(accepted.is_ok(), in_s, "token {token}: accepted {accepted:?}, in S {in_s}");
        if let Some(twin) = &mut twin {
            assert_eq!(twin.accept(token).is_ok(), in_s, "token {token} with two parts");
        }
        if !in_s {
            return;
        }
    }
}
