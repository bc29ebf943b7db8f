//! Q6_K: 256 values in 210 bytes `{ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16}`:
//! 16 sub-blocks of 16 with 8-bit signed scales; w = (d * sc) * (q - 32), q in 0..64. Value
//! `v` (half `h = v / 128`) takes nibble `(v / 64) % 2` of `ql[64h + v % 64]` and bits
//! `2 * ((v / 32) % 4)..` of `qh[32h + v % 32]` as bits 4 and 5.
//!
//! Exactness: `d * sc` has at most 11 + 8 significant bits; with `d = M * 2^e` (integer
//! `|M| < 2^11`), `(d * sc) * c = M * (sc * c) * 2^e` where `|sc * c| <= 128 * 32 = 2^12`, so
//! the integer `M * sc * c` has magnitude below 2^23 and every product is exact in f32.

use crate::tensor::spec::{decode_groups, dequantize_groups, f16_at, Codes, Group, GroupFormat, GroupType, KernelGroup, TypeSpec};
use crate::tensor::GgmlType;

pub struct Q6K;

impl GroupType for Q6K {
    const FORMAT: GroupFormat = GroupFormat { codes: Codes::I8, halves: true, offset: false };
    const BLOCK_SIZE: usize = 256;
    const BLOCK_BYTES: usize = 210;
    fn decode(b: &[u8], groups: &mut [Group]) {
        let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
        let d = f16_at(&b[208..210]);
        for (g, group) in groups.iter_mut().enumerate().take(8) {
            for l in 0..32 {
                let v = 32 * g + l;
                let h = v / 128;
                let low = (ql[64 * h + v % 64] >> (4 * ((v / 64) % 2))) & 0x0F;
                let high = (qh[32 * h + v % 32] >> (2 * ((v / 32) % 4))) & 3;
                group.codes[l] = (low | (high << 4)) as i8 - 32;
            }
            group.scale = [d * scales[2 * g] as i8 as f32, d * scales[2 * g + 1] as i8 as f32];
        }
    }
}

pub const SPEC: TypeSpec = TypeSpec {
    ty: GgmlType::Q6_K,
    id: 14,
    name: "Q6_K",
    block_size: Q6K::BLOCK_SIZE,
    block_bytes: Q6K::BLOCK_BYTES,
    file_type: None,
    dequantize: dequantize_groups::<Q6K>,
    f16_fields: &[208],
    kernel: KernelGroup::Groups(Q6K::FORMAT),
    decode_groups: Some(decode_groups::<Q6K>),
};
