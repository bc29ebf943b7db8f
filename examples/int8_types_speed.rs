//! Times the int8 kernel of each weight type on a 1 B model's feed-forward shape (2048 rows x
//! 8192 columns), one thread, and prints multiply-adds per second with a hash of the outputs
//! (equal hashes: equal bits, for comparing builds; a type read in place is timed on both
//! layouts, with equal hashes). Not a test: prints medians of 15 runs.
//!
//! `cargo run --release --example int8_types_speed [-- TOKENS [TYPE [ISA [ROWSxCOLS]]]]`
//! (default 64 tokens, every type, the best int8 ISA, 2048x8192; TYPE filters by name, e.g.
//! `Q6_K`, or `all`; ISA is `avx512`, `avx2` or `scalar`; `8192x2048` is the up and gate
//! shape).

mod common;

use common::median_seconds;
use reprolm::kernels::packed::{layout_row_bytes, pack_rows_in, reads_blocks_in_place, Layout};
use reprolm::kernels::{matmul_rows_int8, Disjoint, Isa, MatRef, QuantizedRows};
use reprolm::tensor::GgmlType;

/// (rows, cols): a 1 B Llama's feed-forward down matrix.
const SHAPE: (usize, usize) = (2048, 8192);

/// Each type with the byte offsets of the f16 scales in its ggml block, which get small
/// finite values (the other bytes are pseudo-random codes).
const TYPES: [(GgmlType, &[usize]); 7] = [
    (GgmlType::Q4_0, &[0]),
    (GgmlType::Q4_1, &[0, 2]),
    (GgmlType::Q5_0, &[0]),
    (GgmlType::Q8_0, &[0]),
    (GgmlType::Q4_K, &[0, 2]),
    (GgmlType::Q5_K, &[0, 2]),
    (GgmlType::Q6_K, &[208]),
];

fn main() {
    let mut args = std::env::args().skip(1);
    let n_tokens: usize = args.next().map_or(64, |s| s.parse().expect("TOKENS: a number"));
    let only = args.next().filter(|t| t != "all");
    let isa = match args.next() {
        Some(name) => Isa::parse(&name).expect("ISA: avx512, avx2 or scalar"),
        None => [Isa::Avx512, Isa::Avx2].into_iter().find(|i| i.int8_available()).unwrap_or(Isa::Scalar),
    };
    assert!(isa.int8_available(), "this CPU has no int8 kernels for {}", isa.name());
    let (rows, cols) = args.next().map_or(SHAPE, |s| {
        let (r, c) = s.split_once('x').expect("ROWSxCOLS, e.g. 8192x2048");
        (r.parse().expect("ROWS: a number"), c.parse().expect("COLS: a number"))
    });
    println!("{n_tokens} tokens, 1 thread, {} kernels; median of 15 runs", isa.name());
    for (ty, scales) in TYPES {
        if only.as_deref().is_some_and(|o| o != ty.name()) {
            continue;
        }
        let n = rows * ty.row_bytes(cols);
        let block = ty.block_bytes();
        let mut ggml: Vec<u8> = (0..n).map(|i| ((i as u64).wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for b in 0..n / block {
            for &o in scales {
                ggml[b * block + o] = (b % 200) as u8;
                ggml[b * block + o + 1] = 0x20;
            }
        }
        let mut packed = vec![0u8; rows * layout_row_bytes(ty, Layout::Chunked, cols)];
        pack_rows_in(ty, Layout::Chunked, cols, &ggml, &mut packed);
        let x: Vec<f32> = (0..n_tokens * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
        let mut act = QuantizedRows::default();
        act.quantize(isa, &x, cols, n_tokens);
        let mut layouts = vec![(Layout::Chunked, "", &packed[..])];
        if reads_blocks_in_place(ty) {
            layouts.push((Layout::Blocks, " (in place)", &ggml[..]));
        }
        for (layout, label, data) in layouts {
            let w = MatRef { ty, rows, cols, layout, data };
            // [token][row]
            let mut out = vec![0f32; n_tokens * rows];
            let s = median_seconds(15, || {
                // SAFETY: no other thread touches `out`.
                unsafe { matmul_rows_int8(isa, &w, &act, 0..rows, Disjoint::new(&mut out), rows) }
            });
            let hash = out.iter().fold(0u64, |h, v| h.rotate_left(5) ^ v.to_bits() as u64);
            let gmacs = (rows * cols * n_tokens) as f64 / s / 1e9;
            println!("{:<17} {rows}x{cols} x{n_tokens}: {gmacs:6.1} G multiply-adds/s  hash {hash:016x}", format!("{}{label}", ty.name()));
        }
    }
}
