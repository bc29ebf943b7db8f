//! The real Gemma 3 270M file (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors) against
//! transformers' float32 forward of the same dequantized weights (tests/data/gemma3/, made
//! by scripts/gemma3_reference.py): last-position logits of six prompts, every position of
//! one, greedy continuations; and determinism across threads, chunkings and ISAs.

use std::sync::OnceLock;

use crate::common;

use common::*;
use reprolm::gguf::GgufFile;
use reprolm::kernels::{Isa, Precision};
use reprolm::model::{KvCache, Transformer, TransformerWeights, LogitRows, ModelConfig, Scratch};
use reprolm::threads::ThreadPool;
use serde_json::Value;

fn load(isa: Isa) -> Transformer {
    let file = GgufFile::open(cached_model("gemma-3-270m-q4_k_m.gguf", "gemma3-270m")).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    let weights = TransformerWeights::from_gguf_with(&file, &config, Precision::Float32).unwrap();
    Transformer { config, weights, isa }
}

fn model() -> &'static Transformer {
    static MODEL: OnceLock<Transformer> = OnceLock::new();
    MODEL.get_or_init(|| load(Isa::best()))
}

fn reference() -> &'static Value {
    static REF: OnceLock<Value> = OnceLock::new();
    REF.get_or_init(|| serde_json::from_str(&std::fs::read_to_string(data_path("gemma3/reference.json")).unwrap()).unwrap())
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Largest |difference| between a row of logits and a reference row (at its sampled ids and
/// its top ids); also checks the row's argmax.
fn row_diff(got: &[f32], want: &Value) -> f32 {
    let sampled = ids(&reference()["sampled_ids"]);
    let (top_ids, top) = (ids(&want["top_ids"]), floats(&want["top"]));
    let at = |ids: &[u32]| ids.iter().map(|&i| got[i as usize]).collect::<Vec<f32>>();
    let diff = max_abs_diff(&at(&sampled), &floats(&want["sampled"])).max(max_abs_diff(&at(&top_ids), &top));
    let argmax = got.iter().enumerate().fold(0, |best, (i, &v)| if v > got[best] { i } else { best });
    assert!(got[argmax] - top[0] < 1e-3, "a token outside the reference's top has the largest logit");
    diff
}

#[test]
fn gemma3_config_is_read_from_the_file() {
    let c = &model().config;
    assert_eq!((c.architecture.as_str(), c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim), ("gemma3", 18, 640, 4, 1, 256));
    assert_eq!((c.ffn_dim, c.vocab_size, c.context_length), (2048, 262_144, 32_768));
    let local: Vec<usize> = (0..18).filter(|&l| c.layers[l].window == Some(512)).collect();
    assert_eq!(local.len(), 15);
    assert!((0..18).all(|l| (c.layers[l].window.is_none()) == (l % 6 == 5)));
    assert!((0..18).all(|l| c.layers[l].rope_base == if l % 6 == 5 { 1e6 } else { 1e4 }));
}

#[test]
fn gemma3_logits_match_transformers() {
    let model = model();
    let vocab = model.config.vocab_size;
    for (i, p) in reference()["prompts"].as_array().unwrap().iter().enumerate() {
        let prompt = ids(&p["ids"]);
        let all = p.get("all_positions").is_some();
        let rows = if all { LogitRows::All } else { LogitRows::Last };
        let got = forward_logits(model, 2, &[&prompt], rows);
        let diff = row_diff(&got[got.len() - vocab..], &p["last"]);
        eprintln!("prompt {i}: last position max |diff| {diff:e}");
        assert!(diff < 1e-3, "prompt {i}: max |diff| = {diff}");
        if all {
            for (pos, want) in p["all_positions"].as_array().unwrap().iter().enumerate() {
                let diff = row_diff(&got[pos * vocab..(pos + 1) * vocab], want);
                assert!(diff < 1e-3, "prompt {i}, position {pos}: max |diff| = {diff}");
            }
        }
    }
}

#[test]
fn gemma3_greedy_continuations_match_transformers() {
    let model = model();
    let pool = ThreadPool::new(2).unwrap();
    for (i, p) in reference()["prompts"].as_array().unwrap().iter().enumerate().take(3) {
        let expected = ids(&p["greedy"]);
        let mut cache = KvCache::new(&model.config, 128).unwrap();
        let mut scratch = Scratch::default();
        let mut input = ids(&p["ids"]);
        let mut got = Vec::new();
        while got.len() < expected.len() {
            model.forward(&pool, &mut cache, &mut scratch, &input, LogitRows::Last).unwrap();
            let l = &scratch.logits;
            let next = (0..l.len()).fold(0, |best, j| if l[j] > l[best] { j } else { best }) as u32;
            got.push(next);
            input = vec![next];
        }
        assert_eq!(got, expected, "prompt {i}");
    }
}

#[test]
fn gemma3_is_bitwise_identical_across_threads_chunking_and_isa() {
    let prompt = ids(&reference()["prompts"][1]["ids"]);
    let bits = |model: &Transformer, threads, chunk: usize| -> Vec<u32> {
        let chunks: Vec<&[u32]> = prompt.chunks(chunk).collect();
        forward_logits(model, threads, &chunks, LogitRows::All).iter().map(|v| v.to_bits()).collect()
    };
    let reference = bits(model(), 1, usize::MAX);
    assert!(bits(model(), 3, usize::MAX) == reference, "threads");
    assert!(bits(model(), 2, 3) == reference, "chunking");
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.available() && *i != Isa::best()) {
        assert!(bits(&load(isa), 2, 7) == reference, "isa = {}", isa.name());
    }
}

/// The model with its weights packed for int8 (Q4_K, Q6_K, Q8_0 and Q5_0 matrices on the
/// int8 kernels).
fn load_int8(isa: Isa) -> Transformer {
    let file = GgufFile::open(cached_model("gemma-3-270m-q4_k_m.gguf", "gemma3-270m")).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    let weights = TransformerWeights::from_gguf_with(&file, &config, Precision::Int8).unwrap();
    Transformer { config, weights, isa }
}

fn best_int8() -> Isa {
    [Isa::Avx512, Isa::Avx2].into_iter().find(|i| i.int8_available()).unwrap_or(Isa::Scalar)
}

fn model_int8() -> &'static Transformer {
    static MODEL: OnceLock<Transformer> = OnceLock::new();
    MODEL.get_or_init(|| load_int8(best_int8()))
}

#[test]
fn gemma3_int8_is_bitwise_identical_across_threads_chunking_and_isa() {
    let prompt = ids(&reference()["prompts"][1]["ids"]);
    let bits = |model: &Transformer, threads, chunk: usize| -> Vec<u32> {
        let chunks: Vec<&[u32]> = prompt.chunks(chunk).collect();
        forward_logits(model, threads, &chunks, LogitRows::All).iter().map(|v| v.to_bits()).collect()
    };
    let reference = bits(model_int8(), 1, usize::MAX);
    assert!(bits(model_int8(), 3, usize::MAX) == reference, "threads");
    assert!(bits(model_int8(), 2, 3) == reference, "chunking");
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.int8_available() && *i != best_int8()) {
        assert!(bits(&load_int8(isa), 2, 7) == reference, "isa = {}", isa.name());
    }
}

/// int8 quality: the mean KL divergence of int8's next-token distributions from float32's
/// (which match transformers, above) over the reference prompts.
#[test]
fn gemma3_int8_next_token_distributions_close_to_float32() {
    let softmax = |z: &[f32]| -> Vec<f64> {
        let max = z.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let e: Vec<f64> = z.iter().map(|&v| (v as f64 - max).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|v| v / s).collect()
    };
    let mut kls = Vec::new();
    for (i, p) in reference()["prompts"].as_array().unwrap().iter().enumerate() {
        let prompt = ids(&p["ids"]);
        let f = softmax(&forward_logits(model(), 2, &[&prompt], LogitRows::Last));
        let q = softmax(&forward_logits(model_int8(), 2, &[&prompt], LogitRows::Last));
        let kl: f64 = f.iter().zip(&q).filter(|(&p, _)| p > 0.0).map(|(&p, &q)| p * (p / q).ln()).sum();
        eprintln!("prompt {i}: KL(float32 || int8) = {kl:.3e}");
        kls.push(kl);
    }
    let mean = kls.iter().sum::<f64>() / kls.len() as f64;
    eprintln!("mean KL(float32 || int8) over {} prompts = {mean:.3e}", kls.len());
    // The bound of forward_int8.rs for SmolLM2 against its reference.
    assert!(mean <= 5e-3, "mean KL {mean}");
}
