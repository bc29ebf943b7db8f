//! How each weight type's groups of 32 values enter the 16-lane dot product.
//!
//! Canonical operation order for one weight row `w` against an activation row `x` (both of
//! length `cols`, a multiple of 32), group `g` covering values `32g .. 32g + 32`, lane `l`
//! holding values `32g + l` and `32g + 16 + l`:
//!
//! - F32 / F16 / BF16 (`Plain`): `acc = fma(x_lo, w_lo, acc); acc = fma(x_hi, w_hi, acc)`
//! - Q8_0, Q4_0 (`Scaled`): `s = x_lo * q_lo; s = fma(x_hi, q_hi, s); acc = fma(d, s, acc)`
//! - Q4_1 (`ScaledMin`): as `Scaled`, then `acc = fma(m, xs, acc)` where
//!   `xs = x_lo + x_hi` is the per-lane sum of the activations (see [`super::lane_sums`]),
//!   because `sum(x * (d q + m)) = d sum(x q) + m sum(x)`.
//!
//! and finally the fixed 16-lane reduction tree of [`super::lanes::Lanes16::reduce`].

use super::lanes::Lanes16;

/// How a group's partial products are folded into the accumulator.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Fold {
    Plain,
    Scaled,
    ScaledMin,
}

/// One weight type's group of 32 values, `BYTES` long in memory.
pub trait WeightGroup {
    const BYTES: usize;
    const FOLD: Fold;
    /// The 32 weights (or their integer codes, for quantized types) as two 16-lane halves.
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L);
    /// The scale `d` (only for `Scaled` and `ScaledMin`).
    #[inline(always)]
    unsafe fn scale<L: Lanes16>(_p: *const u8) -> L {
        unreachable!("plain groups have no scale")
    }
    /// The offset `m` (only for `ScaledMin`).
    #[inline(always)]
    unsafe fn min<L: Lanes16>(_p: *const u8) -> L {
        unreachable!("only Q4_1 has an offset")
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> [u8; 2] {
    [*p, *p.add(1)]
}

pub struct F32Group;
impl WeightGroup for F32Group {
    const BYTES: usize = 128;
    const FOLD: Fold = Fold::Plain;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        let f = p.cast::<f32>();
        (L::load(f), L::load(f.add(16)))
    }
}

pub struct F16Group;
impl WeightGroup for F16Group {
    const BYTES: usize = 64;
    const FOLD: Fold = Fold::Plain;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        (L::f16x16(p), L::f16x16(p.add(32)))
    }
}

pub struct Bf16Group;
impl WeightGroup for Bf16Group {
    const BYTES: usize = 64;
    const FOLD: Fold = Fold::Plain;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        (L::bf16x16(p), L::bf16x16(p.add(32)))
    }
}

/// `BlockQ8_0`: f16 d, 32 x i8.
pub struct Q8_0Group;
impl WeightGroup for Q8_0Group {
    const BYTES: usize = 34;
    const FOLD: Fold = Fold::Scaled;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        L::i8x32(p.add(2).cast())
    }
    #[inline(always)]
    unsafe fn scale<L: Lanes16>(p: *const u8) -> L {
        L::splat_f16(f16_at(p))
    }
}

/// `BlockQ4_0`: f16 d, 16 bytes of nibbles, code q - 8.
pub struct Q4_0Group;
impl WeightGroup for Q4_0Group {
    const BYTES: usize = 18;
    const FOLD: Fold = Fold::Scaled;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        L::nibbles(p.add(2), -8)
    }
    #[inline(always)]
    unsafe fn scale<L: Lanes16>(p: *const u8) -> L {
        L::splat_f16(f16_at(p))
    }
}

/// `BlockQ4_1`: f16 d, f16 m, 16 bytes of nibbles.
pub struct Q4_1Group;
impl WeightGroup for Q4_1Group {
    const BYTES: usize = 20;
    const FOLD: Fold = Fold::ScaledMin;
    #[inline(always)]
    unsafe fn unpack<L: Lanes16>(p: *const u8) -> (L, L) {
        L::nibbles(p.add(4), 0)
    }
    #[inline(always)]
    unsafe fn scale<L: Lanes16>(p: *const u8) -> L {
        L::splat_f16(f16_at(p))
    }
    #[inline(always)]
    unsafe fn min<L: Lanes16>(p: *const u8) -> L {
        L::splat_f16(f16_at(p.add(2)))
    }
}
