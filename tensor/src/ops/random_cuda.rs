//! Random tensors on a GPU, generated there by the Philox kernels of
//! `tessera-cuda-kernels` from the same `(seed, offset)` blocks as the CPU
//! generator: `rand` of f32/f16/bf16 (as many random bits as the dtype
//! holds) bit for bit, and `randn`/`normal` of f32/f16/bf16 (Box–Muller in
//! f64 on 53-bit uniforms, rounded once) up to the last bit of CUDA's f64
//! `log`/`cos`/`sin`, which can move a result by one ulp of the dtype when
//! it lies on a rounding boundary. Other draws (f64, general uniform bounds,
//! which the CPU computes in f64) are generated on the host and copied, so
//! every device sees the same numbers for a seed.

use tessera_cuda_kernels::ops::elementwise::{normal as normal_launch, uniform as uniform_launch};

use crate::cuda::{device, kernel_err, launch, with_kernel_float, Output};
use crate::ops::creation::TensorOptions;
use crate::rng::{reserve, Generator};
use crate::{Device, Result, Tensor};

/// Uniform samples in [a, b) on `opts.device` (a GPU). Errors as
/// [`Tensor::uniform`], and when the device is not available.
pub(crate) fn uniform(
    shape: &[usize],
    a: f64,
    b: f64,
    opts: TensorOptions,
    gen: Option<&mut Generator>,
) -> Result<Tensor> {
    const OP: &str = "uniform";
    let Device::Cuda(ordinal) = opts.device else {
        return on_host(opts, |o| Tensor::uniform_impl(shape, a, b, o, gen));
    };
    if !(a == 0.0 && b == 1.0) {
        return on_host(opts, |o| Tensor::uniform_impl(shape, a, b, o, gen));
    }
    with_kernel_float!(opts.dtype, T => {
        let n = host_options(opts).check(OP, shape)?;
        let state = device(OP, ordinal)?;
        let (seed, word) = reserve(gen, n, 4).seed_and_word();
        let out = Output::new(OP, &state, opts.dtype, n)?;
        let l = uniform_launch::<T>(out.ptr(), n, seed, word, 0.0, 1.0).map_err(kernel_err(OP, state.device()))?;
        launch(OP, &state, &[l])?;
        Ok(out.into_tensor(shape))
    }, else on_host(opts, |o| Tensor::uniform_impl(shape, a, b, o, gen)))
}

/// Normal samples with `mean` and `std` on `opts.device` (a GPU). Errors
/// as [`Tensor::normal`], and when the device is not available.
pub(crate) fn normal(
    shape: &[usize],
    mean: f64,
    std: f64,
    opts: TensorOptions,
    gen: Option<&mut Generator>,
) -> Result<Tensor> {
    const OP: &str = "normal";
    let Device::Cuda(ordinal) = opts.device else {
        return on_host(opts, |o| Tensor::normal_impl(shape, mean, std, o, gen));
    };
    with_kernel_float!(opts.dtype, T => {
        let n = host_options(opts).check(OP, shape)?;
        super::check_normal(OP, mean, std)?;
        let state = device(OP, ordinal)?;
        let (seed, block) = reserve(gen, n, 2).seed_and_block();
        let out = Output::new(OP, &state, opts.dtype, n)?;
        let l = normal_launch::<T>(out.ptr(), n, seed, block, mean, std).map_err(kernel_err(OP, state.device()))?;
        launch(OP, &state, &[l])?;
        Ok(out.into_tensor(shape))
    }, else on_host(opts, |o| Tensor::normal_impl(shape, mean, std, o, gen)))
}

/// `opts` on the CPU, to check a shape without the device error.
fn host_options(opts: TensorOptions) -> TensorOptions {
    TensorOptions {
        device: Device::Cpu,
        ..opts
    }
}

/// `make` run for the CPU, then copied to `opts.device`.
pub(crate) fn on_host(
    opts: TensorOptions,
    make: impl FnOnce(TensorOptions) -> Result<Tensor>,
) -> Result<Tensor> {
    crate::cuda::host_then_upload(opts, make)
}
