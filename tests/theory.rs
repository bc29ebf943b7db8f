//! docs/theory.md's temperature, ranking, top-k, top-p and restriction, with its worked
//! examples, as tests of the free functions (which run the sampler's own code).

use crate::toy;

use toy::TestRng;
use reprolm::sampling::{entropy, restrict, softmax, top_k_set, top_p_set, total_variation};

fn assert_close(actual: f64, expected: f64, tolerance: f64) {
    assert!((actual - expected).abs() <= tolerance, "{actual} vs {expected} (tolerance {tolerance})");
}

/// Rounds to 4 decimals like the table in docs/theory.md, "Temperature".
fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

#[test]
fn temperature_table_for_logits_2_1_0_to_four_decimals() {
    let table = [
        (0.1, [1.0000, 0.0000, 0.0000], 0.0005),
        (0.5, [0.8668, 0.1173, 0.0159], 0.4411),
        (1.0, [0.6652, 0.2447, 0.0900], 0.8324),
        (2.0, [0.5065, 0.3072, 0.1863], 1.0202),
        (100.0, [0.3367, 0.3333, 0.3300], 1.0986),
    ];
    for (tau, expected_p, expected_h) in table {
        let p = softmax(&[2.0, 1.0, 0.0], tau).unwrap();
        assert_eq!(p.iter().map(|&x| round4(x)).collect::<Vec<_>>(), expected_p, "tau = {tau}");
        assert_eq!(round4(entropy(&p).unwrap()), expected_h, "tau = {tau}");
    }
    assert_eq!(round4(3f64.ln()), 1.0986);
}

#[test]
fn temperature_limits() {
    // tau -> 0+: mass 1/|I| on the maxima; tau -> infinity: uniform.
    let z = [1.0, 3.0, -2.0, 3.0, 0.5];
    let cold = softmax(&z, 1e-3).unwrap();
    assert_eq!(cold, vec![0.0, 0.5, 0.0, 0.5, 0.0]);
    let hot = softmax(&z, 1e9).unwrap();
    hot.iter().for_each(|&p| assert_close(p, 0.2, 1e-8));
    // Temperature 0 itself is the greedy branch: the lowest-id argmax.
    assert_eq!(softmax(&z, 0.0).unwrap(), vec![0.0, 1.0, 0.0, 0.0, 0.0]);
}

#[test]
fn temperature_preserves_the_order() {
    let mut rng = TestRng::new(43);
    for _ in 0..200 {
        let n = 2 + rng.below(30);
        // Logits on a grid of 1/8 so that ties occur and distinct values are well separated.
        let z: Vec<f64> = (0..n).map(|_| (rng.below(40) as f64 - 20.0) / 8.0).collect();
        let tau = rng.range(0.1, 10.0);
        let p = softmax(&z, tau).unwrap();
        for i in 0..n {
            for j in 0..n {
                if z[i] > z[j] {
                    assert!(p[i] > p[j], "z {} > {} but p {} <= {}", z[i], z[j], p[i], p[j]);
                } else if z[i] == z[j] {
                    assert_eq!(p[i].to_bits(), p[j].to_bits());
                }
            }
        }
    }
}

/// H(p_tau) and Var_{p_tau}(z) for logits z.
fn entropy_and_variance(z: &[f64], tau: f64) -> (f64, f64) {
    let p = softmax(z, tau).unwrap();
    let mean: f64 = p.iter().zip(z).map(|(p, z)| p * z).sum();
    let variance: f64 = p.iter().zip(z).map(|(p, z)| p * (z - mean).powi(2)).sum();
    (entropy(&p).unwrap(), variance)
}

#[test]
fn entropy_grows_with_temperature_at_rate_variance_over_tau_cubed() {
    let mut rng = TestRng::new(44);
    for _ in 0..50 {
        let n = 2 + rng.below(50);
        let z: Vec<f64> = (0..n).map(|_| rng.normal() * 3.0).collect();
        let mut previous = 0.0;
        let mut tau = 0.05;
        while tau < 200.0 {
            let (h, variance) = entropy_and_variance(&z, tau);
            assert!(h >= previous - 1e-12, "entropy fell from {previous} to {h} at tau = {tau}");
            previous = h;
            // Central difference against Var(z) / tau^3.
            let step = tau * 1e-4;
            let slope =
                (entropy_and_variance(&z, tau + step).0 - entropy_and_variance(&z, tau - step).0) / (2.0 * step);
            let expected = variance / tau.powi(3);
            assert!(
                (slope - expected).abs() <= 1e-6 * expected.max(1.0) + 1e-9,
                "tau {tau}: dH/dtau {slope} vs Var/tau^3 {expected}"
            );
            tau *= 1.3;
        }
        assert!(previous <= (n as f64).ln() + 1e-12);
    }
}

#[test]
fn two_token_temperature_for_probability_0_9() {
    let tau = 1.0 / 9f64.ln();
    let p = softmax(&[1.0, 0.0], tau).unwrap();
    assert_close(p[0], 0.9, 1e-15);
    assert_close(tau, 0.455, 5e-4);
    let p1 = softmax(&[1.0, 0.0], 1.0).unwrap();
    assert_close(p1[0], 0.731, 5e-4);
    assert_close(p1[1], 0.269, 5e-4);
    let (h1, h_tau) = (entropy(&p1).unwrap(), entropy(&p).unwrap());
    assert_close(h1, 0.582, 5e-4);
    assert_close(h_tau, 0.325, 5e-4);
    assert!(h_tau < h1);
}

#[test]
fn top_p_compares_exact_cumulative_sums() {
    let p = [0.5, 0.2, 0.2, 0.1];
    // The rounding artifact: a naive float cumulative sum stays below 0.9...
    assert!(p[..3].iter().sum::<f64>() < 0.9);
    // ...but the exact c_3 reaches it, so k(0.9) = 3.
    assert_eq!(top_p_set(&p, 0.9).unwrap(), vec![0, 1, 2]);
    assert_eq!(top_p_set(&p, 0.6).unwrap(), vec![0, 1]);
    assert_eq!(top_p_set(&p, 0.3).unwrap(), vec![0]);
    assert_eq!(top_p_set(&p, 1.0).unwrap(), vec![0, 1, 2, 3]);
    let q = restrict(&p, &[0, 1]).unwrap();
    assert_eq!(q.iter().map(|&x| (x * 1e3).round() / 1e3).collect::<Vec<_>>(), vec![0.714, 0.286, 0.0, 0.0]);
    assert_eq!(top_k_set(&p, 2).unwrap(), vec![0, 1]);
    // The size of the nucleus follows the shape of the distribution.
    assert_eq!(top_p_set(&[0.97, 0.01, 0.01, 0.01], 0.9).unwrap(), vec![0]);
    assert_eq!(top_p_set(&[0.25; 4], 0.9).unwrap(), vec![0, 1, 2, 3]);
}

#[test]
fn top_p_sets_restriction_and_removed_mass_of_a_five_token_distribution() {
    let p = [0.4, 0.3, 0.15, 0.1, 0.05];
    assert_eq!(top_p_set(&p, 0.5).unwrap(), vec![0, 1]);
    assert_eq!(top_p_set(&p, 0.8).unwrap(), vec![0, 1, 2]);
    assert_eq!(top_p_set(&p, 0.95).unwrap(), vec![0, 1, 2, 3]);
    let q = restrict(&p, &[0, 1, 2]).unwrap();
    let expected = [0.471, 0.353, 0.176, 0.0, 0.0];
    q.iter().zip(expected).for_each(|(&a, b)| assert_close(a, b, 5e-4));
    let tv = total_variation(&p, &q).unwrap();
    assert_close(tv, 0.15, 1e-15);
    assert!(tv <= 1.0 - 0.8);
}

/// A random distribution with ties: multiples of 2^-10 (so every sum below is exact in f64).
fn dyadic_distribution(rng: &mut TestRng, n: usize) -> Vec<f64> {
    let mut weights: Vec<u32> = (0..n).map(|_| rng.below(6) as u32).collect();
    weights[rng.below(n)] += 1;
    let total: u32 = weights.iter().sum();
    // Scale to 1024 units, putting the remainder on the first positive weight's token.
    let mut units: Vec<u32> = weights.iter().map(|w| w * 1024 / total).collect();
    let missing = 1024 - units.iter().sum::<u32>();
    let first = units.iter().position(|&u| u > 0).unwrap();
    units[first] += missing;
    units.iter().map(|&u| u as f64 / 1024.0).collect()
}

/// The ranking pi (probability descending, ties by ascending id) by a stable sort.
fn ranking(p: &[f64]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..p.len() as u32).collect();
    order.sort_by(|&a, &b| p[b as usize].total_cmp(&p[a as usize])); // stable: ties by id
    order
}

fn mass(p: &[f64], set: impl IntoIterator<Item = u32>) -> f64 {
    set.into_iter().map(|i| p[i as usize]).sum()
}

#[test]
fn top_k_and_top_p_are_maximal_minimal_and_monotone_with_ties() {
    let mut rng = TestRng::new(51);
    for _ in 0..400 {
        let n = 1 + rng.below(8);
        let p = dyadic_distribution(&mut rng, n);
        let pi = ranking(&p);
        let c: Vec<f64> = (1..=n).map(|j| mass(&p, pi[..j].iter().copied())).collect();
        let subsets: Vec<Vec<u32>> =
            (0u32..1 << n).map(|bits| (0..n as u32).filter(|i| bits >> i & 1 == 1).collect()).collect();

        // Top-k is the first k of pi; c_j is the largest mass of a j-set.
        for k in 1..=n {
            assert_eq!(top_k_set(&p, k).unwrap(), pi[..k]);
            let best = subsets.iter().filter(|t| t.len() == k).map(|t| mass(&p, t.iter().copied())).fold(0.0, f64::max);
            assert_eq!(best, c[k - 1]);
        }

        // Thresholds: every c_j exactly, values just around them, and random ones.
        let mut rhos: Vec<f64> = c.iter().flat_map(|&x| [x, x.next_down(), x.next_up().min(1.0)]).collect();
        rhos.extend((0..5).map(|_| rng.range(1e-9, 1.0)));
        rhos.retain(|&r| r > 0.0);
        rhos.sort_by(f64::total_cmp);
        let mut previous: Vec<u32> = Vec::new();
        for &rho in &rhos {
            let set = top_p_set(&p, rho).unwrap();
            // The top-p set: k(rho) = min{ j : c_j >= rho }.
            let k = c.iter().position(|&cj| cj >= rho).unwrap() + 1;
            assert_eq!(set, pi[..k], "p {p:?} rho {rho}");
            // Minimality: no smaller set reaches rho.
            let smallest = subsets.iter().filter(|t| mass(&p, t.iter().copied()) >= rho).map(Vec::len).min();
            assert_eq!(smallest, Some(k));
            // Largest mass among k-sets, and the only one when the p_i are distinct.
            let top = subsets.iter().filter(|t| t.len() == k).map(|t| mass(&p, t.iter().copied()));
            assert_eq!(top.clone().fold(0.0, f64::max), mass(&p, set.iter().copied()));
            let distinct = (0..n).all(|i| (0..i).all(|j| p[i] != p[j]));
            if distinct {
                assert_eq!(top.filter(|&m| m == c[k - 1]).count(), 1);
            }
            // Monotonicity: thresholds ascend, sets grow as prefixes.
            assert!(set.starts_with(&previous), "{previous:?} not in {set:?}");
            previous = set;
            // The ends: a threshold up to the largest probability keeps the greedy token alone.
            if rho <= p[pi[0] as usize] {
                assert_eq!(previous, vec![pi[0]]);
            }
        }
        let support: Vec<u32> = pi.iter().copied().filter(|&i| p[i as usize] > 0.0).collect();
        assert_eq!(top_p_set(&p, 1.0).unwrap(), support);
    }
}

#[test]
fn top_p_is_monotone_on_random_float_distributions() {
    let mut rng = TestRng::new(54);
    for _ in 0..300 {
        let n = 1 + rng.below(200);
        let z: Vec<f64> = (0..n).map(|_| (rng.normal() * 2.0 * 4.0).round() / 4.0).collect();
        let p = softmax(&z, rng.range(0.3, 3.0)).unwrap();
        let mut rhos: Vec<f64> = (0..10).map(|_| rng.range(1e-6, 1.0)).collect();
        rhos.sort_by(f64::total_cmp);
        let pi = ranking(&p);
        let mut previous: Vec<u32> = Vec::new();
        for rho in rhos {
            let set = top_p_set(&p, rho).unwrap();
            assert_eq!(set, pi[..set.len()], "top-p is a prefix of the ranking");
            assert!(set.starts_with(&previous));
            previous = set;
        }
    }
}

#[test]
fn restriction_is_conditioning() {
    let mut rng = TestRng::new(52);
    for _ in 0..300 {
        let n = 1 + rng.below(40);
        let z: Vec<f64> = (0..n).map(|_| rng.normal() * 2.0).collect();
        let p = softmax(&z, 1.0).unwrap();
        let mut set: Vec<u32> = (0..n as u32).filter(|_| rng.below(2) == 0).collect();
        if set.is_empty() {
            set.push(rng.below(n) as u32);
        }
        let p_set = mass(&p, set.iter().copied());
        let q = restrict(&p, &set).unwrap();
        // 1. A distribution supported on S, equal to p_i / p(S) there.
        assert_close(q.iter().sum(), 1.0, 1e-14);
        for (i, &qi) in q.iter().enumerate() {
            if set.contains(&(i as u32)) {
                assert_close(qi, p[i] / p_set, 1e-15);
            } else {
                assert_eq!(qi, 0.0);
            }
        }
        // 2. Ratios inside S are unchanged.
        for &i in &set {
            for &j in &set {
                let (i, j) = (i as usize, j as usize);
                assert_close(q[i] / q[j], p[i] / p[j], 1e-13 * (p[i] / p[j]).max(1.0));
            }
        }
        // 3. TV(p, p_S) = 1 - p(S).
        assert_close(total_variation(&p, &q).unwrap(), 1.0 - p_set, 1e-14);
    }
}
