//! im2col / col2im: the unfolding that turns a convolution into a GEMM.
//!
//! For one sample and one group, `cols` is a `[cg·kh·kw, oh·ow]` matrix (or
//! the columns of one sample in a wider one, a GEMM over several samples)
//! whose row `(c, ki, kj)` holds, for every output position, the input
//! element that kernel tap meets (0 in the padding). Both directions work on
//! a band of output rows, so a large unfolding can be made and consumed a
//! cache-sized block at a time.

use std::ops::Range;

use super::Geom;
use crate::ops::softmax_backward::{as_f32, as_f32_mut};
use crate::simd::{kernels, Level};
use crate::{FloatElement, FloatMath};

/// Unfolds output rows `band` of `x` (one sample's `cg` channels,
/// `[cg, h, w]` row-major) into `cols`: `band.len()·ow` columns, rows
/// `ld ≥ band.len()·ow` elements apart (the elements between rows are left
/// as they are), each element through `cast` (to the math type, or the
/// identity where the GEMM packs the storage type itself).
pub fn im2col_strided<S: Copy, D: Copy + Default>(
    x: &[S],
    g: &Geom,
    band: Range<usize>,
    cols: &mut [D],
    ld: usize,
    cast: impl Fn(S) -> D,
) {
    let l = band.len() * g.ow;
    // Column of output row oy's first position.
    let at = |oy: usize| (oy - band.start) * g.ow;
    let mut row = 0;
    for c in 0..g.cg {
        let plane = &x[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            let ys = clip(
                valid(g.oh, g.stride[0], ki * g.dilation[0], g.padding[0], g.h),
                &band,
            );
            for kj in 0..g.kw {
                let xs = valid(g.ow, g.stride[1], kj * g.dilation[1], g.padding[1], g.w);
                let dst = &mut cols[row * ld..row * ld + l];
                let zero = D::default();
                if g.stride == [1, 1] && g.ow == g.w && !ys.is_empty() && !xs.is_empty() {
                    // "Same" width at stride 1: output row oy is input row
                    // oy + shift, so the whole tap row is one shifted copy
                    // of the plane (instead of one short copy per output
                    // row); the columns it wraps into are zeroed after.
                    let (e0, e1) = (at(ys.start) + xs.start, at(ys.end - 1) + xs.end);
                    let iy0 = ys.start + ki * g.dilation[0] - g.padding[0];
                    let s0 = iy0 * g.w + xs.start + kj * g.dilation[1] - g.padding[1];
                    for (o, &v) in dst[e0..e1].iter_mut().zip(&plane[s0..s0 + (e1 - e0)]) {
                        *o = cast(v);
                    }
                    dst[..at(ys.start)].fill(zero);
                    dst[at(ys.end)..].fill(zero);
                    for oy in ys.clone() {
                        let out = &mut dst[at(oy)..at(oy) + g.ow];
                        out[..xs.start].fill(zero);
                        out[xs.end..].fill(zero);
                    }
                    row += 1;
                    continue;
                }
                dst.fill(zero);
                for oy in ys.clone() {
                    let iy = oy * g.stride[0] + ki * g.dilation[0] - g.padding[0];
                    let src = &plane[iy * g.w..(iy + 1) * g.w];
                    let out = &mut dst[at(oy)..at(oy) + g.ow];
                    // An empty run (every output reads padding) has no
                    // first input to offset from: the loop below skips it.
                    if g.stride[1] == 1 && !xs.is_empty() {
                        // A run of consecutive inputs: a copy the compiler vectorises.
                        let x0 = xs.start + kj * g.dilation[1] - g.padding[1];
                        for (o, &v) in out[xs.clone()].iter_mut().zip(&src[x0..x0 + xs.len()]) {
                            *o = cast(v);
                        }
                    } else {
                        for ox in xs.clone() {
                            out[ox] = cast(src[ox * g.stride[1] + kj * g.dilation[1] - g.padding[1]]);
                        }
                    }
                }
                row += 1;
            }
        }
    }
}

/// The adjoint of [`im2col_strided`] for output rows `band`: adds every
/// entry of `cols` (rows `ld ≥ band.len()·ow` elements apart) into the
/// input position it was read from in `dx` (`[cg, h, w]`), in a fixed order.
pub fn col2im_strided<T: FloatElement + FloatMath>(
    cols: &[T],
    g: &Geom,
    band: Range<usize>,
    ld: usize,
    dx: &mut [T],
) {
    let l = band.len() * g.ow;
    let level = Level::best();
    let mut row = 0;
    for c in 0..g.cg {
        let plane = &mut dx[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            let ys = clip(
                valid(g.oh, g.stride[0], ki * g.dilation[0], g.padding[0], g.h),
                &band,
            );
            for kj in 0..g.kw {
                let xs = valid(g.ow, g.stride[1], kj * g.dilation[1], g.padding[1], g.w);
                let src = &cols[row * ld..row * ld + l];
                for oy in ys.clone() {
                    let iy = oy * g.stride[0] + ki * g.dilation[0] - g.padding[0];
                    let dst = &mut plane[iy * g.w..(iy + 1) * g.w];
                    let s = &src[(oy - band.start) * g.ow..][..g.ow];
                    if g.stride[1] == 1 && !xs.is_empty() {
                        let x0 = xs.start + kj * g.dilation[1] - g.padding[1];
                        add_into(level, &s[xs.clone()], &mut dst[x0..x0 + xs.len()]);
                    } else {
                        for ox in xs.clone() {
                            dst[ox * g.stride[1] + kj * g.dilation[1] - g.padding[1]] += s[ox];
                        }
                    }
                }
                row += 1;
            }
        }
    }
}

/// `y += x`, on the SIMD kernel for f32.
fn add_into<T: FloatElement + FloatMath>(level: Level, x: &[T], y: &mut [T]) {
    if let Some(x) = as_f32(x) {
        let y = as_f32_mut(y).expect("x and y have one type");
        return kernels::add_into(level, x, y);
    }
    for (d, &v) in y.iter_mut().zip(x) {
        *d += v;
    }
}

/// The part of `r` inside `band` (empty, at `band.start`, if none).
fn clip(r: Range<usize>, band: &Range<usize>) -> Range<usize> {
    let start = r.start.max(band.start);
    start..r.end.min(band.end).max(start)
}

/// The output positions `o < n_out` whose input index `o·stride + tap − pad`
/// lies in `0 .. size`.
fn valid(n_out: usize, stride: usize, tap: usize, pad: usize, size: usize) -> Range<usize> {
    // o·stride + tap ≥ pad  ⇔  o ≥ ceil((pad − tap) / stride)
    let lo = pad.saturating_sub(tap).div_ceil(stride);
    // o·stride + tap − pad ≤ size − 1  ⇔  o ≤ (size − 1 + pad − tap) / stride
    let hi = match (size + pad).checked_sub(tap + 1) {
        Some(v) => (v / stride + 1).min(n_out),
        None => 0,
    };
    lo.min(hi)..hi
}
