//! [`Lanes16`] on two AVX2 registers.

use std::arch::x86_64::*;

use super::Lanes16;

/// Two AVX2 registers: lanes 0..8 and 8..16.
#[derive(Clone, Copy)]
pub struct Avx2x2(pub(crate) __m256, pub(crate) __m256);

impl Lanes16 for Avx2x2 {
    const PREFILL_TILE_ROWS: usize = 1;
    const DECODE_TILE_ROWS: usize = 2;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_setzero_ps(), _mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe {
            let s = _mm256_set1_ps(v);
            Avx2x2(s, s)
        }
    }
    #[inline(always)]
    unsafe fn splat_f16(b: [u8; 2]) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe {
            let s = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(b) as i32)));
            Avx2x2(s, s)
        }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `p` is valid for the bytes this method
        // names (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `p` is valid for the bytes this method
        // names (the `Lanes16` contract).
        unsafe {
            _mm256_storeu_ps(p, self.0);
            _mm256_storeu_ps(p.add(8), self.1);
        }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_sub_ps(a.0, b.0), _mm256_sub_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_div_ps(a.0, b.0), _mm256_div_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn min(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_min_ps(a.0, b.0), _mm256_min_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_max_ps(a.0, b.0), _mm256_max_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn lookup32(table: &[f32; 32], i: Self) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(lookup32_8(table, i.0), lookup32_8(table, i.1)) }
    }
    #[inline(always)]
    unsafe fn scale_pow2(p: Self, k: Self) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(scale_pow2_8(p.0, k.0), scale_pow2_8(p.1, k.1)) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_fmadd_ps(a.0, b.0, c.0), _mm256_fmadd_ps(a.1, b.1, c.1)) }
    }
    #[inline(always)]
    unsafe fn reduce(self) -> f32 {
        // SAFETY: the CPU has AVX2, FMA and F16C (the `Lanes16` contract).
        unsafe { reduce8(_mm256_add_ps(self.0, self.1)) }
    }
    #[inline(always)]
    unsafe fn nibbles(qs: *const u8) -> (Self, Self) {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `qs` is valid for the bytes this method
        // names (the `Lanes16` contract).
        unsafe {
            let q = _mm_loadu_si128(qs.cast());
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(q, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
            (u8x16(lo), u8x16(hi))
        }
    }
    #[inline(always)]
    unsafe fn i8x32(qs: *const i8) -> (Self, Self) {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `qs` is valid for the bytes this method
        // names (the `Lanes16` contract).
        unsafe { (i8x16(qs), i8x16(qs.add(16))) }
    }
    #[inline(always)]
    unsafe fn f16x16(p: *const u8) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `p` is valid for the bytes this method
        // names (the `Lanes16` contract).
        unsafe { Avx2x2(_mm256_cvtph_ps(_mm_loadu_si128(p.cast())), _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast()))) }
    }
    #[inline(always)]
    unsafe fn bf16x16(p: *const u8) -> Self {
        // SAFETY: the CPU has AVX2, FMA and F16C, and `p` is valid for the bytes this method
        // names (the `Lanes16` contract).
        unsafe { Avx2x2(bf16x8(p), bf16x8(p.add(16))) }
    }
}

// Helpers as functions, not closures: a closure would not inherit the target features of
// the kernel it is called from, and its intrinsics would not inline.

/// 16 bytes (values 0..255) to two times 8 f32.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn u8x16(v: __m128i) -> Avx2x2 {
    // SAFETY: the CPU has AVX2 (this function's precondition).
    unsafe {
        let a = _mm256_cvtepu8_epi32(v);
        let b = _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8));
        Avx2x2(_mm256_cvtepi32_ps(a), _mm256_cvtepi32_ps(b))
    }
}

/// 16 signed bytes at `p` to two times 8 f32.
///
/// # Safety
/// The CPU must have AVX2, and `p` be valid for 16 bytes.
#[inline(always)]
unsafe fn i8x16(p: *const i8) -> Avx2x2 {
    // SAFETY: the CPU has AVX2 and `p` is valid for 16 bytes (this function's precondition).
    unsafe {
        let v = _mm_loadu_si128(p.cast());
        Avx2x2(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))))
    }
}

/// 8 bf16 at `p` to f32.
///
/// # Safety
/// The CPU must have AVX2, and `p` be valid for 16 bytes.
#[inline(always)]
unsafe fn bf16x8(p: *const u8) -> __m256 {
    // SAFETY: the CPU has AVX2 and `p` is valid for 16 bytes (this function's precondition).
    unsafe {
        let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))
    }
}

/// `table[i]` for 8 lanes of integral `i` in [0, 31]: permutevar8x32 reads the low 3
/// bits, bits 3 and 4 pick the quarter.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn lookup32_8(table: &[f32; 32], i: __m256) -> __m256 {
    // SAFETY: the CPU has AVX2 (this function's precondition); the four loads read `table`'s 32
    // values.
    unsafe {
        let idx = _mm256_cvtps_epi32(i);
        let t = table.as_ptr();
        let (v0, v1) = (_mm256_permutevar8x32_ps(_mm256_loadu_ps(t), idx), _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.add(8)), idx));
        let (v2, v3) = (_mm256_permutevar8x32_ps(_mm256_loadu_ps(t.add(16)), idx), _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.add(24)), idx));
        let bit3 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
        let bit4 = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 27));
        _mm256_blendv_ps(_mm256_blendv_ps(v0, v1, bit3), _mm256_blendv_ps(v2, v3, bit3), bit4)
    }
}

/// [`Lanes16::scale_pow2`] on 8 lanes.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn scale_pow2_8(p: __m256, k: __m256) -> __m256 {
    // SAFETY: the CPU has AVX2 (this function's precondition).
    unsafe {
        let e = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(126));
        let e = _mm256_min_epi32(_mm256_max_epi32(e, _mm256_setzero_si256()), _mm256_set1_epi32(254));
        let scaled = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
        _mm256_mul_ps(scaled, _mm256_set1_ps(2.0))
    }
}

/// Lanes l + l+4, then l + l+2, then l + l+1 of an 8-lane partial sum.
///
/// # Safety
/// The CPU must have AVX (every ISA here but the scalar one has it).
#[inline(always)]
pub(super) unsafe fn reduce8(v: __m256) -> f32 {
    // SAFETY: the CPU has AVX (this function's precondition).
    unsafe {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
        _mm_cvtss_f32(s1)
    }
}
