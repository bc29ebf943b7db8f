//! The forward pass over a batch of rows drawn from one or several sequences, for every
//! supported architecture (the differences are data: [`ModelConfig::traits`], per-layer
//! attention settings, and the optional tensors of [`LayerWeights`]).
//!
//! A forward call takes, for each sequence, its KV cache and the tokens of its next
//! consecutive positions; the rows of all sequences run through every per-token step and
//! matmul together (weights read once per call), and each row attends to its own sequence's
//! cache only.
//!
//! Token embeddings (times `sqrt(d_model)` for Gemma), then per layer: RMSNorm -> Q, K, V
//! projections (+ biases: Qwen2) -> RMSNorm of each query and key head (Qwen3, Gemma 3) ->
//! RoPE (adjacent pairs or halves, the layer's base, Llama 3 frequency factors, linear
//! position scaling) -> K, V written to the cache -> causal grouped-query attention over the
//! cache (within the layer's sliding window, if any) -> output projection (-> RMSNorm:
//! Gemma 3) + residual -> RMSNorm -> gated feed-forward (SiLU or GELU-tanh gate) (-> RMSNorm:
//! Gemma 3) + residual; final RMSNorm and output matrix. Activations
//! are f32 throughout, except that with [`Precision::Int8`] each matmul on quantized weights
//! reads its input quantized per group of 32 (`kernels::quantize_act`). Parallel phases
//! split only independent outputs (matrix rows, (token, head) pairs, tokens), so each value
//! has one op sequence whatever the thread count or the number of tokens per call.

use super::config::{ModelConfig, RopeStyle};
use super::kv_cache::KvCache;
use super::rowwise;
use super::weights::{LayerWeights, TransformerWeights, Matrix};
use crate::error::{Error, Result};
use crate::kernels::aligned::AlignedBuf;
use crate::kernels::{
    elementwise, group_sums_len, matmul_rows, matmul_rows_int8, weighted_row_sums, Activations, Isa,
    Precision, QuantizedRows,
};
use crate::threads::{split, Disjoint, ThreadPool};

/// Which positions of a forward call need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// Every position (`Model::logits`).
    All,
    /// Only the last (generation).
    Last,
    /// None (prefill of a prefix).
    None,
}

/// One sequence's part of a forward call: the tokens of its next positions
/// (`cache.len()..`), appended to its cache, and which of them need logits.
pub struct SeqInput<'a> {
    pub cache: &'a mut KvCache,
    pub tokens: &'a [u32],
    pub logits: LogitRows,
}

/// A Llama model: configuration, weights (packed for a [`Precision`], see
/// [`Transformer::precision`]) and the kernel path to run on.
pub struct Transformer {
    pub config: ModelConfig,
    pub weights: TransformerWeights,
    pub isa: Isa,
}

/// Reusable buffers for forward calls; grown to the largest batch seen.
#[derive(Default)]
pub struct Scratch {
    n_tokens: usize,
    /// [T][d_model] residual stream
    x: AlignedBuf<f32>,
    /// [T][d_model] normalised input of the current matmul
    xn: AlignedBuf<f32>,
    /// [T][group_sums_len(max(d_model, ffn_dim))] group sums of the current matmul input
    /// (float32 precision)
    gs: AlignedBuf<f32>,
    /// The current matmul input quantized per group (int8 precision; grows in `quantize`)
    xq: QuantizedRows,
    /// [T][d_q]
    q: AlignedBuf<f32>,
    /// [T][d_kv]
    k: AlignedBuf<f32>,
    /// [T][d_kv]
    v: AlignedBuf<f32>,
    /// [T][d_q] attention output (heads concatenated)
    att: AlignedBuf<f32>,
    /// [T][d_model] projection output before the residual add
    proj: AlignedBuf<f32>,
    /// [T][ffn_dim]
    gate: AlignedBuf<f32>,
    /// [T][ffn_dim]
    up: AlignedBuf<f32>,
    /// [T] index of the row's sequence in the call's `SeqInput`s
    row_seq: Vec<usize>,
    /// [T] absolute position of each row
    row_pos: Vec<usize>,
    /// [rope bases][T][head_dim / 2] rotation of each pair at each position, one table per
    /// distinct RoPE base of the layers ([`rope_bases`])
    rope_cos: AlignedBuf<f32>,
    rope_sin: AlignedBuf<f32>,
    /// [n_threads][group_size][capacity] attention scores of the query heads sharing a KV
    /// head (the keys each query attends to, in position order)
    scores: AlignedBuf<f32>,
    /// [rows needing logits][vocab_size]
    pub logits: Vec<f32>,
}

impl Scratch {
    fn ensure(&mut self, cfg: &ModelConfig, n_tokens: usize, n_threads: usize, capacity: usize) {
        let t = n_tokens;
        self.x.grow(t * cfg.d_model, 0.0);
        let widest = cfg.d_model.max(cfg.ffn_dim).max(cfg.d_q());
        self.xn.grow(t * cfg.d_model.max(cfg.ffn_dim), 0.0);
        self.gs.grow(t * group_sums_len(widest), 0.0);
        self.q.grow(t * cfg.d_q(), 0.0);
        self.k.grow(t * cfg.d_kv(), 0.0);
        self.v.grow(t * cfg.d_kv(), 0.0);
        self.att.grow(t * cfg.d_q(), 0.0);
        self.proj.grow(t * cfg.d_model, 0.0);
        self.gate.grow(t * cfg.ffn_dim, 0.0);
        self.up.grow(t * cfg.ffn_dim, 0.0);
        let n_bases = rope_bases(cfg).len();
        self.rope_cos.grow(n_bases * t * cfg.head_dim / 2, 0.0);
        self.rope_sin.grow(n_bases * t * cfg.head_dim / 2, 0.0);
        self.scores.grow(CHUNKS_PER_THREAD * n_threads * cfg.group_size() * capacity, 0.0);
        self.n_tokens = t;
    }
}

/// Parallel phases are cut into up to this many chunks per thread, so a thread the OS
/// deschedules delays the others by one small chunk at most.
const CHUNKS_PER_THREAD: usize = 4;
/// Activation rows below which quantizing them is not worth a hand-off.
const MIN_TOKENS_PER_QUANTIZE_CHUNK: usize = 8;
/// Matrix rows below which a chunk is not worth the hand-off.
const MIN_ROWS_PER_CHUNK: usize = 16;

/// How many chunks to cut `units` of independent work into (at least 1).
fn chunks_for(pool: &ThreadPool, units: usize) -> usize {
    units.min(CHUNKS_PER_THREAD * pool.n_threads()).max(1)
}

impl Transformer {
    /// Runs `tokens` at positions `cache.len()..` and appends them to the cache. Logits of
    /// the requested rows are left in `scratch.logits` ([rows][vocab_size]).
    pub fn forward(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        scratch: &mut Scratch,
        tokens: &[u32],
        rows: LogitRows,
    ) -> Result<()> {
        self.forward_batch(pool, scratch, &mut [SeqInput { cache, tokens, logits: rows }])
    }

    /// One forward call over the rows of several sequences: each `SeqInput`'s tokens run at
    /// its cache's next positions and are appended to that cache. Logits of the requested rows
    /// are left in `scratch.logits` ([rows][vocab_size]), sequences in order.
    ///
    /// Every row is computed with the same op sequence whatever else is in the call (the other
    /// sequences, their number and lengths): per-token steps and matmuls treat rows
    /// independently, and a row's attention reads only its own sequence's keys in position
    /// order. Checks every sequence (ids, room in its cache) before any work.
    pub fn forward_batch(&self, pool: &ThreadPool, scratch: &mut Scratch, seqs: &mut [SeqInput<'_>]) -> Result<()> {
        let cfg = &self.config;
        for seq in seqs.iter() {
            if seq.tokens.is_empty() {
                return Err(Error::EmptyPrompt);
            }
            if let Some(&bad) = seq.tokens.iter().find(|&&id| id as usize >= cfg.vocab_size) {
                return Err(Error::TokenOutOfRange { id: bad.into(), vocab_size: cfg.vocab_size });
            }
            seq.cache.check_append(seq.tokens.len())?;
        }
        if seqs.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        let pass = pool.install(|| self.pass(pool, scratch, seqs));
        if pass.is_err() {
            // A panic (a bug) may have left some of the pass's cache rows written: empty the
            // caches, so their sequences are recomputed rather than read half-written.
            seqs.iter_mut().for_each(|seq| seq.cache.clear());
        }
        pass
    }

    /// The pass of [`forward_batch`](Self::forward_batch) over checked, non-empty inputs, run
    /// inside the pool so that each parallel phase is dispatched among its threads.
    fn pass(&self, pool: &ThreadPool, scratch: &mut Scratch, seqs: &mut [SeqInput<'_>]) {
        let cfg = &self.config;
        let t_n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let capacity = seqs.iter().map(|s| s.cache.capacity()).max().unwrap_or(1);
        scratch.ensure(cfg, t_n, pool.n_threads(), capacity);
        let (d, dq, ff) = (cfg.d_model, cfg.d_q(), cfg.ffn_dim);
        let w = &self.weights;

        scratch.row_seq.clear();
        scratch.row_pos.clear();
        let mut t = 0;
        for (i, seq) in seqs.iter().enumerate() {
            let p0 = seq.cache.len();
            for (j, &id) in seq.tokens.iter().enumerate() {
                w.dequantize_matrix_row(&w.token_embd, id as usize, &mut scratch.x[t * d..(t + 1) * d]);
                scratch.row_seq.push(i);
                scratch.row_pos.push(p0 + j);
                t += 1;
            }
        }
        if cfg.traits.scale_embeddings {
            // As Gemma's reference does: sqrt(d_model) rounded to f32, one product per value.
            let scale = (d as f32).sqrt();
            scratch.x[..t_n * d].iter_mut().for_each(|v| *v *= scale);
        }
        let bases = rope_bases(cfg);
        self.rope_tables(scratch, &bases, t_n);

        let eps = cfg.rms_eps;
        let first_norm = w.layers.first().map(|lw| &lw.attn_norm[..]);
        rowwise::residual_norm(pool, &mut scratch.x, None, first_norm, eps, (t_n, d), &mut scratch.xn, &mut scratch.gs);
        self.quantize_input(pool, &scratch.xn, d, t_n, &mut scratch.xq);
        for (l, lw) in w.layers.iter().enumerate() {
            crate::count::set_layer(Some(l));
            // Attention block (its input is ready: xn, gs, and xq for int8).
            self.matmuls(
                pool,
                &scratch.xn,
                &scratch.gs,
                &scratch.xq,
                t_n,
                &mut [(&lw.wq, &mut scratch.q), (&lw.wk, &mut scratch.k), (&lw.wv, &mut scratch.v)],
            );
            let table = bases.iter().position(|&b| b == cfg.layers[l].rope_base).unwrap_or(0);
            self.positional_qk(lw, scratch, table, t_n);
            let dkv = cfg.d_kv();
            for t in 0..t_n {
                let cache = &mut *seqs[scratch.row_seq[t]].cache;
                cache.write(l, scratch.row_pos[t], &scratch.k[t * dkv..(t + 1) * dkv], &scratch.v[t * dkv..(t + 1) * dkv]);
            }
            let caches: Vec<&KvCache> = seqs.iter().map(|s| &*s.cache).collect();
            self.attention(pool, &caches, scratch, l, t_n, capacity);
            rowwise::group_sums_rows(pool, &scratch.att, dq, t_n, &mut scratch.gs);
            self.quantize_input(pool, &scratch.att, dq, t_n, &mut scratch.xq);
            self.matmuls(pool, &scratch.att, &scratch.gs, &scratch.xq, t_n, &mut [(&lw.wo, &mut scratch.proj)]);
            if let Some(norm) = &lw.post_attn_norm {
                rowwise::norm_in_place(pool, &mut scratch.proj, norm, eps, (t_n, d));
            }
            let (x, xn, gs) = (&mut scratch.x, &mut scratch.xn, &mut scratch.gs);
            rowwise::residual_norm(pool, x, Some(&scratch.proj), Some(&lw.ffn_norm), eps, (t_n, d), xn, gs);
            self.quantize_input(pool, &scratch.xn, d, t_n, &mut scratch.xq);

            // Feed-forward block.
            self.matmuls(
                pool,
                &scratch.xn,
                &scratch.gs,
                &scratch.xq,
                t_n,
                &mut [(&lw.w_gate, &mut scratch.gate), (&lw.w_up, &mut scratch.up)],
            );
            let act = cfg.traits.activation;
            rowwise::gated(pool, self.isa, act, &mut scratch.gate, &scratch.up, ff, t_n, &mut scratch.gs);
            self.quantize_input(pool, &scratch.gate, ff, t_n, &mut scratch.xq);
            self.matmuls(pool, &scratch.gate, &scratch.gs, &scratch.xq, t_n, &mut [(&lw.w_down, &mut scratch.proj)]);
            if let Some(norm) = &lw.post_ffn_norm {
                rowwise::norm_in_place(pool, &mut scratch.proj, norm, eps, (t_n, d));
            }
            // The residual add, and the next layer's input norm.
            let next_norm = w.layers.get(l + 1).map(|next| &next.attn_norm[..]);
            let (x, xn, gs) = (&mut scratch.x, &mut scratch.xn, &mut scratch.gs);
            rowwise::residual_norm(pool, x, Some(&scratch.proj), next_norm, eps, (t_n, d), xn, gs);
            if next_norm.is_some() {
                self.quantize_input(pool, &scratch.xn, d, t_n, &mut scratch.xq);
            }
        }
        for seq in seqs.iter_mut() {
            let end = seq.cache.len() + seq.tokens.len();
            seq.cache.advance_to(end);
        }
        crate::count::set_layer(None);

        // The rows that need logits, moved to the front of `x` in order (row i comes from a
        // row at or after i, so the moves never overwrite a row still to be moved).
        let mut n_out = 0;
        let mut first = 0;
        for seq in seqs.iter() {
            let n = seq.tokens.len();
            let wanted = match seq.logits {
                LogitRows::None => 0..0,
                LogitRows::Last => n - 1..n,
                LogitRows::All => 0..n,
            };
            for r in wanted {
                let from = first + r;
                if from != n_out {
                    scratch.x.copy_within(from * d..(from + 1) * d, n_out * d);
                }
                n_out += 1;
            }
            first += n;
        }
        if n_out == 0 {
            return;
        }
        let (x, xn, gs) = (&mut scratch.x, &mut scratch.xn, &mut scratch.gs);
        rowwise::residual_norm(pool, x, None, Some(&w.output_norm), cfg.rms_eps, (n_out, d), xn, gs);
        self.quantize_input(pool, &scratch.xn, d, n_out, &mut scratch.xq);
        let mut logits = std::mem::take(&mut scratch.logits);
        logits.resize(n_out * cfg.vocab_size, 0.0);
        self.matmuls(pool, &scratch.xn, &scratch.gs, &scratch.xq, n_out, &mut [(&w.output, &mut logits)]);
        scratch.logits = logits;
    }

    /// For each RoPE base in `bases` and each row: cos and sin of
    /// `pos * scale * base^(-2i / head_dim) / factor_i` for pair `i` (`scale`: linear RoPE
    /// scaling, `factor_i`: Llama 3's frequency factors, both 1 by default), computed in f64
    /// and rounded once. Tables [bases][T][head_dim / 2].
    fn rope_tables(&self, s: &mut Scratch, bases: &[f32], t_n: usize) {
        let cfg = &self.config;
        let half = cfg.head_dim / 2;
        let factors = self.weights.rope_freq_factors.as_deref();
        for (b, &base) in bases.iter().enumerate() {
            for t in 0..t_n {
                let pos = s.row_pos[t] as f64 * cfg.rope_position_scale as f64;
                for i in 0..half {
                    let mut theta = (base as f64).powf(-2.0 * i as f64 / cfg.head_dim as f64);
                    if let Some(f) = factors {
                        theta /= f[i] as f64;
                    }
                    let (sin, cos) = (pos * theta).sin_cos();
                    let at = (b * t_n + t) * half + i;
                    s.rope_cos[at] = cos as f32;
                    s.rope_sin[at] = sin as f32;
                }
            }
        }
    }

    /// The per-row steps between the Q/K/V projections and the cache: biases, query and key
    /// head norms, and RoPE with rotation table `table`, in place on `s.q` and `s.k`.
    fn positional_qk(&self, lw: &LayerWeights, s: &mut Scratch, table: usize, t_n: usize) {
        let cfg = &self.config;
        let (dq, dkv, hd) = (cfg.d_q(), cfg.d_kv(), cfg.head_dim);
        let half = hd / 2;
        for t in 0..t_n {
            let (q, k, v) = (&mut s.q[t * dq..(t + 1) * dq], &mut s.k[t * dkv..(t + 1) * dkv], &mut s.v[t * dkv..(t + 1) * dkv]);
            if let Some([bq, bk, bv]) = &lw.qkv_bias {
                for (x, b) in [(&mut *q, bq), (&mut *k, bk), (&mut *v, bv)] {
                    x.iter_mut().zip(b).for_each(|(a, &b)| *a += b);
                }
            }
            if let Some([nq, nk]) = &lw.qk_norm {
                q.chunks_exact_mut(hd).for_each(|head| rowwise::rms_norm_in_place(head, nq, cfg.rms_eps));
                k.chunks_exact_mut(hd).for_each(|head| rowwise::rms_norm_in_place(head, nk, cfg.rms_eps));
            }
            let at = (table * t_n + t) * half;
            let (cos, sin) = (&s.rope_cos[at..at + half], &s.rope_sin[at..at + half]);
            rope(q, hd, cfg.traits.rope_style, cos, sin);
            rope(k, hd, cfg.traits.rope_style, cos, sin);
        }
    }

    /// The arithmetic of matmuls on quantized weights (chosen when the weights were packed).
    pub fn precision(&self) -> Precision {
        self.weights.precision()
    }

    /// With int8 precision, quantizes the `t_n` input rows of `cols` values of the next matmul
    /// phase into `xq` (each row by the same code whichever thread takes it, so the result is
    /// the same for any thread count); float32 matmuls read the rows and their group sums.
    fn quantize_input(&self, pool: &ThreadPool, x: &[f32], cols: usize, t_n: usize, xq: &mut QuantizedRows) {
        if self.precision() != Precision::Int8 {
            return;
        }
        let writer = xq.writer(cols, t_n);
        if t_n < MIN_TOKENS_PER_QUANTIZE_CHUNK * 2 {
            // SAFETY: one writer, all rows.
            unsafe { writer.quantize(self.isa, x, 0..t_n) };
        } else {
            let n = chunks_for(pool, t_n / MIN_TOKENS_PER_QUANTIZE_CHUNK);
            // SAFETY: chunk c writes only its own rows.
            pool.run(n, |c| unsafe { writer.quantize(self.isa, x, split(t_n, c, n)) });
        }
    }

    /// One parallel phase: several matrices applied to the same `t_n` input rows, their
    /// output rows concatenated and split evenly across the pool. Quantized matrices packed
    /// for int8 read `xq`, the others `x` (and `gs`).
    fn matmuls(
        &self,
        pool: &ThreadPool,
        x: &[f32],
        gs: &[f32],
        xq: &QuantizedRows,
        t_n: usize,
        jobs: &mut [(&Matrix, &mut [f32])],
    ) {
        let cols = jobs[0].0.cols;
        let act = Activations { x, gs, n_tokens: t_n, cols };
        let mats: Vec<_> = jobs
            .iter_mut()
            .map(|(m, out)| {
                debug_assert!(m.cols == cols && out.len() >= t_n * m.rows);
                let int8 = self.weights.is_int8(m);
                debug_assert!(!int8 || (xq.n_tokens == t_n && xq.cols == cols));
                (self.weights.mat(m), Disjoint::new(&mut out[..]), int8)
            })
            .collect();
        let total: usize = mats.iter().map(|(m, _, _)| m.rows).sum();
        let n = chunks_for(pool, total / MIN_ROWS_PER_CHUNK);
        pool.run(n, |c| {
            let mine = split(total, c, n);
            let mut base = 0;
            for (m, out, int8) in &mats {
                let (lo, hi) = (mine.start.max(base), mine.end.min(base + m.rows));
                if lo < hi {
                    // SAFETY: each (token, row) output belongs to the one chunk whose rows hold it.
                    unsafe {
                        if *int8 {
                            matmul_rows_int8(self.isa, m, xq, lo - base..hi - base, *out, m.rows)
                        } else {
                            matmul_rows(self.isa, m, &act, lo - base..hi - base, *out, m.rows)
                        }
                    };
                }
                base += m.rows;
            }
        });
    }

    /// Causal attention of the `t_n` rows, each over its own sequence's cache (`caches`
    /// indexed by `row_seq`, at position `row_pos`), parallel over (row, head) pairs; a thread takes its consecutive heads that share a
    /// KV head together, so each key and value row is read once for all of them.
    ///
    /// Each query reads the keys it attends to (see [`KvCache::pieces_into`]) in position order:
    /// scores are independent dots (the kernels give a dot the same op sequence whatever the
    /// number of queries per call), the softmax and the weighted sum of values run over them
    /// in position order with one accumulator, so a query's op sequence depends only on the
    /// positions it attends to. Output in `scratch.att`.
    /// `capacity` is the largest cache's: the stride of the score rows.
    fn attention(&self, pool: &ThreadPool, caches: &[&KvCache], s: &mut Scratch, layer: usize, t_n: usize, capacity: usize) {
        let cfg = &self.config;
        let (dq, hd, nh, gs) = (cfg.d_q(), cfg.head_dim, cfg.n_heads, cfg.group_size());
        let scale = 1.0 / (hd as f32).sqrt();
        let window = cfg.layers[layer].window;
        let tasks = t_n * cfg.n_heads;
        let n = chunks_for(pool, tasks);
        let (q, row_seq, row_pos) = (&s.q, &s.row_seq, &s.row_pos);
        let (att, scores) = (Disjoint::new(&mut s.att), Disjoint::new(&mut s.scores));
        pool.run(n, |c| {
            // SAFETY: chunk c owns scores block c and the att slices of its (token, head) pairs.
            let scores = unsafe { scores.slice(c * gs * capacity..(c + 1) * gs * capacity) };
            let mine = split(tasks, c, n);
            let mut task = mine.start;
            let mut pieces = Vec::new();
            let mut values = Vec::new();
            while task < mine.end {
                let (t, h) = (task / nh, task % nh);
                let g = h / gs;
                // Heads h..h + nq: this thread's, all reading KV head g.
                let nq = ((g + 1) * gs - h).min(mine.end - task);
                task += nq;
                let cache = caches[row_seq[t]];
                let pos = row_pos[t];
                let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                cache.pieces_into(pos, first, &mut pieces);
                let queries = &q[t * dq + h * hd..t * dq + (h + nq) * hd];
                let act = Activations { x: queries, gs: &[], n_tokens: nq, cols: hd };
                let mut n_keys = 0;
                for r in &pieces {
                    let keys = cache.keys(layer, g, r.clone());
                    // SAFETY: nq rows of keys.rows outputs, `capacity` apart, in this chunk's
                    // own scores block (the pieces hold at most `capacity` keys in all).
                    unsafe { matmul_rows(self.isa, &keys, &act, 0..keys.rows, Disjoint::new(&mut scores[n_keys..]), capacity) };
                    n_keys += keys.rows;
                }
                for j in 0..nq {
                    elementwise::softmax_scaled(self.isa, &mut scores[j * capacity..j * capacity + n_keys], scale);
                }
                values.clear();
                values.extend(pieces.iter().map(|r| cache.values(layer, g, r.clone())));
                // SAFETY: the (token, head) pairs of this chunk's tasks are its own.
                let out = unsafe { att.slice(t * dq + h * hd..t * dq + (h + nq) * hd) };
                weighted_row_sums(self.isa, scores, capacity, &values, out);
            }
        });
    }
}

/// The RoPE bases of the layers, each once, in order of first use.
fn rope_bases(cfg: &ModelConfig) -> Vec<f32> {
    let mut bases: Vec<f32> = Vec::new();
    for layer in &cfg.layers {
        if !bases.contains(&layer.rope_base) {
            bases.push(layer.rope_base);
        }
    }
    bases
}

/// Rotates the pairs of every head in `x` ([heads][head_dim]) by the angles of `cos` and
/// `sin` ([head_dim / 2]): pair `i` is `(2i, 2i + 1)` or `(i, i + head_dim / 2)`.
fn rope(x: &mut [f32], hd: usize, style: RopeStyle, cos: &[f32], sin: &[f32]) {
    let half = hd / 2;
    for head in x.chunks_exact_mut(hd) {
        for i in 0..half {
            let (ia, ib) = match style {
                RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                RopeStyle::Halves => (i, i + half),
            };
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * cos[i] - b * sin[i];
            head[ib] = a * sin[i] + b * cos[i];
        }
    }
}
