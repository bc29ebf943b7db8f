//! The fuzz targets' bodies (shared with the corpus replay in `tests/fuzz_corpora.rs`) and a
//! counting allocator that lets a target check its allocations against a bound.

pub mod alloc;
pub mod targets;
