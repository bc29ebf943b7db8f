//! The int8 kernels (precision "int8"): every ISA against the scalar twin bit for bit, the
//! activation quantizer against a direct float64 / integer reference, and the kernel result
//! against a float64 evaluation of the same quantized arithmetic within a derived bound.

use crate::common;

use common::int8::{int8_isas, random_acts, run, TOKENS};
use common::Rng;

use reprolm::kernels::packed::{pack_rows, pack_rows_in, packed_row_bytes, reads_blocks_in_place, Layout};
use reprolm::kernels::quantize_act::{code_offset, narrow_groups, QuantizedRows};
use reprolm::kernels::{Isa, MatRef};
use reprolm::tensor::{GgmlType, KernelGroup};


/// (Q5_0 and Q5_1 have a layout of their own: `kernels_q5_int8`.)
const TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];
/// Widths of 1, 2, 3, 5, 9, 16, 17, 18, 21 and 48 groups: full chunks of 16, narrow last
/// chunks (1 to 4 groups) and padded wide ones (5 to 15). Row counts from 1 to 40, which `run`
/// splits in two calls.
const SHAPES: [(usize, usize); 10] =
    [(1, 32), (7, 64), (33, 96), (2, 160), (3, 288), (24, 512), (3, 544), (40, 576), (3, 672), (37, 1536)];

/// Random ggml rows of `ty` with finite, moderate scales (some negative) and random codes.
fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(rows * ty.row_bytes(cols));
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    for _ in 0..rows * cols / 32 {
        bytes.extend_from_slice(&f16(rng.unit() * 0.05));
        if ty == GgmlType::Q4_1 {
            bytes.extend_from_slice(&f16(rng.unit() * 0.5));
        }
        // Include -128, which Q8_0 files do not contain but the kernels must handle.
        let n = ty.block_bytes() - bytes.len() % ty.block_bytes();
        bytes.extend((0..n).map(|_| rng.byte()));
    }
    bytes
}

/// One packed (grouped layout) row's integer weights per value and f16 scales per group:
/// (`q_w` with Q4_0's -8 applied, `d`, `m`).
fn decode_row(ty: GgmlType, row: &[u8], cols: usize) -> (Vec<i32>, Vec<f64>, Vec<f64>) {
    let groups = cols / 32;
    let cb = if ty.kernel() == KernelGroup::Q8_0 { 32 } else { 16 };
    let f16 = |b: &[u8], g: usize| half::f16::from_le_bytes([b[2 * g], b[2 * g + 1]]).to_f64();
    let mut q = vec![0i32; cols];
    for g in 0..groups {
        let codes = &row[g * cb..(g + 1) * cb];
        for j in 0..32 {
            q[32 * g + j] = match ty {
                GgmlType::Q8_0 => codes[j] as i8 as i32,
                _ => {
                    let nib = if j < 16 { codes[j] & 0x0F } else { codes[j - 16] >> 4 } as i32;
                    if ty == GgmlType::Q4_0 {
                        nib - 8
                    } else {
                        nib
                    }
                }
            };
        }
    }
    let scales = &row[groups * cb..];
    let d = (0..groups).map(|g| f16(scales, g)).collect();
    let m = if ty == GgmlType::Q4_1 { (0..groups).map(|g| f16(&scales[2 * groups..], g)).collect() } else { vec![0.0; groups] };
    (q, d, m)
}

#[test]
fn int8_paths_agree_bitwise_and_with_float64() {
    let mut rng = Rng(0x0DDB_1A5E_5BAD_5EED);
    let u = f64::powi(2.0, -24);
    for ty in TYPES {
        for &(rows, cols) in &SHAPES {
            let ggml = random_matrix(&mut rng, ty, rows, cols);
            let grouped = pack_rows(ty, cols, &ggml);
            let mut chunked = vec![0u8; grouped.len()];
            pack_rows_in(ty, Layout::Chunked, cols, &ggml, &mut chunked);
            let m = MatRef { ty, rows, cols, layout: Layout::Chunked, data: &chunked };
            let rb = packed_row_bytes(ty, cols);
            let decoded: Vec<_> = (0..rows).map(|r| decode_row(ty, &grouped[r * rb..(r + 1) * rb], cols)).collect();
            for n_tokens in TOKENS {
                let x = random_acts(&mut rng, n_tokens, cols);
                let mut act = QuantizedRows::default();
                act.quantize(Isa::Scalar, &x, cols, n_tokens);
                let scalar = run(Isa::Scalar, &m, &act);
                for isa in int8_isas() {
                    assert!(run(isa, &m, &act) == scalar, "{} {rows}x{cols} T={n_tokens} on {}", ty.name(), isa.name());
                }
                // Q8_0 read in place from ggml's blocks: the same bits on every path.
                if reads_blocks_in_place(ty) {
                    let blocks = MatRef { layout: Layout::Blocks, data: &ggml, ..m };
                    for isa in int8_isas() {
                        assert!(run(isa, &blocks, &act) == scalar, "{} blocks {rows}x{cols} T={n_tokens} on {}", ty.name(), isa.name());
                    }
                }
                // The same quantized arithmetic in float64: sum_g d_w d_x isum_g + m_w s_x. The
                // f32 kernel rounds `dd = d_w d_x` once, then each lane accumulates k fused
                // terms (k = chunks, twice that for Q4_1) and the tree adds 4 levels, so
                // |error| <= gamma_(k + 5) * sum |terms|, gamma_n = n u / (1 - n u), u = 2^-24
                // (plus the float64 evaluation's own rounding, below 2^-40 relative).
                let (groups, chunks) = (cols / 32, (cols / 32).div_ceil(16));
                let k = if ty == GgmlType::Q4_1 { 2 * chunks } else { chunks };
                let n = (k + 5) as f64;
                let gamma = n * u / (1.0 - n * u);
                let (qs, ls) = (act.q_stride(), act.lane_stride());
                for t in 0..n_tokens {
                    for (r, (qw, dw, mw)) in decoded.iter().enumerate() {
                        let (mut exact, mut scale) = (0f64, 0f64);
                        for g in 0..groups {
                            let prod = |j: usize| qw[32 * g + j] as i64 * act.q[t * qs + code_offset(cols, 32 * g + j)] as i64;
                            let dd = dw[g] * act.d[t * ls + g] as f64;
                            // A narrow last chunk adds a group as 4 lane terms (values
                            // 4w..4w+4 and 16+4w..16+4w+4), the others as one.
                            let parts: Vec<i64> = if g >= groups - narrow_groups(cols) {
                                (0..4).map(|w| (0..4).map(|b| prod(4 * w + b) + prod(16 + 4 * w + b)).sum()).collect()
                            } else {
                                vec![(0..32).map(prod).sum()]
                            };
                            for p in parts {
                                exact += dd * p as f64;
                                scale += (dd * p as f64).abs();
                            }
                            let b = mw[g] * act.s[t * ls + g] as f64;
                            exact += b;
                            scale += b.abs();
                        }
                        let got = f32::from_bits(scalar[t * rows + r]) as f64;
                        let bound = gamma * scale + f64::powi(2.0, -40) * scale;
                        assert!(
                            (got - exact).abs() <= bound,
                            "{} {rows}x{cols} T={n_tokens}: {got} vs {exact} (bound {bound})",
                            ty.name()
                        );
                    }
                }
            }
        }
    }
}

/// `x / d` as one f32 division: the float64 quotient of two f32 values rounded once to f32
/// is the correctly rounded f32 quotient (53 >= 2 * 24 + 2 bits).
fn div_f32(x: f32, d: f32) -> f32 {
    (x as f64 / d as f64) as f32
}

/// Round half away from zero, spelled out on the float64 value.
fn round_away(v: f64) -> i64 {
    let f = v.abs().floor();
    let r = if v.abs() - f >= 0.5 { f + 1.0 } else { f };
    (r as i64) * if v < 0.0 { -1 } else { 1 }
}

#[test]
fn activation_quantizer_matches_its_definition() {
    // A narrow last chunk (16 + 2 groups) and a padded wide one (16 + 5).
    check_quantizer(18 * 32, 512 + 128);
    check_quantizer(21 * 32, 2 * 512);
}

/// Every available ISA's quantizer: the same bytes as the scalar one (each is checked
/// against the definition below).
fn quantizer_isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.available()).collect()
}

fn check_quantizer(cols: usize, q_stride: usize) {
    for isa in quantizer_isas() {
        check_quantizer_on(isa, cols, q_stride);
    }
}

fn check_quantizer_on(isa: Isa, cols: usize, q_stride: usize) {
    let mut rng = Rng(7);
    let n_tokens = 5;
    let mut x = random_acts(&mut rng, n_tokens, cols);
    // Hand-made groups: exact ties (max 127, so d = 1 and x / d = k + 0.5), negative maximum,
    // tiny values whose scale is subnormal, huge values.
    for j in 0..32 {
        x[32 + j] = match j {
            0 => 127.0,
            // Just below one half: a naive `trunc(v + 0.5)` would round these up.
            1 => 0.49999997,
            2 => -0.49999997,
            _ => (j as f32 - 16.0) + 0.5,
        };
        x[32 * 2 + j] = -(j as f32) * 0.25;
        x[32 * 3 + j] = (j as f32 - 15.0) * 1e-42;
        x[32 * 4 + j] = (j as f32 - 20.0) * 1e30;
        // Non-finite values (not produced by a finite model, but defined): NaN codes 0 and
        // is skipped by the maximum; an infinity makes `d` infinite and every code 0.
        x[32 * 5 + j] = if j % 7 == 3 { f32::NAN } else { (j as f32 - 9.0) * 0.3 };
        x[32 * 6 + j] = if j == 30 { f32::NEG_INFINITY } else { j as f32 };
    }
    let mut q = QuantizedRows::default();
    q.quantize(isa, &x, cols, n_tokens);
    let (qs, ls) = (q.q_stride(), q.lane_stride());
    assert_eq!(qs, q_stride);
    assert_eq!(ls, 32);
    let mut saw_tie = false;
    for t in 0..n_tokens {
        for g in 0..ls {
            let lane = t * ls + g;
            if g >= cols / 32 {
                // Padding of the last chunk.
                assert_eq!((q.d[lane], q.s[lane], q.qsum[lane], q.hsum[lane]), (0.0, 0.0, 0, 0));
                continue;
            }
            let xs = &x[t * cols + 32 * g..t * cols + 32 * g + 32];
            let a = xs.iter().map(|v| v.abs() as f64).fold(0.0, f64::max);
            let d = (a / 127.0) as f32; // correctly rounded (see div_f32)
            assert_eq!(q.d[lane].to_bits(), d.to_bits(), "d of group {g}, token {t}, {}", isa.name());
            let (mut sum, mut first_half) = (0i64, 0i64);
            for (j, &v) in xs.iter().enumerate() {
                let code = q.q[t * qs + code_offset(cols, 32 * g + j)] as i64;
                let expected = if d == 0.0 { 0 } else { round_away(div_f32(v, d) as f64).clamp(-127, 127) };
                assert_eq!(code, expected, "value {j} of group {g}, token {t}, {}: x = {v}, d = {d}", isa.name());
                assert_eq!(q.grouped[t * cols + 32 * g + j] as i64, code, "grouped copy of value {j} of group {g}, token {t}");
                if d != 0.0 && d.is_normal() && v.is_finite() {
                    // The code is the nearest integer to x / d, up to the rounding of the f32
                    // quotient (|x / d| <= 128, so at most 128 * 2^-24 off):
                    // |x - d q| <= d (1/2 + 2^-17).
                    let err = (v as f64 - d as f64 * code as f64).abs();
                    assert!(err <= d as f64 * (0.5 + f64::powi(2.0, -17)), "x = {v}, d = {d}, q = {code}");
                    saw_tie |= (div_f32(v, d) as f64).fract().abs() == 0.5;
                }
                sum += code;
                if j < 16 {
                    first_half += code;
                }
            }
            assert_eq!(q.qsum[lane] as i64, sum);
            assert_eq!(q.hsum[lane] as i64, first_half);
            if g >= cols / 32 - narrow_groups(cols) {
                // The narrow chunk's per-lane scale and code sums.
                let l = g % 16;
                for w in 0..4 {
                    let lane_sum: i64 = (0..4)
                        .map(|b| {
                            let at = |j: usize| q.q[t * qs + code_offset(cols, 32 * g + j)] as i64;
                            at(4 * w + b) + at(16 + 4 * w + b)
                        })
                        .sum();
                    assert_eq!(q.tail_sum[t * 16 + 4 * l + w] as i64, lane_sum);
                    assert_eq!(q.tail_d[t * 16 + 4 * l + w].to_bits(), d.to_bits());
                }
            }
            assert_eq!(q.s[lane].to_bits(), ((d as f64 * sum as f64) as f32).to_bits());
        }
    }
    assert!(saw_tie, "the tie group must exercise round-half-away");
}
