//! MultiheadAttention with PyTorch's parameter layout (batch first).

use tessera_autograd::{scaled_dot_product_attention, AttnMask, AttnOptions, Parameter, Var};
use tessera_tensor::{DType, Error, Result, Tensor};

use crate::{init, Linear, Module, Training};

/// Multi-head attention over `[B, L, E]` inputs (`torch.nn.
/// MultiheadAttention(E, heads, batch_first=True)`): a packed input
/// projection `in_proj_weight` `[3E, E]` (rows `[q; k; v]`) with
/// `in_proj_bias` `[3E]`, and `out_proj` (a Linear `E → E`), named as in
/// PyTorch's state dict. Init as PyTorch: xavier-uniform input projection,
/// zero biases, default Linear init for `out_proj.weight`.
///
/// [`Module::forward`] is self-attention (`query = key = value = x`) without
/// masks; [`MultiheadAttention::attend`] takes separate inputs and masks.
#[derive(Debug, Clone, Module)]
pub struct MultiheadAttention {
    /// The packed q/k/v projection, `[3E, E]`.
    pub in_proj_weight: Parameter,
    /// The packed q/k/v bias, `[3E]`, when the layer has biases.
    pub in_proj_bias: Option<Parameter>,
    /// The output projection.
    pub out_proj: Linear,
    /// The number of heads.
    #[module(skip)]
    pub num_heads: usize,
    /// Dropout probability on the attention weights (training only).
    #[module(skip)]
    pub dropout: f64,
    training: Training,
}

/// Masks for [`MultiheadAttention::attend`], with PyTorch's conventions.
#[derive(Debug, Clone, Copy, Default)]
pub struct MhaMasks<'a> {
    /// `[L, S]` or `[B·heads, L, S]`: bool with `true` = not allowed to
    /// attend, or float added to the scores.
    pub attn_mask: Option<&'a Tensor>,
    /// `[B, S]`: bool with `true` = padding (ignored), or float added.
    pub key_padding_mask: Option<&'a Tensor>,
    /// A causal mask (position `i` attends to `j <= i`); exclusive with
    /// `attn_mask`.
    pub is_causal: bool,
}

impl MultiheadAttention {
    /// Attention with `embed_dim` split over `num_heads` heads, attention
    /// dropout `dropout` and optional biases, in f32. Errors when
    /// `num_heads` is 0 or does not divide `embed_dim`, or `dropout` is
    /// outside [0, 1].
    pub fn new(embed_dim: usize, num_heads: usize, dropout: f64, bias: bool) -> Result<Self> {
        if num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(Error::arg(
                "MultiheadAttention::new",
                format!("embed_dim {embed_dim} must be divisible by num_heads {num_heads} (> 0)"),
            ));
        }
        if !(0.0..=1.0).contains(&dropout) {
            return Err(Error::arg(
                "MultiheadAttention::new",
                format!("dropout must be in [0, 1], got {dropout}"),
            ));
        }
        let in_proj_weight = Parameter::new(Tensor::zeros(&[3 * embed_dim, embed_dim], DType::F32)?);
        let out_proj = Linear::new(embed_dim, embed_dim, bias)?;
        init::xavier_uniform_(&in_proj_weight, 1.0)?;
        let in_proj_bias = match bias {
            true => Some(Parameter::new(Tensor::zeros(&[3 * embed_dim], DType::F32)?)),
            false => None,
        };
        if let Some(b) = &out_proj.bias {
            init::zeros_(b)?;
        }
        Ok(MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
            num_heads,
            dropout,
            training: Training::default(),
        })
    }

    /// The model width E.
    pub fn embed_dim(&self) -> usize {
        self.in_proj_weight.shape()[1]
    }

    /// Attention of `query` `[B, L, E]` over `key` and `value` `[B, S, E]`,
    /// returning `[B, L, E]` (PyTorch's output with `need_weights=False`).
    /// Errors when the shapes or masks do not fit.
    pub fn attend(&self, query: &Var, key: &Var, value: &Var, masks: MhaMasks<'_>) -> Result<Var> {
        let e = self.embed_dim();
        for (name, x) in [("query", query), ("key", key), ("value", value)] {
            if x.ndim() != 3 || x.shape()[2] != e {
                return Err(Error::shape(
                    "MultiheadAttention",
                    format!(
                        "{name} must be [batch, seq, {e}] (batch_first), got {:?}",
                        x.shape()
                    ),
                ));
            }
        }
        let (b, l, s) = (query.shape()[0], query.shape()[1], key.shape()[1]);
        if key.shape()[0] != b || value.shape()[..2] != key.shape()[..2] {
            return Err(Error::shape(
                "MultiheadAttention",
                format!(
                    "query {:?}, key {:?} and value {:?} disagree in batch or key length",
                    query.shape(),
                    key.shape(),
                    value.shape()
                ),
            ));
        }
        let w = self.in_proj_weight.var()?;
        let bias = self.in_proj_bias.as_ref().map(Parameter::var).transpose()?;
        let proj = |x: &Var, k: usize| -> Result<Var> {
            let wk = w.narrow(0, k * e, e)?;
            let bk = bias.as_ref().map(|b| b.narrow(0, k * e, e)).transpose()?;
            self.split_heads(&x.linear(&wk, bk.as_ref())?)
        };
        let (q, k, v) = (proj(query, 0)?, proj(key, 1)?, proj(value, 2)?);
        let mask = self
            .additive_mask(masks, b, l, s, query.dtype())?
            .map(Var::constant);
        let opts = AttnOptions {
            mask: mask.as_ref().map(AttnMask::Additive),
            dropout_p: if self.training.get() { self.dropout } else { 0.0 },
            is_causal: masks.is_causal,
            scale: None,
        };
        // The fused kernel stores its output [B, L, heads, E/heads] when q
        // is a head-split view, so merging the heads is a view too; the
        // composite path (no fused kernel on the device) copies here.
        let o = scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let o = o.transpose(1, 2)?.reshape([b, l, e])?;
        self.out_proj.forward(&o)
    }

    /// `[B, T, E]` → `[B, heads, T, E/heads]` as a strided view (no copy):
    /// the fused attention kernel reads it with its strides.
    fn split_heads(&self, x: &Var) -> Result<Var> {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        x.reshape((b, t, self.num_heads, ()))?.transpose(1, 2)
    }

    /// The float mask added to the `[B, heads, L, S]` scores, combining
    /// `attn_mask` and `key_padding_mask`; `None` when there is neither.
    fn additive_mask(
        &self,
        masks: MhaMasks<'_>,
        b: usize,
        l: usize,
        s: usize,
        dtype: DType,
    ) -> Result<Option<Tensor>> {
        let h = self.num_heads;
        let mut total: Option<Tensor> = None;
        if let Some(m) = masks.attn_mask {
            let m = to_additive(m, dtype)?;
            let m = match m.shape() {
                [ml, ms] if *ml == l && *ms == s => m.reshape([1, 1, l, s])?,
                [bh, ml, ms] if *bh == b * h && *ml == l && *ms == s => m.reshape([b, h, l, s])?,
                other => {
                    return Err(Error::shape(
                        "MultiheadAttention",
                        format!(
                            "attn_mask must be [{l}, {s}] or [{}, {l}, {s}], got {other:?}",
                            b * h
                        ),
                    ))
                }
            };
            total = Some(m);
        }
        if let Some(m) = masks.key_padding_mask {
            if m.shape() != [b, s] {
                return Err(Error::shape(
                    "MultiheadAttention",
                    format!("key_padding_mask must be [{b}, {s}], got {:?}", m.shape()),
                ));
            }
            let m = to_additive(m, dtype)?.reshape([b, 1, 1, s])?;
            total = Some(match total {
                Some(t) => t.add(&m)?,
                None => m,
            });
        }
        Ok(total)
    }
}

/// A bool mask (`true` = masked out) as 0/−∞ in `dtype`, or a float mask
/// cast to `dtype`.
fn to_additive(m: &Tensor, dtype: DType) -> Result<Tensor> {
    if m.dtype() == DType::Bool {
        let zeros = Tensor::zeros(m.shape(), dtype)?;
        let neg = Tensor::full(m.shape(), f64::NEG_INFINITY, dtype)?;
        Tensor::where_(m, &neg, &zeros)
    } else {
        m.to_dtype(dtype)
    }
}

impl Module for MultiheadAttention {
    /// Self-attention of `[B, L, E]` without masks.
    fn forward(&self, input: &Var) -> Result<Var> {
        self.attend(input, input, input, MhaMasks::default())
    }
}
