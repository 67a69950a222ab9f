//! conv2d (stride, padding, dilation, groups, depthwise), max/avg/adaptive
//! pooling and bilinear interpolation.

use proptest::prelude::*;
use tessera_tensor::ops::conv::Conv2dParams;
use tessera_tensor::ops::pool::Pool2dParams;

use super::{distinct_input, seen_var, view};
use crate::gradcheck::common::{check, close, fail, input_of, prop, Checked, Domain, Input};

/// Naive f64 conv2d: `x` `[n, c, h, w]`, `w` `[o, c/g, kh, kw]`.
fn naive_conv(
    x: &[f64],
    xs: &[usize],
    w: &[f64],
    ws: &[usize],
    b: Option<&[f64]>,
    p: &Conv2dParams,
) -> Vec<f64> {
    let (n, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
    let (o, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let og = o / p.groups;
    let out = |size: usize, k: usize, d: usize| {
        (size + 2 * p.padding[d] - p.dilation[d] * (k - 1) - 1) / p.stride[d] + 1
    };
    let (oh, ow) = (out(h, kh, 0), out(wd, kw, 1));
    let mut y = Vec::new();
    for ni in 0..n {
        for oi in 0..o {
            let gi = oi / og;
            for yi in 0..oh {
                for xi in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[oi]);
                    for ci in 0..cg {
                        for ki in 0..kh {
                            for kj in 0..kw {
                                let iy =
                                    (yi * p.stride[0] + ki * p.dilation[0]) as isize - p.padding[0] as isize;
                                let ix =
                                    (xi * p.stride[1] + kj * p.dilation[1]) as isize - p.padding[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let xc = gi * cg + ci;
                                acc += x[((ni * c + xc) * h + iy as usize) * wd + ix as usize]
                                    * w[((oi * cg + ci) * kh + ki) * kw + kj];
                            }
                        }
                    }
                    y.push(acc);
                }
            }
        }
    }
    y
}

/// Gradchecks conv2d of `x`, `w` (and bias `b` when `bias`) and checks the
/// forward against [`naive_conv`].
fn conv_check(
    x: Input,
    w: Input,
    b: Input,
    bias: bool,
    p: Conv2dParams,
) -> Result<tessera_autograd::GradcheckReport, TestCaseError> {
    let report = if bias {
        check(&[x.leaf(), w.leaf(), b.leaf()], |xs| {
            view(&x, &xs[0])?.conv2d(&view(&w, &xs[1])?, Some(&view(&b, &xs[2])?), &p)
        })?
    } else {
        check(&[x.leaf(), w.leaf()], |xs| {
            view(&x, &xs[0])?.conv2d(&view(&w, &xs[1])?, None, &p)
        })?
    };
    let bv = b.seen();
    let want = naive_conv(
        &x.seen(),
        &x.shape,
        &w.seen(),
        &w.shape,
        bias.then_some(&bv[..]),
        &p,
    );
    let b_var = bias.then(|| seen_var(&b)).transpose()?;
    let y = seen_var(&x)?
        .conv2d(&seen_var(&w)?, b_var.as_ref(), &p)
        .map_err(fail)?;
    close(y.tensor(), &want, 1e-12)?;
    Ok(report)
}

pub fn conv2d_case(n: u32) -> Checked {
    // (batch, groups, channels per group, outputs per group, kernel, stride, padding, dilation, extra size, bias)
    let s = (
        1usize..=2,
        1usize..=2,
        1usize..=2,
        1usize..=2,
        1usize..=3,
        1usize..=2,
        0usize..=1,
        1usize..=2,
        0usize..=2,
        any::<bool>(),
    )
        .prop_flat_map(|(nb, g, cg, og, k, st, pd, dl, extra, bias)| {
            let size = (dl * (k - 1) + 1 + extra).saturating_sub(2 * pd).max(1);
            let p = Conv2dParams {
                stride: [st, 1],
                padding: [pd, pd],
                dilation: [dl, 1],
                groups: g,
            };
            (
                input_of(vec![nb, g * cg, size, size + 1], Domain::Any),
                input_of(vec![g * og, cg, k, k.min(2)], Domain::Any),
                input_of(vec![g * og], Domain::Any),
                Just(bias),
                Just(p),
            )
        });
    prop(n, s, |(x, w, b, bias, p)| conv_check(x, w, b, bias, p))
}

pub fn conv2d_depthwise_case(n: u32) -> Checked {
    let s = (1usize..=3, 1usize..=2, 1usize..=2).prop_flat_map(|(c, mult, st)| {
        let p = Conv2dParams::default().groups(c).padding(1).stride(st);
        (
            input_of(vec![1, c, 4, 3], Domain::Any),
            input_of(vec![c * mult, 1, 3, 3], Domain::Any),
            input_of(vec![c * mult], Domain::Any),
            Just(true),
            Just(p),
        )
    });
    prop(n, s, |(x, w, b, bias, p)| conv_check(x, w, b, bias, p))
}

pub fn max_pool2d_case(n: u32) -> Checked {
    let s = (
        1usize..=3,
        1usize..=2,
        1usize..=2,
        any::<bool>(),
        0usize..=2,
        any::<bool>(),
    )
        .prop_flat_map(|(k, st, dl, pad, extra, ceil)| {
            let mut p = Pool2dParams::new(k).stride(st).dilation(dl).ceil_mode(ceil);
            p = p.padding(if pad { k / 2 } else { 0 });
            let size = dl * (k - 1) + 1 + extra;
            (distinct_input(vec![2, size, size + 1]), Just(p))
        });
    prop(n, s, |(x, p)| {
        // Windows that meet only padding are an error (PyTorch gives −∞).
        prop_assume!(x.leaf().max_pool2d(&p).is_ok());
        let report = check(&[x.leaf()], |xs| view(&x, &xs[0])?.max_pool2d(&p))?;
        // Forward: the pooled values are those at the returned indices.
        let (y, idx) = seen_var(&x)?.max_pool2d_with_indices(&p).map_err(fail)?;
        let plane = x.shape[1] * x.shape[2];
        let seen = x.seen();
        let idx = idx.contiguous().unwrap().to_vec::<i64>().map_err(fail)?;
        let per = idx.len() / x.shape[0];
        let want: Vec<f64> = idx
            .iter()
            .enumerate()
            .map(|(i, &j)| seen[(i / per) * plane + j as usize])
            .collect();
        close(y.tensor(), &want, 0.0)?;
        Ok(report)
    })
}

pub fn avg_pool2d_case(n: u32) -> Checked {
    let s = (
        1usize..=3,
        1usize..=2,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(1usize..=4),
        0usize..=2,
    )
        .prop_flat_map(|(k, st, pad, ceil, include, div, extra)| {
            let mut p = Pool2dParams::new(k)
                .stride(st)
                .ceil_mode(ceil)
                .padding(if pad { k / 2 } else { 0 });
            p.count_include_pad = include;
            p.divisor_override = div;
            (input_of(vec![1, 2, k + extra, k + 1], Domain::Any), Just(p))
        });
    prop(n, s, |(x, p)| {
        check(&[x.leaf()], |xs| view(&x, &xs[0])?.avg_pool2d(&p))
    })
}

pub fn adaptive_avg_pool2d_case(n: u32) -> Checked {
    let s = (1usize..=5, 1usize..=5, 1usize..=4, 1usize..=4)
        .prop_flat_map(|(h, w, oh, ow)| (input_of(vec![1, 2, h, w], Domain::Any), Just([oh, ow])));
    prop(n, s, |(x, out)| {
        let report = check(&[x.leaf()], |xs| view(&x, &xs[0])?.adaptive_avg_pool2d(out))?;
        // Forward: output 1×1 is the plane mean.
        let y = seen_var(&x)?.adaptive_avg_pool2d([1, 1]).map_err(fail)?;
        let seen = x.seen();
        let plane = x.shape[2] * x.shape[3];
        let want: Vec<f64> = seen
            .chunks(plane)
            .map(|c| c.iter().sum::<f64>() / plane as f64)
            .collect();
        close(y.tensor(), &want, 1e-12)?;
        Ok(report)
    })
}

pub fn interpolate_case(n: u32) -> Checked {
    let s = (
        1usize..=3,
        1usize..=3,
        1usize..=5,
        1usize..=5,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(h, w, oh, ow, by_size, align)| {
            let (size, scale) = if by_size {
                (Some([oh, ow]), None)
            } else {
                (None, Some([1.0 + oh as f64 * 0.4, 0.75 + ow as f64 * 0.5]))
            };
            (
                input_of(vec![1, 2, h, w], Domain::Any),
                Just((size, scale, align)),
            )
        });
    prop(n, s, |(x, (size, scale, align))| {
        let report = check(&[x.leaf()], |xs| {
            view(&x, &xs[0])?.interpolate_bilinear(size, scale, align)
        })?;
        // Forward: resampling to the same size is the identity.
        let same = [x.shape[2], x.shape[3]];
        let y = seen_var(&x)?
            .interpolate_bilinear(Some(same), None, align)
            .map_err(fail)?;
        close(y.tensor(), &x.seen(), 1e-12)?;
        Ok(report)
    })
}
