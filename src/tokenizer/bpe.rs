//! GPT-2 style byte-level BPE (GGUF `tokenizer.ggml.model = "gpt2"`), built from the GGUF
//! vocabulary and merges with the pieces of the Hugging Face `tokenizers` crate.
//!
//! A run of text (between special tokens) is split by the pre-tokenizer that
//! `tokenizer.ggml.pre` names (the regexes llama.cpp uses for it), each piece is mapped to the
//! byte-level alphabet, and BPE merges run on each piece separately.

use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    Model, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, PreTokenizerWrapper,
    SplitDelimiterBehavior,
};

use super::vocab::Vocab;
use crate::error::{Error, Result};

/// The `tokenizer.ggml.pre` values implemented, for error messages.
pub(super) const SUPPORTED_PRE: &str = "'llama-bpe' (Llama 3), 'qwen2', 'qwen35', 'gpt-2', 'smollm'";

/// Llama 3's split regex, as llama.cpp spells it (the contractions without `(?i:...)`).
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with single digits.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's: Qwen2's where combining marks (`\p{M}`) continue a word.
const QWEN35_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pre-tokenizer llama.cpp knows by `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PreTokenizerKind {
    /// `"gpt-2"`, or no key: the GPT-2 regex.
    Gpt2,
    /// `"smollm"`: every digit alone, then the GPT-2 regex.
    SmolLm,
    /// `"llama-bpe"` (also `"llama3"`, `"llama-v3"`): Llama 3's regex; a piece that is a whole
    /// token is not merged (`ignore_merges`).
    Llama3,
    /// `"qwen2"`: Llama 3's regex with single digits.
    Qwen2,
    /// `"qwen35"`: Qwen2's, with combining marks continuing a word.
    Qwen35,
}

impl PreTokenizerKind {
    /// # Errors
    /// [`Error::Unsupported`] naming an unknown pre-tokenizer and listing the supported ones.
    pub(super) fn parse(pre: Option<&str>) -> Result<PreTokenizerKind> {
        match pre {
            None | Some("gpt-2") => Ok(PreTokenizerKind::Gpt2),
            Some("smollm") => Ok(PreTokenizerKind::SmolLm),
            Some("llama-bpe" | "llama3" | "llama-v3") => Ok(PreTokenizerKind::Llama3),
            Some("qwen2") => Ok(PreTokenizerKind::Qwen2),
            Some("qwen35") => Ok(PreTokenizerKind::Qwen35),
            Some(other) => Err(Error::Unsupported(format!(
                "tokenizer.ggml.pre = '{other}' for a 'gpt2' tokenizer (supported: {SUPPORTED_PRE})"
            ))),
        }
    }

    /// The name reprolm reports for it.
    pub(super) fn name(self) -> &'static str {
        match self {
            PreTokenizerKind::Gpt2 => "gpt-2",
            PreTokenizerKind::SmolLm => "smollm",
            PreTokenizerKind::Llama3 => "llama-bpe",
            PreTokenizerKind::Qwen2 => "qwen2",
            PreTokenizerKind::Qwen35 => "qwen35",
        }
    }

    /// Whether llama.cpp adds a BOS token by default (no `add_bos_token` key).
    pub(super) fn adds_bos_by_default(self) -> bool {
        self == PreTokenizerKind::Llama3
    }

    fn build(self) -> Result<PreTokenizerWrapper> {
        // trim_offsets only affects offsets, which are unused here.
        let gpt2 = ByteLevel::new(false, true, true);
        let bytes_only = ByteLevel::new(false, true, false);
        let split = |regex: &str| {
            Split::new(SplitPattern::Regex(regex.into()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))
        };
        Ok(match self {
            PreTokenizerKind::Gpt2 => gpt2.into(),
            PreTokenizerKind::SmolLm => Sequence::new(vec![Digits::new(true).into(), gpt2.into()]).into(),
            PreTokenizerKind::Llama3 => Sequence::new(vec![split(LLAMA3_REGEX)?.into(), bytes_only.into()]).into(),
            PreTokenizerKind::Qwen2 => Sequence::new(vec![split(QWEN2_REGEX)?.into(), bytes_only.into()]).into(),
            PreTokenizerKind::Qwen35 => Sequence::new(vec![split(QWEN35_REGEX)?.into(), bytes_only.into()]).into(),
        })
    }
}

/// The BPE model and pre-tokenizer of one vocabulary.
pub(super) struct ByteLevelBpe {
    bpe: BPE,
    pre_tokenizer: PreTokenizerWrapper,
}

impl ByteLevelBpe {
    /// # Errors
    /// [`Error::Model`] for a merge that is malformed or names a token (or a merged result)
    /// that is not in the vocabulary.
    pub(super) fn new(vocab: &Vocab, kind: PreTokenizerKind, merges: &[String]) -> Result<Self> {
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, merge)| match split_merge(merge) {
                Some((left, right)) => Ok((left.to_owned(), right.to_owned())),
                None => Err(Error::Model(format!(
                    "tokenizer.ggml.merges[{i}] = {merge:?} is not two tokens separated by a space"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe_vocab: BpeVocab = vocab.ids.clone().into_iter().collect();
        let bpe = BPE::builder()
            .vocab_and_merges(bpe_vocab, merges)
            .ignore_merges(kind == PreTokenizerKind::Llama3)
            .build()
            .map_err(|e| Error::Model(format!("tokenizer.ggml.merges: {e}")))?;
        Ok(ByteLevelBpe { bpe, pre_tokenizer: kind.build()? })
    }

    /// Appends the tokens of `text` to `out`. A byte that has no token in the vocabulary
    /// (`SmolLM2` lacks a few control bytes) is skipped, as in llama.cpp.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if the `tokenizers` pipeline fails (not expected for any input).
    pub(super) fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut pieces = PreTokenizedString::from(text);
        self.pre_tokenizer.pre_tokenize(&mut pieces).map_err(tokenizers_error)?;
        for (piece, _, _) in pieces.get_splits(OffsetReferential::Original, OffsetType::None) {
            out.extend(self.bpe.tokenize(piece).map_err(tokenizers_error)?.iter().map(|t| t.id));
        }
        Ok(())
    }
}

/// `"left right"` split at the first space after the first byte, as llama.cpp reads merges.
fn split_merge(merge: &str) -> Option<(&str, &str)> {
    let at = 1 + merge.as_bytes().get(1..)?.iter().position(|&b| b == b' ')?;
    Some((&merge[..at], &merge[at + 1..]))
}

/// Inverse of the GPT-2 byte-level alphabet: `BYTE_OF_CHAR[c]` is the byte that the char with
/// code point `c` stands for. The printable Latin-1 bytes (`'!'..='~'`, `'¡'..='¬'`, `'®'..='ÿ'`)
/// stand for themselves; the other 68 bytes, in increasing order, are U+0100..=U+0143 (so a
/// space is `'Ġ'` = U+0120 and a newline `'Ċ'` = U+010A).
const BYTE_OF_CHAR: [Option<u8>; 0x144] = {
    let mut table = [None; 0x144];
    let mut next_unprintable = 0x100;
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        if matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF) {
            table[byte] = Some(b);
        } else {
            table[next_unprintable] = Some(b);
            next_unprintable += 1;
        }
        byte += 1;
    }
    table
};

/// The raw bytes a normal byte-level token stands for; a token with a char outside the
/// byte-level alphabet is taken as plain text (as the `tokenizers` `ByteLevel` decoder does).
pub(super) fn byte_level_decode(token: &str) -> Vec<u8> {
    token
        .chars()
        .map(|c| BYTE_OF_CHAR.get(c as usize).copied().flatten())
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

/// Wraps an error from the `tokenizers` crate.
fn tokenizers_error(e: tokenizers::Error) -> Error {
    Error::Tokenizer(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_split_after_the_first_byte() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ", "t")));
        assert_eq!(split_merge("  x"), Some((" ", "x")), "a leading space belongs to the left token");
        assert_eq!(split_merge("nospace"), None);
        assert_eq!(split_merge(""), None);
    }

    #[test]
    fn byte_level_alphabet_round_trips() {
        assert_eq!(byte_level_decode("Ġhello"), b" hello");
        assert_eq!(byte_level_decode("Ċ"), b"\n");
        assert_eq!(byte_level_decode("日本"), "日本".as_bytes(), "outside the alphabet: plain text");
    }
}
