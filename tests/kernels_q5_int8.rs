//! The int8 kernels of Q5_0 and Q5_1 (layout in `kernels::q5`, order of operations in
//! `kernels::int8`): every ISA against the scalar twin bit for bit, and the scalar twin
//! against a float64 evaluation of the definition, step by step with f32 rounding where the
//! definition rounds, equal bit for bit. The weights are decoded here from ggml's block
//! definitions, independently of the crate's decoders. On random blocks (row widths with
//! full, padded and narrow last chunks) and on the real Q5_0 tensors of the Gemma 3 270M
//! file (640 columns: a narrow last chunk of 4 groups).

use crate::common::int8::{check_against_definition, random_ggml_matrix, TOKENS};
use crate::common::{cached_model, Rng};

use reprolm::gguf::GgufFile;
use reprolm::kernels::packed::{dequantize_packed_row_in, pack_rows_in, Layout};
use reprolm::kernels::quantize_act::{code_offset, narrow_groups, QuantizedRows};
use reprolm::tensor::{dequantize_row, GgmlType};

const TYPES: [GgmlType; 2] = [GgmlType::Q5_0, GgmlType::Q5_1];
/// Widths of 1, 2, 4, 5, 9, 16, 17, 18, 20, 21 and 48 groups: full chunks of 16, narrow last
/// chunks (1 to 4 groups) and padded wide ones (5 to 15). Row counts from 1 to 40, which `run`
/// splits in two calls.
const SHAPES: [(usize, usize); 11] =
    [(1, 32), (7, 64), (2, 128), (33, 160), (3, 288), (24, 512), (3, 544), (40, 576), (5, 640), (3, 672), (37, 1536)];


fn f16(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// A row of ggml blocks decoded by ggml's definitions: the integer weight of each value
/// (Q5_0 `u - 16`, Q5_1 `u`, `u` the 5-bit code), and each group's f16 `d` and `m` (Q5_1).
fn decode(ty: GgmlType, row: &[u8]) -> (Vec<i64>, Vec<f32>, Vec<f32>) {
    let (mut q, mut d, mut m) = (vec![], vec![], vec![]);
    for b in row.chunks_exact(ty.block_bytes()) {
        // Q5_0 {d, qh: u32, qs[16]}, Q5_1 {d, m, qh, qs}: value j's low 4 bits are nibble
        // j / 16 of qs[j % 16], its bit 4 is bit j of qh.
        let at = if ty == GgmlType::Q5_0 { 2 } else { 4 };
        let qh = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let qs = &b[at + 4..at + 20];
        let bias = if ty == GgmlType::Q5_0 { 16 } else { 0 };
        q.extend((0..32).map(|j| ((qs[j % 16] >> (4 * (j / 16))) & 0x0F) as i64 + 16 * ((qh >> j) & 1) as i64 - bias));
        d.push(f16(&b[0..2]));
        m.push(if ty == GgmlType::Q5_1 { f16(&b[2..4]) } else { 0.0 });
    }
    (q, d, m)
}

/// `fma(a, b, c)` rounded once to f32, from float64 (as in `kernels_kquant_int8`).
fn fma32(a: f32, b: f32, c: f32) -> f32 {
    let p = a as f64 * b as f64;
    let s = p + c as f64;
    let bb = s - p;
    let e = (p - (s - bb)) + (c as f64 - bb);
    let r = s as f32;
    if e == 0.0 || r as f64 == s {
        return r;
    }
    let other = if s > r as f64 { r.next_up() } else { r.next_down() };
    if (r as f64 + other as f64) / 2.0 == s {
        return if (e > 0.0) == (other as f64 > r as f64) { other } else { r };
    }
    r
}

/// One output by the definition (module docs of `kernels::int8`), in float64 with f32
/// rounding at each step the definition rounds: per chunk, lane by lane, the exact integer
/// sum, `dd = d_w d_x` rounded to f32, `fma(dd, isum, acc)`, then (Q5_1) `fma(m_w, s_x, acc)`
/// with lane `l` = group `16c + l`; a narrow last chunk's lane `4g + w` takes 8 values of
/// group `g` and that group's scales.
fn definition(ty: GgmlType, w: &(Vec<i64>, Vec<f32>, Vec<f32>), act: &QuantizedRows, t: usize, cols: usize) -> f32 {
    let (q, d, m) = w;
    let groups = cols / 32;
    let (qs, ls) = (act.q_stride(), act.lane_stride());
    let xq = |i: usize| act.q[t * qs + code_offset(cols, i)] as i64;
    let narrow = narrow_groups(cols);
    let mut acc = [0f32; 16];
    for c in 0..groups.div_ceil(16) {
        let g0 = 16 * c;
        for l in 0..16 {
            let lane = t * ls + g0 + l;
            let (isum, dd) = if narrow > 0 && g0 == groups - narrow {
                // Lane l = 4g + w: values 4w..4w + 4 and 16 + 4w..16 + 4w + 4 of group g.
                let (g, v) = (g0 + l / 4, l % 4);
                if l / 4 >= narrow {
                    (0, 0.0 * act.tail_d[t * 16 + l])
                } else {
                    let s: i64 = (0..4).flat_map(|b| [4 * v + b, 16 + 4 * v + b]).map(|i| q[32 * g + i] * xq(32 * g + i)).sum();
                    assert_eq!(act.tail_d[t * 16 + l].to_bits(), act.d[t * ls + g].to_bits());
                    (s, (d[g] as f64 * act.d[t * ls + g] as f64) as f32)
                }
            } else if g0 + l < groups {
                let g = g0 + l;
                ((0..32).map(|i| q[32 * g + i] * xq(32 * g + i)).sum(), (d[g] as f64 * act.d[lane] as f64) as f32)
            } else {
                (0, 0.0 * act.d[lane])
            };
            assert!(isum.abs() < 1 << 24, "exact by the bounds in the docs");
            acc[l] = fma32(dd, isum as f32, acc[l]);
            if ty == GgmlType::Q5_1 {
                let mw = if g0 + l < groups { m[g0 + l] } else { 0.0 };
                acc[l] = fma32(mw, act.s[lane], acc[l]);
            }
        }
    }
    for h in [8, 4, 2, 1] {
        for l in 0..h {
            acc[l] = (acc[l] as f64 + acc[l + h] as f64) as f32;
        }
    }
    acc[0]
}

/// [`check_against_definition`] with this file's decoder and definition.
fn check(ty: GgmlType, rows: usize, cols: usize, ggml: &[u8], tokens: &[usize], rng: &mut Rng, what: &str) {
    check_against_definition(ty, rows, cols, ggml, tokens, rng, what, |row| decode(ty, row), |w, act, t| definition(ty, w, act, t, cols));
}

#[test]
fn q5_int8_paths_agree_bitwise_and_equal_their_definition() {
    let mut rng = Rng(0x7135_0000_0000_0001);
    for ty in TYPES {
        for &(rows, cols) in &SHAPES {
            let ggml = random_ggml_matrix(&mut rng, ty, rows, cols);
            check(ty, rows, cols, &ggml, &TOKENS, &mut rng, &format!("{} {rows}x{cols}", ty.name()));
        }
    }
}

#[test]
fn q5_0_int8_on_gemma3_tensors() {
    let file = GgufFile::open(cached_model("gemma-3-270m-q4_k_m.gguf", "gemma3-270m")).unwrap();
    let mut rng = Rng(13);
    let mut seen = std::collections::BTreeSet::new();
    for info in file.tensors().iter().filter(|t| t.dims.len() == 2 && t.ggml_type == GgmlType::Q5_0) {
        let ty = info.ggml_type;
        let (cols, all_rows) = (info.dims[0] as usize, info.dims[1] as usize);
        let bytes = file.tensor_bytes(info);
        // Every row packs to ggml's values (checked in `check` for the rows it multiplies).
        let mut packed = vec![0u8; bytes.len()];
        pack_rows_in(ty, Layout::Chunked, cols, bytes, &mut packed);
        let (rb, mut a, mut b) = (ty.row_bytes(cols), vec![0f32; cols], vec![0f32; cols]);
        for r in 0..all_rows {
            dequantize_row(ty, &bytes[r * rb..(r + 1) * rb], &mut a);
            dequantize_packed_row_in(ty, Layout::Chunked, &packed[r * rb..(r + 1) * rb], &mut b);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{} row {r}", info.name);
        }
        // The kernels on one matrix per shape, at most 48 of its rows.
        if seen.insert(info.dims.clone()) {
            let rows = all_rows.min(48);
            check(ty, rows, cols, &bytes[..rows * rb], &[1, 5, 17], &mut rng, &info.name);
        }
    }
    assert!(!seen.is_empty(), "the Gemma 3 file has Q5_0 matrices");
}
