//! Sampling exactly as the inference chapter defines it (sections 3 to 6 and 9).
//!
//! # Pipeline
//!
//! A [`Sampler`] turns one vector of f32 logits into one token, in this fixed order:
//!
//! 1. **processors**: repetition penalty, frequency and presence penalties, logit bias, then
//!    the allowed/banned masks (restriction to a set S, proposition 5.2), on f64 logits;
//! 2. **temperature** (definition 4.1): p = softmax(z / tau) in f64 with the maximum
//!    subtracted; tau = 0 is the greedy branch (argmax, lowest id on ties, no division) and
//!    skips the remaining stages;
//! 3. **top-k**, then 4. **top-p**, then 5. **min-p** (definition 5.1): each keeps a prefix of
//!    the ranking (probability descending, ties by ascending id) of the renormalized survivors
//!    of the previous stage; top-p compares *exact* cumulative sums with its threshold;
//! 6. **selection**: inverse-CDF sampling (proposition 6.1) over the survivors in ascending id
//!    order with one uniform per step, `u_t = rng::uniform(seed, t)` (Philox4x32-10), the
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
//! decides a set or a token (proposition 6.3.1). The free functions below ([`softmax()`],
//! [`top_k_set`], [`top_p_set`], [`restrict`], [`entropy`], [`total_variation`],
//! [`log_softmax`]) run the same code as the sampler.

mod config;
mod exact_sum;
mod processors;
pub mod rng;
mod sampler;
mod select;
mod softmax;
mod stats;
mod truncation;

pub use config::SamplerConfig;
pub use sampler::{Sampler, Selection};
pub use softmax::{log_softmax, softmax};
pub use stats::{entropy, total_variation};
pub use truncation::{restrict, top_k_set, top_p_set};
