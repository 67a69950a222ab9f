//! The backward primitives of [`crate::Tensor::conv2d`]: gradients with
//! respect to the input, the weight and the bias.

use rayon::prelude::*;

use super::im2col::col2im_strided;
use super::{
    bands, blocking, chunks_maybe_par, gather_samples, samples_per_gemm, transpose_blocks, unfold_samples,
    weight_ref, Blocking, Conv2dParams, Geom,
};
use crate::ops::matmul::check_operands;
use crate::ops::matmul::gemm::{gemm, Epilogue, GemmShape, MatMut};
use crate::ops::matmul::kernel::{GemmScalar, Isa};
use crate::ops::matmul::pack::MatRef;
use crate::{Error, FloatElement, FloatMath, Result, Tensor};

/// Partial weight gradients computed at once before they are added in task
/// order (bounds their memory: each is as large as the weight).
const PARTIALS_IN_FLIGHT: usize = 8;

/// The gradient of `conv2d(input, weight)` with respect to its input, for
/// an input of shape `input_shape` `[N, C, H, W]`, given `grad_out`
/// `[N, O, OH, OW]`; returns `[N, C, H, W]` in `grad_out`'s dtype.
///
/// Errors when the shapes do not describe one convolution with `p` (the
/// message names the op and shapes), or the dtypes or devices differ.
pub fn conv2d_backward_input(
    grad_out: &Tensor,
    weight: &Tensor,
    input_shape: &[usize],
    p: &Conv2dParams,
) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_input";
    check_operands(OP, grad_out, weight)?;
    let g = Geom::new(OP, input_shape, weight.shape(), p)?;
    check_grad_out(OP, grad_out, &g)?;
    crate::backend::dispatch(OP, &[grad_out, weight])?.conv2d_backward_input(grad_out, weight, &g)
}

/// The CPU kernel of [`conv2d_backward_input`] (operands checked).
pub(crate) fn cpu_backward_input(grad_out: &Tensor, weight: &Tensor, g: &Geom) -> Result<Tensor> {
    crate::with_float_dtype!(grad_out.dtype(), S => input_grad::<S>(grad_out, weight, g),
        else unreachable!("check_operands admits only floats"))
}

/// The gradient of `conv2d(input, weight)` with respect to a weight of shape
/// `weight_shape` `[O, C/groups, kh, kw]`, given `grad_out`
/// `[N, O, OH, OW]`; returns `weight_shape` in `grad_out`'s dtype.
///
/// Errors as [`conv2d_backward_input`].
pub fn conv2d_backward_weight(
    grad_out: &Tensor,
    input: &Tensor,
    weight_shape: &[usize],
    p: &Conv2dParams,
) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_weight";
    check_operands(OP, grad_out, input)?;
    let g = Geom::new(OP, input.shape(), weight_shape, p)?;
    check_grad_out(OP, grad_out, &g)?;
    crate::backend::dispatch(OP, &[grad_out, input])?.conv2d_backward_weight(grad_out, input, &g)
}

/// The CPU kernel of [`conv2d_backward_weight`] (operands checked).
pub(crate) fn cpu_backward_weight(grad_out: &Tensor, input: &Tensor, g: &Geom) -> Result<Tensor> {
    crate::with_float_dtype!(grad_out.dtype(), S => weight_grad::<S>(grad_out, input, g, g.kk() <= super::dot::MAX_TAPS),
        else unreachable!("check_operands admits only floats"))
}

/// The gradient with respect to the bias: `grad_out` `[N, O, ...]` summed
/// over every dimension but dimension 1; returns `[O]`.
///
/// Errors when `grad_out` has fewer than 2 dimensions or is not a float tensor.
pub fn conv2d_backward_bias(grad_out: &Tensor) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_bias";
    check_operands(OP, grad_out, grad_out)?;
    if grad_out.ndim() < 2 {
        return Err(Error::shape(
            OP,
            format!("expects [N, O, ...], got shape {:?}", grad_out.shape()),
        ));
    }
    if !grad_out.device().is_cpu() {
        // A sum over every dim but 1: the reduction kernels of its device.
        let dims: Vec<isize> = (0..grad_out.ndim() as isize).filter(|&d| d != 1).collect();
        return grad_out.sum(&dims, false);
    }
    let (n, o) = (grad_out.shape()[0], grad_out.shape()[1]);
    let l: usize = grad_out.shape()[2..].iter().product();
    crate::with_float_dtype!(grad_out.dtype(), S => bias_grad::<S>(grad_out, n, o, l),
        else unreachable!("check_operands admits only floats"))
}

/// Sums `[n, o, l]` over `n` and `l`, per channel in a fixed order.
fn bias_grad<S: FloatElement>(grad_out: &Tensor, n: usize, o: usize, l: usize) -> Result<Tensor>
where
    S::Math: crate::Element,
{
    // Read in place, widened element by element (a shift for bf16): no
    // copy of the whole gradient.
    let grad_out = grad_out.contiguous()?;
    let go = grad_out.as_slice::<S>().expect("contiguous and dtype-checked");
    let zero = <S::Math as FloatMath>::ZERO;
    let sums: Vec<S> = (0..o)
        .into_par_iter()
        .map(|c| {
            // Eight running sums, element e into sum e % 8 of its row, added
            // in a fixed order at the end: independent chains the compiler
            // keeps in a vector register, one order on any thread count.
            let mut acc = [zero; 8];
            for b in 0..n {
                let row = &go[(b * o + c) * l..(b * o + c + 1) * l];
                let mut chunks = row.chunks_exact(8);
                for ch in &mut chunks {
                    for (a, &v) in acc.iter_mut().zip(ch) {
                        *a += v.to_math();
                    }
                }
                for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
                    *a += v.to_math();
                }
            }
            S::from_math(acc.iter().fold(zero, |s, &v| s + v))
        })
        .collect();
    Tensor::build::<S>("conv2d_backward_bias", &[o], |out| out.copy_from_slice(&sums))
}

fn check_grad_out(op: &'static str, grad_out: &Tensor, g: &Geom) -> Result<()> {
    if grad_out.shape() != g.out_shape() {
        return Err(Error::shape(
            op,
            format!(
                "grad_out has shape {:?}, the convolution's output is {:?}",
                grad_out.shape(),
                g.out_shape()
            ),
        ));
    }
    Ok(())
}

fn input_grad<S: FloatElement>(grad_out: &Tensor, w: &Tensor, g: &Geom) -> Result<Tensor>
where
    S::Math: GemmScalar + FloatElement<Math = S::Math>,
{
    // The GEMM operands stay in the storage type, as in the forward: bf16
    // runs on the bf16 kernels, f16 is widened while packing.
    let grad_out = grad_out.contiguous()?;
    let go = grad_out.as_slice::<S>().expect("contiguous and dtype-checked");
    let wm = w.contiguous()?.to_vec::<S>()?;
    let (kk, l) = (g.kk(), g.l());
    let plane = g.cg * g.h * g.w;
    let blk = blocking::<S>(g);
    let Blocking {
        samples: nb,
        rows,
        banded,
    } = blk;
    let lb = rows * g.ow;
    // Bands, and samples sharing a large weight (their output gradients
    // then fit L2), run on the direct kernels, which read A row-major: each
    // group's Wᵀ `[kk, og]`, transposed once here (ResNet-18's last stage:
    // 222 -> 209 ms a step against packing the strided Wᵀ).
    let direct = banded || blk.shares_large_weights::<S::Math>(g);
    let wt = if direct {
        transpose_blocks(&wm, g.groups, g.og, kk)
    } else {
        Vec::new()
    };
    let a = |grp: usize| {
        if direct {
            MatRef {
                data: &wt[..],
                off: grp * kk * g.og,
                rs: g.og as isize,
                cs: 1,
            }
        } else {
            weight_ref(&wm, g, grp, true)
        }
    };
    let par_inner = blk.parallel_inside::<S::Math>(g);
    // Per rayon job: the column gradients of its samples side by side, and
    // their output gradients gathered into one GEMM operand.
    let new_bufs = || {
        let gathered = if nb > 1 { g.og * nb * l } else { 0 };
        (
            vec![<S::Math as FloatMath>::ZERO; kk * nb * lb],
            vec![S::ZERO; gathered],
        )
    };
    let chunk = |(dcols, gathered): &mut (Vec<S::Math>, Vec<S>), (c, dx): (usize, &mut [S::Math])| {
        let m = dx.len() / (g.c * g.h * g.w);
        let ld = m * lb;
        for (grp, oy0) in bands(g, rows) {
            let b = if m == 1 {
                MatRef {
                    data: go,
                    off: (c * nb * g.o + grp * g.og) * l + oy0 * g.ow,
                    rs: l as isize,
                    cs: 1,
                }
            } else {
                gather_samples(go, g, c * nb, m, grp, gathered, par_inner);
                MatRef {
                    data: &gathered[..],
                    off: 0,
                    rs: ld as isize,
                    cs: 1,
                }
            };
            let shape = GemmShape {
                m: kk,
                n: ld,
                k: g.og,
                alpha: <S::Math as FloatMath>::ONE,
                beta: <S::Math as FloatMath>::ZERO,
            };
            let c = MatMut {
                data: &mut dcols[..],
                off: 0,
                rs: ld as isize,
                cs: 1,
            };
            gemm::<S>(shape, a(grp), b, c, Epilogue::none(), Isa::best(), par_inner);
            chunks_maybe_par(dx, g.c * g.h * g.w, par_inner, |(j, dxj)| {
                col2im_strided(
                    &dcols[j * lb..],
                    g,
                    oy0..oy0 + rows,
                    ld,
                    &mut dxj[grp * plane..][..plane],
                );
            });
        }
    };
    let out = Tensor::build::<S::Math>("conv2d_backward_input", &[g.n, g.c, g.h, g.w], |dx| {
        if dx.is_empty() {
            return;
        }
        if par_inner {
            let mut bufs = new_bufs();
            dx.chunks_mut(nb * g.c * g.h * g.w)
                .enumerate()
                .for_each(|job| chunk(&mut bufs, job));
        } else {
            dx.par_chunks_mut(nb * g.c * g.h * g.w)
                .enumerate()
                .for_each_init(new_bufs, chunk);
        }
    })?;
    out.to_dtype(S::DTYPE)
}

/// The weight gradient by long dot products over `N·OH·OW` (`dot`, for
/// few taps) or by per-sample GEMMs.
pub(super) fn weight_grad<S: FloatElement>(
    grad_out: &Tensor,
    x: &Tensor,
    g: &Geom,
    dot: bool,
) -> Result<Tensor>
where
    S::Math: GemmScalar + FloatElement<Math = S::Math>,
{
    // Both paths read the operands in the storage type, as in `input_grad`.
    let grad_out = grad_out.contiguous()?;
    let go = grad_out.as_slice::<S>().expect("contiguous and dtype-checked");
    let x = x.contiguous()?;
    let xs = x.as_slice::<S>().expect("contiguous and dtype-checked");
    let (kk, l) = (g.kk(), g.l());
    if dot {
        let dw = super::dot::weight_grad::<S>(go, xs, g);
        return Tensor::from_vec(dw, &[g.o, g.cg, g.kh, g.kw])?.to_dtype(S::DTYPE);
    }
    let blk = blocking::<S>(g);
    if blk.banded
        && g.og
            .is_multiple_of(<S::Math as GemmScalar>::kernel(Isa::best()).nr)
    {
        return banded_weight_grad::<S>(go, xs, g, blk.rows);
    }
    let size = g.o * kk;
    let nb = samples_per_gemm(g);
    let tasks = g.n.div_ceil(nb);
    let zero = <S::Math as FloatMath>::ZERO;
    // Task t adds the gradients of samples t·nb .. (one GEMM per group, of
    // depth samples·l) into `part`, or writes them there when `first`; as
    // each group's dWᵀ `[kk, og]` (= cols·dYᵀ) when `transposed`.
    let accumulate = |t: usize, part: &mut [S::Math], first: bool, par: bool, transposed: bool| {
        let (n0, m) = (t * nb, nb.min(g.n - t * nb));
        let ld = m * l;
        let mut cols = vec![S::ZERO; kk * ld];
        let mut gathered = vec![S::ZERO; if m > 1 { g.og * ld } else { 0 }];
        for grp in 0..g.groups {
            unfold_samples(xs, g, n0, m, grp, 0..g.oh, &mut cols, par);
            let a = if m == 1 {
                MatRef {
                    data: go,
                    off: (n0 * g.o + grp * g.og) * l,
                    rs: l as isize,
                    cs: 1,
                }
            } else {
                gather_samples(go, g, n0, m, grp, &mut gathered, par);
                MatRef {
                    data: &gathered[..],
                    off: 0,
                    rs: ld as isize,
                    cs: 1,
                }
            };
            let shape = GemmShape {
                m: g.og,
                n: kk,
                k: ld,
                alpha: <S::Math as FloatMath>::ONE,
                beta: if first { zero } else { <S::Math as FloatMath>::ONE },
            };
            let b = MatRef {
                data: &cols[..],
                off: 0,
                rs: 1,
                cs: ld as isize,
            };
            if transposed {
                let shape = GemmShape {
                    m: kk,
                    n: g.og,
                    ..shape
                };
                let c = MatMut {
                    data: &mut *part,
                    off: grp * kk * g.og,
                    rs: g.og as isize,
                    cs: 1,
                };
                gemm::<S>(shape, b.t(), a.t(), c, Epilogue::none(), Isa::best(), par);
            } else {
                let c = MatMut {
                    data: &mut *part,
                    off: grp * g.og * kk,
                    rs: kk as isize,
                    cs: 1,
                };
                gemm::<S>(shape, a, b, c, Epilogue::none(), Isa::best(), par);
            }
        }
    };
    let sum = if blk.shares_large_weights::<S::Math>(g) {
        // The tasks run in turn, each GEMM on the whole pool, into one sum
        // (a choice of the shapes alone, so the sum order is fixed). As
        // dWᵀ = cols·dYᵀ the direct kernels read the unfolding in place and
        // only dY's few columns are packed (ResNet-18's last stage: 232 ->
        // 189 ms a step against dW = dY·colsᵀ, which packs the unfolding).
        let mut sum_t = vec![zero; size];
        for t in 0..tasks {
            accumulate(t, &mut sum_t, t == 0, true, true);
        }
        transpose_blocks(&sum_t, g.groups, kk, g.og)
    } else {
        let par_inner = tasks < rayon::current_num_threads();
        sum_in_task_order(tasks, size, par_inner, |t| {
            let mut part = vec![zero; size];
            accumulate(t, &mut part, true, par_inner, false);
            part
        })
    };
    Tensor::from_vec(sum, &[g.o, g.cg, g.kh, g.kw])?.to_dtype(S::DTYPE)
}

/// Samples whose weight gradients one task of [`banded_weight_grad`] sums.
const BAND_TASK_SAMPLES: usize = 8;

/// The weight gradient on bands of output rows (see `blocking`): per group,
/// dWᵀ `[kk, og]` += cols_band · dY_bandᵀ for every band of every sample of
/// a task of [`BAND_TASK_SAMPLES`], on the direct kernels, which read the
/// band's unfolding in place from L2 (dY's band is packed, `lb × og`).
/// The tasks' sums are added in task order and transposed once.
fn banded_weight_grad<S: FloatElement>(go: &[S], xs: &[S], g: &Geom, rows: usize) -> Result<Tensor>
where
    S::Math: GemmScalar + FloatElement<Math = S::Math>,
{
    let (kk, l, lb, og) = (g.kk(), g.l(), rows * g.ow, g.og);
    let zero = <S::Math as FloatMath>::ZERO;
    let tasks = g.n.div_ceil(BAND_TASK_SAMPLES);
    let par_inner = tasks < rayon::current_num_threads();
    let task = |t: usize| -> Vec<S::Math> {
        let mut part = vec![zero; g.o * kk];
        let mut cols = vec![S::ZERO; kk * lb];
        let samples = t * BAND_TASK_SAMPLES..((t + 1) * BAND_TASK_SAMPLES).min(g.n);
        for (si, ni) in samples.enumerate() {
            for (grp, oy0) in bands(g, rows) {
                unfold_samples(xs, g, ni, 1, grp, oy0..oy0 + rows, &mut cols, false);
                let shape = GemmShape {
                    m: kk,
                    n: og,
                    k: lb,
                    alpha: <S::Math as FloatMath>::ONE,
                    beta: if si == 0 && oy0 == 0 {
                        zero
                    } else {
                        <S::Math as FloatMath>::ONE
                    },
                };
                let a = MatRef {
                    data: &cols[..],
                    off: 0,
                    rs: lb as isize,
                    cs: 1,
                };
                let b = MatRef {
                    data: go,
                    off: (ni * g.o + grp * og) * l + oy0 * g.ow,
                    rs: 1,
                    cs: l as isize,
                };
                let c = MatMut {
                    data: &mut part[..],
                    off: grp * kk * og,
                    rs: og as isize,
                    cs: 1,
                };
                gemm::<S>(shape, a, b, c, Epilogue::none(), Isa::best(), par_inner);
            }
        }
        part
    };
    let sum_t = sum_in_task_order(tasks, g.o * kk, par_inner, task);
    let sum = transpose_blocks(&sum_t, g.groups, kk, og);
    Tensor::from_vec(sum, &[g.o, g.cg, g.kh, g.kw])?.to_dtype(S::DTYPE)
}

/// The sum of `task(0) + task(1) + …` (vectors of `size`), added in task
/// order a wave at a time, so at most [`PARTIALS_IN_FLIGHT`] of them are
/// alive and the sum order is fixed; the tasks of a wave run in parallel
/// unless `serial`.
fn sum_in_task_order<T: FloatMath + Send>(
    tasks: usize,
    size: usize,
    serial: bool,
    task: impl Fn(usize) -> Vec<T> + Sync,
) -> Vec<T> {
    let mut sum = vec![T::ZERO; size];
    let all: Vec<usize> = (0..tasks).collect();
    for wave in all.chunks(PARTIALS_IN_FLIGHT) {
        let parts: Vec<Vec<T>> = if serial {
            wave.iter().map(|&t| task(t)).collect()
        } else {
            wave.par_iter().map(|&t| task(t)).collect()
        };
        for part in &parts {
            for (d, &v) in sum.iter_mut().zip(part) {
                *d += v;
            }
        }
    }
    sum
}
