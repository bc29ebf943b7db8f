//! reprolm: bitwise-reproducible CPU inference for Llama-family GGUF models.
//!
//! Data flow: [`gguf::GgufFile`] (bounded parse over a memory map) -> [`model::ModelConfig`]
//! and [`model::TransformerWeights`] (typed views of the file) -> [`model::Transformer::forward`] over a
//! [`model::KvCache`] -> logits. The kernels in [`kernels`] compute every output with one
//! fixed op sequence, so results do not depend on thread count, batch size or ISA.

// An `unsafe fn` states its precondition; its body is checked like any other, each unsafe
// operation in a block that says why the precondition makes it sound.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod atomic_file;
pub mod batch;
pub mod count;
pub mod chat;
pub mod decode;
pub mod loaded_model;
pub mod error;
pub mod gguf;
pub mod grammar;
pub mod kernels;
pub mod model;
pub mod quantize;
pub mod sampling;
pub mod state;
pub mod tensor;
pub mod threads;
pub mod tokenizer;
pub mod xxh64;

pub use error::{Error, Result};

#[cfg(feature = "python")]
mod python;
