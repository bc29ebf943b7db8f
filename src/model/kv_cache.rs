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
//! The keys a query reads are at most three contiguous slot ranges, listed in position order;
//! attention walks them in that order, so the op sequence for a query depends only on which
//! positions it attends to, never on where they sit.
//!
//! # Storage
//!
//! Slots live in a [`KvMemory`]. A cache made by [`KvCache::with_options`] (a session's) has
//! memory of its own: one block of `capacity` slots, so slot `s` is memory slot `s`. A cache
//! made by [`KvCache::paged`] (the batch engine's) has a block table into a memory shared
//! with other caches: slot `s` is memory slot `table[s / B] * B + s % B` with `B` the memory's
//! block size, and blocks are added as the sequence grows ([`KvCache::push_block`]). Such a
//! cache never slides (slot `p` is position `p`), and its table may begin with full blocks
//! that other caches hold too (a shared prompt prefix). [`KvCache::pieces_into`] maps the
//! slots a query reads to memory slot ranges, merging blocks that are adjacent in memory; the
//! split into ranges changes no bit (the attention kernels take any split of the keys as
//! one sequence).

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::kernels::packed::Layout;
use crate::kernels::MatRef;
use crate::model::config::ModelConfig;
use super::kv_memory::KvMemory;
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

    pub(crate) fn ggml(self) -> GgmlType {
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

/// Keys and values of the positions a sequence may still attend to.
pub struct KvCache {
    capacity: usize,
    overflow: Overflow,
    memory: Arc<KvMemory>,
    /// Whether `memory` is shared (a block table into a pool) rather than the cache's own.
    paged: bool,
    /// [blocks held] the memory block of each run of `memory.block_slots()` slots
    table: Vec<u32>,
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
        let memory = KvMemory::new(cfg, dtype, capacity, 1)?;
        memory.retain(0);
        Ok(KvCache { capacity, overflow, memory: Arc::new(memory), paged: false, table: vec![0], len: 0, oldest: overflow.n_keep() })
    }

    /// An empty cache of at most `capacity` positions in blocks of the shared `memory`, added
    /// with [`KvCache::push_block`]; it never slides.
    pub fn paged(memory: Arc<KvMemory>, capacity: usize) -> KvCache {
        KvCache { capacity, overflow: Overflow::Error, memory, paged: true, table: Vec::new(), len: 0, oldest: 0 }
    }

    /// The memory the cache's slots live in.
    pub fn memory(&self) -> &Arc<KvMemory> {
        &self.memory
    }

    /// The memory blocks holding the cache's slots, in slot order.
    pub fn blocks(&self) -> &[u32] {
        &self.table
    }

    /// Slots the held blocks cover.
    pub fn granted(&self) -> usize {
        self.table.len() * self.memory.block_slots()
    }

    /// Adds memory block `block` after the blocks held, as one more holder of it. It must be
    /// a free block (then the cache writes it) or a full block whose slots are the same
    /// positions in this cache (a shared prefix, which it only reads).
    pub fn push_block(&mut self, block: u32) {
        assert!(self.paged, "a cache with its own memory has one block");
        self.memory.retain(block);
        self.table.push(block);
    }

    /// Makes `block` (a full block with the same bytes, held elsewhere) the block of the
    /// cache's `i`th run of slots, as one more holder of it; returns the block it replaces,
    /// whose holder the caller releases.
    pub fn replace_block(&mut self, i: usize, block: u32) -> u32 {
        assert!(self.paged && (i + 1) * self.memory.block_slots() <= self.len, "only full blocks are replaced");
        self.memory.retain(block);
        std::mem::replace(&mut self.table[i], block)
    }

    /// Empties the cache and hands back its blocks (the caller releases their holders).
    pub fn take_blocks(&mut self) -> Vec<u32> {
        assert!(self.paged, "a cache with its own memory keeps it");
        self.clear();
        std::mem::take(&mut self.table)
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn dtype(&self) -> KvDtype {
        self.memory.dtype()
    }

    pub fn overflow(&self) -> Overflow {
        self.overflow
    }

    pub fn options(&self) -> KvCacheOptions {
        KvCacheOptions { capacity: self.capacity, dtype: self.dtype(), overflow: self.overflow }
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
        self.n_held() * self.memory.block_bytes() / self.memory.block_slots()
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

    /// The memory slot of slot `s`.
    fn memory_slot(&self, s: usize) -> usize {
        let bs = self.memory.block_slots();
        self.table[s / bs] as usize * bs + s % bs
    }

    /// Stores position `pos`'s keys and values for one layer, `k` and `v` each
    /// [n_kv_heads][head_dim], rounded to the storage type.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let slot = self.slot(pos);
        assert!(slot < self.granted(), "position {pos} lies beyond the cache's blocks");
        let at = self.memory_slot(slot);
        let hd = self.memory.head_dim();
        for g in 0..self.memory.n_kv_heads() {
            // SAFETY: `&mut self`: this cache holds the block, and `put` checks that nothing
            // else does; no reference into it from `keys`/`values` outlives their borrow of
            // `self`.
            unsafe { self.memory.put(layer, g, at, &k[g * hd..(g + 1) * hd], &v[g * hd..(g + 1) * hd]) };
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

    /// The memory slots query position `q` attends to (leaving out positions before `first`,
    /// a layer's own sliding window), as ranges in position order, in `out`: the sinks, then
    /// the window (split where it wraps around the ring), each split where the blocks holding
    /// it are not adjacent in memory.
    pub fn pieces_into(&self, q: usize, first: usize, out: &mut Vec<Range<usize>>) {
        out.clear();
        let bs = self.memory.block_slots();
        let mut push = |r: Range<usize>| {
            let mut s = r.start;
            while s < r.end {
                let end = r.end.min((s / bs + 1) * bs);
                let m = self.memory_slot(s);
                match out.last_mut() {
                    Some(last) if last.end == m => last.end += end - s,
                    _ => out.push(m..m + end - s),
                }
                s = end;
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
    }

    /// Keys in memory slots `slots` (from [`KvCache::pieces_into`]) for one layer and KV head,
    /// as a `slots.len() x head_dim` matrix.
    pub fn keys(&self, layer: usize, kv_head: usize, slots: Range<usize>) -> MatRef<'_> {
        self.rows(layer, kv_head, slots).0
    }

    /// Values in memory slots `slots` for one layer and KV head, as a `slots.len() x head_dim`
    /// matrix.
    pub fn values(&self, layer: usize, kv_head: usize, slots: Range<usize>) -> MatRef<'_> {
        self.rows(layer, kv_head, slots).1
    }

    fn rows(&self, layer: usize, kv_head: usize, slots: Range<usize>) -> (MatRef<'_>, MatRef<'_>) {
        let n = slots.len();
        // SAFETY: the slots are this cache's (pieces of its table): blocks it holds alone,
        // written only through `&mut self`, which this borrow excludes, or full shared
        // blocks, which nobody writes.
        let (k, v) = unsafe { self.memory.rows(layer, kv_head, slots) };
        let ty = self.dtype().ggml();
        let cols = self.memory.head_dim();
        (MatRef { ty, rows: n, cols, layout: Layout::Grouped, data: k }, MatRef { ty, rows: n, cols, layout: Layout::Grouped, data: v })
    }

    /// Slots that hold data worth saving: `min(len, capacity)` (later slots are either never
    /// written or stale tails that are rewritten before any query reads them).
    pub fn saved_slots(&self) -> usize {
        self.n_held()
    }

    /// Bytes of one region's first `rows` slots: (keys, values), of a cache with its own memory.
    pub fn region_bytes(&self, layer: usize, kv_head: usize, rows: usize) -> (&[u8], &[u8]) {
        assert!(!self.paged && rows <= self.capacity);
        // SAFETY: the cache's own memory, and `&self` excludes its writer.
        unsafe { self.memory.rows(layer, kv_head, 0..rows) }
    }

    /// Mutable bytes of one region's first `rows` slots: (keys, values), of a cache with its
    /// own memory.
    pub fn region_bytes_mut(&mut self, layer: usize, kv_head: usize, rows: usize) -> (&mut [u8], &mut [u8]) {
        assert!(!self.paged && rows <= self.capacity);
        // SAFETY: the cache's own memory, held by it alone (checked), and `&mut self`.
        unsafe { self.memory.rows_mut(layer, kv_head, 0..rows) }
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
        // a spread of bit patterns, stored one row of 32 at a time.
        let mut bits: Vec<u32> = vec![0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0001, 0x477f_f000, 0x477f_efff,
                                      0x3380_0000, 0x3380_0001, 0x3300_0000, 0x387f_e000, 0x3f80_1000, 0x3f80_3000];
        let mut x = 0x9e37_79b9u32;
        bits.extend((0..1 << 14).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        }));
        bits.resize(bits.len().next_multiple_of(32), 0x3c00_0000);
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let o = KvCacheOptions { capacity: src.len() / 32 + 3, dtype: KvDtype::F16, overflow: Overflow::Error };
        let mut c = KvCache::with_options(&cfg(), &o).unwrap();
        for (i, row) in src.chunks_exact(32).enumerate() {
            c.write(1, i + 3, row, row);
        }
        let keys = c.keys(1, 0, 3..3 + src.len() / 32);
        for (&s, got) in src.iter().zip(keys.data.chunks_exact(2)) {
            let (got, want) = (u16::from_le_bytes([got[0], got[1]]), half::f16::from_f32(s));
            assert!(got == want.to_bits() || (want.is_nan() && half::f16::from_bits(got).is_nan()), "{s:e}");
        }
    }

    /// The positions a query attends to, read back through `pieces` and a slot -> position map.
    fn attended(c: &KvCache, q: usize, owner: &[usize]) -> Vec<usize> {
        let mut pieces = Vec::new();
        c.pieces_into(q, 0, &mut pieces);
        assert!(pieces.len() <= 3 && pieces.iter().all(|r| !r.is_empty()));
        pieces.iter().flat_map(|r| r.clone()).map(|s| owner[s]).collect()
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
            let mut p = Vec::new();
            c.pieces_into(q, 0, &mut p);
            assert_eq!((p.len(), p[0].clone()), (1, 0..q + 1), "one piece: the whole prefix");
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

    #[test]
    fn a_paged_cache_reads_its_blocks_in_position_order_merging_adjacent_ones() {
        let memory = Arc::new(KvMemory::new(&cfg(), KvDtype::F32, 4, 8).unwrap());
        let mut c = KvCache::paged(Arc::clone(&memory), 20);
        for b in [5, 6, 2, 3, 0] {
            c.push_block(b);
        }
        // Slots 0..20 live in memory slots 20..28, 8..16, 0..4.
        let owner: Vec<usize> = (0..32).map(|m| match m {
            20..28 => m - 20,
            8..16 => m - 8 + 8,
            0..4 => m + 16,
            _ => usize::MAX,
        }).collect();
        let mut pieces = Vec::new();
        for q in 0..20 {
            c.advance_to(q + 1);
            c.pieces_into(q, 0, &mut pieces);
            let expected: Vec<Range<usize>> = [20..28, 8..16, 0..4]
                .into_iter()
                .scan(0, |start, r| {
                    let n = r.len().min((q + 1).saturating_sub(*start));
                    *start += r.len();
                    Some(r.start..r.start + n)
                })
                .filter(|r| !r.is_empty())
                .collect();
            assert_eq!(pieces, expected, "q {q}");
            assert_eq!(attended(&c, q, &owner), (0..=q).collect::<Vec<_>>());
        }
        c.pieces_into(13, 6, &mut pieces);
        assert_eq!(pieces, [26..28, 8..14]);
    }

    #[test]
    #[should_panic(expected = "a shared block is never written")]
    fn a_shared_block_is_never_written() {
        let memory = Arc::new(KvMemory::new(&cfg(), KvDtype::F32, 4, 2).unwrap());
        let (mut a, mut b) = (KvCache::paged(Arc::clone(&memory), 8), KvCache::paged(Arc::clone(&memory), 8));
        a.push_block(1);
        b.push_block(1);
        a.write(0, 0, &[0.0; 32], &[0.0; 32]);
    }
}
