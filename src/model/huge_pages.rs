//! Weight memory on transparent huge pages, where the OS gives them.
//!
//! A matmul streams every weight row once per pass. On 4 KiB pages that is a TLB miss, and a
//! restart of the hardware prefetchers (which stop at page boundaries), every few rows; on
//! 2 MiB pages both go away. On Zen 4, one thread's pass of a 576 x 49152 F16 matrix (the
//! shape of SmolLM2's LM head) over one token took 1.6 ms instead of 2.8 (medians of 100;
//! whole models: docs/benchmarks.md, "Huge pages"). Faulting huge pages in costs load time (the kernel
//! zeroes and may compact 2 MiB at a time). `REPROLM_HUGE_PAGES=0` asks for ordinary pages;
//! so does a system without transparent huge pages. The bytes, and so every result, are the
//! same either way.

use std::ops::{Deref, DerefMut};

use memmap2::MmapMut;

use crate::error::{Error, Result};

/// The size and alignment of an x86-64 transparent huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Zero-initialized bytes in an anonymous mapping aligned to 2 MiB and advised for huge pages.
pub struct HugePageBytes {
    map: MmapMut,
    /// The first 2 MiB boundary in `map`.
    start: usize,
    len: usize,
}

impl HugePageBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Result<HugePageBytes> {
        // Room to start at a 2 MiB boundary, and never an empty mapping (which mmap refuses).
        let map = MmapMut::map_anon(len + HUGE_PAGE).map_err(|e| Error::Internal(format!("cannot allocate {len} bytes for weights: {e}")))?;
        let start = map.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
        // Only a hint: without transparent huge pages the bytes are the same.
        #[cfg(target_os = "linux")]
        if std::env::var("REPROLM_HUGE_PAGES").map_or(true, |v| v != "0") {
            let _ = map.advise_range(memmap2::Advice::HugePage, start, len);
        }
        Ok(HugePageBytes { map, start, len })
    }
}

impl Deref for HugePageBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

impl DerefMut for HugePageBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for HugePageBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugePageBytes({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_zeroed_writable_bytes_from_a_huge_page_boundary() {
        for len in [0, 1, 4095, HUGE_PAGE + 3] {
            let mut b = HugePageBytes::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            b.copy_from_slice(&src);
            assert_eq!(&b[..], &src[..]);
        }
    }
}
