//! [`IntLanes`] on plain integer arrays: the portable twin of the SIMD implementations.

use super::{q6_sub_scales, IntLanes};
use crate::kernels::lanes::Scalar16;

/// The portable twin: plain integer arithmetic.
#[derive(Clone, Copy)]
pub(crate) struct ScalarI32([i32; 16]);

/// Lane `l`: the sum over words `k` and bytes `b < 4` of `w[k][4l + b] * x[64k + 4l + b]`
/// (the scalar twin's exact integer dot products, codes `u8` or `i8`).
///
/// # Safety
/// `x` must be valid for `64 WORDS` bytes (the activation words matching `w`'s).
#[inline(always)]
unsafe fn lane_dots<C: Copy + Into<i32>, const WORDS: usize>(w: &[[C; 64]; WORDS], x: *const i8) -> ScalarI32 {
    // SAFETY: `x` is valid for `64 WORDS` bytes (this function's precondition), and every read
    // is below `64 (WORDS - 1) + 4 * 15 + 3`.
    unsafe {
        ScalarI32(std::array::from_fn(|l| {
            let mut s = 0i32;
            for (k, word) in w.iter().enumerate() {
                for b in 0..4 {
                    s += word[4 * l + b].into() * *x.add(64 * k + 4 * l + b) as i32;
                }
            }
            s
        }))
    }
}


impl IntLanes for ScalarI32 {
    type F = Scalar16;
    #[inline(always)]
    unsafe fn q5(codes: *const u8, n: usize) -> Self::Q4 {
        // SAFETY: `codes` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe {
            let mut w = [[0u8; 64]; 8];
            for j in 0..4 {
                for i in 0..4 * n {
                    let (b, high) = (*codes.add(4 * n * j + i), *codes.add(16 * n + i));
                    w[j][i] = (b & 0x0F) | (((high >> j) & 1) << 4);
                    w[j + 4][i] = (b >> 4) | (((high >> (j + 4)) & 1) << 4);
                }
            }
            w
        }
    }
    #[inline(always)]
    unsafe fn t5(codes: *const u8, n: usize) -> Self::T4 {
        // SAFETY: `codes` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe {
            let mut w = [[0u8; 64]; 2];
            for i in 0..16 * n {
                // Lane 4g + v / 4 (value v % 4 of it): group g, word v / 4 of its bytes.
                let (g, k, b) = (i / 16, (i % 16) / 4, i % 4);
                let (c, high) = (*codes.add(i), *codes.add(16 * n + 4 * g + b));
                w[0][i] = (c & 0x0F) | (((high >> k) & 1) << 4);
                w[1][i] = (c >> 4) | (((high >> (k + 4)) & 1) << 4);
            }
            w
        }
    }
    #[inline(always)]
    unsafe fn q_low<const Q3: bool>(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
        // SAFETY: `codes` and `sub` are valid for the bytes this method names (the `IntLanes`
        // contract).
        unsafe {
            let mut w = [[0u8; 64]; 8];
            for (k, word) in w.iter_mut().enumerate() {
                for i in 0..4 * n {
                    let low = (*codes.add(4 * n * (k / 4) + i) >> (2 * (k % 4))) & 3;
                    word[i] = if Q3 {
                        let high = (*codes.add(8 * n + i) >> k) & 1;
                        (low | (high << 2)) + 28
                    } else {
                        low + 32
                    };
                }
            }
            let (s0, s1) = q6_sub_scales(sub, n);
            (w, s0, s1)
        }
    }
    /// ([word][lane * 4 + byte] of `u`, `sc_0` per lane, `sc_1` per lane)
    type Q6 = ([[u8; 64]; 8], [i32; 16], [i32; 16]);
    #[inline(always)]
    unsafe fn q6(codes: *const u8, sub: *const u8, n: usize) -> Self::Q6 {
        // SAFETY: `codes` and `sub` are valid for the bytes this method names (the `IntLanes`
        // contract).
        unsafe {
            let mut w = [[0u8; 64]; 8];
            for j in 0..4 {
                for i in 0..4 * n {
                    let b = *codes.add(4 * n * j + i);
                    let high = |h: usize| ((*codes.add(4 * n * (4 + h) + i) >> (2 * j)) & 3) << 4;
                    w[j][i] = (b & 0x0F) | high(0);
                    w[j + 4][i] = (b >> 4) | high(1);
                }
            }
            let (s0, s1) = q6_sub_scales(sub, n);
            (w, s0, s1)
        }
    }
    #[inline(always)]
    unsafe fn dot_q6(w: &Self::Q6, x: *const i8, qsum: *const i32, hsum: *const i32) -> Scalar16 {
        // SAFETY: `x`, `qsum` and `hsum` are valid for the bytes this method names (the
        // `IntLanes` contract).
        unsafe {
            let (u, s0, s1) = w;
            let lo: &[[u8; 64]; 4] = u[..4].try_into().unwrap();
            let hi: &[[u8; 64]; 4] = u[4..].try_into().unwrap();
            let (lo, hi) = (lane_dots(lo, x), lane_dots(hi, x.add(256)));
            ScalarI32(std::array::from_fn(|l| {
                let (q, h) = (*qsum.add(l), *hsum.add(l));
                s0[l] * (lo.0[l] - 32 * h) + s1[l] * (hi.0[l] - 32 * (q - h))
            }))
            .to_f32()
        }
    }
    /// [word][lane * 4 + byte]
    type Q4 = [[u8; 64]; 8];
    /// [word][lane * 4 + byte]
    type Q8 = [[i8; 64]; 8];
    #[inline(always)]
    unsafe fn q4(codes: *const u8, n: usize) -> Self::Q4 {
        // SAFETY: `codes` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe {
            let mut w = [[0u8; 64]; 8];
            for j in 0..4 {
                for i in 0..4 * n {
                    let b = *codes.add(4 * n * j + i);
                    w[j][i] = b & 0x0F;
                    w[j + 4][i] = b >> 4;
                }
            }
            w
        }
    }
    #[inline(always)]
    unsafe fn q8(codes: *const u8, n: usize) -> Self::Q8 {
        // SAFETY: `codes` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe {
            let mut w = [[0i8; 64]; 8];
            for (j, word) in w.iter_mut().enumerate() {
                for (i, v) in word.iter_mut().enumerate().take(4 * n) {
                    *v = *codes.add(4 * n * j + i) as i8;
                }
            }
            w
        }
    }
    #[inline(always)]
    unsafe fn dot_q4(w: &Self::Q4, x: *const i8) -> Self {
        // SAFETY: `x` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe { lane_dots(w, x) }
    }
    #[inline(always)]
    unsafe fn dot_q8(w: &Self::Q8, x: *const i8, _qsum: *const i32) -> Self {
        // SAFETY: `x` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe { lane_dots(w, x) }
    }
    #[inline(always)]
    unsafe fn minus_8_qsum(self, qsum: *const i32) -> Self {
        // SAFETY: `qsum` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe { ScalarI32(std::array::from_fn(|l| self.0[l] - 8 * *qsum.add(l))) }
    }
    #[inline(always)]
    unsafe fn to_f32(self) -> Scalar16 {
        Scalar16(self.0.map(|v| v as f32))
    }
    /// [half][lane * 4 + byte]
    type T4 = [[u8; 64]; 2];
    /// [half][lane * 4 + byte]
    type T8 = [[i8; 64]; 2];
    #[inline(always)]
    unsafe fn t4(codes: *const u8, n: usize) -> Self::T4 {
        // SAFETY: `codes` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe {
            let mut w = [[0u8; 64]; 2];
            for i in 0..16 * n {
                let b = *codes.add(i);
                w[0][i] = b & 0x0F;
                w[1][i] = b >> 4;
            }
            w
        }
    }
    #[inline(always)]
    unsafe fn t8(codes: *const u8, n: usize) -> Self::T8 {
        // SAFETY: `codes` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe {
            let mut w = [[0i8; 64]; 2];
            for (h, half) in w.iter_mut().enumerate() {
                for (i, v) in half.iter_mut().enumerate().take(16 * n) {
                    *v = *codes.add(16 * n * h + i) as i8;
                }
            }
            w
        }
    }
    #[inline(always)]
    unsafe fn dot_t4(w: &Self::T4, x: *const i8) -> Self {
        // SAFETY: `x` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe { lane_dots(w, x) }
    }
    #[inline(always)]
    unsafe fn dot_t8(w: &Self::T8, x: *const i8, _lane_sum: *const i32) -> Self {
        // SAFETY: `x` is valid for the bytes this method names (the `IntLanes` contract).
        unsafe { lane_dots(w, x) }
    }
    #[inline(always)]
    unsafe fn spread4(v: Scalar16) -> Scalar16 {
        Scalar16(std::array::from_fn(|l| v.0[l / 4]))
    }
}
