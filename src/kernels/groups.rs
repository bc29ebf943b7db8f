//! How each weight type's groups of 32 values enter the 16-lane dot product.
//!
//! Quantized matrices are kept in the *packed* row layout of [`super::packed`]: a row's
//! codes for all its groups, then its f16 scales `d`, then (Q4_1) its f16 offsets `m`.
//! Float matrices (F32, F16, BF16) are used as ggml stores them.
//!
//! Canonical operation order for one weight row against one activation row `x` (length
//! `cols`, a multiple of 32); group `g` covers values `32g .. 32g + 32`, lane `l` holds
//! values `32g + l` (`lo`) and `32g + 16 + l` (`hi`):
//!
//! - weights: float types `w = value`; quantized types `w = d * q`, which is *exact* in f32
//!   (an f16 scale has 11 significant bits, a code at most 8);
//! - two accumulators, `lo = fma(x_lo, w_lo, lo); hi = fma(x_hi, w_hi, hi)` for
//!   g = 0, 1, ... (two independent chains, so the FMA latency is paid once per group);
//! - Q4_1's offset, `sum(x * m) = sum_g m_g S_g` with `S_g` the group sums of
//!   [`super::group_sums`]: a second accumulator over chunks of 16 groups,
//!   `macc = fma(m[16c..16c+16], S[16c..16c+16], macc)` (zero-padded past the last group);
//! - result `reduce(lo + hi)`, plus `reduce(macc)` for Q4_1, with the fixed tree of
//!   [`super::lanes::Lanes16::reduce`].
//!
//! For Q8_0 and Q4_0 this is exactly the dot product with ggml's dequantized weights.

use super::lanes::Lanes16;

/// One weight type's groups of 32 values.
pub trait WeightGroup {
    /// Bytes of codes (or values) per group.
    const CODE_BYTES: usize;
    /// Whether rows carry f16 scales `d` after their codes.
    const SCALED: bool;
    /// Whether rows carry f16 offsets `m` after their scales (Q4_1).
    const OFFSET: bool;
    /// The group's 32 values (float types) or integer codes (quantized types) as two
    /// 16-lane halves, converted exactly.
    unsafe fn unpack<L: Lanes16>(codes: *const u8) -> (L, L);
    /// The group's weights: the values, or `d * code` for quantized types (exact).
    #[inline(always)]
    unsafe fn weights<L: Lanes16>(codes: *const u8, d: L) -> (L, L) {
        let (lo, hi) = Self::unpack::<L>(codes);
        if Self::SCALED {
            (L::mul(d, lo), L::mul(d, hi))
        } else {
            (lo, hi)
        }
    }
}

pub struct F32Group;
impl WeightGroup for F32Group {
    const CODE_BYTES: usize = 128;
    const SCALED: bool = false;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        let f = p.cast::<f32>();
        (L::load(f), L::load(f.add(16)))
    }
}

pub struct F16Group;
impl WeightGroup for F16Group {
    const CODE_BYTES: usize = 64;
    const SCALED: bool = false;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        (L::f16x16(p), L::f16x16(p.add(32)))
    }
}

pub struct Bf16Group;
impl WeightGroup for Bf16Group {
    const CODE_BYTES: usize = 64;
    const SCALED: bool = false;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        (L::bf16x16(p), L::bf16x16(p.add(32)))
    }
}

/// Q8_0 codes: 32 signed bytes.
pub struct Q8_0Group;
impl WeightGroup for Q8_0Group {
    const CODE_BYTES: usize = 32;
    const SCALED: bool = true;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        L::i8x32(p.cast())
    }
}

/// Q4_0 codes: 16 bytes of nibbles, value `q - 8`.
pub struct Q4_0Group;
impl WeightGroup for Q4_0Group {
    const CODE_BYTES: usize = 16;
    const SCALED: bool = true;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        // q - 8 in f32 is exact.
        let (lo, hi) = L::nibbles(p);
        let eight = L::splat(-8.0);
        (L::add(lo, eight), L::add(hi, eight))
    }
    #[inline(always)]
    unsafe fn weights<L: Lanes16>(p: *const u8, d: L) -> (L, L) {
        L::scaled_nibbles::<true>(p, d)
    }
}

/// Q4_1 codes: 16 bytes of nibbles, value `q`.
pub struct Q4_1Group;
impl WeightGroup for Q4_1Group {
    const CODE_BYTES: usize = 16;
    const SCALED: bool = true;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        L::nibbles(p)
    }
    #[inline(always)]
    unsafe fn weights<L: Lanes16>(p: *const u8, d: L) -> (L, L) {
        L::scaled_nibbles::<false>(p, d)
    }
}
