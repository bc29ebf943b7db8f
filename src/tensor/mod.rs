//! ggml tensor types, their block layouts and dequantization.

mod blocks;
mod dequant;

pub use blocks::{as_blocks, as_blocks_mut, BlockQ4_0, BlockQ4_1, BlockQ8_0, QK};
pub use dequant::dequantize_row;

/// The ggml tensor types reprolm reads and computes with (ids as in ggml.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    BF16,
}

impl GgmlType {
    pub const ALL: [GgmlType; 6] =
        [GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::BF16];

    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    /// The type named `name` ("q4_1", "Q8_0", "f16", ... in any case).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Whether values are stored in blocks with a scale (Q4_0, Q4_1, Q8_0).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
            GgmlType::BF16 => 30,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::BF16 => "BF16",
        }
    }

    /// Values per block (1 for the float types).
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => QK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => std::mem::size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => std::mem::size_of::<BlockQ4_1>(),
            GgmlType::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
        }
    }

    /// Bytes taken by a row of `n` values (`n` a multiple of the block size).
    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_size() * self.block_bytes()
    }
}

/// ggml's name for a tensor type id, whether or not reprolm supports it (ids as in ggml.h).
pub fn ggml_type_name(id: u32) -> Option<&'static str> {
    const NAMES: [&str; 40] = [
        "F32", "F16", "Q4_0", "Q4_1", "", "", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
        "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16",
        "I32", "I64", "F64", "IQ1_M", "BF16", "", "", "", "TQ1_0", "TQ2_0", "", "", "", "MXFP4",
    ];
    NAMES.get(id as usize).copied().filter(|n| !n.is_empty())
}

/// "Q4_K (ggml type 12)", or "ggml type 99" for ids ggml does not define.
pub fn describe_type_id(id: u32) -> String {
    match ggml_type_name(id) {
        Some(name) => format!("{name} (ggml type {id})"),
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
    fn ggml_names_agree_with_the_supported_types() {
        for t in GgmlType::ALL {
            assert_eq!(ggml_type_name(t.id()), Some(t.name()));
        }
        assert_eq!(describe_type_id(12), "Q4_K (ggml type 12)");
        assert_eq!(describe_type_id(4), "ggml type 4");
        assert_eq!(describe_type_id(1000), "ggml type 1000");
    }
}
