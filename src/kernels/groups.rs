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
//! - result `reduce(lo + hi)`, or `reduce((lo + hi) + macc)` for Q4_1, with the fixed tree of
//!   [`super::lanes::Lanes16::reduce`].
//!
//! For Q8_0 and Q4_0 this is exactly the dot product with ggml's dequantized weights.
//!
//! Decoded group types ([`Groups`]: Q5_1 and the K-quants; Q5_0 is held as Q8_0) carry f32 scales (and
//! offsets) per group or per half-group in the packed row; their weights are
//! `w = scale * code` or `w = scale * code + offset`, one exact multiplication then one
//! rounded addition: ggml's dequantized values bit for bit, so for them too the result is the
//! fused dot product with exactly the dequantized weights (same two chains and tree).

use std::marker::PhantomData;

use super::lanes::Lanes16;

/// One weight type's groups of 32 values.
///
/// # Safety
/// The methods run `L`'s ISA, which the CPU must have (the [`Lanes16`] contract), and take
/// pointers into a packed row, which must be valid for the group they name (`CODE_BYTES` at
/// `codes`; at `row`, a row of `groups` groups with its scales).
pub trait WeightGroup {
    /// Bytes of codes (or values) per group.
    const CODE_BYTES: usize;
    /// Whether rows carry f16 scales `d` after their codes.
    const SCALED: bool;
    /// Whether rows carry f16 offsets `m` after their scales (Q4_1).
    const OFFSET: bool;
    /// Most weight rows per tile of one token (the ISA's [`Lanes16::DECODE_TILE_ROWS`]
    /// caps it): more rows keep more independent FMA chains in flight.
    const DECODE_TILE_ROWS: usize = 4;
    /// Most weight rows per tile of several tokens (the ISA's [`Lanes16::PREFILL_TILE_ROWS`]
    /// caps it). 3 rows x 4 tokens keeps 24 accumulators in registers; that pays for the
    /// float types, whose groups need no unpacking registers, and not for the quantized ones
    /// (`cargo bench --bench kernels -- prefill` compares the two).
    const PREFILL_TILE_ROWS: usize = 2;
    /// Whether a block of many tokens decodes the rows' weights once into f32 and multiplies
    /// them by the float tiles (`kernels::decode_rows`): true where the weights are each
    /// value's whole contribution; not for F32, already decoded, nor for Q4_1, whose offsets
    /// enter through the group sums.
    const DECODED_PREFILL: bool = true;
    /// The group's 32 values (float types) or integer codes (quantized types) as two
    /// 16-lane halves, converted exactly.
    unsafe fn unpack<L: Lanes16>(codes: *const u8) -> (L, L);
    /// The group's weights: the values, or `d * code` for quantized types (exact).
    #[inline(always)]
    unsafe fn weights<L: Lanes16>(codes: *const u8, d: L) -> (L, L) {
        // SAFETY: `codes` is valid for the bytes this method names and the CPU runs `L`'s ISA
        // (the `WeightGroup` contract).
        unsafe {
            let (lo, hi) = Self::unpack::<L>(codes);
            if Self::SCALED {
                (L::mul(d, lo), L::mul(d, hi))
            } else {
                (lo, hi)
            }
        }
    }
    /// The weights of group `g` of a packed row of `groups` groups at `row` (`d`: its f16
    /// scale if `SCALED`).
    #[inline(always)]
    unsafe fn weights_at<L: Lanes16>(row: *const u8, _groups: usize, g: usize, d: L) -> (L, L) {
        // SAFETY: `row` is valid for the bytes this method names and the CPU runs `L`'s ISA
        // (the `WeightGroup` contract).
        unsafe { Self::weights::<L>(row.add(g * Self::CODE_BYTES), d) }
    }
}

pub struct F32Group;
impl WeightGroup for F32Group {
    const CODE_BYTES: usize = 128;
    const PREFILL_TILE_ROWS: usize = 3;
    const DECODED_PREFILL: bool = false;
    const SCALED: bool = false;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        // SAFETY: `p` is valid for the bytes this method names and the CPU runs `L`'s ISA (the
        // `WeightGroup` contract).
        unsafe {
            let f = p.cast::<f32>();
            (L::load(f), L::load(f.add(16)))
        }
    }
}

pub struct F16Group;
impl WeightGroup for F16Group {
    const CODE_BYTES: usize = 64;
    const PREFILL_TILE_ROWS: usize = 3;
    const SCALED: bool = false;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        // SAFETY: `p` is valid for the bytes this method names and the CPU runs `L`'s ISA (the
        // `WeightGroup` contract).
        unsafe { (L::f16x16(p), L::f16x16(p.add(32))) }
    }
}

pub struct Bf16Group;
impl WeightGroup for Bf16Group {
    const CODE_BYTES: usize = 64;
    const PREFILL_TILE_ROWS: usize = 3;
    const SCALED: bool = false;
    const OFFSET: bool = false;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        // SAFETY: `p` is valid for the bytes this method names and the CPU runs `L`'s ISA (the
        // `WeightGroup` contract).
        unsafe { (L::bf16x16(p), L::bf16x16(p.add(32))) }
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
        // SAFETY: `p` is valid for the bytes this method names and the CPU runs `L`'s ISA (the
        // `WeightGroup` contract).
        unsafe { L::i8x32(p.cast()) }
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
        // SAFETY: `p` is valid for the bytes this method names and the CPU runs `L`'s ISA (the
        // `WeightGroup` contract).
        unsafe {
            // q - 8 in f32 is exact.
            let (lo, hi) = L::nibbles(p);
            let eight = L::splat(-8.0);
            (L::add(lo, eight), L::add(hi, eight))
        }
    }
    #[inline(always)]
    unsafe fn weights<L: Lanes16>(p: *const u8, d: L) -> (L, L) {
        // SAFETY: `p` is valid for the bytes this method names and the CPU runs `L`'s ISA (the
        // `WeightGroup` contract).
        unsafe { L::scaled_nibbles::<true>(p, d) }
    }
}

/// Q4_1 codes: 16 bytes of nibbles, value `q`.
pub struct Q4_1Group;
impl WeightGroup for Q4_1Group {
    const CODE_BYTES: usize = 16;
    const SCALED: bool = true;
    const OFFSET: bool = true;
    const DECODED_PREFILL: bool = false;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        // SAFETY: `p` is valid for the bytes this method names and the CPU runs `L`'s ISA (the
        // `WeightGroup` contract).
        unsafe { L::nibbles(p) }
    }
    #[inline(always)]
    unsafe fn weights<L: Lanes16>(p: *const u8, d: L) -> (L, L) {
        // SAFETY: `p` is valid for the bytes this method names and the CPU runs `L`'s ISA (the
        // `WeightGroup` contract).
        unsafe { L::scaled_nibbles::<false>(p, d) }
    }
}

/// How a decoded group type's 32 codes are stored (see `tensor::Codes`).
///
/// # Safety
/// The methods run `L`'s ISA, which the CPU must have (the [`Lanes16`] contract), and read
/// the group's `CODE_BYTES` code bytes at `p`, which must be valid for them.
pub trait CodeForm {
    const CODE_BYTES: usize;
    /// The codes as two exact 16-lane halves.
    unsafe fn codes<L: Lanes16>(p: *const u8) -> (L, L);
    /// `d * code (+ a)` with one scale (and offset) for all 32 codes.
    #[inline(always)]
    unsafe fn weights<L: Lanes16>(p: *const u8, d: L, a: Option<L>) -> (L, L) {
        // SAFETY: `p` is valid for the group's codes and the CPU runs `L`'s ISA (the `CodeForm`
        // contract).
        unsafe {
            let (lo, hi) = Self::codes::<L>(p);
            let (lo, hi) = (L::mul(d, lo), L::mul(d, hi));
            match a {
                Some(a) => (L::add(lo, a), L::add(hi, a)),
                None => (lo, hi),
            }
        }
    }
}

/// One signed byte per code.
pub struct I8Codes;
impl CodeForm for I8Codes {
    const CODE_BYTES: usize = 32;
    #[inline(always)]
    unsafe fn codes<L: Lanes16>(p: *const u8) -> (L, L) {
        // SAFETY: `p` is valid for 32 bytes and the CPU runs `L`'s ISA (the `CodeForm`
        // contract).
        unsafe { L::i8x32(p.cast()) }
    }
}

/// Nibbles plus `BIAS` (Q4_0's order); the addition of a small integer is exact.
pub struct NibbleCodes<const BIAS: i8>;
impl<const BIAS: i8> CodeForm for NibbleCodes<BIAS> {
    const CODE_BYTES: usize = 16;
    #[inline(always)]
    unsafe fn codes<L: Lanes16>(p: *const u8) -> (L, L) {
        // SAFETY: `p` is valid for 16 bytes and the CPU runs `L`'s ISA (the `CodeForm`
        // contract).
        unsafe {
            let (lo, hi) = L::nibbles(p);
            if BIAS == 0 {
                (lo, hi)
            } else {
                let b = L::splat(BIAS as f32);
                (L::add(lo, b), L::add(hi, b))
            }
        }
    }
    #[inline(always)]
    unsafe fn weights<L: Lanes16>(p: *const u8, d: L, a: Option<L>) -> (L, L) {
        // SAFETY: `p` is valid for 16 bytes and the CPU runs `L`'s ISA (the `CodeForm`
        // contract).
        unsafe { L::nibble_weights(p, BIAS as f32, d, a) }
    }
}

/// A decoded group type (`kernels::packed`, group layout): codes `C`, f32 scales per half
/// (`HALVES`) or per group, f32 offsets if `OFFSET`.
pub struct Groups<C, const HALVES: bool, const OFFSET: bool>(PhantomData<C>);
impl<C: CodeForm, const HALVES: bool, const OFFSET: bool> WeightGroup for Groups<C, HALVES, OFFSET> {
    const CODE_BYTES: usize = C::CODE_BYTES;
    // The scales are f32 and read per group below, not the f16 chunks of `SCALED` types;
    // the offsets are part of each weight, not Q4_1's group-sum term.
    const SCALED: bool = false;
    const OFFSET: bool = false;
    // Measured on Zen 4: no gain from more rows (Q6_K loses 10% with 4), as the per-group
    // scale loads already fill the gaps.
    const DECODE_TILE_ROWS: usize = 1;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        // SAFETY: `p` is valid for the bytes this method names and the CPU runs `L`'s ISA (the
        // `WeightGroup` contract).
        unsafe { C::codes::<L>(p) }
    }
    #[inline(always)]
    unsafe fn weights_at<L: Lanes16>(row: *const u8, groups: usize, g: usize, _d: L) -> (L, L) {
        // SAFETY: `row` is valid for the bytes this method names and the CPU runs `L`'s ISA
        // (the `WeightGroup` contract).
        unsafe {
            let codes = row.add(g * C::CODE_BYTES);
            let s = if HALVES { 2 } else { 1 };
            // Native-endian f32 scales for all groups, then the offsets.
            let base = row.add(groups * C::CODE_BYTES).cast::<f32>();
            if !HALVES {
                let d = L::splat(base.add(g).read_unaligned());
                let a = if OFFSET { Some(L::splat(base.add(groups + g).read_unaligned())) } else { None };
                return C::weights::<L>(codes, d, a);
            }
            let (lo, hi) = C::codes::<L>(codes);
            let scales = base.add(g * s);
            let (d_lo, d_hi) = (scales.read_unaligned(), scales.add(s - 1).read_unaligned());
            let (mut w_lo, mut w_hi) = (L::mul(L::splat(d_lo), lo), L::mul(L::splat(d_hi), hi));
            if OFFSET {
                let m = base.add(groups * s + g * s);
                w_lo = L::add(w_lo, L::splat(m.read_unaligned()));
                w_hi = L::add(w_hi, L::splat(m.add(s - 1).read_unaligned()));
            }
            (w_lo, w_hi)
        }
    }
}
