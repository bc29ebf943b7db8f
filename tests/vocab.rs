//! The tokenizer of every family against llama.cpp's own ids, on its vocabulary-only GGUF files
//! (tests/data/vocab/, see the README there):
//! - llama.cpp's test pairs `ggml-vocab-NAME.gguf.inp` / `.out` (no BOS, special tokens not
//!   parsed), every pair, tokenized with special tokens parsed too (none of these texts holds a
//!   special token, which the test checks);
//! - `cases.inp` (334 texts: prose, code, unicode, whitespace runs, numbers, chat markup of
//!   every family, edge cases) with `.cases.out` / `.cases-special.out`: BOS/EOS as the file
//!   says, special tokens plain and parsed; also for Gemma 3 (a vocabulary-only file extracted
//!   from the Gemma 3 270M GGUF, which has no llama.cpp test pair);
//! - decoding: exact round trips, and the streaming decoder equal to the full decode.

use reprolm::loaded_model::{LoadedModel, LoadOptions};
use reprolm::error::Error;
use reprolm::gguf::GgufFile;
use reprolm::tokenizer::{StreamDecoder, Tokenizer, TokenizerSpec};

const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn vocab_path(name: &str) -> std::path::PathBuf {
    crate::common::data_path("vocab").join(name)
}

fn spec(name: &str) -> TokenizerSpec {
    // llama.cpp's ggml-vocab-qwen35.gguf is its qwen2 file with another pre-tokenizer name
    // (checked when the data was made), so only the qwen2 file is here.
    let (file, pre) = match name {
        "qwen35" => ("qwen2", Some("qwen35")),
        _ => (name, None),
    };
    let mut spec =
        TokenizerSpec::from_gguf(&GgufFile::open(vocab_path(&format!("ggml-vocab-{file}.gguf"))).unwrap()).unwrap();
    if let Some(pre) = pre {
        spec.pre = Some(pre.into());
    }
    spec
}

/// Texts of an `.inp` file (llama.cpp's format: each text followed by the separator).
fn texts(file: &str) -> Vec<String> {
    let raw = std::fs::read_to_string(vocab_path(file)).unwrap();
    let mut texts: Vec<String> = raw.split(SEPARATOR).map(str::to_owned).collect();
    assert_eq!(texts.pop().as_deref(), Some(""), "{file} ends with a separator");
    texts
}

/// One line of ids per text.
fn ids(file: &str) -> Vec<Vec<u32>> {
    std::fs::read_to_string(vocab_path(file))
        .unwrap()
        .lines()
        .map(|line| line.split_whitespace().map(|id| id.parse().unwrap()).collect())
        .collect()
}

struct Family {
    name: &'static str,
    kind: &'static str,
    vocab_size: usize,
    bos: u32,
    /// Whether encode() adds the BOS (the file's `add_bos_token`, else llama.cpp's default).
    adds_bos: bool,
    /// SentencePiece's space before the text (`add_space_prefix`), kept by decode.
    space_prefix: bool,
    /// Whether llama.cpp ships an `.inp` / `.out` pair for this vocabulary.
    llama_cpp_pair: bool,
}

const FAMILIES: [Family; 7] = [
    Family { name: "llama-spm", kind: "sentencepiece", vocab_size: 32000, bos: 1, adds_bos: true, space_prefix: true, llama_cpp_pair: true },
    Family { name: "phi-3", kind: "sentencepiece", vocab_size: 32064, bos: 1, adds_bos: true, space_prefix: true, llama_cpp_pair: true },
    Family { name: "gemma-3", kind: "sentencepiece", vocab_size: 262144, bos: 2, adds_bos: true, space_prefix: false, llama_cpp_pair: false },
    Family { name: "llama-bpe", kind: "bpe:llama-bpe", vocab_size: 128256, bos: 128000, adds_bos: true, space_prefix: false, llama_cpp_pair: true },
    Family { name: "qwen2", kind: "bpe:qwen2", vocab_size: 151936, bos: 151643, adds_bos: false, space_prefix: false, llama_cpp_pair: true },
    Family { name: "qwen35", kind: "bpe:qwen35", vocab_size: 151936, bos: 151643, adds_bos: false, space_prefix: false, llama_cpp_pair: true },
    Family { name: "gpt-2", kind: "bpe:gpt-2", vocab_size: 50257, bos: 50256, adds_bos: false, space_prefix: false, llama_cpp_pair: true },
];

fn family(name: &str) -> &'static Family {
    FAMILIES.iter().find(|f| f.name == name).unwrap()
}

/// Every check on one family's vocabulary, collecting all failures before failing.
fn check_family(name: &str) {
    let family = family(name);
    let tok = Tokenizer::from_spec(spec(name)).unwrap();
    assert_eq!(tok.kind(), family.kind);
    assert_eq!(tok.vocab_size(), family.vocab_size);
    assert_eq!(tok.bos_id(), Some(family.bos));
    assert!(tok.is_special(family.bos));
    let spm = family.kind == "sentencepiece";
    let mut failures = Vec::new();

    // llama.cpp's own test pairs: no BOS, special tokens not parsed.
    let (inputs, expected) = match family.llama_cpp_pair {
        true => (texts(&format!("ggml-vocab-{name}.gguf.inp")), ids(&format!("ggml-vocab-{name}.gguf.out"))),
        false => (Vec::new(), Vec::new()),
    };
    assert_eq!(inputs.len(), expected.len());
    assert!(!family.llama_cpp_pair || inputs.len() >= 45, "{} llama.cpp test texts", inputs.len());
    for (i, (text, want)) in inputs.iter().zip(&expected).enumerate() {
        for special in [false, true] {
            let got = tok.encode_with(text, special, false).unwrap();
            if &got != want {
                failures.push(format!(".inp #{i} special={special} {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
    }

    // The larger set, BOS/EOS as the file says, special tokens plain and parsed.
    let cases = texts("cases.inp");
    let plain = ids(&format!("ggml-vocab-{name}.gguf.cases.out"));
    let parsed = ids(&format!("ggml-vocab-{name}.gguf.cases-special.out"));
    assert_eq!((cases.len(), plain.len(), parsed.len()), (334, 334, 334));
    assert!(plain.iter().zip(&parsed).any(|(a, b)| a != b), "some case has special tokens");
    for (i, text) in cases.iter().enumerate() {
        for (special, want) in [(false, &plain[i]), (true, &parsed[i])] {
            let got = tok.encode(text, special).unwrap();
            if &got != want {
                failures.push(format!("cases #{i} special={special} {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
            let mut framed = tok.encode_with(text, special, false).unwrap();
            if family.adds_bos {
                framed.insert(0, family.bos);
            }
            if &framed != want {
                failures.push(format!("cases #{i}: BOS expectation differs from llama.cpp"));
            }
        }
        // Decoding: the ids of the text (without BOS) give the text back, after the space
        // SentencePiece puts in front (a `▁` in the text comes back as a space).
        let ids = tok.encode_with(text, false, false).unwrap();
        let want = if family.space_prefix && !text.is_empty() { format!(" {text}") } else { text.clone() };
        let decoded = tok.decode(&ids).unwrap();
        if decoded != want && !(spm && text.contains('\u{2581}')) {
            failures.push(format!("cases #{i} decode {text:?} -> {decoded:?}"));
        }
        // Streaming gives the same text, token by token, special tokens included.
        let ids = &parsed[i];
        let mut stream = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in ids {
            streamed.push_str(&stream.push(&tok, id).unwrap());
        }
        streamed.push_str(&stream.finish());
        if streamed != tok.decode(ids).unwrap() {
            failures.push(format!("cases #{i} stream decode differs"));
        }
    }
    assert!(failures.is_empty(), "{name}: {} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn llama_spm_matches_llama_cpp() {
    check_family("llama-spm");
}

#[test]
fn phi3_matches_llama_cpp() {
    check_family("phi-3");
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_family("gemma-3");
}

#[test]
fn llama_bpe_matches_llama_cpp() {
    check_family("llama-bpe");
}

#[test]
fn qwen2_matches_llama_cpp() {
    check_family("qwen2");
}

#[test]
fn qwen35_matches_llama_cpp() {
    check_family("qwen35");
}

#[test]
fn gpt2_matches_llama_cpp() {
    check_family("gpt-2");
}

#[test]
fn sentencepiece_byte_fallback_streams_whole_characters() {
    let tok = Tokenizer::from_spec(spec("llama-spm")).unwrap();
    // Characters the 32k vocabulary lacks come out as <0xNN> byte tokens.
    let text = "🦙 emoji 𠮷 and ᚠᛇᚻ runes";
    let ids = tok.encode_with(text, false, false).unwrap();
    let byte_tokens = ids.iter().filter(|&&id| tok.token_bytes(id).unwrap().len() == 1 && tok.token_bytes(id).unwrap()[0] >= 0x80).count();
    assert!(byte_tokens >= 8, "expected byte-fallback tokens, got {ids:?}");
    let mut stream = StreamDecoder::new();
    let pieces: Vec<String> = ids.iter().map(|&id| stream.push(&tok, id).unwrap()).collect();
    assert!(pieces.iter().any(String::is_empty), "some push holds an incomplete character back");
    assert!(pieces.iter().all(|p| !p.contains(char::REPLACEMENT_CHARACTER)));
    assert_eq!(stream.finish(), "");
    assert_eq!(pieces.concat(), format!(" {text}"));
    // The byte tokens decode to their bytes, the space marker to a space.
    let newline = tok.encode_with("\n", false, false).unwrap();
    assert_eq!(tok.token_bytes(*newline.last().unwrap()).unwrap(), b"\n");
    assert_eq!(tok.decode(&tok.encode_with("a b", false, false).unwrap()).unwrap(), " a b");
}

#[test]
fn sentencepiece_space_prefix_and_eos_follow_the_metadata() {
    let base = spec("llama-spm");
    let no_prefix = Tokenizer::from_spec(TokenizerSpec { add_space_prefix: Some(false), ..base.clone() }).unwrap();
    let with_prefix = Tokenizer::from_spec(base.clone()).unwrap();
    let hello = with_prefix.encode_with("Hello", false, false).unwrap();
    assert_eq!(with_prefix.decode(&hello).unwrap(), " Hello");
    assert_eq!(no_prefix.decode(&no_prefix.encode_with("Hello", false, false).unwrap()).unwrap(), "Hello");
    let with_eos = Tokenizer::from_spec(TokenizerSpec { add_eos: Some(true), ..base.clone() }).unwrap();
    assert_eq!(with_eos.encode("Hello", false).unwrap(), [&[1][..], &hello, &[2]].concat());
    assert_eq!(with_eos.encode_with("Hello", false, false).unwrap(), hello);
    let no_bos = Tokenizer::from_spec(TokenizerSpec { add_bos: Some(false), ..base }).unwrap();
    assert_eq!(no_bos.encode("Hello", false).unwrap(), hello);
    assert!(no_bos.encode("", true).unwrap().is_empty());
    assert_eq!(with_prefix.encode("", true).unwrap(), [1]);
}

#[test]
fn sentencepiece_metadata_errors_are_typed() {
    let base = spec("llama-spm");
    let model_error = |spec: TokenizerSpec| match Tokenizer::from_spec(spec) {
        Err(Error::Model(m)) => m,
        other => panic!("expected a model error, got {other:?}"),
    };
    assert!(model_error(TokenizerSpec { scores: None, ..base.clone() }).contains("tokenizer.ggml.scores"));
    assert!(model_error(TokenizerSpec { scores: Some(vec![0.0; 3]), ..base.clone() }).contains("3 entries"));
    let mut scores = base.scores.clone().unwrap();
    scores[7] = f32::NAN;
    assert!(model_error(TokenizerSpec { scores: Some(scores), ..base.clone() }).contains("scores[7]"));
    let mut tokens = base.tokens.clone();
    tokens[3] = "<0xZZ>".into();
    assert!(model_error(TokenizerSpec { tokens, ..base.clone() }).contains("<0xZZ>"));
    assert!(model_error(TokenizerSpec { unk_id: Some(40000), ..base }).contains("unknown_token_id = 40000"));
}

#[test]
fn unsupported_tokenizers_name_what_is_supported() {
    let unsupported = |spec: TokenizerSpec| match Tokenizer::from_spec(spec) {
        Err(e @ Error::Unsupported(_)) => e.to_string(),
        other => panic!("expected Unsupported, got {other:?}"),
    };
    let e = unsupported(TokenizerSpec { model: "gemma4".into(), ..spec("llama-spm") });
    assert!(e.contains("'gemma4'") && e.contains("'gpt2'") && e.contains("'llama'"), "{e}");
    let e = unsupported(TokenizerSpec { pre: Some("deepseek-llm".into()), ..spec("qwen2") });
    assert!(e.contains("'deepseek-llm'") && e.contains("'llama-bpe'") && e.contains("'smollm'"), "{e}");
}

#[test]
fn vocabulary_only_files_refuse_to_load_as_models() {
    let path = vocab_path("ggml-vocab-llama-spm.gguf");
    match LoadedModel::load(&path, &LoadOptions { threads: Some(1), ..Default::default() }) {
        Err(Error::Model(m)) => assert!(m.contains("no tensors") && m.contains("vocabulary-only"), "{m}"),
        other => panic!("expected a model error, got {:?}", other.map(|_| ())),
    }
}
