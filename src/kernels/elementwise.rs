//! Elementwise kernels: `exp`, the attention softmax and SwiGLU, written once against
//! [`Lanes16`] so every instruction set (and the scalar twin) gives the same bits, on any
//! platform: `exp` is this module's own (Cephes' single-precision scheme), not the libm's.
//!
//! `exp(x)`: clamp `x` to [-88, 89] (NaN passes through); `k = round(x * log2 e)` by the
//! 1.5 * 2^23 trick with one fused multiply-add; `r = x - k ln2` in two fused steps
//! (Cody-Waite); `y = 1 + r + r^2 P(r)` with Cephes' degree-5 minimax `P` by Horner with
//! fused multiply-adds; result `y * 2^k` ([`Lanes16::scale_pow2`]). Within 2 ulp of the
//! exact value (tested); results below 2^-125.5 (x < -125.5 ln 2 = -86.988) are 0, results
//! above f32::MAX infinite.
//!
//! Slices are processed 16 values at a time; a tail is run through a copy padded to 16
//! lanes, so a value's ops do not depend on its position.

use super::lanes::Lanes16;
use super::Isa;

const EXP_LO: f32 = -88.0;
const EXP_HI: f32 = 89.0;
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// 1.5 * 2^23: adding it rounds a float of magnitude below 2^22 to an integer.
const ROUNDER: f32 = 12_582_912.0;
/// ln 2 = LN2_HI + LN2_LO, `LN2_HI` with 9 significant bits so `k * LN2_HI` is exact.
const LN2_HI: f32 = 355.0 / 512.0;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes expf's polynomial, highest degree first (its 5.0000001201e-1 is 0.5 in f32).
const EXP_POLY: [f32; 6] = [1.987_569_2e-4, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

#[inline(always)]
unsafe fn exp_lanes<L: Lanes16>(x: L) -> L {
    let x = L::min(L::splat(EXP_HI), L::max(L::splat(EXP_LO), x));
    let k = L::sub(L::fma(x, L::splat(LOG2_E), L::splat(ROUNDER)), L::splat(ROUNDER));
    let r = L::fma(k, L::splat(-LN2_HI), x);
    let r = L::fma(k, L::splat(-LN2_LO), r);
    let mut p = L::splat(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        p = L::fma(p, r, L::splat(*c));
    }
    let y = L::add(L::fma(p, L::mul(r, r), r), L::splat(1.0));
    L::scale_pow2(y, k)
}

// No closures below: a closure would not inherit the ISA wrapper's target features, and
// its lane ops would not inline.

/// The 16 values of `x` from `i`, lanes past the end holding `pad`.
#[inline(always)]
unsafe fn load_padded<L: Lanes16>(x: &[f32], i: usize, pad: f32) -> L {
    if i + 16 <= x.len() {
        L::load(x.as_ptr().add(i))
    } else {
        let mut padded = [pad; 16];
        padded[..x.len() - i].copy_from_slice(&x[i..]);
        L::load(padded.as_ptr())
    }
}

/// Stores the lanes of `v` that fall inside `x`, from `i`.
#[inline(always)]
unsafe fn store_partial<L: Lanes16>(v: L, x: &mut [f32], i: usize) {
    if i + 16 <= x.len() {
        v.store(x.as_mut_ptr().add(i));
    } else {
        let mut lanes = [0f32; 16];
        v.store(lanes.as_mut_ptr());
        let n = x.len() - i;
        x[i..].copy_from_slice(&lanes[..n]);
    }
}

#[inline(always)]
unsafe fn exp_in_place_lanes<L: Lanes16>(x: &mut [f32]) {
    for i in (0..x.len()).step_by(16) {
        store_partial(exp_lanes(load_padded::<L>(x, i, 0.0)), x, i);
    }
}

/// `s = softmax(scale * s)`: `v = scale * s`; `m` = the largest `v` (lane-wise maxima, then
/// a fixed tree); `e = exp(v - m)`; `sum` = lane-wise sums of `e` (lane `l` takes values
/// `l, l + 16, ...`; missing lanes add 0) reduced by [`Lanes16::reduce`]; `s = e / sum`.
#[inline(always)]
unsafe fn softmax_scaled_lanes<L: Lanes16>(s: &mut [f32], scale: f32) {
    let mut lane_max = L::splat(f32::NEG_INFINITY);
    for i in (0..s.len()).step_by(16) {
        let v = L::mul(load_padded::<L>(s, i, f32::NEG_INFINITY), L::splat(scale));
        lane_max = L::max(lane_max, v);
        store_partial(v, s, i);
    }
    let mut m = [0f32; 16];
    lane_max.store(m.as_mut_ptr());
    for h in [8, 4, 2, 1] {
        for l in 0..h {
            m[l] = if m[l] > m[l + h] { m[l] } else { m[l + h] };
        }
    }
    let mut lane_sum = L::zero();
    for i in (0..s.len()).step_by(16) {
        // exp(-inf - m) = 0 in the padding.
        let e = exp_lanes(L::sub(load_padded::<L>(s, i, f32::NEG_INFINITY), L::splat(m[0])));
        lane_sum = L::add(lane_sum, e);
        store_partial(e, s, i);
    }
    let sum = L::splat(lane_sum.reduce());
    for i in (0..s.len()).step_by(16) {
        store_partial(L::div(load_padded::<L>(s, i, 0.0), sum), s, i);
    }
}

/// `gate = gate / (1 + exp(-gate)) * up` (SiLU of the gate times the up projection).
#[inline(always)]
unsafe fn swiglu_lanes<L: Lanes16>(gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len());
    let up = &up[..gate.len()];
    for i in (0..gate.len()).step_by(16) {
        let (g, u) = (load_padded::<L>(gate, i, 0.0), load_padded::<L>(up, i, 0.0));
        let silu = L::div(g, L::add(L::splat(1.0), exp_lanes(L::sub(L::zero(), g))));
        store_partial(L::mul(silu, u), gate, i);
    }
}

/// A public entry point running the generic kernel `$generic` on the selected ISA, through
/// a wrapper compiled with that ISA's features (so the lane ops inline).
macro_rules! entry_point {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) => $generic:ident) => {
        $(#[$doc])*
        pub fn $name(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2($($arg: $ty),*) {
                $generic::<super::lanes::Avx2x2>($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            unsafe fn avx512($($arg: $ty),*) {
                $generic::<super::lanes::Avx512>($($arg),*)
            }
            // SAFETY: the ISA was checked when it was selected.
            unsafe {
                match isa {
                    Isa::Scalar => $generic::<super::Scalar16>($($arg),*),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => avx2($($arg),*),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => avx512($($arg),*),
                    #[cfg(not(target_arch = "x86_64"))]
                    _ => unreachable!("no SIMD path on this architecture"),
                }
            }
        }
    };
}

entry_point! {
    /// `x = exp(x)`, value by value (see the module documentation).
    pub fn exp_in_place(x: &mut [f32]) => exp_in_place_lanes
}

entry_point! {
    /// `s = softmax(scale * s)` in the op order of `softmax_scaled_lanes`.
    pub fn softmax_scaled(s: &mut [f32], scale: f32) => softmax_scaled_lanes
}

entry_point! {
    /// `gate = silu(gate) * up`, value by value; `up` at least as long as `gate`.
    pub fn swiglu(gate: &mut [f32], up: &[f32]) => swiglu_lanes
}
