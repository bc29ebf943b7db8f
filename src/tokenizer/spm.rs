//! SentencePiece BPE (GGUF `tokenizer.ggml.model = "llama"`: Llama 2, Mistral, TinyLlama, Phi-3,
//! Gemma), as llama.cpp's `llm_tokenizer_spm` runs it.
//!
//! A run of text (between special tokens) has its spaces replaced by `▁` (U+2581), then starts
//! as one symbol per character. Repeatedly, of all adjacent symbol pairs whose concatenation is
//! a token, the pair whose token has the highest score is merged (ties: the leftmost pair).
//! When no pair is left, each symbol is emitted as its token, or, if it is not one (a character
//! missing from the vocabulary), as one byte-fallback token `<0xNN>` per UTF-8 byte.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;
use crate::error::{Error, Result};

/// The SentencePiece space marker `▁` (U+2581).
pub(super) const SPACE_MARKER: char = '\u{2581}';

/// Scores and the byte-fallback table over a shared [`Vocab`].
pub(super) struct SentencePiece {
    /// `tokenizer.ggml.scores`: a merged pair's priority is its token's score.
    scores: Vec<f32>,
    /// The token for each byte value: `<0xNN>`, else the one-character token of that byte,
    /// else the unknown token.
    byte_tokens: Box<[Option<u32>; 256]>,
}

impl SentencePiece {
    /// # Errors
    /// [`Error::Model`] if the scores are missing, of the wrong length or NaN, or the unknown
    /// token id is outside the vocabulary.
    pub(super) fn new(vocab: &Vocab, scores: Option<Vec<f32>>, unk_id: Option<u32>) -> Result<Self> {
        let scores = scores.ok_or_else(|| {
            Error::Model("a SentencePiece ('llama') tokenizer needs tokenizer.ggml.scores".into())
        })?;
        if scores.len() != vocab.len() {
            return Err(Error::Model(format!(
                "tokenizer.ggml.scores has {} entries for {} tokens",
                scores.len(),
                vocab.len()
            )));
        }
        if let Some(id) = scores.iter().position(|s| s.is_nan()) {
            return Err(Error::Model(format!("tokenizer.ggml.scores[{id}] is NaN")));
        }
        if let Some(id) = unk_id.filter(|&id| id as usize >= vocab.len()) {
            return Err(Error::Model(format!(
                "tokenizer.ggml.unknown_token_id = {id} is outside the vocabulary of {}",
                vocab.len()
            )));
        }
        let byte_tokens = Box::new(std::array::from_fn(|byte| {
            let byte = byte as u8;
            let single = (byte < 0x80).then(|| (byte as char).to_string());
            vocab
                .ids
                .get(&format!("<0x{byte:02X}>"))
                .or_else(|| single.and_then(|s| vocab.ids.get(&s)))
                .copied()
                .or(unk_id)
        }));
        Ok(SentencePiece { scores, byte_tokens })
    }

    /// Appends the tokens of `text` (spaces already replaced by `▁`) to `out`.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if a character has no token, the vocabulary has no byte token for
    /// one of its bytes and there is no unknown token either.
    pub(super) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            symbols.push(Symbol { start, len: c.len_utf8(), prev: symbols.len().checked_sub(1), next: None });
        }
        let n = symbols.len();
        for (i, symbol) in symbols.iter_mut().enumerate() {
            symbol.next = (i + 1 < n).then_some(i + 1);
        }

        let mut queue = BinaryHeap::new();
        for left in 1..n {
            self.push_pair(vocab, text, &symbols, left - 1, left, &mut queue);
        }
        while let Some(pair) = queue.pop() {
            let (left, right) = (&symbols[pair.left], &symbols[pair.right]);
            // Stale: one side has been merged into something else since the pair was queued.
            if left.len == 0 || right.len == 0 || left.len + right.len != pair.len {
                continue;
            }
            let right_next = right.next;
            symbols[pair.left].len += symbols[pair.right].len;
            symbols[pair.right].len = 0;
            symbols[pair.left].next = right_next;
            if let Some(next) = right_next {
                symbols[next].prev = Some(pair.left);
            }
            if let Some(prev) = symbols[pair.left].prev {
                self.push_pair(vocab, text, &symbols, prev, pair.left, &mut queue);
            }
            if let Some(next) = right_next {
                self.push_pair(vocab, text, &symbols, pair.left, next, &mut queue);
            }
        }

        let mut index = (n > 0).then_some(0);
        while let Some(i) = index {
            let symbol = &symbols[i];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            // Every merged symbol is a token; only a single character can be missing.
            match vocab.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &byte in piece.as_bytes() {
                        out.push(self.byte_tokens[byte as usize].ok_or_else(|| {
                            Error::Tokenizer(format!(
                                "no token for byte 0x{byte:02X} (no <0x{byte:02X}> token and no unknown token)"
                            ))
                        })?);
                    }
                }
            }
            index = symbol.next;
        }
        Ok(())
    }

    /// Queues the merge of adjacent symbols `left` and `right` if their text is a token.
    fn push_pair(
        &self,
        vocab: &Vocab,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Pair>,
    ) {
        let len = symbols[left].len + symbols[right].len;
        let start = symbols[left].start;
        if let Some(&id) = vocab.ids.get(&text[start..start + len]) {
            queue.push(Pair { score: self.scores[id as usize], left, right, len });
        }
    }
}

/// A run of the text: a character at first, then the union of merged neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    /// Bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols, valid while their lengths sum to `len`.
#[derive(Debug, Clone, Copy)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

/// Max-heap order: higher score first, then the smaller left index (llama.cpp's comparator).
/// Scores are checked to be free of NaN, so `partial_cmp` is total here.
impl Ord for Pair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

/// A normal SentencePiece token's text with `▁` turned back into spaces.
pub(super) fn unescape_spaces(token: &str) -> Vec<u8> {
    token.replace(SPACE_MARKER, " ").into_bytes()
}
