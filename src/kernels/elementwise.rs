//! Elementwise kernels: `exp`, the attention softmax and SwiGLU, written once against
//! [`Lanes16`] so every instruction set (and the scalar twin) gives the same bits, on any
//! platform: `exp` is this module's own, not the libm's.
//!
//! `exp(x)`: clamp `x` to [-88, 89] (NaN passes through); `k = round(32 x / ln 2)` by the
//! 1.5 * 2^23 trick with one fused multiply-add; `e = floor(k / 32)`, `j = k - 32 e` (exact,
//! by the same trick); `r = x - k ln2/32` in two fused steps (Cody-Waite, `|r| <= ln2/64`);
//! `s = r + r^2 (1/2 + r (1/6 + r/24))` (fused multiply-adds); `y = T[j] + (T[j] s + t[j])`
//! with `T[j] + t[j]` = 2^(j/32) to 48 bits (a 32-entry table); result `y * 2^e`
//! ([`Lanes16::scale_pow2`]). The last addition is the only large rounding, so results are
//! within 0.52 ulp of the exact value (tested: at most 1 ulp, and correctly rounded in all
//! but a few in a thousand). Results below 2^-125 are 0 (flushed), above f32::MAX infinite.
//!
//! Slices are processed 16 values at a time; a tail is run through a copy padded to 16
//! lanes, so a value's ops do not depend on its position.

use super::lanes::Lanes16;
use super::Isa;

const EXP_LO: f32 = -88.0;
const EXP_HI: f32 = 89.0;
/// 32 / ln 2.
const SCALED_LOG2_E: f32 = 46.166_24;
/// 1.5 * 2^23: adding it rounds a float of magnitude below 2^22 to an integer.
const ROUNDER: f32 = 12_582_912.0;
/// ln2/32 = LN2_32_HI + LN2_32_LO, `LN2_32_HI` with 11 significant bits so `k * LN2_32_HI`
/// is exact for every `k` the clamp allows.
const LN2_32_HI: f32 = 355.0 / 16384.0;
const LN2_32_LO: f32 = f32::from_bits(0xb6de_8083);
/// 2^(j/32) rounded to f32, and the remainder 2^(j/32) - EXP2_HI[j] rounded to f32.
const EXP2_HI: [f32; 32] = bits([
    0x3f80_0000, 0x3f82_cd87, 0x3f85_aac3, 0x3f88_980f, 0x3f8b_95c2, 0x3f8e_a43a, 0x3f91_c3d3, 0x3f94_f4f0,
    0x3f98_37f0, 0x3f9b_8d3a, 0x3f9e_f532, 0x3fa2_7043, 0x3fa5_fed7, 0x3fa9_a15b, 0x3fad_583f, 0x3fb1_23f6,
    0x3fb5_04f3, 0x3fb8_fbaf, 0x3fbd_08a4, 0x3fc1_2c4d, 0x3fc5_672a, 0x3fc9_b9be, 0x3fce_248c, 0x3fd2_a81e,
    0x3fd7_44fd, 0x3fdb_fbb8, 0x3fe0_ccdf, 0x3fe5_b907, 0x3fea_c0c7, 0x3fef_e4ba, 0x3ff5_257d, 0x3ffa_83b3,
]);
const EXP2_LO: [f32; 32] = bits([
    0x0000_0000, 0xb34e_a7a9, 0x334f_9891, 0xb37e_da4b, 0xb260_aba1, 0xb369_7465, 0x3367_5624, 0xb32e_0212,
    0x3323_1b71, 0xb30c_5563, 0x3341_2342, 0x30c3_125a, 0xb32c_9d5e, 0xb316_2b08, 0xb22d_eaf6, 0xb37c_5aa8,
    0x32cf_e77a, 0x330e_c5f7, 0xb341_4fe8, 0xb2d6_663e, 0x320a_a837, 0xb373_23a2, 0x3228_fc24, 0xb35c_1daa,
    0xb2d4_a58a, 0xb350_4a1c, 0xb21e_ab59, 0xb244_1be6, 0xb241_16de, 0xb348_464a, 0x3229_2436, 0xb292_3758,
]);

const fn bits(b: [u32; 32]) -> [f32; 32] {
    let mut out = [0f32; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = f32::from_bits(b[i]);
        i += 1;
    }
    out
}

/// # Safety
/// The CPU must have `L`'s ISA.
#[inline(always)]
unsafe fn exp_lanes<L: Lanes16>(x: L) -> L {
    // SAFETY: the CPU has `L`'s ISA (this function's precondition).
    unsafe {
        let x = L::min(L::splat(EXP_HI), L::max(L::splat(EXP_LO), x));
        let rounder = L::splat(ROUNDER);
        let k = L::sub(L::fma(x, L::splat(SCALED_LOG2_E), rounder), rounder);
        // k / 32 - 15.5 / 32 is exact and 0.48 or less from floor(k / 32): it rounds to it.
        let e = L::sub(L::add(L::sub(L::mul(k, L::splat(1.0 / 32.0)), L::splat(15.5 / 32.0)), rounder), rounder);
        let j = L::sub(k, L::mul(e, L::splat(32.0)));
        let r = L::fma(k, L::splat(-LN2_32_HI), x);
        let r = L::fma(k, L::splat(-LN2_32_LO), r);
        let p = L::fma(L::fma(r, L::splat(1.0 / 24.0), L::splat(1.0 / 6.0)), r, L::splat(0.5));
        let s = L::fma(p, L::mul(r, r), r);
        let hi = L::lookup32(&EXP2_HI, j);
        let y = L::add(hi, L::fma(hi, s, L::lookup32(&EXP2_LO, j)));
        L::scale_pow2(y, e)
    }
}

// No closures below: a closure would not inherit the ISA wrapper's target features, and
// its lane ops would not inline.

/// The 16 values of `x` from `i`, lanes past the end holding `pad`.
///
/// # Safety
/// The CPU must have `L`'s ISA.
#[inline(always)]
unsafe fn load_padded<L: Lanes16>(x: &[f32], i: usize, pad: f32) -> L {
    // SAFETY: the CPU has `L`'s ISA (this function's precondition); the load reads
    // `x[i..i + 16]`, inside `x`, or the 16 values of `padded`.
    unsafe {
        if i + 16 <= x.len() {
            L::load(x.as_ptr().add(i))
        } else {
            let mut padded = [pad; 16];
            padded[..x.len() - i].copy_from_slice(&x[i..]);
            L::load(padded.as_ptr())
        }
    }
}

/// Stores the lanes of `v` that fall inside `x`, from `i`.
///
/// # Safety
/// The CPU must have `L`'s ISA.
#[inline(always)]
unsafe fn store_partial<L: Lanes16>(v: L, x: &mut [f32], i: usize) {
    // SAFETY: the CPU has `L`'s ISA (this function's precondition); the store writes
    // `x[i..i + 16]`, inside `x`, or the 16 values of `lanes`.
    unsafe {
        if i + 16 <= x.len() {
            v.store(x.as_mut_ptr().add(i));
        } else {
            let mut lanes = [0f32; 16];
            v.store(lanes.as_mut_ptr());
            let n = x.len() - i;
            x[i..].copy_from_slice(&lanes[..n]);
        }
    }
}

/// # Safety
/// The CPU must have `L`'s ISA.
#[inline(always)]
unsafe fn exp_in_place_lanes<L: Lanes16>(x: &mut [f32]) {
    // SAFETY: the CPU has `L`'s ISA (this function's precondition); every load and store goes
    // through `load_padded` and `store_partial`, which stay inside the slice.
    unsafe {
        for i in (0..x.len()).step_by(16) {
            store_partial(exp_lanes(load_padded::<L>(x, i, 0.0)), x, i);
        }
    }
}

/// `s = softmax(scale * s)`: `v = scale * s`; `m` = the largest `v` (lane-wise maxima, then
/// a fixed tree); `e = exp(v - m)`; `sum` = lane-wise sums of `e` (lane `l` takes values
/// `l, l + 16, ...`; missing lanes add 0) reduced by [`Lanes16::reduce`]; `s = e / sum`.
///
/// # Safety
/// The CPU must have `L`'s ISA.
#[inline(always)]
unsafe fn softmax_scaled_lanes<L: Lanes16>(s: &mut [f32], scale: f32) {
    // SAFETY: the CPU has `L`'s ISA (this function's precondition); every load and store goes
    // through `load_padded` and `store_partial`, which stay inside the slice. `m` holds the 16
    // lanes stored into it.
    unsafe {
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
}

/// `gate = gate / (1 + exp(-gate)) * up` (SiLU of the gate times the up projection).
///
/// # Safety
/// The CPU must have `L`'s ISA.
#[inline(always)]
unsafe fn swiglu_lanes<L: Lanes16>(gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len());
    let up = &up[..gate.len()];
    // SAFETY: the CPU has `L`'s ISA (this function's precondition); every load and store goes
    // through `load_padded` and `store_partial`, which stay inside the slice.
    unsafe {
        for i in (0..gate.len()).step_by(16) {
            let (g, u) = (load_padded::<L>(gate, i, 0.0), load_padded::<L>(up, i, 0.0));
            let silu = L::div(g, L::add(L::splat(1.0), exp_lanes(L::sub(L::zero(), g))));
            store_partial(L::mul(silu, u), gate, i);
        }
    }
}

/// sqrt(2 / pi) * 2 and that times 0.044715: GELU's tanh approximation
/// `x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` equals `x * sigmoid(2 u)` with `u` the
/// tanh argument, computed as `x / (1 + exp(-(x * (C1 + C3 x^2))))`.
const GELU_C1: f32 = 1.595_769_2;
const GELU_C3: f32 = 0.071_354_814;

/// `gate = gelu_tanh(gate) * up` (GeGLU), see [`GELU_C1`].
///
/// # Safety
/// The CPU must have `L`'s ISA.
#[inline(always)]
unsafe fn geglu_lanes<L: Lanes16>(gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len());
    let up = &up[..gate.len()];
    // SAFETY: the CPU has `L`'s ISA (this function's precondition); every load and store goes
    // through `load_padded` and `store_partial`, which stay inside the slice.
    unsafe {
        for i in (0..gate.len()).step_by(16) {
            let (g, u) = (load_padded::<L>(gate, i, 0.0), load_padded::<L>(up, i, 0.0));
            let t = L::mul(g, L::fma(L::mul(g, g), L::splat(GELU_C3), L::splat(GELU_C1)));
            let gelu = L::div(g, L::add(L::splat(1.0), exp_lanes(L::sub(L::zero(), t))));
            store_partial(L::mul(gelu, u), gate, i);
        }
    }
}

/// A public entry point running the generic kernel `$generic` on the selected ISA, through
/// a wrapper compiled with that ISA's features (so the lane ops inline).
macro_rules! entry_point {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) => $generic:ident) => {
        $(#[$doc])*
        pub fn $name(isa: Isa, $($arg: $ty),*) {
            /// # Safety
            /// The CPU must have AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2($($arg: $ty),*) {
                // SAFETY: the CPU has AVX2, FMA and F16C (this function's precondition), which
                // is all `$generic` asks for with `Avx2x2`.
                unsafe { $generic::<super::lanes::Avx2x2>($($arg),*) }
            }
            /// # Safety
            /// The CPU must have AVX-512 (F, BW, VL), AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
            unsafe fn avx512($($arg: $ty),*) {
                // SAFETY: the CPU has AVX-512 (F, BW, VL), AVX2, FMA and F16C (this function's
                // precondition), which is all `$generic` asks for with `Avx512`.
                unsafe { $generic::<super::lanes::Avx512>($($arg),*) }
            }
            assert!(isa.available(), "the {} kernels cannot run on this CPU", isa.name());
            // SAFETY: the CPU's features are asserted above; the kernels take slices.
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

entry_point! {
    /// `gate = gelu_tanh(gate) * up`, value by value; `up` at least as long as `gate`.
    pub fn geglu(gate: &mut [f32], up: &[f32]) => geglu_lanes
}
