//! [`Lanes16`] on plain arrays: the portable twin of the SIMD implementations.

use super::Lanes16;

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
        // SAFETY: `p` is valid for the bytes this method names (the `Lanes16` contract).
        unsafe { Scalar16(std::ptr::read_unaligned(p.cast::<[f32; 16]>())) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: `p` is valid for the bytes this method names (the `Lanes16` contract).
        unsafe { std::ptr::write_unaligned(p.cast::<[f32; 16]>(), self.0) }
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
        // SAFETY: `qs` is valid for the bytes this method names (the `Lanes16` contract).
        unsafe {
            let q = std::ptr::read_unaligned(qs.cast::<[u8; 16]>());
            (
                Scalar16(std::array::from_fn(|l| (q[l] & 0x0F) as f32)),
                Scalar16(std::array::from_fn(|l| (q[l] >> 4) as f32)),
            )
        }
    }
    #[inline(always)]
    unsafe fn i8x32(qs: *const i8) -> (Self, Self) {
        // SAFETY: `qs` is valid for the bytes this method names (the `Lanes16` contract).
        unsafe {
            let q = std::ptr::read_unaligned(qs.cast::<[i8; 32]>());
            (
                Scalar16(std::array::from_fn(|l| q[l] as f32)),
                Scalar16(std::array::from_fn(|l| q[l + 16] as f32)),
            )
        }
    }
    #[inline(always)]
    unsafe fn f16x16(p: *const u8) -> Self {
        // SAFETY: `p` is valid for the bytes this method names (the `Lanes16` contract).
        unsafe {
            let b = std::ptr::read_unaligned(p.cast::<[[u8; 2]; 16]>());
            Scalar16(std::array::from_fn(|l| half::f16::from_le_bytes(b[l]).to_f32()))
        }
    }
    #[inline(always)]
    unsafe fn bf16x16(p: *const u8) -> Self {
        // SAFETY: `p` is valid for the bytes this method names (the `Lanes16` contract).
        unsafe {
            let b = std::ptr::read_unaligned(p.cast::<[[u8; 2]; 16]>());
            Scalar16(std::array::from_fn(|l| half::bf16::from_le_bytes(b[l]).to_f32()))
        }
    }
}
