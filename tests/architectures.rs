//! Every supported architecture on tiny random models (tests/data/arch/, made by
//! scripts/make_arch_fixtures.py with transformers and llama.cpp's convert_hf_to_gguf.py):
//! logits of all positions of several prompts against transformers' float32 forward, in
//! F32, F16 and Q8_0 files; and the determinism guarantees on each.

use crate::common;

use common::*;
use reprolm::gguf::GgufFile;
use reprolm::kernels::{Isa, Precision};
use reprolm::model::{KvCache, KvCacheOptions, KvDtype, Transformer, TransformerWeights, LogitRows, ModelConfig, Overflow, Scratch};
use reprolm::threads::ThreadPool;

const ARCHS: [&str; 6] = ["llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma3"];
const TYPES: [&str; 3] = ["f32", "f16", "q8_0"];

fn arch_path(name: &str) -> std::path::PathBuf {
    data_path(&format!("arch/{name}"))
}

fn load(name: &str, isa: Isa, precision: Precision) -> Transformer {
    let file = GgufFile::open(arch_path(&format!("{name}.gguf"))).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    let weights = TransformerWeights::from_gguf_with(&file, &config, precision).unwrap();
    Transformer { config, weights, isa }
}

fn prompts() -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(arch_path("references.json")).unwrap();
    let refs: serde_json::Value = serde_json::from_str(&text).unwrap();
    refs["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect())
        .collect()
}

/// The reference logits of every position of every prompt, [positions][vocab].
fn reference(name: &str) -> Vec<f32> {
    let bytes = std::fs::read(arch_path(&format!("{name}.logits.f32"))).unwrap();
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// Logits of all positions of `ids`, fed in `chunk`-token calls on a pool of `threads`.
fn logits(model: &Transformer, ids: &[u32], threads: usize, chunk: usize) -> Vec<f32> {
    let chunks: Vec<&[u32]> = ids.chunks(chunk).collect();
    forward_logits(model, threads, &chunks, LogitRows::All)
}

#[test]
fn logits_match_transformers_on_every_architecture_and_type() {
    let prompts = prompts();
    for arch in ARCHS {
        for ty in TYPES {
            let name = format!("{arch}-{ty}");
            let model = load(&name, Isa::best(), Precision::Float32);
            assert_eq!(model.config.architecture, if arch == "llama3" || arch == "mistral" { "llama" } else { arch });
            let expected = reference(&name);
            let vocab = model.config.vocab_size;
            let (mut at, mut worst, mut scale) = (0, 0f32, 0f32);
            for ids in &prompts {
                let got = logits(&model, ids, 2, usize::MAX);
                let want = &expected[at * vocab..(at + ids.len()) * vocab];
                worst = worst.max(max_abs_diff(&got, want));
                scale = want.iter().fold(scale, |m, v| m.max(v.abs()));
                at += ids.len();
            }
            assert_eq!(at * vocab, expected.len(), "{name}: reference size");
            eprintln!("{name}: max |diff| {worst:e} (max |logit| {scale:.2})");
            assert!(worst < 1e-4, "{name}: max |diff| = {worst}");
        }
    }
}

#[test]
fn every_architecture_is_bitwise_identical_across_threads_chunking_isa_and_precision() {
    let ids = prompts().pop().unwrap();
    let isas: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.available()).collect();
    for arch in ARCHS {
        for (ty, precision) in [("f16", Precision::Float32), ("q8_0", Precision::Float32), ("q8_0", Precision::Int8)] {
            let name = format!("{arch}-{ty}");
            let bits = |model: &Transformer, threads, chunk| -> Vec<u32> {
                logits(model, &ids, threads, chunk).iter().map(|v| v.to_bits()).collect()
            };
            let best = load(&name, Isa::best(), precision);
            let reference = bits(&best, 1, usize::MAX);
            for threads in [2, 3] {
                assert!(bits(&best, threads, usize::MAX) == reference, "{name} {precision:?}: threads = {threads}");
            }
            for chunk in [1, 7] {
                assert!(bits(&best, 2, chunk) == reference, "{name} {precision:?}: chunk = {chunk}");
            }
            for &isa in &isas {
                if precision == Precision::Int8 && !isa.int8_available() {
                    continue;
                }
                assert!(bits(&load(&name, isa, precision), 2, 5) == reference, "{name} {precision:?}: isa = {}", isa.name());
            }
        }
    }
}

/// Gemma 3's layer settings as read from the file: five local layers of six with the
/// window 8 and the local RoPE base, then a global one. (Matching transformers on the
/// 40-token prompt above is what shows the window is applied right; here, a cache too small
/// for the global layer must change its logits exactly once it is outgrown.)
#[test]
fn gemma3_windowed_layers_attend_to_their_window_only() {
    let model = load("gemma3-f32", Isa::best(), Precision::Float32);
    let windows: Vec<Option<usize>> = model.config.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(8), Some(8), Some(8), Some(8), Some(8), None]);
    let bases: Vec<f32> = model.config.layers.iter().map(|l| l.rope_base).collect();
    assert_eq!(bases, [1e4, 1e4, 1e4, 1e4, 1e4, 1e6]);
    let ids = prompts().pop().unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let opts = KvCacheOptions { capacity: 16, dtype: KvDtype::F32, overflow: Overflow::SlidingWindow { n_keep: 0 } };
    let mut cache = KvCache::with_options(&model.config, &opts).unwrap();
    let mut scratch = Scratch::default();
    let mut ring = Vec::new();
    for &id in &ids {
        model.forward(&pool, &mut cache, &mut scratch, &[id], LogitRows::All).unwrap();
        ring.extend_from_slice(&scratch.logits);
    }
    let full = logits(&model, &ids, 2, usize::MAX);
    let vocab = model.config.vocab_size;
    assert!(ring[..16 * vocab] == full[..16 * vocab], "identical while the ring holds every position");
    assert!(ring[16 * vocab..] != full[16 * vocab..], "the global layer sees fewer positions once the ring is outgrown");

    // Without the window the local layers would see more, and miss the reference.
    let mut unwindowed = model;
    unwindowed.config.layers.iter_mut().for_each(|l| l.window = None);
    let expected = reference("gemma3-f32");
    let n = ids.len() * vocab;
    let diff = max_abs_diff(&logits(&unwindowed, &ids, 2, usize::MAX), &expected[expected.len() - n..]);
    assert!(diff > 1e-2, "the window must matter on a 40-token prompt: {diff}");
}
