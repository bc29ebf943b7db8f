//! What the int8 kernel tests of the types that keep ggml's bytes (`kernels_q5_int8`,
//! `kernels_kquant_int8`) share: random ggml rows and activations, the kernel run in two row
//! ranges, and the check of every ISA against the scalar twin and of the scalar twin against
//! a test's own float64 evaluation of the definition.

use super::Rng;

use reprolm::kernels::packed::{dequantize_packed_row_in, layout_row_bytes, pack_rows_in, reads_blocks_in_place, Layout};
use reprolm::kernels::quantize_act::QuantizedRows;
use reprolm::kernels::{matmul_rows_int8, Disjoint, Isa, MatRef};
use reprolm::tensor::{dequantize_row, GgmlType};

/// Token counts of the kernel tests: one to a few tiles, narrow last tiles, and a count that
/// crosses the kernels' token blocks of 64.
pub const TOKENS: [usize; 9] = [1, 2, 3, 4, 5, 7, 17, 64, 70];

/// The ISAs whose int8 kernels this CPU runs (the scalar twin always).
pub fn int8_isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.int8_available()).collect()
}

/// Random ggml rows of `ty` (`[rows][ty.row_bytes(cols)]`): random codes and sub-scales, and
/// f16 scales of either sign with exponent fields 0, 4, 8 or 12 (finite; subnormals up to
/// 2^-2 in magnitude).
pub fn random_ggml_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..rows * ty.row_bytes(cols)).map(|_| rng.byte()).collect();
    moderate_f16_fields(ty, &mut bytes);
    bytes
}

/// Clears bits of the high byte of every f16 field of `ty`'s blocks in `bytes`, so that each
/// is finite and below 2^-2 in magnitude (exponent at most 12), whatever the other bytes are.
pub fn moderate_f16_fields(ty: GgmlType, bytes: &mut [u8]) {
    for b in bytes.chunks_exact_mut(ty.block_bytes()) {
        for &at in ty.spec().f16_fields {
            b[at + 1] &= 0b1011_0011;
        }
    }
}

/// Activations `[n_tokens][cols]` whose groups of 32 have very different magnitudes, one of
/// them all zero.
pub fn random_acts(rng: &mut Rng, n_tokens: usize, cols: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.unit()).collect();
    for (i, g) in x.chunks_exact_mut(32).enumerate() {
        let scale = [1.0, 30.0, 1e-3, 0.0, 4.0, 0.25, 7.0][i % 7];
        g.iter_mut().for_each(|v| *v *= scale);
    }
    x
}

/// The int8 product of `m` with `act` on `isa`, as bits (`[n_tokens][rows]`), computed in two
/// uneven row ranges as two threads would split them.
pub fn run(isa: Isa, m: &MatRef, act: &QuantizedRows) -> Vec<u32> {
    let mut out = vec![0f32; act.n_tokens * m.rows];
    let cut = m.rows / 3;
    for rows in [0..cut, cut..m.rows] {
        // SAFETY: one call at a time, on this thread: no other thread touches `out`.
        unsafe { matmul_rows_int8(isa, m, act, rows, Disjoint::new(&mut out), m.rows) };
    }
    out.iter().map(|v| v.to_bits()).collect()
}

/// Packs `ggml` (`rows` rows of `ty`) for int8, in two row ranges as two threads would, and
/// checks: the layout keeps ggml's bytes, the packed rows dequantize to ggml's values, and for
/// each token count every ISA equals the scalar twin and the scalar twin equals
/// `definition(row decoded by decode, activations, token)` bit for bit.
#[allow(clippy::too_many_arguments)]
pub fn check_against_definition<D>(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    ggml: &[u8],
    tokens: &[usize],
    rng: &mut Rng,
    what: &str,
    decode: impl Fn(&[u8]) -> D,
    definition: impl Fn(&D, &QuantizedRows, usize) -> f32,
) {
    let rb = ty.row_bytes(cols);
    let pb = layout_row_bytes(ty, Layout::Chunked, cols);
    assert_eq!(pb, rb, "{what}: the int8 layout takes ggml's bytes");
    let mut packed = vec![0u8; rows * pb];
    let cut = rows / 2;
    let (a, b) = packed.split_at_mut(cut * pb);
    pack_rows_in(ty, Layout::Chunked, cols, &ggml[..cut * rb], a);
    pack_rows_in(ty, Layout::Chunked, cols, &ggml[cut * rb..], b);
    let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
    for r in 0..rows {
        dequantize_row(ty, &ggml[r * rb..(r + 1) * rb], &mut a);
        dequantize_packed_row_in(ty, Layout::Chunked, &packed[r * pb..(r + 1) * pb], &mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: row {r} dequantized");
    }
    let m = MatRef { ty, rows, cols, layout: Layout::Chunked, data: &packed };
    let decoded: Vec<D> = (0..rows).map(|r| decode(&ggml[r * rb..(r + 1) * rb])).collect();
    for &n_tokens in tokens {
        let x = random_acts(rng, n_tokens, cols);
        let mut act = QuantizedRows::default();
        act.quantize(Isa::Scalar, &x, cols, n_tokens);
        let scalar = run(Isa::Scalar, &m, &act);
        for isa in int8_isas() {
            assert!(run(isa, &m, &act) == scalar, "{what} T={n_tokens} on {}", isa.name());
        }
        // Read in place from ggml's blocks: the same bits on every path.
        if reads_blocks_in_place(ty) {
            let blocks = MatRef { layout: Layout::Blocks, data: ggml, ..m };
            for isa in int8_isas() {
                assert!(run(isa, &blocks, &act) == scalar, "{what} blocks T={n_tokens} on {}", isa.name());
            }
        }
        for t in 0..n_tokens {
            for (r, w) in decoded.iter().enumerate() {
                let want = definition(w, &act, t);
                let got = f32::from_bits(scalar[t * rows + r]);
                assert_eq!(got.to_bits(), want.to_bits(), "{what} T={n_tokens} token {t} row {r}: {got} vs {want}");
            }
        }
    }
}
