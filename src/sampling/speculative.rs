//! The acceptance rule of speculative sampling (Leviathan, Kalman, Matias 2023; Chen et al.
//! 2023), over two distributions given as vectors: the target's final distribution q and the
//! drafter's r, from which the drafted token x was drawn.
//!
//! x is kept with probability min(1, q(x) / r(x)); otherwise the token is drawn from the
//! residual distribution max(0, q - r) / sum max(0, q - r). Whatever r is, the token returned
//! is then distributed exactly as q: P(y) = r(y) min(1, q(y)/r(y)) + (1 - sum_x min(r(x),
//! q(x))) max(0, q(y) - r(y)) / sum max(0, q - r) = min(r(y), q(y)) + max(0, q(y) - r(y)) = q(y),
//! because sum max(0, q - r) = 1 - sum min(r, q). The token is x exactly when x was accepted: a
//! rejection needs q(x) < r(x), where the residual is 0.

/// The token drawn from the distribution proportional to the non-negative `weights` with the
/// uniform `u` in [0, 1): the first id j with w_j > 0 whose running sum C_j (f64, in id order)
/// exceeds u * C_N, or the last positive one if rounding leaves none. `None` when every weight
/// is 0.
pub fn draw_proportional(weights: impl Iterator<Item = f64> + Clone, u: f64) -> Option<u32> {
    let total: f64 = weights.clone().fold(0.0, |sum, w| sum + w);
    if total <= 0.0 {
        return None;
    }
    let target = u * total;
    let (mut sum, mut last) = (0.0, None);
    for (id, w) in weights.enumerate() {
        if w > 0.0 {
            sum += w;
            last = Some(id as u32);
            if sum > target {
                break;
            }
        }
    }
    last
}

/// Speculative sampling of the drafted token `drafted`, drawn from `r`, against the target's
/// `q` (both over the whole vocabulary, zeros outside their supports): the accepted draft or
/// the residual draw (see the [module docs](self)). `u_accept` and `u_residual` are
/// independent uniforms in [0, 1).
///
/// Accepting when `u_accept * r(x) < q(x)` has probability min(1, q(x)/r(x)) for a uniform on
/// the grid of multiples of 2^-53 (up to that grid's rounding). If q and r are so close that
/// the residual has no mass left in f64, the draw falls back to q itself.
pub fn verify_draft(q: &[f64], r: &[f64], drafted: u32, u_accept: f64, u_residual: f64) -> u32 {
    let x = drafted as usize;
    if u_accept * r[x] < q[x] {
        return drafted;
    }
    let residual = q.iter().zip(r).map(|(&q, &r)| (q - r).max(0.0));
    draw_proportional(residual, u_residual)
        .or_else(|| draw_proportional(q.iter().copied(), u_residual))
        .expect("q is a distribution: some entry is positive")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportional_draws_follow_the_cumulative_sums() {
        let w = [0.0, 1.0, 0.0, 3.0];
        assert_eq!(draw_proportional(w.iter().copied(), 0.0), Some(1));
        assert_eq!(draw_proportional(w.iter().copied(), 0.2499), Some(1));
        assert_eq!(draw_proportional(w.iter().copied(), 0.25), Some(3));
        assert_eq!(draw_proportional(w.iter().copied(), 0.999), Some(3));
        assert_eq!(draw_proportional([0.0, 0.0].iter().copied(), 0.5), None);
    }

    /// The exact output distribution of `verify_draft` for a drafter r, by integrating over
    /// the draft and both uniforms on a fine grid: it must be q.
    #[test]
    fn the_output_distribution_is_q_for_any_drafter() {
        let q = [0.5, 0.3, 0.2, 0.0];
        let drafters: [[f64; 4]; 4] =
            [[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7], [0.0, 0.0, 0.0, 1.0], [0.6, 0.4, 0.0, 0.0]];
        let grid = 1000;
        for r in drafters {
            let mut p = [0.0; 4];
            for x in 0..4 {
                if r[x] == 0.0 {
                    continue;
                }
                for a in 0..grid {
                    let ua = (a as f64 + 0.5) / grid as f64;
                    // The residual draw's distribution, integrated over its uniform.
                    for b in 0..grid {
                        let ub = (b as f64 + 0.5) / grid as f64;
                        p[verify_draft(&q, &r, x as u32, ua, ub) as usize] += r[x] / (grid * grid) as f64;
                    }
                }
            }
            for (got, want) in p.iter().zip(q) {
                assert!((got - want).abs() < 2e-3, "drafter {r:?}: {p:?} vs {q:?}");
            }
        }
    }
}
