//! What one tensor type is: the single table entry ([`TypeSpec`]) that every other module
//! (GGUF reader, dequantization, repacking, kernels, quantize) reads instead of matching on
//! the type itself.
//!
//! Adding a type means one file in `tensor/types/` (its block layout, its [`TypeSpec`] and
//! its decoder), one variant of [`super::GgmlType`], and, only if none of the existing
//! [`KernelGroup`]s fits its codes, a kernel group.

use super::GgmlType;

/// Decodes whole blocks into [`Group`]s (one per 32 values).
pub type DecodeGroups = fn(bytes: &[u8], groups: &mut [Group]);

/// Everything reprolm needs to know about one ggml tensor type.
#[derive(Debug)]
pub struct TypeSpec {
    pub ty: GgmlType,
    /// ggml's id (ggml.h).
    pub id: u32,
    /// ggml's name ("Q4_K").
    pub name: &'static str,
    /// Values per block (1 for the float types).
    pub block_size: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// llama.cpp's `llama_ftype` for a file whose matrices are mostly of this type, for the
    /// types `quantize`/`convert` can write.
    pub file_type: Option<u32>,
    /// Dequantizes whole blocks into `out` (`bytes.len() / block_bytes * block_size`
    /// values), bit for bit as ggml's reference and the `gguf` Python package.
    pub dequantize: fn(bytes: &[u8], out: &mut [f32]),
    /// Byte offsets in a block of its f16 fields (scales and mins), for tests that make
    /// random blocks with finite scales.
    pub f16_fields: &'static [usize],
    /// How the matmul kernels read matrices of this type.
    pub kernel: KernelGroup,
    /// For [`KernelGroup::Groups`] types: decodes whole blocks into [`Group`]s (one per 32
    /// values), from which the packed layout is written.
    pub decode_groups: Option<DecodeGroups>,
}

/// How a type enters the f32 matmul kernels (`kernels::groups`), which always work on groups
/// of 32 values split into two halves of 16 lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelGroup {
    /// Used in place as stored: f32 values.
    F32,
    /// Used in place: f16 values.
    F16,
    /// Used in place: bf16 values.
    Bf16,
    /// ggml's 32-value blocks with an f16 scale (and offset), repacked at load into codes
    /// then scales (`kernels::packed`); the int8 kernels also read these.
    Q8_0,
    Q4_0,
    Q4_1,
    /// Decoded at load into [`Group`]s of 32 integer codes with f32 scales and offsets
    /// (`kernels::packed`, group layout); the kernel forms each weight as
    /// `scale * code (+ offset)`, ggml's dequantized value bit for bit.
    Groups(GroupFormat),
}

/// The stored form of a decoded group type: which codes, how many scales, whether offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupFormat {
    pub codes: Codes,
    /// One scale (and offset) per half of 16 values (sub-blocks of 16), else one per group.
    pub halves: bool,
    /// Whether a weight is `scale * code + offset` rather than `scale * code`.
    pub offset: bool,
}

/// How a group's 32 codes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codes {
    /// One signed byte per code (32 bytes).
    I8,
    /// Codes `nibble + bias` in 16 bytes: value `l < 16` is the low nibble of byte `l`,
    /// value `l + 16` its high nibble (ggml's Q4_0 order).
    Nibbles { bias: i8 },
}

impl GroupFormat {
    pub const fn code_bytes(self) -> usize {
        match self.codes {
            Codes::I8 => 32,
            Codes::Nibbles { .. } => 16,
        }
    }

    /// Scales (and offsets, if any) per group.
    pub const fn scales(self) -> usize {
        if self.halves {
            2
        } else {
            1
        }
    }

    /// Bytes a group takes in the packed layout: codes, f32 scales, f32 offsets.
    pub const fn group_bytes(self) -> usize {
        self.code_bytes() + 4 * self.scales() * (1 + self.offset as usize)
    }
}

/// 32 consecutive values of a decoded group type: value `l` is
/// `scale[l / 16] * codes[l] as f32`, plus `offset[l / 16]` if the format has offsets (one
/// f32 multiplication that is exact, then one rounded addition: ggml's operation order).
/// With one scale per group, `scale[1] == scale[0]` and `offset[1] == offset[0]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Group {
    pub codes: [i8; 32],
    pub scale: [f32; 2],
    pub offset: [f32; 2],
}

impl Group {
    pub const ZERO: Group = Group { codes: [0; 32], scale: [0.0; 2], offset: [0.0; 2] };

    /// The group's 32 values, by the operation order above.
    pub fn values(&self, offset: bool, out: &mut [f32]) {
        for (l, o) in out[..32].iter_mut().enumerate() {
            let w = self.scale[l / 16] * self.codes[l] as f32;
            *o = if offset { w + self.offset[l / 16] } else { w };
        }
    }
}

/// A type decoded into [`Group`]s: its format and its decoder of one block into
/// `block_size / 32` groups.
pub trait GroupType {
    const FORMAT: GroupFormat;
    const BLOCK_SIZE: usize;
    const BLOCK_BYTES: usize;
    fn decode(block: &[u8], groups: &mut [Group]);
}

/// Decodes whole blocks of a group type into `groups` (one per 32 values).
pub fn decode_groups<T: GroupType>(bytes: &[u8], groups: &mut [Group]) {
    let per_block = T::BLOCK_SIZE / 32;
    for (b, g) in bytes.chunks_exact(T::BLOCK_BYTES).zip(groups.chunks_exact_mut(per_block)) {
        T::decode(b, g);
    }
}

/// [`TypeSpec::dequantize`] for a group type: decode, then [`Group::values`].
pub fn dequantize_groups<T: GroupType>(bytes: &[u8], out: &mut [f32]) {
    let mut groups = [Group::ZERO; 8];
    let per_block = T::BLOCK_SIZE / 32;
    for (b, o) in bytes.chunks_exact(T::BLOCK_BYTES).zip(out.chunks_exact_mut(T::BLOCK_SIZE)) {
        T::decode(b, &mut groups[..per_block]);
        for (g, v) in groups.iter().zip(o.chunks_exact_mut(32)) {
            g.values(T::FORMAT.offset, v);
        }
    }
}

/// The f16 at `b[0..2]` (little-endian), exactly converted.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

#[cfg(test)]
mod tests {
    use half::f16;

    /// The K-quant decoders multiply the f16 super-block scale by the integer sub-block scale
    /// in f32, then by the integer code: both must be exact for the kernels' weights to be
    /// ggml's values and independent of the order of the two multiplications. For every
    /// type's ranges (sub-block scale, code): every finite f16 `d` times every scale is exact,
    /// and `(d * sc) * c` is exact for every f16 significand (the exponent only shifts the
    /// result, which stays far from f32's overflow and subnormal ranges: at most
    /// 65504 * 128 * 32 < 2^28, at least 2^-24).
    #[test]
    fn sub_block_scale_times_super_block_scale_is_exact_in_f32() {
        // (type, sub-block scales, codes)
        let ranges: [(&str, std::ops::Range<i32>, std::ops::Range<i32>); 5] = [
            ("Q2_K", 0..16, 0..4),
            ("Q3_K", -32..32, -4..4),
            ("Q4_K", 0..64, 0..16),
            ("Q5_K", 0..64, 0..32),
            ("Q6_K", -128..128, -32..32),
        ];
        let finite: Vec<f32> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).filter(|v| v.is_finite()).collect();
        // Every significand of f16 once: the values in [1, 2) and the subnormals.
        let significands: Vec<f32> =
            finite.iter().copied().filter(|v| (1.0..2.0).contains(v) || (*v > 0.0 && *v < f16::MIN_POSITIVE.to_f32())).collect();
        assert_eq!(significands.len(), 1024 + 1023);
        for (name, scales, codes) in ranges {
            for &d in &finite {
                for sc in scales.clone() {
                    assert_eq!((d * sc as f32) as f64, d as f64 * sc as f64, "{name}: {d} * {sc}");
                }
            }
            for &d in &significands {
                for sc in scales.clone() {
                    let dl = d * sc as f32;
                    for c in codes.clone() {
                        assert_eq!((dl * c as f32) as f64, d as f64 * sc as f64 * c as f64, "{name}: {d} * {sc} * {c}");
                    }
                }
            }
        }
    }
}
