//! GGUF version 3 writer, the inverse of [`super::GgufFile`].
//!
//! The layout is the one the reader parses: header, metadata in the given order, tensor infos
//! in the given order, zero padding to `general.alignment` (default 32), then each tensor's
//! data at the next aligned offset. Writing a parsed file back with its own metadata, tensor
//! order and data therefore reproduces a llama.cpp-written file byte for byte.
//!
//! The file is written to a temporary sibling of the destination and renamed over it only
//! once complete, so a failure never leaves a truncated GGUF at the destination.

use std::io::Write;
use std::path::Path;

use super::value::{MetadataValue, ValueType};
use crate::atomic_file::{write_atomically, write_err};
use crate::error::{Error, Result};
use crate::tensor::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
const VERSION: u32 = 3;
const DEFAULT_ALIGNMENT: u64 = 32;
/// Zero bytes for padding (alignments above this are padded in several writes).
const ZEROS: [u8; 4096] = [0; 4096];

/// One tensor's header entry, as it will be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    /// Dimensions with the contiguous (row) axis first.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

impl TensorSpec {
    /// Bytes of data this tensor occupies.
    pub fn n_bytes(&self) -> Result<u64> {
        let block = self.ggml_type.block_size() as u64;
        if self.dims.is_empty() || self.dims.len() > 4 || self.dims.contains(&0) {
            return Err(Error::invalid_argument(
                "tensor",
                format!("'{}' has dimensions {:?} (1 to 4 nonzero dimensions allowed)", self.name, self.dims),
            ));
        }
        if !self.dims[0].is_multiple_of(block) {
            return Err(Error::invalid_argument(
                "tensor",
                format!(
                    "'{}' row length {} is not a multiple of the {} block size {block}",
                    self.name,
                    self.dims[0],
                    self.ggml_type.name()
                ),
            ));
        }
        self.dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .and_then(|n| (n / block).checked_mul(self.ggml_type.block_bytes() as u64))
            .ok_or_else(|| Error::invalid_argument("tensor", format!("'{}' is too large", self.name)))
    }
}

/// A GGUF file to be written: metadata and tensor headers, data supplied while writing.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<TensorSpec>,
    /// Offset of each tensor relative to the data section, and its byte length.
    layout: Vec<(u64, u64)>,
    alignment: u64,
}

impl GgufWriter {
    /// A writer for `metadata` (written in this order). Its `general.alignment`, if present,
    /// must be a power of two and sets the data alignment.
    pub fn new(metadata: Vec<(String, MetadataValue)>) -> Result<GgufWriter> {
        let mut seen = std::collections::HashSet::new();
        for (key, value) in &metadata {
            if !seen.insert(key.as_str()) {
                return Err(Error::invalid_argument("metadata", format!("duplicate key '{key}'")));
            }
            check_value(key, value)?;
        }
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(Error::invalid_argument(
                        "general.alignment",
                        format!("must be a power of two, got {}", v.summary()),
                    ))
                }
            },
        };
        Ok(GgufWriter { metadata, tensors: Vec::new(), layout: Vec::new(), alignment })
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Appends a tensor; its data goes at the next aligned offset after the previous one.
    pub fn add_tensor(&mut self, spec: TensorSpec) -> Result<()> {
        if self.tensors.iter().any(|t| t.name == spec.name) {
            return Err(Error::invalid_argument("tensor", format!("duplicate tensor name '{}'", spec.name)));
        }
        let n_bytes = spec.n_bytes()?;
        let offset = match self.layout.last() {
            None => 0,
            Some(&(o, n)) => align_up(o + n, self.alignment),
        };
        self.tensors.push(spec);
        self.layout.push((offset, n_bytes));
        Ok(())
    }

    /// Writes the file to `path`. `data(i, buf)` must fill `buf` (cleared before the call)
    /// with tensor `i`'s bytes, exactly as many as its type and dimensions require.
    pub fn write<F>(&self, path: impl AsRef<Path>, mut data: F) -> Result<()>
    where
        F: FnMut(usize, &mut Vec<u8>) -> Result<()>,
    {
        let path = path.as_ref();
        write_atomically(path, |out| {
            let mut written = self.write_header(out).map_err(|e| write_err(path, e))?;
            let data_start = align_up(written, self.alignment);
            let mut buf = Vec::new();
            for (i, (spec, &(offset, n_bytes))) in self.tensors.iter().zip(&self.layout).enumerate() {
                buf.clear();
                data(i, &mut buf)?;
                if buf.len() as u64 != n_bytes {
                    return Err(Error::invalid_argument(
                        "tensor",
                        format!("'{}' was given {} bytes of data, needs {n_bytes}", spec.name, buf.len()),
                    ));
                }
                let start = data_start + offset;
                pad(out, start - written).map_err(|e| write_err(path, e))?;
                out.write_all(&buf).map_err(|e| write_err(path, e))?;
                written = start + n_bytes;
            }
            // Like ggml's and gguf-py's writers, pad the end to the alignment too (an empty
            // data section still starts at an aligned offset).
            let end = align_up(written.max(data_start), self.alignment);
            pad(out, end - written).map_err(|e| write_err(path, e))
        })
    }

    /// Header, metadata and tensor infos; returns the number of bytes written.
    fn write_header(&self, out: &mut impl Write) -> std::io::Result<u64> {
        let mut enc = Encoder { out, n: 0 };
        enc.bytes(MAGIC)?;
        enc.u32(VERSION)?;
        enc.u64(self.tensors.len() as u64)?;
        enc.u64(self.metadata.len() as u64)?;
        for (key, value) in &self.metadata {
            enc.string(key)?;
            enc.u32(value.value_type().id())?;
            enc.value(value)?;
        }
        for (spec, &(offset, _)) in self.tensors.iter().zip(&self.layout) {
            enc.string(&spec.name)?;
            enc.u32(spec.dims.len() as u32)?;
            for &d in &spec.dims {
                enc.u64(d)?;
            }
            enc.u32(spec.ggml_type.id())?;
            enc.u64(offset)?;
        }
        Ok(enc.n)
    }
}

fn align_up(x: u64, alignment: u64) -> u64 {
    x.div_ceil(alignment) * alignment
}

fn pad(out: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64);
        out.write_all(&ZEROS[..k as usize])?;
        n -= k;
    }
    Ok(())
}

/// The element type an array is written with. The reader does not keep the element type of
/// an empty array, so an empty array is written as an array of u8 (no value is lost).
fn element_type(items: &[MetadataValue]) -> ValueType {
    items.first().map_or(ValueType::U8, MetadataValue::value_type)
}

/// Rejects arrays whose elements do not share one type (GGUF arrays are homogeneous).
fn check_value(key: &str, value: &MetadataValue) -> Result<()> {
    if let MetadataValue::Array(items) = value {
        let ty = element_type(items);
        for item in items {
            if item.value_type() != ty {
                return Err(Error::invalid_argument(
                    "metadata",
                    format!("array '{key}' mixes {ty:?} and {:?} elements", item.value_type()),
                ));
            }
            check_value(key, item)?;
        }
    }
    Ok(())
}

/// Little-endian serializer that counts the bytes it writes.
struct Encoder<'a, W: Write> {
    out: &'a mut W,
    n: u64,
}

impl<W: Write> Encoder<'_, W> {
    fn bytes(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.out.write_all(b)?;
        self.n += b.len() as u64;
        Ok(())
    }

    fn u32(&mut self, v: u32) -> std::io::Result<()> {
        self.bytes(&v.to_le_bytes())
    }

    fn u64(&mut self, v: u64) -> std::io::Result<()> {
        self.bytes(&v.to_le_bytes())
    }

    fn string(&mut self, s: &str) -> std::io::Result<()> {
        self.u64(s.len() as u64)?;
        self.bytes(s.as_bytes())
    }

    fn value(&mut self, value: &MetadataValue) -> std::io::Result<()> {
        use MetadataValue as V;
        match value {
            V::U8(v) => self.bytes(&[*v]),
            V::I8(v) => self.bytes(&v.to_le_bytes()),
            V::U16(v) => self.bytes(&v.to_le_bytes()),
            V::I16(v) => self.bytes(&v.to_le_bytes()),
            V::U32(v) => self.u32(*v),
            V::I32(v) => self.bytes(&v.to_le_bytes()),
            V::F32(v) => self.bytes(&v.to_le_bytes()),
            V::Bool(v) => self.bytes(&[u8::from(*v)]),
            V::String(s) => self.string(s),
            V::U64(v) => self.u64(*v),
            V::I64(v) => self.bytes(&v.to_le_bytes()),
            V::F64(v) => self.bytes(&v.to_le_bytes()),
            V::Array(items) => {
                self.u32(element_type(items).id())?;
                self.u64(items.len() as u64)?;
                items.iter().try_for_each(|item| self.value(item))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    fn every_value_type() -> Vec<(String, MetadataValue)> {
        use MetadataValue as V;
        vec![
            ("general.alignment".into(), V::U32(64)),
            ("t.u8".into(), V::U8(200)),
            ("t.i8".into(), V::I8(-100)),
            ("t.u16".into(), V::U16(60000)),
            ("t.i16".into(), V::I16(-30000)),
            ("t.u32".into(), V::U32(4_000_000_000)),
            ("t.i32".into(), V::I32(-2_000_000_000)),
            ("t.f32".into(), V::F32(-1.5e-3)),
            ("t.bool".into(), V::Bool(true)),
            ("t.string".into(), V::String("héllo\n".into())),
            ("t.u64".into(), V::U64(u64::MAX)),
            ("t.i64".into(), V::I64(i64::MIN)),
            ("t.f64".into(), V::F64(std::f64::consts::PI)),
            ("t.array.f32".into(), V::Array(vec![V::F32(1.0), V::F32(-2.0)])),
            ("t.array.string".into(), V::Array(vec![V::String("a".into()), V::String(String::new())])),
            ("t.array.nested".into(), V::Array(vec![V::Array(vec![V::I16(1)]), V::Array(vec![V::I16(2), V::I16(3)])])),
            ("t.array.empty".into(), V::Array(vec![])),
        ]
    }

    #[test]
    fn writes_what_the_reader_reads() {
        let dir = std::env::temp_dir().join(format!("reprolm-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.gguf");
        let mut w = GgufWriter::new(every_value_type()).unwrap();
        w.add_tensor(TensorSpec { name: "a".into(), dims: vec![3], ggml_type: GgmlType::F32 }).unwrap();
        w.add_tensor(TensorSpec { name: "b".into(), dims: vec![32, 2], ggml_type: GgmlType::Q8_0 }).unwrap();
        let data: Vec<Vec<u8>> = vec![(0..12).collect(), (0..68).map(|i| i as u8 ^ 0x5a).collect()];
        w.write(&path, |i, buf| {
            buf.extend_from_slice(&data[i]);
            Ok(())
        })
        .unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.metadata(), &every_value_type()[..]);
        assert_eq!(f.tensors().len(), 2);
        for (t, d) in f.tensors().iter().zip(&data) {
            assert_eq!((t.offset - f.data_offset()) % 64, 0);
            assert_eq!(f.tensor_bytes(t), &d[..]);
        }
        assert_eq!(f.tensor("b").unwrap().dims, vec![32, 2]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_bad_input() {
        use MetadataValue as V;
        let mixed = vec![("k".into(), V::Array(vec![V::U8(1), V::I8(1)]))];
        assert!(matches!(GgufWriter::new(mixed), Err(Error::InvalidArgument { .. })));
        let align = vec![("general.alignment".into(), V::U32(48))];
        assert!(matches!(GgufWriter::new(align), Err(Error::InvalidArgument { .. })));
        let mut w = GgufWriter::new(vec![]).unwrap();
        let odd = TensorSpec { name: "x".into(), dims: vec![33], ggml_type: GgmlType::Q4_0 };
        assert!(matches!(w.add_tensor(odd), Err(Error::InvalidArgument { .. })));
        let dir = std::env::temp_dir().join(format!("reprolm-writer-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        w.add_tensor(TensorSpec { name: "x".into(), dims: vec![4], ggml_type: GgmlType::F32 }).unwrap();
        // Wrong data length: an error, and nothing left behind.
        let r = w.write(dir.join("short.gguf"), |_, buf| {
            buf.push(0);
            Ok(())
        });
        assert!(matches!(r, Err(Error::InvalidArgument { .. })));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // A missing directory is a write error naming the destination.
        let r = w.write(dir.join("missing/x.gguf"), |_, buf| {
            buf.extend_from_slice(&[0; 16]);
            Ok(())
        });
        assert!(matches!(r, Err(Error::Write { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
