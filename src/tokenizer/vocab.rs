//! What every tokenizer kind shares: the token strings and their GGUF types, the raw bytes each
//! token decodes to, and cutting special tokens out of a text before the kind-specific
//! algorithm runs on the pieces in between (llama.cpp's `tokenizer_st_partition`).

use std::collections::HashMap;
use std::ops::Range;

use crate::error::{Error, Result};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TokenType {
    /// 0, or any value outside 0..=6.
    Undefined,
    /// 1: ordinary text.
    Normal,
    /// 2: the unknown token (`<unk>`): special.
    Unknown,
    /// 3: control tokens (`<s>`, `<|im_start|>`, ...): special.
    Control,
    /// 4: user-defined tokens: always matched as a whole, decoded as their text.
    UserDefined,
    /// 5: unused (never produced by splitting text around specials, decodes to nothing).
    Unused,
    /// 6: SentencePiece byte-fallback tokens `<0xNN>`.
    Byte,
}

impl TokenType {
    fn from_gguf(value: i32) -> TokenType {
        match value {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Control and unknown tokens: parsed from text only on request, reported by `is_special`.
    pub(super) fn is_special(self) -> bool {
        matches!(self, TokenType::Control | TokenType::Unknown)
    }
}

/// Token texts llama.cpp makes control tokens whatever their GGUF type says: its
/// end-of-generation names, then its fill-in-the-middle names (llama.cpp overrides the latter
/// only when the file has no `fim_*_token_id` key, and only the first name of each group it
/// finds; reprolm overrides them all).
const CONTROL_BY_NAME: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
];

/// A token cut out of the text as a whole before tokenization.
#[derive(Debug, Clone)]
struct Verbatim {
    id: u32,
    /// User-defined tokens are cut out even when special tokens are not parsed.
    always: bool,
    /// Whitespace right after the token is dropped (llama.cpp's `RSTRIP` attribute).
    rstrip: bool,
}

/// A run of text between verbatim tokens, or one such token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fragment {
    /// A byte range of the input text (never empty).
    Text(Range<usize>),
    Token(u32),
}

/// Token strings, types and decoded bytes, plus the verbatim-token table.
pub(super) struct Vocab {
    pub(super) tokens: Vec<String>,
    pub(super) types: Vec<TokenType>,
    /// Token text -> id.
    pub(super) ids: HashMap<String, u32>,
    /// Tokens cut out of text as a whole, longest text first (llama.cpp's special-token cache).
    verbatim: Vec<Verbatim>,
    /// The raw bytes of every token, end to end: token `id` is `bytes[offsets[id]..offsets[id + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
}

impl Vocab {
    /// Checks and indexes the token list. `bos`/`eos` must already be checked to be in range.
    /// `normal_bytes` gives the raw bytes of a normal token (kind-specific); `byte_tokens` says
    /// whether `<0xNN>` byte tokens decode to their byte (SentencePiece) or to nothing (BPE).
    pub(super) fn new(
        tokens: Vec<String>,
        token_types: Option<Vec<i32>>,
        special_ids: [Option<u32>; 2],
        model_name: Option<&str>,
        normal_bytes: &dyn Fn(&str) -> Vec<u8>,
        byte_tokens: bool,
    ) -> Result<Vocab> {
        let n_tokens = tokens.len();
        if n_tokens == 0 || u32::try_from(n_tokens).is_err() {
            return Err(Error::Model(format!(
                "tokenizer.ggml.tokens has {n_tokens} entries (need 1 to 2^32 - 1)"
            )));
        }
        let mut types: Vec<TokenType> = match token_types {
            Some(types) if types.len() != n_tokens => {
                return Err(Error::Model(format!(
                    "tokenizer.ggml.token_type has {} entries for {n_tokens} tokens",
                    types.len()
                )))
            }
            Some(types) => types.into_iter().map(TokenType::from_gguf).collect(),
            None => {
                let mut types = vec![TokenType::Normal; n_tokens];
                for id in special_ids.into_iter().flatten() {
                    types[id as usize] = TokenType::Control;
                }
                types
            }
        };

        let ids: HashMap<String, u32> = tokens.iter().cloned().zip(0u32..).collect();
        if ids.len() != n_tokens {
            return Err(Error::Model(format!(
                "tokenizer.ggml.tokens has {} duplicate strings",
                n_tokens - ids.len()
            )));
        }
        for name in CONTROL_BY_NAME {
            if let Some(&id) = ids.get(*name) {
                types[id as usize] = TokenType::Control;
            }
        }

        let mut verbatim: Vec<Verbatim> = (0..n_tokens)
            .filter(|&id| {
                matches!(types[id], TokenType::Control | TokenType::Unknown | TokenType::UserDefined)
                    && !tokens[id].is_empty()
            })
            .map(|id| Verbatim {
                id: id as u32,
                always: types[id] == TokenType::UserDefined,
                rstrip: false,
            })
            .collect();
        // Stable: equal lengths stay in id order.
        verbatim.sort_by_key(|v| std::cmp::Reverse(tokens[v.id as usize].len()));
        let name = model_name.unwrap_or_default().to_ascii_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for v in &mut verbatim {
                let text = tokens[v.id as usize].as_str();
                v.rstrip = !matches!(text, "<unk>" | "<s>" | "<|endoftext|>");
            }
        }

        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n_tokens + 1);
        offsets.push(0);
        for (token, kind) in tokens.iter().zip(&types) {
            match kind {
                TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
                    bytes.extend_from_slice(token.as_bytes())
                }
                TokenType::Normal => bytes.extend_from_slice(&normal_bytes(token)),
                TokenType::Byte if byte_tokens => {
                    let value = byte_token_value(token).ok_or_else(|| {
                        Error::Model(format!("byte token {token:?} is not of the form <0xNN>"))
                    })?;
                    bytes.push(value);
                }
                // As llama.cpp's token_to_piece: other types decode to nothing.
                TokenType::Byte | TokenType::Unused | TokenType::Undefined => {}
            }
            offsets.push(bytes.len());
        }
        Ok(Vocab { tokens, types, ids, verbatim, bytes, offsets })
    }

    pub(super) fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The raw bytes token `id` decodes to.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= len()`.
    pub(super) fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        let index = id as usize;
        if index >= self.len() {
            return Err(Error::TokenOutOfRange { id: id.into(), vocab_size: self.len() });
        }
        Ok(&self.bytes[self.offsets[index]..self.offsets[index + 1]])
    }

    /// Splits `text` into runs of text and verbatim tokens, as llama.cpp does: for each verbatim
    /// token, longest first, every text run is cut at each of its occurrences, left to right.
    /// Control and unknown tokens are cut only with `parse_special`; user-defined ones always.
    pub(super) fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut fragments = Vec::new();
        if !text.is_empty() {
            fragments.push(Fragment::Text(0..text.len()));
        }
        let bytes = text.as_bytes();
        for v in self.verbatim.iter().filter(|v| parse_special || v.always) {
            let needle = self.tokens[v.id as usize].as_str();
            if !fragments.iter().any(|f| matches!(f, Fragment::Text(r) if text[r.clone()].contains(needle))) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(range) = fragment else {
                    next.push(fragment);
                    continue;
                };
                let (mut start, end) = (range.start, range.end);
                while let Some(found) = text[start..end].find(needle) {
                    let at = start + found;
                    if at > start {
                        next.push(Fragment::Text(start..at));
                    }
                    next.push(Fragment::Token(v.id));
                    start = at + needle.len();
                    if v.rstrip {
                        while start < end && is_c_space(bytes[start]) {
                            start += 1;
                        }
                    }
                }
                if start < end {
                    next.push(Fragment::Text(start..end));
                }
            }
            fragments = next;
        }
        fragments
    }
}

/// C's `isspace` in the "C" locale, which llama.cpp's whitespace stripping uses.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// The byte of a SentencePiece byte token `<0xNN>` (hex digits of either case).
fn byte_token_value(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[&str], types: &[i32], name: Option<&str>) -> Vocab {
        let tokens = tokens.iter().map(|t| t.to_string()).collect();
        Vocab::new(tokens, Some(types.to_vec()), [None, None], name, &|t| t.as_bytes().to_vec(), true)
            .unwrap()
    }

    #[test]
    fn partition_cuts_longest_tokens_first_and_user_defined_always() {
        let v = vocab(&["a", "<x>", "<x><y>", "<u>"], &[1, 3, 3, 4], None);
        let text = "a<x><y>b<x> <u>c";
        use Fragment::*;
        assert_eq!(
            v.partition(text, true),
            vec![Text(0..1), Token(2), Text(7..8), Token(1), Text(11..12), Token(3), Text(15..16)]
        );
        assert_eq!(v.partition(text, false), vec![Text(0..12), Token(3), Text(15..16)]);
        assert!(v.partition("", true).is_empty());
    }

    #[test]
    fn phi3_special_tokens_strip_whitespace_to_their_right() {
        let types = [3, 3, 1];
        let text = "<|end|>\n x<s> y";
        let plain = vocab(&["<|end|>", "<s>", "x"], &types, Some("llama"));
        let phi3 = vocab(&["<|end|>", "<s>", "x"], &types, Some("Phi3"));
        use Fragment::*;
        assert_eq!(plain.partition(text, true), vec![Token(0), Text(7..10), Token(1), Text(13..15)]);
        assert_eq!(phi3.partition(text, true), vec![Token(0), Text(9..10), Token(1), Text(13..15)]);
    }

    #[test]
    fn byte_tokens_and_control_names() {
        assert_eq!(byte_token_value("<0x0A>"), Some(10));
        assert_eq!(byte_token_value("<0xfF>"), Some(255));
        assert_eq!(byte_token_value("<0x1>"), None);
        assert_eq!(byte_token_value("0x41"), None);
        let v = vocab(&["<|im_end|>", "b"], &[4, 1], None);
        assert_eq!(v.types[0], TokenType::Control, "llama.cpp makes <|im_end|> a control token");
    }
}
