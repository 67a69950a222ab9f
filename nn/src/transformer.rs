//! TransformerEncoderLayer, post-norm (PyTorch's default) or pre-norm.

use tessera_autograd::Var;
use tessera_tensor::{GeluApprox, Result};

use crate::{Dropout, LayerNorm, Linear, MhaMasks, Module, MultiheadAttention};

/// The feed-forward activation of a [`TransformerEncoderLayer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// ReLU (PyTorch's default).
    #[default]
    Relu,
    /// Exact GELU.
    Gelu,
}

/// The settings of a [`TransformerEncoderLayer`]; the default is
/// PyTorch's (feed-forward 2048, dropout 0.1, ReLU, eps 1e-5, post-norm).
#[derive(Debug, Clone, Copy)]
pub struct TransformerOptions {
    /// Width of the feed-forward hidden layer.
    pub dim_feedforward: usize,
    /// Dropout after attention, inside and after the feed-forward block,
    /// and on the attention weights.
    pub dropout: f64,
    /// The feed-forward activation.
    pub activation: Activation,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Pre-norm (`true`: `x + f(norm(x))`) or post-norm (`norm(x + f(x))`).
    pub norm_first: bool,
    /// Biases in the linear layers and LayerNorms.
    pub bias: bool,
}

impl Default for TransformerOptions {
    fn default() -> Self {
        TransformerOptions {
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            norm_first: false,
            bias: true,
        }
    }
}

/// One encoder block over `[B, L, d_model]` (`torch.nn.
/// TransformerEncoderLayer(..., batch_first=True)`), with PyTorch's
/// submodule names: `self_attn`, `linear1`, `dropout`, `linear2`, `norm1`,
/// `norm2`, `dropout1`, `dropout2`.
#[derive(Debug, Clone, Module)]
pub struct TransformerEncoderLayer {
    /// Self-attention.
    pub self_attn: MultiheadAttention,
    /// Feed-forward expansion `d_model → dim_feedforward`.
    pub linear1: Linear,
    /// Dropout inside the feed-forward block.
    pub dropout: Dropout,
    /// Feed-forward projection `dim_feedforward → d_model`.
    pub linear2: Linear,
    /// Norm of the attention sub-block.
    pub norm1: LayerNorm,
    /// Norm of the feed-forward sub-block.
    pub norm2: LayerNorm,
    /// Dropout after attention.
    pub dropout1: Dropout,
    /// Dropout after the feed-forward block.
    pub dropout2: Dropout,
    /// The feed-forward activation.
    #[module(skip)]
    pub activation: Activation,
    /// Pre-norm when true.
    #[module(skip)]
    pub norm_first: bool,
}

impl TransformerEncoderLayer {
    /// A block of width `d_model` with `nhead` heads. Errors when `nhead`
    /// does not divide `d_model` or the dropout is outside [0, 1].
    pub fn new(d_model: usize, nhead: usize, o: TransformerOptions) -> Result<Self> {
        let ln = || LayerNorm::new(&[d_model], o.layer_norm_eps, true, o.bias);
        Ok(TransformerEncoderLayer {
            self_attn: MultiheadAttention::new(d_model, nhead, o.dropout, o.bias)?,
            linear1: Linear::new(d_model, o.dim_feedforward, o.bias)?,
            dropout: Dropout::new(o.dropout)?,
            linear2: Linear::new(o.dim_feedforward, d_model, o.bias)?,
            norm1: ln()?,
            norm2: ln()?,
            dropout1: Dropout::new(o.dropout)?,
            dropout2: Dropout::new(o.dropout)?,
            activation: o.activation,
            norm_first: o.norm_first,
        })
    }

    /// The block with attention masks (PyTorch's `src_mask`,
    /// `src_key_padding_mask`, `is_causal`). Errors when shapes or masks do
    /// not fit.
    pub fn forward_masked(&self, x: &Var, masks: MhaMasks<'_>) -> Result<Var> {
        if self.norm_first {
            let x = x.add(&self.sa_block(&self.norm1.forward(x)?, masks)?)?;
            x.add(&self.ff_block(&self.norm2.forward(&x)?)?)
        } else {
            let x = self.norm1.forward(&x.add(&self.sa_block(x, masks)?)?)?;
            self.norm2.forward(&x.add(&self.ff_block(&x)?)?)
        }
    }

    fn sa_block(&self, x: &Var, masks: MhaMasks<'_>) -> Result<Var> {
        self.dropout1.forward(&self.self_attn.attend(x, x, x, masks)?)
    }

    fn ff_block(&self, x: &Var) -> Result<Var> {
        let h = self.linear1.forward(x)?;
        let h = match self.activation {
            Activation::Relu => h.relu()?,
            Activation::Gelu => h.gelu(GeluApprox::None)?,
        };
        self.dropout2
            .forward(&self.linear2.forward(&self.dropout.forward(&h)?)?)
    }
}

impl Module for TransformerEncoderLayer {
    fn forward(&self, input: &Var) -> Result<Var> {
        self.forward_masked(input, MhaMasks::default())
    }
}
