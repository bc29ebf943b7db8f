//! The counter-based random number generator: one uniform per (seed, step), no state.
//!
//! Algorithm: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as
//! 1, 2, 3", SC'11), the generator of the Random123 library, with
//!
//! - key = (seed mod 2^32, seed >> 32), counter = (step mod 2^32, step >> 32, purpose, 0),
//!   where `purpose` ([`Purpose`]) separates the independent draws one step may need: the
//!   sampler's selection (0, so plain sampling's draws are those of counter (step, 0, 0, 0)),
//!   and speculative decoding's draft, acceptance and residual draws;
//! - ten rounds; each round maps (x0, x1, x2, x3) with key (k0, k1) to
//!   (hi(M1*x2) ^ x1 ^ k0, lo(M1*x2), hi(M0*x0) ^ x3 ^ k1, lo(M0*x0)) where M0 = 0xD2511F53,
//!   M1 = 0xCD9E8D57 and hi/lo are the halves of the 64-bit product; between rounds the key
//!   is bumped by (0x9E3779B9, 0xBB67AE85) modulo 2^32;
//! - the uniform is u = floor(w / 2^11) * 2^-53 with w = x0 * 2^32 + x1 from the output, so u
//!   takes every multiple of 2^-53 in [0, 1) with equal probability.
//!
//! Because u depends on nothing but (seed, step), two samplers with the same seed produce the
//! same draws in any order, thread or process (docs/theory.md, "Drawing a token").

const MULTIPLIERS: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
const KEY_BUMP: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];

/// The Philox4x32-10 block function of Random123.
fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut x, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(KEY_BUMP[0]), k[1].wrapping_add(KEY_BUMP[1])];
        }
        let product0 = MULTIPLIERS[0] as u64 * x[0] as u64;
        let product1 = MULTIPLIERS[1] as u64 * x[2] as u64;
        x = [
            (product1 >> 32) as u32 ^ x[1] ^ k[0],
            product1 as u32,
            (product0 >> 32) as u32 ^ x[3] ^ k[1],
            product0 as u32,
        ];
    }
    x
}

/// What a draw is for: each purpose has its own stream of uniforms, so the draws of one step
/// are independent and none depends on how many others were made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Purpose {
    /// The sampler's inverse-CDF selection (plain decoding, and every target draw that is not
    /// one of the ones below).
    Select = 0,
    /// A draft model's choice of its drafted token (speculative decoding).
    Draft = 1,
    /// The acceptance test of a drafted token (speculative sampling).
    Accept = 2,
    /// The draw from the residual distribution after a rejection (speculative sampling).
    Residual = 3,
}

/// The uniform draw u_t in [0, 1) for decoding step `step` under `seed` (a multiple of 2^-53).
pub fn uniform(seed: u64, step: u64) -> f64 {
    uniform_for(seed, step, Purpose::Select)
}

/// The uniform draw for `purpose` at decoding step `step` under `seed`.
pub fn uniform_for(seed: u64, step: u64, purpose: Purpose) -> f64 {
    let key = [seed as u32, (seed >> 32) as u32];
    let block = philox4x32_10([step as u32, (step >> 32) as u32, purpose as u32, 0], key);
    let word = (block[0] as u64) << 32 | block[1] as u64;
    (word >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random123_known_answers() {
        // From Random123's kat_vectors: counter, key -> output.
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32_10([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn uniform_is_the_documented_function_of_the_block() {
        // seed 0, step 0 uses the all-zero block above: w = 0x6627e8d5_e169c58d.
        let expected = (0x6627_e8d5_e169_c58d_u64 >> 11) as f64 / 2f64.powi(53);
        assert_eq!(uniform(0, 0), expected);
        // Key and counter halves land where the doc says.
        let block = philox4x32_10([7, 1, 0, 0], [5, 3]);
        let w = (block[0] as u64) << 32 | block[1] as u64;
        assert_eq!(uniform(3 << 32 | 5, 1 << 32 | 7), (w >> 11) as f64 / 2f64.powi(53));
    }

    #[test]
    fn draws_lie_in_the_unit_interval_and_look_uniform() {
        let n = 100_000;
        let draws: Vec<f64> = (0..n).map(|t| uniform(42, t)).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        assert_ne!(uniform(1, 0), uniform(2, 0));
    }

    #[test]
    fn purposes_are_the_third_counter_word() {
        assert_eq!(uniform_for(9, 4, Purpose::Select), uniform(9, 4));
        let block = philox4x32_10([4, 0, Purpose::Residual as u32, 0], [9, 0]);
        let w = (block[0] as u64) << 32 | block[1] as u64;
        assert_eq!(uniform_for(9, 4, Purpose::Residual), (w >> 11) as f64 / 2f64.powi(53));
        let draws: Vec<f64> =
            [Purpose::Select, Purpose::Draft, Purpose::Accept, Purpose::Residual].map(|p| uniform_for(9, 4, p)).to_vec();
        assert!(draws.iter().enumerate().all(|(i, a)| draws[i + 1..].iter().all(|b| a != b)));
    }
}
