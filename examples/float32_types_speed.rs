//! Times the float32 (reference-exact) kernel of each weight type on a 1 B model's
//! feed-forward shape (2048 rows x 8192 columns), one thread, and prints multiply-adds per
//! second with a hash of the outputs (equal hashes: equal bits, for comparing builds), after
//! the core's float32 multiply-add peak (independent FMA chains in registers, the ISA's
//! widest vectors) that the kernel rates are a fraction of. Not a test: prints medians of 15
//! runs.
//!
//! `cargo run --release --example float32_types_speed [-- TOKENS [TYPE [ISA [ROWSxCOLS]]]]`
//! (default 64 tokens, every type, the best ISA, 2048x8192; TYPE filters by name, e.g.
//! `Q4_K`, or `all`; ISA is `avx512`, `avx2` or `scalar`).

mod common;

use common::{activations, bits_hash, ggml_matrix, median_seconds, parse_shape, TYPES};
use reprolm::kernels::packed::{pack_rows, Layout};
use reprolm::kernels::{group_sums, group_sums_len, matmul_rows, Activations, Disjoint, Isa, MatRef};

/// (rows, cols): a 1 B Llama's feed-forward down matrix.
const SHAPE: (usize, usize) = (2048, 8192);

fn main() {
    let mut args = std::env::args().skip(1);
    let n_tokens: usize = args.next().map_or(64, |s| s.parse().expect("TOKENS: a number"));
    let only = args.next().filter(|t| t != "all");
    let isa = args.next().map_or_else(Isa::best, |name| Isa::parse(&name).expect("ISA: avx512, avx2 or scalar"));
    assert!(isa.available(), "this CPU cannot run the {} kernels", isa.name());
    let (rows, cols) = args.next().map_or(SHAPE, |s| parse_shape(&s));
    println!("{n_tokens} tokens, 1 thread, {} float32 kernels; median of 15 runs", isa.name());
    if let Some(peak) = fma_peak(isa) {
        println!("FMA peak             {peak:6.1} G multiply-adds/s");
    }
    let x = activations(n_tokens, cols);
    let gl = group_sums_len(cols);
    let mut gs = vec![0f32; n_tokens * gl];
    for t in 0..n_tokens {
        group_sums(&x[t * cols..(t + 1) * cols], &mut gs[t * gl..(t + 1) * gl]);
    }
    let act = Activations { x: &x, gs: &gs, n_tokens, cols };
    for (ty, scales) in TYPES {
        if only.as_deref().is_some_and(|o| o != ty.name()) {
            continue;
        }
        let packed = pack_rows(ty, cols, &ggml_matrix(ty, scales, rows, cols));
        let w = MatRef { ty, rows, cols, layout: Layout::Grouped, data: &packed };
        // [token][row]
        let mut out = vec![0f32; n_tokens * rows];
        let s = median_seconds(15, || {
            // SAFETY: no other thread touches `out`.
            unsafe { matmul_rows(isa, &w, &act, 0..rows, Disjoint::new(&mut out), rows) }
        });
        let gmacs = (rows * cols * n_tokens) as f64 / s / 1e9;
        println!("{:<5} {rows}x{cols} x{n_tokens}: {gmacs:6.1} G multiply-adds/s  hash {:016x}", ty.name(), bits_hash(&out));
    }
}

/// The multiply-adds per second of 12 independent FMA chains on `isa`'s vectors (enough to
/// cover the FMA latency on two ports), or `None` for the scalar path.
fn fma_peak(isa: Isa) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        const STEPS: usize = 1 << 20;
        let lanes = match isa {
            Isa::Avx512 => 16,
            Isa::Avx2 => 8,
            Isa::Scalar => return None,
        };
        let mut sink = 0f32;
        let s = median_seconds(15, || {
            // SAFETY: `isa` is available (checked by the caller), so the CPU has its features.
            sink += unsafe { if lanes == 16 { fma_chains_avx512(STEPS) } else { fma_chains_avx2(STEPS) } };
        });
        std::hint::black_box(sink);
        Some((12 * STEPS * lanes) as f64 / s / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        None
    }
}

/// 12 chains of `steps` FMAs on 16-lane vectors; returns a value that depends on all of them.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains_avx512(steps: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(std::hint::black_box(0.999_999)), _mm512_set1_ps(std::hint::black_box(1e-7)));
    let mut acc = [_mm512_set1_ps(std::hint::black_box(1.0)); 12];
    for _ in 0..std::hint::black_box(steps) {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
}

/// As [`fma_chains_avx512`] on 8-lane vectors.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains_avx2(steps: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(std::hint::black_box(0.999_999)), _mm256_set1_ps(std::hint::black_box(1e-7)));
    let mut acc = [_mm256_set1_ps(std::hint::black_box(1.0)); 12];
    for _ in 0..std::hint::black_box(steps) {
        for v in acc.iter_mut() {
            *v = _mm256_fmadd_ps(*v, a, b);
        }
    }
    let sum = acc[1..].iter().fold(acc[0], |s, &v| _mm256_add_ps(s, v));
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), sum);
    out.iter().sum()
}
