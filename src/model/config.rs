//! Hyper-parameters of a Llama-family model, read from GGUF metadata (`<arch>.*` keys).

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// Everything the forward pass needs to know about shapes and constants.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
}

/// Architectures whose GGUF layout and forward pass are the Llama one.
const LLAMA_LIKE: &[&str] = &["llama"];

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let architecture = file
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Error::Model("missing general.architecture".into()))?
            .to_string();
        if !LLAMA_LIKE.contains(&architecture.as_str()) {
            return Err(Error::Unsupported(format!("architecture '{architecture}' (supported: llama)")));
        }
        let key = |k: &str| format!("{architecture}.{k}");
        let uint = |k: &str| -> Result<usize> {
            let full = key(k);
            file.get(&full)
                .and_then(|v| v.as_u64())
                .filter(|&v| v > 0 && v <= 1 << 24)
                .map(|v| v as usize)
                .ok_or_else(|| Error::Model(format!("missing or invalid '{full}'")))
        };
        let n_layers = uint("block_count")?;
        let d_model = uint("embedding_length")?;
        let n_heads = uint("attention.head_count")?;
        let n_kv_heads = match file.get(&key("attention.head_count_kv")) {
            None => n_heads,
            Some(_) => uint("attention.head_count_kv")?,
        };
        let ffn_dim = uint("feed_forward_length")?;
        let context_length = uint("context_length")?;
        let float = |k: &str, default: f64| -> Result<f32> {
            let full = key(k);
            match file.get(&full) {
                None => Ok(default as f32),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .map(|x| x as f32)
                    .ok_or_else(|| Error::Model(format!("invalid '{full}': {}", v.summary()))),
            }
        };
        let rope_base = float("rope.freq_base", 10_000.0)?;
        let rms_eps = float("attention.layer_norm_rms_epsilon", 1e-5)?;
        let token_id = |k: &str| file.get(k).and_then(|v| v.as_u64()).map(|v| v as u32);

        let vocab_from_tokens = file.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).map(|a| a.len());
        let vocab_size = match file.get(&key("vocab_size")) {
            Some(_) => uint("vocab_size")?,
            None => vocab_from_tokens.ok_or_else(|| Error::Model("cannot determine the vocabulary size".into()))?,
        };

        if d_model % n_heads != 0 || n_heads % n_kv_heads != 0 {
            return Err(Error::Model(format!(
                "{d_model} dimensions, {n_heads} heads and {n_kv_heads} KV heads do not divide evenly"
            )));
        }
        let head_dim = d_model / n_heads;
        if let Some(rot) = file.get(&key("rope.dimension_count")).and_then(|v| v.as_u64()) {
            if rot as usize != head_dim {
                return Err(Error::Unsupported(format!(
                    "partial rotary embeddings ({rot} of {head_dim} dimensions)"
                )));
            }
        }
        if head_dim % 32 != 0 {
            return Err(Error::Unsupported(format!("head dimension {head_dim} (must be a multiple of 32)")));
        }
        let config = ModelConfig {
            architecture,
            n_layers,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            context_length,
            rope_base,
            rms_eps,
            bos_id: token_id("tokenizer.ggml.bos_token_id"),
            eos_id: token_id("tokenizer.ggml.eos_token_id"),
        };
        Ok(config)
    }

    /// Width of the K and V projections: `head_dim * n_kv_heads`.
    pub fn d_kv(&self) -> usize {
        self.head_dim * self.n_kv_heads
    }

    /// Query heads that share one KV head.
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }
}
