//! Buffers that start on a cache line.
//!
//! The kernels load activations 64 bytes at a time. From a buffer that starts on a 64-byte
//! boundary, with rows a multiple of 64 bytes long (every row of 32-value groups in f32,
//! and the int8 code rows), each such load reads one cache line; from an arbitrary start
//! (the allocator's 16-byte alignment) most loads straddle two lines, which on AVX-512 costs
//! a float32 prefill a third of its multiply-add rate (`examples/float32_types_speed.rs`).
//! Where a value is stored never changes a result.

use std::ops::{Deref, DerefMut};

use aligned_vec::{AVec, ConstAlign};

/// The alignment of an [`AlignedBuf`]: one cache line.
pub const LINE: usize = 64;

/// A growable buffer whose first element sits on a [`LINE`] boundary; it derefs to a slice.
#[derive(Debug, Clone)]
pub struct AlignedBuf<T>(AVec<T, ConstAlign<LINE>>);

impl<T> Default for AlignedBuf<T> {
    fn default() -> Self {
        AlignedBuf(AVec::new(LINE))
    }
}

impl<T: Clone> AlignedBuf<T> {
    /// Grows or shrinks to `len` elements, new ones `value`.
    pub fn resize(&mut self, len: usize, value: T) {
        self.0.resize(len, value);
    }

    /// Grows to at least `len` elements, new ones `value` (a buffer reused for the largest
    /// call so far).
    pub fn grow(&mut self, len: usize, value: T) {
        if self.len() < len {
            self.resize(len, value);
        }
    }
}

impl<T> Deref for AlignedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> DerefMut for AlignedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_on_a_line_and_keeps_its_values_as_it_grows() {
        let mut b = AlignedBuf::<f32>::default();
        assert!(b.is_empty());
        for (i, len) in [1usize, 17, 1000, 100_000, 5].into_iter().enumerate() {
            let old: Vec<f32> = b.to_vec();
            b.resize(len, i as f32);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % LINE, 0, "len {len}");
            let kept = old.len().min(len);
            assert_eq!(&b[..kept], &old[..kept]);
            assert!(b[kept..].iter().all(|&v| v == i as f32));
        }
    }
}
