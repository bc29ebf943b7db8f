//! Llama-family models: configuration, weights, KV cache and the forward pass.

pub mod config;
mod huge_pages;
pub mod kv_cache;
pub mod kv_memory;
pub mod transformer;
mod rowwise;
pub mod weights;

pub use config::ModelConfig;
pub use kv_cache::{KvCache, KvCacheOptions, KvDtype, Overflow};
pub use kv_memory::KvMemory;
pub use transformer::{Transformer, LogitRows, Scratch, SeqInput};
pub use weights::TransformerWeights;
