//! Session state files: a session's tokens and KV cache, saved so that a restored session
//! continues with exactly the same bits.
//!
//! # Format, version 1 (all integers little-endian)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `RPLMSESS` |
//! | 8 | 4 | format version (1) |
//! | 12 | 4 | header size in bytes (96) |
//! | 16 | 8 | model fingerprint: a hash of the GGUF file's bytes ([`LoadedModel::fingerprint`]) |
//! | 24 | 16 | n_layers, n_kv_heads, head_dim, vocab_size (u32 each) |
//! | 40 | 8 | kv dtype (u8: 0 f32, 1 f16), overflow policy (u8: 0 error, 1 sliding window), precision (u8: 0 float32, 1 int8; the cache's values depend on it), 5 zero bytes |
//! | 48 | 48 | n_keep, capacity, len, oldest, n_tokens, saved_slots (u64 each) |
//! | 96 | 4 n_tokens | token ids (u32) |
//! | ... | | for each layer, for each KV head: keys then values of slots `0..saved_slots`, `head_dim` numbers each in the kv dtype |
//! | end - 8 | 8 | XXH64 (seed 0) of every byte before it |
//!
//! Loading checks, in order: magic, version, checksum (so a truncated or altered file is
//! rejected before any field is trusted), model fingerprint, then every field's consistency;
//! each failure is a typed error, never a panic or a silently wrong state.
//!
//! Memory: loading holds the file's bytes, the token ids (the file's size again at most) and a
//! KV cache of the saved capacity, which must not exceed the saved slots, the model's context
//! length, or half the available memory (whichever is largest), so a short hostile file
//! cannot ask for a huge cache.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::atomic_file::{write_atomically, write_err};
use crate::loaded_model::{LoadedModel, Session};
use crate::error::{Error, Result};
use crate::kernels::Precision;
use crate::model::{KvCache, KvCacheOptions, KvDtype, Overflow};
/// The checksum of the format.
pub use crate::xxh64::xxh64;

const MAGIC: &[u8; 8] = b"RPLMSESS";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const HEADER_BYTES: usize = 96;
const CHECKSUM_BYTES: usize = 8;

impl Session {
    /// Writes this session's state to `path` (see the module docs for the format).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.state_bytes()?;
        write_atomically(path, |out| out.write_all(&bytes).map_err(|e| write_err(path, e)))
    }

    /// The bytes [`Session::save`] writes.
    pub fn state_bytes(&self) -> Result<Vec<u8>> {
        let cfg = self.loaded.config();
        let cache = &self.cache;
        let (len, oldest) = cache.cursor();
        let slots = cache.saved_slots();
        let kv_len = 2 * cfg.n_layers * cfg.d_kv() * slots * cache.dtype().bytes();
        let mut out = Vec::with_capacity(HEADER_BYTES + 4 * self.tokens.len() + kv_len + CHECKSUM_BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
        out.extend_from_slice(&self.loaded.fingerprint()?.to_le_bytes());
        for v in [cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size] {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
        let dtype = match cache.dtype() {
            KvDtype::F32 => 0u8,
            KvDtype::F16 => 1,
        };
        let overflow = match cache.overflow() {
            Overflow::Error => 0u8,
            Overflow::SlidingWindow { .. } => 1,
        };
        let precision = match self.loaded.transformer.precision() {
            Precision::Float32 => 0u8,
            Precision::Int8 => 1,
        };
        out.extend_from_slice(&[dtype, overflow, precision, 0, 0, 0, 0, 0]);
        for v in [cache.overflow().n_keep(), cache.capacity(), len, oldest, self.tokens.len(), slots] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        debug_assert_eq!(out.len(), HEADER_BYTES);
        for &t in &self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        for l in 0..cfg.n_layers {
            for g in 0..cfg.n_kv_heads {
                let (k, v) = cache.region_bytes(l, g, slots);
                out.extend_from_slice(k);
                out.extend_from_slice(v);
            }
        }
        let checksum = xxh64(&out, 0);
        out.extend_from_slice(&checksum.to_le_bytes());
        Ok(out)
    }

    /// Restores a session saved by [`Session::save`] for `engine`'s model.
    pub fn load(loaded: Arc<LoadedModel>, path: impl AsRef<Path>) -> Result<Session> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => Error::FileNotFound(path.to_path_buf()),
            _ => Error::Io { path: path.to_path_buf(), source },
        })?;
        Session::from_state_bytes(loaded, &bytes)
    }

    /// Restores a session from the bytes of a state file.
    pub fn from_state_bytes(loaded: Arc<LoadedModel>, bytes: &[u8]) -> Result<Session> {
        let bad = |m: &str| Error::StateFormat(m.to_string());
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(bad("not a reprolm session file (wrong magic bytes)"));
        }
        if bytes.len() < 12 {
            return Err(bad("truncated inside the header"));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        if version != FORMAT_VERSION {
            return Err(Error::StateVersion { found: version, supported: FORMAT_VERSION });
        }
        if bytes.len() < HEADER_BYTES + CHECKSUM_BYTES {
            return Err(bad("truncated inside the header"));
        }
        let (body, tail) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
        if xxh64(body, 0) != u64::from_le_bytes(tail.try_into().unwrap()) {
            return Err(bad("checksum mismatch: the file is truncated or damaged"));
        }
        let mut r = Reader { bytes: body, at: 12 };
        if r.u32()? as usize != HEADER_BYTES {
            return Err(bad("unexpected header size"));
        }
        let fingerprint = u64::from_le_bytes(r.take(8)?.try_into().unwrap());
        let model_fingerprint = loaded.fingerprint()?;
        if fingerprint != model_fingerprint {
            return Err(Error::StateModelMismatch(format!(
                "saved with a model file of fingerprint {fingerprint:016x}, but {} has {model_fingerprint:016x}",
                loaded.file.path().display(),
            )));
        }
        let cfg = loaded.config();
        let dims = [r.u32()?, r.u32()?, r.u32()?, r.u32()?];
        let expected = [cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size];
        if dims.iter().zip(expected).any(|(&a, b)| a as usize != b) {
            return Err(Error::StateModelMismatch(format!(
                "saved with (n_layers, n_kv_heads, head_dim, vocab_size) = {dims:?}, the model has {expected:?}"
            )));
        }
        let codes = r.take(8)?;
        let dtype = match codes[0] {
            0 => KvDtype::F32,
            1 => KvDtype::F16,
            c => return Err(bad(&format!("unknown kv dtype code {c}"))),
        };
        let [n_keep, capacity, len, oldest, n_tokens, slots] = [r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?];
        let overflow = match codes[1] {
            0 if n_keep == 0 => Overflow::Error,
            1 => Overflow::SlidingWindow { n_keep },
            c => return Err(bad(&format!("unknown overflow policy code {c} (n_keep {n_keep})"))),
        };
        let precision = match codes[2] {
            0 => Precision::Float32,
            1 => Precision::Int8,
            c => return Err(bad(&format!("unknown precision code {c}"))),
        };
        if precision != loaded.transformer.precision() {
            return Err(Error::StateModelMismatch(format!(
                "saved with precision {}, but the model runs {}",
                precision.name(),
                loaded.transformer.precision().name()
            )));
        }
        if codes[3..].iter().any(|&b| b != 0) {
            return Err(bad("reserved header bytes are not zero"));
        }
        if len > n_tokens || slots != len.min(capacity) {
            return Err(bad("inconsistent token and slot counts"));
        }
        // Every count is bounded by the file's actual size before anything is allocated.
        let slot_bytes = 2 * cfg.n_layers * cfg.d_kv() * dtype.bytes();
        let body_len = n_tokens
            .checked_mul(4)
            .and_then(|t| slots.checked_mul(slot_bytes).and_then(|k| k.checked_add(t)))
            .and_then(|n| n.checked_add(HEADER_BYTES));
        if body_len != Some(body.len()) {
            return Err(bad("the file's length does not match its header"));
        }
        // The cache is allocated at its full capacity, most of it empty: a capacity beyond the
        // saved slots must be one a new session could have (the model's context length, or a
        // cache that fits in half the available memory), or a 100-byte file could ask for
        // terabytes.
        let per_position = loaded.kv_bytes_per_position(dtype);
        let fits = || {
            crate::loaded_model::available_memory()
                .is_some_and(|m| capacity.checked_mul(per_position).is_some_and(|b| b <= m / 2))
        };
        if capacity > slots.max(cfg.context_length) && !fits() {
            return Err(bad(&format!(
                "a cache of {capacity} positions exceeds the model's context length {} and half the available memory",
                cfg.context_length
            )));
        }
        let tokens: Vec<u32> = r.take(4 * n_tokens)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        loaded.check_ids(&tokens).map_err(|e| bad(&format!("saved tokens: {e}")))?;
        let options = KvCacheOptions { capacity, dtype, overflow };
        let mut cache = KvCache::with_options(cfg, &options).map_err(|e| bad(&format!("cache settings: {e}")))?;
        for l in 0..cfg.n_layers {
            for g in 0..cfg.n_kv_heads {
                let (k, v) = cache.region_bytes_mut(l, g, slots);
                k.copy_from_slice(r.take(k.len())?);
                v.copy_from_slice(r.take(v.len())?);
            }
        }
        cache.set_cursor(len, oldest)?;
        Ok(Session::from_parts(loaded, cache, tokens))
    }
}

/// Bounds-checked little-endian reads.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| Error::StateFormat("truncated".into()))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    /// A u64 count, as usize.
    fn u64(&mut self) -> Result<usize> {
        let v = u64::from_le_bytes(self.take(8)?.try_into().unwrap());
        usize::try_from(v).map_err(|_| Error::StateFormat(format!("count {v} is too large")))
    }
}
