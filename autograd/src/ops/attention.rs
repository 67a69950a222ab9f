//! Scaled dot-product attention on [`Var`]s (PyTorch's
//! `F.scaled_dot_product_attention`): the fused kernel of the tensor
//! backend ([`Tensor::sdpa`], FlashAttention-2: no `[.., L, S]` weights
//! kept) with its fused backward as one node, and the composition of
//! matmul, masking, softmax and dropout
//! ([`scaled_dot_product_attention_composite`]) where the device has no
//! fused kernel for the call.

use tessera_tensor::{DType, Error, Result, SdpaArgs, SdpaMask, SdpaOutput, Tensor};

use super::registry as reg;
use super::{record_op, sum_to};
use crate::autocast::autocast_entry;
use crate::Var;

/// A mask for [`scaled_dot_product_attention`], broadcasting against the
/// `[..., L, S]` attention scores.
#[derive(Debug, Clone, Copy)]
pub enum AttnMask<'a> {
    /// Added to the scores (a learnable bias when it requires a gradient;
    /// −∞ removes a position).
    Additive(&'a Var),
    /// A bool mask: `true` where a query may attend to a key.
    Keep(&'a Tensor),
}

/// Options of [`scaled_dot_product_attention`]; the default is PyTorch's
/// (no mask, no dropout, not causal, scale `1/√E`).
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnOptions<'a> {
    /// An optional mask (not together with `is_causal`).
    pub mask: Option<AttnMask<'a>>,
    /// Dropout probability on the attention weights (drawn from the default
    /// generator; 0 draws nothing).
    pub dropout_p: f64,
    /// Query `i` attends only to keys `j ≤ i` (the top-left causal mask).
    pub is_causal: bool,
    /// The factor applied to `q·kᵀ`; `None` means `1/√E`.
    pub scale: Option<f64>,
}

/// `softmax(q·kᵀ·scale + mask)·v` for `q` `[..., L, E]`, `k` `[..., S, E]`
/// and `v` `[..., S, Ev]` (batch dims broadcast), with dropout on the
/// attention weights when `dropout_p > 0`; returns `[..., L, Ev]`. A query
/// whose every key is masked gets NaN, as in PyTorch.
///
/// Runs the device's fused kernel ([`Tensor::sdpa`]) and records one node
/// whose backward is the fused backward; gradients reach `q`, `k`, `v` and
/// an additive mask that requires grad. Where the device has no fused
/// kernel for the call (see [`Tensor::sdpa_fused_available`]: on the CUDA
/// backend a mask tensor, dropout, E ≠ Ev or non-square causal scores;
/// empty sizes anywhere) it runs
/// [`scaled_dot_product_attention_composite`]. Dropout draws the same keep
/// mask from the default generator either way (one f32 uniform per weight
/// of the `[batch.., L, S]` weights), so a seed gives the same result on
/// both paths and on any thread count.
///
/// Errors when an operand has fewer than 2 dims, the shapes do not fit,
/// both a mask and `is_causal` are given, the bool mask is not bool or does
/// not broadcast, `dropout_p` is not in [0, 1], or dtypes/devices differ.
pub fn scaled_dot_product_attention(q: &Var, k: &Var, v: &Var, opts: &AttnOptions<'_>) -> Result<Var> {
    autocast_entry!(reg::SCALED_DOT_PRODUCT_ATTENTION, [q, k, v], |c| {
        scaled_dot_product_attention(&c[0], &c[1], &c[2], opts)
    });
    let (qt, kt, vt) = (q.tensor(), k.tensor(), v.tensor());
    let mask = opts.mask.map(|m| match m {
        AttnMask::Additive(b) => SdpaMask::Additive(b.tensor()),
        AttnMask::Keep(t) => SdpaMask::Keep(t),
    });
    let mut args = SdpaArgs {
        mask,
        is_causal: opts.is_causal,
        scale: opts.scale,
        dropout: None,
    };
    if !Tensor::sdpa_fused_available(qt, kt, vt, &args)? {
        return scaled_dot_product_attention_composite(q, k, v, opts);
    }
    args.dropout = Tensor::sdpa_dropout(opts.dropout_p, qt, kt, vt, mask)?;
    let fwd = Tensor::sdpa(qt, kt, vt, &args)?;
    let mut inputs = vec![q, k, v];
    if let Some(AttnMask::Additive(b)) = opts.mask {
        inputs.push(b);
    }
    let node = FusedNode {
        q: qt.clone(),
        k: kt.clone(),
        v: vt.clone(),
        mask: opts.mask.map(|m| match m {
            AttnMask::Additive(b) => (b.tensor().clone(), true),
            AttnMask::Keep(t) => (t.clone(), false),
        }),
        is_causal: args.is_causal,
        scale: args.scale,
        dropout: args.dropout,
        out: fwd.out.clone(),
        lse: fwd.lse.clone(),
    };
    record_op(
        reg::SCALED_DOT_PRODUCT_ATTENTION,
        fwd.out,
        &inputs,
        move |g, needs| node.backward(g, needs),
    )
}

/// What the fused node keeps for its backward: the inputs, the mask, the
/// options with the dropout stream, the output and the row log-sum-exp.
struct FusedNode {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// The mask and whether it is additive.
    mask: Option<(Tensor, bool)>,
    is_causal: bool,
    scale: Option<f64>,
    dropout: Option<tessera_tensor::SdpaDropout>,
    out: Tensor,
    lse: Tensor,
}

impl FusedNode {
    /// The gradients of q, k, v (and of an additive mask) for output
    /// gradient `g`, each summed down to its input's shape.
    fn backward(self, g: &Tensor, needs: &[bool]) -> Result<Vec<Option<Tensor>>> {
        let args = SdpaArgs {
            mask: self.mask.as_ref().map(|(m, additive)| match additive {
                true => SdpaMask::Additive(m),
                false => SdpaMask::Keep(m),
            }),
            is_causal: self.is_causal,
            scale: self.scale,
            dropout: self.dropout,
        };
        let fwd = SdpaOutput {
            out: self.out,
            lse: self.lse,
        };
        let mask_grad = needs.get(3).copied().unwrap_or(false);
        let gr = Tensor::sdpa_backward(g, &self.q, &self.k, &self.v, &fwd, &args, mask_grad)?;
        let mut out = vec![
            Some(sum_to(&gr.dq, self.q.shape())?),
            Some(sum_to(&gr.dk, self.k.shape())?),
            Some(sum_to(&gr.dv, self.v.shape())?),
        ];
        if let Some((m, true)) = &self.mask {
            out.push(gr.dmask.map(|d| sum_to(&d, m.shape())).transpose()?);
        }
        Ok(out
            .into_iter()
            .zip(needs)
            .map(|(g, &n)| g.filter(|_| n))
            .collect())
    }
}

/// [`scaled_dot_product_attention`] composed from matmul, masking,
/// softmax and dropout (PyTorch's math backend), keeping the full
/// `[.., L, S]` scores and weights: the reference the fused kernel is
/// tested against and the path of devices without one. Same arguments,
/// result and errors; dropout draws the same mask.
pub fn scaled_dot_product_attention_composite(
    q: &Var,
    k: &Var,
    v: &Var,
    opts: &AttnOptions<'_>,
) -> Result<Var> {
    const OP: &str = "scaled_dot_product_attention";
    if [q, k, v].iter().any(|x| x.ndim() < 2) {
        return Err(Error::shape(
            OP,
            format!(
                "q, k and v need at least 2 dims, got {:?}, {:?}, {:?}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    let e = q.shape()[q.ndim() - 1];
    let scale = opts.scale.unwrap_or(1.0 / (e as f64).sqrt());
    let mut scores = q.matmul(&k.transpose(-2, -1)?)?.mul_scalar(scale)?;
    match (opts.mask, opts.is_causal) {
        (Some(_), true) => {
            return Err(Error::arg(OP, "give either a mask or is_causal, not both"));
        }
        (None, true) => {
            let (l, s) = (q.shape()[q.ndim() - 2], k.shape()[k.ndim() - 2]);
            let above = Tensor::build::<bool>(OP, &[l, s], |out| {
                for (i, row) in out.chunks_mut(s.max(1)).enumerate() {
                    row.iter_mut().enumerate().for_each(|(j, m)| *m = j > i);
                }
            })?;
            scores = scores.masked_fill(&above, f64::NEG_INFINITY)?;
        }
        (Some(AttnMask::Keep(keep)), false) => {
            if keep.dtype() != DType::Bool {
                return Err(Error::dtype(
                    OP,
                    format!("a keep mask must be bool, got {}", keep.dtype()),
                ));
            }
            scores = scores.masked_fill(&keep.logical_not()?, f64::NEG_INFINITY)?;
        }
        (Some(AttnMask::Additive(bias)), false) => scores = scores.add(bias)?,
        (None, false) => {}
    }
    let mut attn = scores.softmax(-1)?;
    if opts.dropout_p > 0.0 {
        attn = attn.dropout(opts.dropout_p, true)?;
    }
    attn.matmul(v)
}
