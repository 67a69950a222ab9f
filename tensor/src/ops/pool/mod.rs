//! 2-D pooling over the last two dimensions of `[N, C, H, W]` or `[C, H, W]`
//! tensors, with PyTorch's window and output-size rules: max pooling with
//! indices, average pooling, adaptive average pooling, and their backwards.
//!
//! Every output plane is independent, so planes run in parallel; backwards
//! accumulate within one plane in a fixed order (results never depend on the
//! thread count). Float dtypes only; f16/bf16 accumulate in f32.

mod adaptive;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod max_2x2;
#[cfg(test)]
mod tests;

pub use adaptive::adaptive_avg_pool2d_backward;
pub(crate) use adaptive::{cpu_adaptive_avg_pool2d, cpu_adaptive_avg_pool2d_backward};

use rayon::prelude::*;

use crate::ops::norm_common::check_float;
use crate::{Error, FloatElement, FloatMath, Result, Tensor};

/// Window parameters of [`Tensor::max_pool2d`] and [`Tensor::avg_pool2d`],
/// as `(height, width)` pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool2dParams {
    /// Window size.
    pub kernel: [usize; 2],
    /// Step between windows (PyTorch's default is the kernel size).
    pub stride: [usize; 2],
    /// Implicit padding on both sides (at most half the kernel).
    pub padding: [usize; 2],
    /// Spacing between window taps (max pooling only; must be 1 for average pooling).
    pub dilation: [usize; 2],
    /// Round the output size up instead of down (a last window may start in
    /// the input or left padding, never in the right padding).
    pub ceil_mode: bool,
    /// Average pooling: divide by the window size including padding (true,
    /// PyTorch's default) or by the number of input elements in it.
    pub count_include_pad: bool,
    /// Average pooling: divide by this instead of the window size.
    pub divisor_override: Option<usize>,
}

impl Pool2dParams {
    /// A square `k×k` window with PyTorch's defaults: stride `k`, no
    /// padding, dilation 1, floor mode, padding counted in averages.
    pub fn new(k: usize) -> Self {
        Pool2dParams {
            kernel: [k, k],
            stride: [k, k],
            padding: [0, 0],
            dilation: [1, 1],
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }

    /// The same window with `stride` in both dimensions.
    pub fn stride(mut self, stride: usize) -> Self {
        self.stride = [stride, stride];
        self
    }

    /// The same window with `padding` in both dimensions.
    pub fn padding(mut self, padding: usize) -> Self {
        self.padding = [padding, padding];
        self
    }

    /// The same window with `dilation` in both dimensions.
    pub fn dilation(mut self, dilation: usize) -> Self {
        self.dilation = [dilation, dilation];
        self
    }

    /// The same window with `ceil_mode` set.
    pub fn ceil_mode(mut self, ceil_mode: bool) -> Self {
        self.ceil_mode = ceil_mode;
        self
    }
}

impl Tensor {
    /// Max pooling over the last two dimensions of a 3-D or 4-D tensor. A
    /// NaN in a window is its maximum.
    ///
    /// Errors when the tensor is not 3-D/4-D or not float, a kernel, stride
    /// or dilation is 0, the padding exceeds half the kernel, the output
    /// would be empty, or a dilated window would meet only padding (where
    /// PyTorch returns -inf).
    pub fn max_pool2d(&self, p: &Pool2dParams) -> Result<Tensor> {
        Ok(self.max_pool2d_with_indices(p)?.0)
    }

    /// [`Tensor::max_pool2d`] also returning, as an i64 tensor of the same
    /// shape, the index of each maximum in its flattened `H·W` input plane
    /// (PyTorch's `return_indices=True`). Errors as [`Tensor::max_pool2d`].
    pub fn max_pool2d_with_indices(&self, p: &Pool2dParams) -> Result<(Tensor, Tensor)> {
        const OP: &str = "max_pool2d";
        let g = Window::new(OP, self, p)?;
        if (0..g.oh).any(|o| g.max_taps(0, o).len() == 0) || (0..g.ow).any(|o| g.max_taps(1, o).len() == 0) {
            return Err(Error::shape(
                OP,
                format!(
                    "a dilated window meets no input element: input {:?}, {p:?}",
                    self.shape()
                ),
            ));
        }
        crate::backend::dispatch(OP, &[self])?.max_pool2d(self, &g)
    }

    /// Average pooling over the last two dimensions of a 3-D or 4-D tensor
    /// (`dilation` must be 1). Windows entirely in the padding give 0.
    ///
    /// Errors as [`Tensor::max_pool2d`], and when `divisor_override` is 0.
    pub fn avg_pool2d(&self, p: &Pool2dParams) -> Result<Tensor> {
        const OP: &str = "avg_pool2d";
        let be = crate::backend::dispatch(OP, &[self])?;
        let g = Window::new(OP, self, p)?;
        g.check_avg(OP)?;
        be.avg_pool2d(self, &g)
    }
}

/// The CPU kernel of [`Tensor::avg_pool2d`] (input and window checked).
pub(crate) fn cpu_avg_pool2d(x: &Tensor, g: &Window) -> Result<Tensor> {
    crate::with_float_dtype!(x.dtype(), S => avg_forward::<S>(x, g),
        else unreachable!("Window::new admits only floats"))
}

/// The gradient of [`Tensor::max_pool2d`] with respect to its input of shape
/// `input_shape`: each element of `grad_out` is added at the input position
/// its `indices` entry names. Returns `input_shape` in `grad_out`'s dtype.
///
/// Errors when the shapes differ from each other or do not fit
/// `input_shape`, `indices` is not i64, or an index is outside `0 .. H·W`.
pub fn max_pool2d_backward(grad_out: &Tensor, indices: &Tensor, input_shape: &[usize]) -> Result<Tensor> {
    const OP: &str = "max_pool2d_backward";
    let (planes, _, _) = plane_dims(OP, input_shape)?;
    if indices.dtype() != crate::DType::I64 || grad_out.shape() != indices.shape() {
        return Err(Error::shape(
            OP,
            format!(
                "grad_out {:?} and indices {:?} ({}) must have one shape and indices must be int64",
                grad_out.shape(),
                indices.shape(),
                indices.dtype()
            ),
        ));
    }
    check_float(OP, grad_out)?;
    let (gp, _, _) = plane_dims(OP, grad_out.shape())?;
    if gp != planes || grad_out.shape()[..grad_out.ndim() - 2] != input_shape[..input_shape.len() - 2] {
        return Err(Error::shape(
            OP,
            format!(
                "grad_out {:?} does not fit input shape {input_shape:?}",
                grad_out.shape()
            ),
        ));
    }
    crate::backend::dispatch(OP, &[grad_out, indices])?.max_pool2d_backward(grad_out, indices, input_shape)
}

/// The CPU kernel of [`Tensor::max_pool2d_with_indices`] (input checked).
pub(crate) fn cpu_max_pool2d(x: &Tensor, g: &Window) -> Result<(Tensor, Tensor)> {
    crate::with_float_dtype!(x.dtype(), S => max_forward::<S>(x, g),
        else unreachable!("Window::new admits only floats"))
}

/// The CPU kernel of [`max_pool2d_backward`] (operands checked).
pub(crate) fn cpu_max_pool2d_backward(
    grad_out: &Tensor,
    indices: &Tensor,
    input_shape: &[usize],
) -> Result<Tensor> {
    const OP: &str = "max_pool2d_backward";
    let (_, h, w) = plane_dims(OP, input_shape)?;
    let (_, oh, ow) = plane_dims(OP, grad_out.shape())?;
    let indices = indices.contiguous()?;
    let idx = indices.as_slice::<i64>().expect("contiguous and dtype-checked");
    let l = oh * ow;
    // Indices are checked where they are used (one pass over them), the
    // first bad one reported after.
    let bad = std::sync::atomic::AtomicBool::new(false);
    let out = crate::with_float_dtype!(grad_out.dtype(), S => {
        // Read in place, widened element by element: no copy of the gradient.
        let grad_out = grad_out.contiguous()?;
        let go = grad_out.as_slice::<S>().expect("contiguous and dtype-checked");
        scatter_planes::<S>(input_shape, h * w, l, |pl, gi| {
            for (&i, &v) in idx[pl * l..(pl + 1) * l].iter().zip(&go[pl * l..]) {
                // A negative index wraps far past the plane: `None` too.
                match gi.get_mut(i as usize) {
                    Some(g) => *g += v.to_math(),
                    None => bad.store(true, std::sync::atomic::Ordering::Relaxed),
                }
            }
        })?
    }, else unreachable!("checked float"));
    if bad.into_inner() {
        let bad = idx
            .iter()
            .find(|&&i| i < 0 || i as usize >= h * w)
            .copied()
            .unwrap_or(-1);
        return Err(Error::index(
            OP,
            format!("index {bad} is outside a plane of {h}x{w} elements"),
        ));
    }
    Ok(out)
}

/// The gradient of [`Tensor::avg_pool2d`] with respect to its input of
/// shape `input_shape`, given `grad_out` and the same parameters.
///
/// Errors when the shapes do not describe that pooling, or as [`Tensor::avg_pool2d`].
pub fn avg_pool2d_backward(grad_out: &Tensor, input_shape: &[usize], p: &Pool2dParams) -> Result<Tensor> {
    const OP: &str = "avg_pool2d_backward";
    let be = crate::backend::dispatch(OP, &[grad_out])?;
    check_float(OP, grad_out)?;
    let g = Window::from_shape(OP, input_shape, p)?;
    g.check_avg(OP)?;
    g.check_grad(OP, grad_out)?;
    be.avg_pool2d_backward(grad_out, &g)
}

/// The CPU kernel of [`avg_pool2d_backward`] (operands checked).
pub(crate) fn cpu_avg_pool2d_backward(grad_out: &Tensor, g: &Window) -> Result<Tensor> {
    let input_shape = g.shape.as_slice();
    Ok(crate::with_float_dtype!(grad_out.dtype(), S => {
        let go = crate::ops::math_view::math_view::<S>(grad_out)?;
        let l = g.oh * g.ow;
        scatter_planes::<S>(input_shape, g.h * g.w, l, |pl, gi| {
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    if let Some((ys, xs, div)) = g.avg_window(oy, ox) {
                        let v = go[pl * l + oy * g.ow + ox] / <<S as FloatElement>::Math as FloatMath>::of(div);
                        for y in ys {
                            for x in xs.clone() {
                                gi[y * g.w + x] += v;
                            }
                        }
                    }
                }
            }
        })?
    }, else unreachable!("checked float")))
}

/// The validated geometry of one pooling.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    shape: Vec<usize>,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) p: Pool2dParams,
}

impl Window {
    fn new(op: &'static str, x: &Tensor, p: &Pool2dParams) -> Result<Window> {
        check_float(op, x)?;
        Self::from_shape(op, x.shape(), p)
    }

    fn from_shape(op: &'static str, shape: &[usize], p: &Pool2dParams) -> Result<Window> {
        let (_, h, w) = plane_dims(op, shape)?;
        let desc = || format!("input {shape:?}, {p:?}");
        if p.kernel.contains(&0) || p.stride.contains(&0) || p.dilation.contains(&0) {
            return Err(Error::arg(
                op,
                format!("kernel, stride and dilation must be positive: {}", desc()),
            ));
        }
        if (0..2).any(|d| p.padding[d] > p.kernel[d] / 2) {
            return Err(Error::arg(
                op,
                format!("padding must be at most half the kernel: {}", desc()),
            ));
        }
        let out = |d: usize, size: usize| -> Option<usize> {
            let span = p.dilation[d].checked_mul(p.kernel[d] - 1)?.checked_add(1)?;
            let padded = size.checked_add(p.padding[d].checked_mul(2)?)?;
            let extra = if p.ceil_mode { p.stride[d] - 1 } else { 0 };
            let mut o = padded.checked_add(extra)?.checked_sub(span)? / p.stride[d] + 1;
            // The last window must start inside the input or the left padding.
            if p.ceil_mode && (o - 1) * p.stride[d] >= size + p.padding[d] {
                o -= 1;
            }
            (o > 0).then_some(o)
        };
        match (out(0, h), out(1, w)) {
            (Some(oh), Some(ow)) if h > 0 && w > 0 => Ok(Window {
                shape: shape.to_vec(),
                h,
                w,
                oh,
                ow,
                p: *p,
            }),
            _ => Err(Error::shape(
                op,
                format!(
                    "the window does not fit the input (output would be empty): {}",
                    desc()
                ),
            )),
        }
    }

    fn check_avg(&self, op: &'static str) -> Result<()> {
        if self.p.dilation != [1, 1] || self.p.divisor_override == Some(0) {
            return Err(Error::arg(
                op,
                format!(
                    "needs dilation 1 and a non-zero divisor_override, got {:?}",
                    self.p
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn out_shape(&self) -> Vec<usize> {
        let mut s = self.shape[..self.shape.len() - 2].to_vec();
        s.extend([self.oh, self.ow]);
        s
    }

    fn check_grad(&self, op: &'static str, grad_out: &Tensor) -> Result<()> {
        if grad_out.shape() != self.out_shape() {
            return Err(Error::shape(
                op,
                format!(
                    "grad_out has shape {:?}, the pooling's output is {:?}",
                    grad_out.shape(),
                    self.out_shape()
                ),
            ));
        }
        Ok(())
    }

    /// The input rows (`d == 0`) or columns (`d == 1`) that max window `o` meets.
    fn max_taps(&self, d: usize, o: usize) -> std::iter::StepBy<std::ops::Range<usize>> {
        let size = if d == 0 { self.h } else { self.w };
        let (s, pad, dil) = (self.p.stride[d], self.p.padding[d], self.p.dilation[d]);
        let start = (o * s) as isize - pad as isize;
        let end = (start + ((self.p.kernel[d] - 1) * dil) as isize + 1).min(size as isize);
        let mut first = start;
        while first < 0 {
            first += dil as isize;
        }
        (first as usize..end.max(first) as usize).step_by(dil)
    }

    /// PyTorch's average window: the clipped row and column ranges and the
    /// divisor, or `None` when the window lies entirely in the padding.
    fn avg_window(
        &self,
        oy: usize,
        ox: usize,
    ) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>, f64)> {
        let range = |d: usize, o: usize, size: usize| {
            let start = (o * self.p.stride[d]) as isize - self.p.padding[d] as isize;
            let end = (start + self.p.kernel[d] as isize).min((size + self.p.padding[d]) as isize);
            let full = end - start;
            (
                start.max(0) as usize,
                end.min(size as isize).max(0) as usize,
                full,
            )
        };
        let (y0, y1, fh) = range(0, oy, self.h);
        let (x0, x1, fw) = range(1, ox, self.w);
        if y0 >= y1 || x0 >= x1 {
            return None;
        }
        let div = match self.p.divisor_override {
            Some(d) => d as f64,
            None if self.p.count_include_pad => (fh * fw) as f64,
            None => ((y1 - y0) * (x1 - x0)) as f64,
        };
        Some((y0..y1, x0..x1, div))
    }
}

/// `(planes, H, W)` of a 3-D or 4-D shape; errors for another rank or an
/// element count past `isize::MAX`.
fn plane_dims(op: &'static str, shape: &[usize]) -> Result<(usize, usize, usize)> {
    crate::tensor::checked_numel(op, shape)?;
    // With a zero size elsewhere the element count is 0 whatever the
    // others: the planes and the plane size must fit on their own.
    let fit = |a: usize, b: usize| {
        a.checked_mul(b)
            .filter(|&p| p <= isize::MAX as usize)
            .ok_or_else(|| too_large(op, shape))
    };
    match shape {
        [c, h, w] => fit(*h, *w).map(|_| (*c, *h, *w)),
        [n, c, h, w] => fit(*h, *w).and(fit(*n, *c)).map(|planes| (planes, *h, *w)),
        _ => Err(Error::shape(
            op,
            format!("expects a 3-D [C, H, W] or 4-D [N, C, H, W] shape, got {shape:?}"),
        )),
    }
}

fn too_large(op: &'static str, shape: &[usize]) -> Error {
    Error::arg(
        op,
        format!("shape {shape:?} has more elements than memory can hold"),
    )
}

/// A fresh tensor of `shape` (in `S`) whose planes of `plane` elements are
/// accumulated in the math type from zero by `f(plane_index, plane)` and
/// rounded once, in parallel when `work` (elements read per plane) makes
/// it worth it.
fn scatter_planes<S: FloatElement>(
    shape: &[usize],
    plane: usize,
    work: usize,
    f: impl Fn(usize, &mut [S::Math]) + Sync,
) -> Result<Tensor>
where
    S::Math: crate::Element,
{
    // Each plane is zeroed right before its scatter, while it is in cache;
    // f16/bf16 planes accumulate in a per-job f32 plane.
    let each = |scratch: &mut Vec<S::Math>, (pl, out): (usize, &mut [S])| {
        crate::ops::math_view::zeroed_math_mut(out, scratch, |g| f(pl, g))
    };
    Tensor::build_overwrite::<S>("pool_backward", shape, |gi| {
        if plane == 0 {
            return;
        }
        if gi.len() * work.max(1) > crate::strided::PAR_THRESHOLD {
            gi.par_chunks_mut(plane).enumerate().for_each_init(Vec::new, each);
        } else {
            let mut scratch = Vec::new();
            gi.chunks_mut(plane)
                .enumerate()
                .for_each(|job| each(&mut scratch, job));
        }
    })
}

/// Fills a fresh `S` tensor of `shape`, plane by plane, from `f(plane_index,
/// out_plane)`, in parallel when large.
pub(super) fn fill_planes<S: FloatElement>(
    shape: &[usize],
    plane: usize,
    f: impl Fn(usize, &mut [S]) + Sync,
) -> Result<Tensor> {
    Tensor::build::<S>("pool", shape, |out| {
        if plane == 0 {
            return;
        }
        if out.len() > crate::strided::PAR_THRESHOLD / 16 {
            out.par_chunks_mut(plane).enumerate().for_each(|(pl, o)| f(pl, o));
        } else {
            out.chunks_mut(plane).enumerate().for_each(|(pl, o)| f(pl, o));
        }
    })
}

fn max_forward<S: FloatElement>(x: &Tensor, g: &Window) -> Result<(Tensor, Tensor)> {
    let x = x.contiguous()?;
    let xs = x.as_slice::<S>().expect("contiguous and dtype-checked");
    // Both outputs are written in full, so they come from the caching
    // allocator unfilled: a fresh zeroed index vector page-faulted on every
    // call and cost more than the pooling.
    let mut values = None;
    let idx = Tensor::build_overwrite::<i64>("max_pool2d", &g.out_shape(), |indices| {
        values = Some(Tensor::build_overwrite::<S>(
            "max_pool2d",
            &g.out_shape(),
            |out| max_planes::<S>(xs, g, out, indices),
        ));
    })?;
    Ok((values.expect("build_overwrite runs its closure")?, idx))
}

/// Fills the maxima `out` and their plane indices `indices` of every plane.
fn max_planes<S: FloatElement>(xs: &[S], g: &Window, out: &mut [S], indices: &mut [i64]) {
    let (hw, l) = (g.h * g.w, g.oh * g.ow);
    {
        let plane = |(pl, (o, idx)): (usize, (&mut [S], &mut [i64]))| {
            let src = &xs[pl * hw..(pl + 1) * hw];
            if g.p.padding == [0, 0] && g.p.dilation == [1, 1] {
                if g.p.kernel == [2, 2] && g.p.stride == [2, 2] && 2 * g.oh <= g.h && 2 * g.ow <= g.w {
                    max_2x2::max_plane_2x2::<S>(crate::simd::Level::best(), src, g.w, g.ow, o, idx);
                } else {
                    max_plane_dense::<S>(src, g, o, idx);
                }
                return;
            }
            for oy in 0..g.oh {
                for ox in 0..g.ow {
                    let ys = g.max_taps(0, oy);
                    let xs_ = g.max_taps(1, ox);
                    let mut best = <<S as FloatElement>::Math as FloatMath>::NEG_INFINITY;
                    let mut best_i = ys.clone().next().unwrap_or(0) * g.w + xs_.clone().next().unwrap_or(0);
                    for y in ys {
                        for xx in xs_.clone() {
                            let v = src[y * g.w + xx].to_math();
                            if v > best || v.is_nan() {
                                best = v;
                                best_i = y * g.w + xx;
                            }
                        }
                    }
                    o[oy * g.ow + ox] = S::from_math(best);
                    idx[oy * g.ow + ox] = best_i as i64;
                }
            }
        };
        if l == 0 {
            return;
        }
        if out.len() > crate::strided::PAR_THRESHOLD / 16 {
            out.par_chunks_mut(l)
                .zip(indices.par_chunks_mut(l))
                .enumerate()
                .for_each(plane);
        } else {
            out.chunks_mut(l)
                .zip(indices.chunks_mut(l))
                .enumerate()
                .for_each(plane);
        }
    }
}

/// [`max_planes`] on one plane for windows without padding or dilation
/// (the common case, e.g. 2×2 stride 2): plain index arithmetic instead of
/// the general tap iterators, the same scan order and NaN rule.
fn max_plane_dense<S: FloatElement>(src: &[S], g: &Window, o: &mut [S], idx: &mut [i64]) {
    let ([kh, kw], [sh, sw]) = (g.p.kernel, g.p.stride);
    for oy in 0..g.oh {
        let y0 = oy * sh;
        let y1 = (y0 + kh).min(g.h);
        for ox in 0..g.ow {
            let x0 = ox * sw;
            let x1 = (x0 + kw).min(g.w);
            let mut best = <<S as FloatElement>::Math as FloatMath>::NEG_INFINITY;
            let mut best_i = y0 * g.w + x0;
            for y in y0..y1 {
                for (x, v) in src[y * g.w + x0..y * g.w + x1].iter().enumerate() {
                    let v = v.to_math();
                    // Selects, not branches: random data mispredicts them.
                    let take = v > best || v.is_nan();
                    best = if take { v } else { best };
                    best_i = if take { y * g.w + x0 + x } else { best_i };
                }
            }
            o[oy * g.ow + ox] = S::from_math(best);
            idx[oy * g.ow + ox] = best_i as i64;
        }
    }
}

fn avg_forward<S: FloatElement>(x: &Tensor, g: &Window) -> Result<Tensor> {
    let x = x.contiguous()?;
    let xs = x.as_slice::<S>().expect("contiguous and dtype-checked");
    let hw = g.h * g.w;
    fill_planes::<S>(&g.out_shape(), g.oh * g.ow, |pl, o| {
        let src = &xs[pl * hw..(pl + 1) * hw];
        for oy in 0..g.oh {
            for ox in 0..g.ow {
                o[oy * g.ow + ox] = match g.avg_window(oy, ox) {
                    None => S::ZERO,
                    Some((ys, xr, div)) => {
                        let mut sum = <<S as FloatElement>::Math as FloatMath>::ZERO;
                        for y in ys {
                            for v in &src[y * g.w + xr.start..y * g.w + xr.end] {
                                sum += v.to_math();
                            }
                        }
                        S::from_math(sum / <<S as FloatElement>::Math as FloatMath>::of(div))
                    }
                };
            }
        }
    })
}
