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

use common::{activations, bits_hash, ggml_matrix, median_seconds, parse_shape, TYPES};
use reprolm::kernels::packed::{layout_row_bytes, pack_rows_in, reads_blocks_in_place, Layout};
use reprolm::kernels::{matmul_rows_int8, Disjoint, Isa, MatRef, QuantizedRows};

/// (rows, cols): a 1 B Llama's feed-forward down matrix.
const SHAPE: (usize, usize) = (2048, 8192);

fn main() {
    let mut args = std::env::args().skip(1);
    let n_tokens: usize = args.next().map_or(64, |s| s.parse().expect("TOKENS: a number"));
    let only = args.next().filter(|t| t != "all");
    let isa = match args.next() {
        Some(name) => Isa::parse(&name).expect("ISA: avx512, avx2 or scalar"),
        None => [Isa::Avx512, Isa::Avx2].into_iter().find(|i| i.int8_available()).unwrap_or(Isa::Scalar),
    };
    assert!(isa.int8_available(), "this CPU has no int8 kernels for {}", isa.name());
    let (rows, cols) = args.next().map_or(SHAPE, |s| parse_shape(&s));
    println!("{n_tokens} tokens, 1 thread, {} kernels; median of 15 runs", isa.name());
    for (ty, scales) in TYPES {
        if only.as_deref().is_some_and(|o| o != ty.name()) {
            continue;
        }
        let ggml = ggml_matrix(ty, scales, rows, cols);
        let mut packed = vec![0u8; rows * layout_row_bytes(ty, Layout::Chunked, cols)];
        pack_rows_in(ty, Layout::Chunked, cols, &ggml, &mut packed);
        let x = activations(n_tokens, cols);
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
            let hash = bits_hash(&out);
            let gmacs = (rows * cols * n_tokens) as f64 / s / 1e9;
            println!("{:<17} {rows}x{cols} x{n_tokens}: {gmacs:6.1} G multiply-adds/s  hash {hash:016x}", format!("{}{label}", ty.name()));
        }
    }
}
