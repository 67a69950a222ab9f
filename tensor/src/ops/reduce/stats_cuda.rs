//! GPU reductions composed of device ops: variance and standard deviation
//! (two passes: the mean, then the squared deviations), log-sum-exp (the
//! max, then Σ exp(x − max)), the vector norms, and all/any. Each runs in
//! f32 on the device and rounds once to the input dtype; the CPU computes
//! var and the norms in f64 or f32 pairwise, so results agree within f32
//! rounding, not bit for bit.

use super::cpu::Plan;
use crate::backend::CompareOp;
use crate::cuda::no_kernel;
use crate::ops::compare::cuda::{compare, compare_scalar};
use crate::{DType, Error, Result, Tensor};

/// `x` in f32 for the float dtypes with kernels; an error naming `op`
/// otherwise.
fn wide(op: &'static str, x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => x.to_dtype(DType::F32),
        d => Err(no_kernel(op, x.device(), format_args!("{d} tensors"))),
    }
}

/// (variance, mean) over `dims` with `correction`; the standard deviation
/// instead of the variance when `sqrt`. Errors: a bad correction or dims,
/// a dtype without kernels, a device failure.
pub(crate) fn var_mean(
    op: &'static str,
    x: &Tensor,
    dims: &[isize],
    correction: f64,
    keepdim: bool,
    sqrt: bool,
) -> Result<(Tensor, Tensor)> {
    if !correction.is_finite() || correction < 0.0 {
        return Err(Error::arg(
            op,
            format!("correction must be finite and ≥ 0, got {correction}"),
        ));
    }
    let plan = Plan::new(op, x.layout(), dims, keepdim)?;
    let xf = wide(op, x)?;
    let mean = xf.mean(dims, true)?;
    let dof = (plan.n_red as f64 - correction).max(0.0);
    // Σ(x − mean)²/dof: 0/0 is NaN and c/0 inf, as on the CPU.
    let mut var = xf.sub(&mean)?.square()?.sum(dims, true)?.div_scalar(dof)?;
    if sqrt {
        var = var.sqrt()?;
    }
    let back = |t: Tensor| t.reshape(plan.out_shape.as_slice())?.to_dtype(x.dtype());
    Ok((back(var)?, back(mean)?))
}

/// log Σ exp(x) over `dims`: the max is subtracted first, replaced by 0
/// where it is not finite (all −inf gives −inf, a +inf gives +inf, NaN
/// propagates). An empty reduction gives −inf.
///
/// Errors: bad dims, a dtype without kernels, a device failure.
pub(crate) fn logsumexp(x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    const OP: &str = "logsumexp";
    let plan = Plan::new(OP, x.layout(), dims, keepdim)?;
    let xf = wide(OP, x)?;
    let out = if plan.n_red == 0 {
        xf.sum(dims, true)?.log()?
    } else {
        let m = xf.max(dims, true)?;
        let finite = compare_scalar(OP, CompareOp::Lt, &m.abs()?, f64::INFINITY)?;
        let shift = Tensor::where_(
            &finite,
            &m,
            &Tensor::zeros(&[], DType::F32)?.to_device(x.device())?,
        )?;
        xf.sub(&shift)?.exp()?.sum(dims, true)?.log()?.add(&shift)?
    };
    out.reshape(plan.out_shape.as_slice())?.to_dtype(x.dtype())
}

/// The vector `p`-norm over `dims` (`p` not NaN): Σ|x|^p to the 1/p, the
/// max (min) of |x| for p = ∞ (−∞), the count of non-zeros for p = 0.
///
/// Errors: bad dims, an empty reduction with p = ±∞, a dtype without
/// kernels, a device failure.
pub(crate) fn norm(x: &Tensor, p: f64, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    const OP: &str = "norm";
    let plan = Plan::new(OP, x.layout(), dims, keepdim)?;
    let xf = wide(OP, x)?;
    let out = if p.is_infinite() {
        if plan.n_red == 0 {
            return Err(super::empty_error(OP, x.shape(), dims));
        }
        if p > 0.0 {
            xf.abs()?.max(dims, true)?
        } else {
            xf.abs()?.min(dims, true)?
        }
    } else if p == 0.0 {
        count(&compare_scalar(OP, CompareOp::Ne, &xf, 0.0)?, dims)?
    } else if p == 1.0 {
        xf.abs()?.sum(dims, true)?
    } else if p == 2.0 {
        xf.square()?.sum(dims, true)?.sqrt()?
    } else {
        xf.abs()?.pow_scalar(p)?.sum(dims, true)?.pow_scalar(1.0 / p)?
    };
    out.reshape(plan.out_shape.as_slice())?.to_dtype(x.dtype())
}

/// The number of true elements of the bool `mask` over `dims` (kept), in
/// f32: exact below 2^24, and never 0 when one is true.
fn count(mask: &Tensor, dims: &[isize]) -> Result<Tensor> {
    let dev = mask.device();
    let one = Tensor::ones(&[], DType::F32)?.to_device(dev)?;
    let zero = Tensor::zeros(&[], DType::F32)?.to_device(dev)?;
    Tensor::where_(mask, &one, &zero)?.sum(dims, true)
}

/// Whether every (`all`) or some element of `x` over `dims` is non-zero
/// (NaN counts as non-zero), as bool: no zero (some non-zero) among them.
/// An empty reduction is true for all and false for any.
///
/// Errors: bad dims, a dtype without kernels (integers, f64), a device
/// failure.
pub(crate) fn truth_reduce(
    op: &'static str,
    x: &Tensor,
    dims: &[isize],
    keepdim: bool,
    all: bool,
) -> Result<Tensor> {
    let plan = Plan::new(op, x.layout(), dims, keepdim)?;
    let zero = Tensor::zeros(&[], x.dtype())?.to_device(x.device())?;
    let hits = compare(if all { CompareOp::Eq } else { CompareOp::Ne }, x, &zero)?;
    let n = count(&hits, dims)?;
    let out = if all {
        compare_scalar(op, CompareOp::Eq, &n, 0.0)?
    } else {
        compare_scalar(op, CompareOp::Gt, &n, 0.0)?
    };
    out.reshape(plan.out_shape.as_slice())
}
