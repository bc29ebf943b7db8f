//! The model's tensors as typed views into the memory-mapped GGUF file.

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::sync::Arc;

use memmap2::Mmap;

use super::config::ModelConfig;
use super::huge_pages::HugePageBytes;
use crate::error::{Error, Result};
use crate::gguf::fingerprint::rows_per_segment;
use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels::packed::{dequantize_packed_row_in, is_int8_packable, is_packed, layout_row_bytes, pack_rows_in, reads_blocks_in_place, Layout};
use crate::kernels::{MatRef, Precision, GROUP};
use crate::tensor::{dequantize_row, GgmlType};
use crate::threads::{Disjoint, ThreadPool};

/// A weight matrix: `rows` outputs, each `cols` inputs long.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    storage: Storage,
}

/// Where a matrix's bytes live.
#[derive(Debug, Clone)]
enum Storage {
    /// Used in place: a byte range of the file map. Float types (`Grouped`: the float32
    /// kernels read them as stored) and, at int8, the types whose kernels read ggml's blocks
    /// (`Blocks`, [`reads_blocks_in_place`]).
    Mapped { offset: usize, n_bytes: usize, layout: Layout },
    /// Quantized types, repacked at load (`kernels::packed`): [rows][row bytes], codes in
    /// the grouped layout (f32 kernels) or the chunked one (int8 kernels); a byte range of
    /// the model's packed weights.
    Packed { offset: usize, n_bytes: usize, layout: Layout },
}

/// One transformer block's weights. Optional parts exist where the architecture has them
/// (see [`super::config::ArchTraits`]).
#[derive(Debug)]
pub struct LayerWeights {
    /// [d_model]
    pub attn_norm: Vec<f32>,
    /// [d_q][d_model]
    pub wq: Matrix,
    /// [d_kv][d_model]
    pub wk: Matrix,
    /// [d_kv][d_model]
    pub wv: Matrix,
    /// Biases of Q, K and V: [d_q], [d_kv], [d_kv] (Qwen2)
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// RMSNorm weights of each query head and each key head: [head_dim] each (Qwen3, Gemma 3)
    pub qk_norm: Option<[Vec<f32>; 2]>,
    /// [d_model][d_q]
    pub wo: Matrix,
    /// [d_model] norm of the attention output before its residual add (Gemma 3)
    pub post_attn_norm: Option<Vec<f32>>,
    /// [d_model]
    pub ffn_norm: Vec<f32>,
    /// [ffn_dim][d_model]
    pub w_gate: Matrix,
    /// [ffn_dim][d_model]
    pub w_up: Matrix,
    /// [d_model][ffn_dim]
    pub w_down: Matrix,
    /// [d_model] norm of the feed-forward output before its residual add (Gemma 3)
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// All weights of a model.
#[derive(Debug)]
pub struct TransformerWeights {
    map: Arc<Mmap>,
    /// Every packed matrix, one after another, on huge pages ([`super::huge_pages`]).
    packed: HugePageBytes,
    /// The arithmetic of quantized matmuls; decides the packed layout.
    precision: Precision,
    /// [vocab_size][d_model]
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    /// [d_model]
    pub output_norm: Vec<f32>,
    /// [vocab_size][d_model]; `token_embd` itself when the output matrix is tied.
    pub output: Matrix,
    /// [head_dim / 2] RoPE frequency divisors (`rope_freqs.weight`: Llama 3's scaling)
    pub rope_freq_factors: Option<Vec<f32>>,
}

impl TransformerWeights {
    /// The weights for the default `Precision::Float32`.
    pub fn from_gguf(file: &GgufFile, cfg: &ModelConfig) -> Result<TransformerWeights> {
        TransformerWeights::from_gguf_with(file, cfg, Precision::Float32)
    }

    /// The weights, quantized matrices packed for `precision`'s kernels (on the calling
    /// thread).
    pub fn from_gguf_with(file: &GgufFile, cfg: &ModelConfig, precision: Precision) -> Result<TransformerWeights> {
        TransformerWeights::load(file, cfg, precision, &ThreadPool::new(1)?)
    }

    /// The weights, quantized matrices packed for `precision`'s kernels on `pool`'s threads.
    /// The packed bytes are the same for any number of threads.
    pub fn load(file: &GgufFile, cfg: &ModelConfig, precision: Precision, pool: &ThreadPool) -> Result<TransformerWeights> {
        let layout = match precision {
            Precision::Float32 => Layout::Grouped,
            Precision::Int8 => Layout::Chunked,
        };
        let loader = Loader { file, packed_len: Cell::new(0), jobs: RefCell::new(Vec::new()), layout };
        let (d, dq, dkv, ff, vocab) = (cfg.d_model, cfg.d_q(), cfg.d_kv(), cfg.ffn_dim, cfg.vocab_size);
        let traits = &cfg.traits;
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                let b = |s: &str| format!("blk.{i}.{s}.bias");
                // Q, K and V: separate, or one fused matrix (Phi-3).
                let [wq, wk, wv] = match file.usable_tensor(&n("attn_qkv"))? {
                    Some(_) => loader.split_matrix(&n("attn_qkv"), d, [dq, dkv, dkv])?,
                    None => [loader.matrix(&n("attn_q"), dq, d)?, loader.matrix(&n("attn_k"), dkv, d)?, loader.matrix(&n("attn_v"), dkv, d)?],
                };
                // Gate and up: separate, or one fused matrix, gate first (Phi-3).
                let [w_gate, w_up] = match file.usable_tensor(&n("ffn_gate"))? {
                    Some(_) => [loader.matrix(&n("ffn_gate"), ff, d)?, loader.matrix(&n("ffn_up"), ff, d)?],
                    None => loader.split_matrix(&n("ffn_up"), d, [ff, ff])?,
                };
                let has_bias = traits.qkv_bias || file.usable_tensor(&b("attn_q"))?.is_some();
                Ok(LayerWeights {
                    attn_norm: loader.vector(&n("attn_norm"), d)?,
                    wq,
                    wk,
                    wv,
                    qkv_bias: match has_bias {
                        true => Some([loader.vector(&b("attn_q"), dq)?, loader.vector(&b("attn_k"), dkv)?, loader.vector(&b("attn_v"), dkv)?]),
                        false => None,
                    },
                    qk_norm: match traits.qk_norm {
                        true => Some([loader.vector(&n("attn_q_norm"), cfg.head_dim)?, loader.vector(&n("attn_k_norm"), cfg.head_dim)?]),
                        false => None,
                    },
                    wo: loader.matrix(&n("attn_output"), d, dq)?,
                    post_attn_norm: traits.post_norms.then(|| loader.vector(&n("post_attention_norm"), d)).transpose()?,
                    ffn_norm: loader.vector(&n("ffn_norm"), d)?,
                    w_gate,
                    w_up,
                    w_down: loader.matrix(&n("ffn_down"), d, ff)?,
                    post_ffn_norm: traits.post_norms.then(|| loader.vector(&n("post_ffw_norm"), d)).transpose()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let token_embd = loader.matrix("token_embd.weight", vocab, d)?;
        let output = match file.usable_tensor("output.weight")? {
            Some(_) => loader.matrix("output.weight", vocab, d)?,
            None => token_embd.clone(),
        };
        let rope_freq_factors = match file.usable_tensor("rope_freqs.weight")? {
            Some(_) => Some(loader.vector("rope_freqs.weight", cfg.head_dim / 2)?),
            None => None,
        };
        if let Some(f) = &rope_freq_factors {
            if f.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
                return Err(Error::Model("rope_freqs.weight holds a value that is not a positive number".into()));
            }
        }
        let output_norm = loader.vector("output_norm.weight", d)?;
        let packed = loader.pack(pool, packed_bytes(file, layout))?;
        Ok(TransformerWeights {
            map: Arc::clone(file.map()),
            packed,
            precision,
            token_embd,
            layers,
            output_norm,
            output,
            rope_freq_factors,
        })
    }

    /// The matrix as the kernels see it.
    pub fn mat<'a>(&'a self, m: &'a Matrix) -> MatRef<'a> {
        let (data, layout) = match m.storage {
            Storage::Mapped { offset, n_bytes, layout } => (&self.map[offset..offset + n_bytes], layout),
            Storage::Packed { offset, n_bytes, layout } => (&self.packed[offset..offset + n_bytes], layout),
        };
        MatRef { ty: m.ty, rows: m.rows, cols: m.cols, layout, data }
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Bytes of weights one decoded token reads, as held (packed or mapped): every layer's
    /// matrices and vectors, the output matrix and norm, and one row of the embedding (the
    /// floor of a decode step's memory traffic).
    pub fn bytes_read_per_token(&self) -> usize {
        let vec_bytes = |v: &[f32]| std::mem::size_of_val(v);
        let opt = |v: &Option<Vec<f32>>| v.as_deref().map_or(0, vec_bytes);
        let mut n = self.mat(&self.output).data.len() + vec_bytes(&self.output_norm);
        n += self.mat(&self.token_embd).data.len() / self.token_embd.rows.max(1);
        for l in &self.layers {
            n += [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down].iter().map(|m| self.mat(m).data.len()).sum::<usize>();
            n += vec_bytes(&l.attn_norm) + vec_bytes(&l.ffn_norm) + opt(&l.post_attn_norm) + opt(&l.post_ffn_norm);
            n += l.qkv_bias.as_ref().map_or(0, |b| b.iter().map(|v| vec_bytes(v)).sum());
            n += l.qk_norm.as_ref().map_or(0, |b| b.iter().map(|v| vec_bytes(v)).sum());
        }
        n
    }

    /// Whether the int8 kernels run this matrix (quantized, packed in the chunked layout or
    /// read in ggml's blocks).
    pub fn is_int8(&self, m: &Matrix) -> bool {
        matches!(self.mat(m).layout, Layout::Chunked | Layout::Blocks)
    }

    /// Row `r` of a matrix dequantized into `out` (embedding lookup), with the values of
    /// ggml's dequantization.
    pub fn dequantize_matrix_row(&self, m: &Matrix, r: usize, out: &mut [f32]) {
        let mat = self.mat(m);
        match m.storage {
            Storage::Mapped { .. } => dequantize_row(m.ty, &mat.data[r * m.ty.row_bytes(m.cols)..(r + 1) * m.ty.row_bytes(m.cols)], out),
            Storage::Packed { layout, .. } => {
                let rb = layout_row_bytes(m.ty, layout, m.cols);
                dequantize_packed_row_in(m.ty, layout, &mat.data[r * rb..(r + 1) * rb], out)
            }
        }
    }
}

/// Reads tensors from the file into [`Matrix`] and vector form. Quantized matrices are
/// planned first (each gets its place in the packed memory) and packed together at the end
/// ([`Loader::pack`]), in parallel.
struct Loader<'a> {
    file: &'a GgufFile,
    /// Bytes of the packed memory the planned matrices take.
    packed_len: Cell<usize>,
    /// The quantized tensors to pack, in the order they were planned.
    jobs: RefCell<Vec<PackJob>>,
    /// How quantized matrices are packed (decided by the precision).
    layout: Layout,
}

/// One quantized tensor to pack: all its rows, from its bytes in the file to its place in the
/// packed memory.
struct PackJob {
    ty: GgmlType,
    layout: Layout,
    /// Values per row.
    cols: usize,
    /// Bytes of one row in the file, and packed.
    row_bytes: usize,
    packed_row: usize,
    /// The tensor's bytes in the file: [rows][row_bytes].
    file: Range<usize>,
    /// Offset of its packed rows in the packed memory: [rows][packed_row].
    packed_offset: usize,
}

impl Loader<'_> {
    /// The `[rows][cols]` matrix `name`.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let [m] = self.split_matrix(name, cols, [rows])?;
        Ok(m)
    }

    /// The matrix `name` of `cols` columns cut into consecutive row blocks of the given
    /// sizes (a fused matrix taken apart: each output row is an independent dot product, so
    /// the parts compute exactly what the whole would).
    fn split_matrix<const N: usize>(&self, name: &str, cols: usize, rows: [usize; N]) -> Result<[Matrix; N]> {
        let info = tensor(self.file, name)?;
        check_shape(info, &[cols, rows.iter().sum()])?;
        if !cols.is_multiple_of(GROUP) {
            return Err(Error::Unsupported(format!(
                "tensor '{name}' rows of {cols} values (must be a multiple of {GROUP})"
            )));
        }
        let ty = info.ggml_type;
        let row_bytes = ty.row_bytes(cols);
        let layout = matrix_layout(ty, self.layout);
        // The whole tensor's packed rows, one after another: part k is a run of them.
        let packed = (is_packed(ty) && layout != Layout::Blocks).then(|| self.plan_packing(info, layout, cols));
        let mut first = 0;
        let mut parts = Vec::with_capacity(N);
        for n in rows {
            let storage = match packed {
                Some((offset, packed_row)) => Storage::Packed { offset: offset + first * packed_row, n_bytes: n * packed_row, layout },
                None => Storage::Mapped { offset: info.offset + first * row_bytes, n_bytes: n * row_bytes, layout },
            };
            first += n;
            parts.push(Matrix { name: name.into(), ty, rows: n, cols, storage });
        }
        Ok(parts.try_into().expect("one part per row count"))
    }

    /// Reserves the place of the tensor `info` (rows of `cols` values) packed in `layout` in
    /// the packed memory, to be packed by [`Loader::pack`]. Returns (offset, bytes
    /// of one packed row).
    fn plan_packing(&self, info: &TensorInfo, layout: Layout, cols: usize) -> (usize, usize) {
        let (ty, row_bytes) = (info.ggml_type, info.ggml_type.row_bytes(cols));
        let packed_row = layout_row_bytes(ty, layout, cols);
        let offset = self.packed_len.get();
        self.packed_len.set(offset + info.n_bytes / row_bytes * packed_row);
        let file = info.offset..info.offset + info.n_bytes;
        self.jobs.borrow_mut().push(PackJob { ty, layout, cols, row_bytes, packed_row, file, packed_offset: offset });
        (offset, packed_row)
    }

    /// Packs every planned tensor into `capacity` bytes of huge-page memory, in parallel on
    /// `pool`'s threads over runs of about 1 MiB of rows ([`rows_per_segment`]). Each run is
    /// packed while it is in the cache, then its file pages are released: loading holds a few
    /// runs of the file (one per thread) beside the packed matrices, not a whole tensor (Gemma
    /// 3's embedding is 178 MB), and reads each byte of a quantized tensor once.
    fn pack(self, pool: &ThreadPool, capacity: usize) -> Result<HugePageBytes> {
        let (file, jobs) = (self.file, self.jobs.into_inner());
        if self.packed_len.get() > capacity {
            return Err(Error::Internal("the packed matrices do not fit the packed weights sized from the tensor list".into()));
        }
        let mut memory = HugePageBytes::zeroed(capacity)?;
        // (job, first row, rows) of every run.
        let runs: Vec<(usize, usize, usize)> = jobs
            .iter()
            .enumerate()
            .flat_map(|(j, job)| {
                let (step, rows) = (rows_per_segment(job.row_bytes), job.file.len() / job.row_bytes);
                (0..rows).step_by(step).map(move |r| (j, r, step.min(rows - r)))
            })
            .collect();
        {
            let map = &file.map()[..];
            let packed = Disjoint::new(&mut memory[..]);
            pool.install(|| {
                pool.run(runs.len(), |i| {
                    let (j, first_row, n_rows) = runs[i];
                    let job = &jobs[j];
                    let from = job.file.start + first_row * job.row_bytes;
                    let src = &map[from..from + n_rows * job.row_bytes];
                    let start = job.packed_offset + first_row * job.packed_row;
                    // SAFETY: the jobs' packed ranges are disjoint (planned one after another)
                    // and so are the runs of one job: no two runs write the same bytes.
                    let dst = unsafe { packed.slice(start..start + n_rows * job.packed_row) };
                    pack_rows_in(job.ty, job.layout, job.cols, src, dst);
                    file.release_bytes(from, src.len());
                })
            })?;
        }
        for job in &jobs {
            // The pages that straddle two runs, which a run's release leaves.
            file.release_bytes(job.file.start, job.file.len());
        }
        Ok(memory)
    }

    /// The vector `name` of `len` values, dequantized to f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let info = tensor(self.file, name)?;
        check_shape(info, &[len])?;
        let mut v = vec![0.0; len];
        dequantize_row(info.ggml_type, self.file.tensor_bytes(info), &mut v);
        Ok(v)
    }
}

/// Bytes of every quantized tensor of the file packed in `layout` (the int8-packable types;
/// the others grouped): room for all the packed matrices a model loads (one pass over the
/// tensor list; untouched room costs no memory).
fn packed_bytes(file: &GgufFile, layout: Layout) -> usize {
    let packed = file.tensors().iter().filter(|t| is_packed(t.ggml_type) && !t.dims.is_empty());
    packed
        .map(|t| {
            let cols = t.dims[0] as usize;
            let rows: usize = t.dims[1..].iter().map(|&d| d as usize).product();
            match matrix_layout(t.ggml_type, layout) {
                Layout::Blocks => 0,
                layout => rows * layout_row_bytes(t.ggml_type, layout, cols),
            }
        })
        .sum()
}

/// The layout of a matrix of type `ty` for the precision's layout `precision_layout`: types the
/// int8 kernels cannot read run the float32 kernels in either precision (grouped), and those
/// they read in ggml's blocks are not packed at all (used from the file map).
fn matrix_layout(ty: GgmlType, precision_layout: Layout) -> Layout {
    match precision_layout {
        Layout::Chunked if reads_blocks_in_place(ty) => Layout::Blocks,
        Layout::Chunked if is_int8_packable(ty) => Layout::Chunked,
        _ => Layout::Grouped,
    }
}

fn tensor<'a>(file: &'a GgufFile, name: &str) -> Result<&'a TensorInfo> {
    file.usable_tensor(name)?.ok_or_else(|| Error::Model(format!("missing tensor '{name}'")))
}

fn check_shape(info: &TensorInfo, expected: &[usize]) -> Result<()> {
    let dims: Vec<usize> = info.dims.iter().map(|&x| x as usize).collect();
    if dims != expected {
        return Err(Error::Model(format!(
            "tensor '{}' has shape {:?}, expected {:?}",
            info.name, info.dims, expected
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrices(w: &TransformerWeights) -> Vec<&Matrix> {
        let mut out = vec![&w.token_embd, &w.output];
        for l in &w.layers {
            out.extend([&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        }
        out
    }

    /// Loading on any number of threads packs every matrix into the bytes one call of its
    /// packer over the whole tensor gives; a matrix read in place is the file's bytes.
    #[test]
    fn parallel_packing_gives_the_sequential_bytes() {
        for name in ["tiny.Q4_K_M.gguf", "tiny.Q6_K.gguf", "tiny.Q8_0.gguf", "tiny.Q4_0.gguf"] {
            let path = format!("{}/tests/data/synthetic/{name}", env!("CARGO_MANIFEST_DIR"));
            let file = GgufFile::open(&path).unwrap();
            let cfg = ModelConfig::from_gguf(&file).unwrap();
            for precision in [Precision::Float32, Precision::Int8] {
                let mut packed_by_one_thread: Option<Vec<u8>> = None;
                for threads in [1, 2, 3] {
                    let w = TransformerWeights::load(&file, &cfg, precision, &ThreadPool::new(threads).unwrap()).unwrap();
                    let (mut n_packed, mut n_in_place) = (0, 0);
                    for m in matrices(&w) {
                        let info = file.tensor(&m.name).unwrap();
                        assert_eq!(m.rows * m.ty.row_bytes(m.cols), info.n_bytes, "{} is a whole tensor", m.name);
                        let layout = match m.storage {
                            Storage::Packed { layout, .. } => layout,
                            Storage::Mapped { layout: Layout::Blocks, .. } => {
                                assert!(precision == Precision::Int8 && reads_blocks_in_place(m.ty), "{name}: {}", m.name);
                                assert!(w.mat(m).data == file.tensor_bytes(info), "{name}: {} is the file's bytes", m.name);
                                n_in_place += 1;
                                continue;
                            }
                            Storage::Mapped { .. } => continue,
                        };
                        let mut sequential = vec![0u8; m.rows * layout_row_bytes(m.ty, layout, m.cols)];
                        pack_rows_in(m.ty, layout, m.cols, file.tensor_bytes(info), &mut sequential);
                        assert!(w.mat(m).data == &sequential[..], "{name} {precision:?} {threads} threads: {}", m.name);
                        n_packed += 1;
                    }
                    assert!(n_packed + n_in_place > 0, "{name} {precision:?}: no matrix packed or read in place");
                    match &packed_by_one_thread {
                        None => packed_by_one_thread = Some(w.packed.to_vec()),
                        Some(one) => assert!(one[..] == w.packed[..], "{name} {precision:?}: {threads} threads"),
                    }
                }
            }
        }
    }
}
