//! Scaled dot-product attention on [`Var`]s, composed from matmul,
//! masking, softmax and dropout (PyTorch's
//! `F.scaled_dot_product_attention`).

use tessera_tensor::{DType, Error, Result, Tensor};

use super::registry as reg;
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
/// Errors when an operand has fewer than 2 dims, the shapes do not fit,
/// both a mask and `is_causal` are given, the bool mask is not bool or does
/// not broadcast, `dropout_p` is not in [0, 1], or dtypes/devices differ.
pub fn scaled_dot_product_attention(q: &Var, k: &Var, v: &Var, opts: &AttnOptions<'_>) -> Result<Var> {
    const OP: &str = "scaled_dot_product_attention";
    autocast_entry!(reg::SCALED_DOT_PRODUCT_ATTENTION, [q, k, v], |c| {
        scaled_dot_product_attention(&c[0], &c[1], &c[2], opts)
    });
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
