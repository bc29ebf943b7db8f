//! The prefix cache: the keys and values of full blocks of [`BLOCK_TOKENS`] positions that
//! earlier sequences computed, kept across requests so that a later prompt starting with the
//! same tokens copies them instead of computing them.
//!
//! # Keys
//!
//! Block `i` of a sequence covers positions `i * B .. (i + 1) * B` (`B = BLOCK_TOKENS`). Its
//! rows depend on every token up to the end of the block and on nothing else but the model
//! file, the matmul precision and the KV dtype, so its key is a hash chain:
//! `key_i = XXH64(key_{i-1} || tokens of block i)`, with `key_{-1}` a hash of the model file's
//! fingerprint, the precision and the KV dtype ([`PrefixCache::new`]'s `identity`). A cache
//! belongs to one loaded model, so the identity is the same for all its blocks; it is in the
//! key so that a cache shared by several models could never mix them.
//!
//! Every block stores its own token ids and its parent's key, and a lookup walks the chain
//! from the first block, comparing both: a hash collision is never taken for a match. A block
//! is evicted only when no cached block has it as parent (leaves first), so the parent a
//! stored block names is always the block it was computed after.
//!
//! # Memory
//!
//! The blocks' bytes stay within `max_bytes`: inserting a block first evicts the least
//! recently used blocks that no running sequence reads and that have no cached children; if
//! that frees too little, the block is not stored. A sequence that reused blocks holds them
//! ([`PrefixCache::lookup`] pins, [`PrefixCache::release`] unpins) until it ends.
//!
//! # Bits
//!
//! A block holds the exact bytes the cache stored (already rounded to the KV dtype). A
//! multi-token pass computes each row with the op sequence of a single step, and attention
//! reads the keys of positions `0..=q` in position order with chunks fixed by positions, so a
//! copied prefix gives the same bits as a computed one.

use std::collections::{BTreeSet, HashMap};

use crate::model::{KvCache, Overflow};
use crate::state::xxh64;

/// Positions per cached block.
pub const BLOCK_TOKENS: usize = 16;

/// A cached block.
struct Block {
    /// The key of the block before it (`None`: the first block of a sequence).
    parent: Option<u64>,
    /// [BLOCK_TOKENS] the token ids of the block's positions
    tokens: Vec<u32>,
    /// [n_layers][n_kv_heads][2: keys, values][BLOCK_TOKENS][head_dim] numbers in the KV
    /// dtype, as bytes ([`KvCache::read_slots`])
    rows: Vec<u8>,
    /// Tick of the last lookup or insertion that used it.
    last_use: u64,
    /// Cached blocks whose parent it is.
    children: usize,
    /// Running sequences that reused it.
    readers: usize,
}

/// Counters of a [`PrefixCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Blocks found at admission (each saves `BLOCK_TOKENS` prompt positions).
    pub hits: u64,
    /// Full prompt blocks looked up at admission and not found (they are computed).
    pub misses: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Bytes of the blocks held now.
    pub bytes: usize,
}

/// Full blocks of computed sequences, by hash chain (see the [module docs](self)).
pub struct PrefixCache {
    /// `key_{-1}` of every chain: the model file, precision and KV dtype.
    root: u64,
    /// Bound on the bytes of all blocks.
    max_bytes: usize,
    /// Bytes of one block's rows.
    block_bytes: usize,
    blocks: HashMap<u64, Block>,
    /// (last use, key) of every block, least recently used first.
    lru: BTreeSet<(u64, u64)>,
    clock: u64,
    stats: PrefixCacheStats,
}

impl PrefixCache {
    /// An empty cache of at most `max_bytes` for blocks of `block_bytes` each, for the model,
    /// precision and KV dtype that `identity` names (their bytes, e.g. the file's fingerprint
    /// and two type codes).
    pub fn new(identity: &[u8], block_bytes: usize, max_bytes: usize) -> PrefixCache {
        PrefixCache {
            root: xxh64(identity, 0),
            max_bytes,
            block_bytes,
            blocks: HashMap::new(),
            lru: BTreeSet::new(),
            clock: 0,
            stats: PrefixCacheStats::default(),
        }
    }

    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats { bytes: self.blocks.len() * self.block_bytes, ..self.stats }
    }

    /// Number of blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Whether the block of `key` is held.
    pub fn contains(&self, key: u64) -> bool {
        self.blocks.contains_key(&key)
    }

    /// The key of the block of `tokens` after the block `parent` (`None`: the first block).
    pub fn key(&self, parent: Option<u64>, tokens: &[u32]) -> u64 {
        let mut bytes = Vec::with_capacity(8 + 4 * tokens.len());
        bytes.extend_from_slice(&parent.unwrap_or(self.root).to_le_bytes());
        tokens.iter().for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
        xxh64(&bytes, 0)
    }

    fn touch(&mut self, key: u64) {
        self.clock += 1;
        if let Some(block) = self.blocks.get_mut(&key) {
            self.lru.remove(&(block.last_use, key));
            block.last_use = self.clock;
            self.lru.insert((self.clock, key));
        }
    }

    /// The keys of the longest chain of cached blocks that `tokens` starts with (whole blocks
    /// only; a trailing partial block is not looked up). The blocks found are pinned until
    /// [`PrefixCache::release`]; counts one hit per block found and one miss per full block
    /// not found.
    pub fn lookup(&mut self, tokens: &[u32]) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut parent = None;
        for chunk in tokens.chunks_exact(BLOCK_TOKENS) {
            let key = self.key(parent, chunk);
            match self.blocks.get(&key) {
                Some(b) if b.parent == parent && b.tokens == chunk => {}
                _ => break,
            }
            self.touch(key);
            self.blocks.get_mut(&key).expect("found above").readers += 1;
            keys.push(key);
            parent = Some(key);
        }
        self.stats.hits += keys.len() as u64;
        self.stats.misses += (tokens.len() / BLOCK_TOKENS - keys.len()) as u64;
        keys
    }

    /// Copies the rows of the chain `keys` (from [`PrefixCache::lookup`]) into the empty
    /// `cache` (one that never slides, so slot `p` holds position `p`), positions
    /// `0 .. keys.len() * BLOCK_TOKENS`, and marks them written.
    pub fn copy_into(&self, keys: &[u64], cache: &mut KvCache) {
        assert!(cache.is_empty(), "blocks are copied into a fresh cache");
        assert_eq!(cache.overflow(), Overflow::Error, "slot p holds position p");
        for (i, key) in keys.iter().enumerate() {
            cache.write_slots(i * BLOCK_TOKENS, &self.blocks[key].rows);
        }
        cache.advance_to(keys.len() * BLOCK_TOKENS);
    }

    /// Unpins blocks pinned by [`PrefixCache::lookup`].
    pub fn release(&mut self, keys: &[u64]) {
        for key in keys {
            if let Some(block) = self.blocks.get_mut(key) {
                block.readers -= 1;
            }
        }
    }

    /// Stores the block of `tokens` ([`BLOCK_TOKENS`] ids) after the block `parent`, its rows
    /// read from `cache` (one that never slides) at `slots` when it is not held yet. Returns its key, or `None` when
    /// it cannot be stored (no room, the parent is gone, or another block holds its key), in
    /// which case no later block of the chain can be either.
    pub fn insert(&mut self, parent: Option<u64>, tokens: &[u32], cache: &KvCache, slots: std::ops::Range<usize>) -> Option<u64> {
        debug_assert_eq!(tokens.len(), BLOCK_TOKENS);
        let key = self.key(parent, tokens);
        if let Some(b) = self.blocks.get(&key) {
            if b.parent != parent || b.tokens != tokens {
                return None;
            }
            self.touch(key);
            return Some(key);
        }
        if let Some(p) = parent {
            // The parent is held while room is made, so the chain stays whole.
            self.blocks.get_mut(&p)?.children += 1;
        }
        if !self.make_room() {
            if let Some(p) = parent {
                self.blocks.get_mut(&p).expect("held above").children -= 1;
            }
            return None;
        }
        assert_eq!(cache.overflow(), Overflow::Error, "slot p holds position p");
        let mut rows = Vec::new();
        cache.read_slots(slots, &mut rows);
        debug_assert_eq!(rows.len(), self.block_bytes);
        self.clock += 1;
        let block = Block { parent, tokens: tokens.to_vec(), rows, last_use: self.clock, children: 0, readers: 0 };
        self.blocks.insert(key, block);
        self.lru.insert((self.clock, key));
        Some(key)
    }

    /// Evicts unread leaf blocks, least recently used first, until one more block fits;
    /// returns whether it does.
    fn make_room(&mut self) -> bool {
        while (self.blocks.len() + 1) * self.block_bytes > self.max_bytes {
            let victim = self.lru.iter().find(|(_, key)| {
                let b = &self.blocks[key];
                b.children == 0 && b.readers == 0
            });
            let Some(&(tick, key)) = victim else { return false };
            self.lru.remove(&(tick, key));
            let block = self.blocks.remove(&key).expect("listed blocks are held");
            if let Some(p) = block.parent {
                self.blocks.get_mut(&p).expect("a parent outlives its children").children -= 1;
            }
            self.stats.evictions += 1;
        }
        true
    }

    /// Checks the cache's invariants (for tests): every block's parent is held and counts it
    /// as a child, the LRU list names every block once, and the bytes are within the bound.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut children: HashMap<u64, usize> = HashMap::new();
        for (key, b) in &self.blocks {
            if let Some(p) = b.parent {
                if !self.blocks.contains_key(&p) {
                    return Err(format!("block {key:016x} names an evicted parent"));
                }
                *children.entry(p).or_default() += 1;
            }
            if !self.lru.contains(&(b.last_use, *key)) {
                return Err(format!("block {key:016x} is not in the LRU list"));
            }
        }
        if let Some((key, b)) = self.blocks.iter().find(|(k, b)| children.get(k).copied().unwrap_or(0) != b.children) {
            return Err(format!("block {key:016x} counts {} children", b.children));
        }
        if self.lru.len() != self.blocks.len() {
            return Err("the LRU list names blocks that are not held".into());
        }
        if self.blocks.len() * self.block_bytes > self.max_bytes {
            return Err(format!("{} bytes exceed the bound {}", self.blocks.len() * self.block_bytes, self.max_bytes));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{LayerAttention, ModelConfig, ARCHITECTURES};
    use crate::model::{KvCacheOptions, KvDtype};

    fn cfg() -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            traits: ARCHITECTURES[0],
            n_layers: 2,
            d_model: 16,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            ffn_dim: 16,
            vocab_size: 100,
            context_length: 256,
            rope_base: 10000.0,
            rope_position_scale: 1.0,
            layers: vec![LayerAttention { window: None, rope_base: 10000.0 }; 2],
            rms_eps: 1e-5,
            bos_id: None,
            eos_id: None,
        }
    }

    /// A cache whose rows at position p hold a value made of (seed, p, layer, half).
    fn filled(tokens: &[u32], dtype: KvDtype) -> KvCache {
        let cfg = cfg();
        let options = KvCacheOptions { capacity: 256, dtype, overflow: Overflow::Error };
        let mut cache = KvCache::with_options(&cfg, &options).unwrap();
        for (p, &t) in tokens.iter().enumerate() {
            for l in 0..cfg.n_layers {
                let k: Vec<f32> = (0..4).map(|j| (t as f32) * 0.5 + (p * 10 + l) as f32 + j as f32 * 0.01).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                cache.write(l, p, &k, &v);
            }
        }
        cache.advance_to(tokens.len());
        cache
    }

    fn insert_all(pc: &mut PrefixCache, tokens: &[u32], cache: &KvCache) -> Vec<u64> {
        let mut keys = Vec::new();
        for (i, chunk) in tokens.chunks_exact(BLOCK_TOKENS).enumerate() {
            match pc.insert(keys.last().copied(), chunk, cache, i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS) {
                Some(k) => keys.push(k),
                None => break,
            }
        }
        keys
    }

    #[test]
    fn copied_blocks_are_the_stored_bytes_and_chains_stop_where_prompts_diverge() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let a: Vec<u32> = (0..50).map(|i| (i * 7 % 100) as u32).collect();
            let source = filled(&a, dtype);
            let block_bytes = source.slot_block_bytes(BLOCK_TOKENS);
            let mut pc = PrefixCache::new(b"model", block_bytes, 100 * block_bytes);
            assert_eq!(insert_all(&mut pc, &a, &source).len(), 3);
            // Same first 20 tokens, then different: one block (positions 0..16) matches.
            let mut b = a.clone();
            b[20] += 1;
            let keys = pc.lookup(&b[..48]);
            assert_eq!(keys.len(), 1);
            assert_eq!((pc.stats().hits, pc.stats().misses), (1, 2));
            let mut fresh = KvCache::with_options(&cfg(), &source.options()).unwrap();
            pc.copy_into(&keys, &mut fresh);
            assert_eq!(fresh.len(), 16);
            let (mut x, mut y) = (Vec::new(), Vec::new());
            source.read_slots(0..16, &mut x);
            fresh.read_slots(0..16, &mut y);
            assert_eq!(x, y);
            // A different first token: nothing matches.
            let mut c = a.clone();
            c[0] += 1;
            assert!(pc.lookup(&c).is_empty());
            pc.release(&keys);
            pc.check_invariants().unwrap();
        }
    }

    #[test]
    fn another_identity_never_matches() {
        let a: Vec<u32> = (0..32).collect();
        let source = filled(&a, KvDtype::F32);
        let bytes = source.slot_block_bytes(BLOCK_TOKENS);
        let mut one = PrefixCache::new(b"model a, f32", bytes, 10 * bytes);
        let two = PrefixCache::new(b"model a, f16", bytes, 10 * bytes);
        insert_all(&mut one, &a, &source);
        let k = one.key(None, &a[..16]);
        assert!(one.contains(k));
        assert_ne!(two.key(None, &a[..16]), k);
    }

    #[test]
    fn eviction_keeps_the_bound_and_spares_read_blocks_and_parents() {
        let bytes = filled(&[], KvDtype::F32).slot_block_bytes(BLOCK_TOKENS);
        let bound = 10 * bytes + bytes / 2; // room for 10 blocks
        let mut pc = PrefixCache::new(b"m", bytes, bound);
        // A conversation of 4 blocks that a running sequence reads.
        let held: Vec<u32> = (0..64).map(|i| i as u32).collect();
        insert_all(&mut pc, &held, &filled(&held, KvDtype::F32));
        let pinned = pc.lookup(&held);
        assert_eq!(pinned.len(), 4);
        // Many other prompts, far past the bound.
        for s in 0..40u32 {
            let tokens: Vec<u32> = (0..48).map(|i| 1000 + s * 100 + i).collect();
            insert_all(&mut pc, &tokens, &filled(&tokens, KvDtype::F32));
            pc.check_invariants().unwrap();
            assert!(pc.stats().bytes <= bound);
            assert!(pinned.iter().all(|&k| pc.contains(k)), "a read block was evicted");
        }
        assert!(pc.stats().evictions > 0);
        pc.release(&pinned);
        // Unpinned, they go as other blocks come.
        for s in 40..50u32 {
            let tokens: Vec<u32> = (0..48).map(|i| 1000 + s * 100 + i).collect();
            insert_all(&mut pc, &tokens, &filled(&tokens, KvDtype::F32));
        }
        assert!(!pinned.iter().any(|&k| pc.contains(k)));
        pc.check_invariants().unwrap();
    }

    #[test]
    fn a_cache_full_of_read_blocks_stores_nothing_more() {
        let bytes = filled(&[], KvDtype::F32).slot_block_bytes(BLOCK_TOKENS);
        let mut pc = PrefixCache::new(b"m", bytes, 2 * bytes);
        let a: Vec<u32> = (0..32).collect();
        insert_all(&mut pc, &a, &filled(&a, KvDtype::F32));
        let pinned = pc.lookup(&a);
        let b: Vec<u32> = (100..132).collect();
        assert!(insert_all(&mut pc, &b, &filled(&b, KvDtype::F32)).is_empty());
        assert_eq!(pc.len(), 2);
        pc.release(&pinned);
        assert_eq!(insert_all(&mut pc, &b, &filled(&b, KvDtype::F32)).len(), 2);
        pc.check_invariants().unwrap();
    }
}
