//! The fuzz corpora (`fuzz/corpus/<target>/`) replayed through the fuzz targets' own bodies
//! (`fuzz/src/targets.rs`, compiled into this test binary), so every input a fuzzer kept,
//! including each crash it found, is re-checked by `cargo test` without any fuzzer.
//!
//! `mutation_smoke` (ignored by default; `bash fuzz/smoke.sh` runs it) adds a short
//! non-instrumented fuzzing pass: random mutations of the corpus files, for
//! `REPROLM_FUZZ_SMOKE_SECONDS` (default 10) per target. It needs no fuzzer and no extra build.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[allow(dead_code)]
#[path = "../fuzz/src/alloc.rs"]
mod alloc;
#[allow(dead_code)]
#[path = "../fuzz/src/targets.rs"]
mod targets;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 6] = [
    ("gguf", targets::gguf),
    ("state", targets::state),
    ("tokenizer", targets::tokenizer_target),
    ("chat", targets::chat),
    ("sampler", targets::sampler),
    ("grammar", targets::grammar),
];

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

/// Runs one input; on a panic, saves it under target/fuzz-smoke/ and says where.
fn run(target: &str, f: Target, input: &[u8], origin: &str) {
    if let Err(panic) = std::panic::catch_unwind(|| f(input)) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-smoke");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("crash-{target}-{:016x}", reprolm::state::xxh64(input, 0)));
        std::fs::write(&path, input).unwrap();
        eprintln!("{target}: input from {origin} failed; saved as {}", path.display());
        std::panic::resume_unwind(panic);
    }
}

fn replay(target: &str) {
    let f = TARGETS.iter().find(|(name, _)| *name == target).unwrap().1;
    for (path, bytes) in corpus(target) {
        run(target, f, &bytes, &path.display().to_string());
    }
}

#[test]
fn replay_gguf() {
    replay("gguf");
}

#[test]
fn replay_state() {
    replay("state");
}

#[test]
fn replay_tokenizer() {
    replay("tokenizer");
}

#[test]
fn replay_chat() {
    replay("chat");
}

#[test]
fn replay_sampler() {
    replay("sampler");
}

#[test]
fn replay_grammar() {
    replay("grammar");
}

/// xorshift64*: the mutator's randomness (seeded, so a run can be repeated).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four random edits: bit flips, interesting bytes and integers, insertions,
/// deletions, duplicated ranges, and splices from another corpus file.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8], max_len: usize) -> Vec<u8> {
    const INTERESTING: [u64; 10] = [0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 0xFFFF_FFFF, u64::MAX, 1 << 40];
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = INTERESTING[rng.below(INTERESTING.len())] as u8;
            }
            2 => {
                let width = [4, 8][rng.below(2)];
                let value = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let end = (at + width).min(out.len());
                out[at..end].copy_from_slice(&value[..end - at]);
            }
            3 => {
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                out.splice(at..at, bytes);
            }
            4 if !out.is_empty() => {
                let end = (at + 1 + rng.below(64)).min(out.len());
                out.drain(at.min(end)..end);
            }
            5 if !out.is_empty() => {
                let start = rng.below(out.len());
                let end = (start + 1 + rng.below(64)).min(out.len());
                let piece = out[start..end].to_vec();
                out.splice(at..at, piece);
            }
            _ if !other.is_empty() => {
                let start = rng.below(other.len());
                let end = (start + 1 + rng.below(256)).min(other.len());
                out.splice(at..at, other[start..end].iter().copied());
            }
            _ => {}
        }
    }
    out.truncate(max_len);
    out
}

#[test]
#[ignore = "a timed run: `bash fuzz/smoke.sh`"]
fn mutation_smoke() {
    let seconds: u64 = std::env::var("REPROLM_FUZZ_SMOKE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seconds);
    for (target, f) in TARGETS {
        let files = corpus(target);
        let max_len = files.iter().map(|(_, b)| b.len()).max().unwrap() + 1024;
        let start = Instant::now();
        let mut runs = 0u64;
        while start.elapsed() < Duration::from_secs(seconds) {
            let (_, input) = &files[rng.below(files.len())];
            let (_, other) = &files[rng.below(files.len())];
            let mutated = mutate(&mut rng, input, other, max_len);
            run(target, f, &mutated, "a mutation");
            runs += 1;
        }
        eprintln!("{target}: {runs} mutated inputs in {:.1?}, no failure", start.elapsed());
    }
}
