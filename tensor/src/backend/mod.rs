//! The backend layer: the one way from an op to a kernel.
//!
//! Every op validates its arguments, then calls [`dispatch`] with its
//! tensor operands, which checks they share one device and returns that
//! device's [`Backend`]: [`cpu::Cpu`] for host memory, `cuda::Cuda` (feature
//! `cuda`) for a GPU or the emulated one. The trait has no default methods,
//! so each backend states, for every kernel, what it does: a GPU kernel, or
//! an [`Error::Device`] naming the op and the device
//! ([`no_kernel`]). Whether an op has a GPU path is therefore read off one
//! `impl` block and checked by the compiler; the CPU-only engines (`zip_map`,
//! `make_mut`, host-built creation ops) say so through
//! [`Backend::host_kernel`], the one place the CUDA backend refuses them.
//!
//! Dispatch happens once per op call, never per element: the CPU kernels
//! behind [`cpu::Cpu`] are the same monomorphised loops as before. An op
//! validates its arguments before dispatching, so both backends receive
//! checked operands (conv2d gets its `Geom`, max pooling its `Window`).
//! Some CUDA methods are compositions of other device ops (linear: GEMM
//! and a broadcast add; softmax gradients; conv2d: im2col/col2im around the
//! device GEMM), which is still a GPU path the compiler checks.
//!
//! # Adding an elementwise op
//!
//! A unary function (a fused `(g, x)` derivative rule is a binary one) is
//! touched in five places, and the compiler points at each one left out:
//! 1. its definition: a variant of [`UnaryOp`] (or [`BinaryOp`]) in
//!    `tessera-cuda-kernels/src/op_codes.rs` with its names, plus the one-line
//!    `Tensor` method calling [`Tensor::unary_op`] (`ops/unary/mod.rs`);
//! 2. its CPU math: its arm in `ops/unary/cpu.rs`' `unary` (exhaustive
//!    match; a SIMD kernel in `simd/` is optional);
//! 3. its CUDA math: `unary_<NAME>` in `cuda-kernels/src/kernels/elementwise.cu`
//!    (the `switch` is generated from the op list, so a missing function
//!    does not compile);
//! 4. its derivative rule: the `Var` method in `tessera-autograd/src/ops/`,
//!    composed of tensor ops (with a fused `BinaryOp` where it pays);
//! 5. its test row: `ops/unary/tests.rs` (CPU against f64); the
//!    device-equivalence test in `tests/it/cuda_backend.rs` runs every
//!    variant of `UnaryOp::ALL` / `BinaryOp::ALL` on the emulated GPU
//!    against the CPU without being told.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;

use std::borrow::Borrow;

pub use tessera_cuda_kernels::op_codes::{BinaryOp, CompareOp, ReduceOp, UnaryOp};

use crate::{Device, Error, Result, Tensor};

/// The kernels of one kind of device. Arguments are validated by the
/// `Tensor` op calling in only as far as dispatch needs; each method
/// returns the errors of the op of the same name.
pub(crate) trait Backend {
    /// `op` of every element of `x`.
    fn unary(&self, op: UnaryOp, x: &Tensor) -> Result<Tensor>;
    /// `op` of `a` and `b` with broadcasting, in the promoted dtype.
    fn binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    /// `x op s` (`s op x` when `reversed`) for a scalar `s`, reported as `name`.
    fn binary_scalar(
        &self,
        name: &'static str,
        op: BinaryOp,
        x: &Tensor,
        s: f64,
        reversed: bool,
    ) -> Result<Tensor>;
    /// `op` over `dims` of `x`.
    fn reduce(&self, op: ReduceOp, x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor>;
    /// The mean over `dims` of `x`.
    fn mean(&self, x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor>;
    /// The max (or min) along `dim` and the index of its first occurrence.
    fn reduce_index(&self, max: bool, x: &Tensor, dim: isize, keepdim: bool) -> Result<(Tensor, Tensor)>;
    /// The index of the first max (or min) along `dim` (flattened: `None`).
    fn arg_reduce(&self, max: bool, x: &Tensor, dim: Option<isize>, keepdim: bool) -> Result<Tensor>;
    /// `a @ b` with broadcast batch dims.
    fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    /// Softmax (log-softmax when `log`) along `dim`, reported as `op`.
    fn softmax(&self, op: &'static str, x: &Tensor, dim: isize, log: bool) -> Result<Tensor>;
    /// LayerNorm forward: (y, mean, rstd).
    fn layer_norm(
        &self,
        x: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)>;
    /// LayerNorm backward: (dx, dweight, dbias).
    fn layer_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)>;
    /// Rows of `weight` picked by `indices`.
    fn embedding(&self, weight: &Tensor, indices: &Tensor) -> Result<Tensor>;
    /// The gradient of `embedding` for a `[num_weights, D]` table.
    fn embedding_backward(
        &self,
        grad: &Tensor,
        indices: &Tensor,
        num_weights: usize,
        padding_idx: Option<usize>,
    ) -> Result<Tensor>;
    /// A zero tensor of shape `base` with `grad` written where the view
    /// `view` (over a contiguous `base`) reads: the gradient of narrow,
    /// slice, select and other injective views.
    fn view_backward(&self, grad: &Tensor, base: &[usize], view: &crate::Layout) -> Result<Tensor>;
    /// `parts` (one dtype, contiguous or not, equal outside `dim`) joined
    /// along `dim` into a tensor of `shape`.
    fn cat(&self, parts: &[Tensor], dim: usize, shape: &[usize]) -> Result<Tensor>;
    /// `x·wᵀ + bias` with `act` fused, arguments checked.
    fn linear(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        act: crate::ops::matmul::Activation,
    ) -> Result<Tensor>;
    /// 2-D convolution of checked operands with geometry `g`.
    fn conv2d(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        g: &crate::ops::conv::Geom,
    ) -> Result<Tensor>;
    /// The input gradient of a convolution with geometry `g`.
    fn conv2d_backward_input(
        &self,
        grad_out: &Tensor,
        weight: &Tensor,
        g: &crate::ops::conv::Geom,
    ) -> Result<Tensor>;
    /// The weight gradient of a convolution with geometry `g`.
    fn conv2d_backward_weight(
        &self,
        grad_out: &Tensor,
        input: &Tensor,
        g: &crate::ops::conv::Geom,
    ) -> Result<Tensor>;
    /// Max pooling of a checked input: (values, i64 plane indices).
    fn max_pool2d(&self, x: &Tensor, w: &crate::ops::pool::Window) -> Result<(Tensor, Tensor)>;
    /// The input gradient of max pooling from the forward's indices.
    fn max_pool2d_backward(
        &self,
        grad_out: &Tensor,
        indices: &Tensor,
        input_shape: &[usize],
    ) -> Result<Tensor>;
    /// The gradient of softmax (log-softmax when `log`) along `dim` from
    /// its output `y`, reported as `op`.
    fn softmax_backward(
        &self,
        op: &'static str,
        dy: &Tensor,
        y: &Tensor,
        dim: isize,
        log: bool,
    ) -> Result<Tensor>;
    /// A fresh tensor of `shape` with every element `value`, reported as `op`.
    fn full(
        &self,
        op: &'static str,
        shape: &[usize],
        value: f64,
        opts: crate::TensorOptions,
    ) -> Result<Tensor>;
    /// Uniform samples in [a, b) from `gen` (the global generator when `None`).
    fn uniform(
        &self,
        shape: &[usize],
        a: f64,
        b: f64,
        opts: crate::TensorOptions,
        gen: Option<&mut crate::Generator>,
    ) -> Result<Tensor>;
    /// Normal samples with `mean` and `std` from `gen`.
    fn normal(
        &self,
        shape: &[usize],
        mean: f64,
        std: f64,
        opts: crate::TensorOptions,
        gen: Option<&mut crate::Generator>,
    ) -> Result<Tensor>;
    /// `op` of `a` and `b` (one dtype) with broadcasting, as bool.
    fn compare(&self, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    /// `op` of `x` and the scalar `s`, reported as `name`, as bool.
    fn compare_scalar(&self, name: &'static str, op: CompareOp, x: &Tensor, s: f64) -> Result<Tensor>;
    /// The logical `op` (and, or, xor) of the truth values of `a` and `b`.
    fn logical(&self, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    /// `a` where the bool `cond` is true, else `b`, broadcast, promoted.
    fn where_(&self, cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    /// `x` clamped to checked bounds [`lo`, `hi`].
    fn clamp(&self, x: &Tensor, lo: f64, hi: f64) -> Result<Tensor>;
    /// The variance over `dims` (its square root when `sqrt`) and the mean,
    /// reported as `op`.
    fn var_mean(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: &[isize],
        correction: f64,
        keepdim: bool,
        sqrt: bool,
    ) -> Result<(Tensor, Tensor)>;
    /// log Σ exp over `dims`.
    fn logsumexp(&self, x: &Tensor, dims: &[isize], keepdim: bool) -> Result<Tensor>;
    /// The vector `p`-norm over `dims` (p not NaN).
    fn norm(&self, x: &Tensor, p: f64, dims: &[isize], keepdim: bool) -> Result<Tensor>;
    /// Whether every (`all`) or some element over `dims` is non-zero, as bool.
    fn truth_reduce(
        &self,
        op: &'static str,
        x: &Tensor,
        dims: &[isize],
        keepdim: bool,
        all: bool,
    ) -> Result<Tensor>;
    /// `beta·c + alpha·(a·b)` for checked matrices, `c` broadcast to the product.
    fn addmm(&self, c: &Tensor, a: &Tensor, b: &Tensor, beta: f64, alpha: f64) -> Result<Tensor>;
    /// Average pooling of a checked input.
    fn avg_pool2d(&self, x: &Tensor, w: &crate::ops::pool::Window) -> Result<Tensor>;
    /// The input gradient of average pooling.
    fn avg_pool2d_backward(&self, grad_out: &Tensor, w: &crate::ops::pool::Window) -> Result<Tensor>;
    /// Adaptive average pooling of a checked input to `out`.
    fn adaptive_avg_pool2d(&self, x: &Tensor, out: [usize; 2]) -> Result<Tensor>;
    /// The input gradient of adaptive average pooling (shapes checked).
    fn adaptive_avg_pool2d_backward(&self, grad_out: &Tensor, input_shape: &[usize]) -> Result<Tensor>;
    /// Fused cross-entropy forward: (loss, lse).
    fn cross_entropy(
        &self,
        logits: &Tensor,
        target: &Tensor,
        opts: crate::CrossEntropyOptions,
    ) -> Result<(Tensor, Tensor)>;
    /// Fused cross-entropy backward: dlogits.
    fn cross_entropy_backward(
        &self,
        dloss: &Tensor,
        logits: &Tensor,
        target: &Tensor,
        lse: &Tensor,
        opts: crate::CrossEntropyOptions,
    ) -> Result<Tensor>;
    /// Per-channel mean and biased variance of a checked `[N, C, *]` input.
    fn batch_norm_stats(&self, x: &Tensor) -> Result<(Tensor, Tensor)>;
    /// Batch normalization forward (see [`Tensor::batch_norm_forward`]).
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<crate::ops::batch_norm::BatchNormForward>;
    /// Batch normalization backward: (dx, dweight, dbias).
    fn batch_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        invstd: &Tensor,
        weight: Option<&Tensor>,
        training: bool,
    ) -> Result<(Tensor, Tensor, Tensor)>;
    /// The lower (`lower`) or upper triangle about `diagonal`, reported as `op`.
    fn tri(&self, op: &'static str, x: &Tensor, diagonal: isize, lower: bool) -> Result<Tensor>;
    /// The running sum (product when `prod`) along `dim`, reported as `op`.
    fn scan(&self, op: &'static str, x: &Tensor, dim: isize, prod: bool) -> Result<Tensor>;
    /// `x` padded by checked `pads` with `mode`.
    fn pad(&self, x: &Tensor, pads: &[usize], mode: crate::ops::pad::PadMode) -> Result<Tensor>;
    /// The checked gather `g` of `x` by the i64 `index` (index_select,
    /// gather), reported as `op`.
    fn gather(
        &self,
        op: &'static str,
        x: &Tensor,
        index: &Tensor,
        g: &crate::ops::index::Gather,
    ) -> Result<Tensor>;
    /// Group normalization forward of a checked input: (y, mean, rstd).
    fn group_norm(
        &self,
        x: &Tensor,
        g: &crate::ops::group_norm::Groups,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)>;
    /// Group normalization backward of checked operands: (dx, dweight, dbias).
    fn group_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        mean: &Tensor,
        rstd: &Tensor,
        g: &crate::ops::group_norm::Groups,
        weight: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)>;
    /// The first `k` elements along dim `d` (largest first when `largest`)
    /// and their i64 positions: topk, sort, argsort.
    fn topk(&self, x: &Tensor, d: usize, k: usize, largest: bool) -> Result<(Tensor, Tensor)>;
    /// `value` where the bool `mask` is true, `x` elsewhere.
    fn masked_fill(&self, x: &Tensor, mask: &Tensor, value: f64) -> Result<Tensor>;
    /// Bilinear resampling of a checked `[N, C, H, W]` input to `out`.
    fn upsample_bilinear2d(
        &self,
        x: &Tensor,
        out: [usize; 2],
        align_corners: bool,
        scales: [Option<f64>; 2],
    ) -> Result<Tensor>;
    /// The input gradient of bilinear resampling (shapes checked).
    fn upsample_bilinear2d_backward(
        &self,
        grad_out: &Tensor,
        input_shape: &[usize],
        align_corners: bool,
        scales: [Option<f64>; 2],
    ) -> Result<Tensor>;
    /// The checked scatter `how` of `x` along `d` by `index`, reported as `op`.
    fn scatter(
        &self,
        op: &'static str,
        x: &Tensor,
        d: usize,
        index: &Tensor,
        how: crate::ops::index::Scatter<'_>,
    ) -> Result<Tensor>;

    /// Whether [`Backend::sdpa`] has a kernel for a call on `q` of sizes
    /// `g` with `args` (else the caller composes attention from other ops).
    fn sdpa_supports(&self, q: &Tensor, g: &crate::ops::attention::Geom, args: &crate::SdpaArgs<'_>) -> bool;
    /// Fused attention of checked operands: (output, row log-sum-exp).
    fn sdpa(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        g: &crate::ops::attention::Geom,
        args: &crate::SdpaArgs<'_>,
    ) -> Result<crate::SdpaOutput>;
    /// The gradients of [`Backend::sdpa`] from the output gradient `dout`.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<crate::SdpaGrads>;
    /// `Ok(())` when the op named `op`, whose only kernel is the CPU's, may
    /// run on this backend; the CUDA backend's refusal.
    fn host_kernel(&self, op: &'static str) -> Result<()>;
}

/// The backend chosen for one op call.
pub(crate) enum Dispatch {
    /// Host memory.
    Cpu(cpu::Cpu),
    /// A GPU (or the emulated one).
    #[cfg(feature = "cuda")]
    Cuda(cuda::Cuda),
}

impl std::ops::Deref for Dispatch {
    type Target = dyn Backend;
    fn deref(&self) -> &(dyn Backend + 'static) {
        match self {
            Dispatch::Cpu(c) => c,
            #[cfg(feature = "cuda")]
            Dispatch::Cuda(c) => c,
        }
    }
}

/// The backend of the device every operand is on (the CPU without
/// operands), holding the op's profiler span ([`crate::profile`]) until it
/// is dropped: at the end of the statement that calls the kernel. Errors,
/// naming `op`: operands on different devices (the error names both), or a
/// GPU that cannot be opened.
pub(crate) fn dispatch(op: &'static str, operands: &[&dyn Operands]) -> Result<Spanned> {
    let backend = on_device(op, same_device(op, operands)?.unwrap_or(Device::Cpu))?;
    if matches!(backend, Dispatch::Cpu(_)) {
        crate::thread_pool::keep_warm();
    }
    let span = crate::profile::span(op, || {
        let mut shapes = Vec::new();
        for o in operands {
            o.each(&mut |t| shapes.push(t.shape().to_vec()));
        }
        shapes
    });
    Ok(Spanned { backend, _span: span })
}

/// A [`Dispatch`] with the profiler span of the op it serves.
pub(crate) struct Spanned {
    backend: Dispatch,
    _span: crate::profile::Span,
}

impl std::ops::Deref for Spanned {
    type Target = dyn Backend;
    fn deref(&self) -> &(dyn Backend + 'static) {
        &*self.backend
    }
}

/// The backend of `device`, for ops that create tensors. Errors, naming
/// `op`, when the device cannot be opened.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub(crate) fn on_device(op: &'static str, device: Device) -> Result<Dispatch> {
    match device {
        Device::Cpu => Ok(Dispatch::Cpu(cpu::Cpu)),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => Ok(Dispatch::Cuda(cuda::Cuda::open(op, n)?)),
    }
}

/// What an op can take as tensor operands: a tensor, an optional one, or a
/// slice of them.
pub(crate) trait Operands {
    /// Calls `f` with each tensor.
    fn each(&self, f: &mut dyn FnMut(&Tensor));
}

impl Operands for Tensor {
    fn each(&self, f: &mut dyn FnMut(&Tensor)) {
        f(self);
    }
}

impl<T: Operands + ?Sized> Operands for &T {
    fn each(&self, f: &mut dyn FnMut(&Tensor)) {
        (**self).each(f);
    }
}

impl Operands for Option<&Tensor> {
    fn each(&self, f: &mut dyn FnMut(&Tensor)) {
        if let Some(t) = self {
            f(t);
        }
    }
}

impl<T: Borrow<Tensor>> Operands for [T] {
    fn each(&self, f: &mut dyn FnMut(&Tensor)) {
        for t in self {
            f(t.borrow());
        }
    }
}

/// The device every operand is on (`None` without operands). Errors,
/// naming `op` and both devices, when they differ.
pub(crate) fn same_device(op: &'static str, operands: &[&dyn Operands]) -> Result<Option<Device>> {
    let mut first = None;
    let mut other = None;
    for o in operands {
        o.each(&mut |t| match (first, t.device()) {
            (None, d) => first = Some(d),
            (Some(f), d) if f != d && other.is_none() => other = Some(d),
            _ => {}
        });
    }
    match (first, other) {
        (Some(a), Some(b)) => Err(Error::device(
            op,
            format!("operands are on different devices ({a} and {b}); move them to one device with .to_device first"),
        )),
        _ => Ok(first),
    }
}

/// `t` on `other`'s device when `t` is a 0-d CPU tensor and `other` is not
/// on the CPU; otherwise `t` itself. Errors when the copy fails.
fn scalar_to(t: &Tensor, other: &Tensor) -> Result<Tensor> {
    if t.ndim() == 0 && t.device().is_cpu() && !other.device().is_cpu() {
        t.to_device(other.device())
    } else {
        Ok(t.clone())
    }
}

/// The error for an op (or a dtype of it) without a kernel on `dev`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn no_kernel(op: &'static str, dev: Device, what: impl std::fmt::Display) -> Error {
    Error::device(
        op,
        format!("not implemented on {dev} for {what}; call .to_device(Device::Cpu) first"),
    )
}

impl Tensor {
    /// `op` of every element through the backend of `self`'s device: the
    /// body of every elementwise unary method. Errors as the op named by
    /// `op` (dtype, device).
    pub fn unary_op(&self, op: UnaryOp) -> Result<Tensor> {
        dispatch(op.name(), &[self])?.unary(op, self)
    }

    /// `op` of `self` and `other` with broadcasting through the backend of
    /// their device. Errors as the op named by `op` (shapes that do not
    /// broadcast, dtypes, devices).
    /// A 0-d CPU operand with a GPU one is copied to the GPU first, as
    /// PyTorch treats CPU scalars.
    pub fn binary_op(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        let a = scalar_to(self, other)?;
        let b = scalar_to(other, &a)?;
        dispatch(op.name(), &[&a, &b])?.binary(op, &a, &b)
    }

    /// `self op s` (`s op self` when `reversed`) through the backend of
    /// `self`'s device. Errors as [`Tensor::binary_op`].
    pub(crate) fn scalar_op(
        &self,
        name: &'static str,
        op: BinaryOp,
        s: f64,
        reversed: bool,
    ) -> Result<Tensor> {
        dispatch(name, &[self])?.binary_scalar(name, op, self, s, reversed)
    }

    /// `Err` naming `op` and the device when `self` is on a GPU: the guard
    /// of the CPU engines (`zip_map`, `make_mut`, ...).
    #[cfg(feature = "cuda")]
    pub(crate) fn cpu_only(&self, op: &'static str) -> Result<()> {
        dispatch(op, &[self])?.host_kernel(op)
    }
}
