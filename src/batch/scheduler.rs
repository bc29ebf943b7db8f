//! The engine thread: admission, pass building, the batched forward pass and token selection.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::block_pool::BlockPool;
use super::handle::{Channel, Event};
use super::prefix_cache::{PrefixCache, BLOCK_TOKENS};
use super::{BatchOptions, EngineStats, Submission, Wakeup};
use crate::decode::{SequenceDecoder, Step};
use crate::loaded_model::LoadedModel;
use crate::error::{Error, Result};
use crate::kernels::Precision;
use crate::model::{KvCache, KvDtype, LogitRows, Scratch, SeqInput};

/// A request waiting for admission: new, or preempted (its decoder keeps the tokens generated
/// so far and the sampler's state; its cache is recomputed when it is admitted again).
struct Queued {
    channel: Arc<Channel>,
    seq: SequenceDecoder,
    /// Preempted at least once (its prompt's cached-token count was already reported).
    resumed: bool,
}

/// An admitted request: its decoder and its KV cache (blocks of the pool).
struct Running {
    channel: Arc<Channel>,
    seq: SequenceDecoder,
    cache: KvCache,
    /// Keys of the prefix-cache blocks in the cache's table, from its first block on (taken
    /// at admission or indexed since); the sequence pins them while it runs.
    blocks: Vec<u64>,
    /// The prefix cache refused a block: index no more of this sequence.
    blocks_refused: bool,
}

impl Running {
    /// Context tokens not yet in the cache: the rest of the prompt, or the last sampled token.
    fn pending(&self) -> &[u32] {
        &self.seq.context()[self.cache.len()..]
    }

    /// Whether the whole context but the last sampled token has been through a pass (each
    /// pass now adds one token). A readmitted sequence recomputes its context first.
    fn decoding(&self) -> bool {
        self.cache.len() >= self.seq.n_prompt() && self.pending().len() == 1
    }
}

/// The blocks a cache of `capacity` positions needs to hold `positions`.
fn blocks_for(positions: usize, capacity: usize) -> usize {
    positions.min(capacity).div_ceil(BLOCK_TOKENS)
}

/// The scheduler's state, owned by the engine thread.
struct Scheduler<'a> {
    loaded: &'a LoadedModel,
    options: BatchOptions,
    /// Not admitted: preempted sequences first (in admission order), then submissions in
    /// arrival order.
    waiting: VecDeque<Queued>,
    /// Admitted, in admission order.
    running: Vec<Running>,
    /// The blocks of `kv_memory` the caches take theirs from.
    pool: BlockPool,
    scratch: Scratch,
    /// Running totals (passes, tokens) for [`EngineStats`].
    totals: EngineStats,
    /// None when `prefix_cache_bytes` cannot hold one block.
    prefix_cache: Option<PrefixCache>,
    /// Requests' last events, held until the stats no longer count those requests (see
    /// [`Scheduler::deliver_last_events`]).
    last_events: Vec<(Arc<Channel>, Event)>,
}

/// The prefix cache for `engine`'s batch caches, if `options` give it room for a block;
/// `fingerprint`: the model file's.
fn prefix_cache(loaded: &LoadedModel, fingerprint: u64, options: &BatchOptions, block_bytes: usize) -> Option<PrefixCache> {
    if options.prefix_cache_bytes < block_bytes {
        return None;
    }
    // Everything besides the tokens that changes a block's numbers.
    let precision = match loaded.transformer.precision() {
        Precision::Float32 => 0u8,
        Precision::Int8 => 1,
    };
    let dtype = match options.kv_dtype {
        KvDtype::F32 => 0u8,
        KvDtype::F16 => 1,
    };
    let mut identity = fingerprint.to_le_bytes().to_vec();
    identity.extend_from_slice(&[precision, dtype]);
    Some(PrefixCache::new(&identity, block_bytes, options.prefix_cache_bytes))
}

/// The engine thread's loop: runs until the engine is dropped. `fingerprint`: the model
/// file's ([`LoadedModel::fingerprint`]).
pub(super) fn run(loaded: &Arc<LoadedModel>, fingerprint: u64, options: BatchOptions, pool: BlockPool, wakeup: &Wakeup) {
    let eos = loaded.config().eos_id;
    let block_bytes = pool.memory().block_bytes();
    let mut s = Scheduler {
        loaded,
        options,
        waiting: VecDeque::new(),
        running: Vec::new(),
        pool,
        scratch: Scratch::default(),
        totals: EngineStats::default(),
        prefix_cache: prefix_cache(loaded, fingerprint, &options, block_bytes),
        last_events: Vec::new(),
    };
    loop {
        {
            let mut inbox = wakeup.lock();
            loop {
                s.waiting.extend(inbox.submitted.drain(..).map(|Submission { request, channel }| Queued {
                    channel,
                    seq: SequenceDecoder::new(request, eos),
                    resumed: false,
                }));
                if inbox.shutdown {
                    drop(inbox);
                    s.fail_all(|| Error::EngineStopped("the model was closed".into()));
                    return;
                }
                s.drop_cancelled();
                inbox.stats = s.stats();
                if !s.running.is_empty() || !s.waiting.is_empty() {
                    break;
                }
                inbox = wakeup.work.wait(inbox).unwrap_or_else(|e| e.into_inner());
            }
        }
        s.admit();
        wakeup.lock().stats = s.stats();
        s.deliver_last_events();
        if s.running.is_empty() {
            continue;
        }
        // A bug must not leave callers waiting forever: a panic fails the pass's requests.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| s.pass())) {
            let message = crate::threads::panic_message(&*panic);
            s.scratch = Scratch::default();
            s.fail_running(|| Error::EngineStopped(format!("internal error: {message}")));
        }
        wakeup.lock().stats = s.stats();
        s.deliver_last_events();
    }
}

impl Scheduler<'_> {
    fn stats(&self) -> EngineStats {
        // Blocks held only by the prefix cache are the pool's to take back: not in use.
        let reclaimable = self.available();
        let used = self.pool.n_blocks() - reclaimable;
        EngineStats {
            waiting: self.waiting.len(),
            running: self.running.len(),
            kv_bytes: used * self.pool.memory().block_bytes(),
            kv_blocks_used: used,
            kv_blocks_free: reclaimable,
            prefix_cache: self.prefix_cache.as_ref().map(|c| c.stats()).unwrap_or_default(),
            ..self.totals
        }
    }

    /// Blocks the pool can hand out: free ones, and those only the prefix cache holds.
    fn available(&self) -> usize {
        self.pool.n_free() + self.prefix_cache.as_ref().map_or(0, PrefixCache::unpinned)
    }

    /// Gives `cache` `n` more blocks, evicting prefix-cache blocks no sequence reads when no
    /// block is free (the caller checked [`Scheduler::available`]).
    fn grant(pool: &mut BlockPool, prefix_cache: &mut Option<PrefixCache>, cache: &mut KvCache, n: usize) {
        for _ in 0..n {
            while !pool.grow(cache) {
                let evicted = prefix_cache.as_mut().is_some_and(|c| c.evict_one(pool));
                assert!(evicted, "the pool had room for the blocks granted");
            }
        }
    }

    /// Pushes the last events held since the stats were published: a caller that has a
    /// request's result then reads stats in which the request no longer runs or holds memory.
    fn deliver_last_events(&mut self) {
        for (channel, event) in self.last_events.drain(..) {
            channel.push(event);
        }
    }

    /// Frees what a sequence leaving the engine holds: its blocks and its pins on prefix-cache
    /// blocks.
    fn release(pool: &mut BlockPool, prefix_cache: &mut Option<PrefixCache>, r: &mut Running) {
        if let Some(cache) = prefix_cache {
            cache.release(&r.blocks);
        }
        pool.release_cache(&mut r.cache);
    }

    /// Indexes the full blocks of positions each running sequence has computed since the last
    /// call in the prefix cache.
    fn store_blocks(&mut self) {
        let Some(prefix_cache) = &mut self.prefix_cache else { return };
        for r in &mut self.running {
            while !r.blocks_refused && (r.blocks.len() + 1) * BLOCK_TOKENS <= r.cache.len() {
                let i = r.blocks.len();
                let tokens = &r.seq.context()[i * BLOCK_TOKENS..(i + 1) * BLOCK_TOKENS];
                match prefix_cache.insert(r.blocks.last().copied(), tokens, &mut r.cache, i, &mut self.pool) {
                    Some(key) => r.blocks.push(key),
                    None => r.blocks_refused = true,
                }
            }
        }
    }

    /// Drops cancelled requests, waiting or running (their caches are freed here).
    fn drop_cancelled(&mut self) {
        self.waiting.retain(|w| !w.channel.is_cancelled());
        let (pool, prefix_cache) = (&mut self.pool, &mut self.prefix_cache);
        self.running.retain_mut(|r| {
            let keep = !r.channel.is_cancelled();
            if !keep {
                Self::release(pool, prefix_cache, r);
            }
            keep
        });
    }

    /// Admits waiting requests in order while they fit: a sequence takes the longest chain of
    /// prefix-cache blocks its context (prompt, or prompt and generated tokens when it was
    /// preempted) starts with, and is given blocks for the rest of its context; it is admitted
    /// only if that leaves a block of room for every running sequence to grow into (or if
    /// nothing runs). The first that does not fit waits, and so do those behind it.
    fn admit(&mut self) {
        while self.running.len() < self.options.max_concurrent {
            let Some(next) = self.waiting.front() else { break };
            if next.channel.is_cancelled() {
                self.waiting.pop_front();
                continue;
            }
            let context = next.seq.context();
            let capacity = (context.len() + next.seq.remaining()).max(1);
            // Whole blocks of the context but its last token, which is always computed (its
            // logits choose the next token).
            let reusable = (context.len() - 1) / BLOCK_TOKENS * BLOCK_TOKENS;
            let shared = self.prefix_cache.as_ref().map_or_else(Vec::new, |c| c.find(&context[..reusable]));
            let needed = blocks_for(context.len(), capacity) - shared.len();
            // The shared blocks no sequence reads now are no longer the pool's to take back.
            let available = self.available() - self.prefix_cache.as_ref().map_or(0, |c| c.unpinned_among(&shared));
            let headroom = if self.running.is_empty() { 0 } else { self.running.len() + 1 };
            if needed + headroom > available {
                break;
            }
            let Queued { channel, seq, resumed } = self.waiting.pop_front().expect("checked above");
            if let Some(finish) = seq.finish() {
                self.last_events.push((channel, Event::Finished(finish)));
                continue;
            }
            let mut cache = KvCache::paged(std::sync::Arc::clone(self.pool.memory()), capacity);
            if let Some(prefix_cache) = &mut self.prefix_cache {
                prefix_cache.acquire(&shared, reusable / BLOCK_TOKENS);
                for &key in &shared {
                    cache.push_block(prefix_cache.block(key));
                }
                cache.advance_to(shared.len() * BLOCK_TOKENS);
            }
            Self::grant(&mut self.pool, &mut self.prefix_cache, &mut cache, needed);
            if !resumed {
                channel.set_cached_tokens(cache.len());
            }
            self.running.push(Running { channel, seq, cache, blocks: shared, blocks_refused: false });
        }
    }

    /// The rows each running sequence gives the next pass: one per decoding sequence, then
    /// prompt (or recomputed context) chunks in admission order under the token budget.
    fn rows(&self) -> Vec<usize> {
        let mut budget = self.options.max_batch_tokens;
        let mut take = vec![0usize; self.running.len()];
        for (i, r) in self.running.iter().enumerate() {
            if r.decoding() {
                take[i] = 1;
                budget -= 1;
            }
        }
        for (i, r) in self.running.iter().enumerate() {
            if !r.decoding() && budget > 0 {
                take[i] = r.pending().len().min(budget);
                budget -= take[i];
            }
        }
        take
    }

    /// Gives every running sequence the blocks the next pass writes, preempting the most
    /// recently admitted sequences while the pool cannot hold them; returns the rows of the
    /// pass. A preempted sequence frees its blocks and goes back to the front of the queue
    /// with its decoder (the tokens generated so far and the sampler's state), so when it is
    /// admitted again its context is recomputed (from the prefix cache where it holds it) and
    /// it continues with the token it would have chosen.
    fn grow(&mut self) -> Vec<usize> {
        loop {
            let take = self.rows();
            let needed: Vec<usize> = self
                .running
                .iter()
                .zip(&take)
                .map(|(r, &n)| blocks_for(r.cache.len() + n, r.cache.capacity()).saturating_sub(r.cache.blocks().len()))
                .collect();
            // A sequence alone fits: its capacity is at most the pool's positions (checked at
            // submission), and it holds all the blocks it does not share.
            if needed.iter().sum::<usize>() <= self.available() || self.running.len() == 1 {
                for (r, n) in self.running.iter_mut().zip(needed) {
                    Self::grant(&mut self.pool, &mut self.prefix_cache, &mut r.cache, n);
                }
                return take;
            }
            let mut r = self.running.pop().expect("more than one running");
            Self::release(&mut self.pool, &mut self.prefix_cache, &mut r);
            self.totals.preemptions += 1;
            self.waiting.push_front(Queued { channel: r.channel, seq: r.seq, resumed: true });
        }
    }

    /// One forward pass and one token for every sequence whose prompt it completes.
    fn pass(&mut self) {
        let take = self.grow();
        self.totals.passes += 1;
        self.totals.prompt_tokens +=
            self.running.iter().zip(&take).filter(|(r, _)| !r.decoding()).map(|(_, &n)| n as u64).sum::<u64>();
        let sampled: Vec<usize> =
            (0..self.running.len()).filter(|&i| take[i] > 0 && take[i] == self.running[i].pending().len()).collect();

        let result = {
            let mut inputs: Vec<SeqInput<'_>> = Vec::new();
            for (r, &n) in self.running.iter_mut().zip(&take) {
                if n > 0 {
                    let start = r.cache.len();
                    let logits = if n == r.seq.context().len() - start { LogitRows::Last } else { LogitRows::None };
                    inputs.push(SeqInput { cache: &mut r.cache, tokens: &r.seq.context()[start..start + n], logits });
                }
            }
            self.loaded.transformer.forward_batch(self.loaded.pool(), &mut self.scratch, &mut inputs)
        };
        if let Err(e) = result {
            // Requests were checked when submitted, so this is not one request's fault.
            let message = e.to_string();
            self.fail_running(|| Error::EngineStopped(format!("a forward pass failed: {message}")));
            return;
        }
        self.store_blocks();
        let steps = self.select(&sampled);
        self.totals.generated_tokens += steps.iter().filter(|s| s.is_ok()).count() as u64;
        let mut finished = vec![false; self.running.len()];
        for (&i, step) in sampled.iter().zip(steps) {
            let r = &self.running[i];
            finished[i] = match step {
                Ok(step) if step.finish.is_none() => {
                    r.channel.push(Event::Token(step));
                    false
                }
                Ok(step) => {
                    self.last_events.push((Arc::clone(&r.channel), Event::Token(step)));
                    true
                }
                Err(e) => {
                    self.last_events.push((Arc::clone(&r.channel), Event::Error(e)));
                    true
                }
            };
        }
        let (pool, prefix_cache) = (&mut self.pool, &mut self.prefix_cache);
        let mut i = 0;
        self.running.retain_mut(|r| {
            let keep = !finished[i];
            i += 1;
            if !keep {
                Self::release(pool, prefix_cache, r);
            }
            keep
        });
    }

    /// Lets each sampled sequence choose its token from its logits row (rows in the order of
    /// `sampled`), in parallel: each decoder is independent and sees only its own row.
    fn select(&mut self, sampled: &[usize]) -> Vec<Result<Step>> {
        let vocab = self.loaded.config().vocab_size;
        let tokenizer = &self.loaded.tokenizer;
        let logits = &self.scratch.logits;
        let mut slots: Vec<Option<&mut Running>> = self.running.iter_mut().map(Some).collect();
        // A decoder and, once its task ran, what it chose.
        let mut work: Vec<(&mut SequenceDecoder, Option<Result<Step>>)> =
            sampled.iter().map(|&i| (&mut slots[i].take().expect("distinct").seq, None)).collect();
        self.loaded.pool().for_each_mut(&mut work, |j, (seq, chosen)| {
            let row = &logits[j * vocab..(j + 1) * vocab];
            *chosen = Some(seq.accept(row, Some(tokenizer)));
        });
        work.into_iter().map(|(_, chosen)| chosen.expect("every slot ran")).collect()
    }

    /// Ends every running request with an error and frees their caches.
    fn fail_running(&mut self, error: impl Fn() -> Error) {
        for mut r in std::mem::take(&mut self.running) {
            r.channel.push(Event::Error(error()));
            Self::release(&mut self.pool, &mut self.prefix_cache, &mut r);
        }
    }

    /// Ends every request, running or waiting, with an error.
    fn fail_all(&mut self, error: impl Fn() -> Error) {
        self.fail_running(&error);
        for w in self.waiting.drain(..) {
            w.channel.push(Event::Error(error()));
        }
    }
}
