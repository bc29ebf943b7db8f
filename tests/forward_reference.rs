//! The forward pass against the float32 reference logits, and its determinism.

use crate::common;

use common::*;
use reprolm::kernels::{Isa, Precision};
use reprolm::model::{KvCache, Transformer, LogitRows, Scratch};
use reprolm::threads::ThreadPool;

fn load(isa: Isa) -> Transformer {
    load_llama(isa, Precision::Float32)
}

#[test]
fn last_logits_match_reference() {
    let model = load(Isa::best());
    let (shape, reference) = read_npy_f32("last_logits.npy");
    let vocab = shape[1];
    for (i, g) in generations().iter().enumerate() {
        let got = forward_logits(&model, 2, &[&g.prompt_ids], LogitRows::Last);
        let diff = max_abs_diff(&got, &reference[i * vocab..(i + 1) * vocab]);
        eprintln!("prompt {i}: max |diff| = {diff:e}");
        assert!(diff < 1e-3, "prompt {i}: max |diff| = {diff}");
    }
}

#[test]
fn all_positions_match_reference() {
    let model = load(Isa::best());
    let (shape, reference) = read_npy_f32("all_positions_prompt2.npy");
    let ids = &generations()[2].prompt_ids;
    assert_eq!(shape, vec![ids.len(), model.config.vocab_size]);
    let got = forward_logits(&model, 2, &[ids], LogitRows::All);
    let diff = max_abs_diff(&got, &reference);
    assert!(diff < 1e-3, "max |diff| = {diff}");
}

/// Logits for every position of prompt 2 computed `how`, as raw bits.
fn bits(model: &Transformer, threads: usize, chunk: usize) -> Vec<u32> {
    let ids = &generations()[2].prompt_ids;
    let chunks: Vec<&[u32]> = ids.chunks(chunk).collect();
    forward_logits(model, threads, &chunks, LogitRows::All).iter().map(|v| v.to_bits()).collect()
}

#[test]
fn bitwise_identical_across_threads_chunking_and_isa() {
    let isas: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.available()).collect();
    let best = load(Isa::best());
    let reference = bits(&best, 1, usize::MAX);
    for threads in [2, 3, 4, 7] {
        assert!(bits(&best, threads, usize::MAX) == reference, "threads = {threads}");
    }
    for chunk in [1, 3, 7, 64] {
        assert!(bits(&best, 2, chunk) == reference, "chunk = {chunk}");
    }
    for isa in isas {
        assert!(bits(&load(isa), 2, 5) == reference, "isa = {}", isa.name());
    }
}

/// The cached computation gives each row the bits of a full one, deep into a context: steps
/// through positions 560..600 one at a time (on 1 to 3 threads) give the bits of one 40-token
/// chunk.
#[test]
fn decode_steps_deep_in_a_context_match_a_chunk() {
    let model = load(Isa::best());
    let ids: Vec<u32> = (0..600u32).map(|i| 100 + i * 7919 % 40000).collect();
    let (prefix, tail) = ids.split_at(560);
    let run = |threads: usize, chunks: Vec<&[u32]>| {
        let pool = ThreadPool::new(threads).unwrap();
        let mut cache = KvCache::new(&model.config, 600).unwrap();
        let mut scratch = Scratch::default();
        model.forward(&pool, &mut cache, &mut scratch, prefix, LogitRows::None).unwrap();
        let mut out = Vec::new();
        for c in chunks {
            model.forward(&pool, &mut cache, &mut scratch, c, LogitRows::All).unwrap();
            out.extend(scratch.logits.iter().map(|v| v.to_bits()));
        }
        out
    };
    let chunk = run(2, vec![tail]);
    for threads in [1, 2, 3] {
        assert!(run(threads, tail.chunks(1).collect()) == chunk, "threads = {threads}");
    }
}
