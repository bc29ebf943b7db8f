//! Quantizing and dequantizing whole GGUF models (docs/theory.md, "Uniform quantization").
//!
//! [`quantize_file`] reads a GGUF and writes one whose matrices are Q4_0, Q4_1 or Q8_0, by
//! ggml's reference rules ([`minmax`], bit-exact with `llama-quantize` without an importance
//! matrix) or, for Q4_1, by the b-bit uniform quantizer on [-a, a] ([`uniform`]).
//! Vectors (norm weights) stay F32 and the embedding/output matrix type is chosen separately.
//! Metadata is copied in order, with `general.file_type` updated. The [`report`] holds, per
//! quantized tensor, the error against the uniform quantizer's bounds and, given a text, the
//! mean KL divergence of next-token distributions between the source and the quantized model
//! ([`kl`]).
//!
//! [`convert_file`] writes the dequantized model as F32 or F16.
//!
//! Every tensor is read through [`crate::tensor::dequantize_row`] (so any readable type is a
//! valid source) and written row by row; rows are independent, so they are encoded in parallel
//! and the statistics merged in row order, which keeps both the file and the report
//! deterministic.

mod encode;
pub mod kl;
pub mod minmax;
mod options;
mod plan;
pub mod report;
pub mod uniform;

use std::path::Path;

use rayon::prelude::*;

pub use encode::{encode_row, RowError};
pub use options::{parse_convert_type, QuantizeOptions, Scheme, DEFAULT_OUTPUT_TYPE};
pub use report::{ErrorStats, KlReport, QuantizeReport, TensorReport};

use crate::error::{Error, Result};
use crate::gguf::{GgufFile, GgufWriter, TensorInfo, TensorSpec};
use crate::tensor::{dequantize_row, GgmlType};

/// Quantizes the GGUF model `src` into `dst` (see the module docs) and reports the error.
pub fn quantize_file(src: &Path, dst: &Path, options: &QuantizeOptions) -> Result<QuantizeReport> {
    let file = GgufFile::open(src)?;
    // Every tensor is rewritten: one this cannot read would be silently dropped.
    file.check_all_supported()?;
    check_distinct(src, dst)?;
    let plan = plan::quantize_plan(&file, options);
    let quantized = plan.iter().any(|t| t.is_quantized());
    let metadata = plan::output_metadata(&file, plan::file_type(options.weight_type), quantized);
    let tensors = rewrite(&file, dst, &plan, metadata, options.scheme)?;
    let kl = match &options.report_text {
        Some(text) => Some(kl::next_token_kl(src, dst, text)?),
        None => None,
    };
    Ok(QuantizeReport { tensors, kl })
}

/// Writes `src` dequantized: matrices as `to` (F32 or F16, see [`parse_convert_type`]),
/// vectors as F32, `general.file_type` updated.
pub fn convert_file(src: &Path, dst: &Path, to: GgmlType) -> Result<()> {
    if !matches!(to, GgmlType::F32 | GgmlType::F16) {
        return Err(Error::invalid_argument("to", format!("'{}' is not one of f32, f16", to.name())));
    }
    let file = GgufFile::open(src)?;
    // Every tensor is rewritten: one this cannot read would be silently dropped.
    file.check_all_supported()?;
    check_distinct(src, dst)?;
    let plan = plan::convert_plan(&file, to);
    let metadata = plan::output_metadata(&file, plan::file_type(to), false);
    rewrite(&file, dst, &plan, metadata, Scheme::MinMax).map(drop)
}

/// Refuses to write over the file being read.
fn check_distinct(src: &Path, dst: &Path) -> Result<()> {
    if let (Ok(a), Ok(b)) = (std::fs::canonicalize(src), std::fs::canonicalize(dst)) {
        if a == b {
            return Err(Error::invalid_argument("dst", format!("'{}' is the source file", dst.display())));
        }
    }
    Ok(())
}

/// Writes every tensor of `file` in its planned type; reports the block-quantized ones.
fn rewrite(
    file: &GgufFile,
    dst: &Path,
    plan: &[GgmlType],
    metadata: Vec<(String, crate::gguf::MetadataValue)>,
    scheme: Scheme,
) -> Result<Vec<TensorReport>> {
    let mut writer = GgufWriter::new(metadata)?;
    for (info, &ty) in file.tensors().iter().zip(plan) {
        writer.add_tensor(TensorSpec { name: info.name.clone(), dims: info.dims.clone(), ggml_type: ty })?;
    }
    // Rows are transcoded on a pool of this call's own rather than rayon's global one, which a
    // child forked after the parent used it would not have (its threads are the parent's).
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .map_err(|e| Error::Unsupported(format!("cannot start worker threads: {e}")))?;
    let mut reports = Vec::new();
    pool.install(|| {
        writer.write(dst, |i, buf| {
            let (info, ty) = (&file.tensors()[i], plan[i]);
            if let Some(report) = transcode(file, info, ty, scheme, buf)? {
                reports.push(report);
            }
            Ok(())
        })
    })?;
    Ok(reports)
}

/// Tensor `info` as `ty` into `buf`, with its error statistics if `ty` is block-quantized.
/// A tensor already of type `ty` is copied unchanged (unless the uniform scheme re-quantizes
/// a Q4_1 tensor).
fn transcode(file: &GgufFile, info: &TensorInfo, ty: GgmlType, scheme: Scheme, buf: &mut Vec<u8>) -> Result<Option<TensorReport>> {
    let n = info.dims[0] as usize;
    let n_rows = (info.n_elements() / info.dims[0]) as usize;
    let (src_ty, src_row_bytes, dst_row_bytes) = (info.ggml_type, info.ggml_type.row_bytes(n), ty.row_bytes(n));
    let src = file.tensor_bytes(info);
    let copy = src_ty == ty && !(ty == GgmlType::Q4_1 && matches!(scheme, Scheme::Uniform { .. }));
    if copy {
        buf.extend_from_slice(src);
    } else {
        buf.resize(n_rows * dst_row_bytes, 0);
    }
    let want_stats = ty.is_quantized();
    let rows: Vec<std::result::Result<(ErrorStats, usize), (usize, RowError)>> = buf
        .par_chunks_mut(dst_row_bytes)
        .enumerate()
        .map_init(
            || (vec![0f32; n], vec![0f32; n]),
            |(x, y), (r, out)| {
                let mut stats = ErrorStats::default();
                let mut clipped = 0;
                if !copy || want_stats {
                    dequantize_row(src_ty, &src[r * src_row_bytes..(r + 1) * src_row_bytes], x);
                }
                if !copy {
                    clipped = encode_row(ty, scheme, x, out).map_err(|e| (r, e))?;
                }
                if want_stats {
                    dequantize_row(ty, out, y);
                    stats.add_row(ty, x, out, y);
                }
                Ok((stats, clipped))
            },
        )
        .collect();
    let mut stats = ErrorStats::default();
    let mut n_clipped = 0u64;
    for row in rows {
        let (s, c) = row.map_err(|(r, e)| row_error(info, ty, r, e))?;
        stats.merge(&s);
        n_clipped += c as u64;
    }
    Ok(want_stats.then(|| TensorReport { name: info.name.clone(), ggml_type: ty, dims: info.dims.clone(), stats, n_clipped }))
}

fn row_error(info: &TensorInfo, ty: GgmlType, row: usize, e: RowError) -> Error {
    match e {
        RowError::NonFinite(col) => {
            Error::Model(format!("tensor '{}' has a non-finite value at row {row}, column {col}", info.name))
        }
        RowError::Overflow => Error::Unsupported(format!(
            "tensor '{}' row {row} has values beyond the range of {} (its scales are f16)",
            info.name,
            ty.name()
        )),
    }
}
