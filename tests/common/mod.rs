//! Shared helpers for the integration tests: locating the model, reading reference data,
//! loading and running the model, and test data.

#![allow(dead_code)]

use std::path::PathBuf;

pub mod int8;
pub mod outcome;

/// The default model: `REPROLM_MODEL`, else the cache the Python helper fills
/// (`REPROLM_CACHE`, else `$XDG_CACHE_HOME/reprolm` or `~/.cache/reprolm`).
pub fn model_path() -> PathBuf {
    if let Ok(p) = std::env::var("REPROLM_MODEL") {
        return PathBuf::from(p);
    }
    cached_model("SmolLM2-135M-Instruct.Q4_1.gguf", "")
}

/// Known model `file` in the cache (fetched by `python -m reprolm download <name>`).
pub fn cached_model(file: &str, name: &str) -> PathBuf {
    let cache = std::env::var("REPROLM_CACHE").map(PathBuf::from).unwrap_or_else(|_| {
        let base = std::env::var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache"));
        base.join("reprolm")
    });
    let path = cache.join(file);
    assert!(
        path.exists(),
        "{} is missing: fetch it with `python -m reprolm download {name}` (or set REPROLM_MODEL)",
        path.display()
    );
    path
}

pub fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// Reads a little-endian float32 C-order .npy file: (shape, values).
pub fn read_npy_f32(name: &str) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(data_path(name)).expect("reference file");
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
    assert!(header.contains("'<f4'") && header.contains("'fortran_order': False"), "{header}");
    let shape_str = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape: Vec<usize> = shape_str.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect();
    let data = bytes[10 + header_len..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    (shape, data)
}

pub struct Generation {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_text: String,
}

pub fn generations() -> Vec<Generation> {
    let text = std::fs::read_to_string(data_path("generations.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| x.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
    v.as_array()
        .unwrap()
        .iter()
        .map(|g| Generation {
            prompt: g["prompt"].as_str().unwrap().to_string(),
            prompt_ids: ids(&g["prompt_ids"]),
            greedy_ids: ids(&g["greedy_ids"]),
            greedy_text: g["greedy_text"].as_str().unwrap().to_string(),
        })
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// xorshift64*, enough for test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    pub fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// The default model with its weights packed for `precision`, on the kernels of `isa`.
pub fn load_llama(isa: reprolm::kernels::Isa, precision: reprolm::kernels::Precision) -> reprolm::model::Transformer {
    use reprolm::model::{Transformer, TransformerWeights, ModelConfig};
    let file = reprolm::gguf::GgufFile::open(model_path()).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    let weights = TransformerWeights::from_gguf_with(&file, &config, precision).unwrap();
    Transformer { config, weights, isa }
}

/// The logits `rows` of each of `chunks` fed in turn to one fresh 512-position cache on a
/// pool of `threads`, concatenated.
pub fn forward_logits(
    model: &reprolm::model::Transformer,
    threads: usize,
    chunks: &[&[u32]],
    rows: reprolm::model::LogitRows,
) -> Vec<f32> {
    let pool = reprolm::threads::ThreadPool::new(threads).unwrap();
    let mut cache = reprolm::model::KvCache::new(&model.config, 512).unwrap();
    let mut scratch = reprolm::model::Scratch::default();
    let mut out = Vec::new();
    for c in chunks {
        model.forward(&pool, &mut cache, &mut scratch, c, rows).unwrap();
        out.extend_from_slice(&scratch.logits);
    }
    out
}
