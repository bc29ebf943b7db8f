//! Counting mode (cargo feature `count-ops`): the kernels count the scalar multiplications
//! they perform, per transformer layer, so tests can check the KV cache's cost formulas
//! (docs/theory.md, "The KV cache") against what the engine actually did.
//!
//! What is counted is docs/theory.md's rule: one multiplication per (weight or key or value
//! element) x (activation or query or attention weight) product, i.e. `rows * tokens * cols`
//! for a matrix product ([`crate::kernels::matmul_rows`]) and `keys * head_dim` for the
//! weighted sum of values ([`crate::kernels::weighted_row_sums`]). Like that rule,
//! it leaves out normalisation, RoPE, softmax, the SwiGLU gate and the per-group scale
//! products of quantized weights (part of reading a weight, not of the matrix product).
//!
//! The counters are process-wide: the forward pass names the layer it is in
//! ([`set_layer`]) before each phase, and every pool thread adds to that layer's counter.
//! Without the feature every function here is an empty inline stub.

/// Layers beyond this are counted together with the work outside layers.
pub const MAX_LAYERS: usize = 256;

/// Counts of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpCounts {
    /// Multiplications inside each transformer layer, index = layer.
    pub per_layer: Vec<u64>,
    /// Multiplications outside the layers (the LM head).
    pub outside: u64,
}

#[cfg(feature = "count-ops")]
mod imp {
    use super::{OpCounts, MAX_LAYERS};
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

    static SLOT: AtomicUsize = AtomicUsize::new(MAX_LAYERS);
    static COUNTS: [AtomicU64; MAX_LAYERS + 1] = [const { AtomicU64::new(0) }; MAX_LAYERS + 1];

    #[inline]
    pub fn mults(n: usize) {
        COUNTS[SLOT.load(Relaxed)].fetch_add(n as u64, Relaxed);
    }

    pub fn set_layer(layer: Option<usize>) {
        SLOT.store(layer.filter(|&l| l < MAX_LAYERS).unwrap_or(MAX_LAYERS), Relaxed);
    }

    /// Zeroes every counter.
    pub fn reset() {
        for c in &COUNTS {
            c.store(0, Relaxed);
        }
    }

    /// The counters of layers `0..n_layers` and of the work outside them.
    pub fn snapshot(n_layers: usize) -> OpCounts {
        OpCounts {
            per_layer: COUNTS[..n_layers.min(MAX_LAYERS)].iter().map(|c| c.load(Relaxed)).collect(),
            outside: COUNTS[MAX_LAYERS].load(Relaxed),
        }
    }
}

#[cfg(feature = "count-ops")]
pub use imp::{reset, snapshot};

/// Adds `n` multiplications to the current layer's counter.
#[inline(always)]
pub(crate) fn mults(_n: usize) {
    #[cfg(feature = "count-ops")]
    imp::mults(_n)
}

/// Names the layer the following kernel calls belong to (`None`: outside every layer).
#[inline(always)]
pub(crate) fn set_layer(_layer: Option<usize>) {
    #[cfg(feature = "count-ops")]
    imp::set_layer(_layer)
}
