//! The `tokenizer.ggml.*` metadata of a GGUF file, read into one plain struct.

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, MetadataValue};

/// Tokenizer metadata as read from a GGUF file. Options that llama.cpp defaults per tokenizer
/// kind when the key is absent are `None` here; [`super::Tokenizer::from_spec`] resolves them.
#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`, the pre-tokenizer of a `"gpt2"` model (`"llama-bpe"`, `"qwen2"`,
    /// `"qwen35"`, `"gpt-2"`, `"smollm"`). Absent means the plain GPT-2 regex, as llama.cpp
    /// used before the key existed. Ignored for `"llama"` (SentencePiece has no pre-tokenizer).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the token strings in id order (byte-level alphabet for `"gpt2"`,
    /// text with `▁` for spaces for `"llama"`; special and user-defined tokens are plain text).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte). When absent, only the BOS and EOS tokens are special.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.scores`, one per token: SentencePiece merge priorities (higher first).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges`: BPE merges in priority order, each `"left right"`.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`: what SentencePiece emits for a byte without a token.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`. Default: true for SentencePiece and `llama-bpe`, else false.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`. Default: false.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`: SentencePiece puts a space before the text (and after
    /// every special token). Default: true for SentencePiece; BPE never does.
    pub add_space_prefix: Option<bool>,
    /// `general.name`: llama.cpp gives Phi-3's special tokens the "strip whitespace to the
    /// right" attribute by this name (the GGUF has no key for it), and so does reprolm.
    pub model_name: Option<String>,
}

impl TokenizerSpec {
    /// Reads the `tokenizer.ggml.*` metadata (and `general.name`) of a GGUF file.
    ///
    /// # Errors
    /// [`Error::Model`] if `tokenizer.ggml.model` is missing or a key has the wrong type.
    pub fn from_gguf(file: &GgufFile) -> Result<TokenizerSpec> {
        let get = |key: &str| file.get(key);
        let invalid = |key: &str| Error::Model(format!("missing or invalid '{key}'"));
        let array = |key: &str| -> Result<Option<&[MetadataValue]>> {
            get(key).map(|v| v.as_array().ok_or_else(|| invalid(key))).transpose()
        };
        let strings = |key: &str| -> Result<Vec<String>> {
            array(key)?
                .unwrap_or_default()
                .iter()
                .map(|s| s.as_str().map(str::to_owned).ok_or_else(|| invalid(key)))
                .collect()
        };
        let string = |key: &str| -> Result<Option<String>> {
            get(key).map(|v| v.as_str().map(str::to_owned).ok_or_else(|| invalid(key))).transpose()
        };
        let flag = |key: &str| -> Result<Option<bool>> {
            get(key).map(|v| v.as_bool().ok_or_else(|| invalid(key))).transpose()
        };
        let id = |key: &str| get(key).and_then(MetadataValue::as_u64).and_then(|v| u32::try_from(v).ok());

        let model = string("tokenizer.ggml.model")?.ok_or_else(|| invalid("tokenizer.ggml.model"))?;
        let token_types = array("tokenizer.ggml.token_type")?
            .map(|types| {
                types
                    .iter()
                    .map(|t| t.as_i64().and_then(|t| i32::try_from(t).ok()))
                    .collect::<Option<Vec<i32>>>()
                    .ok_or_else(|| invalid("tokenizer.ggml.token_type"))
            })
            .transpose()?;
        let scores = array("tokenizer.ggml.scores")?
            .map(|scores| {
                scores
                    .iter()
                    .map(|s| match s {
                        MetadataValue::F32(v) => Some(*v),
                        _ => None,
                    })
                    .collect::<Option<Vec<f32>>>()
                    .ok_or_else(|| invalid("tokenizer.ggml.scores"))
            })
            .transpose()?;
        Ok(TokenizerSpec {
            model,
            pre: string("tokenizer.ggml.pre")?,
            tokens: strings("tokenizer.ggml.tokens")?,
            token_types,
            scores,
            merges: strings("tokenizer.ggml.merges")?,
            bos_id: id("tokenizer.ggml.bos_token_id"),
            eos_id: id("tokenizer.ggml.eos_token_id"),
            unk_id: id("tokenizer.ggml.unknown_token_id"),
            add_bos: flag("tokenizer.ggml.add_bos_token")?,
            add_eos: flag("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
            model_name: string("general.name")?,
        })
    }
}
