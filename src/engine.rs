//! A loaded model ready to run: parsed file, weights, tokenizer and thread pool, plus the
//! sessions that hold one sequence's KV cache.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kernels::Isa;
use crate::model::{KvCache, Llama, LlamaWeights, LogitRows, ModelConfig, Scratch};
use crate::threads::ThreadPool;
use crate::tokenizer::{Tokenizer, TokenizerSpec};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Worker threads in all (default: the machine's available parallelism).
    pub threads: Option<usize>,
    /// Kernel path: "scalar", "avx2" or "avx512" (default: `REPROLM_ISA`, else the best).
    pub isa: Option<String>,
}

/// Upper bound on `threads`, far above any useful value, to reject typos early.
const MAX_THREADS: usize = 1024;

pub struct Engine {
    pub file: GgufFile,
    pub llama: Llama,
    pub tokenizer: Tokenizer,
    pool: ThreadPool,
}

impl Engine {
    pub fn load(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Engine> {
        let threads = match options.threads {
            None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            Some(n) if (1..=MAX_THREADS).contains(&n) => n,
            Some(n) => return Err(Error::invalid_argument("threads", format!("{n} is not in 1..={MAX_THREADS}"))),
        };
        let isa = Isa::select(options.isa.as_deref())?;
        let file = GgufFile::open(path)?;
        let config = ModelConfig::from_gguf(&file)?;
        let weights = LlamaWeights::from_gguf(&file, &config)?;
        let tokenizer = Tokenizer::from_spec(TokenizerSpec::from_gguf(&file)?)?;
        if tokenizer.vocab_size() != config.vocab_size {
            return Err(Error::Model(format!(
                "the tokenizer has {} tokens but the model {}",
                tokenizer.vocab_size(),
                config.vocab_size
            )));
        }
        Ok(Engine { file, llama: Llama { config, weights, isa }, tokenizer, pool: ThreadPool::new(threads) })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.llama.config
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

    /// Checks every id against the vocabulary.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&id| id as usize >= self.config().vocab_size) {
            Some(&id) => Err(Error::TokenOutOfRange { id: id.into(), vocab_size: self.config().vocab_size }),
            None => Ok(()),
        }
    }
}

/// One sequence's state: the tokens processed so far and their KV cache.
pub struct Session {
    engine: Arc<Engine>,
    cache: KvCache,
    scratch: Scratch,
    /// The ids whose keys and values are in the cache, in order.
    tokens: Vec<u32>,
}

impl Session {
    /// A session whose cache holds up to `capacity` positions.
    pub fn new(engine: Arc<Engine>, capacity: usize) -> Result<Session> {
        let cache = KvCache::new(engine.config(), capacity)?;
        Ok(Session { engine, cache, scratch: Scratch::default(), tokens: Vec::new() })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// Drops every position from `n` on (the cached prefix before it stays valid).
    pub fn truncate(&mut self, n: usize) {
        let n = n.min(self.tokens.len());
        self.tokens.truncate(n);
        self.cache.set_len(n);
    }

    fn forward(&mut self, ids: &[u32], rows: LogitRows) -> Result<()> {
        let engine = &*self.engine;
        engine.llama.forward(&engine.pool, &mut self.cache, &mut self.scratch, ids, rows)?;
        self.tokens.extend_from_slice(ids);
        Ok(())
    }

    /// Appends `ids` and returns the logits after the last of them.
    pub fn feed(&mut self, ids: &[u32]) -> Result<&[f32]> {
        self.forward(ids, LogitRows::Last)?;
        Ok(&self.scratch.logits)
    }

    /// Logits for the token after `context`, reusing the cached prefix that `context` shares
    /// with what this session has processed and computing only the rest (the cache is valid
    /// up to the first changed token, theorem 7.2).
    pub fn next_logits(&mut self, context: &[u32]) -> Result<&[f32]> {
        if context.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let shared = self.tokens.iter().zip(context).take_while(|(a, b)| a == b).count();
        // At least the last token is recomputed, to produce its logits.
        self.truncate(shared.min(context.len() - 1));
        let start = self.tokens.len();
        self.feed(&context[start..])
    }
}

impl crate::decode::LanguageModel for Session {
    fn vocab_size(&self) -> usize {
        self.engine.config().vocab_size
    }

    fn eos_id(&self) -> Option<u32> {
        self.engine.config().eos_id
    }

    fn next_logits(&mut self, context: &[u32]) -> Result<Vec<f32>> {
        Session::next_logits(self, context).map(<[f32]>::to_vec)
    }
}
