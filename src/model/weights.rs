//! The model's tensors as typed views into the memory-mapped GGUF file.

use std::sync::Arc;

use memmap2::Mmap;

use super::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels::packed::{chunk_rows, dequantize_packed_row_in, is_int8_packable, is_packed, pack_rows, Layout};
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
    /// the grouped layout (f32 kernels) or the chunked one (int8 kernels).
    Packed(Arc<[u8]>, Layout),
}

/// One transformer block's weights.
#[derive(Debug)]
pub struct LayerWeights {
    /// [d_model]
    pub attn_norm: Vec<f32>,
    /// [d_model][d_model]
    pub wq: Matrix,
    /// [d_kv][d_model]
    pub wk: Matrix,
    /// [d_kv][d_model]
    pub wv: Matrix,
    /// [d_model][d_model]
    pub wo: Matrix,
    /// [d_model]
    pub ffn_norm: Vec<f32>,
    /// [ffn_dim][d_model]
    pub w_gate: Matrix,
    /// [ffn_dim][d_model]
    pub w_up: Matrix,
    /// [d_model][ffn_dim]
    pub w_down: Matrix,
}

/// All weights of a Llama model.
#[derive(Debug)]
pub struct LlamaWeights {
    map: Arc<Mmap>,
    /// The arithmetic of quantized matmuls; decides the packed layout.
    precision: Precision,
    /// [vocab_size][d_model]
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    /// [d_model]
    pub output_norm: Vec<f32>,
    /// [vocab_size][d_model]; `token_embd` itself when the output matrix is tied.
    pub output: Matrix,
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
        let (d, dkv, ff, vocab) = (cfg.d_model, cfg.d_kv(), cfg.ffn_dim, cfg.vocab_size);
        let matrix = |name: &str, rows: usize, cols: usize| -> Result<Matrix> {
            let info = tensor(file, name)?;
            check_shape(info, &[cols, rows])?;
            if !cols.is_multiple_of(GROUP) {
                return Err(Error::Unsupported(format!(
                    "tensor '{name}' rows of {cols} values (must be a multiple of {GROUP})"
                )));
            }
            let storage = if is_packed(info.ggml_type) {
                let bytes = file.tensor_bytes(info);
                let mut packed = pack_rows(info.ggml_type, cols, bytes);
                // Types the int8 kernels cannot read run the float32 kernels in either
                // precision (kept in the grouped layout).
                let layout = if is_int8_packable(info.ggml_type) { layout } else { Layout::Grouped };
                if layout == Layout::Chunked {
                    chunk_rows(info.ggml_type, cols, &mut packed);
                }
                // The file's pages are no longer needed: let the kernel reclaim them.
                file.release(info);
                Storage::Packed(packed.into(), layout)
            } else {
                Storage::Mapped { offset: info.offset, n_bytes: info.n_bytes }
            };
            Ok(Matrix { name: name.into(), ty: info.ggml_type, rows, cols, storage })
        };
        let vector = |name: &str| -> Result<Vec<f32>> {
            let info = tensor(file, name)?;
            check_shape(info, &[d])?;
            let mut v = vec![0.0; d];
            dequantize_row(info.ggml_type, file.tensor_bytes(info), &mut v);
            Ok(v)
        };
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                Ok(LayerWeights {
                    attn_norm: vector(&n("attn_norm"))?,
                    wq: matrix(&n("attn_q"), d, d)?,
                    wk: matrix(&n("attn_k"), dkv, d)?,
                    wv: matrix(&n("attn_v"), dkv, d)?,
                    wo: matrix(&n("attn_output"), d, d)?,
                    ffn_norm: vector(&n("ffn_norm"))?,
                    w_gate: matrix(&n("ffn_gate"), ff, d)?,
                    w_up: matrix(&n("ffn_up"), ff, d)?,
                    w_down: matrix(&n("ffn_down"), d, ff)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let token_embd = matrix("token_embd.weight", vocab, d)?;
        let output = match file.usable_tensor("output.weight")? {
            Some(_) => matrix("output.weight", vocab, d)?,
            None => token_embd.clone(),
        };
        Ok(LlamaWeights {
            map: Arc::clone(file.map()),
            precision,
            token_embd,
            layers,
            output_norm: vector("output_norm.weight")?,
            output,
        })
    }

    /// The matrix as the kernels see it.
    pub fn mat<'a>(&'a self, m: &'a Matrix) -> MatRef<'a> {
        let data = match &m.storage {
            Storage::Mapped { offset, n_bytes } => &self.map[*offset..*offset + *n_bytes],
            Storage::Packed(bytes, _) => bytes,
        };
        MatRef { ty: m.ty, rows: m.rows, cols: m.cols, data }
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether the int8 kernels run this matrix (quantized, packed in the chunked layout).
    pub fn is_int8(&self, m: &Matrix) -> bool {
        matches!(m.storage, Storage::Packed(_, Layout::Chunked))
    }

    /// Row `r` of a matrix dequantized into `out` (embedding lookup), with the values of
    /// ggml's dequantization.
    pub fn dequantize_matrix_row(&self, m: &Matrix, r: usize, out: &mut [f32]) {
        let mat = self.mat(m);
        let row = &mat.data[r * mat.row_bytes()..(r + 1) * mat.row_bytes()];
        match m.storage {
            Storage::Mapped { .. } => dequantize_row(m.ty, row, out),
            Storage::Packed(_, layout) => dequantize_packed_row_in(m.ty, layout, row, out),
        }
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
