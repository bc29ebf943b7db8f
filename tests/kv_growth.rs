//! The batch engine's KV memory on the tiny synthetic model: caches are granted positions as
//! they grow (not their whole length at admission), so many more chats run at once than
//! `kv_memory` holds full contexts; when the budget runs out the most recently admitted
//! sequences are preempted and recomputed later. Every request gives the bits it gives alone,
//! with the prefix cache off and with one small enough to evict under the load.

use crate::common;
use crate::common::outcome::{alone, drain, Outcome};

use std::sync::Arc;

use reprolm::batch::{BatchEngine, BatchOptions, RequestHandle, BLOCK_TOKENS};
use reprolm::decode::{Finish, GenerationSpec, StopConditions};
use reprolm::loaded_model::{LoadedModel, LoadOptions};
use reprolm::model::KvDtype;
use reprolm::sampling::SamplerConfig;

fn tiny(threads: usize) -> Arc<LoadedModel> {
    let options = LoadOptions { threads: Some(threads), ..LoadOptions::default() };
    Arc::new(LoadedModel::load(common::data_path("synthetic/tiny.Q4_K_M.gguf"), &options).expect("model loads"))
}

/// `n` requests sharing a 40-token system prefix, each with its own user tokens, half greedy
/// and half sampled. `max_tokens: None` is a chat without a limit: the rest of the context,
/// ended by one of `stop_token_ids`.
fn requests(loaded: &LoadedModel, n: usize, max_tokens: Option<usize>, stop_token_ids: &[u32]) -> Vec<GenerationSpec> {
    let (vocab, context) = (loaded.config().vocab_size, loaded.config().context_length);
    let mut rng = common::Rng(0x5eed);
    let system: Vec<u32> = (0..40).map(|_| (rng.next() % vocab as u64) as u32).collect();
    (0..n)
        .map(|i| {
            let mut prompt = system.clone();
            prompt.extend((0..3 + i % 17).map(|_| (rng.next() % vocab as u64) as u32));
            let sampler = match i % 2 {
                0 => SamplerConfig::greedy(),
                _ => SamplerConfig { temperature: 1.0, seed: i as u64, ..SamplerConfig::default() },
            };
            let max_tokens = max_tokens.unwrap_or(context - prompt.len());
            let stop = StopConditions { max_tokens, stop_token_ids: stop_token_ids.to_vec(), ..StopConditions::default() };
            GenerationSpec::new(prompt, sampler, stop, vocab).unwrap()
        })
        .collect()
}

/// Submits every request at once and drains them, recording the most sequences seen running
/// and checking that the KV bytes held and the prefix cache's stay within their bounds.
fn run_all(batch: &BatchEngine, requests: &[GenerationSpec]) -> (Vec<Outcome>, usize) {
    let handles: Vec<RequestHandle> = requests.iter().map(|r| batch.submit(r.clone()).unwrap()).collect();
    let options = batch.options();
    let mut peak = 0;
    while !handles.iter().all(RequestHandle::is_finished) {
        let stats = batch.stats();
        peak = peak.max(stats.running);
        assert!(stats.kv_bytes <= options.kv_memory, "{stats:?}");
        // Every block of the pool is held by running sequences or not, never both.
        assert_eq!((stats.kv_blocks_used + stats.kv_blocks_free) * BLOCK_TOKENS, batch.pool_positions(), "{stats:?}");
        assert!(stats.prefix_cache.bytes <= options.prefix_cache_bytes, "{stats:?}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    (handles.iter().map(drain).collect(), peak)
}

#[test]
fn forty_eight_chats_without_max_tokens_run_at_once_in_eight_contexts() {
    let loaded = tiny(2);
    let context = loaded.config().context_length;
    let dtype = KvDtype::F16;
    let options = BatchOptions {
        kv_memory: 8 * context * loaded.kv_bytes_per_position(dtype),
        kv_dtype: dtype,
        prefix_cache_bytes: 0,
        ..BatchOptions::defaults_for(&loaded)
    };
    assert!(options.max_concurrent >= 48);
    let batch = BatchEngine::new(Arc::clone(&loaded), options).unwrap();
    // Stop tokens end the chats after a few dozen tokens (the model's weights are random).
    let stop: Vec<u32> = (0..loaded.config().vocab_size as u32).filter(|id| id % 9 == 4).collect();
    let requests = requests(&loaded, 48, None, &stop);
    assert!(requests.iter().all(|r| r.positions_needed() == context), "each would reserve a whole context");
    let (outcomes, peak) = run_all(&batch, &requests);
    assert!(peak > 8, "at most {peak} sequences ran at once");
    for (i, (request, outcome)) in requests.iter().zip(&outcomes).enumerate() {
        assert!(matches!(outcome.3, Finish::StopToken(_)), "request {i}: {:?}", outcome.3);
        assert_eq!(outcome, &alone(&loaded, dtype, request), "request {i}");
    }
    let stats = batch.stats();
    assert_eq!((stats.running, stats.kv_bytes, stats.kv_blocks_used), (0, 0, 0), "{stats:?}");
    assert_eq!(stats.kv_blocks_free, 8 * context / BLOCK_TOKENS);
}

#[test]
fn an_exhausted_budget_preempts_and_recomputes_without_changing_a_byte() {
    let dtype = KvDtype::F32;
    let per_position = tiny(1).kv_bytes_per_position(dtype);
    let block_bytes = BLOCK_TOKENS * per_position;
    // (threads, prefix cache bound): off, and a bound the load drives past (evicting).
    for (threads, prefix_cache_bytes) in [(2, 0), (3, 24 * block_bytes + block_bytes / 2)] {
        let loaded = tiny(threads);
        let options = BatchOptions {
            max_batch_tokens: 96,
            kv_memory: 1000 * per_position,
            kv_dtype: dtype,
            prefix_cache_bytes,
            ..BatchOptions::defaults_for(&loaded)
        };
        let batch = BatchEngine::new(Arc::clone(&loaded), options).unwrap();
        // 20 sequences of up to 40 + 19 + 120 positions: 3,580 at most, in a budget of 1,000.
        let requests = requests(&loaded, 20, Some(120), &[]);
        let (outcomes, _) = run_all(&batch, &requests);
        let label = format!("{threads} threads, prefix cache of {prefix_cache_bytes} bytes");
        for (i, (request, outcome)) in requests.iter().zip(&outcomes).enumerate() {
            assert_eq!(outcome, &alone(&loaded, dtype, request), "{label}, request {i}");
        }
        let stats = batch.stats();
        assert!(stats.preemptions > 0, "{label}: {stats:?}");
        assert_eq!((stats.running, stats.waiting, stats.kv_bytes, stats.kv_blocks_used), (0, 0, 0, 0), "{label}: {stats:?}");
        let cache = stats.prefix_cache;
        assert!(cache.bytes <= prefix_cache_bytes, "{label}: {cache:?}");
        if prefix_cache_bytes > 0 {
            assert!(cache.evictions > 0 && cache.hits > 0, "{label}: {cache:?}");
        }
    }
}
