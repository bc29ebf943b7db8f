//! The real K-quant mix (Gemma 3 270M, Q4_K_M: F32, Q8_0, Q5_0, Q4_K, Q6_K tensors), fetched
//! by `python -m reprolm download gemma3-270m` (the test command does): every tensor's packed
//! form holds ggml's dequantized values bit for bit, and the matmul kernels on real matrices
//! agree across ISAs bit for bit and with a float64 dot over the dequantized weights.
//! (Bit-exactness of the dequantization itself against the `gguf` package is
//! tests/python/test_gemma_tensors.py.)

use crate::common::{cached_model, Rng};

use reprolm::gguf::GgufFile;
use reprolm::kernels::packed::{dequantize_packed_row, is_packed, pack_rows, packed_row_bytes, Layout};
use reprolm::kernels::{group_sums, group_sums_len, matmul_rows, Activations, Isa, MatRef, Disjoint};
use reprolm::tensor::{dequantize_row, GgmlType};

fn gemma() -> GgufFile {
    GgufFile::open(cached_model("gemma-3-270m-q4_k_m.gguf", "gemma3-270m")).unwrap()
}

#[test]
fn every_tensor_packs_to_the_same_values() {
    let file = gemma();
    let mut types = std::collections::BTreeSet::new();
    for info in file.tensors() {
        let ty = info.ggml_type;
        types.insert(ty.name());
        if !is_packed(ty) {
            continue;
        }
        let cols = info.dims[0] as usize;
        let bytes = file.tensor_bytes(info);
        let packed = pack_rows(ty, cols, bytes);
        let (rb, pb) = (ty.row_bytes(cols), packed_row_bytes(ty, cols));
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        for r in 0..bytes.len() / rb {
            dequantize_row(ty, &bytes[r * rb..(r + 1) * rb], &mut a);
            dequantize_packed_row(ty, &packed[r * pb..(r + 1) * pb], &mut b);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{} row {r}", info.name);
        }
    }
    assert_eq!(types.into_iter().collect::<Vec<_>>(), ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]);
}

#[test]
fn matmuls_on_real_matrices_agree_across_isas_and_with_float64() {
    let file = gemma();
    let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.available()).collect();
    let mut rng = Rng(7);
    let mut seen = std::collections::BTreeSet::new();
    for info in file.tensors().iter().filter(|t| t.dims.len() == 2 && t.ggml_type != GgmlType::F32) {
        let ty = info.ggml_type;
        // One matrix per (type, shape) is enough; at most 96 of its rows.
        if !seen.insert((ty.name(), info.dims.clone())) {
            continue;
        }
        let cols = info.dims[0] as usize;
        let rows = (info.dims[1] as usize).min(96);
        let data = pack_rows(ty, cols, &file.tensor_bytes(info)[..rows * ty.row_bytes(cols)]);
        let m = MatRef { ty, rows, cols, layout: Layout::Grouped, data: &data };
        let mut w = vec![0f32; rows * cols];
        let pb = packed_row_bytes(ty, cols);
        for r in 0..rows {
            dequantize_packed_row(ty, &data[r * pb..(r + 1) * pb], &mut w[r * cols..(r + 1) * cols]);
        }
        for n_tokens in [1, 5] {
            let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.unit()).collect();
            let gl = group_sums_len(cols);
            let mut gs = vec![0f32; n_tokens * gl];
            for t in 0..n_tokens {
                group_sums(&x[t * cols..(t + 1) * cols], &mut gs[t * gl..(t + 1) * gl]);
            }
            let act = Activations { x: &x, gs: &gs, n_tokens, cols };
            let run = |isa: Isa| {
                let mut out = vec![0f32; n_tokens * rows];
                // SAFETY: one thread: nothing else touches `out`.
                unsafe { matmul_rows(isa, &m, &act, 0..rows, Disjoint::new(&mut out), rows) };
                out
            };
            let scalar = run(Isa::Scalar);
            for &isa in &isas {
                assert!(run(isa).iter().zip(&scalar).all(|(a, b)| a.to_bits() == b.to_bits()), "{} on {}", info.name, isa.name());
            }
            // The bound of tests/kernels.rs (fused products of the exact weights, two chains,
            // a 4-level tree).
            for t in 0..n_tokens {
                for r in 0..rows {
                    let (xr, wr) = (&x[t * cols..(t + 1) * cols], &w[r * cols..(r + 1) * cols]);
                    let exact: f64 = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let scale: f64 = xr.iter().zip(wr).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    let bound = (cols as f64 / 16.0 + 9.0) * f64::powi(2.0, -24) * scale.max(1e-30) * 2.0;
                    let got = scalar[t * rows + r] as f64;
                    assert!((got - exact).abs() <= bound, "{} row {r}: {got} vs {exact}", info.name);
                }
            }
        }
    }
    let types: std::collections::BTreeSet<_> = seen.iter().map(|s| s.0).collect();
    assert_eq!(types.into_iter().collect::<Vec<_>>(), ["Q4_K", "Q5_0", "Q6_K", "Q8_0"]);
}
