//! The batch engine's pool of KV blocks: one [`KvMemory`] of `kv_memory` bytes in blocks of
//! [`BLOCK_TOKENS`] positions, from which every running sequence's cache takes the blocks it
//! fills and the prefix cache keeps the blocks it indexes.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::prefix_cache::BLOCK_TOKENS;
use crate::error::Result;
use crate::model::{KvCache, KvDtype, KvMemory, ModelConfig};

/// Which blocks of the memory are free. A block is free when nothing holds it; blocks are
/// handed out lowest first, so a sequence admitted to a quiet pool gets adjacent blocks
/// (attention reads them as one range) and the memory touched stays compact.
pub struct BlockPool {
    memory: Arc<KvMemory>,
    /// Free blocks below `fresh`.
    free: BTreeSet<u32>,
    /// Blocks from here on were never handed out.
    fresh: u32,
}

impl BlockPool {
    /// A pool of `n_blocks` blocks of `cfg`'s keys and values in `dtype`.
    pub fn new(cfg: &ModelConfig, dtype: KvDtype, n_blocks: usize) -> Result<BlockPool> {
        let memory = KvMemory::new(cfg, dtype, BLOCK_TOKENS, n_blocks)?;
        Ok(BlockPool { memory: Arc::new(memory), free: BTreeSet::new(), fresh: 0 })
    }

    pub fn memory(&self) -> &Arc<KvMemory> {
        &self.memory
    }

    pub fn n_blocks(&self) -> usize {
        self.memory.n_blocks()
    }

    /// Blocks nothing holds.
    pub fn n_free(&self) -> usize {
        self.free.len() + self.n_blocks() - self.fresh as usize
    }

    /// Adds a free block to `cache`, if there is one.
    pub fn grow(&mut self, cache: &mut KvCache) -> bool {
        let block = match self.free.pop_first() {
            Some(b) => b,
            None if (self.fresh as usize) < self.n_blocks() => {
                self.fresh += 1;
                self.fresh - 1
            }
            None => return false,
        };
        debug_assert_eq!(self.memory.holders(block), 0);
        cache.push_block(block);
        true
    }

    /// One holder of `block` fewer; the block is free again when none is left.
    pub fn release(&mut self, block: u32) {
        if self.memory.release(block) == 0 {
            self.free.insert(block);
        }
    }

    /// Releases every block of `cache` and empties it.
    pub fn release_cache(&mut self, cache: &mut KvCache) {
        for block in cache.take_blocks() {
            self.release(block);
        }
    }
}
