//! Text <-> token ids for GGUF models whose tokenizer is GPT-2 style byte-level BPE
//! (`tokenizer.ggml.model = "gpt2"`), built from the GGUF metadata with the pieces of the
//! Hugging Face `tokenizers` crate, and matching llama.cpp's tokenization of the same file.
//!
//! Encoding runs, in order:
//! 1. special-token extraction: control and unknown tokens (GGUF token types 3 and 2) are cut
//!    out of the text as single ids only when the caller asks for it (`special = true`);
//!    user-defined tokens (type 4) always are, as in llama.cpp;
//! 2. the pre-tokenizer named by `tokenizer.ggml.pre` (for `"smollm"`: every digit is its own
//!    piece, then the GPT-2 regex);
//! 3. byte-level BPE over each piece, with the GGUF vocabulary and merges.
//!
//! Decoding does not use the `tokenizers` decoders: every token has a precomputed byte string
//! (the byte-level alphabet mapped back to raw bytes), ids are decoded by concatenating those
//! bytes, and only then is the result read as UTF-8. A character split across tokens therefore
//! comes out whole, and [`StreamDecoder`] can hold back an incomplete character while streaming.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{
    AddedToken, AddedVocabulary, Model, NormalizerWrapper, OffsetType, PreTokenizer,
    PreTokenizerWrapper,
};

use crate::error::{Error, Result};

/// GGUF `tokenizer.ggml.token_type` of the unknown token (`<unk>`): special.
const TOKEN_TYPE_UNKNOWN: i32 = 2;
/// GGUF `tokenizer.ggml.token_type` of control tokens (`<|im_start|>`, ...): special.
const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF `tokenizer.ggml.token_type` of user-defined tokens: always matched as a whole, plain text.
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

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

/// Tokenizer metadata as read from a GGUF file (the GGUF reader fills this).
#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`; only `"gpt2"` (byte-level BPE) is supported.
    pub model: String,
    /// `tokenizer.ggml.pre`, the pre-tokenizer name: `"smollm"` or `"gpt-2"`. Absent means the
    /// plain GPT-2 regex, as llama.cpp used before the key existed (today's llama.cpp falls back
    /// to its own `"default"` pattern set instead, which is not implemented here).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the token strings in id order, in the byte-level alphabet
    /// (except special and user-defined tokens, which are plain text).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte). When absent, only the BOS and EOS tokens are special.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: BPE merges in priority order, each `"left right"`.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: whether [`Tokenizer::encode`] prepends the BOS id.
    pub add_bos: bool,
}

/// A byte-level BPE tokenizer built from GGUF metadata. Immutable after construction, and
/// `Send + Sync`: one instance can serve several threads.
pub struct Tokenizer {
    /// The BPE model over the GGUF vocabulary and merges.
    bpe: BPE,
    /// Splits text into the pieces that BPE runs on separately.
    pre_tokenizer: PreTokenizerWrapper,
    /// Extracts control, unknown and user-defined tokens (`encode(.., special = true)`).
    added_special: AddedVocabulary,
    /// Extracts only user-defined tokens (`encode(.., special = false)`).
    added_text: AddedVocabulary,
    /// The id [`Tokenizer::encode`] prepends, if the metadata asks for a BOS.
    bos_to_add: Option<u32>,
    /// The raw bytes of every token, end to end: token `id` is
    /// `bytes[offsets[id]..offsets[id + 1]]`.
    bytes: Vec<u8>,
    /// `vocab_size() + 1` offsets into `bytes`.
    offsets: Vec<usize>,
    /// `special[id]`: the token is a control or unknown token.
    special: Vec<bool>,
}

/// Shows the vocabulary size and BOS setting, not the vocabulary-sized tables.
impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_to_add", &self.bos_to_add)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a model other than `"gpt2"` or an unknown
    /// pre-tokenizer (named in the message); [`Error::Model`] for inconsistent metadata: no
    /// tokens, duplicate token strings, a token-type list of the wrong length, a BOS/EOS id
    /// outside the vocabulary, `add_bos` without a BOS id, or a merge that is malformed or
    /// names a token (or a merged result) that is not in the vocabulary.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Tokenizer> {
        let TokenizerSpec { model, pre, tokens, token_types, merges, bos_id, eos_id, add_bos } =
            spec;
        if model != "gpt2" {
            return Err(Error::Unsupported(format!(
                "tokenizer model '{model}' (only 'gpt2' byte-level BPE is implemented)"
            )));
        }
        let pre_tokenizer = pre_tokenizer(pre.as_deref())?;

        let n_tokens = tokens.len();
        if n_tokens == 0 || u32::try_from(n_tokens).is_err() {
            return Err(Error::Model(format!(
                "tokenizer.ggml.tokens has {n_tokens} entries (need 1 to 2^32 - 1)"
            )));
        }
        if let Some(types) = &token_types {
            if types.len() != n_tokens {
                return Err(Error::Model(format!(
                    "tokenizer.ggml.token_type has {} entries for {n_tokens} tokens",
                    types.len()
                )));
            }
        }
        for (key, id) in [("bos_token_id", bos_id), ("eos_token_id", eos_id)] {
            if let Some(id) = id.filter(|&id| id as usize >= n_tokens) {
                return Err(Error::Model(format!(
                    "tokenizer.ggml.{key} = {id} is outside the vocabulary of {n_tokens}"
                )));
            }
        }
        let bos_to_add = match (add_bos, bos_id) {
            (true, None) => {
                return Err(Error::Model(
                    "tokenizer.ggml.add_bos_token is set but there is no bos_token_id".into(),
                ))
            }
            (true, bos) => bos,
            (false, _) => None,
        };

        let token_type = |id: usize| token_types.as_ref().map(|types| types[id]);
        let special: Vec<bool> = (0..n_tokens)
            .map(|id| match token_type(id) {
                Some(kind) => kind == TOKEN_TYPE_CONTROL || kind == TOKEN_TYPE_UNKNOWN,
                None => [bos_id, eos_id].contains(&Some(id as u32)),
            })
            .collect();
        let verbatim = |id: usize| special[id] || token_type(id) == Some(TOKEN_TYPE_USER_DEFINED);

        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n_tokens + 1);
        offsets.push(0);
        for (id, token) in tokens.iter().enumerate() {
            match byte_level_decode(token).filter(|_| !verbatim(id)) {
                Some(raw) => bytes.extend_from_slice(&raw),
                None => bytes.extend_from_slice(token.as_bytes()),
            }
            offsets.push(bytes.len());
        }

        let added_tokens: Vec<AddedToken> = (0..n_tokens)
            .filter(|&id| verbatim(id))
            .map(|id| AddedToken::from(tokens[id].clone(), special[id]).normalized(false))
            .collect();

        let vocab: Vocab = tokens.into_iter().zip(0u32..).collect();
        if vocab.len() != n_tokens {
            return Err(Error::Model(format!(
                "tokenizer.ggml.tokens has {} duplicate strings",
                n_tokens - vocab.len()
            )));
        }
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, merge)| match merge.split_once(' ') {
                Some((left, right)) => Ok((left.to_owned(), right.to_owned())),
                None => Err(Error::Model(format!(
                    "tokenizer.ggml.merges[{i}] = {merge:?} is not two tokens separated by a space"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| Error::Model(format!("tokenizer.ggml.merges: {e}")))?;

        let mut added_special = AddedVocabulary::new();
        added_special.add_tokens(&added_tokens, &bpe, None::<&NormalizerWrapper>);
        let mut added_text = added_special.clone();
        added_text.set_encode_special_tokens(true);

        Ok(Tokenizer {
            bpe,
            pre_tokenizer,
            added_special,
            added_text,
            bos_to_add,
            bytes,
            offsets,
            special,
        })
    }

    /// Number of tokens in the vocabulary; valid ids are `0..vocab_size()`.
    pub fn vocab_size(&self) -> usize {
        self.special.len()
    }

    /// Token ids of `text`, preceded by the BOS id if the metadata sets `add_bos_token`.
    ///
    /// With `special = true`, the text of a control or unknown token (such as `<|im_start|>`)
    /// becomes that token's id; with `special = false` it is tokenized as ordinary text (use this
    /// for untrusted input). User-defined tokens are matched either way. A byte that has no
    /// token in the vocabulary (`SmolLM2` lacks a few control bytes) is skipped, as in llama.cpp.
    ///
    /// # Errors
    /// [`Error::Tokenizer`] if the `tokenizers` pipeline fails (not expected for any input).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        Ok(self.bos_to_add.iter().copied().chain(self.encode_text(text, special)?).collect())
    }

    /// [`Tokenizer::encode`] without the BOS id: the tokens of `text` alone.
    pub fn encode_text(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let added = if special { &self.added_special } else { &self.added_text };
        let mut pieces = added.extract_and_normalize(None::<&NormalizerWrapper>, text);
        self.pre_tokenizer.pre_tokenize(&mut pieces).map_err(tokenizers_error)?;
        pieces.tokenize(|piece| self.bpe.tokenize(piece.get())).map_err(tokenizers_error)?;
        let encoding = pieces.into_encoding(None, 0, OffsetType::None).map_err(tokenizers_error)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`: the raw bytes of all tokens concatenated, then read as UTF-8 (invalid
    /// sequences, such as half a character at the end, become U+FFFD). Special tokens are
    /// rendered as their text.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= vocab_size()`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// The raw bytes of one token: for ordinary tokens the byte-level alphabet mapped back (so
    /// possibly part of a UTF-8 character), for special and user-defined tokens their text.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= vocab_size()`.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        let index = id as usize;
        if index >= self.vocab_size() {
            return Err(Error::TokenOutOfRange { id: id.into(), vocab_size: self.vocab_size() });
        }
        Ok(&self.bytes[self.offsets[index]..self.offsets[index + 1]])
    }

    /// Whether `id` is a special (control or unknown) token, such as `<|im_end|>`. False for
    /// ids outside the vocabulary.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }
}

/// The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre`, with `tokenizers` parts.
fn pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizerWrapper> {
    // The GPT-2 regex, no leading space added; trim_offsets only affects offsets, unused here.
    let gpt2 = ByteLevel::new(false, true, true);
    match pre {
        None | Some("gpt-2") => Ok(gpt2.into()),
        Some("smollm") => Ok(Sequence::new(vec![Digits::new(true).into(), gpt2.into()]).into()),
        Some(other) => Err(Error::Unsupported(format!(
            "tokenizer.ggml.pre = '{other}' (implemented: 'smollm', 'gpt-2')"
        ))),
    }
}

/// The raw bytes a byte-level token stands for, or `None` if it has a char outside the
/// byte-level alphabet (such a token is then taken as plain text, like the `tokenizers`
/// `ByteLevel` decoder does).
fn byte_level_decode(token: &str) -> Option<Vec<u8>> {
    token.chars().map(|c| BYTE_OF_CHAR.get(c as usize).copied().flatten()).collect()
}

/// Wraps an error from the `tokenizers` crate.
fn tokenizers_error(e: tokenizers::Error) -> Error {
    Error::Tokenizer(e.to_string())
}

/// Incremental detokenizer for streaming: push ids one at a time and get back only complete
/// UTF-8 text, holding back the bytes of a character whose remaining bytes are still to come.
///
/// The concatenation of every [`push`](Self::push) output and the final
/// [`finish`](Self::finish) equals [`Tokenizer::decode`] of all the ids, invalid bytes included.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// Bytes received but not yet returned: the start of an incomplete UTF-8 character.
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// An empty decoder.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds token `id` and returns the text that is now complete (possibly empty). Bytes that
    /// can never become valid UTF-8 are returned as U+FFFD right away.
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`] for an id `>= vocab_size()`; the decoder is then unchanged.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.pending.extend_from_slice(tokenizer.token_bytes(id)?);
        let mut text = String::new();
        let mut rest: &[u8] = &self.pending;
        while !rest.is_empty() {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    rest = &[];
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    text.push_str(std::str::from_utf8(valid).expect("valid_up_to marks UTF-8"));
                    match e.error_len() {
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[invalid..];
                        }
                        None => {
                            // An incomplete character at the end: keep it for the next push.
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let consumed = self.pending.len() - rest.len();
        self.pending.drain(..consumed);
        Ok(text)
    }

    /// Returns whatever is still held back (an incomplete character, as U+FFFD) and empties the
    /// decoder, which can then be reused.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

impl TokenizerSpec {
    /// Reads the `tokenizer.ggml.*` metadata of a GGUF file.
    pub fn from_gguf(file: &crate::gguf::GgufFile) -> Result<TokenizerSpec> {
        use crate::gguf::MetadataValue;
        let get = |key: &str| file.get(key);
        let missing = |key: &str| Error::Model(format!("missing or invalid '{key}'"));
        let strings = |key: &str| -> Result<Vec<String>> {
            match get(key) {
                None => Ok(Vec::new()),
                Some(v) => v
                    .as_array()
                    .ok_or_else(|| missing(key))?
                    .iter()
                    .map(|s| s.as_str().map(str::to_owned).ok_or_else(|| missing(key)))
                    .collect(),
            }
        };
        let model = get("tokenizer.ggml.model").and_then(MetadataValue::as_str).ok_or_else(|| missing("tokenizer.ggml.model"))?;
        let token_types = match get("tokenizer.ggml.token_type") {
            None => None,
            Some(v) => Some(
                v.as_array()
                    .ok_or_else(|| missing("tokenizer.ggml.token_type"))?
                    .iter()
                    .map(|t| t.as_i64().and_then(|t| i32::try_from(t).ok()).ok_or_else(|| missing("tokenizer.ggml.token_type")))
                    .collect::<Result<Vec<i32>>>()?,
            ),
        };
        let id = |key: &str| get(key).and_then(MetadataValue::as_u64).and_then(|v| u32::try_from(v).ok());
        Ok(TokenizerSpec {
            model: model.to_owned(),
            pre: get("tokenizer.ggml.pre").and_then(MetadataValue::as_str).map(str::to_owned),
            tokens: strings("tokenizer.ggml.tokens")?,
            token_types,
            merges: strings("tokenizer.ggml.merges")?,
            bos_id: id("tokenizer.ggml.bos_token_id"),
            eos_id: id("tokenizer.ggml.eos_token_id"),
            add_bos: get("tokenizer.ggml.add_bos_token").and_then(MetadataValue::as_bool).unwrap_or(false),
        })
    }
}
