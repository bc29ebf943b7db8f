//! Bounded GGUF parser over a memory map. Every count, length, dimension and offset read
//! from the file is checked against what the file can hold before it is used, so a corrupt
//! or hostile file yields [`Error::Format`] instead of a huge allocation, a panic or a hang.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::value::{MetadataValue, ValueType};
use crate::error::{Error, Result};
use crate::tensor::{ggml_type_info, GgmlType};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal GGUF; nothing real nests deeper than this.
const MAX_ARRAY_DEPTH: usize = 4;

/// One tensor's description, with its data location resolved to an absolute file offset.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions with the contiguous (row) axis first, as GGUF lists them.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the tensor's data in the file.
    pub offset: usize,
    pub n_bytes: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A tensor of a ggml type reprolm does not compute with (K-quants, ...): sized from ggml's
/// block layout and bounds-checked like the others, so the file can be inspected, but never
/// loaded. Asking for it by name is an [`Error::UnknownTensorType`].
#[derive(Debug, Clone)]
pub struct ForeignTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    /// Absolute byte offset of the tensor's data in the file.
    pub offset: usize,
    pub n_bytes: usize,
}

/// A resolved tensor description: one reprolm can use, or one it can only describe.
enum Resolved {
    Supported(TensorInfo),
    Foreign(ForeignTensor),
}

/// A parsed GGUF file: metadata and tensor infos decoded, tensor data left in the map.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Arc<Mmap>,
    version: u32,
    /// Metadata in file order.
    metadata: Vec<(String, MetadataValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// Tensors of types reprolm does not support, in file order.
    foreign: Vec<ForeignTensor>,
    alignment: u64,
    data_offset: usize,
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source: std::io::Error| {
            if source.kind() == std::io::ErrorKind::NotFound {
                Error::FileNotFound(path.clone())
            } else {
                Error::Io { path: path.clone(), source }
            }
        };
        let file = File::open(&path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.is_dir() {
            return Err(Error::Io {
                path: path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "is a directory"),
            });
        }
        if meta.len() < 24 {
            return Err(too_short(&path, meta.len()));
        }
        // SAFETY: the map is read-only; reprolm never writes through it. Another process
        // truncating the file while it is mapped is outside what any mmap reader can guard.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        // Weights read in place stream from this map on every token: ask for its page cache to
        // be filled with huge pages (fewer TLB misses); pages the cache holds already stay as
        // they are, and a kernel without file huge pages ignores the advice.
        let _ = map.advise(memmap2::Advice::HugePage);
        Self::parse(path, Arc::new(map))
    }

    /// Parses a GGUF file held in memory (copied into an anonymous map), as [`GgufFile::open`]
    /// would parse the same bytes from a file; [`GgufFile::path`] is then `<memory>`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let path = PathBuf::from("<memory>");
        if bytes.len() < 24 {
            return Err(too_short(&path, bytes.len() as u64));
        }
        let io_err = |source| Error::Io { path: path.clone(), source };
        let mut map = memmap2::MmapMut::map_anon(bytes.len()).map_err(io_err)?;
        map.copy_from_slice(bytes);
        let map = map.make_read_only().map_err(io_err)?;
        Self::parse(path, Arc::new(map))
    }

    fn parse(path: PathBuf, map: Arc<Mmap>) -> Result<Self> {
        let mut cur = Cursor { bytes: &map[..], pos: 0 };
        if cur.take(4, "magic")? != MAGIC {
            return Err(Error::Format(format!("{}: not a GGUF file (bad magic)", path.display())));
        }
        let version = cur.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(Error::Unsupported(format!(
                "GGUF version {version} (reprolm reads versions 2 and 3)"
            )));
        }
        let n_tensors = cur.u64("tensor count")?;
        let n_metadata = cur.u64("metadata count")?;
        // Each metadata pair takes at least 13 bytes, each tensor info at least 32.
        cur.check_count(n_metadata, 13, "metadata count")?;
        cur.check_count(n_tensors, 32, "tensor count")?;

        let mut metadata = Vec::with_capacity(n_metadata as usize);
        let mut metadata_index = HashMap::with_capacity(n_metadata as usize);
        for _ in 0..n_metadata {
            let key = cur.string("metadata key")?;
            let type_id = cur.u32("metadata value type")?;
            let value = cur.value(type_id, &key, 0)?;
            if metadata_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(Error::Format(format!("duplicate metadata key '{key}'")));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => match metadata[i].1.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(Error::Format(format!(
                        "general.alignment must be a power of two, got {}",
                        metadata[i].1.summary()
                    )))
                }
            },
        };

        let mut raw_tensors = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = cur.string("tensor name")?;
            let n_dims = cur.u32("tensor n_dims")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(Error::Format(format!(
                    "tensor '{name}' has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(cur.u64("tensor dimension")?);
            }
            let type_id = cur.u32("tensor type")?;
            let offset = cur.u64("tensor offset")?;
            raw_tensors.push((name, dims, type_id, offset));
        }

        let file_len = map.len() as u64;
        // A file without tensors (llama.cpp's vocabulary-only files) may end right after its
        // metadata, without the padding up to an empty data section.
        let data_offset = match align_up(cur.pos as u64, alignment) {
            offset if raw_tensors.is_empty() => offset.min(file_len),
            offset => offset,
        };
        if data_offset > file_len {
            return Err(Error::Format(format!(
                "truncated: data section would start at byte {data_offset} of {file_len}"
            )));
        }

        let mut tensors = Vec::with_capacity(raw_tensors.len());
        let mut tensor_index = HashMap::with_capacity(raw_tensors.len());
        let mut foreign: Vec<ForeignTensor> = Vec::new();
        let mut names = std::collections::HashSet::with_capacity(raw_tensors.len());
        for (name, dims, type_id, offset) in raw_tensors {
            if !names.insert(name.clone()) {
                return Err(Error::Format(format!("duplicate tensor name '{name}'")));
            }
            match resolve_tensor(name, dims, type_id, offset, alignment, data_offset, file_len)? {
                Resolved::Supported(info) => {
                    tensor_index.insert(info.name.clone(), tensors.len());
                    tensors.push(info);
                }
                Resolved::Foreign(t) => foreign.push(t),
            }
        }

        Ok(GgufFile {
            path,
            map,
            version,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            foreign,
            alignment,
            data_offset: data_offset as usize,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    pub fn file_len(&self) -> usize {
        self.map.len()
    }

    /// Metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, MetadataValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensors whose types reprolm does not support (they are not in [`Self::tensors`]).
    pub fn foreign_tensors(&self) -> &[ForeignTensor] {
        &self.foreign
    }

    /// The tensor `name` if the file has it: an error if its type is not supported.
    pub fn usable_tensor(&self, name: &str) -> Result<Option<&TensorInfo>> {
        match self.foreign.iter().find(|t| t.name == name) {
            Some(t) => Err(Error::UnknownTensorType { tensor: t.name.clone(), type_id: t.type_id }),
            None => Ok(self.tensor(name)),
        }
    }

    /// An error naming the first tensor of an unsupported type, if any (for whole-file tools).
    pub fn check_all_supported(&self) -> Result<()> {
        match self.foreign.first() {
            Some(t) => Err(Error::UnknownTensorType { tensor: t.name.clone(), type_id: t.type_id }),
            None => Ok(()),
        }
    }

    /// The map itself, shared with whatever borrows tensor data beyond this file's lifetime.
    pub fn map(&self) -> &Arc<Mmap> {
        &self.map
    }

    /// Tells the kernel that a tensor's pages will not be read again (after a copy was
    /// made), so they stop counting towards the process's resident memory. Reading them
    /// later still works: the pages are read back from the file.
    pub fn release(&self, info: &TensorInfo) {
        self.release_bytes(info.offset, info.n_bytes);
    }

    /// [`GgufFile::release`] for `n_bytes` of the file from `offset` (a part of a tensor).
    pub fn release_bytes(&self, offset: usize, n_bytes: usize) {
        // Whole 4 KiB pages inside the range (on larger pages the call fails: harmless).
        let page = 4096;
        let start = offset.div_ceil(page) * page;
        let end = (offset + n_bytes).min(self.map.len()) / page * page;
        if end > start {
            // SAFETY: a read-only private file mapping: dropped pages are re-read from the
            // file on the next access, so no observable data changes. Failure is harmless.
            let _ = unsafe { self.map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }

    /// The raw bytes of a tensor (bounds were checked at parse time).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.map[info.offset..info.offset + info.n_bytes]
    }
}

fn too_short(path: &Path, len: u64) -> Error {
    Error::Format(format!("{}: {len} bytes is too short for a GGUF header", path.display()))
}

fn align_up(x: u64, alignment: u64) -> u64 {
    x.div_ceil(alignment) * alignment
}

fn resolve_tensor(
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    offset: u64,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<Resolved> {
    let layout = ggml_type_info(type_id).ok_or_else(|| Error::UnknownTensorType { tensor: name.clone(), type_id })?;
    let mut n_elements: u64 = 1;
    for &d in &dims {
        if d == 0 {
            return Err(Error::Format(format!("tensor '{name}' has a zero dimension")));
        }
        n_elements = n_elements
            .checked_mul(d)
            .filter(|&n| n <= file_len.saturating_mul(8))
            .ok_or_else(|| Error::Format(format!("tensor '{name}' dimensions {dims:?} are too large")))?;
    }
    let block = layout.block_size as u64;
    if !dims[0].is_multiple_of(block) {
        return Err(Error::Format(format!(
            "tensor '{name}' row length {} is not a multiple of the {} block size {block}",
            dims[0], layout.name
        )));
    }
    let n_bytes = n_elements / block * layout.block_bytes as u64;
    if !offset.is_multiple_of(alignment) {
        return Err(Error::Format(format!(
            "tensor '{name}' offset {offset} is not aligned to {alignment}"
        )));
    }
    let start = data_offset.checked_add(offset);
    let end = start.and_then(|s| s.checked_add(n_bytes));
    match (start, end) {
        (Some(start), Some(end)) if end <= file_len => Ok(match GgmlType::from_id(type_id) {
            Some(ggml_type) => {
                Resolved::Supported(TensorInfo { name, dims, ggml_type, offset: start as usize, n_bytes: n_bytes as usize })
            }
            None => Resolved::Foreign(ForeignTensor { name, dims, type_id, offset: start as usize, n_bytes: n_bytes as usize }),
        }),
        _ => Err(Error::Format(format!(
            "truncated: tensor '{name}' ({n_bytes} bytes at data offset {offset}) extends past the end of the {file_len}-byte file"
        ))),
    }
}

/// A bounds-checked little-endian reader over the header.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(Error::Format(format!(
                "truncated while reading {what} at byte {} (needs {n} bytes, {} left)",
                self.pos,
                self.remaining()
            )));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Rejects a count of items of at least `min_item_bytes` each that cannot fit in the rest.
    fn check_count(&self, count: u64, min_item_bytes: u64, what: &str) -> Result<()> {
        if count > self.remaining() as u64 / min_item_bytes {
            return Err(Error::Format(format!(
                "{what} {count} is impossible: only {} bytes remain in the file",
                self.remaining()
            )));
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(Error::Format(format!(
                "{what}: string length {len} exceeds the {} bytes left in the file",
                self.remaining()
            )));
        }
        let bytes = self.take(len as usize, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::Format(format!("{what} at byte {} is not valid UTF-8", self.pos)))
    }

    fn value(&mut self, type_id: u32, key: &str, depth: usize) -> Result<MetadataValue> {
        let ty = ValueType::from_id(type_id)
            .ok_or_else(|| Error::Format(format!("metadata '{key}' has unknown value type {type_id}")))?;
        use MetadataValue as V;
        Ok(match ty {
            ValueType::U8 => V::U8(self.array::<1>(key)?[0]),
            ValueType::I8 => V::I8(self.array::<1>(key)?[0] as i8),
            ValueType::U16 => V::U16(u16::from_le_bytes(self.array(key)?)),
            ValueType::I16 => V::I16(i16::from_le_bytes(self.array(key)?)),
            ValueType::U32 => V::U32(self.u32(key)?),
            ValueType::I32 => V::I32(i32::from_le_bytes(self.array(key)?)),
            ValueType::F32 => V::F32(f32::from_le_bytes(self.array(key)?)),
            ValueType::Bool => match self.array::<1>(key)?[0] {
                0 => V::Bool(false),
                1 => V::Bool(true),
                b => return Err(Error::Format(format!("metadata '{key}': invalid bool byte {b}"))),
            },
            ValueType::String => V::String(self.string(key)?),
            ValueType::U64 => V::U64(self.u64(key)?),
            ValueType::I64 => V::I64(i64::from_le_bytes(self.array(key)?)),
            ValueType::F64 => V::F64(f64::from_le_bytes(self.array(key)?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(Error::Format(format!("metadata '{key}': arrays nested too deeply")));
                }
                let elem_id = self.u32(key)?;
                let elem = ValueType::from_id(elem_id).ok_or_else(|| {
                    Error::Format(format!("metadata '{key}' has unknown array element type {elem_id}"))
                })?;
                let len = self.u64(key)?;
                // Strings take at least their 8-byte length, arrays their 12-byte header.
                let min_bytes = match elem {
                    ValueType::String => 8,
                    ValueType::Array => 12,
                    fixed => fixed.fixed_size().expect("fixed-size type") as u64,
                };
                self.check_count(len, min_bytes, &format!("metadata '{key}' array length"))?;
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem_id, key, depth + 1)?);
                }
                V::Array(items)
            }
        })
    }
}
