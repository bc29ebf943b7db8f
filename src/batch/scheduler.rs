//! The engine thread: admission, pass building, the batched forward pass and token selection.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::handle::{Channel, Event};
use super::prefix_cache::{PrefixCache, BLOCK_TOKENS};
use super::{BatchOptions, EngineStats, Submission, Wakeup};
use crate::decode::{SequenceDecoder, Step};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::kernels::Precision;
use crate::model::{KvCache, KvCacheOptions, KvDtype, LogitRows, Overflow, Scratch, SeqInput};

/// An admitted request: its decoder and its own KV cache.
struct Running {
    channel: Arc<Channel>,
    seq: SequenceDecoder,
    cache: KvCache,
    /// Bytes of `kv_memory` reserved for the cache.
    reserved: usize,
    /// Keys of the prefix-cache blocks copied at admission (pinned while it runs).
    reused: Vec<u64>,
    /// Key of the prefix-cache block of each full block of positions stored so far, in order.
    blocks: Vec<u64>,
    /// The prefix cache refused a block: store no more of this sequence.
    blocks_refused: bool,
}

impl Running {
    /// Context tokens not yet in the cache: the rest of the prompt, or the last sampled token.
    fn pending(&self) -> &[u32] {
        &self.seq.context()[self.cache.len()..]
    }

    /// Whether the whole prompt has been through a pass (each pass now adds one token).
    fn decoding(&self) -> bool {
        self.cache.len() >= self.seq.n_prompt()
    }
}

/// The scheduler's state, owned by the engine thread.
struct Scheduler<'a> {
    engine: &'a Engine,
    options: BatchOptions,
    /// Submitted, not yet admitted, in arrival order.
    waiting: VecDeque<Submission>,
    /// Admitted, in admission order.
    running: Vec<Running>,
    /// Bytes of `kv_memory` reserved by `running`.
    reserved: usize,
    scratch: Scratch,
    /// Running totals (passes, tokens) for [`EngineStats`].
    totals: EngineStats,
    /// None when `prefix_cache_bytes` cannot hold one block.
    prefix_cache: Option<PrefixCache>,
}

/// The prefix cache for `engine`'s batch caches, if `options` give it room for a block.
fn prefix_cache(engine: &Engine, options: &BatchOptions) -> Option<PrefixCache> {
    let block_bytes = BLOCK_TOKENS * engine.kv_bytes_per_position(options.kv_dtype);
    if options.prefix_cache_bytes < block_bytes {
        return None;
    }
    // Everything besides the tokens that changes a block's numbers.
    let precision = match engine.llama.precision() {
        Precision::Float32 => 0u8,
        Precision::Int8 => 1,
    };
    let dtype = match options.kv_dtype {
        KvDtype::F32 => 0u8,
        KvDtype::F16 => 1,
    };
    let mut identity = engine.fingerprint().to_le_bytes().to_vec();
    identity.extend_from_slice(&[precision, dtype]);
    Some(PrefixCache::new(&identity, block_bytes, options.prefix_cache_bytes))
}

/// The engine thread's loop: runs until the engine is dropped.
pub(super) fn run(engine: &Arc<Engine>, options: BatchOptions, wakeup: &Wakeup) {
    let mut s = Scheduler {
        engine,
        options,
        waiting: VecDeque::new(),
        running: Vec::new(),
        reserved: 0,
        scratch: Scratch::default(),
        totals: EngineStats::default(),
        prefix_cache: prefix_cache(engine, &options),
    };
    loop {
        {
            let mut inbox = wakeup.lock();
            loop {
                s.waiting.extend(inbox.submitted.drain(..));
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
    }
}

impl Scheduler<'_> {
    fn stats(&self) -> EngineStats {
        EngineStats {
            waiting: self.waiting.len(),
            running: self.running.len(),
            kv_bytes: self.reserved,
            prefix_cache: self.prefix_cache.as_ref().map(|c| c.stats()).unwrap_or_default(),
            ..self.totals
        }
    }

    /// Frees what a sequence leaving the engine holds: its reserved bytes and its pins on
    /// prefix-cache blocks.
    fn release(reserved: &mut usize, prefix_cache: &mut Option<PrefixCache>, r: &Running) {
        *reserved -= r.reserved;
        if let Some(cache) = prefix_cache {
            cache.release(&r.reused);
        }
    }

    /// Stores the full blocks of positions each running sequence has computed since the last
    /// call in the prefix cache.
    fn store_blocks(&mut self) {
        let Some(prefix_cache) = &mut self.prefix_cache else { return };
        for r in &mut self.running {
            while !r.blocks_refused && (r.blocks.len() + 1) * BLOCK_TOKENS <= r.cache.len() {
                let start = r.blocks.len() * BLOCK_TOKENS;
                let tokens = &r.seq.context()[start..start + BLOCK_TOKENS];
                match prefix_cache.insert(r.blocks.last().copied(), tokens, &r.cache, start..start + BLOCK_TOKENS) {
                    Some(key) => r.blocks.push(key),
                    None => r.blocks_refused = true,
                }
            }
        }
    }

    /// Drops cancelled requests, waiting or running (their caches are freed here).
    fn drop_cancelled(&mut self) {
        self.waiting.retain(|w| !w.channel.is_cancelled());
        let (reserved, prefix_cache) = (&mut self.reserved, &mut self.prefix_cache);
        self.running.retain(|r| {
            let keep = !r.channel.is_cancelled();
            if !keep {
                Self::release(reserved, prefix_cache, r);
            }
            keep
        });
    }

    /// Admits waiting requests in arrival order while the running sequences and their
    /// reserved caches fit the limits (the first that does not fit waits, and so do those
    /// behind it).
    fn admit(&mut self) {
        let per_position = self.engine.kv_bytes_per_position(self.options.kv_dtype);
        while self.running.len() < self.options.max_concurrent {
            let Some(next) = self.waiting.front() else { break };
            if next.channel.is_cancelled() {
                self.waiting.pop_front();
                continue;
            }
            let capacity = next.request.positions_needed().max(1);
            let bytes = capacity * per_position;
            if self.reserved + bytes > self.options.kv_memory {
                break;
            }
            let Submission { request, channel } = self.waiting.pop_front().expect("checked above");
            let options = KvCacheOptions { capacity, dtype: self.options.kv_dtype, overflow: Overflow::Error };
            match KvCache::with_options(self.engine.config(), &options) {
                Ok(mut cache) => {
                    let seq = SequenceDecoder::new(request, self.engine.config().eos_id);
                    if let Some(finish) = seq.finish() {
                        channel.push(Event::Finished(finish));
                        continue;
                    }
                    // Whole blocks of the prompt but its last token, which is always computed
                    // (its logits choose the first token).
                    let mut reused = Vec::new();
                    if let Some(prefix_cache) = &mut self.prefix_cache {
                        let n_prompt = seq.n_prompt();
                        let reusable = n_prompt.saturating_sub(1) / BLOCK_TOKENS * BLOCK_TOKENS;
                        reused = prefix_cache.lookup(&seq.context()[..reusable]);
                        prefix_cache.copy_into(&reused, &mut cache);
                        channel.set_cached_tokens(cache.len());
                    }
                    self.reserved += bytes;
                    let blocks = reused.clone();
                    self.running.push(Running { channel, seq, cache, reserved: bytes, reused, blocks, blocks_refused: false });
                }
                Err(e) => channel.push(Event::Error(e)),
            }
        }
    }

    /// One forward pass and one token for every sequence whose prompt it completes.
    fn pass(&mut self) {
        // Rows: one per decoding sequence, then prompt chunks in admission order.
        let mut budget = self.options.max_batch_tokens;
        let mut take = vec![0usize; self.running.len()];
        for (i, r) in self.running.iter().enumerate() {
            if r.decoding() {
                take[i] = r.pending().len();
                budget -= take[i];
            }
        }
        for (i, r) in self.running.iter().enumerate() {
            if !r.decoding() && budget > 0 {
                take[i] = r.pending().len().min(budget);
                budget -= take[i];
            }
        }
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
            self.engine.llama.forward_batch(self.engine.pool(), &mut self.scratch, &mut inputs)
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
                Ok(step) => {
                    let last = step.finish.is_some();
                    r.channel.push(Event::Token(step));
                    last
                }
                Err(e) => {
                    r.channel.push(Event::Error(e));
                    true
                }
            };
        }
        let (reserved, prefix_cache) = (&mut self.reserved, &mut self.prefix_cache);
        let mut i = 0;
        self.running.retain(|r| {
            let keep = !finished[i];
            i += 1;
            if !keep {
                Self::release(reserved, prefix_cache, r);
            }
            keep
        });
    }

    /// Lets each sampled sequence choose its token from its logits row (rows in the order of
    /// `sampled`), in parallel: each decoder is independent and sees only its own row.
    fn select(&mut self, sampled: &[usize]) -> Vec<Result<Step>> {
        let vocab = self.engine.config().vocab_size;
        let tokenizer = &self.engine.tokenizer;
        let logits = &self.scratch.logits;
        let mut slots: Vec<Option<&mut Running>> = self.running.iter_mut().map(Some).collect();
        // A decoder and, once its task ran, what it chose.
        let mut work: Vec<(&mut SequenceDecoder, Option<Result<Step>>)> =
            sampled.iter().map(|&i| (&mut slots[i].take().expect("distinct").seq, None)).collect();
        self.engine.pool().for_each_mut(&mut work, |j, (seq, chosen)| {
            let row = &logits[j * vocab..(j + 1) * vocab];
            *chosen = Some(seq.accept(row, Some(tokenizer)));
        });
        work.into_iter().map(|(_, chosen)| chosen.expect("every slot ran")).collect()
    }

    /// Ends every running request with an error and frees their caches.
    fn fail_running(&mut self, error: impl Fn() -> Error) {
        for r in self.running.drain(..) {
            r.channel.push(Event::Error(error()));
            if let Some(cache) = &mut self.prefix_cache {
                cache.release(&r.reused);
            }
        }
        self.reserved = 0;
    }

    /// Ends every request, running or waiting, with an error.
    fn fail_all(&mut self, error: impl Fn() -> Error) {
        self.fail_running(&error);
        for w in self.waiting.drain(..) {
            w.channel.push(Event::Error(error()));
        }
    }
}
