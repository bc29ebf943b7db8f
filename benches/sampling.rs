//! One sampling step on a 49,152-token vocabulary (SmolLM2's), temperature 0.8, top-p 0.95,
//! for logits of four shapes: the default model's own last-position logits for the six
//! reference prompts of tests/data (one row per iteration, in turn: the case that matters),
//! peaked (a few likely tokens, like a language model), Zipf-like (a nucleus of about a
//! thousand tokens) and flat (standard normal logits: a nucleus of most of the vocabulary,
//! the worst case).

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

/// The rows of tests/data/last_logits.npy: float32, shape (6, 49152), C order.
fn model_logits() -> Vec<Vec<f32>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/last_logits.npy");
    let bytes = std::fs::read(path).expect("tests/data/last_logits.npy");
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "a version 1.0 .npy file");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
    assert!(header.contains("'<f4'") && header.contains("(6, 49152)"), "{header}");
    let data = &bytes[10 + header_len..];
    let values: Vec<f32> = data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    values.chunks_exact(VOCAB).map(<[f32]>::to_vec).collect()
}

fn bench(c: &mut Criterion) {
    let top_p = SamplerConfig { temperature: 0.8, top_p: 0.95, seed: 7, ..SamplerConfig::default() };
    let top_k = SamplerConfig { top_k: 40, ..top_p.clone() };
    let plain = SamplerConfig { top_p: 1.0, ..top_p.clone() };
    let rows = model_logits();
    for (name, config) in [("top_p=0.95 tau=0.8", &top_p), ("untruncated tau=0.8", &plain)] {
        let mut sampler = Sampler::new(config.clone(), VOCAB).unwrap();
        let nuclei: Vec<usize> = rows
            .iter()
            .map(|z| sampler.distribution(z, &[], 0).unwrap().iter().filter(|&&q| q > 0.0).count())
            .collect();
        eprintln!("model logits, {name}: nuclei of {nuclei:?} tokens");
        let mut step = 0;
        c.bench_function(&format!("sample {name} model logits"), |b| {
            b.iter(|| {
                step += 1;
                let logits = &rows[step as usize % rows.len()];
                black_box(sampler.sample(black_box(logits), &[], 0, step).unwrap())
            })
        });
    }
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
