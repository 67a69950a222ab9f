//! Group normalization: channels split into groups, each (sample, group)
//! normalized on its own, then a per-channel affine; forward and backward.

#[cfg(feature = "cuda")]
#[path = "group_norm_cuda.rs"]
pub(crate) mod cuda;

use crate::ops::norm_common::{
    channel_sums, check_eps, check_float, check_grad, param, row_stats, rows_backward, rows_forward,
    stats_tensor, tensor_from,
};
use crate::{Element, Error, FloatElement, FloatMath, Result, Tensor};

impl Tensor {
    /// Group normalization of `x` (`[N, C, *]`) with `num_groups` groups of
    /// C/num_groups channels (PyTorch's `F.group_norm`):
    /// y = (x − mean)·rstd·weight[c] + bias[c], the statistics taken per
    /// sample and group. Errors for non-float input, fewer than 2 dims, C
    /// not divisible by `num_groups`, parameters without C elements, or a
    /// bad eps.
    pub fn group_norm(
        &self,
        num_groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        Ok(self.group_norm_forward(num_groups, weight, bias, eps)?.0)
    }

    /// [`Tensor::group_norm`] also returning what
    /// [`Tensor::group_norm_backward`] takes: (y, mean, rstd) with mean/rstd
    /// of shape `[N, num_groups]` in f32 (f64 for f64 input). Errors as
    /// [`Tensor::group_norm`].
    pub fn group_norm_forward(
        &self,
        num_groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "group_norm";
        let be = crate::backend::dispatch(OP, &[self, &weight, &bias])?;
        let g = Groups::of(OP, self, num_groups)?;
        check_eps(OP, eps)?;
        for (name, p) in [("weight", weight), ("bias", bias)] {
            check_param(OP, name, p, self, g.c)?;
        }
        be.group_norm(self, &g, weight, bias, eps)
    }

    /// The CPU kernel of [`Tensor::group_norm_forward`] (arguments checked).
    pub(crate) fn group_norm_cpu(
        &self,
        g: &Groups,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "group_norm";
        let (g, num_groups) = (*g, g.groups);
        let x = self.contiguous()?;
        crate::with_float_dtype!(self.dtype(), T => {
            type M = <T as FloatElement>::Math;
            let w = param::<M>(OP, "weight", weight, self, g.c)?;
            let b = param::<M>(OP, "bias", bias, self, g.c)?;
            let xs = x.as_slice::<T>()?;
            let (mean, rstd) = row_stats(OP, xs, g.n * num_groups, g.k(), eps)?;
            let y = rows_forward(xs, g.k(), &mean, &rstd, |r, i| {
                let c = g.channel(r, i);
                (w.as_ref().map_or(<M as FloatMath>::ONE, |w| w[c]), b.as_ref().map_or(<M as FloatMath>::ZERO, |b| b[c]))
            });
            let shape = [g.n, num_groups];
            Ok((tensor_from(&y, self.shape())?, stats_tensor(&mean, &shape, self.dtype())?, stats_tensor(&rstd, &shape, self.dtype())?))
        }, else Err(Error::dtype(OP, format!("expects a float tensor, got {}", self.dtype()))))
    }

    /// The gradients of [`Tensor::group_norm`] given `dy`, the input `x`
    /// and the saved `mean`/`rstd` (`[N, num_groups]`): (dx, dweight, dbias),
    /// dweight = Σ dy·x̂ and dbias = Σ dy per channel (`[C]`, `x`'s dtype).
    /// Errors when shapes, dtypes or sizes disagree.
    pub fn group_norm_backward(
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        num_groups: usize,
        weight: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "group_norm_backward";
        let be = crate::backend::dispatch(OP, &[dy, x, mean, rstd, &weight])?;
        let g = Groups::of(OP, x, num_groups)?;
        check_grad(OP, dy, x)?;
        check_param(OP, "weight", weight, x, g.c)?;
        check_param(OP, "mean", Some(mean), x, g.n * num_groups)?;
        check_param(OP, "rstd", Some(rstd), x, g.n * num_groups)?;
        be.group_norm_backward(dy, x, mean, rstd, &g, weight)
    }

    /// The CPU kernel of [`Tensor::group_norm_backward`] (arguments checked).
    pub(crate) fn group_norm_backward_cpu(
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        g: &Groups,
        weight: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "group_norm_backward";
        let (g, num_groups) = (*g, g.groups);
        let (xc, dyc) = (x.contiguous()?, dy.contiguous()?);
        crate::with_float_dtype!(x.dtype(), T => {
            type M = <T as FloatElement>::Math;
            let rows = g.n * num_groups;
            let w = param::<M>(OP, "weight", weight, x, g.c)?;
            let mean = param::<M>(OP, "mean", Some(mean), x, rows)?.unwrap_or_default();
            let rstd = param::<M>(OP, "rstd", Some(rstd), x, rows)?.unwrap_or_default();
            let (xs, dys) = (xc.as_slice::<T>()?, dyc.as_slice::<T>()?);
            let dx = rows_backward(dys, xs, g.k(), &mean, &rstd, |r, i| {
                w.as_ref().map_or(<M as FloatMath>::ONE, |w| w[g.channel(r, i)])
            });
            let (dw, db) = channel_sums(g.n, g.c, g.s, |ni, ci, at| {
                let r = ni * num_groups + ci / g.per_group;
                let d = dys[at].to_f64();
                (d * (xs[at].to_f64() - mean[r].f64()) * rstd[r].f64(), d)
            });
            let to_t = |v: Vec<f64>| -> Vec<T> { v.into_iter().map(<T as Element>::from_f64).collect() };
            Ok((tensor_from(&dx, x.shape())?, tensor_from(&to_t(dw), &[g.c])?, tensor_from(&to_t(db), &[g.c])?))
        }, else Err(Error::dtype(OP, format!("expects a float tensor, got {}", x.dtype()))))
    }
}

/// The grouping of a `[N, C, *]` input: rows are (sample, group) pairs of
/// `per_group · s` contiguous elements.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Groups {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) s: usize,
    pub(crate) groups: usize,
    per_group: usize,
}

impl Groups {
    fn of(op: &'static str, x: &Tensor, groups: usize) -> Result<Groups> {
        check_float(op, x)?;
        if x.ndim() < 2 {
            return Err(Error::shape(
                op,
                format!("expects an input [N, C, *], got shape {:?}", x.shape()),
            ));
        }
        let (n, c) = (x.shape()[0], x.shape()[1]);
        if groups == 0 || c % groups != 0 {
            return Err(Error::arg(
                op,
                format!(
                    "{c} channels (input shape {:?}) cannot be split into {groups} groups",
                    x.shape()
                ),
            ));
        }
        // The statistics are [N, groups]: that count must fit too.
        crate::tensor::checked_numel(op, &[n, groups])?;
        Ok(Groups {
            n,
            c,
            s: x.shape()[2..].iter().product(),
            groups,
            per_group: c / groups,
        })
    }

    /// Elements per row.
    pub(crate) fn k(&self) -> usize {
        self.per_group * self.s
    }

    /// The channel of element `i` of row `r`.
    fn channel(&self, r: usize, i: usize) -> usize {
        (r % self.groups) * self.per_group + i / self.s
    }
}

/// Errors, naming `op`, unless the optional `t` is a float tensor of
/// `numel` elements on `x`'s device.
fn check_param(op: &'static str, what: &str, t: Option<&Tensor>, x: &Tensor, numel: usize) -> Result<()> {
    let Some(t) = t else { return Ok(()) };
    x.device().same_as(t.device(), op)?;
    if !t.dtype().is_float() || t.numel() != numel {
        return Err(Error::shape(
            op,
            format!(
                "{what} of shape {:?} ({}) should be a float tensor of {numel} elements for input of shape {:?}",
                t.shape(),
                t.dtype(),
                x.shape()
            ),
        ));
    }
    Ok(())
}
