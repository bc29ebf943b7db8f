//! Viewing file bytes as ggml blocks.
//!
//! Every block struct is built from byte arrays only, so it has alignment 1 and a slice of
//! file bytes can be viewed as a slice of blocks without any alignment requirement.

use half::f16;

/// Values per quantization block for Q4_0, Q4_1, Q8_0 (and per kernel group).
pub const QK: usize = 32;

#[inline(always)]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// Marker for the block structs: plain bytes, alignment 1, any bit pattern valid.
pub trait Block: Copy {}

/// Views `bytes` as whole blocks. Panics if the length is not a multiple of the block size:
/// callers pass rows whose length the GGUF reader has already validated.
pub fn as_blocks<B: Block>(bytes: &[u8]) -> &[B] {
    let size = std::mem::size_of::<B>();
    assert!(bytes.len().is_multiple_of(size), "byte length {} is not whole blocks of {size}", bytes.len());
    // SAFETY: B is repr(C), built only from byte arrays (alignment 1, no padding, every bit
    // pattern valid), and the length is a whole number of blocks.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) }
}

/// Views `bytes` as whole blocks to be written (see [`as_blocks`]).
pub fn as_blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    let size = std::mem::size_of::<B>();
    assert!(bytes.len().is_multiple_of(size), "byte length {} is not whole blocks of {size}", bytes.len());
    // SAFETY: as in `as_blocks`; the exclusive borrow of the bytes becomes one of the blocks.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size) }
}
