//! Sampling exactly as docs/theory.md defines it (greedy decoding, temperature, top-k, top-p,
//! restriction, drawing a token).
//!
//! # Pipeline
//!
//! A [`Sampler`] turns one vector of f32 logits into one token, in this fixed order:
//!
//! 1. **processors**: repetition penalty, frequency and presence penalties, logit bias, then
//!    the allowed/banned masks (restriction to a set S, which is conditioning on S), on f64
//!    logits;
//! 2. **temperature**: p = softmax(z / tau) in f64 with the maximum subtracted; tau = 0 is the
//!    greedy branch (argmax, lowest id on ties, no division) and skips the remaining stages;
//! 3. **top-k**, then 4. **top-p**, then 5. **min-p**: each keeps a prefix of the ranking
//!    (probability descending, ties by ascending id) of the renormalized survivors of the
//!    previous stage; top-p compares *exact* cumulative sums with its threshold;
//! 6. **selection**: inverse-CDF sampling over the survivors in ascending id order with one
//!    uniform per step, `u_t = rng::uniform(seed, t)` (Philox4x32-10), the
//!    comparison C_j >= u again exact.
//!
//! The final distribution q is p restricted to the survivors S: q_i = p_i / p(S) on S, with
//! p(S) summed exactly. When no token of positive probability was removed, q = p itself: p is
//! the distribution (p(V) = 1 by definition; its f64 entries add up to 1 within a few ulps).
//!
//! # Determinism
//!
//! Every stage is a deterministic function of (logits, history, settings, seed, step): no
//! global state, no thread-count dependence, an `exp` without platform libm, operation orders
//! fixed by the code rather than by the SIMD width, and exact arithmetic wherever a comparison
//! decides a set or a token (docs/theory.md, "Drawing a token"). The free functions below
//! ([`softmax()`], [`top_k_set`], [`top_p_set`], [`restrict`], [`entropy`],
//! [`total_variation`], [`log_softmax`]) run the same code as the sampler.
//!
//! # Log-probabilities
//!
//! A [`Selection`] reports log-probabilities of the final distribution q by default
//! ([`LogprobsMode::Processed`]), or of the model's own distribution softmax(z) before any
//! stage above ([`LogprobsMode::Raw`], computed by [`RawLogprobs`]); the choice of the token
//! never depends on it.

/// Defines a function whose body is compiled three times, for AVX-512, AVX2 and the baseline,
/// and picks the best the CPU has at run time. For loops over the vocabulary whose every
/// operation is exact (conversions, comparisons, counts) or element-wise IEEE arithmetic, so
/// all three give the same results.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn portable($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2")]
                fn avx512($($arg: $ty),*) -> $ret {
                    portable($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) -> $ret {
                    portable($($arg),*)
                }
                if crate::sampling::has_avx512() {
                    // SAFETY: the CPU has the features (checked).
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2 (checked).
                    return unsafe { avx2($($arg),*) };
                }
            }
            portable($($arg),*)
        }
    };
}

/// Whether the CPU has the AVX-512 subsets the sampler's kernels use (checked once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| {
        ["avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2"].iter().all(|&feature| match feature {
            "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
            "avx512dq" => std::arch::is_x86_feature_detected!("avx512dq"),
            "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
            _ => std::arch::is_x86_feature_detected!("avx2"),
        })
    })
}

mod config;
mod exact_sum;
mod processors;
mod raw;
pub mod rng;
mod sampler;
mod select;
mod softmax;
pub mod speculative;
mod stats;
mod truncation;

pub use config::{LogprobsMode, SamplerConfig};
pub use raw::{score_rows, RawLogprobs, TokenLogprob};
pub use sampler::{Sampler, Selection};
pub use softmax::{log_softmax, softmax};
pub use stats::{entropy, total_variation};
pub use truncation::{restrict, top_k_set, top_p_set};
