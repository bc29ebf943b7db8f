//! The int8 kernels of the K-quant types (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K; layout in `kernels::kquant`
//! and `kernels::kquant_low`, order of
//! operations in `kernels::int8`): every ISA against the scalar twin bit for bit, and the
//! scalar twin against a float64 evaluation of the definition, step by step with f32
//! rounding where the definition rounds, equal bit for bit. The weights are decoded here from
//! ggml's block definitions, independently of the crate's decoders. On random blocks and on
//! the real Q4_K/Q6_K tensors of the Gemma 3 270M file (which has no Q5_K).

use crate::common::int8::{check_against_definition, random_ggml_matrix, TOKENS};
use crate::common::{cached_model, Rng};

use reprolm::gguf::GgufFile;
use reprolm::kernels::packed::{dequantize_packed_row_in, has_own_int8_layout, is_int8_packable, is_kquant_int8, layout_row_bytes, pack_rows_in, Layout};
use reprolm::kernels::quantize_act::{code_offset, QuantizedRows};
use reprolm::tensor::{dequantize_row, GgmlType};

const TYPES: [GgmlType; 5] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q3_K, GgmlType::Q2_K];
/// 1, 2, 3, 5, 8 and 17 super-blocks: last chunks of 8 groups (padded) and of 16.
const SHAPES: [(usize, usize); 6] = [(1, 256), (7, 512), (33, 768), (3, 1280), (24, 2048), (5, 4352)];


/// A row of ggml blocks decoded by ggml's definitions, per group of 32 values: integer codes
/// (Q4_K `0..16`, Q5_K `0..32`, Q6_K `-32..32`, Q3_K `-4..4`, Q2_K `0..4`), the two integer
/// scales of its halves (Q4_K, Q5_K: one scale twice), the integer mins of its halves (Q4_K,
/// Q5_K: one min twice; Q2_K), and the super-block's f16 `d` and `dmin`.
struct Decoded {
    q: Vec<i64>,
    sc: Vec<[i64; 2]>,
    m: Vec<[i64; 2]>,
    d: Vec<f64>,
    dmin: Vec<f64>,
}

fn f16(b: &[u8]) -> f64 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f64()
}

/// ggml's `get_scale_min_k4`.
fn scale_min_k4(j: usize, q: &[u8]) -> (i64, i64) {
    if j < 4 {
        ((q[j] & 63) as i64, (q[j + 4] & 63) as i64)
    } else {
        (((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4)) as i64, ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as i64)
    }
}

fn decode(ty: GgmlType, row: &[u8]) -> Decoded {
    let mut out = Decoded { q: vec![], sc: vec![], m: vec![], d: vec![], dmin: vec![] };
    for b in row.chunks_exact(ty.block_bytes()) {
        match ty {
            // {d, dmin, scales[12], qs[128]}: sub-block j's value l is nibble j % 2 of
            // qs[32 (j / 2) + l]; w = d sc q - dmin m.
            GgmlType::Q4_K => {
                for j in 0..8 {
                    let (sc, m) = scale_min_k4(j, &b[4..16]);
                    out.q.extend((0..32).map(|l| ((b[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F) as i64));
                    out.sc.push([sc, sc]);
                    out.m.push([m, m]);
                    out.d.push(f16(&b[0..2]));
                    out.dmin.push(f16(&b[2..4]));
                }
            }
            // {ql[128], qh[64], scales[16], d}: ggml's `dequantize_row_q6_K` loop: half n of
            // 128 values, quarter k of 32, value l: low nibble of ql[64n + l] (k = 0),
            // ql[64n + 32 + l] (k = 1), their high nibbles (k = 2, 3); bits 2k.. of
            // qh[32n + l]; scale of 16 values scales[v / 16].
            // {d, dmin, scales[12], qh[32], qs[128]}: Q4_K's nibbles and scales, plus bit j of
            // qh[l] as bit 4 of value l of sub-block j.
            GgmlType::Q5_K => {
                for j in 0..8 {
                    let (sc, m) = scale_min_k4(j, &b[4..16]);
                    out.q.extend((0..32).map(|l| {
                        let low = (b[48 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
                        (low | (((b[16 + l] >> j) & 1) << 4)) as i64
                    }));
                    out.sc.push([sc, sc]);
                    out.m.push([m, m]);
                    out.d.push(f16(&b[0..2]));
                    out.dmin.push(f16(&b[2..4]));
                }
            }
            GgmlType::Q6_K => {
                for v in 0..256 {
                    let (n, k, l) = (v / 128, (v % 128) / 32, v % 32);
                    let ql = b[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2)) & 0x0F;
                    let qh = (b[128 + 32 * n + l] >> (2 * k)) & 3;
                    out.q.push((ql | (qh << 4)) as i64 - 32);
                }
                for g in 0..8 {
                    out.sc.push([b[192 + 2 * g] as i8 as i64, b[192 + 2 * g + 1] as i8 as i64]);
                    out.m.push([0, 0]);
                    out.d.push(f16(&b[208..210]));
                    out.dmin.push(0.0);
                }
            }
            // {hmask[32], qs[64], scales[12], d}: ggml's `dequantize_row_q3_K` loop: half n
            // of 128 values, quarter k of 32, value l: bits 2k.. of qs[32n + l], minus 4
            // unless bit 4n + k of hmask[l] is set; sub-block j's 6-bit scale: low 4 bits
            // from nibble j / 8 of scales[j % 8], high 2 from bits 2 (j / 4) of
            // scales[8 + j % 4], minus 32.
            GgmlType::Q3_K => {
                for v in 0..256 {
                    let (n, k, l) = (v / 128, (v % 128) / 32, v % 32);
                    let q = (b[32 + 32 * n + l] >> (2 * k)) & 3;
                    let set = (b[l] >> (4 * n + k)) & 1 == 1;
                    out.q.push(q as i64 - if set { 0 } else { 4 });
                }
                let sc = |j: usize| {
                    let low = (b[96 + j % 8] >> (4 * (j / 8))) & 0x0F;
                    let high = (b[104 + j % 4] >> (2 * (j / 4))) & 3;
                    (low | (high << 4)) as i64 - 32
                };
                for g in 0..8 {
                    out.sc.push([sc(2 * g), sc(2 * g + 1)]);
                    out.m.push([0, 0]);
                    out.d.push(f16(&b[108..110]));
                    out.dmin.push(0.0);
                }
            }
            // {scales[16], qs[64], d, dmin}: ggml's `dequantize_row_q2_K` loop: half n of 128
            // values, quarter k of 32, value l: bits 2k.. of qs[32n + l]; sub-block j's scale
            // the low nibble of scales[j], its min the high nibble; w = d sc q - dmin m.
            GgmlType::Q2_K => {
                for v in 0..256 {
                    let (n, k, l) = (v / 128, (v % 128) / 32, v % 32);
                    out.q.push(((b[16 + 32 * n + l] >> (2 * k)) & 3) as i64);
                }
                for g in 0..8 {
                    let (a, c) = (b[2 * g], b[2 * g + 1]);
                    out.sc.push([(a & 0x0F) as i64, (c & 0x0F) as i64]);
                    out.m.push([(a >> 4) as i64, (c >> 4) as i64]);
                    out.d.push(f16(&b[80..82]));
                    out.dmin.push(f16(&b[82..84]));
                }
            }
            _ => unreachable!(),
        }
    }
    out
}

/// `fma(a, b, c)` rounded once to f32, from float64: `a b` is exact in f64; the sum `s` and
/// its error `e` (TwoSum) are exact, and rounding `s` to f32 is right unless `s` is exactly
/// halfway between two f32 values and `e` breaks the tie.
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
        // A tie in f64 that the exact value does not have: round toward it.
        return if (e > 0.0) == (other as f64 > r as f64) { other } else { r };
    }
    r
}

/// One output by the definition (module docs of `kernels::int8`), in float64 with f32
/// rounding at each step the definition rounds.
fn definition(ty: GgmlType, w: &Decoded, act: &QuantizedRows, t: usize, cols: usize) -> f32 {
    let groups = cols / 32;
    let (qs, ls) = (act.q_stride(), act.lane_stride());
    let xq = |i: usize| act.q[t * qs + code_offset(cols, i)] as i64;
    let mut acc = [0f32; 16];
    for g in 0..groups.div_ceil(16) * 16 {
        let l = g % 16;
        let lane = t * ls + g;
        if g >= groups {
            // Padding lanes: zero scale times zero sum (twice for Q2_K's minimums).
            acc[l] = fma32(0.0 * act.d[lane], 0.0, acc[l]);
            if ty == GgmlType::Q2_K {
                acc[l] = fma32(0.0 * act.d[lane], 0.0, acc[l]);
            }
            continue;
        }
        let half = |h: usize| (16 * h..16 * h + 16).map(|i| w.q[32 * g + i] * xq(32 * g + i)).sum::<i64>();
        let (isum, dw) = match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => (half(0) + half(1), w.d[g] * w.sc[g][0] as f64),
            _ => (w.sc[g][0] * half(0) + w.sc[g][1] * half(1), w.d[g]),
        };
        assert!(isum.abs() < 1 << 24 && (dw as f32) as f64 == dw, "exact by the bounds in the docs");
        let dd = (dw * act.d[lane] as f64) as f32;
        acc[l] = fma32(dd, isum as f32, acc[l]);
        if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
            let mw = -(w.dmin[g] * w.m[g][0] as f64);
            assert_eq!((mw as f32) as f64, mw);
            acc[l] = fma32(mw as f32, act.s[lane], acc[l]);
        }
        if ty == GgmlType::Q2_K {
            // The minimums: integer sums of the halves' activation codes, then one step.
            let xsum = |h: usize| (16 * h..16 * h + 16).map(|i| xq(32 * g + i)).sum::<i64>();
            let msum = w.m[g][0] * xsum(0) + w.m[g][1] * xsum(1);
            assert!(msum.abs() < 1 << 24);
            let mwdx = ((0.0 - w.dmin[g]) * act.d[lane] as f64) as f32;
            acc[l] = fma32(mwdx, msum as f32, acc[l]);
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
fn kquant_int8_paths_agree_bitwise_and_equal_their_definition() {
    let mut rng = Rng(0x6B71_7561_6E74_0001);
    for ty in TYPES {
        for &(rows, cols) in &SHAPES {
            let ggml = random_ggml_matrix(&mut rng, ty, rows, cols);
            check(ty, rows, cols, &ggml, &TOKENS, &mut rng, &format!("{} {rows}x{cols}", ty.name()));
        }
    }
}

/// Every int8 type's packed row is at most its ggml row.
#[test]
fn int8_layout_is_at_most_ggml_bytes() {
    for ty in GgmlType::ALL.into_iter().filter(|&t| is_int8_packable(t)) {
        for blocks in [1, 2, 3, 8, 17] {
            let cols = blocks * ty.block_size().max(32);
            let (packed, ggml) = (layout_row_bytes(ty, Layout::Chunked, cols), ty.row_bytes(cols));
            assert!(packed <= ggml, "{} at {cols} columns: {packed} bytes packed, {ggml} in ggml", ty.name());
        }
    }
    // The K-quant types and Q5_0, Q5_1 are among them.
    assert!(TYPES.iter().all(|&t| is_int8_packable(t) && has_own_int8_layout(t)));
    assert!([GgmlType::Q5_0, GgmlType::Q5_1].iter().all(|&t| is_int8_packable(t) && has_own_int8_layout(t)));
}

#[test]
fn kquant_int8_on_gemma3_tensors() {
    let file = GgufFile::open(cached_model("gemma-3-270m-q4_k_m.gguf", "gemma3-270m")).unwrap();
    let mut rng = Rng(11);
    let mut seen = std::collections::BTreeSet::new();
    for info in file.tensors().iter().filter(|t| t.dims.len() == 2 && is_kquant_int8(t.ggml_type)) {
        let ty = info.ggml_type;
        let cols = info.dims[0] as usize;
        let all_rows = info.dims[1] as usize;
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
        // The kernels on one matrix per (type, shape), at most 48 of its rows.
        if seen.insert((ty.name(), info.dims.clone())) {
            let rows = all_rows.min(48);
            check(ty, rows, cols, &bytes[..rows * rb], &[1, 5, 16], &mut rng, &info.name);
        }
    }
    let types: std::collections::BTreeSet<_> = seen.iter().map(|s| s.0).collect();
    assert_eq!(types.into_iter().collect::<Vec<_>>(), ["Q4_K", "Q6_K"]);
}

/// A model loaded at int8 runs every quantized matrix of the synthetic llama.cpp files on the
/// int8 kernels and holds it in at most its ggml bytes.
#[test]
fn int8_models_hold_their_matrices_in_at_most_ggml_bytes() {
    use reprolm::kernels::Precision;
    use reprolm::model::{TransformerWeights, ModelConfig};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/synthetic");
    let mut types = std::collections::BTreeSet::new();
    for mix in ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q3_K_M", "Q2_K", "Q5_0", "Q5_1"] {
        let file = GgufFile::open(dir.join(format!("tiny.{mix}.gguf"))).unwrap();
        let config = ModelConfig::from_gguf(&file).unwrap();
        let weights = TransformerWeights::from_gguf_with(&file, &config, Precision::Int8).unwrap();
        let layers = weights.layers.iter().flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        for m in layers.chain([&weights.token_embd, &weights.output]) {
            let (held, ggml) = (weights.mat(m).data.len(), m.ty.row_bytes(m.cols) * m.rows);
            assert!(weights.is_int8(m), "{mix} {}", m.name);
            assert!(held <= ggml, "{mix} {}: {held} bytes held, {ggml} in the file", m.name);
            types.insert(m.ty.name());
        }
    }
    for t in ["Q2_K", "Q3_K", "Q4_0", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"] {
        assert!(types.contains(t), "{t} in the files");
    }
}

/// The largest codes (every code byte 0xFF) against activations at the largest codes of
/// either sign (every value -1 or 1, so every code -127 or 127): the integer sums stay exact
/// on every path, the file's blocks read in place included, where the one-token kernels carry
/// partial sums in 16 bits.
#[test]
fn kquant_int8_largest_codes_stay_exact() {
    use crate::common::int8::{int8_isas, moderate_f16_fields, run};
    use reprolm::kernels::packed::reads_blocks_in_place;
    use reprolm::kernels::{Isa, MatRef};
    let (rows, cols) = (3, 4352);
    for ty in TYPES {
        let mut ggml = vec![0xFFu8; rows * ty.row_bytes(cols)];
        moderate_f16_fields(ty, &mut ggml);
        let mut packed = vec![0u8; ggml.len()];
        pack_rows_in(ty, Layout::Chunked, cols, &ggml, &mut packed);
        let chunked = MatRef { ty, rows, cols, layout: Layout::Chunked, data: &packed };
        for n_tokens in [1, 2, 5] {
            // Token t: every value -1 (t even) or 1 (t odd).
            let x: Vec<f32> = (0..n_tokens * cols).map(|i| if (i / cols) % 2 == 0 { -1.0 } else { 1.0 }).collect();
            let mut act = QuantizedRows::default();
            act.quantize(Isa::Scalar, &x, cols, n_tokens);
            assert_eq!(act.q[..act.q_stride()].iter().filter(|&&q| q == -127).count(), cols, "the activation codes are the largest");
            let scalar = run(Isa::Scalar, &chunked, &act);
            for isa in int8_isas() {
                assert!(run(isa, &chunked, &act) == scalar, "{} T={n_tokens} on {}", ty.name(), isa.name());
                if reads_blocks_in_place(ty) {
                    let blocks = MatRef { layout: Layout::Blocks, data: &ggml, ..chunked };
                    assert!(run(isa, &blocks, &act) == scalar, "{} blocks T={n_tokens} on {}", ty.name(), isa.name());
                }
            }
        }
    }
}
