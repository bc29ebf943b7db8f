//! GGUF files: a bounded reader over a memory map and a writer (for quantized output).
//!
//! Layout (versions 2 and 3, little endian): magic `GGUF`, u32 version, u64 tensor count,
//! u64 metadata count, the metadata key/value pairs, the tensor infos (name, n_dims, dims
//! with the contiguous axis first, ggml type, offset relative to the data section), padding to
//! `general.alignment` (default 32), then the data section.

pub mod fingerprint;
mod reader;
mod value;
mod writer;

pub use reader::{ForeignTensor, GgufFile, TensorInfo};
pub use value::{MetadataValue, ValueType};
pub use writer::{GgufWriter, TensorSpec};
