//! The key/value cache (docs/theory.md, "The KV cache"): a preallocated ring buffer, one
//! region per layer and KV head, in f32 or f16.
//!
//! # Positions and slots
//!
//! `len` counts the positions processed so far (absolute positions; RoPE uses them).
//! Position `p` lives in slot `slot(p)` of every `(layer, kv_head)` region:
//!
//! - policy [`Overflow::Error`]: `slot(p) = p`; a sequence may not outgrow the capacity.
//! - policy [`Overflow::SlidingWindow`] with `n_keep` pinned positions (attention sinks):
//!   `slot(p) = p` for `p < n_keep`, else `n_keep + (p - n_keep) mod (capacity - n_keep)`.
//!   With `n_keep = 0` that is `p mod capacity`. The query at position `q` attends to the
//!   sinks `0..n_keep` and to the `W = capacity - n_keep` most recent positions
//!   `q - W + 1 ..= q`: a rolling buffer, nothing is ever recomputed or moved.
//!
//! The keys a query reads are at most three contiguous slot ranges ([`KvCache::pieces`]),
//! listed in position order; attention walks them in that order, so the op sequence for a
//! query depends only on which positions it attends to, never on where they sit.
//!
//! # Storage
//!
//! Memory is reserved once, zeroed by the allocator (pages become resident only when
//! written). Values are stored rounded to the storage type (f16: round to nearest even) when
//! written, before attention reads them, so prefill and decode read the same bits.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use std::ops::Range;

use crate::error::{Error, Result};
use crate::kernels::MatRef;
use crate::model::config::ModelConfig;
use crate::tensor::GgmlType;

/// The number type the cache stores keys and values in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    /// Bytes per stored number.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        }
    }

    pub fn parse(name: &str) -> Result<KvDtype> {
        match name.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(KvDtype::F32),
            "f16" | "float16" => Ok(KvDtype::F16),
            _ => Err(Error::invalid_argument("kv_dtype", format!("'{name}' is not one of f32, f16"))),
        }
    }

    fn ggml(self) -> GgmlType {
        match self {
            KvDtype::F32 => GgmlType::F32,
            KvDtype::F16 => GgmlType::F16,
        }
    }
}

/// What happens when a sequence outgrows the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Refuse: [`Error::ContextOverflow`] before any work is done.
    Error,
    /// Attend to the first `n_keep` positions (attention sinks) and the most recent ones
    /// that fit, as a rolling buffer.
    SlidingWindow { n_keep: usize },
}

impl Overflow {
    pub fn name(self) -> &'static str {
        match self {
            Overflow::Error => "error",
            Overflow::SlidingWindow { .. } => "sliding_window",
        }
    }

    /// Pinned positions (0 for [`Overflow::Error`]).
    pub fn n_keep(self) -> usize {
        match self {
            Overflow::Error => 0,
            Overflow::SlidingWindow { n_keep } => n_keep,
        }
    }

    /// Parses a policy name; `n_keep` is used by `"sliding_window"` only.
    pub fn parse(name: &str, n_keep: usize) -> Result<Overflow> {
        match name.to_ascii_lowercase().as_str() {
            "error" => Ok(Overflow::Error),
            "sliding_window" => Ok(Overflow::SlidingWindow { n_keep }),
            _ => Err(Error::invalid_argument("overflow", format!("'{name}' is not one of error, sliding_window"))),
        }
    }
}

/// Everything that shapes a cache besides the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheOptions {
    /// Positions held (the context length).
    pub capacity: usize,
    pub dtype: KvDtype,
    pub overflow: Overflow,
}

impl KvCacheOptions {
    /// An f32 cache of `capacity` positions that refuses to overflow.
    pub fn new(capacity: usize) -> KvCacheOptions {
        KvCacheOptions { capacity, dtype: KvDtype::F32, overflow: Overflow::Error }
    }
}

/// One region's worth of numbers in the storage type.
enum Store {
    /// f32 values
    F32(Vec<f32>),
    /// f16 bit patterns (little-endian when viewed as bytes)
    F16(Vec<u16>),
}

impl Store {
    fn zeroed(dtype: KvDtype, n: usize) -> Result<Store> {
        Ok(match dtype {
            KvDtype::F32 => Store::F32(zeroed_vec(n)?),
            KvDtype::F16 => Store::F16(zeroed_vec(n)?),
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: f32 and u16 have no padding; u8 has alignment 1.
        unsafe {
            match self {
                Store::F32(v) => std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(&v[..])),
                Store::F16(v) => std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(&v[..])),
            }
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; every bit pattern is a valid f32 / u16.
        unsafe {
            match self {
                Store::F32(v) => std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(&v[..])),
                Store::F16(v) => std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(&v[..])),
            }
        }
    }

    /// Stores `src` at element offset `at`, rounded to the storage type.
    fn put(&mut self, at: usize, src: &[f32]) {
        match self {
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            // Rounded to nearest even, like `f16::from_f32`, by F16C when the CPU has it.
            Store::F16(v) => v[at..at + src.len()].reinterpret_cast_mut::<half::f16>().convert_from_f32_slice(src),
        }
    }
}

/// A zero-filled vector from the allocator's zeroed memory (lazily committed by the OS), or
/// an error instead of an abort when the allocation fails.
fn zeroed_vec<T: Copy>(n: usize) -> Result<Vec<T>> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let too_large = || Error::invalid_argument("context_length", "the KV cache does not fit in memory");
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| too_large())?;
    // SAFETY: the layout has non-zero size; the memory is zeroed, which is a valid f32 / u16;
    // Vec takes ownership of an allocation made with exactly its layout.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<T>();
        if ptr.is_null() {
            return Err(too_large());
        }
        Ok(Vec::from_raw_parts(ptr, n, n))
    }
}

/// Keys and values of the positions a sequence may still attend to.
pub struct KvCache {
    capacity: usize,
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    dtype: KvDtype,
    overflow: Overflow,
    /// [n_layers][n_kv_heads][capacity][head_dim] keys, in `dtype`
    k: Store,
    /// [n_layers][n_kv_heads][capacity][head_dim] values, in `dtype`
    v: Store,
    /// Positions processed: the next position to write.
    len: usize,
    /// Every ring position in `oldest..len` is present in its slot (sliding window only;
    /// positions before it may have been overwritten). Always >= `n_keep`.
    oldest: usize,
}

impl KvCache {
    /// An f32 cache of `capacity` positions with the [`Overflow::Error`] policy.
    pub fn new(cfg: &ModelConfig, capacity: usize) -> Result<KvCache> {
        KvCache::with_options(cfg, &KvCacheOptions::new(capacity))
    }

    pub fn with_options(cfg: &ModelConfig, options: &KvCacheOptions) -> Result<KvCache> {
        let KvCacheOptions { capacity, dtype, overflow } = *options;
        if capacity == 0 {
            return Err(Error::invalid_argument("context_length", "must be at least 1"));
        }
        if let Overflow::SlidingWindow { n_keep } = overflow {
            if n_keep >= capacity {
                return Err(Error::invalid_argument(
                    "n_keep",
                    format!("{n_keep} pinned positions leave no room in a cache of {capacity}"),
                ));
            }
        }
        let n = cfg
            .n_layers
            .checked_mul(cfg.d_kv())
            .and_then(|x| x.checked_mul(capacity))
            .filter(|&n| n <= isize::MAX as usize / 8)
            .ok_or_else(|| Error::invalid_argument("context_length", format!("{capacity} is too large")))?;
        Ok(KvCache {
            capacity,
            n_layers: cfg.n_layers,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            dtype,
            overflow,
            k: Store::zeroed(dtype, n)?,
            v: Store::zeroed(dtype, n)?,
            len: 0,
            oldest: overflow.n_keep(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    pub fn overflow(&self) -> Overflow {
        self.overflow
    }

    pub fn options(&self) -> KvCacheOptions {
        KvCacheOptions { capacity: self.capacity, dtype: self.dtype, overflow: self.overflow }
    }

    /// Number of positions processed (the absolute position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions whose keys and values are held: `min(len, capacity)`.
    pub fn n_held(&self) -> usize {
        self.len.min(self.capacity)
    }

    /// Bytes of keys and values held: `2 * n_layers * n_held * d_kv * bytes per number`
    /// (docs/theory.md, "The KV cache": `d_kv` numbers per key and per value).
    pub fn kv_bytes(&self) -> usize {
        2 * self.n_layers * self.n_held() * self.n_kv_heads * self.head_dim * self.dtype.bytes()
    }

    fn n_keep(&self) -> usize {
        self.overflow.n_keep()
    }

    /// Ring size `W = capacity - n_keep`.
    fn window(&self) -> usize {
        self.capacity - self.n_keep()
    }

    /// The slot of absolute position `p`.
    pub fn slot(&self, p: usize) -> usize {
        let k = self.n_keep();
        if p < k {
            p
        } else {
            k + (p - k) % self.window()
        }
    }

    /// How many tokens the next forward call may append. With [`Overflow::Error`] that is the
    /// free room. With the sliding window, all K/V of a call are written before any query of
    /// it reads, so once the ring is full a call may hold a single token (a later token's
    /// write would evict a key an earlier token still needs); callers split longer inputs.
    pub fn max_append(&self) -> usize {
        match self.overflow {
            Overflow::Error => self.capacity - self.len,
            Overflow::SlidingWindow { .. } => self.capacity.saturating_sub(self.len).max(1),
        }
    }

    /// `n` more tokens fit at all ([`Error::ContextOverflow`] otherwise).
    pub fn check_fits(&self, n: usize) -> Result<()> {
        match self.overflow {
            Overflow::SlidingWindow { .. } => Ok(()),
            Overflow::Error => {
                let requested = self.len.saturating_add(n);
                if requested > self.capacity {
                    Err(Error::ContextOverflow { requested, allowed: self.capacity })
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Checks that one forward call may append `n` tokens (see [`KvCache::max_append`]).
    pub fn check_append(&self, n: usize) -> Result<()> {
        self.check_fits(n)?;
        if n > self.max_append() {
            return Err(Error::invalid_argument(
                "tokens",
                format!("a full sliding-window cache takes at most {} token(s) per forward call", self.max_append()),
            ));
        }
        Ok(())
    }

    fn region(&self, layer: usize, kv_head: usize) -> usize {
        (layer * self.n_kv_heads + kv_head) * self.capacity * self.head_dim
    }

    /// Stores position `pos`'s keys and values for one layer, `k` and `v` each
    /// [n_kv_heads][head_dim], rounded to the storage type.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        let slot = self.slot(pos);
        for g in 0..self.n_kv_heads {
            let at = self.region(layer, g) + slot * hd;
            self.k.put(at, &k[g * hd..(g + 1) * hd]);
            self.v.put(at, &v[g * hd..(g + 1) * hd]);
        }
    }

    /// Marks positions up to `len` (exclusive) written, after a forward call wrote them.
    pub fn advance_to(&mut self, len: usize) {
        assert!(len >= self.len, "the cache only grows forward");
        if len > self.capacity {
            // Writing position q >= capacity evicted position q - W.
            self.oldest = self.oldest.max(len - self.window());
        }
        self.len = len;
    }

    /// Drops every position from `n` on. Returns whether the kept prefix is still exactly
    /// cached; `false` means a sliding window had already overwritten keys the prefix needs,
    /// and the cache was emptied (the caller recomputes the prefix).
    pub fn truncate(&mut self, n: usize) -> bool {
        let n = n.min(self.len);
        let k = self.n_keep();
        // The next query (at position n) needs the ring positions max(k, n + 1 - W)..n.
        let needed_from = k.max((n + 1).saturating_sub(self.window()));
        if n <= k {
            self.oldest = k;
        } else if needed_from < self.oldest {
            self.clear();
            return false;
        }
        self.len = n;
        true
    }

    /// Forgets every position (the memory is kept).
    pub fn clear(&mut self) {
        self.len = 0;
        self.oldest = self.n_keep();
    }

    /// The slots query position `q` attends to, as up to three slot ranges in position
    /// order: the sinks, then the window (split in two where it wraps around the ring).
    /// Empty ranges are left out; the second value is how many ranges are used.
    pub fn pieces(&self, q: usize) -> ([Range<usize>; 3], usize) {
        self.pieces_from(q, 0)
    }

    /// As [`KvCache::pieces`], leaving out positions before `first` (a layer's own sliding
    /// window).
    pub fn pieces_from(&self, q: usize, first: usize) -> ([Range<usize>; 3], usize) {
        let mut out = [0..0, 0..0, 0..0];
        let mut n = 0;
        let mut push = |r: Range<usize>| {
            if !r.is_empty() {
                out[n] = r;
                n += 1;
            }
        };
        let k = self.n_keep();
        push(first.min(k)..k.min(q + 1));
        if q >= k {
            let from = k.max((q + 1).saturating_sub(self.window())).max(first);
            let (a, b) = (self.slot(from), self.slot(q));
            if a <= b {
                push(a..b + 1);
            } else {
                push(a..self.capacity);
                push(k..b + 1);
            }
        }
        (out, n)
    }

    /// Keys in `slots` for one layer and KV head, as a `slots.len() x head_dim` matrix.
    pub fn keys(&self, layer: usize, kv_head: usize, slots: Range<usize>) -> MatRef<'_> {
        self.rows(&self.k, layer, kv_head, slots)
    }

    /// Values in `slots` for one layer and KV head, as a `slots.len() x head_dim` matrix.
    pub fn values(&self, layer: usize, kv_head: usize, slots: Range<usize>) -> MatRef<'_> {
        self.rows(&self.v, layer, kv_head, slots)
    }

    fn rows<'a>(&self, store: &'a Store, layer: usize, kv_head: usize, slots: Range<usize>) -> MatRef<'a> {
        assert!(slots.end <= self.capacity);
        let b = self.dtype.bytes();
        let at = (self.region(layer, kv_head) + slots.start * self.head_dim) * b;
        MatRef {
            ty: self.dtype.ggml(),
            rows: slots.len(),
            cols: self.head_dim,
            data: &store.bytes()[at..at + slots.len() * self.head_dim * b],
        }
    }

    /// Slots that hold data worth saving: `min(len, capacity)` (later slots are either never
    /// written or stale tails that are rewritten before any query reads them).
    pub fn saved_slots(&self) -> usize {
        self.n_held()
    }

    /// Bytes of one region's first `rows` slots: (keys, values).
    pub fn region_bytes(&self, layer: usize, kv_head: usize, rows: usize) -> (&[u8], &[u8]) {
        let n = rows * self.head_dim * self.dtype.bytes();
        let at = self.region(layer, kv_head) * self.dtype.bytes();
        (&self.k.bytes()[at..at + n], &self.v.bytes()[at..at + n])
    }

    /// Mutable bytes of one region's first `rows` slots: (keys, values).
    pub fn region_bytes_mut(&mut self, layer: usize, kv_head: usize, rows: usize) -> (&mut [u8], &mut [u8]) {
        let n = rows * self.head_dim * self.dtype.bytes();
        let at = self.region(layer, kv_head) * self.dtype.bytes();
        (&mut self.k.bytes_mut()[at..at + n], &mut self.v.bytes_mut()[at..at + n])
    }

    /// Bytes of a row block: `n` slots of every layer and KV head, keys then values,
    /// [n_layers][n_kv_heads][2][n][head_dim] numbers in the storage type.
    pub fn slot_block_bytes(&self, n: usize) -> usize {
        2 * self.n_layers * self.n_kv_heads * n * self.head_dim * self.dtype.bytes()
    }

    /// Copies the stored keys and values of `slots` out as a row block (layout of
    /// [`KvCache::slot_block_bytes`]), bit for bit.
    pub fn read_slots(&self, slots: Range<usize>, out: &mut Vec<u8>) {
        assert!(slots.end <= self.capacity);
        let row = self.head_dim * self.dtype.bytes();
        out.clear();
        out.reserve(self.slot_block_bytes(slots.len()));
        for l in 0..self.n_layers {
            for g in 0..self.n_kv_heads {
                let at = self.region(l, g) * self.dtype.bytes();
                let range = at + slots.start * row..at + slots.end * row;
                out.extend_from_slice(&self.k.bytes()[range.clone()]);
                out.extend_from_slice(&self.v.bytes()[range]);
            }
        }
    }

    /// Stores a row block read by [`KvCache::read_slots`] from a cache of the same model and
    /// dtype into the slots from `start` on, bit for bit (the caller then marks the positions
    /// written with [`KvCache::advance_to`]).
    pub fn write_slots(&mut self, start: usize, block: &[u8]) {
        let row = self.head_dim * self.dtype.bytes();
        let per_region = 2 * row;
        let n = block.len() / (self.n_layers * self.n_kv_heads * per_region);
        assert_eq!(block.len(), self.slot_block_bytes(n), "a row block of this cache's shape");
        assert!(start + n <= self.capacity);
        let mut src = block.chunks_exact(n * row);
        for l in 0..self.n_layers {
            for g in 0..self.n_kv_heads {
                let at = self.region(l, g) * self.dtype.bytes();
                let range = at + start * row..at + (start + n) * row;
                self.k.bytes_mut()[range.clone()].copy_from_slice(src.next().expect("sized above"));
                self.v.bytes_mut()[range].copy_from_slice(src.next().expect("sized above"));
            }
        }
    }

    /// The bookkeeping needed to restore this cache: (len, oldest).
    pub fn cursor(&self) -> (usize, usize) {
        (self.len, self.oldest)
    }

    /// Restores the bookkeeping saved by [`KvCache::cursor`] (after the slots were filled),
    /// rejecting values no cache of these options could have had.
    pub fn set_cursor(&mut self, len: usize, oldest: usize) -> Result<()> {
        let k = self.n_keep();
        let consistent = match self.overflow {
            Overflow::Error => len <= self.capacity && oldest == 0,
            Overflow::SlidingWindow { .. } => {
                oldest >= k && oldest <= k.max((len + 1).saturating_sub(self.window()))
            }
        };
        if !consistent {
            return Err(Error::StateFormat(format!(
                "cache cursor (len {len}, oldest {oldest}) is impossible for a {} cache of {} positions",
                self.overflow.name(),
                self.capacity
            )));
        }
        self.len = len;
        self.oldest = oldest;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            traits: crate::model::config::ARCHITECTURES[0],
            n_layers: 2,
            d_model: 64,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 32,
            ffn_dim: 64,
            vocab_size: 10,
            context_length: 64,
            rope_base: 10000.0,
            rope_position_scale: 1.0,
            layers: vec![crate::model::config::LayerAttention { window: None, rope_base: 10000.0 }; 2],
            rms_eps: 1e-5,
            bos_id: None,
            eos_id: None,
        }
    }

    fn sliding(capacity: usize, n_keep: usize) -> KvCache {
        let o = KvCacheOptions { capacity, dtype: KvDtype::F32, overflow: Overflow::SlidingWindow { n_keep } };
        KvCache::with_options(&cfg(), &o).unwrap()
    }

    #[test]
    fn f16_storage_rounds_each_value_like_from_f32() {
        // Edge cases (overflow, the subnormal range, ties, signed zeros, infinities, NaN) and
        // a spread of bit patterns, stored as one row.
        let mut bits: Vec<u32> = vec![0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0001, 0x477f_f000, 0x477f_efff,
                                      0x3380_0000, 0x3380_0001, 0x3300_0000, 0x387f_e000, 0x3f80_1000, 0x3f80_3000];
        let mut x = 0x9e37_79b9u32;
        bits.extend((0..1 << 16).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        }));
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut store = Store::zeroed(KvDtype::F16, src.len() + 3).unwrap();
        store.put(3, &src);
        let Store::F16(stored) = &store else { unreachable!() };
        for (&s, &got) in src.iter().zip(&stored[3..]) {
            let want = half::f16::from_f32(s);
            assert!(got == want.to_bits() || (want.is_nan() && half::f16::from_bits(got).is_nan()), "{s:e}");
        }
    }

    /// The positions a query attends to, read back through `pieces` and a slot -> position map.
    fn attended(c: &KvCache, q: usize, owner: &[usize]) -> Vec<usize> {
        let (pieces, n) = c.pieces(q);
        pieces[..n].iter().flat_map(|r| r.clone()).map(|s| owner[s]).collect()
    }

    #[test]
    fn pieces_list_sinks_then_window_in_position_order() {
        for (capacity, n_keep) in [(8, 0), (8, 3), (5, 4), (7, 1)] {
            let mut c = sliding(capacity, n_keep);
            let mut owner = vec![usize::MAX; capacity];
            for q in 0..40 {
                owner[c.slot(q)] = q;
                c.advance_to(q + 1);
                let w = capacity - n_keep;
                let expected: Vec<usize> = (0..=q).filter(|&p| p < n_keep || p + w > q).collect();
                assert_eq!(attended(&c, q, &owner), expected, "capacity {capacity}, n_keep {n_keep}, q {q}");
            }
        }
    }

    #[test]
    fn error_policy_is_the_identity_layout() {
        let c = KvCache::new(&cfg(), 16).unwrap();
        for q in 0..16 {
            assert_eq!(c.slot(q), q);
            let (p, n) = c.pieces(q);
            assert_eq!((n, p[0].clone()), (1, 0..q + 1));
        }
        assert!(c.check_fits(16).is_ok());
        assert!(matches!(c.check_fits(17), Err(Error::ContextOverflow { requested: 17, allowed: 16 })));
    }

    #[test]
    fn truncation_keeps_the_cache_only_while_the_window_is_intact() {
        let mut c = sliding(8, 2);
        c.advance_to(6);
        assert!(c.truncate(3) && c.len() == 3);
        c.advance_to(20); // wrapped: ring holds 14..20
        assert!(c.truncate(19) && c.len() == 19); // position 19 needs 13..19 ⊂ present
        assert!(!c.truncate(17) && c.is_empty()); // 17 needs 11..17, 11..14 are gone
        c.advance_to(20);
        assert!(c.truncate(2) && c.len() == 2); // only sinks needed
        assert_eq!(c.max_append(), 6);
    }

    #[test]
    fn one_token_per_call_once_the_ring_is_full() {
        let mut c = sliding(8, 2);
        assert_eq!(c.max_append(), 8);
        c.advance_to(7);
        assert_eq!(c.max_append(), 1);
        c.advance_to(100);
        assert_eq!(c.max_append(), 1);
        assert!(c.check_append(2).is_err() && c.check_append(1).is_ok());
    }

    #[test]
    fn kv_bytes_counts_held_positions() {
        let o = KvCacheOptions { capacity: 10, dtype: KvDtype::F16, overflow: Overflow::SlidingWindow { n_keep: 1 } };
        let mut c = KvCache::with_options(&cfg(), &o).unwrap();
        c.advance_to(4);
        assert_eq!(c.kv_bytes(), 2 * 2 * 4 * 32 * 2);
        c.advance_to(25);
        assert_eq!(c.kv_bytes(), 2 * 2 * 10 * 32 * 2);
    }

    #[test]
    fn f16_storage_rounds_to_nearest_even() {
        let o = KvCacheOptions { capacity: 4, dtype: KvDtype::F16, overflow: Overflow::Error };
        let mut c = KvCache::with_options(&cfg(), &o).unwrap();
        let x: Vec<f32> = (0..32).map(|i| 1.0 + i as f32 * 1e-4).collect();
        c.write(1, 2, &x, &x);
        let keys = c.keys(1, 0, 2..3);
        for (i, b) in keys.data.chunks_exact(2).enumerate() {
            assert_eq!(half::f16::from_le_bytes([b[0], b[1]]), half::f16::from_f32(x[i]));
        }
    }
}
