//! Random tensors on a GPU. f32 `rand` runs the Philox kernel of
//! `tessera-cuda-kernels`, which draws the same 24-bit uniforms from the
//! same `(seed, offset)` words as the CPU generator, bit for bit. Other
//! draws (f16/bf16 uniforms keep fewer bits, normals use 53-bit Box–Muller
//! in f64, general bounds round from f64) are generated on the host and
//! copied, so every device sees the same numbers for a seed.

use tessera_cuda_kernels::ops::elementwise::uniform as uniform_launch;

use crate::cuda::{device, kernel_err, launch, Output};
use crate::ops::creation::TensorOptions;
use crate::rng::{reserve, Generator};
use crate::{DType, Device, Result, Tensor};

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
    let (Device::Cuda(ordinal), DType::F32, true) = (opts.device, opts.dtype, a == 0.0 && b == 1.0) else {
        return on_host(opts, |o| Tensor::uniform_impl(shape, a, b, o, gen));
    };
    let state = device(OP, ordinal)?;
    let n = TensorOptions {
        device: Device::Cpu,
        ..opts
    }
    .check(OP, shape)?;
    let (seed, word) = reserve(gen, n, 4).seed_and_word();
    let out = Output::new(OP, &state, DType::F32, n)?;
    if n > 0 {
        let l = uniform_launch::<f32>(out.ptr(), n, seed, word, 0.0, 1.0)
            .map_err(kernel_err(OP, state.device()))?;
        launch(OP, &state, &[l])?;
    }
    Ok(out.into_tensor(shape))
}

/// `make` run for the CPU, then copied to `opts.device`.
pub(crate) fn on_host(
    opts: TensorOptions,
    make: impl FnOnce(TensorOptions) -> Result<Tensor>,
) -> Result<Tensor> {
    crate::cuda::host_then_upload(opts, make)
}
