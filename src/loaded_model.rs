//! A loaded model ready to run: parsed file, weights, tokenizer and thread pool, plus the
//! sessions that hold one sequence's KV cache.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};
use crate::gguf::{fingerprint, GgufFile};
use crate::grammar::{Grammar, GrammarSpec, GrammarVocabulary};
use crate::kernels::{Isa, Precision};
use crate::decode::{self, Generation, GenerationSpec};
use crate::model::{KvCache, KvCacheOptions, KvDtype, Transformer, TransformerWeights, LogitRows, ModelConfig, Overflow, Scratch};
use crate::threads::ThreadPool;
use crate::tokenizer::{Tokenizer, TokenizerSpec};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Worker threads in all (default: the machine's available parallelism).
    pub threads: Option<usize>,
    /// Kernel path: "scalar", "avx2" or "avx512" (default: `REPROLM_ISA`, else the best).
    pub isa: Option<String>,
    /// Matmul arithmetic: "float32" (default) or "int8".
    pub precision: Option<String>,
}

/// Upper bound on `threads`, far above any useful value, to reject typos early.
const MAX_THREADS: usize = 1024;

pub struct LoadedModel {
    pub file: GgufFile,
    pub transformer: Transformer,
    pub tokenizer: Arc<Tokenizer>,
    pool: ThreadPool,
    /// The model file's fingerprint ([`crate::gguf::fingerprint`]), computed on first use.
    fingerprint: OnceLock<u64>,
    /// The vocabulary as grammars see it, built on first use.
    grammar_vocabulary: OnceLock<GrammarVocabulary>,
}

impl LoadedModel {
    pub fn load(path: impl AsRef<Path>, options: &LoadOptions) -> Result<LoadedModel> {
        let threads = match options.threads {
            None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            Some(n) if (1..=MAX_THREADS).contains(&n) => n,
            Some(n) => return Err(Error::invalid_argument("threads", format!("{n} is not in 1..={MAX_THREADS}"))),
        };
        let precision = options.precision.as_deref().map(Precision::parse).transpose()?.unwrap_or_default();
        let mut isa = Isa::select(options.isa.as_deref())?;
        if precision == Precision::Int8 && !isa.int8_available() {
            let requested = options.isa.is_some() || std::env::var("REPROLM_ISA").is_ok_and(|s| !s.is_empty());
            if requested {
                return Err(Error::Unsupported(format!("this CPU cannot run the {} int8 kernels", isa.name())));
            }
            // AVX-512 without VNNI: the AVX2 int8 kernels give the same bits.
            isa = Isa::Avx2;
        }
        let file = GgufFile::open(path)?;
        if file.tensors().is_empty() && file.foreign_tensors().is_empty() {
            return Err(Error::Model(format!(
                "{} has no tensors: it is a vocabulary-only GGUF (tokenizer metadata, no weights), \
                 so it cannot run as a model; tokenize with it through reprolm.Tokenizer.from_gguf",
                file.path().display()
            )));
        }
        let config = ModelConfig::from_gguf(&file)?;
        let pool = ThreadPool::new(threads)?;
        let weights = TransformerWeights::load(&file, &config, precision, &pool)?;
        let tokenizer = Tokenizer::from_spec(TokenizerSpec::from_gguf(&file)?)?;
        if tokenizer.vocab_size() != config.vocab_size {
            return Err(Error::Model(format!(
                "the tokenizer has {} tokens but the model {}",
                tokenizer.vocab_size(),
                config.vocab_size
            )));
        }
        Ok(LoadedModel {
            file,
            transformer: Transformer { config, weights, isa },
            tokenizer: Arc::new(tokenizer),
            pool,
            fingerprint: OnceLock::new(),
            grammar_vocabulary: OnceLock::new(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.transformer.config
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Logits at every position of one fresh forward pass: [ids.len()][vocab_size].
    pub fn logits(self: &Arc<Self>, ids: &[u32]) -> Result<Vec<f32>> {
        let mut session = Session::new(Arc::clone(self), ids.len().max(1))?;
        session.forward(ids, LogitRows::All)?;
        Ok(std::mem::take(&mut session.scratch.logits))
    }

    /// Identifies the model file: a 64-bit hash of all its bytes
    /// ([`crate::gguf::fingerprint`]), computed on the model's threads when first asked for.
    pub fn fingerprint(&self) -> Result<u64> {
        if let Some(&f) = self.fingerprint.get() {
            return Ok(f);
        }
        let f = fingerprint::fingerprint_on(&self.file, &self.pool)?;
        Ok(*self.fingerprint.get_or_init(|| f))
    }

    /// The default cache capacity: the model's context length, capped so that a cache of
    /// `dtype` numbers takes at most half of the memory the OS reports available.
    pub fn default_context_length(&self, dtype: KvDtype) -> usize {
        let per_position = self.kv_bytes_per_position(dtype);
        let limit = available_memory().map_or(usize::MAX, |m| (m / 2 / per_position).max(1));
        self.config().context_length.clamp(1, limit.max(1))
    }

    /// Bytes of keys and values one position takes in a cache of `dtype` numbers (at least 1).
    pub fn kv_bytes_per_position(&self, dtype: KvDtype) -> usize {
        let cfg = self.config();
        (2 * cfg.n_layers * cfg.d_kv() * dtype.bytes()).max(1)
    }

    /// The worker pool forward passes run on.
    pub(crate) fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// The vocabulary prepared for constrained decoding (the token trie), built on first use.
    pub fn grammar_vocabulary(&self) -> Result<&GrammarVocabulary> {
        if let Some(vocabulary) = self.grammar_vocabulary.get() {
            return Ok(vocabulary);
        }
        let built = GrammarVocabulary::new(Arc::clone(&self.tokenizer), self.config().eos_id, self.grammar_parts())?;
        Ok(self.grammar_vocabulary.get_or_init(|| built))
    }

    /// Parts the grammar mask is computed in, on as many threads: one per thread of the model,
    /// at most one per core.
    fn grammar_parts(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.n_threads().min(cores)
    }

    /// `spec` compiled for this model's vocabulary (see [`Grammar::compile`]).
    pub fn compile_grammar(&self, spec: &GrammarSpec) -> Result<Grammar> {
        Grammar::compile(spec, self.grammar_vocabulary()?)
    }

    /// Checks every id against the vocabulary.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&id| id as usize >= self.config().vocab_size) {
            Some(&id) => Err(Error::TokenOutOfRange { id: id.into(), vocab_size: self.config().vocab_size }),
            None => Ok(()),
        }
    }
}

/// Bytes of memory available to new allocations (Linux `MemAvailable`), if known.
pub(crate) fn available_memory() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// How to make a [`Session`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    /// Positions the cache holds (default: [`LoadedModel::default_context_length`]).
    pub context_length: Option<usize>,
    pub kv_dtype: KvDtype,
    pub overflow: Overflow,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions { context_length: None, kv_dtype: KvDtype::F32, overflow: Overflow::Error }
    }
}

/// One sequence's state: its tokens and their KV cache.
///
/// Invariant: the cache holds the keys and values of `tokens[..cache.len()]`. After a
/// truncation that a full sliding window cannot serve (it has already overwritten keys the
/// kept prefix needs), the cache restarts empty and the next call recomputes the prefix,
/// which gives the same bits as if it had never been dropped (docs/theory.md, "The KV cache").
pub struct Session {
    pub(crate) loaded: Arc<LoadedModel>,
    pub(crate) cache: KvCache,
    pub(crate) scratch: Scratch,
    /// [n_tokens] every id of the sequence, in position order
    pub(crate) tokens: Vec<u32>,
}

impl Session {
    /// A session whose f32 cache holds up to `capacity` positions and refuses to overflow.
    pub fn new(loaded: Arc<LoadedModel>, capacity: usize) -> Result<Session> {
        Session::with_options(loaded, &SessionOptions { context_length: Some(capacity), ..Default::default() })
    }

    pub fn with_options(loaded: Arc<LoadedModel>, options: &SessionOptions) -> Result<Session> {
        let capacity = options.context_length.unwrap_or_else(|| loaded.default_context_length(options.kv_dtype));
        let cache = KvCache::with_options(
            loaded.config(),
            &KvCacheOptions { capacity, dtype: options.kv_dtype, overflow: options.overflow },
        )?;
        Ok(Session::from_parts(loaded, cache, Vec::new()))
    }

    pub(crate) fn from_parts(loaded: Arc<LoadedModel>, cache: KvCache, tokens: Vec<u32>) -> Session {
        Session { loaded, cache, scratch: Scratch::default(), tokens }
    }

    pub fn loaded(&self) -> &Arc<LoadedModel> {
        &self.loaded
    }

    /// Every id of the sequence so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Bytes of keys and values held (see [`KvCache::kv_bytes`]).
    pub fn kv_bytes(&self) -> usize {
        self.cache.kv_bytes()
    }

    /// Drops every token from `n` on; the prefix before it stays valid (causality: a position's
    /// keys and values depend only on the tokens up to it).
    pub fn truncate(&mut self, n: usize) {
        let n = n.min(self.tokens.len());
        self.tokens.truncate(n);
        if n < self.cache.len() {
            // false: the window could not keep the prefix; it is recomputed on the next call.
            let _kept = self.cache.truncate(n);
        }
    }

    /// Appends `ids` and runs every position not yet in the cache. Checks the ids and the
    /// overflow policy before any work.
    fn forward(&mut self, ids: &[u32], rows: LogitRows) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.loaded.check_ids(ids)?;
        let old_len = self.tokens.len();
        self.cache.check_fits(old_len - self.cache.len() + ids.len())?;
        self.tokens.extend_from_slice(ids);
        let result = self.run_pending(rows, ids.len());
        if result.is_err() {
            self.tokens.truncate(self.cache.len().max(old_len));
        }
        result
    }

    /// Runs `tokens[cache.len()..]` in as few forward calls as the cache allows (one, unless
    /// a full sliding window forces one token per call); the last `n_new` are the caller's.
    fn run_pending(&mut self, rows: LogitRows, n_new: usize) -> Result<()> {
        let loaded = &*self.loaded;
        let total = self.tokens.len();
        let first_new = total - n_new;
        let vocab = loaded.config().vocab_size;
        let mut gathered: Option<Vec<f32>> = None;
        while self.cache.len() < total {
            let a = self.cache.len();
            let b = total.min(a + self.cache.max_append());
            let batch_rows = match rows {
                LogitRows::None => LogitRows::None,
                LogitRows::Last if b == total => LogitRows::Last,
                LogitRows::All if b > first_new => LogitRows::All,
                _ => LogitRows::None,
            };
            loaded.transformer.forward(&loaded.pool, &mut self.cache, &mut self.scratch, &self.tokens[a..b], batch_rows)?;
            if batch_rows == LogitRows::All && !(a == first_new && b == total) {
                let skip = first_new.saturating_sub(a);
                gathered.get_or_insert_with(Vec::new).extend_from_slice(&self.scratch.logits[skip * vocab..(b - a) * vocab]);
            }
        }
        if let Some(all) = gathered {
            self.scratch.logits = all;
        }
        Ok(())
    }

    /// Appends `ids` and returns the logits after the last of them.
    pub fn feed(&mut self, ids: &[u32]) -> Result<&[f32]> {
        self.forward(ids, LogitRows::Last)?;
        Ok(&self.scratch.logits)
    }

    /// Logits for the token after `context`, reusing the cached prefix that `context` shares
    /// with what this session has processed and computing only the rest (the cache is valid
    /// up to the first changed token, docs/theory.md, "The KV cache").
    pub fn next_logits(&mut self, context: &[u32]) -> Result<&[f32]> {
        let start = self.reuse_prefix(context)?;
        self.feed(&context[start..])
    }

    /// Computes up to `max_tokens` more of `context` (all but its last token, which
    /// [`Session::next_logits`] computes), reusing the shared cached prefix like it; returns
    /// how many of them are still left. Splitting the work this way changes no bits
    /// (each row gets the bits of a full recomputation); it lets a caller stop between blocks.
    pub fn prefill_part(&mut self, context: &[u32], max_tokens: usize) -> Result<usize> {
        let start = self.reuse_prefix(context)?;
        let end = (context.len() - 1).min(start + max_tokens);
        if end > start {
            self.forward(&context[start..end], LogitRows::None)?;
        }
        Ok(context.len() - 1 - end)
    }

    /// Truncates to the prefix `context` shares with the session, keeping at least its last
    /// token to compute; returns where the rest of `context` starts.
    fn reuse_prefix(&mut self, context: &[u32]) -> Result<usize> {
        if context.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let shared = self.tokens.iter().zip(context).take_while(|(a, b)| a == b).count();
        self.truncate(shared.min(context.len() - 1));
        Ok(self.tokens.len())
    }

    /// Generates from `prompt` (the whole context, not a continuation of this session's
    /// tokens): the prefix `prompt` shares with the session is reused, the rest computed. With
    /// the `Error` policy, `prompt.len() + max_tokens` must fit the cache, checked before any
    /// work. Afterwards the session holds the prompt and the generated ids but the last.
    pub fn generate(&mut self, request: GenerationSpec) -> Result<Generation> {
        self.check_generation(request.prompt.len(), request.stop.max_tokens)?;
        decode::generate(self, request)
    }

    /// Whether a generation of up to `max_tokens` after a prompt of `prompt_len` tokens may
    /// start: with the `Error` policy, `prompt_len + max_tokens` must fit the cache
    /// ([`Error::ContextOverflow`] otherwise); a sliding window always may.
    pub fn check_generation(&self, prompt_len: usize, max_tokens: usize) -> Result<()> {
        let requested = prompt_len.saturating_add(max_tokens);
        if self.cache.overflow() == Overflow::Error && requested > self.capacity() {
            return Err(Error::ContextOverflow { requested, allowed: self.capacity() });
        }
        Ok(())
    }

    /// Appends `ids` and returns the logits after each of them: [ids.len()][vocab_size].
    pub fn feed_all(&mut self, ids: &[u32]) -> Result<&[f32]> {
        self.forward(ids, LogitRows::All)?;
        Ok(&self.scratch.logits)
    }
}

impl decode::LanguageModel for Session {
    fn vocab_size(&self) -> usize {
        self.loaded.config().vocab_size
    }

    fn eos_id(&self) -> Option<u32> {
        self.loaded.config().eos_id
    }

    fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>> {
        Session::next_logits(self, context).map(<[f32]>::to_vec)
    }
}

impl decode::speculative::Target for Session {
    /// Computes the context but its last token (reusing the shared cached prefix, which drops
    /// the drafts of an earlier pass that the context does not keep), then the last token and
    /// the drafts in one pass with every row's logits.
    fn score(&mut self, context: &[u32], drafted: &[u32]) -> Result<Vec<f32>> {
        self.prefill_part(context, usize::MAX)?;
        let mut ids = Vec::with_capacity(drafted.len() + 1);
        ids.extend(context.last());
        ids.extend_from_slice(drafted);
        self.feed_all(&ids).map(<[f32]>::to_vec)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::SeqCst;

    use super::*;

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// A panic in any phase of a pass, on any thread, is an `Internal` error; the session's
    /// cache is emptied, and its next call recomputes the context with the same bits.
    #[test]
    fn a_panic_in_a_pass_is_an_internal_error_and_the_session_recovers() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/arch/llama3-f32.gguf");
        let ids = [1u32, 5, 9, 13, 2, 7];
        for threads in [1, 2, 3] {
            let options = LoadOptions { threads: Some(threads), ..Default::default() };
            let loaded = Arc::new(LoadedModel::load(path, &options).unwrap());
            let vocab = loaded.config().vocab_size;
            let expected = loaded.logits(&ids).unwrap();
            for countdown in [1, 2, 7, 15] {
                let mut session = Session::new(Arc::clone(&loaded), 16).unwrap();
                session.forward(&ids[..2], LogitRows::None).unwrap();
                loaded.pool.panic_countdown.store(countdown, SeqCst);
                match session.forward(&ids[2..], LogitRows::All) {
                    Err(Error::Internal(m)) => assert!(m.contains("a fault injected"), "{m}"),
                    other => panic!("expected an internal error, got {other:?}"),
                }
                assert_eq!(loaded.pool.panic_countdown.load(SeqCst), 0, "the fault fired in that pass");
                assert_eq!(session.cache.len(), 0);
                session.forward(&ids[2..], LogitRows::All).unwrap();
                assert_eq!(bits(&session.scratch.logits), bits(&expected[2 * vocab..]));
            }
        }
    }
}
