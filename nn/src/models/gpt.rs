//! A GPT-style decoder-only language model (GPT-2 / nanoGPT structure):
//! learned token and position embeddings, pre-norm blocks of causal
//! self-attention and a GELU MLP, a final LayerNorm, and an output
//! projection tied to the token embedding. Names follow nanoGPT's
//! `transformer.*` modules without the prefix (`wte.weight`,
//! `h.0.attn.c_attn.weight`, ...), with torch's `[out, in]` Linear layout.
//!
//! This is the serial form; `tessera_parallel::tensor_parallel` builds the
//! tensor- and sequence-parallel forms from it (same master weights, same
//! state-dict names once consolidated).

use tessera_autograd::{scaled_dot_product_attention, AttnOptions, Parameter, Var};
use tessera_tensor::{DType, Error, GeluApprox, Generator, Result, Tensor};

use crate::{Dropout, Embedding, LayerNorm, Linear, Module};

/// The size of a [`Gpt`]. `GptConfig::new(vocab)` is a small model (4
/// layers, width 128, 4 heads, context 64); the builder methods change one
/// thing each.
#[derive(Debug, Clone, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size V (256 for bytes).
    pub vocab_size: usize,
    /// Longest sequence (rows of the position embedding).
    pub block_size: usize,
    /// Number of blocks L.
    pub n_layer: usize,
    /// Attention heads; must divide `n_embd`.
    pub n_head: usize,
    /// Width h.
    pub n_embd: usize,
    /// Dropout after the embeddings, on the attention weights, after each
    /// projection (nanoGPT's `dropout`).
    pub dropout: f64,
    /// LayerNorm epsilon (1e-5).
    pub layer_norm_eps: f64,
}

impl GptConfig {
    /// A small model for a `vocab_size`-token vocabulary.
    pub fn new(vocab_size: usize) -> GptConfig {
        GptConfig {
            vocab_size,
            block_size: 64,
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
            dropout: 0.0,
            layer_norm_eps: 1e-5,
        }
    }

    /// Sets the context length.
    pub fn block_size(mut self, n: usize) -> Self {
        self.block_size = n;
        self
    }

    /// Sets the number of blocks.
    pub fn n_layer(mut self, n: usize) -> Self {
        self.n_layer = n;
        self
    }

    /// Sets the number of heads.
    pub fn n_head(mut self, n: usize) -> Self {
        self.n_head = n;
        self
    }

    /// Sets the width.
    pub fn n_embd(mut self, n: usize) -> Self {
        self.n_embd = n;
        self
    }

    /// Sets the dropout probability.
    pub fn dropout(mut self, p: f64) -> Self {
        self.dropout = p;
        self
    }

    /// Errors when a size is 0, `n_head` does not divide `n_embd`, or the
    /// dropout is outside `[0, 1)`.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            self.vocab_size,
            self.block_size,
            self.n_layer,
            self.n_head,
            self.n_embd,
        ];
        if sizes.contains(&0)
            || !self.n_embd.is_multiple_of(self.n_head)
            || !(0.0..1.0).contains(&self.dropout)
        {
            return Err(Error::arg("GptConfig", format!("invalid configuration {self:?}")));
        }
        Ok(())
    }

    /// The number of parameters of the model (the tied head counted once).
    pub fn num_parameters(&self) -> usize {
        let (v, n, h) = (self.vocab_size, self.block_size, self.n_embd);
        let block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h);
        v * h + n * h + self.n_layer * block + 2 * h
    }
}

/// The GPT model: `forward` maps i64 tokens `[b, s]` to logits `[b, s, V]`.
#[derive(Module)]
pub struct Gpt {
    /// Token embedding `[V, h]`, also the output projection.
    pub wte: Embedding,
    /// Position embedding `[block_size, h]`.
    pub wpe: Embedding,
    /// Dropout after the embeddings.
    pub drop: Dropout,
    /// The blocks.
    pub h: Vec<GptBlock>,
    /// The final LayerNorm.
    pub ln_f: LayerNorm,
    #[module(skip)]
    config: GptConfig,
}

impl Gpt {
    /// A model drawn from `Generator::new(seed)` with nanoGPT's init:
    /// N(0, 0.02) weights and embeddings, zero biases, N(0, 0.02/√(2L)) for
    /// the projections into the residual stream. The same seed gives the
    /// same model on every thread and rank. Errors for an invalid config.
    pub fn new(config: &GptConfig, seed: u64) -> Result<Gpt> {
        config.validate()?;
        let gen = &mut Generator::new(seed);
        let (h, v) = (config.n_embd, config.vocab_size);
        let proj_std = 0.02 / ((2 * config.n_layer) as f64).sqrt();
        let blocks = (0..config.n_layer)
            .map(|_| GptBlock::new(config, proj_std, gen))
            .collect::<Result<Vec<_>>>()?;
        Ok(Gpt {
            wte: embedding(v, h, gen)?,
            wpe: embedding(config.block_size, h, gen)?,
            drop: Dropout::new(config.dropout)?,
            h: blocks,
            ln_f: LayerNorm::new(&[h], config.layer_norm_eps, true, true)?,
            config: config.clone(),
        })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// The mean cross-entropy of next-token prediction: logits of `tokens`
    /// `[b, s]` against `targets` `[b, s]`. Errors as [`Module::forward`]
    /// and for targets of another shape or out of the vocabulary.
    pub fn loss(&self, tokens: &Tensor, targets: &Tensor) -> Result<Var> {
        let logits = self.forward(&Var::constant(tokens.clone()))?;
        let v = self.config.vocab_size;
        let flat = logits.reshape(vec![logits.numel() / v, v])?;
        let t = targets.reshape(vec![targets.numel()])?;
        flat.cross_entropy(tessera_autograd::Target::Indices(&t), &Default::default())
    }

    /// Extends `prompt` by `n` tokens sampled one at a time from the
    /// softmax of the last position's logits divided by `temperature`
    /// (argmax when it is 0), drawing from `gen`, with the context cut to
    /// the last `block_size` tokens. Runs without recording a graph.
    /// Errors for an empty prompt, an id out of the vocabulary, or a
    /// negative temperature.
    pub fn generate(
        &self,
        prompt: &[i64],
        n: usize,
        temperature: f64,
        gen: &mut Generator,
    ) -> Result<Vec<i64>> {
        if prompt.is_empty() || temperature < 0.0 {
            return Err(Error::arg(
                "Gpt::generate",
                "needs a prompt and a temperature ≥ 0",
            ));
        }
        let _guard = tessera_autograd::GradModeGuard::set(false);
        let mut out = prompt.to_vec();
        for _ in 0..n {
            let ctx = &out[out.len().saturating_sub(self.config.block_size)..];
            let x = Tensor::from_slice(ctx, &[1, ctx.len()])?;
            let logits = self.forward(&Var::constant(x))?.into_tensor();
            let last = logits
                .narrow(1, ctx.len() - 1, 1)?
                .contiguous()?
                .to_vec::<f32>()?;
            out.push(sample(&last, temperature, gen)?);
        }
        Ok(out)
    }
}

impl Module for Gpt {
    /// `tokens` `[b, s]` i64 with `s ≤ block_size`; returns `[b, s, V]`.
    fn forward(&self, tokens: &Var) -> Result<Var> {
        let s = match tokens.shape() {
            &[_, s] if s <= self.config.block_size => s,
            other => {
                return Err(Error::shape(
                    "Gpt::forward",
                    format!(
                        "tokens must be [b, s ≤ {}], got {other:?}",
                        self.config.block_size
                    ),
                ))
            }
        };
        let pos = Var::constant(Tensor::arange_int(0, s as i64, 1, DType::I64)?);
        let mut x = self
            .drop
            .forward(&self.wte.forward(tokens)?.add(&self.wpe.forward(&pos)?)?)?;
        for block in &self.h {
            x = block.forward(&x)?;
        }
        self.ln_f.forward(&x)?.linear(&self.wte.weight.var()?, None)
    }
}

/// One pre-norm block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
#[derive(Module)]
pub struct GptBlock {
    /// Norm before the attention.
    pub ln_1: LayerNorm,
    /// Causal self-attention.
    pub attn: GptAttention,
    /// Norm before the MLP.
    pub ln_2: LayerNorm,
    /// The MLP.
    pub mlp: GptMlp,
}

impl GptBlock {
    fn new(config: &GptConfig, proj_std: f64, gen: &mut Generator) -> Result<GptBlock> {
        let h = config.n_embd;
        let eps = config.layer_norm_eps;
        Ok(GptBlock {
            ln_1: LayerNorm::new(&[h], eps, true, true)?,
            attn: GptAttention {
                c_attn: linear(h, 3 * h, 0.02, gen)?,
                c_proj: linear(h, h, proj_std, gen)?,
                attn_dropout: config.dropout,
                resid_drop: Dropout::new(config.dropout)?,
                n_head: config.n_head,
            },
            ln_2: LayerNorm::new(&[h], eps, true, true)?,
            mlp: GptMlp {
                c_fc: linear(h, 4 * h, 0.02, gen)?,
                c_proj: linear(4 * h, h, proj_std, gen)?,
                drop: Dropout::new(config.dropout)?,
            },
        })
    }
}

impl Module for GptBlock {
    fn forward(&self, x: &Var) -> Result<Var> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        x.add(&self.mlp.forward(&self.ln_2.forward(&x)?)?)
    }
}

/// Causal multi-head self-attention with a fused `c_attn` `[3h, h]` (rows:
/// all heads' q, then k, then v) and the output projection `c_proj`.
#[derive(Module)]
pub struct GptAttention {
    /// The fused q, k, v projection.
    pub c_attn: Linear,
    /// The output projection.
    pub c_proj: Linear,
    /// Dropout on the attention weights.
    #[module(skip)]
    pub attn_dropout: f64,
    /// Dropout after the projection.
    pub resid_drop: Dropout,
    /// The number of heads.
    #[module(skip)]
    pub n_head: usize,
}

impl Module for GptAttention {
    /// `x` `[b, s, h]` → `[b, s, h]`.
    fn forward(&self, x: &Var) -> Result<Var> {
        let qkv = self.c_attn.forward(x)?;
        let y = causal_attention(
            &qkv,
            self.n_head,
            self.attn_dropout,
            self.resid_drop.is_training(),
        )?;
        self.resid_drop.forward(&self.c_proj.forward(&y)?)
    }
}

/// Causal attention over a fused `qkv` `[a, c, 3·n·d]` (q, k, v of `n`
/// heads of width `d`, each head's columns contiguous) where dim 1 is the
/// sequence: returns `[a, c, n·d]`. Shared by the serial and the
/// tensor-parallel attention (which passes its local heads).
pub fn causal_attention(qkv: &Var, n_head: usize, dropout_p: f64, training: bool) -> Result<Var> {
    let shape = qkv.shape().to_vec();
    let (a, c, w) = match shape[..] {
        [a, c, w] if n_head > 0 && w % (3 * n_head) == 0 => (a, c, w),
        _ => {
            return Err(Error::shape(
                "causal_attention",
                format!("qkv must be [a, c, 3·heads·d] with {n_head} heads, got {shape:?}"),
            ))
        }
    };
    let d = w / 3 / n_head;
    let heads = |t: Var| t.reshape(vec![a, c, n_head, d])?.permute(&[0, 2, 1, 3]);
    let mut parts = qkv.chunk(3, -1)?.into_iter();
    let mut next = || {
        parts
            .next()
            .ok_or_else(|| Error::shape("causal_attention", "qkv chunk"))
    };
    let (q, k, v) = (heads(next()?)?, heads(next()?)?, heads(next()?)?);
    let opts = AttnOptions {
        is_causal: true,
        dropout_p: if training { dropout_p } else { 0.0 },
        ..Default::default()
    };
    let y = scaled_dot_product_attention(&q, &k, &v, &opts)?;
    y.permute(&[0, 2, 1, 3])?.reshape(vec![a, c, n_head * d])
}

/// The MLP: `c_proj(gelu(c_fc(x)))` with width `4h` (exact GELU).
#[derive(Module)]
pub struct GptMlp {
    /// `h → 4h`.
    pub c_fc: Linear,
    /// `4h → h`.
    pub c_proj: Linear,
    /// Dropout after the projection.
    pub drop: Dropout,
}

impl Module for GptMlp {
    fn forward(&self, x: &Var) -> Result<Var> {
        let y = self.c_fc.forward(x)?.gelu(GeluApprox::None)?;
        self.drop.forward(&self.c_proj.forward(&y)?)
    }
}

fn linear(inp: usize, out: usize, std: f64, gen: &mut Generator) -> Result<Linear> {
    Ok(Linear {
        weight: Parameter::new(Tensor::normal_with(&[out, inp], 0.0, std, DType::F32, gen)?),
        bias: Some(Parameter::new(Tensor::zeros(&[out], DType::F32)?)),
    })
}

fn embedding(rows: usize, h: usize, gen: &mut Generator) -> Result<Embedding> {
    Ok(Embedding {
        weight: Parameter::new(Tensor::normal_with(&[rows, h], 0.0, 0.02, DType::F32, gen)?),
        padding_idx: None,
    })
}

/// A token drawn from `softmax(logits / temperature)` (argmax at 0).
pub fn sample(logits: &[f32], temperature: f64, gen: &mut Generator) -> Result<i64> {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |best, (i, &v)| if v > best.1 { (i, v) } else { best },
            )
            .0 as i64
    };
    if temperature == 0.0 {
        return Ok(argmax());
    }
    let mx = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let w: Vec<f64> = logits
        .iter()
        .map(|&v| ((v as f64 - mx) / temperature).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let u = Tensor::rand_with(&[1], DType::F64, gen)?.to_scalar::<f64>()? * total;
    let mut acc = 0.0;
    for (i, wi) in w.iter().enumerate() {
        acc += wi;
        if u < acc {
            return Ok(i as i64);
        }
    }
    Ok(argmax())
}

#[cfg(test)]
#[path = "gpt_tests.rs"]
mod tests;
