//! The f32 layer-norm kernels on SIMD rows: the forward computes each row's
//! statistics and writes it in one parallel task; the backward writes dx and
//! accumulates dweight/dbias per fixed block of rows, merged in block order,
//! so nothing depends on the thread count.

use rayon::prelude::*;

use crate::simd::{kernels, norm, Level};
use crate::strided::PAR_THRESHOLD;
use crate::{Result, Tensor};

/// Rows per block of the backward's parameter-gradient partial sums.
const PART_ROWS: usize = 32;

/// y, mean and rstd of layer norm over rows of `k > 0` elements of `x`
/// (`y` shaped `shape`); an empty `w` or `b` means 1 or 0.
pub(crate) fn forward(
    x: &[f32],
    k: usize,
    eps: f32,
    w: &[f32],
    b: &[f32],
    shape: &[usize],
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    let rows = x.len() / k;
    let (mut mean, mut rstd) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    let level = Level::best();
    let y = Tensor::build_overwrite::<f32>("layer_norm", shape, |y| {
        y.par_chunks_mut(k)
            .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
            .enumerate()
            .with_min_len((PAR_THRESHOLD / k).max(1))
            .for_each(|(r, (yr, (m, s)))| {
                let xr = &x[r * k..(r + 1) * k];
                let mu = kernels::sum(level, xr) / k as f32;
                let var = kernels::sum_sq_dev(level, xr, mu) / k as f32;
                let rs = 1.0 / (var + eps).sqrt();
                norm::layer_norm_row(level, xr, mu, rs, w, b, yr);
                (*m, *s) = (mu, rs);
            })
    })?;
    Ok((y, mean, rstd))
}

/// dx (shaped `shape`), dweight and dbias of layer norm over rows of `k > 0`
/// elements; an empty `w` means 1.
pub(crate) fn backward(
    dy: &[f32],
    x: &[f32],
    k: usize,
    mean: &[f32],
    rstd: &[f32],
    w: &[f32],
    shape: &[usize],
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    let rows = x.len() / k;
    let parts = rows.div_ceil(PART_ROWS);
    let mut partial = vec![0.0f32; parts * 2 * k];
    let level = Level::best();
    let dx = Tensor::build_overwrite::<f32>("layer_norm_backward", shape, |dx| {
        dx.par_chunks_mut(PART_ROWS * k)
            .zip(partial.par_chunks_mut(2 * k))
            .enumerate()
            .for_each(|(p, (dxp, acc))| {
                let (dw, db) = acc.split_at_mut(k);
                for (i, dxr) in dxp.chunks_mut(k).enumerate() {
                    let r = p * PART_ROWS + i;
                    let span = r * k..(r + 1) * k;
                    norm::layer_norm_backward_row(
                        level,
                        &x[span.clone()],
                        &dy[span],
                        w,
                        mean[r],
                        rstd[r],
                        dxr,
                        dw,
                        db,
                    );
                }
            })
    })?;
    let (mut dw, mut db) = (vec![0.0f64; k], vec![0.0f64; k]);
    for acc in partial.chunks(2 * k) {
        for c in 0..k {
            dw[c] += acc[c] as f64;
            db[c] += acc[k + c] as f64;
        }
    }
    let to_f32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect();
    Ok((dx, to_f32(dw), to_f32(db)))
}
