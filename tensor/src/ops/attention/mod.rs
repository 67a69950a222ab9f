//! Fused scaled dot-product attention (FlashAttention-2's algorithm):
//! [`Tensor::sdpa`] returns the output and the per-row log-sum-exp, and
//! [`Tensor::sdpa_backward`] recomputes the probabilities tile by tile from
//! them, so neither direction keeps a `[..., L, S]` probability tensor.
//!
//! Semantics are PyTorch's `F.scaled_dot_product_attention`: `q` `[..., L,
//! E]`, `k` `[..., S, E]`, `v` `[..., S, Ev]` with broadcast batch dims, an
//! optional additive or bool keep mask broadcasting against the `[..., L,
//! S]` scores, a top-left causal mask, a scale (default `1/√E`) and dropout
//! on the attention weights. A query row whose every key is masked is NaN.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(test)]
mod tests;

use crate::rng::{reserve, Stream};
use crate::{broadcast_shapes, DType, Error, Result, Tensor};

const OP: &str = "scaled_dot_product_attention";
const OP_BWD: &str = "scaled_dot_product_attention_backward";

/// A mask of [`Tensor::sdpa`], broadcasting against the `[..., L, S]` scores.
#[derive(Debug, Clone, Copy)]
pub enum SdpaMask<'a> {
    /// A float tensor added to the scaled scores (−∞ removes a position).
    Additive(&'a Tensor),
    /// A bool tensor: `true` where a query may attend to a key.
    Keep(&'a Tensor),
}

impl<'a> SdpaMask<'a> {
    fn tensor(&self) -> &'a Tensor {
        match *self {
            SdpaMask::Additive(t) | SdpaMask::Keep(t) => t,
        }
    }
}

/// The dropout of one attention call: its probability and the Philox
/// stream its keep mask comes from, reserved once by [`Tensor::sdpa_dropout`]
/// so the forward and the backward see the same mask.
#[derive(Debug, Clone, Copy)]
pub struct SdpaDropout {
    p: f64,
    stream: Stream,
}

impl SdpaDropout {
    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Whether element `idx` of the row-major `[batch.., L, S]` weights is
    /// kept: the test `rand(...) >= p` of f32 dropout, on the word `idx` of
    /// the stream (as [`Tensor::rand`] of that shape would draw it).
    #[inline]
    pub(crate) fn keeps(&self, idx: u64) -> bool {
        let u = crate::rng::unit_from_u32(self.stream.word(idx), 24) as f32;
        u >= self.p as f32
    }

    /// The factor applied to kept weights: `1/(1 − p)`, 0 when `p == 1`.
    pub(crate) fn scale(&self) -> f64 {
        if self.p < 1.0 {
            1.0 / (1.0 - self.p)
        } else {
            0.0
        }
    }
}

/// The options of [`Tensor::sdpa`] and [`Tensor::sdpa_backward`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SdpaArgs<'a> {
    /// An optional mask (not together with `is_causal`).
    pub mask: Option<SdpaMask<'a>>,
    /// Query `i` attends only to keys `j ≤ i` (top-left, as PyTorch).
    pub is_causal: bool,
    /// The factor applied to `q·kᵀ`; `None` means `1/√E`.
    pub scale: Option<f64>,
    /// Dropout on the attention weights, from [`Tensor::sdpa_dropout`].
    pub dropout: Option<SdpaDropout>,
}

/// The output of [`Tensor::sdpa`].
#[derive(Debug, Clone)]
pub struct SdpaOutput {
    /// The attention output, `[batch.., L, Ev]`, in the inputs' dtype.
    pub out: Tensor,
    /// `log Σ_j exp(score_ij)` of each query row, `[batch.., L]`, in f32
    /// (f64 for f64 inputs); −∞ for a row whose every key is masked.
    pub lse: Tensor,
}

/// The gradients of [`Tensor::sdpa_backward`], each over the broadcast
/// batch dims (sum them down to an input's own shape).
#[derive(Debug, Clone)]
pub struct SdpaGrads {
    /// `[batch.., L, E]`.
    pub dq: Tensor,
    /// `[batch.., S, E]`.
    pub dk: Tensor,
    /// `[batch.., S, Ev]`.
    pub dv: Tensor,
    /// The additive mask's gradient `[batch.., L, S]`, when asked for.
    pub dmask: Option<Tensor>,
}

/// The checked sizes of one attention call.
#[derive(Debug, Clone)]
pub(crate) struct Geom {
    /// The broadcast batch dims.
    pub batch: Vec<usize>,
    pub l: usize,
    pub s: usize,
    pub e: usize,
    pub ev: usize,
    pub scale: f64,
}

impl Geom {
    /// The number of (batch, head) matrices.
    pub fn count(&self) -> usize {
        self.batch.iter().product()
    }

    /// `batch ++ tail`.
    pub fn shape(&self, tail: &[usize]) -> Vec<usize> {
        let mut s = self.batch.clone();
        s.extend_from_slice(tail);
        s
    }
}

/// Checks the operands of an attention call and returns its sizes. Errors
/// (naming the op and the shapes) when an operand has fewer than 2 dims,
/// `q` and `k` differ in E, `k` and `v` in S, the batch dims or the mask do
/// not broadcast, dtypes/devices differ, the inputs are not float, a keep
/// mask is not bool, or a mask comes with `is_causal`.
pub(crate) fn geometry(q: &Tensor, k: &Tensor, v: &Tensor, args: &SdpaArgs<'_>) -> Result<Geom> {
    crate::backend::same_device(OP, &[q, k, v, &args.mask.map(|m| m.tensor())])?;
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
    let dt = q.dtype();
    if !dt.is_float() || k.dtype() != dt || v.dtype() != dt {
        return Err(Error::dtype(
            OP,
            format!(
                "q, k and v must share one float dtype, got {}, {}, {}",
                q.dtype(),
                k.dtype(),
                v.dtype()
            ),
        ));
    }
    let last2 = |x: &Tensor| (x.shape()[x.ndim() - 2], x.shape()[x.ndim() - 1]);
    let ((l, e), (s, ek), (sv, ev)) = (last2(q), last2(k), last2(v));
    if ek != e || sv != s {
        return Err(Error::shape(
            OP,
            format!(
                "q [.., L, E], k [.., S, E] and v [.., S, Ev] do not fit: {:?}, {:?}, {:?}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    let lead = |x: &Tensor| x.shape()[..x.ndim() - 2].to_vec();
    let batch = broadcast_shapes(OP, &lead(q), &lead(k))
        .and_then(|b| broadcast_shapes(OP, &b, &lead(v)))
        .map_err(|_| {
            Error::shape(
                OP,
                format!(
                    "batch dims of q {:?}, k {:?} and v {:?} do not broadcast",
                    q.shape(),
                    k.shape(),
                    v.shape()
                ),
            )
        })?;
    let mut g = Geom {
        batch,
        l,
        s,
        e,
        ev,
        scale: args.scale.unwrap_or(1.0 / (e as f64).sqrt()),
    };
    if let Some(mask) = args.mask {
        if args.is_causal {
            return Err(Error::arg(OP, "give either a mask or is_causal, not both"));
        }
        let m = mask.tensor();
        match mask {
            SdpaMask::Keep(_) if m.dtype() != DType::Bool => {
                return Err(Error::dtype(
                    OP,
                    format!("a keep mask must be bool, got {}", m.dtype()),
                ))
            }
            SdpaMask::Additive(_) if !m.dtype().is_float() => {
                return Err(Error::dtype(
                    OP,
                    format!("an additive mask must be float, got {}", m.dtype()),
                ))
            }
            _ => {}
        }
        let scores = g.shape(&[l, s]);
        let full = broadcast_shapes(OP, &scores, m.shape())
            .ok()
            .filter(|f| f[f.len() - 2..] == [l, s]);
        let Some(full) = full else {
            return Err(Error::shape(
                OP,
                format!(
                    "mask of shape {:?} does not broadcast to the scores {scores:?}",
                    m.shape()
                ),
            ));
        };
        g.batch = full[..full.len() - 2].to_vec();
    }
    Ok(g)
}

impl Tensor {
    /// Reserves the dropout stream of an attention call on `q`, `k`, `v`
    /// and `mask` from this thread's default generator (one f32 uniform per
    /// attention weight, as `rand` of the `[batch.., L, S]` weights would),
    /// or `None` when `p == 0`. Errors when `p` is outside [0, 1] or the
    /// operands do not fit (as [`Tensor::sdpa`]).
    pub fn sdpa_dropout(
        p: f64,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<SdpaMask<'_>>,
    ) -> Result<Option<SdpaDropout>> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::arg(OP, format!("dropout_p must be in [0, 1], got {p}")));
        }
        let args = SdpaArgs {
            mask,
            ..SdpaArgs::default()
        };
        let g = geometry(q, k, v, &args)?;
        if p == 0.0 {
            return Ok(None);
        }
        let n = g.count() * g.l * g.s;
        Ok(Some(SdpaDropout {
            p,
            stream: reserve(None, n, 4),
        }))
    }

    /// Whether [`Tensor::sdpa`] has a fused kernel for these operands on
    /// their device (the CPU always, for non-empty sizes); when it has not,
    /// compose attention from matmul, softmax and dropout instead. Errors
    /// when the operands do not fit (as [`Tensor::sdpa`]).
    pub fn sdpa_fused_available(q: &Tensor, k: &Tensor, v: &Tensor, args: &SdpaArgs<'_>) -> Result<bool> {
        covered(q, &geometry(q, k, v, args)?, args)
    }

    /// `softmax(q·kᵀ·scale + mask)·v` fused (see the module docs), with the
    /// row log-sum-exp the backward needs. f16/bf16 inputs are computed in
    /// f32 and rounded once. Errors as [`geometry`]'s checks, or when
    /// [`Tensor::sdpa_fused_available`] is false (empty sizes, a case the
    /// device's kernel lacks).
    pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, args: &SdpaArgs<'_>) -> Result<SdpaOutput> {
        let g = fused_geometry(q, k, v, args)?;
        let mask = args.mask.map(|m| m.tensor());
        crate::backend::dispatch(OP, &[q, k, v, &mask])?.sdpa(q, k, v, &g, args)
    }

    /// The gradients of [`Tensor::sdpa`] for the output gradient `dout`
    /// from the forward's `fwd`, with the same `args` (and dropout stream);
    /// the additive mask's gradient too when `mask_grad`. Errors as
    /// [`Tensor::sdpa`], when `dout` is not shaped as the output, or when
    /// `mask_grad` is asked without an additive mask.
    pub fn sdpa_backward(
        dout: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        fwd: &SdpaOutput,
        args: &SdpaArgs<'_>,
        mask_grad: bool,
    ) -> Result<SdpaGrads> {
        let g = fused_geometry(q, k, v, args)?;
        let want = g.shape(&[g.l, g.ev]);
        if dout.shape() != want || fwd.out.shape() != want || fwd.lse.shape() != g.shape(&[g.l]) {
            return Err(Error::shape(
                OP_BWD,
                format!(
                    "dout {:?}, out {:?} and lse {:?} must be {want:?}, {want:?} and {:?}",
                    dout.shape(),
                    fwd.out.shape(),
                    fwd.lse.shape(),
                    g.shape(&[g.l])
                ),
            ));
        }
        if mask_grad && !matches!(args.mask, Some(SdpaMask::Additive(_))) {
            return Err(Error::arg(OP_BWD, "mask_grad needs an additive mask"));
        }
        let mask = args.mask.map(|m| m.tensor());
        crate::backend::dispatch(OP_BWD, &[dout, q, k, v, &fwd.out, &fwd.lse, &mask])?
            .sdpa_backward(dout, q, k, v, fwd, &g, args, mask_grad)
    }
}

/// Whether the fused kernel of `q`'s device covers a call of sizes `g`.
fn covered(q: &Tensor, g: &Geom, args: &SdpaArgs<'_>) -> Result<bool> {
    if [g.count(), g.l, g.s, g.e, g.ev].contains(&0) {
        return Ok(false);
    }
    Ok(crate::backend::on_device(OP, q.device())?.sdpa_supports(q, g, args))
}

/// [`geometry`], and an error when the fused kernel does not cover the call.
fn fused_geometry(q: &Tensor, k: &Tensor, v: &Tensor, args: &SdpaArgs<'_>) -> Result<Geom> {
    let g = geometry(q, k, v, args)?;
    if !covered(q, &g, args)? {
        return Err(Error::arg(
            OP,
            format!(
                "no fused kernel for q {:?}, k {:?}, v {:?} on {} (check sdpa_fused_available and compose instead)",
                q.shape(),
                k.shape(),
                v.shape(),
                q.device()
            ),
        ));
    }
    Ok(g)
}
