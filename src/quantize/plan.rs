//! Which type each tensor is written in, and the output's metadata.

use super::options::QuantizeOptions;
use crate::gguf::{GgufFile, MetadataValue, TensorInfo};
use crate::tensor::GgmlType;

/// The embedding and output matrices, whose type is chosen separately.
const OUTPUT_MATRICES: [&str; 2] = ["token_embd.weight", "output.weight"];

/// ggml's quantization format version written by current llama.cpp (`general.quantization_version`).
const QUANTIZATION_VERSION: u32 = 2;

/// `wanted` if the tensor's rows split into its blocks, else F32 (lossless for any row length).
fn fit(info: &TensorInfo, wanted: GgmlType) -> GgmlType {
    if info.dims[0].is_multiple_of(wanted.block_size() as u64) {
        wanted
    } else {
        GgmlType::F32
    }
}

/// Vectors (norm weights) stay F32; the embedding/output matrix gets `output_type`; every other
/// tensor of two or more dimensions gets `weight_type`.
pub fn quantize_plan(file: &GgufFile, options: &QuantizeOptions) -> Vec<GgmlType> {
    file.tensors()
        .iter()
        .map(|info| {
            if info.dims.len() < 2 {
                GgmlType::F32
            } else if OUTPUT_MATRICES.contains(&info.name.as_str()) {
                fit(info, options.output_type)
            } else {
                fit(info, options.weight_type)
            }
        })
        .collect()
}

/// Every tensor dequantized: matrices to `to` (F32 or F16), vectors to F32.
pub fn convert_plan(file: &GgufFile, to: GgmlType) -> Vec<GgmlType> {
    file.tensors().iter().map(|info| if info.dims.len() < 2 { GgmlType::F32 } else { to }).collect()
}

/// llama.cpp's `llama_ftype` for a file whose matrices are mostly `ty`.
/// (Only the types quantize and convert write have one.)
pub fn file_type(ty: GgmlType) -> u32 {
    ty.spec().file_type.unwrap_or_else(|| unreachable!("{} is not an output type of quantize", ty.name()))
}

/// The source metadata in order, with `general.file_type` set to `file_type` (in place, or
/// appended) and, if any tensor is block-quantized, `general.quantization_version` present.
pub fn output_metadata(file: &GgufFile, file_type: u32, quantized: bool) -> Vec<(String, MetadataValue)> {
    let mut metadata = file.metadata().to_vec();
    let mut set = |key: &str, value: MetadataValue, replace: bool| match metadata.iter_mut().find(|(k, _)| k == key) {
        Some((_, v)) if replace => *v = value,
        Some(_) => {}
        None => metadata.push((key.to_string(), value)),
    };
    set("general.file_type", MetadataValue::U32(file_type), true);
    if quantized {
        set("general.quantization_version", MetadataValue::U32(QUANTIZATION_VERSION), false);
    }
    metadata
}
