//! Tests of `tokenizer.rs` against the SmolLM2 GGUF tokenizer metadata (read from the
//! real model) and the llama.cpp reference ids in tests/data/tokenizer.json.

use std::sync::OnceLock;

use crate::common;

use reprolm::error::Error;
use reprolm::gguf::GgufFile;
use reprolm::tokenizer::{StreamDecoder, Tokenizer, TokenizerSpec};
use serde_json::Value;

const VOCAB: usize = 49152;

fn spec() -> TokenizerSpec {
    static SPEC: OnceLock<TokenizerSpec> = OnceLock::new();
    SPEC.get_or_init(|| TokenizerSpec::from_gguf(&GgufFile::open(common::model_path()).unwrap()).unwrap())
        .clone()
}

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::from_spec(spec()).unwrap())
}

/// (text, ids, ids_special) for every reference text.
fn reference() -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(common::data_path("tokenizer.json")).unwrap()).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    cases
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["text"].as_str().unwrap().to_owned(), ids(&c["ids"]), ids(&c["ids_special"])))
        .collect()
}

#[test]
fn matches_all_reference_ids() {
    let tok = tokenizer();
    let cases = reference();
    assert_eq!(cases.len(), 158);
    let mut failures = Vec::new();
    for (i, (text, ids, ids_special)) in cases.iter().enumerate() {
        if &tok.encode(text, false).unwrap() != ids {
            failures.push(format!("#{i} special=false {text:?}"));
        }
        if &tok.encode(text, true).unwrap() != ids_special {
            failures.push(format!("#{i} special=true {text:?}"));
        }
        if &tok.decode(ids).unwrap() != text || &tok.decode(ids_special).unwrap() != text {
            failures.push(format!("#{i} decode {text:?}"));
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn reference_covers_special_tokens_and_digits() {
    // Guards the test above: the reference must exercise both switches it checks.
    let cases = reference();
    assert!(cases.iter().any(|(_, ids, special)| ids != special));
    assert!(cases.iter().any(|(text, _, _)| text.chars().any(|c| c.is_ascii_digit())));
}

#[test]
fn special_tokens_parse_only_when_asked() {
    let tok = tokenizer();
    let text = "<|im_start|>user\nHi<|im_end|>\n";
    let with = tok.encode(text, true).unwrap();
    assert_eq!(with.first(), Some(&1));
    assert!(with.contains(&2));
    let without = tok.encode(text, false).unwrap();
    assert!(without.iter().all(|&id| !tok.is_special(id)));
    assert_eq!(tok.decode(&with).unwrap(), text);
    assert_eq!(tok.decode(&without).unwrap(), text);
    assert_eq!(tok.decode(&[1]).unwrap(), "<|im_start|>");
    assert_eq!(tok.token_bytes(2).unwrap(), b"<|im_end|>");
}

#[test]
fn digits_are_split_one_by_one() {
    let tok = tokenizer();
    let ids = tok.encode("2024", false).unwrap();
    assert_eq!(ids.len(), 4);
    assert_eq!(tok.decode(&ids).unwrap(), "2024");
    assert_eq!(tok.token_bytes(ids[0]).unwrap(), b"2");
}

#[test]
fn is_special_marks_the_control_tokens() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), VOCAB);
    assert!((0..17).all(|id| tok.is_special(id)));
    assert!((17..VOCAB as u32).all(|id| !tok.is_special(id)));
    assert!(!tok.is_special(VOCAB as u32));
}

#[test]
fn add_bos_is_honoured() {
    let tok = Tokenizer::from_spec(TokenizerSpec { add_bos: Some(true), ..spec() }).unwrap();
    assert_eq!(tok.encode("", false).unwrap(), vec![1]);
    let plain = tokenizer().encode("Hello", false).unwrap();
    for special in [false, true] {
        let ids = tok.encode("Hello", special).unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(ids[1..], plain[..]);
    }
    assert!(tokenizer().encode("", true).unwrap().is_empty());
}

#[test]
fn plain_gpt2_pre_tokenizer_builds() {
    for pre in [None, Some("gpt-2".to_owned())] {
        let tok = Tokenizer::from_spec(TokenizerSpec { pre, ..spec() }).unwrap();
        let text = "Hello world, it's me!";
        assert_eq!(tok.encode(text, false).unwrap(), tokenizer().encode(text, false).unwrap());
    }
}

/// Japanese and emoji: most characters are 3 or 4 UTF-8 bytes, several split across tokens.
const MULTIBYTE: &str = "数学の証明は美しい。🦀🚀👨‍👩‍👧 絵文字と漢字が混ざった文章、𠮷野家";

#[test]
fn stream_decoder_outputs_only_complete_characters() {
    let tok = tokenizer();
    let ids = tok.encode(MULTIBYTE, false).unwrap();
    let split_tokens = ids
        .iter()
        .filter(|&&id| std::str::from_utf8(tok.token_bytes(id).unwrap()).is_err())
        .count();
    assert!(split_tokens >= 4, "test text should have tokens holding partial characters");

    let mut stream = StreamDecoder::new();
    let mut pieces = Vec::new();
    for &id in &ids {
        pieces.push(stream.push(tok, id).unwrap());
    }
    pieces.push(stream.finish());
    assert!(pieces.iter().any(String::is_empty), "some push should have held bytes back");
    assert!(pieces.iter().all(|p| !p.contains(char::REPLACEMENT_CHARACTER)));
    assert_eq!(pieces.concat(), tok.decode(&ids).unwrap());
    assert_eq!(pieces.concat(), MULTIBYTE);
}

#[test]
fn partial_character_decodes_without_panic() {
    let tok = tokenizer();
    let ids = tok.encode("🦀", false).unwrap();
    assert!(ids.len() > 1, "the crab should span several tokens");
    let first = tok.decode(&ids[..1]).unwrap();
    assert!(first.contains(char::REPLACEMENT_CHARACTER), "{first:?}");

    let mut stream = StreamDecoder::new();
    assert_eq!(stream.push(tok, ids[0]).unwrap(), "");
    assert_eq!(stream.finish(), first);
    assert_eq!(stream.finish(), "", "finish empties the decoder");
}

#[test]
fn stream_decoder_equals_decode_on_arbitrary_bytes() {
    // Every single-byte token in a pseudo-random order: lots of invalid and truncated UTF-8.
    // (The vocabulary has 235 of the 256 bytes; see `bytes_missing_from_vocab_are_dropped`.)
    let tok = tokenizer();
    let byte_tokens: Vec<u32> =
        (0..VOCAB as u32).filter(|&id| tok.token_bytes(id).unwrap().len() == 1).collect();
    assert_eq!(byte_tokens.len(), 235);
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let ids: Vec<u32> = (0..5000)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            byte_tokens[(state >> 33) as usize % byte_tokens.len()]
        })
        .collect();
    let mut stream = StreamDecoder::new();
    let mut streamed: String = ids.iter().map(|&id| stream.push(tok, id).unwrap()).collect();
    streamed.push_str(&stream.finish());
    assert_eq!(streamed, tok.decode(&ids).unwrap());
}

#[test]
fn bytes_missing_from_vocab_are_dropped() {
    // SmolLM2's vocabulary has no token for the bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D,
    // 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..=0xFF. With no unknown token, BPE skips them.
    let tok = tokenizer();
    let ids = tok.encode("a\u{4}b\u{1d}", false).unwrap();
    assert_eq!(ids.len(), 2);
    assert_eq!(tok.decode(&ids).unwrap(), "ab");
}

#[test]
fn out_of_range_ids_are_errors() {
    let tok = tokenizer();
    let is_out_of_range =
        |e: Error| matches!(e, Error::TokenOutOfRange { id: 49152, vocab_size: VOCAB });
    assert!(is_out_of_range(tok.decode(&[1, 49152]).unwrap_err()));
    assert!(is_out_of_range(tok.token_bytes(49152).unwrap_err()));
    let mut stream = StreamDecoder::new();
    let crab = tok.encode("🦀", false).unwrap();
    assert_eq!(stream.push(tok, crab[0]).unwrap(), "");
    assert!(is_out_of_range(stream.push(tok, 49152).unwrap_err()));
    let rest: String = crab[1..].iter().map(|&id| stream.push(tok, id).unwrap()).collect();
    assert_eq!(rest, "🦀", "a failed push leaves the decoder unchanged");
    assert!(matches!(
        tok.token_bytes(u32::MAX).unwrap_err(),
        Error::TokenOutOfRange { id, .. } if id == u32::MAX as i64
    ));
}

fn build_error(spec: TokenizerSpec) -> String {
    match Tokenizer::from_spec(spec) {
        Ok(_) => panic!("expected an error"),
        Err(e @ (Error::Unsupported(_) | Error::Model(_))) => e.to_string(),
        Err(e) => panic!("wrong error variant: {e:?}"),
    }
}

#[test]
fn unsupported_model_or_pre_tokenizer() {
    let e = build_error(TokenizerSpec { model: "bert".into(), ..spec() });
    assert!(e.starts_with("unsupported") && e.contains("'bert'"), "{e}");
    let e = build_error(TokenizerSpec { pre: Some("deepseek-llm".into()), ..spec() });
    assert!(e.starts_with("unsupported") && e.contains("'deepseek-llm'"), "{e}");
    let e = build_error(TokenizerSpec { pre: Some("default".into()), ..spec() });
    assert!(e.starts_with("unsupported") && e.contains("'default'"), "{e}");
}

#[test]
fn bad_metadata_is_a_model_error() {
    let mut merges = spec().merges;
    merges.push("Ġt zzzunknown".into());
    let e = build_error(TokenizerSpec { merges, ..spec() });
    assert!(e.starts_with("invalid model") && e.contains("zzzunknown"), "{e}");

    // Both halves are tokens, but their concatenation is not.
    let mut merges = spec().merges;
    merges.push("<|im_start|> <|im_end|>".into());
    let e = build_error(TokenizerSpec { merges, ..spec() });
    assert!(e.starts_with("invalid model") && e.contains("<|im_start|><|im_end|>"), "{e}");

    let mut merges = spec().merges;
    merges[3] = "nospace".into();
    let e = build_error(TokenizerSpec { merges, ..spec() });
    assert!(e.contains("merges[3]"), "{e}");

    let e = build_error(TokenizerSpec { token_types: Some(vec![1; 10]), ..spec() });
    assert!(e.contains("token_type"), "{e}");
    let e = build_error(TokenizerSpec { bos_id: Some(VOCAB as u32), ..spec() });
    assert!(e.contains("bos_token_id = 49152"), "{e}");
    let e = build_error(TokenizerSpec { add_bos: Some(true), bos_id: None, ..spec() });
    assert!(e.contains("add_bos_token"), "{e}");
    let e = build_error(TokenizerSpec { tokens: vec![], token_types: None, ..spec() });
    assert!(e.contains("0 entries"), "{e}");
    let mut tokens = spec().tokens;
    tokens[100] = tokens[101].clone();
    let e = build_error(TokenizerSpec { tokens, ..spec() });
    assert!(e.contains("1 duplicate"), "{e}");
}

#[test]
fn without_token_types_bos_and_eos_are_special() {
    let tok = Tokenizer::from_spec(TokenizerSpec { token_types: None, ..spec() }).unwrap();
    assert!(tok.is_special(1) && tok.is_special(2));
    // Plus the tokens llama.cpp makes control tokens by name (<|endoftext|>, <reponame>).
    assert!(tok.is_special(0) && tok.is_special(4));
    assert!(!tok.is_special(3) && !tok.is_special(5) && !tok.is_special(17));
    assert_eq!(tok.encode("<|im_start|>hi", true).unwrap()[0], 1);
    assert_ne!(tok.encode("<|im_start|>hi", false).unwrap()[0], 1);
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<StreamDecoder>();
}
