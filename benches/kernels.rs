//! Matrix kernels on SmolLM2's shapes (Gemma 3 270M's for the 256-value K-quant blocks),
//! every weight type, one thread: decode (1 token; throughput in the ggml file's weight
//! bytes/s), verify (9 tokens: a speculative draft of 8 checked in one pass) and prefill (64
//! tokens), both in multiply-adds/s. The types with int8 kernels also run those, on
//! activations quantized once outside the timing (groups named `<type>/<phase>/<isa>/int8`).
//!
//! `cargo bench --bench kernels` (add `-- Q4_1` to filter).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use reprolm::kernels::aligned::AlignedBuf;
use reprolm::kernels::packed::{is_int8_packable, is_packed, layout_row_bytes, pack_rows, pack_rows_in, Layout};
use reprolm::kernels::quantize_act::QuantizedRows;
use reprolm::kernels::{group_sums, group_sums_len, matmul_rows, matmul_rows_int8, Activations, Disjoint, Isa, MatRef};
use reprolm::tensor::GgmlType;

/// (cols, rows): attn_q/attn_output, attn_k/attn_v, ffn_gate/ffn_up, ffn_down, LM head.
const SHAPES: [(usize, usize); 5] = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)];
/// (cols, rows) for K-quants (rows of whole 256-value blocks): Gemma 3 270M's attn_output
/// and ffn_down, the matrices its Q4_K_M file stores in Q4_K and Q6_K.
const K_SHAPES: [(usize, usize); 2] = [(1024, 640), (2048, 640)];

/// Bytes whose f16 scales are small and finite: every 2nd byte below 0x3C.
fn ggml_matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * ty.row_bytes(cols);
    (0..n).map(|i| if i % 2 == 1 { (i % 0x3C) as u8 } else { (i * 7 % 251) as u8 }).collect()
}

fn matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let ggml = ggml_matrix(ty, rows, cols);
    if is_packed(ty) {
        pack_rows(ty, cols, &ggml)
    } else {
        ggml
    }
}

fn bench(c: &mut Criterion) {
    let isa = Isa::best();
    for ty in GgmlType::ALL {
        for (phase, n_tokens) in [("decode", 1usize), ("verify", 9), ("prefill", 64)] {
            let mut group = c.benchmark_group(format!("{}/{phase}/{}", ty.name(), isa.name()));
            let shapes: &[(usize, usize)] = if ty.block_size() == 256 { &K_SHAPES } else { &SHAPES };
            for &(cols, rows) in shapes {
                if phase == "prefill" && rows == 49152 {
                    continue; // the LM head runs on one row in generation
                }
                let data = matrix(ty, rows, cols);
                let m = MatRef { ty, rows, cols, layout: Layout::Grouped, data: &data };
                // On a cache line, as the model's activation buffers are.
                let mut x = AlignedBuf::default();
                x.resize(n_tokens * cols, 0.0);
                for (i, v) in x.iter_mut().enumerate() {
                    *v = ((i * 37 % 101) as f32 - 50.0) / 64.0;
                }
                let gl = group_sums_len(cols);
                let mut gs = vec![0f32; n_tokens * gl];
                for t in 0..n_tokens {
                    group_sums(&x[t * cols..(t + 1) * cols], &mut gs[t * gl..(t + 1) * gl]);
                }
                let mut out = vec![0f32; n_tokens * rows];
                group.throughput(if n_tokens == 1 {
                    Throughput::Bytes((rows * ty.row_bytes(cols)) as u64)
                } else {
                    Throughput::Elements((rows * cols * n_tokens) as u64)
                });
                group.bench_function(BenchmarkId::from_parameter(format!("{cols}x{rows}")), |b| {
                    b.iter(|| {
                        let act = Activations { x: &x, gs: &gs, n_tokens, cols };
                        // SAFETY: one thread: nothing else touches `out`.
                        unsafe { matmul_rows(isa, &m, &act, 0..rows, Disjoint::new(&mut out), rows) };
                    })
                });
            }
            group.finish();
        }
    }
    let isa = [Isa::Avx512, Isa::Avx2].into_iter().find(|i| i.int8_available()).unwrap_or(Isa::Scalar);
    for ty in GgmlType::ALL.into_iter().filter(|&t| is_int8_packable(t)) {
        for (phase, n_tokens) in [("decode", 1usize), ("prefill", 64)] {
            let mut group = c.benchmark_group(format!("{}/{phase}/{}/int8", ty.name(), isa.name()));
            let shapes: &[(usize, usize)] = if ty.block_size() == 256 { &K_SHAPES } else { &SHAPES };
            for &(cols, rows) in shapes {
                if phase == "prefill" && rows == 49152 {
                    continue;
                }
                let ggml = ggml_matrix(ty, rows, cols);
                let mut data = vec![0u8; rows * layout_row_bytes(ty, Layout::Chunked, cols)];
                pack_rows_in(ty, Layout::Chunked, cols, &ggml, &mut data);
                let m = MatRef { ty, rows, cols, layout: Layout::Chunked, data: &data };
                let x: Vec<f32> = (0..n_tokens * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
                let mut act = QuantizedRows::default();
                act.quantize(isa, &x, cols, n_tokens);
                let mut out = vec![0f32; n_tokens * rows];
                group.throughput(if n_tokens == 1 {
                    Throughput::Bytes((rows * ty.row_bytes(cols)) as u64)
                } else {
                    Throughput::Elements((rows * cols * n_tokens) as u64)
                });
                group.bench_function(BenchmarkId::from_parameter(format!("{cols}x{rows}")), |b| {
                    // SAFETY: one thread: nothing else touches `out`.
                    b.iter(|| unsafe { matmul_rows_int8(isa, &m, &act, 0..rows, Disjoint::new(&mut out), rows) })
                });
            }
            group.finish();
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(300)).measurement_time(std::time::Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
