//! The CPU backend: the SIMD and scalar kernels of `ops/*/cpu.rs`.

use super::{Backend, BinaryOp, CompareOp, ReduceOp, UnaryOp};
use crate::{Generator, Result, Tensor, TensorOptions};

/// Host memory, rayon threads and SIMD kernels.
pub(crate) struct Cpu;

impl Backend for Cpu {
    fn unary(&self, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
        crate::ops::unary::cpu::unary(op, x)
    }

    fn binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        crate::ops::binary::cpu::binary(op, a, b)
    }

    fn binary_scalar(
        &self,
        name: &'static str,
        op: BinaryOp,
        x: &Tensor,
        s: f64,
        reversed: bool,
    ) -> Result<Tensor> {
        crate::ops::binary::cpu::scalar(name, op, x, s, reversed)
    }

    fn reduce(&self, op: ReduceOp, x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        x.reduce_cpu(op, dims, keepdim)
    }

    fn mean(&self, x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        x.mean_cpu(dims, keepdim)
    }

    fn reduce_index(&self, max: bool, x: &Tensor, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)> {
        x.reduce_index_cpu(max, dim, keepdim)
    }

    fn arg_reduce(&self, max: bool, x: &Tensor, dim: Option<isize>, keepdim: bool) -> Result<Tensor> {
        x.arg_extreme(if max { "argmax" } else { "argmin" }, dim, keepdim, max)
    }

    fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        a.matmul_cpu(b)
    }

    fn softmax(&self, op: &'static str, x: &Tensor, dim: isize, log: bool) -> Result<Tensor> {
        x.softmax_cpu(op, dim, log)
    }

    fn layer_norm(
        &self,
        x: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        x.layer_norm_cpu(normalized_shape, weight, bias, eps)
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
        Tensor::layer_norm_backward_cpu(dy, x, mean, rstd, normalized_shape, weight)
    }

    fn embedding(&self, weight: &Tensor, indices: &Tensor) -> Result<Tensor> {
        weight.embedding_cpu(indices)
    }

    fn embedding_backward(
        &self,
        grad: &Tensor,
        indices: &Tensor,
        num_weights: usize,
        padding_idx: Option<usize>,
    ) -> Result<Tensor> {
        crate::ops::index::embedding::embedding_backward_cpu(grad, indices, num_weights, padding_idx)
    }

    fn view_backward(&self, grad: &Tensor, base: &[usize], view: &crate::Layout) -> Result<Tensor> {
        crate::ops::view_backward::cpu(grad, base, view)
    }

    fn full(&self, op: &'static str, shape: &[usize], value: f64, opts: TensorOptions) -> Result<Tensor> {
        Tensor::full_cpu(op, shape, value, opts)
    }

    fn uniform(
        &self,
        shape: &[usize],
        a: f64,
        b: f64,
        opts: TensorOptions,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        Tensor::uniform_cpu(shape, a, b, opts, gen)
    }

    fn normal(
        &self,
        shape: &[usize],
        mean: f64,
        std: f64,
        opts: TensorOptions,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        Tensor::normal_cpu(shape, mean, std, opts, gen)
    }

    fn cat(&self, parts: &[Tensor], dim: usize, shape: &[usize]) -> Result<Tensor> {
        crate::ops::join::cpu_cat(parts, dim, shape)
    }

    fn linear(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        act: crate::ops::matmul::Activation,
    ) -> Result<Tensor> {
        crate::ops::matmul::cpu_linear(x, weight, bias, act)
    }

    fn conv2d(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        g: &crate::ops::conv::Geom,
    ) -> Result<Tensor> {
        crate::ops::conv::cpu_forward(x, weight, bias, g)
    }

    fn conv2d_backward_input(
        &self,
        grad_out: &Tensor,
        weight: &Tensor,
        g: &crate::ops::conv::Geom,
    ) -> Result<Tensor> {
        crate::ops::conv::cpu_backward_input(grad_out, weight, g)
    }

    fn conv2d_backward_weight(
        &self,
        grad_out: &Tensor,
        input: &Tensor,
        g: &crate::ops::conv::Geom,
    ) -> Result<Tensor> {
        crate::ops::conv::cpu_backward_weight(grad_out, input, g)
    }

    fn max_pool2d(&self, x: &Tensor, w: &crate::ops::pool::Window) -> Result<(Tensor, Tensor)> {
        crate::ops::pool::cpu_max_pool2d(x, w)
    }

    fn max_pool2d_backward(
        &self,
        grad_out: &Tensor,
        indices: &Tensor,
        input_shape: &[usize],
    ) -> Result<Tensor> {
        crate::ops::pool::cpu_max_pool2d_backward(grad_out, indices, input_shape)
    }

    fn softmax_backward(
        &self,
        op: &'static str,
        dy: &Tensor,
        y: &Tensor,
        dim: isize,
        log: bool,
    ) -> Result<Tensor> {
        crate::ops::softmax_backward::cpu(op, dy, y, dim, log)
    }

    fn compare(&self, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        crate::ops::compare::cpu_compare(op, a, b)
    }

    fn compare_scalar(&self, name: &'static str, op: CompareOp, x: &Tensor, s: f64) -> Result<Tensor> {
        crate::ops::compare::cpu_compare_scalar(name, op, x, s)
    }

    fn logical(&self, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        crate::ops::compare::cpu_logical(op, a, b)
    }

    fn where_(&self, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        crate::ops::compare::cpu_where(cond, a, b)
    }

    fn clamp(&self, x: &Tensor, lo: f64, hi: f64) -> Result<Tensor> {
        x.clamp_cpu(lo, hi)
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
        x.var_mean_impl(op, dims, correction, keepdim, sqrt)
    }

    fn logsumexp(&self, x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        x.logsumexp_cpu(dims, keepdim)
    }

    fn norm(&self, x: &Tensor, p: f64, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        x.norm_cpu(p, dims, keepdim)
    }

    fn truth_reduce(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: &[isize],
        keepdim: bool,
        all: bool,
    ) -> Result<Tensor> {
        x.truth(op, dims, keepdim, all)
    }

    fn addmm(&self, c: &Tensor, a: &Tensor, b: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        c.addmm_cpu(a, b, beta, alpha)
    }

    fn avg_pool2d(&self, x: &Tensor, w: &crate::ops::pool::Window) -> Result<Tensor> {
        crate::ops::pool::cpu_avg_pool2d(x, w)
    }

    fn avg_pool2d_backward(&self, grad_out: &Tensor, w: &crate::ops::pool::Window) -> Result<Tensor> {
        crate::ops::pool::cpu_avg_pool2d_backward(grad_out, w)
    }

    fn adaptive_avg_pool2d(&self, x: &Tensor, out: [usize; 2]) -> Result<Tensor> {
        crate::ops::pool::cpu_adaptive_avg_pool2d(x, out)
    }

    fn adaptive_avg_pool2d_backward(&self, grad_out: &Tensor, input_shape: &[usize]) -> Result<Tensor> {
        crate::ops::pool::cpu_adaptive_avg_pool2d_backward(grad_out, input_shape)
    }

    fn cross_entropy(
        &self,
        logits: &Tensor,
        target: &Tensor,
        opts: crate::CrossEntropyOptions,
    ) -> Result<(Tensor, Tensor)> {
        crate::ops::cross_entropy::cpu_forward(logits, target, opts)
    }

    fn cross_entropy_backward(
        &self,
        dloss: &Tensor,
        logits: &Tensor,
        target: &Tensor,
        lse: &Tensor,
        opts: crate::CrossEntropyOptions,
    ) -> Result<Tensor> {
        crate::ops::cross_entropy::cpu_backward(dloss, logits, target, lse, opts)
    }

    fn batch_norm_stats(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        crate::ops::batch_norm::cpu_stats(x)
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
        crate::ops::batch_norm::cpu_forward(
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
        crate::ops::batch_norm::cpu_backward(dy, x, mean, invstd, weight, training)
    }

    fn tri(&self, op: &'static str, x: &Tensor, diagonal: isize, lower: bool) -> Result<Tensor> {
        x.triangle(op, diagonal, lower)
    }

    fn scan(&self, op: &'static str, x: &Tensor, dim: isize, prod: bool) -> Result<Tensor> {
        x.scan(op, dim, prod)
    }

    fn pad(&self, x: &Tensor, pads: &[usize], mode: crate::ops::pad::PadMode) -> Result<Tensor> {
        crate::ops::pad::cpu_pad(x, pads, mode)
    }

    fn gather(
        &self,
        op: &'static str,
        x: &Tensor,
        index: &Tensor,
        g: &crate::ops::index::Gather,
    ) -> Result<Tensor> {
        crate::ops::index::cpu_gather(op, x, index, g)
    }

    fn group_norm(
        &self,
        x: &Tensor,
        g: &crate::ops::group_norm::Groups,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        x.group_norm_cpu(g, weight, bias, eps)
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
        Tensor::group_norm_backward_cpu(dy, x, mean, rstd, g, weight)
    }

    fn topk(&self, x: &Tensor, d: usize, k: usize, largest: bool) -> Result<(Tensor, Tensor)> {
        x.select_along(d, k, largest)
    }

    fn masked_fill(&self, x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor> {
        x.masked_fill_cpu(mask, value)
    }

    fn upsample_bilinear2d(
        &self,
        x: &Tensor,
        out: [usize; 2],
        align_corners: bool,
        scales: [Option<f64>; 2],
    ) -> Result<Tensor> {
        x.upsample_bilinear2d_cpu(out, align_corners, scales)
    }

    fn upsample_bilinear2d_backward(
        &self,
        grad_out: &Tensor,
        input_shape: &[usize],
        align_corners: bool,
        scales: [Option<f64>; 2],
    ) -> Result<Tensor> {
        crate::ops::interpolate::cpu_upsample_bilinear2d_backward(
            grad_out,
            input_shape,
            align_corners,
            scales,
        )
    }

    fn scatter(
        &self,
        op: &'static str,
        x: &Tensor,
        d: usize,
        index: &Tensor,
        how: crate::ops::index::Scatter<'_>,
    ) -> Result<Tensor> {
        crate::ops::index::cpu_scatter(op, x, d, index, how)
    }

    fn sdpa_supports(
        &self,
        _q: &Tensor,
        _g: &crate::ops::attention::Geom,
        _args: &crate::SdpaArgs<'_>,
    ) -> bool {
        true
    }

    fn sdpa(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g: &crate::ops::attention::Geom,
        args: &crate::SdpaArgs<'_>,
    ) -> Result<crate::SdpaOutput> {
        crate::ops::attention::cpu::forward(q, k, v, g, args)
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
        crate::ops::attention::cpu::backward(dout, q, k, v, fwd, g, args, mask_grad)
    }

    fn host_kernel(&self, _op: &'static str) -> Result<()> {
        Ok(())
    }
}
