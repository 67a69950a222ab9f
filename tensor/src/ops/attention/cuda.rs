//! The CUDA path of fused attention: the flash-style forward and backward
//! of `tessera-cuda-kernels` (`kernels/attention.cu`), which read q, k, v
//! as contiguous `[batch·heads, T, D]` and keep the row log-sum-exp as the
//! CPU kernel does.
//!
//! What they cover ([`supports`]): no mask tensor and no dropout (the
//! kernels have neither), one head size for q/k/v (`E == Ev ≤ 128`), f32,
//! f16 or bf16, at most 65,535 (batch, head) matrices, and the causal mask
//! only when L == S (theirs is bottom-right, `j ≤ i + S − L`; PyTorch's
//! `is_causal` is top-left, and the two agree only for square scores).
//! Other calls compose attention from device ops
//! (`scaled_dot_product_attention_composite` in tessera-autograd).

use tessera_cuda_kernels::ops::attention::{attention_bwd, attention_fwd, AttnGrads, AttnMask, AttnShape};

use super::{Geom, SdpaArgs, SdpaGrads, SdpaOutput};
use crate::cuda::{
    common_device, contiguous, contiguous_ptr, kernel_err, launch, no_kernel, with_kernel_float, Output,
};
use crate::{DType, Result, Tensor};

/// Whether the kernels cover a call on `q` of sizes `g` with `args` (see
/// the module docs).
pub(crate) fn supports(q: &Tensor, g: &Geom, args: &SdpaArgs<'_>) -> bool {
    args.mask.is_none()
        && args.dropout.is_none()
        && g.e == g.ev
        && g.e <= 128
        && (!args.is_causal || g.l == g.s)
        && matches!(q.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && g.count() <= 65_535
}

/// `t` broadcast to `[batch.., rows, cols]`, contiguous on its device.
fn flat(t: &Tensor, g: &Geom, rows: usize, cols: usize) -> Result<Tensor> {
    contiguous(&t.broadcast_to(&g.shape(&[rows, cols]))?)
}

fn kernel_args(g: &Geom, args: &SdpaArgs<'_>) -> (AttnShape, AttnMask) {
    (
        AttnShape {
            batch: g.count(),
            heads: 1,
            lq: g.l,
            lk: g.s,
            head_dim: g.e,
        },
        AttnMask {
            scale: g.scale as f32,
            causal: args.is_causal,
            kv_len: None,
        },
    )
}

/// The GPU's [`Tensor::sdpa`] on operands [`supports`] admits.
pub(crate) fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Geom,
    args: &SdpaArgs<'_>,
) -> Result<SdpaOutput> {
    const OP: &str = "scaled_dot_product_attention";
    let state = common_device(OP, &[q, k, v])?;
    let (qc, kc, vc) = (
        flat(q, g, g.l, g.e)?,
        flat(k, g, g.s, g.e)?,
        flat(v, g, g.s, g.ev)?,
    );
    let o = Output::new(OP, &state, q.dtype(), g.count() * g.l * g.ev)?;
    let lse = Output::new(OP, &state, DType::F32, g.count() * g.l)?;
    let (shape, mask) = kernel_args(g, args);
    with_kernel_float!(q.dtype(), T => {
        let l = attention_fwd::<T>(
            &shape, &mask, contiguous_ptr(&qc), contiguous_ptr(&kc), contiguous_ptr(&vc), o.ptr(), lse.ptr(),
        ).map_err(kernel_err(OP, state.device()))?;
        launch(OP, &state, &[l])?;
    }, else return Err(no_kernel(OP, state.device(), format_args!("{} tensors", q.dtype()))));
    Ok(SdpaOutput {
        out: o.into_tensor(&g.shape(&[g.l, g.ev])),
        lse: lse.into_tensor(&g.shape(&[g.l])),
    })
}

/// The GPU's [`Tensor::sdpa_backward`] on operands [`supports`] admits.
pub(crate) fn backward(
    dout: &Tensor,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    fwd: &SdpaOutput,
    g: &Geom,
    args: &SdpaArgs<'_>,
) -> Result<SdpaGrads> {
    const OP: &str = "scaled_dot_product_attention_backward";
    let state = common_device(OP, &[dout, q, k, v, &fwd.out, &fwd.lse])?;
    let (qc, kc, vc) = (
        flat(q, g, g.l, g.e)?,
        flat(k, g, g.s, g.e)?,
        flat(v, g, g.s, g.ev)?,
    );
    let (d_o, o) = (contiguous(&dout.to_dtype(q.dtype())?)?, contiguous(&fwd.out)?);
    let lse = contiguous(&fwd.lse.to_dtype(DType::F32)?)?;
    let rows = g.count() * g.l;
    let dq = Output::zeros(OP, &state, q.dtype(), rows * g.e)?;
    let dk = Output::zeros(OP, &state, q.dtype(), g.count() * g.s * g.e)?;
    let dv = Output::zeros(OP, &state, q.dtype(), g.count() * g.s * g.ev)?;
    let workspace = Output::new(OP, &state, DType::F32, rows)?;
    let (shape, mask) = kernel_args(g, args);
    with_kernel_float!(q.dtype(), T => {
        let grads = AttnGrads::<T> {
            d_o: contiguous_ptr(&d_o),
            d_q: dq.ptr(),
            d_k: dk.ptr(),
            d_v: dv.ptr(),
            workspace: workspace.ptr(),
        };
        let ls = attention_bwd::<T>(
            &shape, &mask, contiguous_ptr(&qc), contiguous_ptr(&kc), contiguous_ptr(&vc),
            contiguous_ptr(&o), contiguous_ptr(&lse), &grads,
        ).map_err(kernel_err(OP, state.device()))?;
        launch(OP, &state, &ls)?;
    }, else return Err(no_kernel(OP, state.device(), format_args!("{} tensors", q.dtype()))));
    Ok(SdpaGrads {
        dq: dq.into_tensor(&g.shape(&[g.l, g.e])),
        dk: dk.into_tensor(&g.shape(&[g.s, g.e])),
        dv: dv.into_tensor(&g.shape(&[g.s, g.ev])),
        dmask: None,
    })
}
