//! The 16-lane vector that every kernel is written against, with one implementation per
//! instruction set. All three perform the same IEEE operations lane by lane (`mul`, fused
//! `fma`, `add`) and reduce with the same tree, so they produce the same bits: the scalar
//! implementation is the twin that the SIMD ones are tested against.
//!
//! Weight unpacking converts small integers or f16/bf16 values to f32, which is exact.

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
        let (mut lo, mut hi) = Self::nibbles(qs);
        if OFFSET8 {
            let eight = Self::splat(-8.0);
            lo = Self::add(lo, eight);
            hi = Self::add(hi, eight);
        }
        (Self::mul(d, lo), Self::mul(d, hi))
    }
    /// `d * (q + bias) + a` (or without `+ a` if `a` is `None`) for the 32 nibbles `q` of
    /// `qs` (low nibbles, then high), `bias` a small integer: `q + bias` and the product are
    /// exact, the addition rounds once (a decoded group type's weights, see `groups`).
    #[inline(always)]
    unsafe fn nibble_weights(qs: *const u8, bias: f32, d: Self, a: Option<Self>) -> (Self, Self) {
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
    /// 32 signed bytes: (first 16, last 16).
    unsafe fn i8x32(qs: *const i8) -> (Self, Self);
    /// 16 little-endian f16 values.
    unsafe fn f16x16(p: *const u8) -> Self;
    /// The first `n` (1 to 16) of 16 little-endian f16 values; the other lanes are zero.
    #[inline(always)]
    unsafe fn f16_partial(p: *const u8, n: usize) -> Self {
        let mut padded = [0u8; 32];
        std::ptr::copy_nonoverlapping(p, padded.as_mut_ptr(), 2 * n);
        Self::f16x16(padded.as_ptr())
    }
    /// 16 little-endian bf16 values.
    unsafe fn bf16x16(p: *const u8) -> Self;
}

/// The portable twin: plain arrays and `f32::mul_add`.
#[derive(Clone, Copy)]
pub struct Scalar16(pub(crate) [f32; 16]);

impl Lanes16 for Scalar16 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        Scalar16([0.0; 16])
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Scalar16([v; 16])
    }
    #[inline(always)]
    unsafe fn splat_f16(b: [u8; 2]) -> Self {
        Scalar16([half::f16::from_le_bytes(b).to_f32(); 16])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Scalar16(std::ptr::read_unaligned(p.cast::<[f32; 16]>()))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        std::ptr::write_unaligned(p.cast::<[f32; 16]>(), self.0)
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        Scalar16(std::array::from_fn(|l| a.0[l] + b.0[l]))
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        Scalar16(std::array::from_fn(|l| a.0[l] - b.0[l]))
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        Scalar16(std::array::from_fn(|l| a.0[l] * b.0[l]))
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        Scalar16(std::array::from_fn(|l| a.0[l] / b.0[l]))
    }
    #[inline(always)]
    unsafe fn min(a: Self, b: Self) -> Self {
        Scalar16(std::array::from_fn(|l| if a.0[l] < b.0[l] { a.0[l] } else { b.0[l] }))
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        Scalar16(std::array::from_fn(|l| if a.0[l] > b.0[l] { a.0[l] } else { b.0[l] }))
    }
    #[inline(always)]
    unsafe fn lookup32(table: &[f32; 32], i: Self) -> Self {
        Scalar16(std::array::from_fn(|l| table[(i.0[l] as usize) & 31]))
    }
    #[inline(always)]
    unsafe fn scale_pow2(p: Self, k: Self) -> Self {
        Scalar16(std::array::from_fn(|l| {
            let bits = ((k.0[l] as i32).wrapping_add(126)).clamp(0, 254) as u32;
            (p.0[l] * f32::from_bits(bits << 23)) * 2.0
        }))
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        Scalar16(std::array::from_fn(|l| a.0[l].mul_add(b.0[l], c.0[l])))
    }
    #[inline(always)]
    unsafe fn reduce(self) -> f32 {
        let mut v = self.0;
        for h in [8, 4, 2, 1] {
            for l in 0..h {
                v[l] += v[l + h];
            }
        }
        v[0]
    }
    #[inline(always)]
    unsafe fn nibbles(qs: *const u8) -> (Self, Self) {
        let q = std::ptr::read_unaligned(qs.cast::<[u8; 16]>());
        (
            Scalar16(std::array::from_fn(|l| (q[l] & 0x0F) as f32)),
            Scalar16(std::array::from_fn(|l| (q[l] >> 4) as f32)),
        )
    }
    #[inline(always)]
    unsafe fn i8x32(qs: *const i8) -> (Self, Self) {
        let q = std::ptr::read_unaligned(qs.cast::<[i8; 32]>());
        (
            Scalar16(std::array::from_fn(|l| q[l] as f32)),
            Scalar16(std::array::from_fn(|l| q[l + 16] as f32)),
        )
    }
    #[inline(always)]
    unsafe fn f16x16(p: *const u8) -> Self {
        let b = std::ptr::read_unaligned(p.cast::<[[u8; 2]; 16]>());
        Scalar16(std::array::from_fn(|l| half::f16::from_le_bytes(b[l]).to_f32()))
    }
    #[inline(always)]
    unsafe fn bf16x16(p: *const u8) -> Self {
        let b = std::ptr::read_unaligned(p.cast::<[[u8; 2]; 16]>());
        Scalar16(std::array::from_fn(|l| half::bf16::from_le_bytes(b[l]).to_f32()))
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2x2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Lanes16;
    use std::arch::x86_64::*;

    /// One AVX-512 register.
    #[derive(Clone, Copy)]
    pub struct Avx512(pub(crate) __m512);

    impl Lanes16 for Avx512 {
        const PREFILL_TILE_ROWS: usize = 3;
        const DECODE_TILE_ROWS: usize = 4;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Avx512(_mm512_setzero_ps())
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            Avx512(_mm512_set1_ps(v))
        }
        #[inline(always)]
        unsafe fn splat_f16(b: [u8; 2]) -> Self {
            Avx512(_mm512_cvtph_ps(_mm256_set1_epi16(i16::from_le_bytes(b))))
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Avx512(_mm512_loadu_ps(p))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm512_storeu_ps(p, self.0)
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            Avx512(_mm512_add_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn sub(a: Self, b: Self) -> Self {
            Avx512(_mm512_sub_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Avx512(_mm512_mul_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn div(a: Self, b: Self) -> Self {
            Avx512(_mm512_div_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn min(a: Self, b: Self) -> Self {
            Avx512(_mm512_min_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn max(a: Self, b: Self) -> Self {
            Avx512(_mm512_max_ps(a.0, b.0))
        }
        #[inline(always)]
        unsafe fn lookup32(table: &[f32; 32], i: Self) -> Self {
            let (lo, hi) = (_mm512_loadu_ps(table.as_ptr()), _mm512_loadu_ps(table.as_ptr().add(16)));
            // permutex2var reads the low 5 bits of each index: 0-15 from `lo`, 16-31 from `hi`.
            Avx512(_mm512_permutex2var_ps(lo, _mm512_cvtps_epi32(i.0), hi))
        }
        #[inline(always)]
        unsafe fn scale_pow2(p: Self, k: Self) -> Self {
            let e = _mm512_add_epi32(_mm512_cvtps_epi32(k.0), _mm512_set1_epi32(126));
            let e = _mm512_min_epi32(_mm512_max_epi32(e, _mm512_setzero_si512()), _mm512_set1_epi32(254));
            let scaled = _mm512_mul_ps(p.0, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
            Avx512(_mm512_mul_ps(scaled, _mm512_set1_ps(2.0)))
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Avx512(_mm512_fmadd_ps(a.0, b.0, c.0))
        }
        #[inline(always)]
        unsafe fn reduce(self) -> f32 {
            let lo = _mm512_castps512_ps256(self.0);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(self.0), 1));
            reduce8(_mm256_add_ps(lo, hi))
        }
        #[inline(always)]
        unsafe fn nibbles(qs: *const u8) -> (Self, Self) {
            let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.cast()));
            let lo = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0F));
            let hi = _mm512_srli_epi32(bytes, 4);
            (Avx512(_mm512_cvtepi32_ps(lo)), Avx512(_mm512_cvtepi32_ps(hi)))
        }
        /// A 16-entry table `d * (k + offset)` and one permute per half instead of two
        /// conversions and two multiplications: the same exact products.
        #[inline(always)]
        unsafe fn scaled_nibbles<const OFFSET8: bool>(qs: *const u8, d: Self) -> (Self, Self) {
            let base = if OFFSET8 { -8.0 } else { 0.0 };
            let iota = _mm512_setr_ps(
                base, base + 1.0, base + 2.0, base + 3.0, base + 4.0, base + 5.0, base + 6.0, base + 7.0,
                base + 8.0, base + 9.0, base + 10.0, base + 11.0, base + 12.0, base + 13.0, base + 14.0, base + 15.0,
            );
            let table = _mm512_mul_ps(d.0, iota);
            let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.cast()));
            // permutexvar reads only the low 4 bits of each index.
            (
                Avx512(_mm512_permutexvar_ps(bytes, table)),
                Avx512(_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table)),
            )
        }
        /// The 16 possible weights computed once (`d * (k + bias) + a`, the same operations
        /// per value) and looked up by one permute per half.
        #[inline(always)]
        unsafe fn nibble_weights(qs: *const u8, bias: f32, d: Self, a: Option<Self>) -> (Self, Self) {
            let iota = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
            );
            let k = if bias != 0.0 { _mm512_add_ps(iota, _mm512_set1_ps(bias)) } else { iota };
            let mut table = _mm512_mul_ps(d.0, k);
            if let Some(a) = a {
                table = _mm512_add_ps(table, a.0);
            }
            let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.cast()));
            (
                Avx512(_mm512_permutexvar_ps(bytes, table)),
                Avx512(_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table)),
            )
        }
        #[inline(always)]
        unsafe fn i8x32(qs: *const i8) -> (Self, Self) {
            let lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(qs.cast()));
            let hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(qs.add(16).cast()));
            (Avx512(_mm512_cvtepi32_ps(lo)), Avx512(_mm512_cvtepi32_ps(hi)))
        }
        #[inline(always)]
        unsafe fn f16x16(p: *const u8) -> Self {
            Avx512(_mm512_cvtph_ps(_mm256_loadu_si256(p.cast())))
        }
        #[inline(always)]
        unsafe fn f16_partial(p: *const u8, n: usize) -> Self {
            let mask = ((1u32 << n) - 1) as __mmask16;
            Avx512(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast())))
        }
        #[inline(always)]
        unsafe fn bf16x16(p: *const u8) -> Self {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            Avx512(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)))
        }
    }

    /// Two AVX2 registers: lanes 0..8 and 8..16.
    #[derive(Clone, Copy)]
    pub struct Avx2x2(pub(crate) __m256, pub(crate) __m256);

    impl Lanes16 for Avx2x2 {
        const PREFILL_TILE_ROWS: usize = 1;
        const DECODE_TILE_ROWS: usize = 2;
        #[inline(always)]
        unsafe fn zero() -> Self {
            Avx2x2(_mm256_setzero_ps(), _mm256_setzero_ps())
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            let s = _mm256_set1_ps(v);
            Avx2x2(s, s)
        }
        #[inline(always)]
        unsafe fn splat_f16(b: [u8; 2]) -> Self {
            let s = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(b) as i32)));
            Avx2x2(s, s)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Avx2x2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self.0);
            _mm256_storeu_ps(p.add(8), self.1);
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            Avx2x2(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1))
        }
        #[inline(always)]
        unsafe fn sub(a: Self, b: Self) -> Self {
            Avx2x2(_mm256_sub_ps(a.0, b.0), _mm256_sub_ps(a.1, b.1))
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Avx2x2(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1))
        }
        #[inline(always)]
        unsafe fn div(a: Self, b: Self) -> Self {
            Avx2x2(_mm256_div_ps(a.0, b.0), _mm256_div_ps(a.1, b.1))
        }
        #[inline(always)]
        unsafe fn min(a: Self, b: Self) -> Self {
            Avx2x2(_mm256_min_ps(a.0, b.0), _mm256_min_ps(a.1, b.1))
        }
        #[inline(always)]
        unsafe fn max(a: Self, b: Self) -> Self {
            Avx2x2(_mm256_max_ps(a.0, b.0), _mm256_max_ps(a.1, b.1))
        }
        #[inline(always)]
        unsafe fn lookup32(table: &[f32; 32], i: Self) -> Self {
            Avx2x2(lookup32_8(table, i.0), lookup32_8(table, i.1))
        }
        #[inline(always)]
        unsafe fn scale_pow2(p: Self, k: Self) -> Self {
            Avx2x2(scale_pow2_8(p.0, k.0), scale_pow2_8(p.1, k.1))
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Avx2x2(_mm256_fmadd_ps(a.0, b.0, c.0), _mm256_fmadd_ps(a.1, b.1, c.1))
        }
        #[inline(always)]
        unsafe fn reduce(self) -> f32 {
            reduce8(_mm256_add_ps(self.0, self.1))
        }
        #[inline(always)]
        unsafe fn nibbles(qs: *const u8) -> (Self, Self) {
            let q = _mm_loadu_si128(qs.cast());
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(q, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
            (u8x16(lo), u8x16(hi))
        }
        #[inline(always)]
        unsafe fn i8x32(qs: *const i8) -> (Self, Self) {
            (i8x16(qs), i8x16(qs.add(16)))
        }
        #[inline(always)]
        unsafe fn f16x16(p: *const u8) -> Self {
            Avx2x2(_mm256_cvtph_ps(_mm_loadu_si128(p.cast())), _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())))
        }
        #[inline(always)]
        unsafe fn bf16x16(p: *const u8) -> Self {
            Avx2x2(bf16x8(p), bf16x8(p.add(16)))
        }
    }

    // Helpers as functions, not closures: a closure would not inherit the target features of
    // the kernel it is called from, and its intrinsics would not inline.

    /// 16 bytes (values 0..255) to two times 8 f32.
    #[inline(always)]
    unsafe fn u8x16(v: __m128i) -> Avx2x2 {
        let a = _mm256_cvtepu8_epi32(v);
        let b = _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8));
        Avx2x2(_mm256_cvtepi32_ps(a), _mm256_cvtepi32_ps(b))
    }

    /// 16 signed bytes at `p` to two times 8 f32.
    #[inline(always)]
    unsafe fn i8x16(p: *const i8) -> Avx2x2 {
        let v = _mm_loadu_si128(p.cast());
        Avx2x2(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))))
    }

    /// 8 bf16 at `p` to f32.
    #[inline(always)]
    unsafe fn bf16x8(p: *const u8) -> __m256 {
        let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
    }

    /// `table[i]` for 8 lanes of integral `i` in [0, 31]: permutevar8x32 reads the low 3
    /// bits, bits 3 and 4 pick the quarter.
    #[inline(always)]
    unsafe fn lookup32_8(table: &[f32; 32], i: __m256) -> __m256 {
        let idx = _mm256_cvtps_epi32(i);
        let t = table.as_ptr();
        let (v0, v1) = (_mm256_permutevar8x32_ps(_mm256_loadu_ps(t), idx), _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.add(8)), idx));
        let (v2, v3) = (_mm256_permutevar8x32_ps(_mm256_loadu_ps(t.add(16)), idx), _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.add(24)), idx));
        let bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
        let bit4 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 27));
        _mm256_blendv_ps(_mm256_blendv_ps(v0, v1, bit3), _mm256_blendv_ps(v2, v3, bit3), bit4)
    }

    /// [`Lanes16::scale_pow2`] on 8 lanes.
    #[inline(always)]
    unsafe fn scale_pow2_8(p: __m256, k: __m256) -> __m256 {
        let e = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(126));
        let e = _mm256_min_epi32(_mm256_max_epi32(e, _mm256_setzero_si256()), _mm256_set1_epi32(254));
        let scaled = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
        _mm256_mul_ps(scaled, _mm256_set1_ps(2.0))
    }

    /// Lanes l + l+4, then l + l+2, then l + l+1 of an 8-lane partial sum.
    #[inline(always)]
    unsafe fn reduce8(v: __m256) -> f32 {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
        _mm_cvtss_f32(s1)
    }
}
