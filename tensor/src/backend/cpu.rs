//! The CPU backend: the SIMD and scalar kernels of `ops/*/cpu.rs`.

use super::{Backend, BinaryOp, ReduceOp, UnaryOp};
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
