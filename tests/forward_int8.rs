//! The forward pass with `Precision::Int8`: bitwise determinism across threads, prefill
//! chunkings and ISAs, and its distance from the float32 reference logits.

use crate::common;

use common::*;
use reprolm::kernels::{Isa, Precision};
use reprolm::model::{KvCache, Transformer, LogitRows, Scratch};
use reprolm::threads::ThreadPool;

fn load(isa: Isa) -> Transformer {
    load_llama(isa, Precision::Int8)
}

fn best() -> Isa {
    [Isa::Avx512, Isa::Avx2].into_iter().find(|i| i.int8_available()).unwrap_or(Isa::Scalar)
}

/// Logits for every position of prompt 2, as raw bits.
fn bits(model: &Transformer, threads: usize, chunk: usize) -> Vec<u32> {
    let ids = &generations()[2].prompt_ids;
    let chunks: Vec<&[u32]> = ids.chunks(chunk).collect();
    forward_logits(model, threads, &chunks, LogitRows::All).iter().map(|v| v.to_bits()).collect()
}

#[test]
fn int8_bitwise_identical_across_threads_chunking_and_isa() {
    let model = load(best());
    assert_eq!(model.precision(), Precision::Int8);
    let reference = bits(&model, 1, usize::MAX);
    for threads in [2, 3] {
        assert!(bits(&model, threads, usize::MAX) == reference, "threads = {threads}");
    }
    for chunk in [1, 7, 64] {
        assert!(bits(&model, 2, chunk) == reference, "chunk = {chunk}");
    }
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.int8_available()) {
        assert!(bits(&load(isa), 2, 5) == reference, "isa = {}", isa.name());
    }
}

/// Softmax in float64.
fn softmax(z: &[f32]) -> Vec<f64> {
    let max = z.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let e: Vec<f64> = z.iter().map(|&v| (v as f64 - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

fn argmax(z: &[f32]) -> usize {
    z.iter().enumerate().fold(0, |b, (i, &v)| if v > z[b] { i } else { b })
}

#[test]
fn int8_logits_close_to_reference() {
    let model = load(best());
    let (shape, reference) = read_npy_f32("last_logits.npy");
    let vocab = shape[1];
    let mut kls = Vec::new();
    for (i, g) in generations().iter().enumerate() {
        let got = forward_logits(&model, 2, &[&g.prompt_ids], LogitRows::Last);
        let want = &reference[i * vocab..(i + 1) * vocab];
        let (p, q) = (softmax(want), softmax(&got));
        let kl: f64 = p.iter().zip(&q).filter(|(&p, _)| p > 0.0).map(|(&p, &q)| p * (p / q).ln()).sum();
        eprintln!(
            "prompt {i}: KL(ref || int8) = {kl:.3e}, max |diff| = {:.3e}, argmax {} vs {}",
            max_abs_diff(&got, want),
            argmax(&got),
            argmax(want)
        );
        kls.push(kl);
    }
    let mean = kls.iter().sum::<f64>() / kls.len() as f64;
    eprintln!("mean KL(reference || int8) over {} prompts = {mean:.3e}", kls.len());
    assert!(mean <= 5e-3, "mean KL {mean}");
}

/// Greedy continuations (8 tokens) against the reference's. Asserted: wherever int8's
/// choice differs from the reference's, the float32 model nearly ties the two tokens (its
/// logits within 0.5 on the same context). How many prompts agree to the end is not a
/// property of int8 arithmetic: which rounding of an activation lands on which side moves
/// with 1-ulp changes upstream (measured: 3 to 5 of 6 prompts agree on all 8 tokens across
/// versions of the float `exp`; the divergences were at float32 gaps of 0.06 to 0.22).
#[test]
fn int8_greedy_continuation() {
    let model = load(best());
    let float = load_llama(best(), Precision::Float32);
    let pool = ThreadPool::new(2).unwrap();
    for (i, g) in generations().iter().enumerate() {
        let mut cache = KvCache::new(&model.config, 512).unwrap();
        let mut scratch = Scratch::default();
        let mut ids = Vec::new();
        let mut next: Vec<u32> = g.prompt_ids.clone();
        for _ in 0..8 {
            model.forward(&pool, &mut cache, &mut scratch, &next, LogitRows::Last).unwrap();
            let id = argmax(&scratch.logits) as u32;
            ids.push(id);
            next = vec![id];
        }
        assert!(g.greedy_ids.len() >= 8);
        let agree = ids.iter().zip(&g.greedy_ids).take_while(|(a, b)| a == b).count();
        eprintln!("prompt {i}: int8 greedy {ids:?}, reference {:?}: first {agree} of 8 agree", &g.greedy_ids[..8]);
        if agree == 8 {
            continue;
        }
        let mut context = g.prompt_ids.clone();
        context.extend_from_slice(&ids[..agree]);
        let f = forward_logits(&float, 2, &[&context], LogitRows::Last);
        let (mine, theirs) = (ids[agree] as usize, g.greedy_ids[agree] as usize);
        eprintln!("  step {agree}: float32 logits {} (int8's choice) vs {} (reference's)", f[mine], f[theirs]);
        assert!((f[theirs] - f[mine]).abs() <= 0.5, "prompt {i}: divergence at a clear float32 preference");
    }
}
