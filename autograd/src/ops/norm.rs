//! Normalization layers on [`Var`]: layer_norm, batch_norm, group_norm,
//! each the tensor crate's fused forward with its backward primitive. The
//! node saves the input, the statistics the forward returned and the
//! weight; weight and bias are optional inputs.

use tessera_tensor::{BatchNormOutput, Result, Tensor};

use super::registry::{self as reg, Op};
use super::{check_same, record_op};
use crate::{Saved, Var};

/// A normalization's input, weight and bias.
type NormInputs = (Var, Option<Var>, Option<Var>);

/// `x`, `weight` and `bias` cast as autocast's policy for `op` says, or
/// `None` when they stay as they are.
fn autocast_norm(op: Op, x: &Var, weight: Option<&Var>, bias: Option<&Var>) -> Result<Option<NormInputs>> {
    let mut all = vec![x];
    all.extend(weight);
    all.extend(bias);
    Ok(crate::autocast::cast_inputs(op, &all)?.map(|c| {
        let mut it = c.into_iter();
        let x = it.next().expect("x is always an input");
        let w = weight.and_then(|_| it.next());
        let b = bias.and_then(|_| it.next());
        (x, w, b)
    }))
}

/// The inputs of a normalization node: x, then weight and bias when given.
struct Params<'a> {
    inputs: Vec<&'a Var>,
    weight: Option<Saved>,
    has_weight: bool,
    has_bias: bool,
}

impl<'a> Params<'a> {
    fn new(op: Op, x: &'a Var, weight: Option<&'a Var>, bias: Option<&'a Var>) -> Result<Self> {
        let mut inputs = vec![x];
        for p in [weight, bias].into_iter().flatten() {
            check_same(op, x, p)?;
            inputs.push(p);
        }
        Ok(Params {
            inputs,
            weight: weight.map(Var::saved),
            has_weight: weight.is_some(),
            has_bias: bias.is_some(),
        })
    }

    /// The gradients (dx, dweight, dbias) mapped onto the node's inputs,
    /// keeping only those requested.
    fn route(
        has_weight: bool,
        has_bias: bool,
        needs: &[bool],
        grads: (Tensor, Tensor, Tensor),
    ) -> Vec<Option<Tensor>> {
        let (dx, dw, db) = grads;
        let mut out = vec![Some(dx)];
        if has_weight {
            out.push(Some(dw));
        }
        if has_bias {
            out.push(Some(db));
        }
        out.into_iter()
            .zip(needs)
            .map(|(g, &n)| g.filter(|_| n))
            .collect()
    }
}

impl Var {
    /// Layer normalization over the trailing dims `normalized_shape`, with
    /// optional elementwise `weight` and `bias` (shaped `normalized_shape`).
    /// Errors as [`Tensor::layer_norm`], or when weight/bias differ from
    /// `self` in dtype or device.
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> Result<Var> {
        if let Some((x, w, b)) = autocast_norm(reg::LAYER_NORM, self, weight, bias)? {
            return x.layer_norm(normalized_shape, w.as_ref(), b.as_ref(), eps);
        }
        let p = Params::new(reg::LAYER_NORM, self, weight, bias)?;
        let (y, mean, rstd) = self.tensor().layer_norm_forward(
            normalized_shape,
            weight.map(Var::tensor),
            bias.map(Var::tensor),
            eps,
        )?;
        let x = self.tensor().clone();
        let ns = normalized_shape.to_vec();
        let (w, hw, hb) = (p.weight, p.has_weight, p.has_bias);
        record_op(reg::LAYER_NORM, y, &p.inputs, move |g, needs| {
            let w = w.map(|s| s.get()).transpose()?;
            let grads = Tensor::layer_norm_backward(g, &x, &mean, &rstd, &ns, w.as_ref())?;
            Ok(Params::route(hw, hb, needs, grads))
        })
    }

    /// Batch normalization of `self` (`[N, C, *]`) per channel, in training
    /// (batch statistics; the running stats, when given, come back updated
    /// with `momentum`) or eval mode (the running stats are used and
    /// required). Gradients flow to `self`, `weight` and `bias`, through the
    /// batch statistics in training. Errors as [`Tensor::batch_norm`], or
    /// when weight/bias differ from `self` in dtype or device.
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        &self,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Var>,
        bias: Option<&Var>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<BatchNormOutput<Var>> {
        if let Some((x, w, b)) = autocast_norm(reg::BATCH_NORM, self, weight, bias)? {
            return x.batch_norm(
                running_mean,
                running_var,
                w.as_ref(),
                b.as_ref(),
                training,
                momentum,
                eps,
            );
        }
        let p = Params::new(reg::BATCH_NORM, self, weight, bias)?;
        let out = self.tensor().batch_norm_forward(
            running_mean,
            running_var,
            weight.map(Var::tensor),
            bias.map(Var::tensor),
            training,
            momentum,
            eps,
        )?;
        let x = self.tensor().clone();
        let (mean, invstd) = (out.mean, out.invstd);
        let (w, hw, hb) = (p.weight, p.has_weight, p.has_bias);
        let y = record_op(reg::BATCH_NORM, out.y, &p.inputs, move |g, needs| {
            let w = w.map(|s| s.get()).transpose()?;
            let grads = Tensor::batch_norm_backward(g, &x, &mean, &invstd, w.as_ref(), training)?;
            Ok(Params::route(hw, hb, needs, grads))
        })?;
        Ok(BatchNormOutput {
            y,
            running_mean: out.running_mean,
            running_var: out.running_var,
        })
    }

    /// Group normalization of `self` (`[N, C, *]`) with `num_groups` groups
    /// and optional per-channel `weight` and `bias` (`[C]`). Errors as
    /// [`Tensor::group_norm`], or when weight/bias differ from `self` in
    /// dtype or device.
    pub fn group_norm(
        &self,
        num_groups: usize,
        weight: Option<&Var>,
        bias: Option<&Var>,
        eps: f64,
    ) -> Result<Var> {
        if let Some((x, w, b)) = autocast_norm(reg::GROUP_NORM, self, weight, bias)? {
            return x.group_norm(num_groups, w.as_ref(), b.as_ref(), eps);
        }
        let p = Params::new(reg::GROUP_NORM, self, weight, bias)?;
        let (y, mean, rstd) = self.tensor().group_norm_forward(
            num_groups,
            weight.map(Var::tensor),
            bias.map(Var::tensor),
            eps,
        )?;
        let x = self.tensor().clone();
        let (w, hw, hb) = (p.weight, p.has_weight, p.has_bias);
        record_op(reg::GROUP_NORM, y, &p.inputs, move |g, needs| {
            let w = w.map(|s| s.get()).transpose()?;
            let grads = Tensor::group_norm_backward(g, &x, &mean, &rstd, num_groups, w.as_ref())?;
            Ok(Params::route(hw, hb, needs, grads))
        })
    }
}
