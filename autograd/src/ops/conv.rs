//! Spatial ops on [`Var`] that wrap a fused tensor kernel together with its
//! backward kernel: `conv2d`, max/avg/adaptive-avg pooling and bilinear
//! interpolation.

use tessera_tensor::ops::conv::{
    conv2d_backward_bias, conv2d_backward_input, conv2d_backward_weight, Conv2dParams,
};
use tessera_tensor::ops::interpolate::upsample_bilinear2d_backward;
use tessera_tensor::ops::pool::{
    adaptive_avg_pool2d_backward, avg_pool2d_backward, max_pool2d_backward, Pool2dParams,
};
use tessera_tensor::{Result, Tensor};

use super::registry as reg;
use super::{check_same, record_op};
use crate::Var;

impl Var {
    /// 2-D convolution (cross-correlation, as PyTorch) of `self`
    /// `[N, C, H, W]` with `weight` `[O, C/groups, kh, kw]` and an optional
    /// `bias` `[O]`; returns `[N, O, OH, OW]`. Stride, padding, dilation and
    /// groups (depthwise when `groups == C`) come from `p`.
    ///
    /// Errors as [`Tensor::conv2d`], and when the dtypes or devices differ.
    pub fn conv2d(&self, weight: &Var, bias: Option<&Var>, p: &Conv2dParams) -> Result<Var> {
        let mut all = vec![self, weight];
        all.extend(bias);
        if let Some(c) = crate::autocast::cast_inputs(reg::CONV2D, &all)? {
            return c[0].conv2d(&c[1], c.get(2), p);
        }
        check_same(reg::CONV2D, self, weight)?;
        if let Some(b) = bias {
            check_same(reg::CONV2D, self, b)?;
        }
        let y = self.tensor().conv2d(weight.tensor(), bias.map(Var::tensor), p)?;
        let x = weight.requires_grad().then(|| self.saved());
        let w = self.requires_grad().then(|| weight.saved());
        let (x_shape, w_shape, p) = (self.shape().to_vec(), weight.shape().to_vec(), *p);
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        record_op(reg::CONV2D, y, &inputs, move |g, needs| {
            let x = x.map(|s| s.get()).transpose()?;
            let w = w.map(|s| s.get()).transpose()?;
            let gx = match (needs[0], &w) {
                (true, Some(w)) => Some(conv2d_backward_input(g, w, &x_shape, &p)?),
                _ => None,
            };
            let gw = match (needs[1], &x) {
                (true, Some(x)) => Some(conv2d_backward_weight(g, x, &w_shape, &p)?),
                _ => None,
            };
            let mut grads = vec![gx, gw];
            if needs.len() == 3 {
                grads.push(if needs[2] {
                    Some(conv2d_backward_bias(g)?)
                } else {
                    None
                });
            }
            Ok(grads)
        })
    }

    /// Max pooling over the last two dimensions of a 3-D or 4-D value; the
    /// gradient goes to the position of each window's maximum.
    ///
    /// Errors as [`Tensor::max_pool2d`].
    pub fn max_pool2d(&self, p: &Pool2dParams) -> Result<Var> {
        Ok(self.max_pool2d_with_indices(p)?.0)
    }

    /// [`Var::max_pool2d`] also returning the i64 index of each maximum in
    /// its flattened `H·W` plane (PyTorch's `return_indices=True`).
    ///
    /// Errors as [`Tensor::max_pool2d`].
    pub fn max_pool2d_with_indices(&self, p: &Pool2dParams) -> Result<(Var, Tensor)> {
        let (y, idx) = self.tensor().max_pool2d_with_indices(p)?;
        let (saved, shape) = (idx.clone(), self.shape().to_vec());
        let y = record_op(reg::MAX_POOL2D, y, &[self], move |g, _| {
            Ok(vec![Some(max_pool2d_backward(g, &saved, &shape)?)])
        })?;
        Ok((y, idx))
    }

    /// Average pooling over the last two dimensions of a 3-D or 4-D value.
    ///
    /// Errors as [`Tensor::avg_pool2d`].
    pub fn avg_pool2d(&self, p: &Pool2dParams) -> Result<Var> {
        let y = self.tensor().avg_pool2d(p)?;
        let (shape, p) = (self.shape().to_vec(), *p);
        record_op(reg::AVG_POOL2D, y, &[self], move |g, _| {
            Ok(vec![Some(avg_pool2d_backward(g, &shape, &p)?)])
        })
    }

    /// Adaptive average pooling of a 3-D or 4-D value to spatial size `out`.
    ///
    /// Errors as [`Tensor::adaptive_avg_pool2d`].
    pub fn adaptive_avg_pool2d(&self, out: [usize; 2]) -> Result<Var> {
        let y = self.tensor().adaptive_avg_pool2d(out)?;
        let shape = self.shape().to_vec();
        record_op(reg::ADAPTIVE_AVG_POOL2D, y, &[self], move |g, _| {
            Ok(vec![Some(adaptive_avg_pool2d_backward(g, &shape)?)])
        })
    }

    /// Bilinear interpolation of a 4-D `[N, C, H, W]` value to exactly one of
    /// `size` or `scale_factor` (PyTorch's `F.interpolate(mode="bilinear")`).
    ///
    /// Errors as [`Tensor::interpolate_bilinear`].
    pub fn interpolate_bilinear(
        &self,
        size: Option<[usize; 2]>,
        scale_factor: Option<[f64; 2]>,
        align_corners: bool,
    ) -> Result<Var> {
        let y = self
            .tensor()
            .interpolate_bilinear(size, scale_factor, align_corners)?;
        // The forward's coordinate scale: the factors when given, else the sizes.
        let scales = match scale_factor {
            Some(f) => [Some(f[0]), Some(f[1])],
            None => [None, None],
        };
        let shape = self.shape().to_vec();
        record_op(reg::INTERPOLATE_BILINEAR, y, &[self], move |g, _| {
            Ok(vec![Some(upsample_bilinear2d_backward(
                g,
                &shape,
                align_corners,
                scales,
            )?)])
        })
    }
}
