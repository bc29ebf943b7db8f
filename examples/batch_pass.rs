//! Times one forward pass of the batch engine's decode shape: N sequences with a CACHE-token
//! cache each (default 128), one new row per sequence (logits for every row), against one sequence
//! with the same cache prefilling N tokens (logits for the last row only), on the default model. Not a test:
//! prints medians of repeated passes.
//!
//! `cargo run --release --example batch_pass [-- N THREADS PRECISION CACHE KV_DTYPE]` (default
//! 16 2 float32 128 f32; CACHE at most 511). Two runs with different CACHE tell the attention's
//! share.

use std::time::Instant;

use reprolm::loaded_model::{LoadedModel, LoadOptions};
use reprolm::model::{KvCache, KvCacheOptions, KvDtype, LogitRows, Scratch, SeqInput};
use reprolm::threads::ThreadPool;

fn model_path() -> std::path::PathBuf {
    let base = std::env::var("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache"));
    std::env::var("REPROLM_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| base.join("reprolm/SmolLM2-135M-Instruct.Q4_1.gguf"))
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).map_or(16, |s| s.parse().expect("N"));
    let threads: usize = args.get(2).map_or(2, |s| s.parse().expect("THREADS"));
    let precision = args.get(3).cloned().unwrap_or_else(|| "float32".into());
    let cached: usize = args.get(4).map_or(128, |s| s.parse().expect("CACHE"));
    assert!((1..512).contains(&cached), "CACHE: 1 to 511 positions (the caches hold 512)");
    let dtype = KvDtype::parse(args.get(5).map_or("f32", |s| s.as_str())).expect("KV_DTYPE: f32 or f16");
    let cache_options = KvCacheOptions { dtype, ..KvCacheOptions::new(512) };
    let options = LoadOptions { threads: Some(1), precision: Some(precision.clone()), ..LoadOptions::default() };
    let loaded = LoadedModel::load(model_path(), &options).expect("model loads");
    let model = &loaded.transformer;
    let pool = ThreadPool::new(threads).unwrap();
    let mut scratch = Scratch::default();
    let prompt: Vec<u32> = (0..cached as u32).map(|i| 100 + i * 37).collect();
    let mut caches: Vec<KvCache> = (0..n).map(|_| KvCache::with_options(&model.config, &cache_options).unwrap()).collect();
    for cache in &mut caches {
        model.forward(&pool, cache, &mut scratch, &prompt, LogitRows::None).unwrap();
    }
    let tokens: Vec<u32> = (0..n as u32).map(|i| 200 + i).collect();
    let reps = 21;
    let decode = median(
        (0..reps)
            .map(|_| {
                for c in &mut caches {
                    c.truncate(cached);
                }
                let mut inputs: Vec<SeqInput> = caches
                    .iter_mut()
                    .zip(&tokens)
                    .map(|(cache, t)| SeqInput { cache, tokens: std::slice::from_ref(t), logits: LogitRows::Last })
                    .collect();
                let s = Instant::now();
                model.forward_batch(&pool, &mut scratch, &mut inputs).unwrap();
                s.elapsed().as_secs_f64()
            })
            .collect(),
    );
    let mut cache = KvCache::with_options(&model.config, &cache_options).unwrap();
    model.forward(&pool, &mut cache, &mut scratch, &prompt, LogitRows::None).unwrap();
    let prefill = median(
        (0..reps)
            .map(|_| {
                cache.truncate(cached);
                let s = Instant::now();
                model.forward(&pool, &mut cache, &mut scratch, &tokens, LogitRows::Last).unwrap();
                s.elapsed().as_secs_f64()
            })
            .collect(),
    );
    println!(
        "{precision}, {} cache, {threads} threads, {} kernels: {n} sequences x 1 row: {:.2} ms ({:.1} rows/s) | 1 sequence x {n} rows: {:.2} ms",
        dtype.name(),
        model.isa.name(),
        decode * 1e3,
        n as f64 / decode,
        prefill * 1e3
    );
}
