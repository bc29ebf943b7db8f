#![no_main]
use reprolm_fuzz::{alloc::Counting, targets};

#[global_allocator]
static ALLOC: Counting = Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::grammar(data));
