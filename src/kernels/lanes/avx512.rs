//! [`Lanes16`] on one AVX-512 register.

use std::arch::x86_64::*;

use super::avx2::reduce8;
use super::Lanes16;

/// One AVX-512 register.
#[derive(Clone, Copy)]
pub struct Avx512(pub(crate) __m512);

impl Lanes16 for Avx512 {
    const PREFILL_TILE_ROWS: usize = 3;
    const DECODE_TILE_ROWS: usize = 4;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_set1_ps(v)) }
    }
    #[inline(always)]
    unsafe fn splat_f16(b: [u8; 2]) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_cvtph_ps(_mm256_set1_epi16(i16::from_le_bytes(b)))) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C, and `p` is valid for the bytes this
        // method names (the `Lanes16` contract).
        unsafe { Avx512(_mm512_loadu_ps(p)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C, and `p` is valid for the bytes this
        // method names (the `Lanes16` contract).
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_add_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_sub_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_mul_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_div_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn min(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_min_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_max_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn lookup32(table: &[f32; 32], i: Self) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe {
            let (lo, hi) = (_mm512_loadu_ps(table.as_ptr()), _mm512_loadu_ps(table.as_ptr().add(16)));
            // permutex2var reads the low 5 bits of each index: 0-15 from `lo`, 16-31 from `hi`.
            Avx512(_mm512_permutex2var_ps(lo, _mm512_cvtps_epi32(i.0), hi))
        }
    }
    #[inline(always)]
    unsafe fn scale_pow2(p: Self, k: Self) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe {
            let e = _mm512_add_epi32(_mm512_cvtps_epi32(k.0), _mm512_set1_epi32(126));
            let e = _mm512_min_epi32(_mm512_max_epi32(e, _mm512_setzero_si512()), _mm512_set1_epi32(254));
            let scaled = _mm512_mul_ps(p.0, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
            Avx512(_mm512_mul_ps(scaled, _mm512_set1_ps(2.0)))
        }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe { Avx512(_mm512_fmadd_ps(a.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn reduce(self) -> f32 {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C (the `Lanes16` contract).
        unsafe {
            let lo = _mm512_castps512_ps256(self.0);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(self.0), 1));
            reduce8(_mm256_add_ps(lo, hi))
        }
    }
    #[inline(always)]
    unsafe fn nibbles(qs: *const u8) -> (Self, Self) {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C, and `qs` is valid for the bytes
        // this method names (the `Lanes16` contract).
        unsafe {
            let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.cast()));
            let lo = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0F));
            let hi = _mm512_srli_epi32(bytes, 4);
            (Avx512(_mm512_cvtepi32_ps(lo)), Avx512(_mm512_cvtepi32_ps(hi)))
        }
    }
    /// A 16-entry table `d * (k + offset)` and one permute per half instead of two
    /// conversions and two multiplications: the same exact products.
    #[inline(always)]
    unsafe fn scaled_nibbles<const OFFSET8: bool>(qs: *const u8, d: Self) -> (Self, Self) {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C, and `qs` is valid for the bytes
        // this method names (the `Lanes16` contract).
        unsafe {
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
    }
    /// The 16 possible weights computed once (`d * (k + bias) + a`, the same operations
    /// per value) and looked up by one permute per half.
    #[inline(always)]
    unsafe fn nibble_weights(qs: *const u8, bias: f32, d: Self, a: Option<Self>) -> (Self, Self) {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C, and `qs` is valid for the bytes
        // this method names (the `Lanes16` contract).
        unsafe {
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
    }
    #[inline(always)]
    unsafe fn i8x32(qs: *const i8) -> (Self, Self) {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C, and `qs` is valid for the bytes
        // this method names (the `Lanes16` contract).
        unsafe {
            let lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(qs.cast()));
            let hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(qs.add(16).cast()));
            (Avx512(_mm512_cvtepi32_ps(lo)), Avx512(_mm512_cvtepi32_ps(hi)))
        }
    }
    #[inline(always)]
    unsafe fn f16x16(p: *const u8) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C, and `p` is valid for the bytes this
        // method names (the `Lanes16` contract).
        unsafe { Avx512(_mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))) }
    }
    #[inline(always)]
    unsafe fn f16_partial(p: *const u8, n: usize) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C, and `p` is valid for the bytes this
        // method names (the `Lanes16` contract).
        unsafe {
            let mask = ((1u32 << n) - 1) as __mmask16;
            Avx512(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast())))
        }
    }
    #[inline(always)]
    unsafe fn bf16x16(p: *const u8) -> Self {
        // SAFETY: the CPU has AVX-512 (F, BW, VL) and F16C, and `p` is valid for the bytes this
        // method names (the `Lanes16` contract).
        unsafe {
            let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
            Avx512(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)))
        }
    }
}
