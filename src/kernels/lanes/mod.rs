//! The 16-lane vector that every kernel is written against, with one implementation per
//! instruction set. All three perform the same IEEE operations lane by lane (`mul`, fused
//! `fma`, `add`) and reduce with the same tree, so they produce the same bits: the scalar
//! implementation is the twin that the SIMD ones are tested against.
//!
//! Weight unpacking converts small integers or f16/bf16 values to f32, which is exact.

mod scalar;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

pub use scalar::Scalar16;
#[cfg(target_arch = "x86_64")]
pub use avx2::Avx2x2;
#[cfg(target_arch = "x86_64")]
pub use avx512::Avx512;

/// Sixteen f32 lanes.
///
/// # Safety
/// Every method is `unsafe` because the SIMD implementations may only run on a CPU with
/// their features; callers go through [`super::Isa`], which checked them. Methods taking
/// pointers also need them valid for the bytes they name (16 f32, 16 bytes of nibbles, ...).
#[allow(clippy::missing_safety_doc)] // the contract above holds for every method
pub trait Lanes16: Copy {
    /// Weight rows per tile of several tokens (1 to 3): 2 x 4 tokens needs 16 accumulators of
    /// 16 lanes, 3 x 4 tokens 24, which fit AVX-512's 32 registers but not AVX2's 16.
    const PREFILL_TILE_ROWS: usize = 2;
    /// Weight rows per tile of one token (1, 2 or 4): each row's two FMA chains are
    /// independent of the others', so more rows keep more FMAs in flight.
    const DECODE_TILE_ROWS: usize = 1;
    unsafe fn zero() -> Self;
    unsafe fn splat(v: f32) -> Self;
    /// Broadcasts one little-endian f16 (exactly converted).
    unsafe fn splat_f16(b: [u8; 2]) -> Self;
    /// Loads 16 consecutive f32 (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn sub(a: Self, b: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn div(a: Self, b: Self) -> Self;
    /// `if a < b { a } else { b }` lane by lane (x86 `minps`: `b` if either is NaN).
    unsafe fn min(a: Self, b: Self) -> Self;
    /// `if a > b { a } else { b }` lane by lane (x86 `maxps`).
    unsafe fn max(a: Self, b: Self) -> Self;
    /// `table[i]` for each lane's `i`, an integral value in [0, 31].
    unsafe fn lookup32(table: &[f32; 32], i: Self) -> Self;
    /// `(p * 2^(k - 1)) * 2` for integral `k` in [-128, 128]: `p * 2^k`, except that
    /// `2^(k - 1)` is 0 for `k <= -126` (so such results are 0).
    unsafe fn scale_pow2(p: Self, k: Self) -> Self;
    /// `a * b + c` with a single rounding.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// `((l0 + l8) + (l4 + l12)) + ...`: lanes l and l + h added for h = 8, 4, 2, 1.
    unsafe fn reduce(self) -> f32;
    /// 16 bytes of packed nibbles: (low nibbles, high nibbles).
    unsafe fn nibbles(qs: *const u8) -> (Self, Self);
    /// `d * (q + offset)` for the 32 nibbles `q` of `qs` (low nibbles, then high), where
    /// `offset` is 0 or -8 (`OFFSET8`). Every product is exact in f32.
    #[inline(always)]
    unsafe fn scaled_nibbles<const OFFSET8: bool>(qs: *const u8, d: Self) -> (Self, Self) {
        // SAFETY: `qs` is valid for 16 bytes and the CPU runs `Self`'s ISA (this trait's
        // contract).
        unsafe {
            let (mut lo, mut hi) = Self::nibbles(qs);
            if OFFSET8 {
                let eight = Self::splat(-8.0);
                lo = Self::add(lo, eight);
                hi = Self::add(hi, eight);
            }
            (Self::mul(d, lo), Self::mul(d, hi))
        }
    }
    /// `d * (q + bias) + a` (or without `+ a` if `a` is `None`) for the 32 nibbles `q` of
    /// `qs` (low nibbles, then high), `bias` a small integer: `q + bias` and the product are
    /// exact, the addition rounds once (a decoded group type's weights, see `groups`).
    #[inline(always)]
    unsafe fn nibble_weights(qs: *const u8, bias: f32, d: Self, a: Option<Self>) -> (Self, Self) {
        // SAFETY: `qs` is valid for 16 bytes and the CPU runs `Self`'s ISA (this trait's
        // contract).
        unsafe {
            let (mut lo, mut hi) = Self::nibbles(qs);
            if bias != 0.0 {
                let b = Self::splat(bias);
                lo = Self::add(lo, b);
                hi = Self::add(hi, b);
            }
            let (mut lo, mut hi) = (Self::mul(d, lo), Self::mul(d, hi));
            if let Some(a) = a {
                lo = Self::add(lo, a);
                hi = Self::add(hi, a);
            }
            (lo, hi)
        }
    }
    /// 32 signed bytes: (first 16, last 16).
    unsafe fn i8x32(qs: *const i8) -> (Self, Self);
    /// 16 little-endian f16 values.
    unsafe fn f16x16(p: *const u8) -> Self;
    /// The first `n` (1 to 16) of 16 little-endian f16 values; the other lanes are zero.
    #[inline(always)]
    unsafe fn f16_partial(p: *const u8, n: usize) -> Self {
        // SAFETY: `p` is valid for the `2 n` bytes copied (this trait's contract), `padded`
        // holds 32, and the CPU runs `Self`'s ISA.
        unsafe {
            let mut padded = [0u8; 32];
            std::ptr::copy_nonoverlapping(p, padded.as_mut_ptr(), 2 * n);
            Self::f16x16(padded.as_ptr())
        }
    }
    /// 16 little-endian bf16 values.
    unsafe fn bf16x16(p: *const u8) -> Self;
}
