//! The per-token elementwise steps between the matrix products: residual adds, RMSNorm,
//! the gated activations and the group sums the Q4_1 kernels read. A prefill splits its tokens across the
//! pool; every row is computed by one thread with the same ops whatever the split.

use super::config::Activation;
use crate::kernels::{elementwise, group_sums, group_sums_len, Isa};
use crate::threads::{split, ThreadPool};

/// Tokens below which a chunk is not worth a hand-off.
const MIN_TOKENS_PER_CHUNK: usize = 8;
/// Chunks per thread, so a descheduled thread delays the others by one small chunk at most.
const CHUNKS_PER_THREAD: usize = 4;

/// For each of `t_n` tokens: `x_t += add_t` (if `add`), then, if `norm` is given,
/// `xn_t = x_t / rms(x_t) * norm` (mean square accumulated in f64) and `gs_t` = group sums
/// of `xn_t`. Buffers are [T][d] (`gs`: [T][group_sums_len(d)]).
#[allow(clippy::too_many_arguments)]
pub fn residual_norm(
    pool: &ThreadPool,
    x: &mut [f32],
    add: Option<&[f32]>,
    norm: Option<&[f32]>,
    eps: f32,
    (t_n, d): (usize, usize),
    xn: &mut [f32],
    gs: &mut [f32],
) {
    let n = n_chunks(pool, t_n);
    let (xs, xns, gss) = (cut(x, d, t_n, n), cut(xn, d, t_n, n), cut(gs, group_sums_len(d), t_n, n));
    let mut pieces: Vec<_> = xs.into_iter().zip(xns).zip(gss).collect();
    pool.for_each_mut(&mut pieces, |c, ((x, xn), gs)| {
        let first = split(t_n, c, n).start;
        for (i, x_t) in x.chunks_exact_mut(d).enumerate() {
            if let Some(add) = add {
                let t = first + i;
                for (a, &b) in x_t.iter_mut().zip(&add[t * d..(t + 1) * d]) {
                    *a += b;
                }
            }
            if let Some(weight) = norm {
                let xn_t = &mut xn[i * d..(i + 1) * d];
                rms_norm(x_t, weight, eps, xn_t);
                group_sums(xn_t, &mut gs[i * group_sums_len(d)..(i + 1) * group_sums_len(d)]);
            }
        }
    });
}

/// For each of `t_n` tokens: `gate_t = act(gate_t) * up_t` ([`elementwise::swiglu`],
/// [`elementwise::geglu`]) and `gs_t` = its group sums. Buffers are [T][width] (`gs`:
/// [T][group_sums_len(width)]).
#[allow(clippy::too_many_arguments)]
pub fn gated(
    pool: &ThreadPool,
    isa: Isa,
    act: Activation,
    gate: &mut [f32],
    up: &[f32],
    width: usize,
    t_n: usize,
    gs: &mut [f32],
) {
    let n = n_chunks(pool, t_n);
    let mut pieces: Vec<_> = cut(gate, width, t_n, n).into_iter().zip(cut(gs, group_sums_len(width), t_n, n)).collect();
    pool.for_each_mut(&mut pieces, |c, (gate, gs)| {
        let rows = split(t_n, c, n);
        let up = &up[rows.start * width..rows.end * width];
        match act {
            Activation::Silu => elementwise::swiglu(isa, gate, up),
            Activation::GeluTanh => elementwise::geglu(isa, gate, up),
        }
        for (row, s) in gate.chunks_exact(width).zip(gs.chunks_exact_mut(group_sums_len(width))) {
            group_sums(row, s);
        }
    });
}

/// `x_t = x_t / rms(x_t) * weight` for each of the `t_n` rows of `x` ([T][d]).
pub fn norm_in_place(pool: &ThreadPool, x: &mut [f32], weight: &[f32], eps: f32, (t_n, d): (usize, usize)) {
    let mut pieces = cut(x, d, t_n, n_chunks(pool, t_n));
    pool.for_each_mut(&mut pieces, |_, x| {
        x.chunks_exact_mut(d).for_each(|row| rms_norm_in_place(row, weight, eps));
    });
}

/// Group sums of each of the `t_n` rows of `x` ([T][width]) into `gs` ([T][group_sums_len(width)]).
pub fn group_sums_rows(pool: &ThreadPool, x: &[f32], width: usize, t_n: usize, gs: &mut [f32]) {
    let n = n_chunks(pool, t_n);
    let mut pieces = cut(gs, group_sums_len(width), t_n, n);
    pool.for_each_mut(&mut pieces, |c, gs| {
        let rows = split(t_n, c, n);
        for (row, s) in x[rows.start * width..rows.end * width].chunks_exact(width).zip(gs.chunks_exact_mut(group_sums_len(width))) {
            group_sums(row, s);
        }
    });
}

/// `out = x / rms(x) * weight`, the mean square accumulated in f64.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let inv = inverse_rms(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = (v * inv) * w;
    }
}

/// `x = x / rms(x) * weight`, with the ops of [`rms_norm`].
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let inv = inverse_rms(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = (*v * inv) * w;
    }
}

/// `1 / sqrt(mean(x^2) + eps)`, the mean square accumulated in f64, rounded once to f32.
fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    let mean_sq = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    (1.0 / (mean_sq + eps as f64).sqrt()) as f32
}

fn n_chunks(pool: &ThreadPool, t_n: usize) -> usize {
    (t_n / MIN_TOKENS_PER_CHUNK).min(CHUNKS_PER_THREAD * pool.n_threads()).max(1)
}

/// The first `t_n` rows of `buf` ([T][width]) cut into the token ranges `split(t_n, c, n)`.
fn cut(buf: &mut [f32], width: usize, t_n: usize, n: usize) -> Vec<&mut [f32]> {
    let mut rest = &mut buf[..t_n * width];
    (0..n)
        .map(|c| {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(split(t_n, c, n).len() * width);
            rest = tail;
            piece
        })
        .collect()
}
