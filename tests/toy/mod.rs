//! Helpers shared by the sampling and decoding tests: a seeded generator for test cases and toy models.
#![allow(dead_code)] // each test crate uses a different subset

use std::collections::HashMap;

use reprolm::decode::LanguageModel;
use reprolm::error::Result;
use reprolm::sampling::rng::uniform;

/// Test inputs from the crate's own counter-based generator: draw i is `uniform(seed, i)`.
pub struct TestRng {
    seed: u64,
    counter: u64,
}

impl TestRng {
    pub fn new(seed: u64) -> Self {
        TestRng { seed, counter: 0 }
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.counter += 1;
        uniform(self.seed, self.counter)
    }

    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        (self.unit() * 2f64.powi(53)) as u64 ^ ((self.unit() * 2f64.powi(53)) as u64) << 11
    }

    /// Uniform integer in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (1.0 - self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// A model given as a table: the generated suffix (context after the one-token prompt) maps
/// to the next-token distribution; logits are ln p.
pub struct TableModel {
    pub vocab: usize,
    pub table: HashMap<Vec<u32>, Vec<f64>>,
}

impl LanguageModel for TableModel {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn eos_id(&self) -> Option<u32> {
        None
    }
    fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>> {
        let p = &self.table[&context[1..]];
        Ok(p.iter().map(|&x| x.ln() as f32).collect())
    }
}

/// A model whose logits are a pseudo-random function of the whole context.
pub struct HashModel {
    pub vocab: usize,
    pub eos: Option<u32>,
    pub seed: u64,
    /// Logit scale: larger means more peaked distributions.
    pub scale: f64,
    /// Number of `next_logits` calls so far.
    pub calls: usize,
}

impl HashModel {
    pub fn new(vocab: usize, eos: Option<u32>, seed: u64) -> Self {
        HashModel { vocab, eos, seed, scale: 3.0, calls: 0 }
    }
}

impl LanguageModel for HashModel {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn eos_id(&self) -> Option<u32> {
        self.eos
    }
    fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>> {
        self.calls += 1;
        // FNV-1a over the context picks the stream, so the logits are a function of it.
        let hash = context
            .iter()
            .fold(0xCBF2_9CE4_8422_2325u64 ^ self.seed, |h, &id| (h ^ id as u64).wrapping_mul(0x0100_0000_01B3));
        let mut rng = TestRng::new(hash);
        Ok((0..self.vocab).map(|_| (rng.normal() * self.scale) as f32).collect())
    }
}
