//! Matrix kernels: weight rows (any supported ggml type) against f32 activations.
//!
//! Every output element is one weight row dotted with one activation row, by the op sequence
//! documented in [`groups`], whatever the ISA, the number of tokens in the call or the rows
//! a thread was given. That is what makes logits independent of thread count, prefill
//! chunking and instruction set.

pub mod aligned;
pub mod elementwise;
mod groups;
pub mod int8;
pub mod kquant;
pub mod kquant_low;
mod lanes;
pub mod packed;
pub mod q5;
pub mod quantize_act;

use std::ops::Range;

use aligned::AlignedBuf;

use groups::{Bf16Group, F16Group, F32Group, Groups, I8Codes, NibbleCodes, Q4_0Group, Q4_1Group, Q8_0Group, WeightGroup};
pub use int8::matmul_rows_int8;
pub use lanes::{Lanes16, Scalar16};
use packed::Layout;
pub use quantize_act::QuantizedRows;
pub use crate::threads::Disjoint;

use crate::error::{Error, Result};
use crate::tensor::{Codes, GgmlType, GroupFormat, KernelGroup};

/// Values per weight group; matrix widths must be multiples of it.
pub const GROUP: usize = 32;
/// Tokens whose activations stay cache-resident while a block of weight rows streams past.
pub(crate) const TOKEN_BLOCK: usize = 64;

/// The instruction set the kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    pub fn parse(name: &str) -> Result<Isa> {
        match name.to_ascii_lowercase().as_str() {
            "scalar" => Ok(Isa::Scalar),
            "avx2" => Ok(Isa::Avx2),
            "avx512" => Ok(Isa::Avx512),
            _ => Err(Error::invalid_argument("isa", format!("'{name}' is not one of scalar, avx2, avx512"))),
        }
    }

    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Whether this CPU can run the path's int8 kernels (AVX-512 needs VNNI for them).
    pub fn int8_available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => self.available() && is_x86_feature_detected!("avx512vnni"),
            _ => self.available(),
        }
    }

    /// The fastest available path.
    pub fn best() -> Isa {
        [Isa::Avx512, Isa::Avx2].into_iter().find(|i| i.available()).unwrap_or(Isa::Scalar)
    }

    /// `requested` if given (an error if this CPU lacks it), else `REPROLM_ISA`, else the best.
    pub fn select(requested: Option<&str>) -> Result<Isa> {
        let env = std::env::var("REPROLM_ISA").ok().filter(|s| !s.is_empty());
        match requested.or(env.as_deref()) {
            None => Ok(Isa::best()),
            Some(name) => {
                let isa = Isa::parse(name)?;
                if isa.available() {
                    Ok(isa)
                } else {
                    Err(Error::Unsupported(format!("this CPU cannot run the {} kernels", isa.name())))
                }
            }
        }
    }
}

/// The arithmetic of matmuls on quantized weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// f32 activations against the exactly dequantized weights (the reference numerics).
    #[default]
    Float32,
    /// Activations quantized to int8 per group of 32, integer dot products per group
    /// ([`int8`], [`quantize_act`]); float matrices and attention stay f32.
    Int8,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Float32 => "float32",
            Precision::Int8 => "int8",
        }
    }

    pub fn parse(name: &str) -> Result<Precision> {
        match name.to_ascii_lowercase().as_str() {
            "float32" => Ok(Precision::Float32),
            "int8" => Ok(Precision::Int8),
            _ => Err(Error::invalid_argument("precision", format!("'{name}' is not one of float32, int8"))),
        }
    }
}

/// A borrowed weight matrix: `rows` rows of `cols` values of type `ty`, quantized types in
/// one of the layouts of [`packed`], float types as ggml stores them.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// How a quantized row's bytes are ordered: `Grouped` for the float32 kernels (and for
    /// float types, which it does not concern), `Chunked` or `Blocks` for the int8 kernels.
    pub layout: Layout,
    /// [rows][packed::layout_row_bytes(ty, layout, cols)]
    pub data: &'a [u8],
}

impl MatRef<'_> {
    /// Bytes of one row in the float32 kernels' layout ([`packed::packed_row_bytes`]; the
    /// int8 kernels' rows are [`packed::layout_row_bytes`] of the matrix's layout).
    pub fn row_bytes(&self) -> usize {
        packed::packed_row_bytes(self.ty, self.cols)
    }
}

/// Activation rows prepared for the kernels.
pub struct Activations<'a> {
    /// [n_tokens][cols]
    pub x: &'a [f32],
    /// [n_tokens][group_sums_len(cols)]: see [`group_sums`] (only read for Q4_1).
    pub gs: &'a [f32],
    pub n_tokens: usize,
    pub cols: usize,
}

/// Length of one row's group sums: one per group, zero-padded to a multiple of 16.
pub fn group_sums_len(cols: usize) -> usize {
    (cols / GROUP).div_ceil(16) * 16
}

/// The sum of each group of 32 values of `x`, in the canonical order
/// `reduce16(x[32g + l] + x[32g + 16 + l])`; zeros after the last group.
pub fn group_sums(x: &[f32], gs: &mut [f32]) {
    debug_assert_eq!(gs.len(), group_sums_len(x.len()));
    gs.fill(0.0);
    for (g, s) in x.chunks_exact(GROUP).zip(gs.iter_mut()) {
        let mut lanes: [f32; 16] = std::array::from_fn(|l| g[l] + g[l + 16]);
        for h in [8, 4, 2, 1] {
            for l in 0..h {
                lanes[l] += lanes[l + h];
            }
        }
        *s = lanes[0];
    }
}


/// Checks that `out` holds every `out[t * token_stride + r]` for `t < n_tokens`, `r` in `rows`.
pub(crate) fn check_out(out: &Disjoint<f32>, token_stride: usize, n_tokens: usize, rows: &Range<usize>) {
    assert!(rows.end <= token_stride || n_tokens <= 1, "rows {rows:?} overlap the next token's outputs");
    if n_tokens > 0 && !rows.is_empty() {
        assert!((n_tokens - 1) * token_stride + rows.end <= out.len(), "the output buffer is too small");
    }
}

/// One matmul over a thread's rows: rows `rows` of `w` against every token of `act`, the
/// output of row `r` and token `t` at `out[t * token_stride + r]`. The checked entry points
/// ([`matmul_rows`], [`matmul_rows_int8`]) build it once and hand it down to the tiles.
pub(crate) struct RowsCall<'a, A> {
    w: &'a MatRef<'a>,
    act: &'a A,
    rows: Range<usize>,
    out: Disjoint<'a, f32>,
    token_stride: usize,
}

/// For every row `r` in `rows` and token `t`: `out[t * token_stride + r] = dot(W[r], x[t])`.
///
/// # Safety
/// No other thread may touch those elements of `out` during the call.
pub unsafe fn matmul_rows(isa: Isa, w: &MatRef, act: &Activations, rows: Range<usize>, out: Disjoint<f32>, token_stride: usize) {
    assert_eq!(w.cols, act.cols);
    check_out(&out, token_stride, act.n_tokens, &rows);
    assert!(w.cols.is_multiple_of(GROUP) && rows.end <= w.rows);
    assert!(w.layout == Layout::Grouped && w.data.len() == w.rows * w.row_bytes());
    assert!(act.x.len() >= act.n_tokens * act.cols);
    assert!(w.ty.kernel() != KernelGroup::Q4_1 || act.gs.len() >= act.n_tokens * group_sums_len(act.cols));
    assert!(isa.available(), "the {} kernels cannot run on this CPU", isa.name());
    crate::count::mults(rows.len() * act.n_tokens * w.cols);
    let call = &RowsCall { w, act, rows, out, token_stride };
    DECODED_SCRATCH.with_borrow_mut(|scratch| {
        // SAFETY: the shapes, the buffer lengths and the CPU's features are checked above; the
        // outputs are this call's alone (this function's precondition).
        unsafe {
            match isa {
                Isa::Scalar => by_type::<Scalar16>(call, scratch),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => x86::avx2(call, scratch),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => x86::avx512(call, scratch),
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!("no SIMD path on this architecture"),
            }
        }
    })
}

/// A thread's buffers for the tiles over decoded rows ([`decoded_tiles`]), kept from one
/// multi-token matmul to the next and grown to the largest so far.
#[derive(Default)]
struct DecodedScratch {
    /// [rows][cols] f32: the decoded weights of one row group.
    rows: AlignedBuf<f32>,
    /// [tile][row][token][lo, hi][16] f32: the tiles' running sums between column blocks.
    sums: AlignedBuf<f32>,
}

thread_local! {
    static DECODED_SCRATCH: std::cell::RefCell<DecodedScratch> = std::cell::RefCell::default();
}

/// `out = sum_r weights[r] * V[r]` over the rows of `v` in index order, lane-wise fused
/// multiply-adds starting from zero (attention's weighted sum of values). `v` must be F32 or F16.
pub fn weighted_row_sum(isa: Isa, weights: &[f32], v: &MatRef, out: &mut [f32]) {
    assert!(weights.len() <= v.rows && out.len() == v.cols);
    let v = MatRef { rows: weights.len(), data: &v.data[..weights.len() * v.row_bytes()], ..*v };
    weighted_row_sums(isa, weights, weights.len(), &[v], out)
}

/// [`weighted_row_sum`] for several weight rows over the same values, whose rows come in
/// several blocks taken as one sequence: with `n = sum of the pieces' rows` and
/// `w_j = weights[j * stride..j * stride + n]`, `out[j * cols..(j + 1) * cols]` gets
/// `sum over pieces in order, rows in order, of w_j[r] * V[r]`, one accumulator per output
/// lane that is never reset between pieces. Each output has the op sequence of
/// [`weighted_row_sum`] over the concatenated rows, however the rows are split into pieces
/// (a ring buffer's wrapped window gives the bits of a contiguous one) and however many
/// weight rows share the call (the query heads of one KV head read each value row once).
pub fn weighted_row_sums(isa: Isa, weights: &[f32], stride: usize, pieces: &[MatRef], out: &mut [f32]) {
    assert!(!pieces.is_empty());
    let (ty, cols) = (pieces[0].ty, pieces[0].cols);
    assert!(matches!(ty, GgmlType::F32 | GgmlType::F16) && cols % GROUP == 0 && out.len().is_multiple_of(cols));
    let n: usize = pieces.iter().map(|v| v.rows).sum();
    for v in pieces {
        assert!(v.ty == ty && v.cols == cols && v.data.len() == v.rows * v.row_bytes());
    }
    let n_out = out.len() / cols;
    assert!(n_out == 0 || ((n <= stride || n_out == 1) && weights.len() >= (n_out - 1) * stride + n));
    assert!(isa.available(), "the {} kernels cannot run on this CPU", isa.name());
    crate::count::mults(n_out * n * cols);
    // SAFETY: bounds and the CPU's features asserted above.
    unsafe {
        match isa {
            Isa::Scalar => axpy_by_type::<Scalar16>(weights, stride, pieces, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::avx2_axpy(weights, stride, pieces, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::avx512_axpy(weights, stride, pieces, out),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("no SIMD path on this architecture"),
        }
    }
}

/// # Safety
/// The CPU must have `L`'s ISA, and the arguments must pass the checks of
/// [`weighted_row_sums`].
#[inline(always)]
unsafe fn axpy_by_type<L: Lanes16>(weights: &[f32], stride: usize, pieces: &[MatRef], out: &mut [f32]) {
    // SAFETY: `F16Group` is the layout of F16 pieces, `F32Group` of the others (F32: checked by
    // `weighted_row_sums`); the rest is the caller's precondition, which `axpy` asks for too.
    unsafe {
        match pieces[0].ty {
            GgmlType::F16 => axpy::<L, F16Group>(weights, stride, pieces, out),
            _ => axpy::<L, F32Group>(weights, stride, pieces, out),
        }
    }
}

/// Weight rows in blocks of up to 4, each block sharing every unpacked value group.
///
/// # Safety
/// As for [`axpy_by_type`], with `W` the layout of the pieces' rows.
#[inline(always)]
unsafe fn axpy<L: Lanes16, W: WeightGroup>(weights: &[f32], stride: usize, pieces: &[MatRef], out: &mut [f32]) {
    // SAFETY: `j < n_out`, `out` holds `n_out` rows of `cols` values and `weights` holds
    // `(n_out - 1) * stride + n` values (checked by `weighted_row_sums`), so the pointers of
    // rows `j..` are in their buffers, and `axpy_rows` reads and writes at most the `n_out - j`
    // rows left.
    unsafe {
        let cols = pieces[0].cols;
        let n_out = out.len() / cols;
        let mut j = 0;
        while j < n_out {
            let (w, o) = (weights.as_ptr().add(j * stride), out.as_mut_ptr().add(j * cols));
            j += match n_out - j {
                1 => axpy_rows::<L, W, 1>(w, stride, pieces, o),
                2 => axpy_rows::<L, W, 2>(w, stride, pieces, o),
                3 => axpy_rows::<L, W, 3>(w, stride, pieces, o),
                _ => axpy_rows::<L, W, 4>(w, stride, pieces, o),
            };
        }
    }
}

/// `NW` weight rows (at `w`, `stride` apart) against the value rows of `pieces`; returns `NW`.
///
/// # Safety
/// `w` must be valid for `NW` rows of weights, `stride` apart, each as long as the pieces' rows
/// together; `out` for `NW` rows of `cols` f32; the pieces' data must hold whole rows in `W`'s
/// layout; the CPU must have `L`'s ISA.
#[inline(always)]
unsafe fn axpy_rows<L: Lanes16, W: WeightGroup, const NW: usize>(
    w: *const f32,
    stride: usize,
    pieces: &[MatRef],
    out: *mut f32,
) -> usize {
    // SAFETY: every group of every row of the pieces lies within the piece's data, and every
    // weight read and output written within `w` and `out` (this function's precondition); the
    // CPU has `L`'s ISA.
    unsafe {
        let cols = pieces[0].cols;
        for g in 0..cols / GROUP {
            let (mut lo, mut hi) = ([L::zero(); NW], [L::zero(); NW]);
            let mut r0 = 0;
            for v in pieces {
                let row_bytes = v.row_bytes();
                for r in 0..v.rows {
                    let (v_lo, v_hi) = W::unpack::<L>(v.data.as_ptr().add(r * row_bytes + g * W::CODE_BYTES));
                    for j in 0..NW {
                        let a = L::splat(*w.add(j * stride + r0 + r));
                        lo[j] = L::fma(a, v_lo, lo[j]);
                        hi[j] = L::fma(a, v_hi, hi[j]);
                    }
                }
                r0 += v.rows;
            }
            for j in 0..NW {
                lo[j].store(out.add(j * cols + g * GROUP));
                hi[j].store(out.add(j * cols + g * GROUP + GROUP / 2));
            }
        }
        NW
    }
}

/// Views f32 values as their native bytes (the kernels read F32 weights from bytes).
pub fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use super::lanes::{Avx2x2, Avx512};

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C, and the arguments must pass the checks of
    /// [`matmul_rows`](super::matmul_rows); no other thread may touch those outputs during the
    /// call.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn avx2(call: &RowsCall<Activations>, scratch: &mut DecodedScratch) {
        // SAFETY: the caller's precondition is `by_type`'s, and the CPU has the features this
        // function enables.
        unsafe { by_type::<Avx2x2>(call, scratch) }
    }

    /// # Safety
    /// The CPU must have AVX-512 (F, BW, VL), AVX2, FMA and F16C, and the arguments must pass
    /// the checks of [`matmul_rows`](super::matmul_rows); no other thread may touch those
    /// outputs during the call.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn avx512(call: &RowsCall<Activations>, scratch: &mut DecodedScratch) {
        // SAFETY: the caller's precondition is `by_type`'s, and the CPU has the features this
        // function enables.
        unsafe { by_type::<Avx512>(call, scratch) }
    }

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C, and the arguments must pass the checks of
    /// [`weighted_row_sums`](super::weighted_row_sums).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn avx2_axpy(weights: &[f32], stride: usize, pieces: &[MatRef], out: &mut [f32]) {
        // SAFETY: the caller's precondition is `axpy_by_type`'s, and the CPU has the features
        // this function enables.
        unsafe { axpy_by_type::<Avx2x2>(weights, stride, pieces, out) }
    }

    /// # Safety
    /// The CPU must have AVX-512 (F, BW, VL), AVX2, FMA and F16C, and the arguments must pass
    /// the checks of [`weighted_row_sums`](super::weighted_row_sums).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn avx512_axpy(weights: &[f32], stride: usize, pieces: &[MatRef], out: &mut [f32]) {
        // SAFETY: the caller's precondition is `axpy_by_type`'s, and the CPU has the features
        // this function enables.
        unsafe { axpy_by_type::<Avx512>(weights, stride, pieces, out) }
    }
}

/// # Safety
/// The CPU must have `L`'s ISA, the arguments must pass the checks of [`matmul_rows`], and no
/// other thread may touch those elements of `out` during the call.
#[inline(always)]
unsafe fn by_type<L: Lanes16>(call: &RowsCall<Activations>, scratch: &mut DecodedScratch) {
    // SAFETY: `W` is the group type of `w`'s kernel group, so its layout is that of `w`'s rows;
    // the rest is the caller's precondition, which `tiles` asks for too.
    unsafe {
        match call.w.ty.kernel() {
            KernelGroup::F32 => tiles::<L, F32Group>(call, scratch),
            KernelGroup::F16 => tiles::<L, F16Group>(call, scratch),
            KernelGroup::Bf16 => tiles::<L, Bf16Group>(call, scratch),
            KernelGroup::Q8_0 => tiles::<L, Q8_0Group>(call, scratch),
            KernelGroup::Q4_0 => tiles::<L, Q4_0Group>(call, scratch),
            KernelGroup::Q4_1 => tiles::<L, Q4_1Group>(call, scratch),
            KernelGroup::Groups(f) => by_group_format::<L>(f, call, scratch),
        }
    }
}

/// The kernel instance of each decoded group format in use (one per format, not per type:
/// Q5_1 and Q5_K share one). A format no type uses has no instance.
///
/// # Safety
/// As for [`by_type`], with `f` the group format of `w.ty`.
#[inline(always)]
unsafe fn by_group_format<L: Lanes16>(f: GroupFormat, call: &RowsCall<Activations>, scratch: &mut DecodedScratch) {
    // SAFETY: `f` is `w.ty`'s group format, so the instance's layout is that of `w`'s rows; the
    // rest is the caller's precondition, which `tiles` asks for too.
    unsafe {
        match (f.codes, f.halves, f.offset) {
            (Codes::I8, false, true) => tiles::<L, Groups<I8Codes, false, true>>(call, scratch), // Q5_1, Q5_K
            (Codes::I8, true, false) => tiles::<L, Groups<I8Codes, true, false>>(call, scratch), // Q6_K
            (Codes::Nibbles { bias: 0 }, false, true) => tiles::<L, Groups<NibbleCodes<0>, false, true>>(call, scratch), // Q4_K
            (Codes::Nibbles { bias: -4 }, true, false) => tiles::<L, Groups<NibbleCodes<-4>, true, false>>(call, scratch), // Q3_K
            (Codes::Nibbles { bias: 0 }, true, true) => tiles::<L, Groups<NibbleCodes<0>, true, true>>(call, scratch), // Q2_K
            // tests/kernels.rs runs every type in GgmlType::ALL through here.
            _ => unreachable!("no kernel instance for {f:?}: add one here"),
        }
    }
}

/// Walks token blocks, then rows, then tiles of up to 3 rows x 4 tokens (one token: up to 4
/// rows): each unpacked weight group serves every token of the tile, each loaded activation
/// every row. A block of more tokens than one tile holds decodes its rows' weights once into
/// f32 ([`decode_rows`], for the types whose [`WeightGroup::DECODED_PREFILL`] says so) and
/// runs the float tiles on them, so a weight is unpacked once per block rather than once per
/// tile. Every output keeps its own two chains over the same weights, so neither the tile
/// shape nor the decoding changes a bit.
///
/// # Safety
/// As for [`by_type`], with `W` the group type of `w.ty`.
#[inline(always)]
unsafe fn tiles<L: Lanes16, W: WeightGroup>(call: &RowsCall<Activations>, scratch: &mut DecodedScratch) {
    // SAFETY: rows `r..r + nr` are rows of `w` (`rows.end <= w.rows`) and tokens `t..` tokens
    // of `act`, so the row and activation pointers stay in their buffers and `tile` reads what
    // they hold; `scratch` holds `nr` rows of `cols` f32 and the block's sums; the outputs
    // `t * token_stride + r..` are in `out` (`check_out`) and this call's alone, and the CPU
    // has `L`'s ISA (this function's precondition).
    unsafe {
        let &RowsCall { w, act, ref rows, out, token_stride } = call;
        let row_bytes = w.row_bytes();
        let cols = act.cols;
        let decoded_rows = L::PREFILL_TILE_ROWS.min(F32Group::PREFILL_TILE_ROWS);
        // Rows decoded once serve a block of tokens whose activations stay in L2 while the
        // thread's rows pass.
        let mut block = TOKEN_BLOCK;
        if W::DECODED_PREFILL && act.n_tokens > PREFILL_TILE_TOKENS {
            block = decoded_token_block(cols);
            scratch.rows.grow(decoded_rows * cols, 0.0);
            scratch.sums.grow(block.div_ceil(PREFILL_TILE_TOKENS) * decoded_rows * PREFILL_TILE_TOKENS * 2 * 16, 0.0);
        }
        for t_block in (0..act.n_tokens).step_by(block) {
            let tokens = t_block..(t_block + block).min(act.n_tokens);
            let decode = W::DECODED_PREFILL && tokens.len() > PREFILL_TILE_TOKENS;
            // One token shares nothing between rows, but several rows give independent FMA chains.
            let tile_rows = match (act.n_tokens, decode) {
                (1, _) => L::DECODE_TILE_ROWS.min(W::DECODE_TILE_ROWS),
                (_, true) => decoded_rows,
                (_, false) => L::PREFILL_TILE_ROWS.min(W::PREFILL_TILE_ROWS),
            };
            let ahead = &mut StreamAhead::new(&w.data[rows.start * row_bytes..rows.end * row_bytes]);
            let mut r = rows.start;
            while r < rows.end {
                // The largest tile of 4, 3, 2 or 1 rows that fits.
                let nr = [4, 3, 2, 1].into_iter().find(|&n| n <= tile_rows.min(rows.end - r)).expect("1 row fits");
                let row = w.data.as_ptr().add(r * row_bytes);
                if act.n_tokens == 1 {
                    // One token: each row is read once, at memory's pace; the tiles prefetch
                    // ahead of their walk ([`StreamAhead`]).
                    let (x, gs, o, s) = (act.x.as_ptr(), act.gs.as_ptr(), out.at(r), (token_stride, Some(&mut *ahead)));
                    match nr {
                        4 => tile::<L, W, 4, 1>(row, row_bytes, cols, x, gs, o, s),
                        3 => tile::<L, W, 3, 1>(row, row_bytes, cols, x, gs, o, s),
                        2 => tile::<L, W, 2, 1>(row, row_bytes, cols, x, gs, o, s),
                        _ => tile::<L, W, 1, 1>(row, row_bytes, cols, x, gs, o, s),
                    };
                } else if decode {
                    // The rows are read from memory here, once for the block.
                    ahead.advance(nr * row_bytes);
                    let d = scratch.rows.as_mut_ptr();
                    decode_rows::<L, W>(row, row_bytes, nr, cols, d);
                    let o = (out, token_stride);
                    let sums = scratch.sums.as_mut_ptr();
                    match nr {
                        3 => decoded_tiles::<L, 3>(d, tokens.clone(), act, r, o, sums),
                        2 => decoded_tiles::<L, 2>(d, tokens.clone(), act, r, o, sums),
                        _ => decoded_tiles::<L, 1>(d, tokens.clone(), act, r, o, sums),
                    }
                } else {
                    token_tiles::<L, W>(row, row_bytes, nr, tokens.clone(), act, r, (out, token_stride), Some(&mut *ahead));
                }
                r += nr;
            }
        }
    }
}

/// Most tokens in a tile of several tokens.
const PREFILL_TILE_TOKENS: usize = 4;

/// The size of one core's L2 cache as the CPU reports it (1 MiB where it does not), between
/// 512 KiB and 4 MiB. It sizes token blocks, never a result.
fn l2_bytes() -> usize {
    static L2: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *L2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__cpuid;
            // A leaf above the highest extended one reads as that leaf's values, so the
            // maximum is checked first; leaf 0x8000_0006, ECX bits 31..16: the L2's size in
            // KiB (AMD and Intel).
            let kib = if __cpuid(0x8000_0000).eax >= 0x8000_0006 { (__cpuid(0x8000_0006).ecx >> 16) as usize } else { 0 };
            if kib > 0 {
                return (kib * 1024).clamp(512 * 1024, 4 * 1024 * 1024);
            }
        }
        1024 * 1024
    })
}

/// Tokens per block over decoded rows of `cols` values: [`TOKEN_BLOCK`], or fewer (whole
/// tiles) where that many rows of activations would not fit in half of this core's L2, so
/// that every row group reads the block's activations from L2, not from memory. More
/// tokens per block spread each row's decoding over more of them.
fn decoded_token_block(cols: usize) -> usize {
    let fit = l2_bytes() / 2 / (4 * cols);
    fit.clamp(PREFILL_TILE_TOKENS, TOKEN_BLOCK) / PREFILL_TILE_TOKENS * PREFILL_TILE_TOKENS
}

/// `nr` rows of `W` at `row` (`row_bytes` apart) against tokens `tokens` of `act`, in
/// tiles of `nr` rows and up to [`PREFILL_TILE_TOKENS`] tokens; the outputs of row `r0 + i`
/// and token `t` go to `out` at `t * token_stride + r0 + i`. With a stream (`ahead`), the
/// first tile reads the rows from memory and walks it on.
///
/// # Safety
/// As for [`tile`], for each tile; `nr` is 1..=4 and 4 only for one token.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the tile's rows, tokens and outputs, as `tile` takes them
unsafe fn token_tiles<L: Lanes16, W: WeightGroup>(
    row: *const u8,
    row_bytes: usize,
    nr: usize,
    tokens: Range<usize>,
    act: &Activations,
    r0: usize,
    (out, token_stride): (Disjoint<f32>, usize),
    mut ahead: Option<&mut StreamAhead>,
) {
    // SAFETY: the caller's precondition, tile by tile.
    unsafe {
        let (cols, gs_len) = (act.cols, group_sums_len(act.cols));
        let mut t = tokens.start;
        while t < tokens.end {
            let x = act.x.as_ptr().add(t * cols);
            let gs = if W::OFFSET { act.gs.as_ptr().add(t * gs_len) } else { x };
            let o = out.at(t * token_stride + r0);
            // The block's first tile over these rows reads them from memory: it walks the
            // stream on; the others find them in the cache.
            let s = (token_stride, if t == tokens.start { ahead.as_deref_mut() } else { None });
            t += match (nr, tokens.end - t) {
                // Only one token has 4-row tiles.
                (4, _) => tile::<L, W, 4, 1>(row, row_bytes, cols, x, gs, o, s),
                (3, 1) => tile::<L, W, 3, 1>(row, row_bytes, cols, x, gs, o, s),
                (3, 2) => tile::<L, W, 3, 2>(row, row_bytes, cols, x, gs, o, s),
                (3, 3) => tile::<L, W, 3, 3>(row, row_bytes, cols, x, gs, o, s),
                (3, _) => tile::<L, W, 3, 4>(row, row_bytes, cols, x, gs, o, s),
                (1, 1) => tile::<L, W, 1, 1>(row, row_bytes, cols, x, gs, o, s),
                (1, 2) => tile::<L, W, 1, 2>(row, row_bytes, cols, x, gs, o, s),
                (1, 3) => tile::<L, W, 1, 3>(row, row_bytes, cols, x, gs, o, s),
                (1, _) => tile::<L, W, 1, 4>(row, row_bytes, cols, x, gs, o, s),
                (_, 1) => tile::<L, W, 2, 1>(row, row_bytes, cols, x, gs, o, s),
                (_, 2) => tile::<L, W, 2, 2>(row, row_bytes, cols, x, gs, o, s),
                (_, 3) => tile::<L, W, 2, 3>(row, row_bytes, cols, x, gs, o, s),
                (_, _) => tile::<L, W, 2, 4>(row, row_bytes, cols, x, gs, o, s),
            };
        }
    }
}

/// Columns of decoded rows that the tiles of a token block take at a time: the weights of
/// that many columns (up to 3 rows of 1024 f32, 12 KiB) stay in L1 while every tile of the
/// block multiplies them, where whole rows would be read from L2 again by each tile.
const DECODED_COLS: usize = 1024;

/// `NR` decoded rows (`w`, [NR][cols] f32) against tokens `tokens` of `act`, the outputs of
/// row `r0 + i` and token `t` to `out` at `t * token_stride + r0 + i`: tiles of `NR` rows and
/// up to [`PREFILL_TILE_TOKENS`] tokens, each over [`DECODED_COLS`] columns at a time, its
/// two chains per output kept in `sums` between them, so every output is [`tile`]'s on the
/// same weights, bit for bit.
///
/// # Safety
/// `w` must hold `NR` rows of `cols` f32; `sums` be valid for
/// `tokens.len().div_ceil(4) * NR * 4 * 32` f32; `tokens` be tokens of `act`; the outputs be
/// in `out` and this call's alone; and the CPU have `L`'s ISA.
#[inline(always)]
unsafe fn decoded_tiles<L: Lanes16, const NR: usize>(
    w: *const f32,
    tokens: Range<usize>,
    act: &Activations,
    r0: usize,
    (out, token_stride): (Disjoint<f32>, usize),
    sums: *mut f32,
) {
    // SAFETY: the reads stay in `w`, the tokens' activations and `sums`, the writes in `sums`
    // and this call's outputs (this function's precondition); the CPU has `L`'s ISA.
    unsafe {
        let cols = act.cols;
        // [tile][row][token][lo, hi][16]
        let tile_sums = NR * PREFILL_TILE_TOKENS * 2 * 16;
        let n_tiles = tokens.len().div_ceil(PREFILL_TILE_TOKENS);
        for c0 in (0..cols).step_by(DECODED_COLS) {
            let groups = c0 / GROUP..(c0 + DECODED_COLS).min(cols) / GROUP;
            let first = c0 == 0;
            for i in 0..n_tiles {
                let t = tokens.start + i * PREFILL_TILE_TOKENS;
                let (x, s) = (act.x.as_ptr().add(t * cols), sums.add(i * tile_sums));
                match tokens.end - t {
                    1 => decoded_tile_part::<L, NR, 1>(w, x, cols, groups.clone(), s, first),
                    2 => decoded_tile_part::<L, NR, 2>(w, x, cols, groups.clone(), s, first),
                    3 => decoded_tile_part::<L, NR, 3>(w, x, cols, groups.clone(), s, first),
                    _ => decoded_tile_part::<L, NR, 4>(w, x, cols, groups.clone(), s, first),
                }
            }
        }
        for t in tokens.clone() {
            let i = t - tokens.start;
            let s = sums.add((i / PREFILL_TILE_TOKENS) * tile_sums + (i % PREFILL_TILE_TOKENS) * 32);
            for r in 0..NR {
                let s = s.add(r * PREFILL_TILE_TOKENS * 32);
                *out.at(t * token_stride + r0 + r) = L::add(L::load(s), L::load(s.add(16))).reduce();
            }
        }
    }
}

/// One tile of [`decoded_tiles`] over the groups `groups`: `NR` rows of `w` ([NR][cols]
/// f32) against `NT` tokens from `x` ([NT][cols] f32), the two chains of each output
/// starting at zero (the `first` column block) or continuing from `sums` ([NR][4][lo, hi][16]
/// f32), and left there.
///
/// # Safety
/// As for [`decoded_tiles`], for this tile.
#[inline(always)]
unsafe fn decoded_tile_part<L: Lanes16, const NR: usize, const NT: usize>(
    w: *const f32,
    x: *const f32,
    cols: usize,
    groups: Range<usize>,
    sums: *mut f32,
    first: bool,
) {
    // SAFETY: the caller's precondition.
    unsafe {
        let mut lo = [[L::zero(); NT]; NR];
        let mut hi = [[L::zero(); NT]; NR];
        if !first {
            for r in 0..NR {
                for t in 0..NT {
                    let s = sums.add((r * PREFILL_TILE_TOKENS + t) * 32);
                    (lo[r][t], hi[r][t]) = (L::load(s), L::load(s.add(16)));
                }
            }
        }
        for g in groups {
            let mut wg = [(L::zero(), L::zero()); NR];
            for (r, wr) in wg.iter_mut().enumerate() {
                let p = w.add(r * cols + g * GROUP);
                *wr = (L::load(p), L::load(p.add(GROUP / 2)));
            }
            group_fmas::<L, NR, NT>(&wg, x, cols, g, &mut lo, &mut hi);
        }
        for r in 0..NR {
            for t in 0..NT {
                let s = sums.add((r * PREFILL_TILE_TOKENS + t) * 32);
                lo[r][t].store(s);
                hi[r][t].store(s.add(16));
            }
        }
    }
}

/// One group's step of the canonical order ([`groups`]) for `NR` rows (their weights `w`,
/// the group's two halves) and `NT` tokens from `x` (`cols` apart): each output's two
/// chains, `lo = fma(x_lo, w_lo, lo)` and `hi = fma(x_hi, w_hi, hi)`.
///
/// # Safety
/// `x` must be valid for group `g` of `NT` rows of `cols` f32, and the CPU have `L`'s ISA.
#[inline(always)]
unsafe fn group_fmas<L: Lanes16, const NR: usize, const NT: usize>(
    w: &[(L, L); NR],
    x: *const f32,
    cols: usize,
    g: usize,
    lo: &mut [[L; NT]; NR],
    hi: &mut [[L; NT]; NR],
) {
    // SAFETY: the loads read group `g` of the `NT` rows (this function's precondition).
    unsafe {
        for t in 0..NT {
            let xt = x.add(t * cols + g * GROUP);
            let (x_lo, x_hi) = (L::load(xt), L::load(xt.add(GROUP / 2)));
            for r in 0..NR {
                lo[r][t] = L::fma(x_lo, w[r].0, lo[r][t]);
                hi[r][t] = L::fma(x_hi, w[r].1, hi[r][t]);
            }
        }
    }
}

/// The weights of `nr` rows of `W` at `row` (`row_bytes` apart), `cols` each, as f32 into
/// `dst` ([nr][cols]): each group's two halves as [`tile`] computes them, so tiles over
/// these f32 rows multiply by the same values.
///
/// # Safety
/// `row` must point at `nr` rows of `cols` values in `W`'s layout, `dst` be valid for
/// `nr * cols` f32, and the CPU have `L`'s ISA.
#[inline(always)]
unsafe fn decode_rows<L: Lanes16, W: WeightGroup>(row: *const u8, row_bytes: usize, nr: usize, cols: usize, dst: *mut f32) {
    // SAFETY: the reads stay in the `nr` rows and the writes in `dst` (this function's
    // precondition); the CPU has `L`'s ISA.
    unsafe {
        let groups = cols / GROUP;
        for r in 0..nr {
            let (row, dst) = (row.add(r * row_bytes), dst.add(r * cols));
            let mut d = [0f32; 16];
            for chunk in (0..groups).step_by(16) {
                chunk_scales::<L, W>(row, groups, chunk, &mut d);
                for g in chunk..(chunk + 16).min(groups) {
                    let (lo, hi) = group_weights::<L, W>(row, groups, g, &d);
                    lo.store(dst.add(g * GROUP));
                    hi.store(dst.add(g * GROUP + GROUP / 2));
                }
            }
        }
    }
}

/// The f16 scales of the up to 16 groups from `chunk` of a row of `W` at `row` (`groups`
/// groups), as f32 into `d`, for [`group_weights`]; nothing for types without them.
///
/// # Safety
/// `row` must point at a row of `groups` groups in `W`'s layout, `chunk < groups`, and the
/// CPU have `L`'s ISA.
#[inline(always)]
unsafe fn chunk_scales<L: Lanes16, W: WeightGroup>(row: *const u8, groups: usize, chunk: usize, d: &mut [f32; 16]) {
    if W::SCALED {
        // SAFETY: the row's scales follow its codes, one f16 per group (this function's
        // precondition).
        unsafe { f16_chunk::<L>(row.add(groups * W::CODE_BYTES + 2 * chunk), (groups - chunk).min(16)).store(d.as_mut_ptr()) }
    }
}

/// The weights of group `g` of that row, its two halves, with `d` the scales of `g`'s chunk
/// from [`chunk_scales`]: what every tile multiplies by, whether it unpacks the group in
/// registers ([`tile`]) or reads it decoded ([`decode_rows`]).
///
/// # Safety
/// As for [`chunk_scales`], with `g < groups`.
#[inline(always)]
unsafe fn group_weights<L: Lanes16, W: WeightGroup>(row: *const u8, groups: usize, g: usize, d: &[f32; 16]) -> (L, L) {
    // SAFETY: group `g` is in the row (this function's precondition).
    unsafe { W::weights_at::<L>(row, groups, g, if W::SCALED { L::splat(d[g % 16]) } else { L::zero() }) }
}

/// The CPU's cache line size in bytes as it reports it (CPUID leaf 1, the `CLFLUSH` line
/// size), 64 where it does not report a power of two between 32 and 256. It spaces the
/// prefetches of [`StreamAhead`], never a result.
fn cache_line_bytes() -> usize {
    static LINE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LINE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // EBX bits 15..8: the line size in units of 8 bytes.
            let bytes = ((std::arch::x86_64::__cpuid(1).ebx >> 8) & 0xff) as usize * 8;
            if bytes.is_power_of_two() && (32..=256).contains(&bytes) {
                return bytes;
            }
        }
        64
    })
}

/// Software prefetch a fixed distance ahead of a thread's walk through its weight rows.
///
/// A matmul reads its rows from memory once, front to back (a token block's first tile over
/// a row group; the block's other tiles find the rows in the cache), and does some arithmetic
/// on every line; the hardware prefetchers alone keep too few lines in flight for that pace
/// (and stop at 4 KiB page boundaries), so a thread would wait on memory and then compute,
/// one after the other.
/// The kernels call [`StreamAhead::advance`] with each piece of the rows they are about to
/// read; it asks for the lines [`StreamAhead::DISTANCE`] bytes further on, a few at a time,
/// so the memory system keeps loading while the kernel computes. The lines are asked into
/// L2, not L1: a request for L1 holds one of the few L1 miss slots for the whole trip to
/// memory, which the kernel's own loads (the activations, the lines it reads next, brought
/// from L2 by the L1 prefetcher) then wait for. A hint only: results never depend on it.
pub(crate) struct StreamAhead {
    /// The next byte to ask for.
    next: *const u8,
    /// The end of the thread's rows: nothing past it is asked for.
    end: *const u8,
    /// The bytes between prefetched addresses: the cache line size (a power of two), read
    /// from the CPU at run time. Kept a run-time value on purpose: with a compile-time 64 the
    /// compiler emits a different prefetch loop, with which one-token passes measured
    /// markedly slower on Intel Xeons (benchmarks.md, "A second Intel Xeon").
    line: usize,
}

impl StreamAhead {
    /// How far ahead of the reading position lines are asked for: more than one core's
    /// loads in flight (about 100 ns of memory latency at 20-30 GB/s is 2-3 KiB), far less
    /// than L2 (1-2 MiB), so a line arrives before it is read and stays until then.
    pub(crate) const DISTANCE: usize = 8192;

    /// For a walk through `bytes` (a thread's consecutive rows), ahead of its first byte.
    pub(crate) fn new(bytes: &[u8]) -> StreamAhead {
        let p = bytes.as_ptr();
        // The first DISTANCE bytes are left to the hardware prefetchers.
        StreamAhead { next: p.wrapping_add(StreamAhead::DISTANCE.min(bytes.len())), end: p.wrapping_add(bytes.len()), line: cache_line_bytes() }
    }

    /// The walk moves on by `bytes`: asks for the lines that bring the prefetched part that
    /// much further (those starting in the next `bytes` bytes, up to the end).
    #[inline(always)]
    pub(crate) fn advance(&mut self, bytes: usize) {
        let from = self.next as usize;
        self.next = self.next.wrapping_add(bytes);
        let stop = (self.next as usize).min(self.end as usize);
        // Lines starting in [from, stop); the line holding `from - 1` was asked for before.
        let mut line = (from + self.line - 1) & !(self.line - 1);
        while line < stop {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch reads nothing and never faults, whatever the address; SSE is
            // part of x86_64.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(line as *const i8);
            }
            line += self.line;
        }
    }

    /// [`StreamAhead::advance`] by piece `i` of `pieces` nearly equal pieces of `bytes` (the
    /// last one takes the remainder), for a kernel that reads a tile's rows piece by piece.
    #[inline(always)]
    pub(crate) fn advance_piece(&mut self, bytes: usize, pieces: usize, i: usize) {
        let step = bytes / pieces;
        self.advance(if i + 1 == pieces { bytes - step * (pieces - 1) } else { step });
    }
}

/// 16 f16 values from `p`, of which only the first `n` exist (the rest read as zero).
///
/// # Safety
/// `p` must be valid for `2 n` bytes, `n` in 1..=16, and the CPU must have `L`'s ISA.
#[inline(always)]
pub(crate) unsafe fn f16_chunk<L: Lanes16>(p: *const u8, n: usize) -> L {
    // SAFETY: this function's precondition is that of `L::f16x16` (`n == 16`) or of
    // `L::f16_partial`.
    unsafe {
        if n == 16 {
            L::f16x16(p)
        } else {
            L::f16_partial(p, n)
        }
    }
}

/// `NR` consecutive weight rows (from `row`, `row_bytes` apart) against `NT` consecutive
/// tokens, each output by the op order of [`groups`]; returns `NT`.
///
/// # Safety
/// `row` must point at `NR` rows of `cols` values in `W`'s layout, `row_bytes` apart; `x` at
/// `NT` tokens of `cols` f32; `gs` (if `W::OFFSET`) at their group sums, `group_sums_len(cols)`
/// per token; `out` be valid for `NR` outputs of each of `NT` tokens, `out_stride` apart, which
/// no other thread touches during the call. The CPU must have `L`'s ISA. With a stream
/// (`ahead`), the tile advances it over its rows as it reads them.
#[inline(always)]
unsafe fn tile<L: Lanes16, W: WeightGroup, const NR: usize, const NT: usize>(
    row: *const u8,
    row_bytes: usize,
    cols: usize,
    x: *const f32,
    gs: *const f32,
    out: *mut f32,
    (out_stride, mut ahead): (usize, Option<&mut StreamAhead>),
) -> usize {
    // SAFETY: `row`, `x`, `gs` and `out` cover the rows, tokens, group sums and outputs this
    // reads and writes (this function's precondition), and the CPU has `L`'s ISA.
    unsafe {
        let groups = cols / GROUP;
        let gs_len = group_sums_len(cols);
        // Loops rather than closures here: a closure would not inherit the ISA wrapper's target
        // features, and the lane ops inside it would not inline.
        let mut rows = [row; NR];
        for (r, p) in rows.iter_mut().enumerate() {
            *p = row.add(r * row_bytes);
        }
        // Two chains per output (low and high halves of each group) halve the FMA latency chain.
        let mut acc_lo = [[L::zero(); NT]; NR];
        let mut acc_hi = [[L::zero(); NT]; NR];
        let mut d = [[0f32; 16]; NR];
        let chunks = groups.div_ceil(16);
        for chunk in (0..groups).step_by(16) {
            let n = (groups - chunk).min(16);
            if let Some(a) = ahead.as_deref_mut() {
                a.advance_piece(NR * row_bytes, chunks, chunk / 16);
            }
            for r in 0..NR {
                chunk_scales::<L, W>(rows[r], groups, chunk, &mut d[r]);
            }
            for g in chunk..chunk + n {
                let mut w = [(L::zero(), L::zero()); NR];
                for r in 0..NR {
                    w[r] = group_weights::<L, W>(rows[r], groups, g, &d[r]);
                }
                group_fmas::<L, NR, NT>(&w, x, cols, g, &mut acc_lo, &mut acc_hi);
            }
        }
        for r in 0..NR {
            let mut macc = [L::zero(); NT];
            if W::OFFSET {
                let m_ptr = rows[r].add(groups * (W::CODE_BYTES + 2));
                for chunk in (0..groups).step_by(16) {
                    let m = f16_chunk::<L>(m_ptr.add(2 * chunk), (groups - chunk).min(16));
                    for (t, a) in macc.iter_mut().enumerate() {
                        *a = L::fma(m, L::load(gs.add(t * gs_len + chunk)), *a);
                    }
                }
            }
            for t in 0..NT {
                let mut v = L::add(acc_lo[r][t], acc_hi[r][t]);
                if W::OFFSET {
                    v = L::add(v, macc[t]);
                }
                *out.add(t * out_stride + r) = v.reduce();
            }
        }
        NT
    }
}

/// The ISA modules hold no closures: a closure does not inherit the target features of the
/// function it is written in, so the intrinsics inside it can stay calls, one per
/// instruction, several times slower than the instructions. `per_index!` and loops write
/// such expressions in place.
#[cfg(test)]
mod simd_sources {
    const SOURCES: [(&str, &str); 4] = [
        ("int8/avx2.rs", include_str!("int8/avx2.rs")),
        ("int8/avx512.rs", include_str!("int8/avx512.rs")),
        ("lanes/avx2.rs", include_str!("lanes/avx2.rs")),
        ("lanes/avx512.rs", include_str!("lanes/avx512.rs")),
    ];

    /// The byte offsets of closures on a line of code: a `|` that opens a parameter list,
    /// after `(`, `,`, `=` or `move` (where `|` cannot be an operator), and is closed on the
    /// line.
    fn closures(code: &str) -> Vec<usize> {
        let b = code.as_bytes();
        (0..b.len())
            .filter(|&i| b[i] == b'|' && (i == 0 || b[i - 1] != b'|'))
            .filter(|&i| {
                let before = code[..i].trim_end();
                let opens = before.ends_with(['(', ',', '=']) && !before.ends_with("==") && !before.ends_with("!=")
                    || before.ends_with("move");
                opens && code[i + 1..].contains('|')
            })
            .collect()
    }

    #[test]
    fn the_detector_finds_closures_and_not_operators() {
        assert_eq!(closures("let half = |h: usize| x(h);"), vec![11]);
        assert_eq!(closures("f(a, || 1, move |x| x)"), vec![5, 16]);
        assert!(closures("let m = a | b; if p || q { c |= d }").is_empty());
    }

    #[test]
    fn isa_modules_hold_no_closures() {
        for (file, source) in SOURCES {
            for (n, line) in source.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if code.contains("per_index!(") {
                    continue;
                }
                assert!(closures(code).is_empty(), "src/kernels/{file}:{}: a closure: {line}", n + 1);
            }
        }
    }
}
