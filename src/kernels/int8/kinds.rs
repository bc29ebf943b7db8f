//! How each weight type's chunk enters the integer dot product: one [`Kind`] per type,
//! generic over the ISA's [`IntLanes`].

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{__m512, __m512i};

#[cfg(target_arch = "x86_64")]
use super::avx512::Vnni;
use super::IntLanes;
use crate::kernels::f16_chunk;
use crate::kernels::packed::code_bytes;
use crate::kernels::kquant::{Q4K_HEADER, SUPER_GROUPS};
use crate::kernels::kquant_low::Q2K_CODE_BYTES;
use crate::kernels::lanes::Lanes16;
use crate::kernels::{kquant, kquant_low, q5};
use crate::tensor::GgmlType;

/// How one weight type's chunk enters the integer dot product.
///
/// # Safety
/// The methods run `D`'s ISA, which the CPU must have (as for [`IntLanes`]), and take
/// pointers into a packed row and a quantized activation row, which must be valid for the
/// chunk they name (codes at `codes`, the row's scales part from `s`, the activation bytes
/// and sums of the chunk).
pub(crate) trait Kind {
    const CODE_BYTES: usize;
    /// Q4_1's `m * s` term.
    const OFFSET: bool;
    /// Whether rows are super-blocks of 8 groups whose scales come from a header (the
    /// K-quants).
    const SUPER_BLOCKS: bool = false;
    /// Whether the codes are 8 words of one byte per value (Q8_0) or 4 of nibbles, which
    /// AVX-512's several-token path takes word by word (Q6_K's 6-bit codes are not).
    const WORD_PAIRS: bool = true;
    /// The type whose ggml blocks the rows are, read in place ([`KQ8_0Blocks`],
    /// [`KQ5KBlocks`], [`KQ6KBlocks`]), or `None` for a packed layout.
    const BLOCKS: Option<GgmlType> = None;
    /// Whether each group's two halves have sub-block scales folded into the integer sum
    /// (Q6_K, Q3_K, Q2_K): then [`Kind::vnni_words`] gives them.
    const HALVES: bool = false;
    type W<D: IntLanes>: Copy;
    /// A chunk's codes at `codes` (`n` groups); `sub`: the chunk's sub-block scales
    /// ([`Kind::sub_ptr`]).
    unsafe fn prep<D: IntLanes>(codes: *const u8, sub: *const u8, n: usize) -> Self::W<D>;
    /// Where the scales part of the row at `row` (`groups` groups) starts: by default after
    /// the codes.
    #[inline(always)]
    unsafe fn scales_part(row: *const u8, groups: usize) -> *const u8 {
        // SAFETY: `row` is a packed row of `groups` groups (the `Kind` contract), so its scales
        // part follows its codes within it.
        unsafe { row.add(groups * Self::CODE_BYTES) }
    }
    /// Where the codes of the chunk starting at group `g0` are in the row at `row`: by default
    /// `CODE_BYTES` per group before it.
    #[inline(always)]
    unsafe fn codes(row: *const u8, g0: usize) -> *const u8 {
        // SAFETY: `row` is a packed row holding the chunk (the `Kind` contract).
        unsafe { row.add(g0 * Self::CODE_BYTES) }
    }
    /// Where the sub-block scales of the chunk starting at group `g0` are, for a row whose
    /// scales part starts at `s` (`groups` groups): by default 2 bytes per group (Q6_K's).
    #[inline(always)]
    unsafe fn sub_ptr(s: *const u8, _groups: usize, g0: usize) -> *const u8 {
        // SAFETY: `s` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { s.add(2 * g0) }
    }
    /// Step 1's integer sums as f32 lanes (exact: each is below `2^24` in magnitude); `qsum`,
    /// `hsum`: the chunk's 16 activation code sums and first-half sums.
    unsafe fn isum<D: IntLanes>(w: &Self::W<D>, x: *const i8, qsum: *const i32, hsum: *const i32) -> D::F;
    /// The chunk's weight scales `d_w` and offsets `m_w` (zero if none) of groups
    /// `g0..g0 + n` of a row whose scales part starts at `s` (`groups` groups); zero past `n`.
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        // SAFETY: `s` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe {
            let d = f16_chunk::<D::F>(s.add(2 * g0), n);
            let m = if Self::OFFSET { f16_chunk::<D::F>(s.add(2 * groups + 2 * g0), n) } else { <D::F as Lanes16>::zero() };
            (d, m)
        }
    }
    /// Q2_K's minimums: a step after step 3, `acc = fma(m_w d_x, msum, acc)`, with `m_w` from
    /// [`Kind::scales`] and `msum` from [`Kind::min_sum`].
    const MINS: bool = false;
    /// Lane `l`: `f32(m_0 hsum + m_1 (qsum - hsum))` (exact) of the chunk's row, `m_h` the
    /// integer minimums of the group's halves; `qsum`, `hsum` as for [`Kind::isum`].
    #[inline(always)]
    unsafe fn min_sum<D: IntLanes>(_w: &Self::W<D>, _qsum: *const i32, _hsum: *const i32) -> D::F {
        unreachable!("only a type with MINS has minimums")
    }
    /// A prepared chunk's 8 code words as `vpdpbusd`'s unsigned operand and, for the types
    /// whose sub-block scales fold into the integer sum (Q6_K, Q3_K, Q2_K), the lanes'
    /// `sc_0` and `sc_1` (f32).
    #[cfg(target_arch = "x86_64")]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>);
    /// The narrow last chunk: codes, and per-lane dots (`sums`: per-lane activation sums).
    /// Rows of super-blocks (the K-quants) always end on a full chunk: they keep the default
    /// methods, which are never called.
    type T<D: IntLanes>: Copy;
    unsafe fn prep_tail<D: IntLanes>(_codes: *const u8, _n: usize) -> Self::T<D> {
        unreachable!("rows of super-blocks have no narrow chunk")
    }
    unsafe fn psum<D: IntLanes>(_w: &Self::T<D>, _x: *const i8, _sums: *const i32) -> D {
        unreachable!("rows of super-blocks have no narrow chunk")
    }
    /// `log2` of the bias of the unsigned codes the SIMD dot products take, whose
    /// `bias * qsum_x` is subtracted after: Q4_0's nibbles are `q + 8`, Q8_0's bytes are
    /// biased by 128 for `vpdpbusd`; Q4_1's nibbles are the codes.
    const BIAS_LOG2: Option<u32>;
}

pub(super) struct KQ4_0;
impl Kind for KQ4_0 {
    const CODE_BYTES: usize = 16;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = Some(3);
    type W<D: IntLanes> = D::Q4;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (w, None)
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::q4(codes, n) }
    }
    /// `sum (q - 8) x = sum q x - 8 sum x`.
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, qsum: *const i32, _hsum: *const i32) -> D::F {
        // SAFETY: `x` and `qsum` are valid for the chunk's bytes and the CPU runs `D`'s ISA
        // (the `Kind` contract).
        unsafe { D::dot_q4(w, x).minus_8_qsum(qsum).to_f32() }
    }
    type T<D: IntLanes> = D::T4;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::t4(codes, n) }
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T4, x: *const i8, sums: *const i32) -> D {
        // SAFETY: `x` and `sums` are valid for the chunk's bytes and the CPU runs `D`'s ISA
        // (the `Kind` contract).
        unsafe { D::dot_t4(w, x).minus_8_qsum(sums) }
    }
}

pub(super) struct KQ4_1;
impl Kind for KQ4_1 {
    const CODE_BYTES: usize = 16;
    const OFFSET: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    type W<D: IntLanes> = D::Q4;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (w, None)
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::q4(codes, n) }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, _qsum: *const i32, _hsum: *const i32) -> D::F {
        // SAFETY: `x` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::dot_q4(w, x).to_f32() }
    }
    type T<D: IntLanes> = D::T4;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::t4(codes, n) }
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T4, x: *const i8, _sums: *const i32) -> D {
        // SAFETY: `x` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::dot_t4(w, x) }
    }
}

pub(super) struct KQ8_0;
impl Kind for KQ8_0 {
    const CODE_BYTES: usize = 32;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = Some(7);
    type W<D: IntLanes> = D::Q8;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (w, None)
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q8 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::q8(codes, n) }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q8, x: *const i8, qsum: *const i32, _hsum: *const i32) -> D::F {
        // SAFETY: `x` and `qsum` are valid for the chunk's bytes and the CPU runs `D`'s ISA
        // (the `Kind` contract).
        unsafe { D::dot_q8(w, x, qsum).to_f32() }
    }
    type T<D: IntLanes> = D::T8;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T8 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::t8(codes, n) }
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T8, x: *const i8, sums: *const i32) -> D {
        // SAFETY: `x` and `sums` are valid for the chunk's bytes and the CPU runs `D`'s ISA
        // (the `Kind` contract).
        unsafe { D::dot_t8(w, x, sums) }
    }
}

/// Q8_0 read in place from ggml's blocks ([`Layout::Blocks`]): each group is one block (its
/// f16 scale, then its 32 codes), so `CODE_BYTES` is the block's size and a row's "scales
/// part" is the row itself. Each chunk's codes are transposed as they are read into what
/// [`KQ8_0`] prepares from the chunked layout ([`IntLanes::q8_blocks`]), and the scales
/// gathered from the blocks ([`IntLanes::q8_block_scales`]): the integer sums and every float
/// step are [`KQ8_0`]'s, and so are the bits.
///
/// [`Layout::Blocks`]: crate::kernels::packed::Layout::Blocks
pub(super) struct KQ8_0Blocks;
impl Kind for KQ8_0Blocks {
    const CODE_BYTES: usize = Q8_0_BLOCK;
    const BLOCKS: Option<GgmlType> = Some(GgmlType::Q8_0);
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = Some(7);
    /// AVX-512's word-pair tiles read code words from the chunked layout.
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q8;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (w, None)
    }
    #[inline(always)]
    unsafe fn scales_part(row: *const u8, _groups: usize) -> *const u8 {
        row
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(blocks: *const u8, _sub: *const u8, n: usize) -> D::Q8 {
        // SAFETY: `blocks` is valid for the chunk's `n` blocks and the CPU runs `D`'s ISA (the
        // `Kind` contract).
        unsafe { D::q8_blocks(blocks, n) }
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(row: *const u8, _groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        // SAFETY: the row holds the chunk's blocks `g0..g0 + n` and the CPU runs `D`'s ISA (the
        // `Kind` contract).
        unsafe { (D::q8_block_scales(row.add(Q8_0_BLOCK * g0), n), <D::F as Lanes16>::zero()) }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q8, x: *const i8, qsum: *const i32, hsum: *const i32) -> D::F {
        // SAFETY: as for `KQ8_0`, whose codes these are (the `Kind` contract).
        unsafe { KQ8_0::isum::<D>(w, x, qsum, hsum) }
    }
    type T<D: IntLanes> = D::T8;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(blocks: *const u8, n: usize) -> D::T8 {
        // SAFETY: `blocks` is valid for the chunk's `n` blocks and the CPU runs `D`'s ISA (the
        // `Kind` contract); the copy holds the narrow chunk's `32 n` code bytes.
        unsafe { D::t8(codes_from_blocks::<16, 128>(blocks, n).as_ptr(), n) }
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T8, x: *const i8, sums: *const i32) -> D {
        // SAFETY: as for `KQ8_0` (the `Kind` contract).
        unsafe { KQ8_0::psum::<D>(w, x, sums) }
    }
}

/// Bytes of one Q8_0 block: the f16 scale, then 32 codes.
pub(super) const Q8_0_BLOCK: usize = 34;

/// The codes of `n` Q8_0 blocks at `blocks` in a chunked order of pieces of `PIECE` bytes:
/// piece `k` (code bytes `PIECE k..PIECE (k + 1)`) of block `l` at `PIECE (n k + l)`. With
/// 4-byte pieces that is a wide chunk of `n <= 16` groups (the packed layout's definition,
/// [`crate::kernels::packed`]), with 16-byte pieces a narrow one of `n <= 4`.
///
/// # Safety
/// `blocks` must be valid for `n` blocks, and `32 n <= BYTES`.
#[inline(always)]
unsafe fn codes_from_blocks<const PIECE: usize, const BYTES: usize>(blocks: *const u8, n: usize) -> [u8; BYTES] {
    let mut out = [0u8; BYTES];
    // SAFETY: block `l < n` is valid for its 34 bytes, and `PIECE (n k + l + 1) <= 32 n <= BYTES`
    // (this function's precondition).
    unsafe {
        for l in 0..n {
            for k in 0..32 / PIECE {
                std::ptr::copy_nonoverlapping(blocks.add(Q8_0_BLOCK * l + 2 + PIECE * k), out.as_mut_ptr().add(PIECE * (n * k + l)), PIECE);
            }
        }
    }
    out
}

/// The codes of `n` (1 to 16) Q8_0 blocks at `blocks` in the chunked order of a wide chunk.
///
/// # Safety
/// `blocks` must be valid for `n` blocks, `n <= 16`.
#[inline(always)]
pub(super) unsafe fn chunk_from_blocks(blocks: *const u8, n: usize) -> [u8; 512] {
    // SAFETY: this function's precondition is `codes_from_blocks`'.
    unsafe { codes_from_blocks::<4, 512>(blocks, n) }
}

/// Q4_K: Q4_1's arithmetic with `d_w = d * sc`, `m_w = -(dmin * m)` from the super-block
/// headers (`[S][16]` after the codes).
pub(super) struct KQ4K;
impl Kind for KQ4K {
    const SUPER_BLOCKS: bool = true;
    const CODE_BYTES: usize = 16;
    const OFFSET: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    type W<D: IntLanes> = D::Q4;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (w, None)
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::q4(codes, n) }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, _qsum: *const i32, _hsum: *const i32) -> D::F {
        // SAFETY: `x` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::dot_q4(w, x).to_f32() }
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, _groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        // SAFETY: `s` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::q4k_scales(s.add(Q4K_HEADER * (g0 / SUPER_GROUPS)), Q4K_HEADER, n) }
    }
    type T<D: IntLanes> = D::T4;
}

/// Q5_K: Q4_K's arithmetic on 5-bit codes (`[G][20]` code bytes, then Q4_K's headers).
pub(super) struct KQ5K;
impl Kind for KQ5K {
    const SUPER_BLOCKS: bool = true;
    const CODE_BYTES: usize = 20;
    const OFFSET: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q4;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (w, None)
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::q5(codes, n) }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, _qsum: *const i32, _hsum: *const i32) -> D::F {
        // SAFETY: `x` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::dot_q5(w, x).to_f32() }
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, _groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        // SAFETY: `s` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::q4k_scales(s.add(Q4K_HEADER * (g0 / SUPER_GROUPS)), Q4K_HEADER, n) }
    }
    type T<D: IntLanes> = D::T4;
}

/// Q6_K: the sub-block scales folded into the integer sum, `d_w = d` of the super-block
/// (`[G][2]` i8 sub-block scales, then `[S]` f16 `d`, after the codes).
pub(super) struct KQ6K;
impl Kind for KQ6K {
    const HALVES: bool = true;
    const SUPER_BLOCKS: bool = true;
    const CODE_BYTES: usize = 24;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q6;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (&w.0, Some((&w.1, &w.2)))
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, sub: *const u8, n: usize) -> D::Q6 {
        // SAFETY: `codes` and `sub` are valid for the chunk's bytes and the CPU runs `D`'s ISA
        // (the `Kind` contract).
        unsafe { D::q6(codes, sub, n) }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> D::F {
        // SAFETY: `x`, `qsum` and `hsum` are valid for the chunk's bytes and the CPU runs `D`'s
        // ISA (the `Kind` contract).
        unsafe { D::dot_q6(w, x, qsum, hsum) }
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        // SAFETY: `s` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { (D::q6k_scales(s.add(2 * groups + 2 * (g0 / SUPER_GROUPS)), 2, n), <D::F as Lanes16>::zero()) }
    }
    type T<D: IntLanes> = D::T4;
}

/// Bytes of one Q5_K super-block: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins (the
/// header, as Q4_K's), `qh[32]` (bit 4 of each value), `qs[128]` (the low 4 bits).
pub(super) const Q5K_BLOCK: usize = 176;

/// Q5_K read in place from ggml's super-blocks ([`Layout::Blocks`]), as [`KQ6KBlocks`] reads
/// Q6_K: each chunk's codes are unpacked as they are read into what [`KQ5K`] prepares from its
/// int8 layout ([`IntLanes::q5k_blocks`]), and the scales and offsets come from the blocks'
/// headers: the integer sums and every float step are [`KQ5K`]'s, and so are the bits.
///
/// [`Layout::Blocks`]: crate::kernels::packed::Layout::Blocks
pub(super) struct KQ5KBlocks;
impl Kind for KQ5KBlocks {
    const SUPER_BLOCKS: bool = true;
    /// A super-block's bytes ([`Kind::codes`] finds a chunk's).
    const CODE_BYTES: usize = Q5K_BLOCK;
    const BLOCKS: Option<GgmlType> = Some(GgmlType::Q5_K);
    const OFFSET: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q4;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        KQ5K::vnni_words(w)
    }
    #[inline(always)]
    unsafe fn scales_part(row: *const u8, _groups: usize) -> *const u8 {
        row
    }
    #[inline(always)]
    unsafe fn codes(row: *const u8, g0: usize) -> *const u8 {
        // SAFETY: the row holds the chunk's super-blocks (the `Kind` contract).
        unsafe { row.add(Q5K_BLOCK * (g0 / SUPER_GROUPS)) }
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(blocks: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        // SAFETY: `blocks` is valid for the chunk's `n / 8` super-blocks and the CPU runs `D`'s
        // ISA (the `Kind` contract).
        unsafe { D::q5k_blocks(blocks, n) }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, qsum: *const i32, hsum: *const i32) -> D::F {
        // SAFETY: as for `KQ5K`, whose codes these are (the `Kind` contract).
        unsafe { KQ5K::isum::<D>(w, x, qsum, hsum) }
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(row: *const u8, _groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        // SAFETY: the row holds the chunk's `n / 8` super-blocks from group `g0` on, each
        // starting with its header, and the CPU runs `D`'s ISA (the `Kind` contract).
        unsafe { D::q4k_scales(Self::codes(row, g0), Q5K_BLOCK, n) }
    }
    type T<D: IntLanes> = D::T4;
}

/// Bytes of one Q6_K super-block: `ql[128]` (low 4 bits), `qh[64]` (bits 4 and 5), 16 i8
/// sub-block scales, the f16 `d`.
pub(super) const Q6K_BLOCK: usize = 210;
/// Offsets of the sub-block scales and of `d` in a Q6_K super-block.
pub(super) const Q6K_SCALES_AT: usize = 192;
const Q6K_D_AT: usize = 208;

/// Q6_K read in place from ggml's super-blocks ([`Layout::Blocks`]): a chunk is one or two
/// super-blocks, and a row's "scales part" is the row itself. Each chunk's codes are
/// unpacked as they are read into what [`KQ6K`] prepares from its int8 layout
/// ([`IntLanes::q6_blocks`]), with the sub-block scales (ggml's 16 per super-block are the
/// groups' `[8][2]`) and `d` read from the blocks: the integer sums and every float step are
/// [`KQ6K`]'s, and so are the bits.
///
/// [`Layout::Blocks`]: crate::kernels::packed::Layout::Blocks
pub(super) struct KQ6KBlocks;
impl Kind for KQ6KBlocks {
    const HALVES: bool = true;
    const SUPER_BLOCKS: bool = true;
    /// A super-block's bytes ([`Kind::codes`] finds a chunk's).
    const CODE_BYTES: usize = Q6K_BLOCK;
    const BLOCKS: Option<GgmlType> = Some(GgmlType::Q6_K);
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q6;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        KQ6K::vnni_words(w)
    }
    #[inline(always)]
    unsafe fn scales_part(row: *const u8, _groups: usize) -> *const u8 {
        row
    }
    #[inline(always)]
    unsafe fn codes(row: *const u8, g0: usize) -> *const u8 {
        // SAFETY: the row holds the chunk's super-blocks (the `Kind` contract).
        unsafe { row.add(Q6K_BLOCK * (g0 / SUPER_GROUPS)) }
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(blocks: *const u8, _sub: *const u8, n: usize) -> D::Q6 {
        // SAFETY: `blocks` is valid for the chunk's `n / 8` super-blocks and the CPU runs `D`'s
        // ISA (the `Kind` contract).
        unsafe { D::q6_blocks(blocks, n) }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> D::F {
        // SAFETY: as for `KQ6K`, whose codes these are (the `Kind` contract).
        unsafe { KQ6K::isum::<D>(w, x, qsum, hsum) }
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(row: *const u8, _groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        // SAFETY: the row holds the chunk's `n / 8` super-blocks from group `g0` on, and the CPU
        // runs `D`'s ISA (the `Kind` contract).
        unsafe { (D::q6k_scales(Self::codes(row, g0).add(Q6K_D_AT), Q6K_BLOCK, n), <D::F as Lanes16>::zero()) }
    }
    type T<D: IntLanes> = D::T4;
}

/// The chunk of `n` (8 or 16) groups of the super-blocks of `ty` (Q5_K or Q6_K) at `blocks`
/// in the type's int8 layout ([`kquant`]: the codes in the chunked order from byte 0; Q6_K's
/// `[n][2]` sub-block scales at byte `24 n`).
///
/// # Safety
/// `blocks` must be valid for `n / 8` super-blocks, `n` 8 or 16.
#[inline(always)]
pub(super) unsafe fn chunk_from_kquant_blocks(ty: GgmlType, blocks: *const u8, n: usize) -> [u8; 2 * Q6K_BLOCK] {
    let bytes = ty.block_bytes() * (n / SUPER_GROUPS);
    let mut out = [0u8; 2 * Q6K_BLOCK];
    // SAFETY: `blocks` is valid for `bytes` bytes (this function's precondition).
    let ggml = unsafe { std::slice::from_raw_parts(blocks, bytes) };
    kquant::pack_rows(ty, 32 * n, ggml, &mut out[..bytes]);
    out
}

/// [`IntLanes::q5k_blocks`] by packing the chunk into the int8 layout first, then
/// [`IntLanes::q5`].
///
/// # Safety
/// The CPU must run `D`'s ISA, and `blocks` be valid for `n / 8` Q5_K super-blocks, `n` 8 or
/// 16.
#[inline(always)]
pub(super) unsafe fn q5k_by_packing<D: IntLanes>(blocks: *const u8, n: usize) -> D::Q4 {
    // SAFETY: the packed chunk holds the codes `q5` reads (this function's precondition for
    // the rest).
    unsafe { D::q5(chunk_from_kquant_blocks(GgmlType::Q5_K, blocks, n).as_ptr(), n) }
}

/// [`IntLanes::q6_blocks`] by packing the chunk into the int8 layout first, then
/// [`IntLanes::q6`].
///
/// # Safety
/// The CPU must run `D`'s ISA, and `blocks` be valid for `n / 8` Q6_K super-blocks, `n` 8 or
/// 16.
#[inline(always)]
pub(super) unsafe fn q6_by_packing<D: IntLanes>(blocks: *const u8, n: usize) -> D::Q6 {
    // SAFETY: the packed chunk holds the codes and, after them, the sub-block scales `q6`
    // reads (this function's precondition for the rest).
    unsafe {
        let chunk = chunk_from_kquant_blocks(GgmlType::Q6_K, blocks, n);
        D::q6(chunk.as_ptr(), chunk.as_ptr().add(code_bytes(GgmlType::Q6_K) * n), n)
    }
}

/// Q5_0: Q4_0's arithmetic on 5-bit codes `u - 16` ([`super::q5`]: `[G][20]` code bytes,
/// `[G]` f16 `d`).
pub(super) struct KQ5_0;
impl Kind for KQ5_0 {
    const CODE_BYTES: usize = q5::CODE_BYTES;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = Some(4);
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q4;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (w, None)
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::q5(codes, n) }
    }
    /// `sum (u - 16) x = sum u x - 16 sum x`.
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, qsum: *const i32, _hsum: *const i32) -> D::F {
        // SAFETY: `x` and `qsum` are valid for the chunk's bytes and the CPU runs `D`'s ISA
        // (the `Kind` contract).
        unsafe { D::dot_q5(w, x).minus_16_qsum(qsum).to_f32() }
    }
    type T<D: IntLanes> = D::T4;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::t5(codes, n) }
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T4, x: *const i8, sums: *const i32) -> D {
        // SAFETY: `x` and `sums` are valid for the chunk's bytes and the CPU runs `D`'s ISA
        // (the `Kind` contract).
        unsafe { D::dot_t4(w, x).minus_16_qsum(sums) }
    }
}

/// Q5_1: Q4_1's arithmetic on 5-bit codes ([`super::q5`]: `[G][20]` code bytes, `[G]` f16
/// `d`, `[G]` f16 `m`).
pub(super) struct KQ5_1;
impl Kind for KQ5_1 {
    const CODE_BYTES: usize = q5::CODE_BYTES;
    const OFFSET: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q4;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (w, None)
    }
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, _sub: *const u8, n: usize) -> D::Q4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::q5(codes, n) }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q4, x: *const i8, _qsum: *const i32, _hsum: *const i32) -> D::F {
        // SAFETY: `x` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::dot_q5(w, x).to_f32() }
    }
    type T<D: IntLanes> = D::T4;
    #[inline(always)]
    unsafe fn prep_tail<D: IntLanes>(codes: *const u8, n: usize) -> D::T4 {
        // SAFETY: `codes` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::t5(codes, n) }
    }
    #[inline(always)]
    unsafe fn psum<D: IntLanes>(w: &D::T4, x: *const i8, _sums: *const i32) -> D {
        // SAFETY: `x` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { D::dot_t4(w, x) }
    }
}

/// Q3_K: Q6_K's arithmetic on 3-bit codes, the sub-block scales unpacked from ggml's 12
/// bytes per super-block ([`super::kquant_low`]: `[G][12]` code bytes, `[S][12]` scales,
/// `[S]` f16 `d`).
pub(super) struct KQ3K;
impl Kind for KQ3K {
    const HALVES: bool = true;
    const SUPER_BLOCKS: bool = true;
    const CODE_BYTES: usize = kquant_low::CODE_BYTES;
    const OFFSET: bool = false;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    type W<D: IntLanes> = D::Q6;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (&w.0, Some((&w.1, &w.2)))
    }
    #[inline(always)]
    unsafe fn sub_ptr(s: *const u8, _groups: usize, g0: usize) -> *const u8 {
        // SAFETY: `s` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe { s.add(kquant_low::SCALE_BYTES * (g0 / SUPER_GROUPS)) }
    }
    /// `sub`: the packed scales of the chunk's first super-block (the second's follow).
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, sub: *const u8, n: usize) -> D::Q6 {
        // SAFETY: `codes` and `sub` are valid for the chunk's bytes and the CPU runs `D`'s ISA
        // (the `Kind` contract).
        unsafe {
            let mut pairs = [0i8; 32];
            for b in 0..n / SUPER_GROUPS {
                // SAFETY: the row's scales part holds a chunk's (one or two) super-blocks' 12
                // bytes each from `sub` on; a byte array needs no alignment.
                let packed = &*sub.add(kquant_low::SCALE_BYTES * b).cast::<[u8; kquant_low::SCALE_BYTES]>();
                pairs[16 * b..16 * (b + 1)].copy_from_slice(&kquant_low::q3k_scales(packed));
            }
            D::q_low::<true>(codes, pairs.as_ptr().cast(), n)
        }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &D::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> D::F {
        // SAFETY: `x`, `qsum` and `hsum` are valid for the chunk's bytes and the CPU runs `D`'s
        // ISA (the `Kind` contract).
        unsafe { D::dot_q6(w, x, qsum, hsum) }
    }
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        // SAFETY: `s` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe {
            let d = s.add(kquant_low::SCALE_BYTES * (groups / SUPER_GROUPS) + 2 * (g0 / SUPER_GROUPS));
            (D::q6k_scales(d, 2, n), <D::F as Lanes16>::zero())
        }
    }
    type T<D: IntLanes> = D::T4;
}

/// Q2_K: Q6_K's arithmetic on 2-bit codes with 4-bit sub-block scales, and the sub-block
/// minimums in a step of their own ([`crate::kernels::kquant_low`]: `[G][8]` code bytes, `[G][2]`
/// scale bytes `sc | m << 4`, `[S]` f16 `d`, `[S]` f16 `dmin`).
pub(super) struct KQ2K;
impl Kind for KQ2K {
    const HALVES: bool = true;
    const SUPER_BLOCKS: bool = true;
    const CODE_BYTES: usize = Q2K_CODE_BYTES;
    const OFFSET: bool = false;
    const MINS: bool = true;
    const BIAS_LOG2: Option<u32> = None;
    const WORD_PAIRS: bool = false;
    /// (the codes and scales as Q6_K's, `m_0` per lane, `m_1` per lane)
    type W<D: IntLanes> = (D::Q6, [i32; 16], [i32; 16]);
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn vnni_words(w: &Self::W<Vnni>) -> (&[__m512i; 8], Option<(&__m512, &__m512)>) {
        (&w.0 .0, Some((&w.0 .1, &w.0 .2)))
    }
    /// `sub`: the chunk's `[n][2]` scale bytes.
    #[inline(always)]
    unsafe fn prep<D: IntLanes>(codes: *const u8, sub: *const u8, n: usize) -> Self::W<D> {
        // SAFETY: `codes` and `sub` are valid for the chunk's bytes and the CPU runs `D`'s ISA
        // (the `Kind` contract).
        unsafe {
            let (mut scales, mut m0, mut m1) = ([0u8; 32], [0i32; 16], [0i32; 16]);
            for l in 0..n {
                let (a, b) = (*sub.add(2 * l), *sub.add(2 * l + 1));
                scales[2 * l] = a & 0x0F;
                scales[2 * l + 1] = b & 0x0F;
                m0[l] = (a >> 4) as i32;
                m1[l] = (b >> 4) as i32;
            }
            (D::q_low::<false>(codes, scales.as_ptr(), n), m0, m1)
        }
    }
    #[inline(always)]
    unsafe fn isum<D: IntLanes>(w: &Self::W<D>, x: *const i8, qsum: *const i32, hsum: *const i32) -> D::F {
        // SAFETY: `x`, `qsum` and `hsum` are valid for the chunk's bytes and the CPU runs `D`'s
        // ISA (the `Kind` contract).
        unsafe { D::dot_q6(&w.0, x, qsum, hsum) }
    }
    /// `|msum| <= 15 * 32 * 127 = 60960`: exact in i32 and in f32.
    #[inline(always)]
    unsafe fn min_sum<D: IntLanes>(w: &Self::W<D>, qsum: *const i32, hsum: *const i32) -> D::F {
        // SAFETY: `qsum` and `hsum` are valid for the chunk's 16 lanes and the CPU runs `D`'s
        // ISA (the `Kind` contract).
        unsafe {
            let mut v = [0f32; 16];
            for l in 0..16 {
                let (q, h) = (*qsum.add(l), *hsum.add(l));
                v[l] = (w.1[l] * h + w.2[l] * (q - h)) as f32;
            }
            <D::F as Lanes16>::load(v.as_ptr())
        }
    }
    /// `d_w = d`, `m_w = 0 - dmin` of the groups' super-blocks.
    #[inline(always)]
    unsafe fn scales<D: IntLanes>(s: *const u8, groups: usize, g0: usize, n: usize) -> (D::F, D::F) {
        // SAFETY: `s` is valid for the chunk's bytes and the CPU runs `D`'s ISA (the `Kind`
        // contract).
        unsafe {
            let d = s.add(2 * groups + 2 * (g0 / SUPER_GROUPS));
            let dmin = d.add(2 * (groups / SUPER_GROUPS));
            let zero = <D::F as Lanes16>::zero();
            (D::q6k_scales(d, 2, n), <D::F as Lanes16>::sub(zero, D::q6k_scales(dmin, 2, n)))
        }
    }
    type T<D: IntLanes> = D::T4;
}
