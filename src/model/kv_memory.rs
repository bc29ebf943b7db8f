//! The memory KV caches store keys and values in: one region per layer and KV head, each a
//! run of slots of `head_dim` numbers (f32 or f16), cut into blocks of `block_slots` slots.
//!
//! A cache with memory of its own (a session's) has one block of its whole capacity. The
//! batch engine's caches share one memory of many small blocks (a pool): a cache's block
//! table names the block that holds each run of `block_slots` of its positions, and a block
//! of a common prompt prefix can be in the tables of several caches at once.
//!
//! # Sharing
//!
//! `holders` counts the caches (and the prefix cache) holding each block. A cache writes a
//! block only while it is its only holder ([`KvMemory::put`] checks), and a block gets a
//! second holder only once it is full, so a shared block is read-only: no position of it
//! is ever written again. Reads and writes of different blocks touch disjoint bytes.
//!
//! Memory is reserved once, zeroed by the allocator (pages become resident only when
//! written). Values are stored rounded to the storage type (f16: round to nearest even) when
//! written, before attention reads them, so prefill and decode read the same bits.

use half::slice::HalfFloatSliceExt;
use std::alloc::Layout;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use super::kv_cache::KvDtype;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;

/// Zero-filled bytes from the allocator's zeroed memory (lazily committed by the OS), written
/// and read through ranges that the owner keeps disjoint.
struct RawBytes {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain bytes; who may touch which range is [`KvMemory`]'s discipline.
unsafe impl Send for RawBytes {}
// SAFETY: as above.
unsafe impl Sync for RawBytes {}

impl RawBytes {
    /// `n` zero bytes aligned for f32 and f16, or an error instead of an abort when the allocation fails.
    fn zeroed(n: usize) -> Result<RawBytes> {
        let too_large = || Error::invalid_argument("context_length", "the KV cache does not fit in memory");
        // The alignment of the allocator's own (16): with it, zeroed memory comes from calloc,
        // which maps fresh zero pages; a larger one would make the allocator write every byte.
        let layout = Layout::from_size_align(n.max(16), 16).map_err(|_| too_large())?;
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        Ok(RawBytes { ptr: NonNull::new(ptr).ok_or_else(too_large)?, layout })
    }

    /// # Safety
    /// `range` within the allocation, and no `&mut` to any of its bytes alive.
    unsafe fn get(&self, range: Range<usize>) -> &[u8] {
        debug_assert!(range.start <= range.end && range.end <= self.layout.size());
        // SAFETY: the caller's precondition.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(range.start), range.len()) }
    }

    /// # Safety
    /// `range` within the allocation, and no other reference to any of its bytes alive.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get_mut(&self, range: Range<usize>) -> &mut [u8] {
        debug_assert!(range.start <= range.end && range.end <= self.layout.size());
        // SAFETY: the caller's precondition.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(range.start), range.len()) }
    }
}

impl Drop for RawBytes {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Keys and values of `n_blocks` blocks of `block_slots` slots (see the [module docs](self)).
pub struct KvMemory {
    n_layers: usize,
    n_kv_heads: usize,
    head_dim: usize,
    dtype: KvDtype,
    block_slots: usize,
    /// Slots per region: `n_blocks * block_slots`.
    slots: usize,
    /// [n_layers][n_kv_heads][slots][head_dim] keys, in `dtype`
    k: RawBytes,
    /// [n_layers][n_kv_heads][slots][head_dim] values, in `dtype`
    v: RawBytes,
    /// [n_blocks] caches (and prefix caches) holding each block
    holders: Box<[AtomicU32]>,
}

impl KvMemory {
    /// Zeroed memory for `n_blocks` blocks of `block_slots` slots of `cfg`'s keys and values.
    pub fn new(cfg: &ModelConfig, dtype: KvDtype, block_slots: usize, n_blocks: usize) -> Result<KvMemory> {
        let slots = block_slots
            .checked_mul(n_blocks)
            .filter(|&s| s > 0 && u32::try_from(n_blocks).is_ok())
            .ok_or_else(|| Error::invalid_argument("context_length", format!("{n_blocks} blocks of {block_slots}")))?;
        let bytes = cfg
            .n_layers
            .checked_mul(cfg.d_kv())
            .and_then(|x| x.checked_mul(slots))
            .and_then(|x| x.checked_mul(dtype.bytes()))
            .filter(|&n| n <= isize::MAX as usize / 2)
            .ok_or_else(|| Error::invalid_argument("context_length", format!("{slots} positions is too large")))?;
        Ok(KvMemory {
            n_layers: cfg.n_layers,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            dtype,
            block_slots,
            slots,
            k: RawBytes::zeroed(bytes)?,
            v: RawBytes::zeroed(bytes)?,
            holders: (0..n_blocks).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    pub fn block_slots(&self) -> usize {
        self.block_slots
    }

    pub fn n_blocks(&self) -> usize {
        self.holders.len()
    }

    /// Bytes of one block: keys and values of its slots in every layer and KV head.
    pub fn block_bytes(&self) -> usize {
        2 * self.n_layers * self.n_kv_heads * self.block_slots * self.head_dim * self.dtype.bytes()
    }

    /// How many caches hold `block`.
    pub fn holders(&self, block: u32) -> u32 {
        self.holders[block as usize].load(Ordering::Relaxed)
    }

    /// One more holder of `block`.
    pub fn retain(&self, block: u32) {
        self.holders[block as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// One holder of `block` fewer; returns how many are left.
    pub fn release(&self, block: u32) -> u32 {
        let before = self.holders[block as usize].fetch_sub(1, Ordering::Relaxed);
        assert!(before > 0, "block {block} released more often than held");
        before - 1
    }

    /// Byte range of `slots` (memory slots) in region `(layer, kv_head)`.
    fn range(&self, layer: usize, kv_head: usize, slots: Range<usize>) -> Range<usize> {
        assert!(layer < self.n_layers && kv_head < self.n_kv_heads && slots.start <= slots.end && slots.end <= self.slots);
        let row = self.head_dim * self.dtype.bytes();
        let region = (layer * self.n_kv_heads + kv_head) * self.slots * row;
        region + slots.start * row..region + slots.end * row
    }

    /// Keys and values of `slots` (memory slots) of region `(layer, kv_head)`, as bytes.
    ///
    /// # Safety
    /// No slot in `slots` may be written while the slices live: the caller reads only slots
    /// of full blocks or of its own blocks, and writes only through `&mut` of its own cache.
    pub(crate) unsafe fn rows(&self, layer: usize, kv_head: usize, slots: Range<usize>) -> (&[u8], &[u8]) {
        let range = self.range(layer, kv_head, slots);
        // SAFETY: in bounds (checked by `range`); no writer, by the caller's precondition.
        unsafe { (self.k.get(range.clone()), self.v.get(range)) }
    }

    /// Mutable keys and values of `slots` (memory slots) of region `(layer, kv_head)`, as bytes.
    ///
    /// # Safety
    /// The slots lie in blocks the caller's cache holds alone (asserted), and no other
    /// reference to them is alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn rows_mut(&self, layer: usize, kv_head: usize, slots: Range<usize>) -> (&mut [u8], &mut [u8]) {
        if !slots.is_empty() {
            for block in slots.start / self.block_slots..=(slots.end - 1) / self.block_slots {
                assert_eq!(self.holders(block as u32), 1, "a shared block is never written");
            }
        }
        let range = self.range(layer, kv_head, slots);
        // SAFETY: in bounds; the blocks have one holder, the caller, which holds `&mut` of
        // its cache, so nothing else reads or writes them.
        unsafe { (self.k.get_mut(range.clone()), self.v.get_mut(range)) }
    }

    /// Stores one slot's key and value in region `(layer, kv_head)`, rounded to the storage
    /// type (f16: round to nearest even, like `f16::from_f32`, by F16C when the CPU has it).
    ///
    /// # Safety
    /// As for [`KvMemory::rows_mut`].
    pub(crate) unsafe fn put(&self, layer: usize, kv_head: usize, slot: usize, k: &[f32], v: &[f32]) {
        // SAFETY: the caller's precondition.
        let (kd, vd) = unsafe { self.rows_mut(layer, kv_head, slot..slot + 1) };
        for (dst, src) in [(kd, k), (vd, v)] {
            assert_eq!(dst.len(), src.len() * self.dtype.bytes());
            match self.dtype {
                KvDtype::F32 => {
                    for (d, x) in dst.chunks_exact_mut(4).zip(src) {
                        d.copy_from_slice(&x.to_le_bytes());
                    }
                }
                KvDtype::F16 => {
                    // SAFETY: the region starts are multiples of the 16-byte-aligned base plus
                    // whole rows of 2-byte numbers, so `dst` is aligned for f16, and it holds
                    // `src.len()` of them (asserted); every bit pattern is a valid f16.
                    let h = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<half::f16>(), src.len()) };
                    h.convert_from_f32_slice(src);
                }
            }
        }
    }

    /// Whether blocks `a` and `b` hold the same bytes in every region.
    pub fn blocks_equal(&self, a: u32, b: u32) -> bool {
        let (bs, a, b) = (self.block_slots, a as usize, b as usize);
        (0..self.n_layers).all(|l| {
            (0..self.n_kv_heads).all(|g| {
                // SAFETY: only full blocks are compared, and full blocks are never written.
                let (x, y) = unsafe { (self.rows(l, g, a * bs..(a + 1) * bs), self.rows(l, g, b * bs..(b + 1) * bs)) };
                x == y
            })
        })
    }

    /// The bytes of `block` in every region, keys then values per region (for tests).
    pub fn block_contents(&self, block: u32) -> Vec<u8> {
        let (bs, b) = (self.block_slots, block as usize);
        let mut out = Vec::with_capacity(self.block_bytes());
        for l in 0..self.n_layers {
            for g in 0..self.n_kv_heads {
                // SAFETY: called between passes, when nothing writes.
                let (k, v) = unsafe { self.rows(l, g, b * bs..(b + 1) * bs) };
                out.extend_from_slice(k);
                out.extend_from_slice(v);
            }
        }
        out
    }
}
