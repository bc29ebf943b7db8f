//! The batch engine's prefix cache on the real model: every request's tokens,
//! log-probabilities, text and finish reason are the same bits with the cache on and off, and
//! the same as the request run alone on a session, for multi-turn conversations sharing a
//! system prompt, prompts diverging inside a block, prompts ending on a block boundary,
//! greedy and sampled decoding, both precisions, both KV dtypes and 1 to 3 threads; and the
//! cache stays within its bound while it evicts; sequences sharing a prefix hold its blocks
//! once (shared by reference, not copied).

use crate::common;
use crate::common::outcome::{alone, drain, Outcome};

use std::sync::Arc;

use reprolm::batch::{BatchEngine, BatchOptions, RequestHandle, BLOCK_TOKENS};
use reprolm::decode::{GenerationSpec, StopConditions};
use reprolm::loaded_model::{LoadedModel, LoadOptions};
use reprolm::model::KvDtype;
use reprolm::sampling::SamplerConfig;

fn load(threads: usize, precision: &str) -> Arc<LoadedModel> {
    let options = LoadOptions { threads: Some(threads), precision: Some(precision.into()), ..LoadOptions::default() };
    Arc::new(LoadedModel::load(common::model_path(), &options).expect("model loads"))
}

/// A conversation: its first prompt, the user tokens added after each reply, its sampler.
struct Conversation {
    first: Vec<u32>,
    users: Vec<Vec<u32>>,
    sampler: SamplerConfig,
    max_tokens: usize,
}

/// One request of a run: its prompt, what it produced, and how many prompt tokens came from
/// the prefix cache.
struct Turn {
    request: GenerationSpec,
    outcome: Outcome,
    cached: usize,
}

/// Runs the conversations turn by turn, every conversation's turn submitted at once, plus
/// `singles` submitted with the first turns. A turn's prompt is the previous prompt, the
/// previous reply (all its ids) and the next user tokens.
fn converse(batch: &BatchEngine, conversations: &[Conversation], singles: &[GenerationSpec]) -> Vec<Turn> {
    let vocab = batch.loaded().config().vocab_size;
    let mut prompts: Vec<Vec<u32>> = conversations.iter().map(|c| c.first.clone()).collect();
    let mut turns = Vec::new();
    for t in 0..=conversations[0].users.len() {
        let mut requests: Vec<GenerationSpec> = conversations
            .iter()
            .zip(&prompts)
            .map(|(c, p)| {
                let stop = StopConditions { max_tokens: c.max_tokens, ..StopConditions::default() };
                GenerationSpec::new(p.clone(), c.sampler.clone(), stop, vocab).unwrap()
            })
            .collect();
        if t == 0 {
            requests.extend(singles.iter().cloned());
        }
        let handles: Vec<RequestHandle> = requests.iter().map(|r| batch.submit(r.clone()).unwrap()).collect();
        for (i, (request, handle)) in requests.into_iter().zip(handles).enumerate() {
            let outcome = drain(&handle);
            if let Some(c) = conversations.get(i) {
                if let Some(user) = c.users.get(t) {
                    prompts[i].extend_from_slice(&outcome.0);
                    prompts[i].extend_from_slice(user);
                }
            }
            turns.push(Turn { request, outcome, cached: handle.cached_tokens() });
        }
    }
    turns
}

fn workload(vocab: usize) -> (Vec<Conversation>, Vec<GenerationSpec>) {
    let mut rng = common::Rng(0x9e1f);
    let mut ids = |n: usize| -> Vec<u32> { (0..n).map(|_| (rng.next() % vocab as u64) as u32).collect() };
    let system = ids(40); // two full blocks and 8 tokens of a third
    let mut conversations = Vec::new();
    for (c, user_len) in [3usize, 11, 16, 25].into_iter().enumerate() {
        let mut first = system.clone();
        if c == 2 {
            first[37] = (first[37] + 1) % vocab as u32; // diverges inside the third block
        }
        first.extend(ids(user_len));
        let sampler = match c % 2 {
            0 => SamplerConfig::greedy(),
            _ => SamplerConfig { temperature: 0.9, top_p: 0.95, seed: 11 + c as u64, ..SamplerConfig::default() },
        };
        let users = (0..2).map(|t| ids(5 + 3 * c + t)).collect();
        conversations.push(Conversation { first, users, sampler, max_tokens: 6 + c });
    }
    let stop = StopConditions { max_tokens: 5, ..StopConditions::default() };
    let singles = vec![
        // Ends on a block boundary: its last block is recomputed for the logits.
        GenerationSpec::new(system[..2 * BLOCK_TOKENS].to_vec(), SamplerConfig::greedy(), stop.clone(), vocab).unwrap(),
        // Shorter than a block.
        GenerationSpec::new(system[..9].to_vec(), SamplerConfig { temperature: 1.1, seed: 5, ..SamplerConfig::default() },
                     stop, vocab).unwrap(),
    ];
    (conversations, singles)
}

#[test]
fn requests_give_the_same_bits_with_the_prefix_cache_on_and_off_and_alone() {
    // (precision, KV dtype, threads with the cache on, threads with it off and alone)
    let configs =
        [("float32", KvDtype::F32, 1, 3), ("float32", KvDtype::F16, 2, 1), ("int8", KvDtype::F32, 3, 2), ("int8", KvDtype::F16, 2, 3)];
    for (precision, dtype, threads_on, threads_off) in configs {
        let (on_engine, off_engine) = (load(threads_on, precision), load(threads_off, precision));
        let vocab = on_engine.config().vocab_size;
        let (conversations, singles) = workload(vocab);
        let options = |loaded: &LoadedModel, prefix_cache_bytes: usize| BatchOptions {
            max_concurrent: 4,
            max_batch_tokens: 24,
            kv_dtype: dtype,
            prefix_cache_bytes,
            ..BatchOptions::defaults_for(loaded)
        };
        let on_options = options(&on_engine, 64 << 20);
        let on = BatchEngine::new(Arc::clone(&on_engine), on_options).unwrap();
        let cached_run = converse(&on, &conversations, &singles);
        let stats = on.stats().prefix_cache;
        let off = BatchEngine::new(Arc::clone(&off_engine), options(&off_engine, 0)).unwrap();
        let plain_run = converse(&off, &conversations, &singles);
        assert_eq!(off.stats().prefix_cache, Default::default(), "no prefix cache");

        let label = format!("{precision}, {} KV", dtype.name());
        assert_eq!(cached_run.len(), plain_run.len());
        let mut saved = 0;
        for (i, (a, b)) in cached_run.iter().zip(&plain_run).enumerate() {
            assert_eq!(a.request.prompt, b.request.prompt, "{label}, request {i}: prompt");
            assert_eq!(a.outcome, b.outcome, "{label}, request {i}: cache on vs off");
            assert_eq!(a.outcome, alone(&off_engine, dtype, &a.request), "{label}, request {i}: cache on vs alone");
            assert_eq!(b.cached, 0);
            let n = a.request.prompt.len();
            assert!(a.cached % BLOCK_TOKENS == 0 && a.cached < n, "{label}, request {i}: {} cached of {n}", a.cached);
            saved += a.cached;
        }
        // Every later turn reuses its conversation's previous turn: the blocks of the previous
        // prompt and reply that were computed (all but the reply's last token), as far as they
        // leave the new prompt's last token to compute.
        let per_round = conversations.len();
        let index = |t: usize, c: usize| if t == 0 { c } else { per_round + singles.len() + (t - 1) * per_round + c };
        for t in 1..=conversations[0].users.len() {
            for c in 0..per_round {
                let (prev, turn) = (&cached_run[index(t - 1, c)], &cached_run[index(t, c)]);
                let computed = prev.request.prompt.len() + prev.outcome.0.len() - 1;
                let reusable = (turn.request.prompt.len() - 1) / BLOCK_TOKENS;
                assert_eq!(turn.cached, (computed / BLOCK_TOKENS).min(reusable) * BLOCK_TOKENS, "{label}, conversation {c}, turn {t}");
            }
        }
        assert_eq!(stats.hits as usize * BLOCK_TOKENS, saved, "{label}: hits count the reused blocks");
        assert!(stats.misses > 0 && stats.evictions == 0 && stats.bytes > 0, "{label}: {stats:?}");
        let block_bytes = BLOCK_TOKENS * on_engine.kv_bytes_per_position(dtype);
        assert_eq!(stats.bytes % block_bytes, 0);
    }
}

#[test]
fn an_evicting_prefix_cache_stays_within_its_bound_and_changes_no_bits() {
    let loaded = load(2, "float32");
    let vocab = loaded.config().vocab_size;
    let block_bytes = BLOCK_TOKENS * loaded.kv_bytes_per_position(KvDtype::F32);
    let bound = 5 * block_bytes + block_bytes / 3; // room for 5 blocks
    let options = BatchOptions { max_concurrent: 3, max_batch_tokens: 32, prefix_cache_bytes: bound, ..BatchOptions::defaults_for(&loaded) };
    let batch = BatchEngine::new(Arc::clone(&loaded), options).unwrap();
    let mut rng = common::Rng(77);
    let shared: Vec<u32> = (0..36).map(|_| (rng.next() % vocab as u64) as u32).collect();
    let stop = |max_tokens| StopConditions { max_tokens, ..StopConditions::default() };
    // Puts the shared prefix's two blocks in the cache.
    let first = GenerationSpec::new(shared.clone(), SamplerConfig::greedy(), stop(2), vocab).unwrap();
    assert_eq!(drain(&batch.submit(first.clone()).unwrap()), alone(&loaded, KvDtype::F32, &first));
    // A long request reusing them runs while other prompts push the cache past its bound.
    let mut long_prompt = shared.clone();
    long_prompt.extend([3, 1, 4]);
    let long = GenerationSpec::new(long_prompt, SamplerConfig { temperature: 0.7, seed: 3, ..SamplerConfig::default() }, stop(40), vocab).unwrap();
    let long_handle = batch.submit(long.clone()).unwrap();
    let mut others = Vec::new();
    for i in 0..8 {
        let prompt: Vec<u32> = (0..40 + i).map(|_| (rng.next() % vocab as u64) as u32).collect();
        let request = GenerationSpec::new(prompt, SamplerConfig::greedy(), stop(3), vocab).unwrap();
        let handle = batch.submit(request.clone()).unwrap();
        others.push((request, handle));
    }
    for (i, (request, handle)) in others.iter().enumerate() {
        assert_eq!(drain(handle), alone(&loaded, KvDtype::F32, request), "request {i}");
        let bytes = batch.stats().prefix_cache.bytes;
        assert!(bytes <= bound, "{bytes} bytes held, bound {bound}");
    }
    assert_eq!(long_handle.cached_tokens(), 2 * BLOCK_TOKENS);
    assert_eq!(drain(&long_handle), alone(&loaded, KvDtype::F32, &long));
    let stats = batch.stats().prefix_cache;
    assert!(stats.evictions > 0 && stats.bytes <= bound, "{stats:?}");
    // The shared blocks came back or stayed, and a repeat of the first request is unchanged.
    let again = batch.submit(first.clone()).unwrap();
    assert_eq!(drain(&again), alone(&loaded, KvDtype::F32, &first));
}

#[test]
fn a_bound_below_one_block_turns_the_prefix_cache_off() {
    let loaded = load(1, "float32");
    let vocab = loaded.config().vocab_size;
    let block_bytes = BLOCK_TOKENS * loaded.kv_bytes_per_position(KvDtype::F32);
    let options = BatchOptions { prefix_cache_bytes: block_bytes - 1, ..BatchOptions::defaults_for(&loaded) };
    let batch = BatchEngine::new(Arc::clone(&loaded), options).unwrap();
    let request = GenerationSpec::new((0..40).collect(), SamplerConfig::greedy(), StopConditions { max_tokens: 2, ..StopConditions::default() }, vocab).unwrap();
    for _ in 0..2 {
        let handle = batch.submit(request.clone()).unwrap();
        drain(&handle);
        assert_eq!(handle.cached_tokens(), 0);
    }
    assert_eq!(batch.stats().prefix_cache, Default::default());
}

#[test]
fn sequences_sharing_a_prefix_hold_its_blocks_once() {
    let loaded = load(2, "float32");
    let vocab = loaded.config().vocab_size;
    let block_bytes = BLOCK_TOKENS * loaded.kv_bytes_per_position(KvDtype::F32);
    // 8 sequences of a 10-block shared prefix, 8 tokens of their own and 24 generated (12
    // blocks each): 96 blocks if each held its own copy, 10 + 8 x 2 shared.
    let pool_blocks = 38;
    let options = BatchOptions {
        kv_memory: pool_blocks * block_bytes,
        prefix_cache_bytes: pool_blocks * block_bytes,
        ..BatchOptions::defaults_for(&loaded)
    };
    let batch = BatchEngine::new(Arc::clone(&loaded), options).unwrap();
    let mut rng = common::Rng(31);
    let mut ids = |n: usize| -> Vec<u32> { (0..n).map(|_| (rng.next() % vocab as u64) as u32).collect() };
    let shared = ids(10 * BLOCK_TOKENS);
    let stop = |max_tokens| StopConditions { max_tokens, ..StopConditions::default() };
    let warm = GenerationSpec::new([shared.clone(), ids(1)].concat(), SamplerConfig::greedy(), stop(1), vocab).unwrap();
    drain(&batch.submit(warm).unwrap());
    let requests: Vec<GenerationSpec> = (0..8)
        .map(|i| {
            let sampler = SamplerConfig { temperature: 0.8, seed: i, ..SamplerConfig::default() };
            GenerationSpec::new([shared.clone(), ids(8)].concat(), sampler, stop(24), vocab).unwrap()
        })
        .collect();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (outcomes, peak) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let (mut running, mut used) = (0, 0);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let stats = batch.stats();
                running = running.max(stats.running);
                used = used.max(stats.kv_blocks_used);
                assert!(stats.kv_blocks_used + stats.kv_blocks_free == pool_blocks, "{stats:?}");
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            (running, used)
        });
        let handles: Vec<RequestHandle> = requests.iter().map(|r| batch.submit(r.clone()).unwrap()).collect();
        let outcomes: Vec<(Outcome, usize)> = handles.iter().map(|h| (drain(h), h.cached_tokens())).collect();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (outcomes, watcher.join().unwrap())
    });
    assert_eq!(peak.0, 8, "all eight ran at once");
    assert!(peak.1 <= 10 + 8 * 2, "{} blocks in use at the peak", peak.1);
    assert_eq!(batch.stats().preemptions, 0);
    for (i, (request, (outcome, cached))) in requests.iter().zip(&outcomes).enumerate() {
        assert_eq!(*cached, shared.len(), "request {i}");
        assert_eq!(*outcome, alone(&loaded, KvDtype::F32, request), "request {i}");
    }
}
