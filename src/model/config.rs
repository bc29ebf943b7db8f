//! Hyper-parameters and the architecture description of a model, read from GGUF metadata
//! (`<arch>.*` keys). The architecture is data: one forward pass runs every supported
//! architecture, steered by the values here and by which optional tensors the file has.

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// Which dimensions of a head RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i + 1)` (ggml's "normal" mode: Llama files, whose converter
    /// permutes the Q and K rows to match).
    Adjacent,
    /// Pairs `(i, i + head_dim / 2)` (ggml's NEOX mode: Qwen, Phi-3, Gemma).
    Halves,
}

/// The gate's activation in the gated feed-forward block `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU; Gemma).
    GeluTanh,
}

/// What differs between the supported architectures beyond the shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchTraits {
    pub name: &'static str,
    pub rope_style: RopeStyle,
    pub activation: Activation,
    /// Token embeddings are multiplied by `sqrt(d_model)` (Gemma).
    pub scale_embeddings: bool,
    /// Every layer has `attn_q_norm` / `attn_k_norm`: RMSNorm of each query and key head
    /// before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Every layer has `attn_q/k/v.bias` (Qwen2).
    pub qkv_bias: bool,
    /// Every layer normalizes the attention and feed-forward outputs before their residual
    /// adds (`post_attention_norm`, `post_ffw_norm`: Gemma's sandwich norms).
    pub post_norms: bool,
    /// Which layers use the sliding window when the file gives one
    /// (`<arch>.attention.sliding_window`).
    pub window_layers: WindowLayers,
}

/// Which layers attend through the file's sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowLayers {
    /// All of them (Mistral-style).
    All,
    /// Layer `i` if `i % n != n - 1`: the others are global; windowed layers use the RoPE base
    /// `<arch>.rope.freq_base_swa` (default 10000) (Gemma 3, `n` = 6).
    Pattern(usize),
    /// None: the key is ignored (Phi-3, as llama.cpp does: its converter's value is not the
    /// window the model was trained with).
    Ignored,
}

const LLAMA: ArchTraits = ArchTraits {
    name: "llama",
    rope_style: RopeStyle::Adjacent,
    activation: Activation::Silu,
    scale_embeddings: false,
    qk_norm: false,
    qkv_bias: false,
    post_norms: false,
    window_layers: WindowLayers::All,
};

/// The architectures reprolm runs, by their GGUF `general.architecture` name.
pub const ARCHITECTURES: &[ArchTraits] = &[
    LLAMA,
    ArchTraits { name: "qwen2", rope_style: RopeStyle::Halves, qkv_bias: true, ..LLAMA },
    ArchTraits { name: "qwen3", rope_style: RopeStyle::Halves, qk_norm: true, ..LLAMA },
    ArchTraits { name: "phi3", rope_style: RopeStyle::Halves, window_layers: WindowLayers::Ignored, ..LLAMA },
    ArchTraits {
        name: "gemma3",
        rope_style: RopeStyle::Halves,
        activation: Activation::GeluTanh,
        scale_embeddings: true,
        qk_norm: true,
        post_norms: true,
        window_layers: WindowLayers::Pattern(6),
        ..LLAMA
    },
];

/// One layer's attention settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerAttention {
    /// A query at position `q` attends to positions `q - window + 1 ..= q` only (sliding
    /// window attention); `None`: to every earlier position.
    pub window: Option<usize>,
    /// RoPE base of this layer (Gemma 3's local layers use their own).
    pub rope_base: f32,
}

/// Everything the forward pass needs to know about shapes and constants.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub traits: ArchTraits,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Width of one attention head (`<arch>.attention.key_length`; by default
    /// `d_model / n_heads`).
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    /// RoPE base of the global layers (`<arch>.rope.freq_base`).
    pub rope_base: f32,
    /// Linear RoPE scaling: positions are multiplied by this (`1 / rope.scaling.factor`).
    pub rope_position_scale: f32,
    pub layers: Vec<LayerAttention>,
    pub rms_eps: f32,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
}

/// Which layers attend through the sliding window: by the architecture's rule, or by the
/// file's `<arch>.attention.sliding_window_pattern` (a period `n`, or one flag per layer).
fn windowed_layers(file: &GgufFile, pattern_key: &str, rule: WindowLayers, n_layers: usize) -> Result<Vec<bool>> {
    let invalid = || Error::Model(format!("invalid '{pattern_key}'"));
    let period = |n: usize| (0..n_layers).map(|i| i % n != n - 1).collect();
    match rule {
        WindowLayers::All => Ok(vec![true; n_layers]),
        WindowLayers::Ignored => Ok(vec![false; n_layers]),
        WindowLayers::Pattern(default) => match file.get(pattern_key) {
            None => Ok(period(default)),
            Some(v) => match (v.as_u64(), v.as_array()) {
                (Some(0), _) => Ok(vec![true; n_layers]),
                (Some(n), _) => Ok(period(n as usize)),
                (None, Some(flags)) if flags.len() == n_layers => {
                    flags.iter().map(|f| f.as_bool().ok_or_else(invalid)).collect()
                }
                _ => Err(invalid()),
            },
        },
    }
}

/// The supported architecture names, for error messages.
pub fn supported_architectures() -> String {
    ARCHITECTURES.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let architecture = file
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Error::Model("missing general.architecture".into()))?
            .to_string();
        let traits = *ARCHITECTURES.iter().find(|a| a.name == architecture).ok_or_else(|| {
            Error::Unsupported(format!("architecture '{architecture}' (supported: {})", supported_architectures()))
        })?;
        let key = |k: &str| format!("{architecture}.{k}");
        let uint = |k: &str| -> Result<usize> {
            let full = key(k);
            file.get(&full)
                .and_then(|v| v.as_u64())
                .filter(|&v| v > 0 && v <= 1 << 24)
                .map(|v| v as usize)
                .ok_or_else(|| Error::Model(format!("missing or invalid '{full}'")))
        };
        let optional_uint = |k: &str| -> Result<Option<usize>> {
            match file.get(&key(k)) {
                None => Ok(None),
                Some(_) => uint(k).map(Some),
            }
        };
        let n_layers = uint("block_count")?;
        let d_model = uint("embedding_length")?;
        let n_heads = uint("attention.head_count")?;
        let n_kv_heads = optional_uint("attention.head_count_kv")?.unwrap_or(n_heads);
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

        if n_kv_heads > n_heads || n_heads % n_kv_heads != 0 {
            return Err(Error::Model(format!("{n_heads} query heads cannot share {n_kv_heads} KV heads evenly")));
        }
        let head_dim = match optional_uint("attention.key_length")? {
            Some(hd) => hd,
            None if d_model % n_heads == 0 => d_model / n_heads,
            None => return Err(Error::Model(format!("{d_model} dimensions do not split into {n_heads} heads"))),
        };
        if let Some(v) = optional_uint("attention.value_length")? {
            if v != head_dim {
                return Err(Error::Unsupported(format!("value heads of {v} dimensions with key heads of {head_dim}")));
            }
        }
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
        let rope_position_scale = match file.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
            None | Some("none") => 1.0,
            Some("linear") => 1.0 / float("rope.scaling.factor", 1.0)?,
            Some(other) => return Err(Error::Unsupported(format!("RoPE scaling '{other}' (supported: linear)"))),
        };
        // 0 (or absent): no window.
        let window = match file.get(&key("attention.sliding_window")) {
            None => None,
            Some(v) => match v.as_u64() {
                Some(0) => None,
                Some(_) => Some(uint("attention.sliding_window")?),
                None => return Err(Error::Model(format!("invalid '{}'", key("attention.sliding_window")))),
            },
        };
        let local_rope_base = float("rope.freq_base_swa", 10_000.0)?;
        let windowed = windowed_layers(file, &key("attention.sliding_window_pattern"), traits.window_layers, n_layers)?;
        let layers = windowed
            .into_iter()
            .map(|w| match (window, w, traits.window_layers) {
                (Some(_), true, WindowLayers::Pattern(_)) => LayerAttention { window, rope_base: local_rope_base },
                (Some(_), true, _) => LayerAttention { window, rope_base },
                _ => LayerAttention { window: None, rope_base },
            })
            .collect();
        Ok(ModelConfig {
            architecture,
            traits,
            n_layers,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            context_length,
            rope_base,
            rope_position_scale,
            layers,
            rms_eps,
            bos_id: token_id("tokenizer.ggml.bos_token_id"),
            eos_id: token_id("tokenizer.ggml.eos_token_id"),
        })
    }

    /// Width of the K and V projections: `head_dim * n_kv_heads`.
    pub fn d_kv(&self) -> usize {
        self.head_dim * self.n_kv_heads
    }

    /// Width of the Q projection and of the attention output: `head_dim * n_heads`.
    pub fn d_q(&self) -> usize {
        self.head_dim * self.n_heads
    }

    /// Query heads that share one KV head.
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }
}
