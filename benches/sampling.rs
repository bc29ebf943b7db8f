//! One sampling step on a 49,152-token vocabulary (SmolLM2's), temperature 0.8, top-p 0.95,
//! for logits of three shapes: peaked (a few likely tokens, the common case of a language
//! model), Zipf-like (a nucleus of about two thousand tokens) and flat (standard normal
//! logits: a nucleus of most of the vocabulary, the worst case).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use reprolm::sampling::rng::uniform;
use reprolm::sampling::{softmax, Sampler, SamplerConfig};

const VOCAB: usize = 49_152;

/// Uniforms in [0, 1) from the crate's own generator.
fn uniforms(seed: u64) -> impl FnMut() -> f64 {
    let mut step = 0;
    move || {
        step += 1;
        uniform(seed, step)
    }
}

fn normal(unit: &mut impl FnMut() -> f64) -> f64 {
    (-2.0 * (1.0 - unit()).ln()).sqrt() * (2.0 * std::f64::consts::PI * unit()).cos()
}

fn peaked() -> Vec<f32> {
    let mut unit = uniforms(1);
    let mut z: Vec<f32> = (0..VOCAB).map(|_| (2.0 * normal(&mut unit)) as f32).collect();
    for (rank, boost) in [14.0, 12.5, 11.0, 10.0, 9.5].iter().enumerate() {
        z[(rank * 7919) % VOCAB] = *boost;
    }
    z
}

fn zipf() -> Vec<f32> {
    // p proportional to rank^-1.1 at temperature 1, ranks shuffled over the ids.
    let mut unit = uniforms(2);
    let mut ranks: Vec<usize> = (1..=VOCAB).collect();
    for i in (1..VOCAB).rev() {
        ranks.swap(i, (unit() * (i + 1) as f64) as usize);
    }
    ranks.iter().map(|&r| (-1.1 * (r as f64).ln()) as f32).collect()
}

fn flat() -> Vec<f32> {
    let mut unit = uniforms(3);
    (0..VOCAB).map(|_| normal(&mut unit) as f32).collect()
}

fn bench(c: &mut Criterion) {
    let top_p = SamplerConfig { temperature: 0.8, top_p: 0.95, seed: 7, ..SamplerConfig::default() };
    let top_k = SamplerConfig { top_k: 40, ..top_p.clone() };
    let plain = SamplerConfig { top_p: 1.0, ..top_p.clone() };
    for (shape, logits) in [("peaked", peaked()), ("zipf", zipf()), ("flat", flat())] {
        let mut sampler = Sampler::new(top_p.clone(), VOCAB).unwrap();
        let nucleus = sampler.distribution(&logits, &[], 0).unwrap().iter().filter(|&&q| q > 0.0).count();
        eprintln!("{shape}: nucleus of {nucleus} tokens");
        let mut step = 0;
        c.bench_function(&format!("sample top_p=0.95 tau=0.8 {shape}"), |b| {
            b.iter(|| {
                step += 1;
                black_box(sampler.sample(black_box(&logits), &[], 0, step).unwrap())
            })
        });
        let mut sampler = Sampler::new(top_k.clone(), VOCAB).unwrap();
        c.bench_function(&format!("sample top_k=40 top_p=0.95 tau=0.8 {shape}"), |b| {
            b.iter(|| {
                step += 1;
                black_box(sampler.sample(black_box(&logits), &[], 0, step).unwrap())
            })
        });
        let mut sampler = Sampler::new(plain.clone(), VOCAB).unwrap();
        c.bench_function(&format!("sample untruncated tau=0.8 {shape}"), |b| {
            b.iter(|| {
                step += 1;
                black_box(sampler.sample(black_box(&logits), &[], 0, step).unwrap())
            })
        });
    }
    let logits: Vec<f64> = zipf().iter().map(|&z| z as f64).collect();
    c.bench_function("softmax alone (allocates its output)", |b| {
        b.iter(|| black_box(softmax(black_box(&logits), 0.8).unwrap()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
