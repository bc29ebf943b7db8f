//! The integration tests, as one test binary (one link instead of one per file; each file is
//! a module). `tests/op_counts.rs` is apart: it needs the `count-ops` feature.

mod common;
mod toy;

mod architectures;
mod batch;
mod chat_templates;
mod decode;
mod forward_int8;
mod forward_reference;
mod fuzz_corpora;
mod fuzz_regressions;
mod gemma3;
mod gemma_tensors;
mod grammar;
mod kernels;
mod kernels_int8;
mod kernels_kquant_int8;
mod kernels_q5_int8;
mod kv_growth;
mod prefix_cache;
mod quantize;
mod sampler;
mod speculative;
mod speculative_exact;
mod stream;
mod theory;
mod tokenizer;
mod vocab;
