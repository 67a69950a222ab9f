//! The CUDA backend: the kernels of `tessera-cuda-kernels` on a GPU or its
//! emulator. Every method is a kernel launch or a named refusal.

use std::sync::Arc;

use super::{no_kernel, Backend, BinaryOp, CompareOp, ReduceOp, UnaryOp};
use crate::cuda::DeviceState;
use crate::ops;
use crate::{Generator, Result, Tensor, TensorOptions};

/// One opened GPU.
pub(crate) struct Cuda {
    state: Arc<DeviceState>,
}

impl Cuda {
    /// GPU `ordinal`, opened (once per process). Errors, naming `op`, when
    /// it is not available.
    pub(crate) fn open(op: &'static str, ordinal: usize) -> Result<Self> {
        Ok(Cuda {
            state: crate::cuda::device(op, ordinal)?,
        })
    }
}

impl Backend for Cuda {
    fn unary(&self, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
        ops::unary::cuda::unary(x, op)
    }

    fn binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        ops::binary::cuda::binary(a, b, op.name(), op)
    }

    fn binary_scalar(
        &self,
        name: &'static str,
        op: BinaryOp,
        x: &Tensor,
        s: f64,
        reversed: bool,
    ) -> Result<Tensor> {
        ops::binary::cuda::scalar(x, s, name, op, reversed)
    }

    fn reduce(&self, op: ReduceOp, x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        ops::reduce::cuda::reduce(x, op, dims, keepdim)
    }

    fn mean(&self, x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        ops::reduce::cuda::mean(x, dims, keepdim)
    }

    fn reduce_index(&self, max: bool, x: &Tensor, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        ops::reduce::cuda::extreme_dim(x, dim, keepdim, max)
    }

    fn arg_reduce(&self, max: bool, x: &Tensor, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        ops::reduce::cuda::arg_extreme(x, dim, keepdim, max)
    }

    fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        ops::matmul::cuda::matmul(a, b)
    }

    fn softmax(&self, op: &'static str, x: &Tensor, dim: isize, log: bool) -> Result<Tensor> {
        ops::softmax::cuda::softmax(x, op, dim, log)
    }

    fn layer_norm(
        &self,
        x: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        ops::layer_norm::cuda::layer_norm(x, normalized_shape, weight, bias, eps)
    }

    fn layer_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        ops::layer_norm::cuda::layer_norm_backward(dy, x, mean, rstd, normalized_shape, weight)
    }

    fn embedding(&self, weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
        ops::index::cuda::embedding(weight, indices)
    }

    fn embedding_backward(
        &self,
        grad: &Tensor,
        indices: &Tensor,
        num_weights: usize,
        padding_idx: Option<usize>,
    ) -> Result<Tensor> {
        ops::index::cuda::embedding_backward(grad, indices, num_weights, padding_idx)
    }

    fn view_backward(&self, grad: &Tensor, base: &[usize], view: &crate::Layout) -> Result<Tensor> {
        const OP: &str = "view_backward";
        let out = crate::cuda::Output::zeros(OP, &self.state, grad.dtype(), base.iter().product())?;
        crate::cuda::copy_into(OP, grad, &out, view)?;
        Ok(out.into_tensor(base))
    }

    fn cat(&self, parts: &[Tensor], dim: usize, shape: &[usize]) -> Result<Tensor> {
        const OP: &str = "cat";
        let dtype = parts.first().map_or(crate::DType::F32, Tensor::dtype);
        let out = crate::cuda::Output::new(OP, &self.state, dtype, shape.iter().product())?;
        let full = crate::Layout::contiguous(shape);
        let mut start = 0;
        for p in parts {
            let len = p.shape()[dim];
            let at = full.narrow(dim as isize, start, len)?;
            crate::cuda::copy_into(OP, p, &out, &at)?;
            start += len;
        }
        Ok(out.into_tensor(shape))
    }

    fn linear(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        act: crate::ops::matmul::Activation,
    ) -> Result<Tensor> {
        ops::matmul::cuda::linear(x, weight, bias, act)
    }

    fn conv2d(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        g: &crate::ops::conv::Geom,
    ) -> Result<Tensor> {
        ops::conv::cuda::forward(&self.state, x, weight, bias, g)
    }

    fn conv2d_backward_input(
        &self,
        grad_out: &Tensor,
        weight: &Tensor,
        g: &crate::ops::conv::Geom,
    ) -> Result<Tensor> {
        ops::conv::cuda::backward_input(&self.state, grad_out, weight, g)
    }

    fn conv2d_backward_weight(
        &self,
        grad_out: &Tensor,
        input: &Tensor,
        g: &crate::ops::conv::Geom,
    ) -> Result<Tensor> {
        ops::conv::cuda::backward_weight(&self.state, grad_out, input, g)
    }

    fn max_pool2d(&self, x: &Tensor, w: &crate::ops::pool::Window) -> Result<(Tensor, Tensor)> {
        ops::pool::cuda::max_pool2d(&self.state, x, w)
    }

    fn max_pool2d_backward(
        &self,
        grad_out: &Tensor,
        indices: &Tensor,
        input_shape: &[usize],
    ) -> Result<Tensor> {
        ops::pool::cuda::max_pool2d_backward(&self.state, grad_out, indices, input_shape)
    }

    fn softmax_backward(
        &self,
        _op: &'static str,
        dy: &Tensor,
        y: &Tensor,
        dim: isize,
        log: bool,
    ) -> Result<Tensor> {
        // Composed of device ops: dx = y·(dy − Σ dy·y), or dy − exp(y)·Σ dy.
        if log {
            dy.sub(&y.exp()?.mul(&dy.sum(&[dim], true)?)?)
        } else {
            y.mul(&dy.sub(&dy.mul(y)?.sum(&[dim], true)?)?)
        }
    }

    fn full(&self, op: &'static str, shape: &[usize], value: f64, opts: TensorOptions) -> Result<Tensor> {
        // No fill kernel reproduces every dtype's value exactly: the CPU
        // writes it and one copy moves it.
        crate::cuda::host_then_upload(opts, |o| Tensor::full_cpu(op, shape, value, o))
    }

    fn uniform(
        &self,
        shape: &[usize],
        a: f64,
        b: f64,
        opts: TensorOptions,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        ops::random::cuda::uniform(shape, a, b, opts, gen)
    }

    fn normal(
        &self,
        shape: &[usize],
        mean: f64,
        std: f64,
        opts: TensorOptions,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        ops::random::cuda::normal(shape, mean, std, opts, gen)
    }

    fn compare(&self, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        ops::compare::cuda::compare(op, a, b)
    }

    fn compare_scalar(&self, name: &'static str, op: CompareOp, x: &Tensor, s: f64) -> Result<Tensor> {
        ops::compare::cuda::compare_scalar(name, op, x, s)
    }

    fn logical(&self, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        ops::compare::cuda::logical(op, a, b)
    }

    fn where_(&self, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        ops::compare::cuda::where_(cond, a, b)
    }

    fn clamp(&self, x: &Tensor, lo: f64, hi: f64) -> Result<Tensor> {
        ops::unary::cuda::clamp(x, lo, hi)
    }

    fn var_mean(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: &[isize],
        correction: f64,
        keepdim: bool,
        sqrt: bool,
    ) -> Result<(Tensor, Tensor)> {
        ops::reduce::stats_cuda::var_mean(op, x, dims, correction, keepdim, sqrt)
    }

    fn logsumexp(&self, x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        ops::reduce::stats_cuda::logsumexp(x, dims, keepdim)
    }

    fn norm(&self, x: &Tensor, p: f64, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        ops::reduce::stats_cuda::norm(x, p, dims, keepdim)
    }

    fn truth_reduce(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: &[isize],
        keepdim: bool,
        all: bool,
    ) -> Result<Tensor> {
        ops::reduce::stats_cuda::truth_reduce(op, x, dims, keepdim, all)
    }

    fn addmm(&self, c: &Tensor, a: &Tensor, b: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        ops::matmul::cuda::addmm(c, a, b, beta, alpha)
    }

    fn avg_pool2d(&self, x: &Tensor, w: &crate::ops::pool::Window) -> Result<Tensor> {
        ops::pool::cuda::avg_pool2d(&self.state, x, w)
    }

    fn avg_pool2d_backward(&self, grad_out: &Tensor, w: &crate::ops::pool::Window) -> Result<Tensor> {
        ops::pool::cuda::avg_pool2d_backward(&self.state, grad_out, w)
    }

    fn adaptive_avg_pool2d(&self, x: &Tensor, out: [usize; 2]) -> Result<Tensor> {
        ops::pool::cuda::adaptive_avg_pool2d(&self.state, x, out)
    }

    fn adaptive_avg_pool2d_backward(&self, grad_out: &Tensor, input_shape: &[usize]) -> Result<Tensor> {
        ops::pool::cuda::adaptive_avg_pool2d_backward(&self.state, grad_out, input_shape)
    }

    fn cross_entropy(
        &self,
        logits: &Tensor,
        target: &Tensor,
        opts: crate::CrossEntropyOptions,
    ) -> Result<(Tensor, Tensor)> {
        ops::cross_entropy::cuda::forward(&self.state, logits, target, opts)
    }

    fn cross_entropy_backward(
        &self,
        dloss: &Tensor,
        logits: &Tensor,
        target: &Tensor,
        lse: &Tensor,
        opts: crate::CrossEntropyOptions,
    ) -> Result<Tensor> {
        ops::cross_entropy::cuda::backward(&self.state, dloss, logits, target, lse, opts)
    }

    fn batch_norm_stats(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        ops::batch_norm::cuda::stats(x)
    }

    fn batch_norm(
        &self,
        x: &Tensor,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<crate::ops::batch_norm::BatchNormForward> {
        ops::batch_norm::cuda::forward(
            x,
            running_mean,
            running_var,
            weight,
            bias,
            training,
            momentum,
            eps,
        )
    }

    fn batch_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        invstd: &Tensor,
        weight: Option<&Tensor>,
        training: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        ops::batch_norm::cuda::backward(dy, x, mean, invstd, weight, training)
    }

    fn tri(&self, op: &'static str, x: &Tensor, diagonal: isize, lower: bool) -> Result<Tensor> {
        ops::tri::cuda::tri(op, x, diagonal, lower)
    }

    fn scan(&self, op: &'static str, x: &Tensor, dim: isize, prod: bool) -> Result<Tensor> {
        ops::cumsum::cuda::scan(op, x, dim, prod)
    }

    fn pad(&self, x: &Tensor, pads: &[usize], mode: crate::ops::pad::PadMode) -> Result<Tensor> {
        ops::pad::cuda::pad(x, pads, mode)
    }

    fn gather(
        &self,
        op: &'static str,
        x: &Tensor,
        index: &Tensor,
        g: &crate::ops::index::Gather,
    ) -> Result<Tensor> {
        ops::index::cuda::gather(op, x, index, g)
    }

    fn group_norm(
        &self,
        x: &Tensor,
        g: &crate::ops::group_norm::Groups,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        ops::group_norm::cuda::forward(x, g, weight, bias, eps)
    }

    fn group_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        g: &crate::ops::group_norm::Groups,
        weight: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        ops::group_norm::cuda::backward(dy, x, mean, rstd, g, weight)
    }

    fn topk(&self, x: &Tensor, d: usize, k: usize, largest: bool) -> Result<(Tensor, Tensor)> {
        ops::topk::cuda::topk(x, d, k, largest)
    }

    fn masked_fill(&self, x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor> {
        ops::index::cuda::masked_fill(x, mask, value)
    }

    fn upsample_bilinear2d(
        &self,
        x: &Tensor,
        out: [usize; 2],
        align_corners: bool,
        scales: [Option<f64>; 2],
    ) -> Result<Tensor> {
        ops::interpolate::cuda::upsample(&self.state, x, out, align_corners, scales)
    }

    fn upsample_bilinear2d_backward(
        &self,
        grad_out: &Tensor,
        input_shape: &[usize],
        align_corners: bool,
        scales: [Option<f64>; 2],
    ) -> Result<Tensor> {
        ops::interpolate::cuda::upsample_backward(&self.state, grad_out, input_shape, align_corners, scales)
    }

    fn scatter(
        &self,
        op: &'static str,
        x: &Tensor,
        d: usize,
        index: &Tensor,
        how: crate::ops::index::Scatter<'_>,
    ) -> Result<Tensor> {
        ops::index::cuda::scatter(op, x, d, index, how)
    }

    fn sdpa_supports(&self, q: &Tensor, g: &crate::ops::attention::Geom, args: &crate::SdpaArgs<'_>) -> bool {
        ops::attention::cuda::supports(q, g, args)
    }

    fn sdpa(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g: &crate::ops::attention::Geom,
        args: &crate::SdpaArgs<'_>,
    ) -> Result<crate::SdpaOutput> {
        ops::attention::cuda::forward(q, k, v, g, args)
    }

    fn sdpa_backward(
        &self,
        dout: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        fwd: &crate::SdpaOutput,
        g: &crate::ops::attention::Geom,
        args: &crate::SdpaArgs<'_>,
        mask_grad: bool,
    ) -> Result<crate::SdpaGrads> {
        if mask_grad {
            return Err(no_kernel(
                "scaled_dot_product_attention_backward",
                self.state.device(),
                "a mask gradient",
            ));
        }
        ops::attention::cuda::backward(dout, (q, k, v), fwd, g, args)
    }

    fn host_kernel(&self, op: &'static str) -> Result<()> {
        Err(no_kernel(op, self.state.device(), "this op"))
    }
}
