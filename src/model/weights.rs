//! The model's tensors as typed views into the memory-mapped GGUF file.

use std::sync::Arc;

use memmap2::Mmap;

use super::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels::packed::{dequantize_packed_row, is_packed, pack_rows};
use crate::kernels::{MatRef, GROUP};
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
    /// Quantized types, repacked at load (`kernels::packed`): [rows][row bytes].
    Packed(Arc<[u8]>),
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
    /// [vocab_size][d_model]
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    /// [d_model]
    pub output_norm: Vec<f32>,
    /// [vocab_size][d_model]; `token_embd` itself when the output matrix is tied.
    pub output: Matrix,
}

impl LlamaWeights {
    pub fn from_gguf(file: &GgufFile, cfg: &ModelConfig) -> Result<LlamaWeights> {
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
                let packed = pack_rows(info.ggml_type, cols, bytes);
                // The file's pages are no longer needed: let the kernel reclaim them.
                file.release(info);
                Storage::Packed(packed.into())
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
            Storage::Packed(bytes) => bytes,
        };
        MatRef { ty: m.ty, rows: m.rows, cols: m.cols, data }
    }

    /// Row `r` of a matrix dequantized into `out` (embedding lookup), with the values of
    /// ggml's dequantization.
    pub fn dequantize_matrix_row(&self, m: &Matrix, r: usize, out: &mut [f32]) {
        let mat = self.mat(m);
        let row = &mat.data[r * mat.row_bytes()..(r + 1) * mat.row_bytes()];
        match m.storage {
            Storage::Mapped { .. } => dequantize_row(m.ty, row, out),
            Storage::Packed(_) => dequantize_packed_row(m.ty, row, out),
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
