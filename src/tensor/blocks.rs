//! Quantized block layouts, byte for byte as ggml stores them.
//!
//! Every field is a byte array, so the structs have alignment 1 and a slice of file bytes can
//! be viewed as a slice of blocks without any alignment requirement.

use half::f16;

/// Values per quantization block for Q4_0, Q4_1 and Q8_0.
pub const QK: usize = 32;

/// Q4_0: w = d * (q - 8), q in 0..16; value j < 16 is `qs[j] & 0xF`, value j + 16 is `qs[j] >> 4`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// Q4_1: w = d * q + m, q in 0..16, nibble order as Q4_0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}

/// Q8_0: w = d * q, q in -128..128.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; QK],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::align_of::<BlockQ4_0>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ4_1>() == 1);
const _: () = assert!(std::mem::align_of::<BlockQ8_0>() == 1);

#[inline(always)]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

impl BlockQ4_0 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}

impl BlockQ4_1 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
    #[inline(always)]
    pub fn m(&self) -> f32 {
        f16_le(self.m)
    }
}

impl BlockQ8_0 {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f16_le(self.d)
    }
}

/// Marker for the block structs: plain bytes, alignment 1, any bit pattern valid.
pub trait Block: Copy {}
impl Block for BlockQ4_0 {}
impl Block for BlockQ4_1 {}
impl Block for BlockQ8_0 {}

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
