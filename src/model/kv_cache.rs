//! The key/value cache: preallocated, one region per layer and KV head.

use crate::error::{Error, Result};
use crate::kernels::MatRef;
use crate::model::config::ModelConfig;
use crate::tensor::GgmlType;

/// Keys and values of every processed position, stored in f32.
///
/// Memory is reserved once (zeroed pages are only made resident when written), and
/// position `p` of layer `l`, KV head `g` lives at row `p` of the `(l, g)` region, so the
/// keys one head attends to are one contiguous matrix.
pub struct KvCache {
    capacity: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// [n_layers][n_kv_heads][capacity][head_dim]
    k: Vec<f32>,
    /// [n_layers][n_kv_heads][capacity][head_dim]
    v: Vec<f32>,
    /// Positions 0..len hold valid entries.
    len: usize,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, capacity: usize) -> Result<KvCache> {
        if capacity == 0 {
            return Err(Error::invalid_argument("context_length", "must be at least 1"));
        }
        let n = cfg
            .n_layers
            .checked_mul(cfg.d_kv())
            .and_then(|x| x.checked_mul(capacity))
            .filter(|&n| n <= isize::MAX as usize / 8)
            .ok_or_else(|| Error::invalid_argument("context_length", format!("{capacity} is too large")))?;
        Ok(KvCache {
            capacity,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            k: vec![0.0; n],
            v: vec![0.0; n],
            len: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of valid positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Marks positions `0..len` valid (after writing them) or drops the tail.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity);
        self.len = len;
    }

    fn region(&self, layer: usize, kv_head: usize) -> usize {
        (layer * self.n_kv_heads + kv_head) * self.capacity * self.head_dim
    }

    /// Stores one position's keys and values, `k` and `v` each [n_kv_heads][head_dim].
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        for g in 0..self.n_kv_heads {
            let at = self.region(layer, g) + pos * hd;
            self.k[at..at + hd].copy_from_slice(&k[g * hd..(g + 1) * hd]);
            self.v[at..at + hd].copy_from_slice(&v[g * hd..(g + 1) * hd]);
        }
    }

    /// Keys of positions `0..n` for one layer and KV head, as an `n x head_dim` matrix.
    pub fn keys(&self, layer: usize, kv_head: usize, n: usize) -> MatRef<'_> {
        self.rows(&self.k, layer, kv_head, n)
    }

    /// Values of positions `0..n` for one layer and KV head, as an `n x head_dim` matrix.
    pub fn values(&self, layer: usize, kv_head: usize, n: usize) -> MatRef<'_> {
        self.rows(&self.v, layer, kv_head, n)
    }

    fn rows<'a>(&self, store: &'a [f32], layer: usize, kv_head: usize, n: usize) -> MatRef<'a> {
        let at = self.region(layer, kv_head);
        MatRef {
            ty: GgmlType::F32,
            rows: n,
            cols: self.head_dim,
            data: crate::kernels::f32_bytes(&store[at..at + n * self.head_dim]),
        }
    }
}
