//! GPU dispatch of the fused cross-entropy: the `ce_fwd`/`ce_bwd` kernels
//! of `softmax.cu` (one warp per row: max, Σ exp, Σ x and the target's
//! logit; label smoothing and `ignore_index` inside the kernels), so no
//! one-hot target weights are built. The targets are read back once to
//! check their range and count those not ignored (the mean's divisor), as
//! the CPU does; the losses are reduced on the device in f32.

use std::sync::Arc;

use tessera_cuda_kernels::ops::softmax::{cross_entropy_bwd, cross_entropy_fwd};

use super::{checked_targets, restore, rows, CrossEntropyOptions, Reduction};
use crate::cuda::{
    contiguous, contiguous_ptr, kernel_err, launch, no_kernel, with_kernel_float, DeviceState, Output,
};
use crate::{DType, Result, Tensor};

/// The classes of checked logits, the rows `[N, C]` and the number of
/// targets not ignored. Errors: a target out of range, a device failure.
fn prepare(
    op: &'static str,
    logits: &Tensor,
    target: &Tensor,
    opts: &CrossEntropyOptions,
) -> Result<(usize, Tensor, Tensor, usize)> {
    let c = if logits.ndim() == 1 {
        logits.shape()[0]
    } else {
        logits.shape()[1]
    };
    let targets = checked_targets(op, target, c, opts.ignore_index)?;
    let count = targets.iter().filter(|&&t| t != opts.ignore_index).count();
    Ok((c, rows(logits, c)?, contiguous(target)?, count))
}

/// (loss, lse) of checked GPU logits against i64 class indices, as
/// [`Tensor::cross_entropy_forward`].
///
/// Errors: a target out of range, a dtype without kernels (f64), a device
/// failure.
pub(crate) fn forward(
    state: &Arc<DeviceState>,
    logits: &Tensor,
    target: &Tensor,
    opts: CrossEntropyOptions,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "cross_entropy";
    let (c, x, t, count) = prepare(OP, logits, target, &opts)?;
    let n = x.shape()[0];
    with_kernel_float!(x.dtype(), T => {
        let loss = Output::new(OP, state, DType::F32, n)?;
        let lse = Output::new(OP, state, DType::F32, n)?;
        let l = cross_entropy_fwd::<T>(
            contiguous_ptr(&x),
            contiguous_ptr(&t),
            loss.ptr(),
            lse.ptr(),
            n,
            c,
            opts.ignore_index,
            opts.label_smoothing as f32,
        )
        .map_err(kernel_err(OP, state.device()))?;
        launch(OP, state, &[l])?;
        let loss = loss.into_tensor(&[n]);
        let loss = match opts.reduction {
            Reduction::None => loss.reshape(target.shape())?,
            Reduction::Sum => loss.sum(&[], false)?,
            // 0/0 is NaN when every target is ignored, as on the CPU.
            Reduction::Mean => loss.sum(&[], false)?.div_scalar(count as f64)?,
        };
        Ok((loss.to_dtype(logits.dtype())?, lse.into_tensor(&[n])))
    }, else Err(no_kernel(OP, state.device(), logits.dtype())))
}

/// dlogits of checked GPU operands, as [`Tensor::cross_entropy_backward`].
///
/// Errors: a target out of range, a dtype without kernels, a device failure.
pub(crate) fn backward(
    state: &Arc<DeviceState>,
    dloss: &Tensor,
    logits: &Tensor,
    target: &Tensor,
    lse: &Tensor,
    opts: CrossEntropyOptions,
) -> Result<Tensor> {
    const OP: &str = "cross_entropy_backward";
    let (c, x, t, count) = prepare(OP, logits, target, &opts)?;
    let n = x.shape()[0];
    // The upstream gradient of each row, in f32.
    let g = dloss.to_dtype(DType::F32)?;
    let g = match opts.reduction {
        Reduction::None => g.reshape([n])?,
        Reduction::Sum => g.reshape([1])?.broadcast_to(&[n])?,
        Reduction::Mean => g.div_scalar(count as f64)?.reshape([1])?.broadcast_to(&[n])?,
    };
    let g = contiguous(&g)?;
    let lse = contiguous(&lse.to_dtype(DType::F32)?.reshape([n])?)?;
    with_kernel_float!(x.dtype(), T => {
        let dx = Output::new(OP, state, x.dtype(), x.numel())?;
        let l = cross_entropy_bwd::<T>(
            contiguous_ptr(&x),
            contiguous_ptr(&t),
            contiguous_ptr(&lse),
            contiguous_ptr(&g),
            dx.ptr(),
            n,
            c,
            opts.ignore_index,
            opts.label_smoothing as f32,
        )
        .map_err(kernel_err(OP, state.device()))?;
        launch(OP, state, &[l])?;
        restore(dx.into_tensor(&[n, c]), logits.shape())
    }, else Err(no_kernel(OP, state.device(), logits.dtype())))
}
