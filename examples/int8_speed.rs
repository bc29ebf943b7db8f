//! Times the Q4_1 kernels on SmolLM2's feed-forward shapes and its Q8_0 LM head, one thread: the float32 path
//! (`matmul_rows`, group sums included) against the int8 path (`matmul_rows_int8`, with and
//! without quantizing the activations). Not a test: prints medians of repeated runs.
//!
//! `cargo run --release --example int8_speed [-- TOKENS]` (default 64 tokens).

mod common;

use common::median_seconds;
use reprolm::kernels::packed::{pack_rows, pack_rows_in, Layout};
use reprolm::kernels::{group_sums, group_sums_len, matmul_rows, matmul_rows_int8, Activations, Isa, MatRef, Disjoint, QuantizedRows};
use reprolm::tensor::GgmlType;

fn main() {
    let n_tokens: usize = std::env::args().nth(1).map_or(64, |s| s.parse().expect("TOKENS"));
    let isa = [Isa::Avx512, Isa::Avx2].into_iter().find(|i| i.int8_available()).unwrap_or(Isa::Scalar);
    println!("{n_tokens} tokens, 1 thread, {} kernels; median of 41 runs", isa.name());
    let mut cases = vec![(GgmlType::Q4_1, 576usize, 1536usize), (GgmlType::Q4_1, 1536, 576)];
    cases.push((GgmlType::Q8_0, 576, 1536));
    cases.push((GgmlType::Q8_0, 576, 49152)); // the LM head
    for (ty, cols, rows) in cases {
        let n = rows * ty.row_bytes(cols);
        // Small finite f16 scales and offsets: every 2nd byte below 0x3C.
        let ggml: Vec<u8> = (0..n).map(|i| if i % 2 == 1 { (i % 0x3C) as u8 } else { (i * 7 % 251) as u8 }).collect();
        let grouped = pack_rows(ty, cols, &ggml);
        let mut chunked = vec![0u8; grouped.len()];
        pack_rows_in(ty, Layout::Chunked, cols, &ggml, &mut chunked);
        let (wf, wi) = (MatRef { ty, rows, cols, layout: Layout::Grouped, data: &grouped }, MatRef { ty, rows, cols, layout: Layout::Chunked, data: &chunked });
        let x: Vec<f32> = (0..n_tokens * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
        let gl = group_sums_len(cols);
        let mut gs = vec![0f32; n_tokens * gl];
        let mut q = QuantizedRows::default();
        let mut out = vec![0f32; n_tokens * rows];
        let o = Disjoint::new(&mut out);
        let f32_time = median_seconds(41, || {
            for t in 0..n_tokens {
                group_sums(&x[t * cols..(t + 1) * cols], &mut gs[t * gl..(t + 1) * gl]);
            }
            let act = Activations { x: &x, gs: &gs, n_tokens, cols };
            // SAFETY: one thread: nothing else touches `out`.
            unsafe { matmul_rows(isa, &wf, &act, 0..rows, o, rows) };
        });
        let quant_time = median_seconds(41, || q.quantize(isa, &x, cols, n_tokens));
        // SAFETY: one thread: nothing else touches `out`.
        let int8_time = median_seconds(41, || unsafe { matmul_rows_int8(isa, &wi, &q, 0..rows, o, rows) });
        let macs = (rows * cols * n_tokens) as f64;
        println!(
            "  {} {cols}x{rows} (cols x rows): float32 {:8.1} us ({:5.1} GMAC/s) | int8 kernel {:8.1} us ({:5.1} GMAC/s) + quantize {:6.1} us | speed-up {:.2}x ({:.2}x with quantize)",
            ty.name(),
            f32_time * 1e6,
            macs / f32_time / 1e9,
            int8_time * 1e6,
            macs / int8_time / 1e9,
            quant_time * 1e6,
            f32_time / int8_time,
            f32_time / (int8_time + quant_time)
        );
    }
}
