//! ggml tensor types: one table entry per type ([`spec::TypeSpec`], in `types/`), the
//! block layouts and dequantization.

mod blocks;
pub mod spec;
pub mod types;

pub use blocks::{as_blocks, as_blocks_mut, Block, QK};
pub use spec::{Codes, Group, GroupFormat, KernelGroup, TypeSpec};
pub use types::q4_0::BlockQ4_0;
pub use types::q4_1::BlockQ4_1;
pub use types::q8_0::BlockQ8_0;

/// The ggml tensor types reprolm reads and computes with (ids as in ggml.h).
#[allow(non_camel_case_types)] // ggml's names
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    BF16,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl GgmlType {
    pub const ALL: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::BF16,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// The type's table entry: every fact about it lives there.
    pub fn spec(self) -> &'static TypeSpec {
        match self {
            GgmlType::F32 => &types::float::F32,
            GgmlType::F16 => &types::float::F16,
            GgmlType::BF16 => &types::float::BF16,
            GgmlType::Q4_0 => &types::q4_0::SPEC,
            GgmlType::Q4_1 => &types::q4_1::SPEC,
            GgmlType::Q8_0 => &types::q8_0::SPEC,
            GgmlType::Q5_0 => &types::q5_0::SPEC,
            GgmlType::Q5_1 => &types::q5_1::SPEC,
            GgmlType::Q2_K => &types::q2_k::SPEC,
            GgmlType::Q3_K => &types::q3_k::SPEC,
            GgmlType::Q4_K => &types::q4_k::SPEC,
            GgmlType::Q5_K => &types::q5_k::SPEC,
            GgmlType::Q6_K => &types::q6_k::SPEC,
        }
    }

    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The type named `name` ("q4_1", "Q8_0", "f16", ... in any case).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether values are stored in blocks with scales (every type but F32, F16, BF16).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    pub fn id(self) -> u32 {
        self.spec().id
    }

    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Values per block (1 for the float types).
    pub fn block_size(self) -> usize {
        self.spec().block_size
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.spec().block_bytes
    }

    /// Bytes taken by a row of `n` values (`n` a multiple of the block size).
    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.block_bytes()
    }

    /// How the matmul kernels read matrices of this type.
    pub fn kernel(self) -> KernelGroup {
        self.spec().kernel
    }
}

/// Dequantizes one row: `bytes` holds `out.len()` values of type `ty`, and `out` gets ggml's
/// values bit for bit (products and sums separately rounded f32 operations, never fused).
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), ty.row_bytes(out.len()), "row byte length does not match {} values", out.len());
    (ty.spec().dequantize)(bytes, out)
}

/// What ggml says of one of its tensor types: enough to size and name tensors of types
/// reprolm does not compute with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlTypeInfo {
    pub id: u32,
    pub name: &'static str,
    /// Values per block.
    pub block_size: usize,
    /// Bytes per block.
    pub block_bytes: usize,
}

/// Every tensor type ggml defines (ggml.h; sizes as the `gguf` package lists them).
const GGML_TYPES: [(u32, &str, usize, usize); 34] = [
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20), (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40), (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144), (13, "Q5_K", 256, 176), (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292), (16, "IQ2_XXS", 256, 66), (17, "IQ2_XS", 256, 74), (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110), (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2), (26, "I32", 1, 4), (27, "I64", 1, 8),
    (28, "F64", 1, 8), (29, "IQ1_M", 256, 56), (30, "BF16", 1, 2), (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66), (39, "MXFP4", 32, 17), (40, "NVFP4", 64, 36), (41, "Q1_0", 128, 18),
];

/// ggml's description of tensor type `id`, whether or not reprolm supports it.
pub fn ggml_type_info(id: u32) -> Option<GgmlTypeInfo> {
    GGML_TYPES
        .iter()
        .find(|t| t.0 == id)
        .map(|&(id, name, block_size, block_bytes)| GgmlTypeInfo { id, name, block_size, block_bytes })
}

/// "Q4_K (ggml type 12)", or "ggml type 99" for ids ggml does not define.
pub fn describe_type_id(id: u32) -> String {
    match ggml_type_info(id) {
        Some(t) => format!("{} (ggml type {id})", t.name),
        None => format!("ggml type {id}"),
    }
}

/// The names of the supported types, for messages: "F32, F16, ...".
pub fn supported_type_names() -> String {
    GgmlType::ALL.map(GgmlType::name).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_table_agrees_with_the_supported_types() {
        for t in GgmlType::ALL {
            assert_eq!(t.spec().ty, t);
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            let info = ggml_type_info(t.id()).unwrap();
            assert_eq!((info.name, info.block_size, info.block_bytes), (t.name(), t.block_size(), t.block_bytes()));
        }
        assert_eq!(describe_type_id(16), "IQ2_XXS (ggml type 16)");
        assert_eq!(describe_type_id(4), "ggml type 4");
        assert_eq!(describe_type_id(1000), "ggml type 1000");
    }
}
