//! The prefix cache: an index of full blocks of [`BLOCK_TOKENS`] positions that earlier
//! sequences computed, kept in the engine's [`BlockPool`] across requests so that a later
//! prompt starting with the same tokens takes those blocks into its own block table (shared,
//! read-only) instead of computing them.
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
//! The blocks live in the pool, and the cache holds each block it indexes. Their bytes stay
//! within `max_bytes`: indexing a block first evicts the least recently used blocks that no
//! running sequence reads and that have no indexed children; if that frees too little, the
//! block is not indexed. The pool, when it runs out of free blocks, also evicts such blocks
//! ([`PrefixCache::evict_one`]). A running sequence pins every indexed block in its table
//! ([`PrefixCache::acquire`] and [`PrefixCache::insert`] pin, [`PrefixCache::release`]
//! unpins) until it ends. A sequence pins a chain from its first block on, so the ancestors
//! of a pinned block are pinned too, and every unpinned block can be evicted (leaves first):
//! [`PrefixCache::unpinned`] blocks are the pool's to take back.
//!
//! # Bits
//!
//! A block holds the exact bytes its sequence stored (already rounded to the KV dtype). A
//! multi-token pass computes each row with the op sequence of a single step, and attention
//! reads the keys of positions `0..=q` in position order whatever the blocks holding them, so
//! a shared prefix gives the same bits as a computed one.

use std::collections::{BTreeSet, HashMap};

use super::block_pool::BlockPool;
use crate::model::{KvCache, KvMemory};
use crate::state::xxh64;

/// Positions per cached block.
pub const BLOCK_TOKENS: usize = 16;

/// A cached block.
struct Block {
    /// The key of the block before it (`None`: the first block of a sequence).
    parent: Option<u64>,
    /// [BLOCK_TOKENS] the token ids of the block's positions
    tokens: Vec<u32>,
    /// The pool block holding its keys and values.
    block: u32,
    /// Tick of the last lookup or insertion that used it.
    last_use: u64,
    /// Cached blocks whose parent it is.
    children: usize,
    /// Running sequences that hold it in their block tables.
    readers: usize,
}

/// Counters of a [`PrefixCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Blocks found at admission (each saves `BLOCK_TOKENS` prompt positions).
    pub hits: u64,
    /// Full prompt blocks looked up at admission and not found (they are computed).
    pub misses: u64,
    /// Blocks evicted to make room (in the cache's bound or in the pool).
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
    /// Blocks whose `readers` is 0.
    unpinned: usize,
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
            unpinned: 0,
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
    /// only; a trailing partial block is not looked up).
    pub fn find(&self, tokens: &[u32]) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut parent = None;
        for chunk in tokens.chunks_exact(BLOCK_TOKENS) {
            let key = self.key(parent, chunk);
            match self.blocks.get(&key) {
                Some(b) if b.parent == parent && b.tokens == chunk => {}
                _ => break,
            }
            keys.push(key);
            parent = Some(key);
        }
        keys
    }

    /// Pins the chain `keys` (from [`PrefixCache::find`] on a prompt of `full_blocks` whole
    /// blocks) for a sequence that takes its blocks, until [`PrefixCache::release`]; counts
    /// one hit per block and one miss per full block not found.
    pub fn acquire(&mut self, keys: &[u64], full_blocks: usize) {
        for &key in keys {
            self.touch(key);
            self.pin(key);
        }
        self.stats.hits += keys.len() as u64;
        self.stats.misses += (full_blocks - keys.len()) as u64;
    }

    /// The pool block of the cached block `key`.
    pub fn block(&self, key: u64) -> u32 {
        self.blocks[&key].block
    }

    /// How many of `keys` no running sequence pins.
    pub fn unpinned_among(&self, keys: &[u64]) -> usize {
        keys.iter().filter(|k| self.blocks[k].readers == 0).count()
    }

    /// Blocks no running sequence reads: the pool's to take back ([`PrefixCache::evict_one`]).
    pub fn unpinned(&self) -> usize {
        self.unpinned
    }

    /// One more running sequence holds the block `key`.
    fn pin(&mut self, key: u64) {
        let block = self.blocks.get_mut(&key).expect("pinned blocks are held");
        if block.readers == 0 {
            self.unpinned -= 1;
        }
        block.readers += 1;
    }

    /// Unpins blocks pinned by [`PrefixCache::acquire`] or [`PrefixCache::insert`].
    pub fn release(&mut self, keys: &[u64]) {
        for key in keys {
            if let Some(block) = self.blocks.get_mut(key) {
                block.readers -= 1;
                if block.readers == 0 {
                    self.unpinned += 1;
                }
            }
        }
    }

    /// Indexes the full block `i` of `cache` (a paged cache that holds positions
    /// `i * B .. (i + 1) * B`, `B = BLOCK_TOKENS`), whose tokens are `tokens`, after the block
    /// `parent` (`None`: the first block), and pins it for the sequence. When an equal block
    /// (same key, tokens, parent and bytes) is indexed already, the cache's table takes that
    /// one instead and its own is released, so that the sequence's pinned blocks stay one
    /// chain. Returns the key, or `None` when the block cannot be indexed (no room, the
    /// parent is gone, or another block holds its key), in which case no later block of the
    /// chain can be either.
    pub fn insert(&mut self, parent: Option<u64>, tokens: &[u32], cache: &mut KvCache, i: usize, pool: &mut BlockPool) -> Option<u64> {
        debug_assert_eq!(tokens.len(), BLOCK_TOKENS);
        let key = self.key(parent, tokens);
        let own = cache.blocks()[i];
        if let Some(b) = self.blocks.get(&key) {
            if b.parent != parent || b.tokens != tokens {
                return None;
            }
            let cached = b.block;
            if cached != own {
                // The same tokens after the same prefix: the same bytes, as every computation
                // of a row gives the same bits. Checked, so a difference could never be shared.
                let equal = pool.memory().blocks_equal(cached, own);
                debug_assert!(equal, "two computations of one block differ");
                if !equal {
                    return None;
                }
                let old = cache.replace_block(i, cached);
                pool.release(old);
            }
            self.touch(key);
            self.pin(key);
            return Some(key);
        }
        if let Some(p) = parent {
            // The parent is held while room is made, so the chain stays whole.
            self.blocks.get_mut(&p)?.children += 1;
        }
        if !self.make_room(pool) {
            if let Some(p) = parent {
                self.blocks.get_mut(&p).expect("held above").children -= 1;
            }
            return None;
        }
        pool.memory().retain(own);
        self.clock += 1;
        let block = Block { parent, tokens: tokens.to_vec(), block: own, last_use: self.clock, children: 0, readers: 1 };
        self.blocks.insert(key, block);
        self.lru.insert((self.clock, key));
        Some(key)
    }

    /// Evicts unpinned leaf blocks, least recently used first, until one more block fits;
    /// returns whether it does.
    fn make_room(&mut self, pool: &mut BlockPool) -> bool {
        while (self.blocks.len() + 1) * self.block_bytes > self.max_bytes {
            if !self.evict_one(pool) {
                return false;
            }
        }
        true
    }

    /// Evicts the least recently used block that no running sequence reads and no cached
    /// block extends, releasing it to `pool`; returns whether there was one.
    pub fn evict_one(&mut self, pool: &mut BlockPool) -> bool {
        let victim = self.lru.iter().find(|(_, key)| {
            let b = &self.blocks[key];
            b.children == 0 && b.readers == 0
        });
        let Some(&(tick, key)) = victim else { return false };
        self.lru.remove(&(tick, key));
        let block = self.blocks.remove(&key).expect("listed blocks are held");
        self.unpinned -= 1;
        if let Some(p) = block.parent {
            self.blocks.get_mut(&p).expect("a parent outlives its children").children -= 1;
        }
        pool.release(block.block);
        self.stats.evictions += 1;
        true
    }

    /// Checks the cache's invariants (for tests): every block's parent is held and counts it
    /// as a child, a pinned block's parent is pinned, the pool block of each is held by the
    /// cache and its readers, the unpinned blocks are those counted, the LRU list names every
    /// block once, and the bytes are within the bound.
    pub fn check_invariants(&self, memory: &KvMemory) -> Result<(), String> {
        let mut children: HashMap<u64, usize> = HashMap::new();
        for (key, b) in &self.blocks {
            if memory.holders(b.block) as usize != b.readers + 1 {
                return Err(format!("block {key:016x} has {} holders and {} readers", memory.holders(b.block), b.readers));
            }
            if b.readers > 0 && b.parent.is_some_and(|p| self.blocks.get(&p).is_some_and(|p| p.readers == 0)) {
                return Err(format!("block {key:016x} is pinned but its parent is not"));
            }
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
        let unpinned = self.blocks.values().filter(|b| b.readers == 0).count();
        if unpinned != self.unpinned {
            return Err(format!("{unpinned} blocks are unpinned, {} counted", self.unpinned));
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
    use crate::model::KvDtype;

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

    /// A paged cache from `pool` whose rows at position p hold a value made of (token, p,
    /// layer, half).
    fn filled(pool: &mut BlockPool, tokens: &[u32]) -> KvCache {
        let cfg = cfg();
        let mut cache = KvCache::paged(std::sync::Arc::clone(pool.memory()), 256);
        for _ in 0..tokens.len().div_ceil(BLOCK_TOKENS) {
            assert!(pool.grow(&mut cache));
        }
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

    fn pool(dtype: KvDtype, n_blocks: usize) -> BlockPool {
        BlockPool::new(&cfg(), dtype, n_blocks).unwrap()
    }

    fn insert_all(pc: &mut PrefixCache, tokens: &[u32], cache: &mut KvCache, pool: &mut BlockPool) -> Vec<u64> {
        let mut keys = Vec::new();
        for (i, chunk) in tokens.chunks_exact(BLOCK_TOKENS).enumerate() {
            match pc.insert(keys.last().copied(), chunk, cache, i, pool) {
                Some(k) => keys.push(k),
                None => break,
            }
        }
        keys
    }

    /// A sequence admitted on the chain `keys` of a prompt of `full` blocks: pins the chain and
    /// takes its blocks into a cache's table.
    fn admit(pc: &mut PrefixCache, pool: &BlockPool, keys: &[u64], full: usize) -> KvCache {
        pc.acquire(keys, full);
        let mut cache = KvCache::paged(std::sync::Arc::clone(pool.memory()), 256);
        for &k in keys {
            cache.push_block(pc.block(k));
        }
        cache.advance_to(keys.len() * BLOCK_TOKENS);
        cache
    }

    /// A sequence of `tokens` computed, indexed and ended (its pins and blocks released).
    fn run_sequence(pc: &mut PrefixCache, tokens: &[u32], pool: &mut BlockPool) -> Vec<u64> {
        let mut cache = filled(pool, tokens);
        let keys = insert_all(pc, tokens, &mut cache, pool);
        pc.release(&keys);
        pool.release_cache(&mut cache);
        keys
    }

    #[test]
    fn shared_blocks_are_the_stored_bytes_and_chains_stop_where_prompts_diverge() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut pool = pool(dtype, 64);
            let block_bytes = pool.memory().block_bytes();
            let mut pc = PrefixCache::new(b"model", block_bytes, 100 * block_bytes);
            let a: Vec<u32> = (0..50).map(|i| (i * 7 % 100) as u32).collect();
            let mut source = filled(&mut pool, &a);
            let stored = insert_all(&mut pc, &a, &mut source, &mut pool);
            assert_eq!(stored.len(), 3);
            let source_block = pool.memory().block_contents(source.blocks()[0]);
            // Same first 20 tokens, then different: one block (positions 0..16) matches.
            let mut b = a.clone();
            b[20] += 1;
            let keys = pc.find(&b[..48]);
            assert_eq!(keys.len(), 1);
            let mut reader = admit(&mut pc, &pool, &keys, 3);
            assert_eq!((pc.stats().hits, pc.stats().misses), (1, 2));
            assert_eq!(pc.block(keys[0]), source.blocks()[0]);
            // A different first token: nothing matches.
            let mut c = a.clone();
            c[0] += 1;
            assert!(pc.find(&c).is_empty());
            // The same tokens computed again by another sequence: its table takes the indexed
            // blocks and its own go back to the pool.
            let free = pool.n_free();
            let mut again = filled(&mut pool, &a);
            let own = again.blocks().to_vec();
            assert_eq!(insert_all(&mut pc, &a, &mut again, &mut pool), stored);
            assert_eq!(&again.blocks()[..3], &source.blocks()[..3]);
            assert_eq!(again.blocks()[3], own[3]);
            assert_eq!(pool.n_free(), free - 1);
            assert_eq!(pool.memory().block_contents(again.blocks()[0]), source_block);
            pc.check_invariants(pool.memory()).unwrap();
            for (cache, pins) in [(&mut source, &stored[..]), (&mut again, &stored[..]), (&mut reader, &keys[..])] {
                pc.release(pins);
                pool.release_cache(cache);
            }
            pc.check_invariants(pool.memory()).unwrap();
            // Only the cache holds the three blocks now.
            assert_eq!((pc.unpinned(), pool.n_free()), (3, 61));
        }
    }

    #[test]
    fn another_identity_never_matches() {
        let mut pool = pool(KvDtype::F32, 8);
        let bytes = pool.memory().block_bytes();
        let a: Vec<u32> = (0..32).collect();
        let mut one = PrefixCache::new(b"model a, f32", bytes, 10 * bytes);
        let two = PrefixCache::new(b"model a, f16", bytes, 10 * bytes);
        run_sequence(&mut one, &a, &mut pool);
        let k = one.key(None, &a[..16]);
        assert!(one.contains(k));
        assert_ne!(two.key(None, &a[..16]), k);
    }

    #[test]
    fn eviction_keeps_the_bound_and_spares_read_blocks_and_parents() {
        let mut pool = pool(KvDtype::F32, 64);
        let bytes = pool.memory().block_bytes();
        let bound = 10 * bytes + bytes / 2; // room for 10 blocks
        let mut pc = PrefixCache::new(b"m", bytes, bound);
        // A conversation of 4 blocks that a running sequence reads.
        let held: Vec<u32> = (0..64).map(|i| i as u32).collect();
        run_sequence(&mut pc, &held, &mut pool);
        let pinned = pc.find(&held);
        let mut reader = admit(&mut pc, &pool, &pinned, 4);
        assert_eq!(pinned.len(), 4);
        // Many other prompts, far past the bound.
        for s in 0..40u32 {
            let tokens: Vec<u32> = (0..48).map(|i| 1000 + s * 100 + i).collect();
            run_sequence(&mut pc, &tokens, &mut pool);
            pc.check_invariants(pool.memory()).unwrap();
            assert!(pc.stats().bytes <= bound);
            assert!(pinned.iter().all(|&k| pc.contains(k)), "a read block was evicted");
        }
        assert!(pc.stats().evictions > 0);
        // Every block is free but those the cache holds.
        assert_eq!(pool.n_free(), 64 - pc.len());
        pc.release(&pinned);
        pool.release_cache(&mut reader);
        // Unpinned, they go as other blocks come.
        for s in 40..50u32 {
            let tokens: Vec<u32> = (0..48).map(|i| 1000 + s * 100 + i).collect();
            run_sequence(&mut pc, &tokens, &mut pool);
        }
        assert!(!pinned.iter().any(|&k| pc.contains(k)));
        pc.check_invariants(pool.memory()).unwrap();
    }

    #[test]
    fn a_cache_full_of_read_blocks_stores_nothing_more() {
        let mut pool = pool(KvDtype::F32, 8);
        let bytes = pool.memory().block_bytes();
        let mut pc = PrefixCache::new(b"m", bytes, 2 * bytes);
        let a: Vec<u32> = (0..32).collect();
        run_sequence(&mut pc, &a, &mut pool);
        let pinned = pc.find(&a);
        let mut reader = admit(&mut pc, &pool, &pinned, 2);
        let b: Vec<u32> = (100..132).collect();
        assert!(run_sequence(&mut pc, &b, &mut pool).is_empty());
        assert_eq!(pc.len(), 2);
        pc.release(&pinned);
        pool.release_cache(&mut reader);
        assert_eq!(run_sequence(&mut pc, &b, &mut pool).len(), 2);
        pc.check_invariants(pool.memory()).unwrap();
    }

    #[test]
    fn the_pool_takes_back_unpinned_blocks_leaves_first() {
        let mut pool = pool(KvDtype::F16, 6);
        let bytes = pool.memory().block_bytes();
        let mut pc = PrefixCache::new(b"m", bytes, 6 * bytes);
        let a: Vec<u32> = (0..48).collect();
        run_sequence(&mut pc, &a, &mut pool);
        let b: Vec<u32> = (0..16).chain(200..232).collect();
        run_sequence(&mut pc, &b, &mut pool);
        // a's 3 blocks and b's last 2 (b's first is a's): 5 held, 1 free.
        assert_eq!((pc.len(), pc.unpinned(), pool.n_free()), (5, 5, 1));
        // A sequence reading b's chain pins it; the others go, leaves first.
        let pinned = pc.find(&b);
        let _reader = admit(&mut pc, &pool, &pinned, 3);
        assert_eq!(pc.unpinned(), 2);
        assert!(pc.evict_one(&mut pool) && pc.evict_one(&mut pool) && !pc.evict_one(&mut pool));
        assert_eq!((pc.len(), pool.n_free()), (3, 3));
        assert!(pinned.iter().all(|&k| pc.contains(k)));
        pc.check_invariants(pool.memory()).unwrap();
    }
}
