//! Every kernel path against its scalar twin (bit for bit) and a float64 reference (within
//! the rounding bound documented below), on awkward shapes and 1 to 70 tokens.

use crate::common;

use common::Rng;

use reprolm::kernels::packed::{dequantize_packed_row, is_packed, pack_rows, packed_row_bytes, Layout};
use reprolm::kernels::{group_sums, group_sums_len, matmul_rows, weighted_row_sum, Activations, Isa, MatRef, Disjoint};
use reprolm::tensor::{dequantize_row, GgmlType};


fn isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.available()).collect()
}

/// Random ggml rows of `ty` with finite, moderate scales and values.
fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(rows * ty.row_bytes(cols));
    for _ in 0..rows * cols / ty.block_size() {
        let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
        match ty {
            GgmlType::F32 => bytes.extend_from_slice(&rng.unit().to_le_bytes()),
            GgmlType::F16 => bytes.extend_from_slice(&f16(rng.unit())),
            GgmlType::BF16 => bytes.extend_from_slice(&half::bf16::from_f32(rng.unit()).to_le_bytes()),
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => {
                bytes.extend_from_slice(&f16(rng.unit() * 0.05));
                if ty == GgmlType::Q4_1 {
                    bytes.extend_from_slice(&f16(rng.unit() * 0.5));
                }
                let n = if ty == GgmlType::Q8_0 { 32 } else { 16 };
                bytes.extend((0..n).map(|_| rng.byte()));
            }
            _ => {
                // Random codes and sub-block scales; finite, moderate f16 scales and mins.
                let start = bytes.len();
                bytes.extend((0..ty.block_bytes()).map(|_| rng.byte()));
                for &at in ty.spec().f16_fields {
                    bytes[start + at..start + at + 2].copy_from_slice(&f16(rng.unit() * 0.05));
                }
            }
        }
    }
    bytes
}

/// The matrix in kernel layout (packed for quantized types) and its dequantized values.
fn prepare(ty: GgmlType, rows: usize, cols: usize, ggml: &[u8]) -> (Vec<u8>, Vec<f32>) {
    let data = if is_packed(ty) { pack_rows(ty, cols, ggml) } else { ggml.to_vec() };
    let (rb, pb) = (ty.row_bytes(cols), packed_row_bytes(ty, cols));
    let mut w = vec![0f32; rows * cols];
    for r in 0..rows {
        let out = &mut w[r * cols..(r + 1) * cols];
        if is_packed(ty) {
            dequantize_packed_row(ty, &data[r * pb..(r + 1) * pb], out);
            // The packed layout holds ggml's values bit for bit.
            let mut direct = vec![0f32; cols];
            dequantize_row(ty, &ggml[r * rb..(r + 1) * rb], &mut direct);
            assert!(direct.iter().zip(out.iter()).all(|(a, b)| a.to_bits() == b.to_bits()), "{}", ty.name());
        } else {
            dequantize_row(ty, &ggml[r * rb..(r + 1) * rb], out);
        }
    }
    (data, w)
}

fn run(isa: Isa, m: &MatRef, x: &[f32], gs: &[f32], n_tokens: usize) -> Vec<u32> {
    let mut out = vec![0f32; n_tokens * m.rows];
    let act = Activations { x, gs, n_tokens, cols: m.cols };
    // Two uneven row ranges, as two threads would split them.
    let cut = m.rows / 3;
    for rows in [0..cut, cut..m.rows] {
        // SAFETY: one call at a time, on this thread: no other thread touches `out`.
        unsafe { matmul_rows(isa, m, &act, rows, Disjoint::new(&mut out), m.rows) };
    }
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn matmul_paths_agree_bitwise_and_with_float64() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    for ty in GgmlType::ALL {
        let shapes = [(1, 32), (7, 64), (13, 576), (33, 96), (5, 1536), (3, 256), (6, 768), (2, 2560)];
        for &(rows, cols) in shapes.iter().filter(|s| s.1 % ty.block_size() == 0) {
            let ggml = random_matrix(&mut rng, ty, rows, cols);
            let (data, w) = prepare(ty, rows, cols, &ggml);
            let m = MatRef { ty, rows, cols, layout: Layout::Grouped, data: &data };
            for n_tokens in [1, 2, 3, 4, 5, 17, 70] {
                let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.unit()).collect();
                let gl = group_sums_len(cols);
                let mut gs = vec![0f32; n_tokens * gl];
                for t in 0..n_tokens {
                    group_sums(&x[t * cols..(t + 1) * cols], &mut gs[t * gl..(t + 1) * gl]);
                }
                let scalar = run(Isa::Scalar, &m, &x, &gs, n_tokens);
                for isa in isas() {
                    assert!(run(isa, &m, &x, &gs, n_tokens) == scalar, "{} {rows}x{cols} T={n_tokens} on {}", ty.name(), isa.name());
                }
                // Each token alone (one-token tiles, weights unpacked in registers) gives the
                // bits of the batch (tiles of several tokens, or rows decoded once per block).
                if n_tokens > 1 {
                    for isa in isas() {
                        for t in 0..n_tokens {
                            let (xt, gt) = (&x[t * cols..(t + 1) * cols], &gs[t * gl..(t + 1) * gl]);
                            assert!(
                                run(isa, &m, xt, gt, 1) == scalar[t * rows..(t + 1) * rows],
                                "{} {rows}x{cols} token {t} of {n_tokens} alone on {}",
                                ty.name(),
                                isa.name()
                            );
                        }
                    }
                }
                // Rounding bound: each lane accumulates cols/32 fused products per chain, the chains are added and the tree
                // adds 4 levels (plus the group sums' 5 for Q4_1's offset term), so
                // |error| <= (cols/16 + 9) * 2^-24 * sum_i |x_i w_i| (a gamma_k bound).
                for t in 0..n_tokens {
                    for r in 0..rows {
                        let (xr, wr) = (&x[t * cols..(t + 1) * cols], &w[r * cols..(r + 1) * cols]);
                        let exact: f64 = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let scale: f64 = xr.iter().zip(wr).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                        let got = f32::from_bits(scalar[t * rows + r]) as f64;
                        let bound = (cols as f64 / 16.0 + 9.0) * f64::powi(2.0, -24) * scale.max(1e-30) * 2.0;
                        assert!((got - exact).abs() <= bound, "{} {rows}x{cols}: {got} vs {exact} (bound {bound})", ty.name());
                    }
                }
            }
        }
    }
}

#[test]
fn weighted_row_sum_paths_agree_bitwise_and_with_float64() {
    let mut rng = Rng(42);
    for ty in [GgmlType::F32, GgmlType::F16] {
        for &(rows, cols) in &[(1, 32), (5, 64), (130, 64), (7, 128)] {
            let data = random_matrix(&mut rng, ty, rows, cols);
            let (_, v) = prepare(ty, rows, cols, &data);
            let m = MatRef { ty, rows, cols, layout: Layout::Grouped, data: &data };
            let weights: Vec<f32> = (0..rows).map(|_| rng.unit().abs()).collect();
            let mut scalar = vec![0f32; cols];
            weighted_row_sum(Isa::Scalar, &weights, &m, &mut scalar);
            for isa in isas() {
                let mut out = vec![0f32; cols];
                weighted_row_sum(isa, &weights, &m, &mut out);
                assert_eq!(out, scalar, "{} on {}", ty.name(), isa.name());
            }
            for c in 0..cols {
                let exact: f64 = (0..rows).map(|r| weights[r] as f64 * v[r * cols + c] as f64).sum();
                let scale: f64 = (0..rows).map(|r| (weights[r] as f64 * v[r * cols + c] as f64).abs()).sum();
                let bound = rows as f64 * f64::powi(2.0, -24) * scale.max(1e-30) * 2.0;
                assert!((scalar[c] as f64 - exact).abs() <= bound);
            }
        }
    }
}

/// Distance in units in the last place between two finite f32 of the same sign.
fn ulps(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

#[test]
fn exp_is_within_one_ulp_mostly_correctly_rounded_and_identical_on_every_path() {
    use reprolm::kernels::elementwise::exp_in_place;
    // A dense sweep of the normal range (exp(x) >= 2^-125), then the edges.
    let n = 400_003;
    let mut xs: Vec<f32> = (0..n).map(|i| -86.6 + (88.7 + 86.6) * i as f32 / (n - 1) as f32).collect();
    xs.extend([0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 88.72, 88.73, 89.5, 1e10, -86.99, -87.5, -88.5, -1e10]);
    xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE]);
    let mut expected = xs.clone();
    exp_in_place(Isa::Scalar, &mut expected);
    for isa in isas() {
        let mut got = xs.clone();
        exp_in_place(isa, &mut got);
        assert!(got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} differs from scalar");
    }
    let (mut worst, mut exact, mut checked) = (0, 0, 0);
    for (&x, &y) in xs.iter().zip(&expected) {
        let correct = (x as f64).exp();
        let log2 = x as f64 * std::f64::consts::LOG2_E;
        if log2 < -125.02 {
            assert_eq!(y, 0.0, "exp({x}) flushes to zero below 2^-125");
        } else if correct > f32::MAX as f64 {
            assert_eq!(y, f32::INFINITY, "exp({x}) overflows");
        } else if log2 > -124.98 {
            let u = ulps(y, correct as f32);
            worst = worst.max(u);
            exact += (u == 0) as usize;
            checked += 1;
            assert!(u <= 1, "exp({x}) = {y}, exact {correct}: {u} ulp");
        }
    }
    let share = exact as f64 / checked as f64;
    println!("exp: worst {worst} ulp, correctly rounded {:.4}%", 100.0 * share);
    assert!(share > 0.99, "only {share} correctly rounded");
    let mut nan = [f32::NAN];
    exp_in_place(Isa::best(), &mut nan);
    assert!(nan[0].is_nan());
}

#[test]
fn softmax_is_identical_on_every_path_and_matches_float64() {
    use reprolm::kernels::elementwise::softmax_scaled;
    let mut rng = Rng(7);
    for len in (1..70).chain([1000, 4099]) {
        let scores: Vec<f32> = (0..len).map(|_| rng.unit() * 40.0).collect();
        let scale = 0.125;
        let mut expected = scores.clone();
        softmax_scaled(Isa::Scalar, &mut expected, scale);
        for isa in isas() {
            let mut got = scores.clone();
            softmax_scaled(isa, &mut got, scale);
            assert!(got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?}, {len} scores");
        }
        let v: Vec<f64> = scores.iter().map(|&s| (s * scale) as f64).collect();
        let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = v.iter().map(|x| (x - m).exp()).sum();
        for (&p, x) in expected.iter().zip(&v) {
            let exact = (x - m).exp() / z;
            // exp within 2 ulp, a sum of `len` terms (relative error <= len * 2^-24), a division.
            let bound = exact * (4.0 + len as f64) * f32::EPSILON as f64 + 1e-30;
            assert!((p as f64 - exact).abs() <= bound, "len {len}: {p} vs {exact}");
        }
    }
}

#[test]
fn swiglu_is_identical_on_every_path_and_matches_float64() {
    use reprolm::kernels::elementwise::swiglu;
    let mut rng = Rng(11);
    for len in (1..70).chain([1536]) {
        let gate: Vec<f32> = (0..len).map(|_| rng.unit() * 30.0).collect();
        let up: Vec<f32> = (0..len).map(|_| rng.unit() * 3.0).collect();
        let mut expected = gate.clone();
        swiglu(Isa::Scalar, &mut expected, &up);
        for isa in isas() {
            let mut got = gate.clone();
            swiglu(isa, &mut got, &up);
            assert!(got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?}, {len} values");
        }
        for ((&y, &g), &u) in expected.iter().zip(&gate).zip(&up) {
            let (g, u) = (g as f64, u as f64);
            let exact = g / (1.0 + (-g).exp()) * u;
            // exp within 2 ulp, then an add, a division and a multiplication, each rounded.
            assert!((y as f64 - exact).abs() <= exact.abs() * 6.0 * f32::EPSILON as f64, "{g} {u}: {y} vs {exact}");
        }
    }
}

#[test]
fn geglu_is_identical_on_every_path_and_matches_float64() {
    use reprolm::kernels::elementwise::geglu;
    let mut rng = Rng(12);
    for len in (1..70).chain([1536]) {
        let gate: Vec<f32> = (0..len).map(|_| rng.unit() * 12.0).collect();
        let up: Vec<f32> = (0..len).map(|_| rng.unit() * 3.0).collect();
        let mut expected = gate.clone();
        geglu(Isa::Scalar, &mut expected, &up);
        for isa in isas() {
            let mut got = gate.clone();
            geglu(isa, &mut got, &up);
            assert!(got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?}, {len} values");
        }
        for ((&y, &g), &u) in expected.iter().zip(&gate).zip(&up) {
            let (g, u) = (g as f64, u as f64);
            // GELU with the tanh approximation, as transformers' gelu_pytorch_tanh defines it.
            let exact = 0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh()) * u;
            // The tanh argument is rounded a few times before exp (relative error a few ulp of
            // an argument up to ~90), then as for SiLU: an absolute bound scaled by |g u|.
            let tol = (g * u).abs() * 64.0 * f32::EPSILON as f64 + 1e-30;
            assert!((y as f64 - exact).abs() <= tol, "{g} {u}: {y} vs {exact}");
        }
    }
}
