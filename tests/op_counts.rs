//! The KV cache's cost formulas (docs/theory.md, "The KV cache") checked against the
//! multiplications the engine performs (counting mode:
//! `cargo test --profile fasttest --features count-ops --test op_counts`).
//!
//! # The formula for a Llama layer with grouped-query attention
//!
//! docs/theory.md counts `a * b * c` multiplications for an `a x b` by `b x c` product and
//! nothing for normalisation, activations and softmax. Write `d` = d_model, `h` = query heads,
//! `h_kv` = KV heads, `d_h = d / h` the head size, `d_kv = h_kv * d_h = d * h_kv / h` and
//! `f` = the feed-forward width. Processing position `t` (1-based) of a sequence whose
//! cache holds all `t` positions, one layer multiplies:
//!
//! - `W_Q` (`d x d`): `d^2`; `W_K` and `W_V` (`d x d_kv` each, shared by `h / h_kv` query
//!   heads): `2 d d_kv`; `W_O`: `d^2`;
//! - scores: each of the `h` heads dots its query with `t` keys of `d_h` numbers: `t d`;
//!   weighted sum of values: likewise `t d`;
//! - SwiGLU feed-forward, three matrices (gate and up `d x f`, down `f x d`): `3 d f`
//!   (the gate product `silu(g) * u` is elementwise, an activation, not counted).
//!
//! so `2 t d + 2 d^2 + 2 d d_kv + 3 d f` per position and, summing `t = 1..n`,
//!
//! ```text
//! C_cache(n) = d n (n + 1) + n (2 d^2 + 2 d d_kv + 3 d f)
//! ```
//!
//! With `h_kv = h` (so `d_kv = d`) and a two-matrix MLP (`2 d f` instead of `3 d f`) this is
//! docs/theory.md's `d n (n + 1) + n (4 d^2 + 2 d d_ff)`. The LM head (`V x d` per position
//! whose logits are asked for) lies outside the layers and is counted apart.
//!
//! Without a cache, recomputing the whole prefix of length `t` at step `t` costs
//! `sum_{s <= t} 2 s d + t (2 d^2 + 2 d d_kv + 3 d f)`: the engine's causal attention only
//! multiplies the `s` keys position `s` may see, where docs/theory.md's `2 t^2 d` per step
//! (`d n (n + 1) (2 n + 1) / 3` in all) also multiplies the masked upper triangle. Summed over `t = 1..n`:
//!
//! ```text
//! C_full(n) = d n (n + 1) (n + 2) / 3 + n (n + 1) / 2 * (2 d^2 + 2 d d_kv + 3 d f)
//! ```
//!
//! The cache holds `2 d_kv` numbers per layer and position: `2 L n d_kv` in all (`2 L n d`
//! with `d_kv` numbers per key and per value).
#![cfg(feature = "count-ops")]

mod common;

use std::sync::{Arc, Mutex};

use common::model_path;
use reprolm::count;
use reprolm::loaded_model::{LoadedModel, LoadOptions, Session, SessionOptions};
use reprolm::model::{KvDtype, ModelConfig, Overflow};

/// The counters are process-wide: tests in this binary take turns.
static LOCK: Mutex<()> = Mutex::new(());

fn loaded(threads: usize) -> Arc<LoadedModel> {
    Arc::new(LoadedModel::load(model_path(), &LoadOptions { threads: Some(threads), ..Default::default() }).unwrap())
}

/// Multiplications per position outside attention: `2 d^2 + 2 d d_kv + 3 d f`.
fn linear(c: &ModelConfig) -> u64 {
    let (d, dkv, f) = (c.d_model as u64, c.d_kv() as u64, c.ffn_dim as u64);
    2 * d * d + 2 * d * dkv + 3 * d * f
}

fn c_cache(c: &ModelConfig, n: u64) -> u64 {
    c.d_model as u64 * n * (n + 1) + n * linear(c)
}

fn c_full(c: &ModelConfig, n: u64) -> u64 {
    c.d_model as u64 * n * (n + 1) * (n + 2) / 3 + n * (n + 1) / 2 * linear(c)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy generation processing `n` positions one at a time from token `first`.
fn generate_cached(loaded: &Arc<LoadedModel>, options: &SessionOptions, first: u32, n: usize) -> Session {
    let mut s = Session::with_options(Arc::clone(loaded), options).unwrap();
    let mut next = first;
    for _ in 0..n {
        next = argmax(s.feed(&[next]).unwrap());
    }
    s
}

#[test]
fn cached_generation_costs_the_quadratic_formula() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let loaded = loaded(2);
    let c = loaded.config().clone();
    for n in [1usize, 2, 5, 17, 40] {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            count::reset();
            let options = SessionOptions { context_length: Some(n), kv_dtype: dtype, overflow: Overflow::Error };
            let s = generate_cached(&loaded, &options, 1, n);
            let counts = count::snapshot(c.n_layers);
            let expected = c_cache(&c, n as u64);
            for (l, &got) in counts.per_layer.iter().enumerate() {
                assert_eq!(got, expected, "n = {n}, layer {l}: counted {got}, the formula gives {expected}");
            }
            assert_eq!(counts.outside, (n * c.d_model * c.vocab_size) as u64, "LM head, n = {n}");
            assert_eq!(s.kv_bytes(), 2 * c.n_layers * n * c.d_kv() * dtype.bytes(), "kv_bytes, n = {n}");
        }
    }
}

#[test]
fn counts_do_not_depend_on_chunking_or_threads() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let ids: Vec<u32> = (0..29).map(|i| 100 + 37 * i).collect();
    for (threads, chunks) in [(1, &[1, 4, 29][..]), (3, &[4][..])] {
        let loaded = loaded(threads);
        let c = loaded.config().clone();
        for &chunk in chunks {
            count::reset();
            let mut s = Session::new(Arc::clone(&loaded), ids.len()).unwrap();
            for part in ids.chunks(chunk) {
                s.feed(part).unwrap();
            }
            let counts = count::snapshot(c.n_layers);
            let expected = c_cache(&c, ids.len() as u64);
            assert!(counts.per_layer.iter().all(|&x| x == expected), "threads {threads}, chunk {chunk}: {counts:?}");
            let calls = ids.len().div_ceil(chunk);
            assert_eq!(counts.outside, (calls * c.d_model * c.vocab_size) as u64);
        }
    }
}

#[test]
fn recomputing_without_a_cache_costs_the_cubic_formula() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let loaded = loaded(2);
    let c = loaded.config().clone();
    for n in [3usize, 8] {
        // Greedy decoding without a cache: the whole sequence from scratch each step.
        count::reset();
        let mut ids = vec![1u32];
        for _ in 0..n {
            let mut s = Session::new(Arc::clone(&loaded), ids.len()).unwrap();
            let next = argmax(s.feed(&ids).unwrap());
            ids.push(next);
        }
        let full = count::snapshot(c.n_layers);
        let cached = generate_cached(&loaded, &SessionOptions { context_length: Some(n), ..Default::default() }, 1, n);
        assert_eq!(cached.tokens(), &ids[..n], "the cache changes nothing in the output");
        let (f, k) = (c_full(&c, n as u64), c_cache(&c, n as u64));
        assert!(full.per_layer.iter().all(|&x| x == f), "n = {n}: {:?} != {f}", full.per_layer);
        eprintln!("n = {n}: per layer, without cache {f}, with cache {k}, ratio {:.2}", f as f64 / k as f64);
    }
}

#[test]
fn a_sliding_window_bounds_the_attention_cost() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let loaded = loaded(2);
    let c = loaded.config().clone();
    let (capacity, n) = (12usize, 30usize);
    count::reset();
    let options = SessionOptions {
        context_length: Some(capacity),
        kv_dtype: KvDtype::F32,
        overflow: Overflow::SlidingWindow { n_keep: 3 },
    };
    let s = generate_cached(&loaded, &options, 1, n);
    let counts = count::snapshot(c.n_layers);
    // Position t attends to min(t, capacity) keys: 2 d min(t, capacity) multiplications.
    let attention: u64 = (1..=n as u64).map(|t| 2 * c.d_model as u64 * t.min(capacity as u64)).sum();
    let expected = attention + n as u64 * linear(&c);
    assert!(counts.per_layer.iter().all(|&x| x == expected), "{counts:?} != {expected}");
    assert_eq!(s.kv_bytes(), 2 * c.n_layers * capacity * c.d_kv() * 4);
}
