//! Fused multi-tensor optimizer steps on a GPU: the `optim.cu` kernels of
//! `tessera-cuda-kernels`, one launch per group of tensors, updating
//! parameters and state buffers in place (LAMB: two launches). The optimizers of
//! `tessera-optim` call these for parameters on a GPU; the element math is
//! theirs (PyTorch's single-tensor rounding form in f32).

use tessera_cuda_kernels::ops::optim::{adamw, adamw_tables, lamb, sgd, sgd_tables, AdamTensor, SgdTensor};
/// The hyperparameters of one step (in f64, as the CPU optimizers take
/// them; `grad_scale` multiplies the gradients first).
pub use tessera_cuda_kernels::ops::optim::{AdamConfig, LambConfig, SgdConfig};
use tessera_cuda_kernels::DevPtr;

use super::{
    common_device, contiguous, contiguous_ptr, copy_into, kernel_err, launch, no_kernel, with_kernel_float,
    DeviceBuffer, DeviceState, Output,
};
use crate::{DType, Error, Layout, Result, Tensor};

/// One Adam/AdamW step of every `params[i]` from `grads[i]` with its moments
/// `exp_avg[i]`, `exp_avg_sq[i]`, in place, in one launch. Parameters and
/// moments are f32 on one GPU (a tensor sharing its storage with another is
/// first copied, as [`Tensor::make_mut`] does); the gradients f32, f16 or
/// bf16, one dtype.
///
/// Errors: lists of different lengths, shapes that differ, tensors on
/// different devices or not on a GPU, dtypes other than those, a device
/// failure.
pub fn adam_step_(
    params: &mut [&mut Tensor],
    grads: &[&Tensor],
    exp_avg: &mut [&mut Tensor],
    exp_avg_sq: &mut [&mut Tensor],
    c: &AdamConfig,
) -> Result<()> {
    const OP: &str = "adam_step_";
    let Some(state) = check(OP, &views(params), grads, &[&views(exp_avg), &views(exp_avg_sq)])? else {
        return Ok(());
    };
    own(OP, &state, params)?;
    own(OP, &state, exp_avg)?;
    own(OP, &state, exp_avg_sq)?;
    let grads = grads.iter().map(|g| contiguous(g)).collect::<Result<Vec<_>>>()?;
    with_kernel_float!(grads[0].dtype(), G => {
        let group: Vec<AdamTensor<G>> = (0..params.len())
            .map(|i| AdamTensor {
                param: contiguous_ptr(params[i]),
                grad: contiguous_ptr(&grads[i]),
                exp_avg: contiguous_ptr(exp_avg[i]),
                exp_avg_sq: contiguous_ptr(exp_avg_sq[i]),
            })
            .collect();
        let t = adamw_tables(&group).map_err(kernel_err(OP, state.device()))?;
        run(OP, &state, &t.tensors, &t.chunks, |tt, tc, n| adamw::<G>(tt, tc, n, c))
    }, else Err(no_kernel(OP, state.device(), format_args!("{} gradients", grads[0].dtype()))))
}

/// One LAMB step of every `params[i]` from `grads[i]` with its moments
/// `exp_avg[i]`, `exp_avg_sq[i]`, in place, in two launches (the moments
/// and per-tensor norms, then the trust-ratio update). Dtypes and devices
/// as [`adam_step_`].
///
/// Errors: as [`adam_step_`], and a clip factor below 1.
pub fn lamb_step_(
    params: &mut [&mut Tensor],
    grads: &[&Tensor],
    exp_avg: &mut [&mut Tensor],
    exp_avg_sq: &mut [&mut Tensor],
    c: &LambConfig,
) -> Result<()> {
    const OP: &str = "lamb_step_";
    let Some(state) = check(OP, &views(params), grads, &[&views(exp_avg), &views(exp_avg_sq)])? else {
        return Ok(());
    };
    own(OP, &state, params)?;
    own(OP, &state, exp_avg)?;
    own(OP, &state, exp_avg_sq)?;
    let grads = grads.iter().map(|g| contiguous(g)).collect::<Result<Vec<_>>>()?;
    with_kernel_float!(grads[0].dtype(), G => {
        let group: Vec<AdamTensor<G>> = (0..params.len())
            .map(|i| AdamTensor {
                param: contiguous_ptr(params[i]),
                grad: contiguous_ptr(&grads[i]),
                exp_avg: contiguous_ptr(exp_avg[i]),
                exp_avg_sq: contiguous_ptr(exp_avg_sq[i]),
            })
            .collect();
        let t = adamw_tables(&group).map_err(kernel_err(OP, state.device()))?;
        let partials = Output::new(OP, &state, DType::F32, t.chunks.len())?;
        run_all(OP, &state, &t.tensors, &t.chunks, |tt, tc, n| {
            lamb::<G>(tt, tc, n, partials.ptr(), c).map(Vec::from)
        })
    }, else Err(no_kernel(OP, state.device(), format_args!("{} gradients", grads[0].dtype()))))
}

/// One SGD step of every `params[i]` from `grads[i]` (and the momentum
/// buffers `momentum_buffers[i]`, empty without momentum), in place, in
/// one launch. Dtypes and devices as [`adam_step_`].
///
/// Errors: as [`adam_step_`], and momentum buffers missing with a momentum
/// (or given without one).
pub fn sgd_step_(
    params: &mut [&mut Tensor],
    grads: &[&Tensor],
    momentum_buffers: &mut [&mut Tensor],
    c: &SgdConfig,
) -> Result<()> {
    const OP: &str = "sgd_step_";
    let with_buffers = c.momentum != 0.0;
    if with_buffers == momentum_buffers.is_empty() {
        return Err(Error::arg(
            OP,
            format!(
                "{} momentum buffers for momentum {}",
                momentum_buffers.len(),
                c.momentum
            ),
        ));
    }
    let bufs = views(momentum_buffers);
    let states: &[&[&Tensor]] = if with_buffers { &[&bufs] } else { &[] };
    let Some(state) = check(OP, &views(params), grads, states)? else {
        return Ok(());
    };
    own(OP, &state, params)?;
    own(OP, &state, momentum_buffers)?;
    let grads = grads.iter().map(|g| contiguous(g)).collect::<Result<Vec<_>>>()?;
    with_kernel_float!(grads[0].dtype(), G => {
        let group: Vec<SgdTensor<G>> = (0..params.len())
            .map(|i| SgdTensor {
                param: contiguous_ptr(params[i]),
                grad: contiguous_ptr(&grads[i]),
                momentum_buffer: with_buffers.then(|| contiguous_ptr(momentum_buffers[i])),
            })
            .collect();
        let t = sgd_tables(&group).map_err(kernel_err(OP, state.device()))?;
        run(OP, &state, &t.tensors, &t.chunks, |tt, tc, n| sgd::<G>(tt, tc, n, c))
    }, else Err(no_kernel(OP, state.device(), format_args!("{} gradients", grads[0].dtype()))))
}

fn views<'a>(ts: &'a [&mut Tensor]) -> Vec<&'a Tensor> {
    ts.iter().map(|t| &**t).collect()
}

/// Checks the lists (lengths, shapes, dtypes, one GPU) and returns their
/// device; `None` for an empty group.
fn check(
    op: &'static str,
    params: &[&Tensor],
    grads: &[&Tensor],
    states: &[&[&Tensor]],
) -> Result<Option<std::sync::Arc<DeviceState>>> {
    let n = params.len();
    if grads.len() != n || states.iter().any(|s| s.len() != n) {
        return Err(Error::arg(
            op,
            format!(
                "{n} parameters, {} gradients and state lists of {:?} tensors",
                grads.len(),
                states.iter().map(|s| s.len()).collect::<Vec<_>>()
            ),
        ));
    }
    if n == 0 {
        return Ok(None);
    }
    let mut all: Vec<&Tensor> = params.iter().chain(grads).copied().collect();
    all.extend(states.iter().flat_map(|s| s.iter().copied()));
    let state = common_device(op, &all)?;
    let gdtype = grads[0].dtype();
    for i in 0..n {
        let p = &params[i];
        let bad = p.dtype() != DType::F32
            || grads[i].shape() != p.shape()
            || grads[i].dtype() != gdtype
            || states
                .iter()
                .any(|s| s[i].shape() != p.shape() || s[i].dtype() != DType::F32);
        if bad {
            return Err(Error::shape(
                op,
                format!(
                    "tensor {i}: parameter {:?} ({}), gradient {:?} ({}), state {:?}: parameters and state must be f32 of the parameter's shape, gradients one float dtype",
                    p.shape(),
                    p.dtype(),
                    grads[i].shape(),
                    grads[i].dtype(),
                    states.iter().map(|s| (s[i].shape().to_vec(), s[i].dtype())).collect::<Vec<_>>()
                ),
            ));
        }
    }
    Ok(Some(state))
}

/// Makes each tensor the sole, whole, contiguous owner of its device
/// storage (a fresh copy where it is not), so a kernel may write it in
/// place.
fn own(op: &'static str, state: &std::sync::Arc<DeviceState>, ts: &mut [&mut Tensor]) -> Result<()> {
    for t in ts {
        let whole = t.is_contiguous() && t.layout().offset() == 0 && t.numel() == t.storage().len();
        if whole && t.storage_mut().is_some() {
            continue;
        }
        let out = Output::new(op, state, t.dtype(), t.numel())?;
        copy_into(op, t, &out, &Layout::contiguous(t.shape()))?;
        **t = out.into_tensor(t.shape());
    }
    Ok(())
}

/// Uploads the tables and launches `make(tensors, chunks, n_chunks)`.
fn run(
    op: &'static str,
    state: &std::sync::Arc<DeviceState>,
    tensors: &[u64],
    chunks: &[u64],
    make: impl FnOnce(
        DevPtr<u64>,
        DevPtr<u64>,
        usize,
    ) -> tessera_cuda_kernels::Result<tessera_cuda_kernels::Launch>,
) -> Result<()> {
    run_all(op, state, tensors, chunks, |tt, tc, n| {
        make(tt, tc, n).map(|l| vec![l])
    })
}

/// Uploads the tables and launches the launches of `make(tensors, chunks,
/// n_chunks)` in order.
fn run_all(
    op: &'static str,
    state: &std::sync::Arc<DeviceState>,
    tensors: &[u64],
    chunks: &[u64],
    make: impl FnOnce(
        DevPtr<u64>,
        DevPtr<u64>,
        usize,
    ) -> tessera_cuda_kernels::Result<Vec<tessera_cuda_kernels::Launch>>,
) -> Result<()> {
    let tt = DeviceBuffer::upload(op, state, bytemuck::cast_slice(tensors))?;
    let tc = DeviceBuffer::upload(op, state, bytemuck::cast_slice(chunks))?;
    let ls = make(
        DevPtr::from_raw(tt.addr(), tensors.len()),
        DevPtr::from_raw(tc.addr(), chunks.len()),
        chunks.len() / 2,
    )
    .map_err(kernel_err(op, state.device()))?;
    // The tables live until the launches return; their frees are ordered after them.
    launch(op, state, &ls)
}
