//! The model's tensors as typed views into the memory-mapped GGUF file.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use memmap2::Mmap;

use super::config::ModelConfig;
use super::huge_pages::HugePageBytes;
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels::packed::{dequantize_packed_row_in, is_int8_packable, is_packed, layout_row_bytes, pack_rows_in, Layout};
use crate::kernels::{MatRef, Precision, GROUP};
use crate::tensor::{dequantize_row, GgmlType};

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
    /// Float types, used in place: a byte range of the file map.
    Mapped { offset: usize, n_bytes: usize },
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
pub struct LlamaWeights {
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

impl LlamaWeights {
    /// The weights for the default `Precision::Float32`.
    pub fn from_gguf(file: &GgufFile, cfg: &ModelConfig) -> Result<LlamaWeights> {
        LlamaWeights::from_gguf_with(file, cfg, Precision::Float32)
    }

    /// The weights, quantized matrices packed for `precision`'s kernels.
    pub fn from_gguf_with(file: &GgufFile, cfg: &ModelConfig, precision: Precision) -> Result<LlamaWeights> {
        let layout = match precision {
            Precision::Float32 => Layout::Grouped,
            Precision::Int8 => Layout::Chunked,
        };
        let loader = Loader { file, packed: RefCell::new((HugePageBytes::zeroed(packed_bytes(file, layout))?, 0)), layout };
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
        Ok(LlamaWeights {
            map: Arc::clone(file.map()),
            packed: loader.packed.into_inner().0,
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
        let data = match &m.storage {
            Storage::Mapped { offset, n_bytes } => &self.map[*offset..*offset + *n_bytes],
            Storage::Packed { offset, n_bytes, .. } => &self.packed[*offset..*offset + *n_bytes],
        };
        MatRef { ty: m.ty, rows: m.rows, cols: m.cols, data }
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether the int8 kernels run this matrix (quantized, packed in the chunked layout).
    pub fn is_int8(&self, m: &Matrix) -> bool {
        matches!(m.storage, Storage::Packed { layout: Layout::Chunked, .. })
    }

    /// Row `r` of a matrix dequantized into `out` (embedding lookup), with the values of
    /// ggml's dequantization.
    pub fn dequantize_matrix_row(&self, m: &Matrix, r: usize, out: &mut [f32]) {
        let mat = self.mat(m);
        match m.storage {
            Storage::Mapped { .. } => dequantize_row(m.ty, &mat.data[r * mat.row_bytes()..(r + 1) * mat.row_bytes()], out),
            Storage::Packed { layout, .. } => {
                let rb = layout_row_bytes(m.ty, layout, m.cols);
                dequantize_packed_row_in(m.ty, layout, &mat.data[r * rb..(r + 1) * rb], out)
            }
        }
    }
}

/// Reads tensors from the file into [`Matrix`] and vector form.
struct Loader<'a> {
    file: &'a GgufFile,
    /// The packed matrices' memory and how many of its bytes are used.
    packed: RefCell<(HugePageBytes, usize)>,
    /// How quantized matrices are packed (decided by the precision).
    layout: Layout,
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
        let row_bytes = info.ggml_type.row_bytes(cols);
        let mut first = 0;
        let mut parts = Vec::with_capacity(N);
        for n in rows {
            let bytes = first * row_bytes..(first + n) * row_bytes;
            first += n;
            let storage = if is_packed(info.ggml_type) {
                // Types the int8 kernels cannot read run the float32 kernels in either
                // precision (kept in the grouped layout).
                let layout = if is_int8_packable(info.ggml_type) { self.layout } else { Layout::Grouped };
                let (offset, n_bytes) = self.pack(info, layout, cols, bytes)?;
                Storage::Packed { offset, n_bytes, layout }
            } else {
                Storage::Mapped { offset: info.offset + bytes.start, n_bytes: bytes.len() }
            };
            parts.push(Matrix { name: name.into(), ty: info.ggml_type, rows: n, cols, storage });
        }
        if is_packed(info.ggml_type) {
            // The file's pages are no longer needed: let the kernel reclaim them (`pack` gave
            // back each block's whole pages already; this also takes the pages that straddle
            // two blocks).
            self.file.release(info);
        }
        Ok(parts.try_into().expect("one part per row count"))
    }

    /// The rows in `bytes` (of the tensor `info`, rows of `cols` values) packed in `layout`
    /// into the next bytes of `self.packed`, block by block, each block's file pages released
    /// once packed: loading holds one block of the file beside the packed matrices, not a
    /// whole tensor (Gemma 3's embedding is 178 MB). Returns (offset, bytes) of the matrix.
    fn pack(&self, info: &TensorInfo, layout: Layout, cols: usize, bytes: Range<usize>) -> Result<(usize, usize)> {
        const BLOCK_BYTES: usize = 4 << 20;
        let (ty, row_bytes) = (info.ggml_type, info.ggml_type.row_bytes(cols));
        let block_rows = (BLOCK_BYTES / row_bytes).max(1);
        let src = &self.file.tensor_bytes(info)[bytes.clone()];
        let packed_row = layout_row_bytes(ty, layout, cols);
        let n_bytes = src.len() / row_bytes * packed_row;
        let (ref mut memory, ref mut used) = *self.packed.borrow_mut();
        let offset = *used;
        let packed = memory.get_mut(offset..offset + n_bytes).ok_or_else(|| {
            Error::Internal(format!("tensor '{}' does not fit the packed weights sized from the tensor list", info.name))
        })?;
        *used += n_bytes;
        let dst_blocks = packed.chunks_mut(block_rows * packed_row);
        for (i, (src, dst)) in src.chunks(block_rows * row_bytes).zip(dst_blocks).enumerate() {
            pack_rows_in(ty, layout, cols, src, dst);
            self.file.release_bytes(info.offset + bytes.start + i * block_rows * row_bytes, src.len());
        }
        Ok((offset, n_bytes))
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
            let layout = if is_int8_packable(t.ggml_type) { layout } else { Layout::Grouped };
            rows * layout_row_bytes(t.ggml_type, layout, cols)
        })
        .sum()
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
