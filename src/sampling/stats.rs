//! Statistics of distributions: entropy and total variation.

use crate::error::{Error, Result};

/// Checks that `p` is a probability vector: non-empty, every entry finite in [0, 1], summing
/// to 1 within 1e-6 (the definitions assume a distribution; float32-normalized input passes).
pub(crate) fn check_distribution(p: &[f64]) -> Result<()> {
    if let Some(i) = p.iter().position(|v| !(0.0..=1.0).contains(v)) {
        return Err(Error::invalid_argument("p", format!("entry {i} is {}, not in [0, 1]", p[i])));
    }
    let total: f64 = p.iter().sum();
    if (total - 1.0).abs() > 1e-6 {
        return Err(Error::invalid_argument("p", format!("entries sum to {total}, not 1")));
    }
    Ok(())
}

/// The entropy H(p) = -sum_i p_i ln p_i in nats (terms with p_i = 0 are 0).
pub fn entropy(p: &[f64]) -> Result<f64> {
    check_distribution(p)?;
    Ok(-p.iter().filter(|&&x| x > 0.0).map(|&x| x * x.ln()).sum::<f64>())
}

/// The total variation distance (1/2) sum_i |p_i - q_i|, summed in id order (for a restriction
/// q = p_S it is the removed mass 1 - p(S): docs/theory.md, "Truncation is conditioning").
pub fn total_variation(p: &[f64], q: &[f64]) -> Result<f64> {
    check_distribution(p)?;
    check_distribution(q).map_err(|_| Error::invalid_argument("q", "must be a probability vector"))?;
    if p.len() != q.len() {
        return Err(Error::invalid_argument("q", format!("has {} entries but p has {}", q.len(), p.len())));
    }
    Ok(0.5 * p.iter().zip(q).map(|(a, b)| (a - b).abs()).sum::<f64>())
}
