//! Megatron's tensor-parallel transformer blocks (spec §6.3), built from the
//! serial GPT blocks of `tessera_nn::models`: the MLP (column → GELU →
//! row: one all-reduce forward, one backward), self-attention with the
//! heads split over the ranks, and the pre-norm layer around them with
//! optional sequence parallelism (LayerNorm and residual on `[s/t, b, h]`).
//! Activations are `[s, b, h]`. Dropout draws from the streams of
//! [`super::random`]: the attention probabilities from the model-parallel
//! stream, the residual dropout from the default stream (replicated
//! activations) or, under sequence parallelism, from the model-parallel
//! stream (each rank's own tokens).

use tessera_autograd::{Parameter, Var};
use tessera_nn::models::{causal_attention, GptAttention, GptBlock, GptMlp};
use tessera_nn::{Dropout, LayerNorm, Linear, Module};
use tessera_tensor::{Error, GeluApprox, Result};

use super::layers::{ColumnOptions, ColumnParallelLinear, RowOptions, RowParallelLinear};
use super::random::{fork_model_parallel, region_dropout};
use super::{TensorParallel, TpComm, TpRole};

/// The MLP `h → 4h → h` split over the group: `c_fc` column-parallel
/// without gathering, GELU on each rank's `4h/t` columns, `c_proj`
/// row-parallel on them, then the residual dropout of the master.
#[derive(Clone, Module)]
pub struct ParallelMlp {
    /// `h → 4h/t` on this rank.
    pub c_fc: ColumnParallelLinear,
    /// `4h/t → h`, summed over the group.
    pub c_proj: RowParallelLinear,
    /// Dropout after the projection (outside the TP region).
    pub drop: Dropout,
    #[module(skip)]
    sequence_parallel: bool,
}

impl ParallelMlp {
    /// Slices `master` for this rank; `sequence_parallel` takes and returns
    /// `[s/t, b, h]`. Errors when `4h` does not divide by the group size.
    pub fn from_master(master: &GptMlp, comm: &TpComm, sequence_parallel: bool) -> Result<Self> {
        Ok(ParallelMlp {
            c_fc: column(&master.c_fc, comm, sequence_parallel, 1)?,
            c_proj: row(&master.c_proj, comm, sequence_parallel)?,
            drop: master.drop.clone(),
            sequence_parallel,
        })
    }
}

impl Module for ParallelMlp {
    /// Errors as the layers, and when dropout is on under sequence
    /// parallelism without the model-parallel RNG.
    fn forward(&self, x: &Var) -> Result<Var> {
        let y = self.c_fc.forward(x)?.gelu(GeluApprox::None)?;
        let y = self.c_proj.forward(&y)?;
        region_dropout(&self.drop, &y, self.sequence_parallel, "ParallelMlp")
    }
}

/// Causal self-attention with `n_head / t` heads on each rank: the fused
/// `c_attn` column-parallel with stride 3 (rank r keeps `q_r, k_r, v_r`),
/// attention local per head (its dropout on the model-parallel stream),
/// `c_proj` row-parallel, then the residual dropout.
#[derive(Clone, Module)]
pub struct ParallelSelfAttention {
    /// `h → 3h/t`: this rank's heads' q, k, v.
    pub c_attn: ColumnParallelLinear,
    /// `h/t → h`, summed over the group.
    pub c_proj: RowParallelLinear,
    /// Dropout on the attention probabilities (inside the TP region).
    #[module(skip)]
    pub attn_dropout: f64,
    /// Dropout after the projection (outside the TP region); its training
    /// flag also switches the attention dropout.
    pub resid_drop: Dropout,
    #[module(skip)]
    local_heads: usize,
    #[module(skip)]
    sequence_parallel: bool,
}

impl ParallelSelfAttention {
    /// Slices `master` for this rank. Errors when the heads do not divide
    /// by the group size.
    pub fn from_master(master: &GptAttention, comm: &TpComm, sequence_parallel: bool) -> Result<Self> {
        const OP: &str = "ParallelSelfAttention::from_master";
        let t = comm.world_size();
        if !master.n_head.is_multiple_of(t) {
            return Err(Error::arg(
                OP,
                format!(
                    "{} heads do not divide over {t} tensor-parallel ranks",
                    master.n_head
                ),
            ));
        }
        Ok(ParallelSelfAttention {
            c_attn: column(&master.c_attn, comm, sequence_parallel, 3)?,
            c_proj: row(&master.c_proj, comm, sequence_parallel)?,
            attn_dropout: master.attn_dropout,
            resid_drop: master.resid_drop.clone(),
            local_heads: master.n_head / t,
            sequence_parallel,
        })
    }
}

impl Module for ParallelSelfAttention {
    /// `x` `[s, b, h]` (`[s/t, b, h]` under sequence parallelism) → the
    /// same shape. Errors as the layers, and when dropout is on without
    /// the model-parallel RNG (`model_parallel_manual_seed`).
    fn forward(&self, x: &Var) -> Result<Var> {
        const OP: &str = "ParallelSelfAttention";
        let qkv = self.c_attn.forward(x)?.transpose(0, 1)?;
        let (p, heads) = (self.attn_dropout, self.local_heads);
        let y = if self.resid_drop.is_training() && p > 0.0 {
            fork_model_parallel(OP, || causal_attention(&qkv, heads, p, true))?
        } else {
            causal_attention(&qkv, heads, 0.0, false)?
        };
        let y = self.c_proj.forward(&y.transpose(0, 1)?)?;
        region_dropout(&self.resid_drop, &y, self.sequence_parallel, OP)
    }
}

/// The pre-norm GPT block `x + attn(ln_1(x))`, `x + mlp(ln_2(x))` with its
/// attention and MLP split over the group; with sequence parallelism the
/// norms and residuals run on this rank's `s/t` tokens.
#[derive(Clone, Module)]
pub struct ParallelTransformerLayer {
    /// Norm before the attention (replicated).
    pub ln_1: LayerNorm,
    /// The attention.
    pub attn: ParallelSelfAttention,
    /// Norm before the MLP (replicated).
    pub ln_2: LayerNorm,
    /// The MLP.
    pub mlp: ParallelMlp,
    #[module(skip)]
    sequence_parallel: bool,
}

impl ParallelTransformerLayer {
    /// Slices `master` for this rank (errors as the attention's and MLP's
    /// `from_master`).
    pub fn from_master(master: &GptBlock, comm: &TpComm, sequence_parallel: bool) -> Result<Self> {
        Ok(ParallelTransformerLayer {
            ln_1: copy_norm(&master.ln_1)?,
            attn: ParallelSelfAttention::from_master(&master.attn, comm, sequence_parallel)?,
            ln_2: copy_norm(&master.ln_2)?,
            mlp: ParallelMlp::from_master(&master.mlp, comm, sequence_parallel)?,
            sequence_parallel,
        })
    }
}

impl Module for ParallelTransformerLayer {
    fn forward(&self, x: &Var) -> Result<Var> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        x.add(&self.mlp.forward(&self.ln_2.forward(&x)?)?)
    }
}

impl TensorParallel for ParallelMlp {
    fn tp_params(&self) -> Vec<(Parameter, TpRole)> {
        [self.c_fc.tp_params(), self.c_proj.tp_params()].concat()
    }
}

impl TensorParallel for ParallelSelfAttention {
    fn tp_params(&self) -> Vec<(Parameter, TpRole)> {
        [self.c_attn.tp_params(), self.c_proj.tp_params()].concat()
    }
}

impl TensorParallel for ParallelTransformerLayer {
    fn tp_params(&self) -> Vec<(Parameter, TpRole)> {
        let role = norm_role(self.sequence_parallel);
        let mut out: Vec<(Parameter, TpRole)> =
            self.ln_1.parameters().into_iter().map(|p| (p, role)).collect();
        out.extend(self.attn.tp_params());
        out.extend(self.ln_2.parameters().into_iter().map(|p| (p, role)));
        out.extend(self.mlp.tp_params());
        out
    }
}

/// The role of a replicated LayerNorm: with sequence parallelism each rank
/// sees `s/t` tokens, so its gradient must be summed over the group.
pub(crate) fn norm_role(sequence_parallel: bool) -> TpRole {
    match sequence_parallel {
        true => TpRole::SequenceParallel,
        false => TpRole::Replicated,
    }
}

/// A LayerNorm with its own copies of the master's parameters.
pub(crate) fn copy_norm(master: &LayerNorm) -> Result<LayerNorm> {
    let norm = LayerNorm::new(
        &master.normalized_shape,
        master.eps,
        master.weight.is_some(),
        master.bias.is_some(),
    )?;
    norm.load_state_dict(&master.state_dict(), true)?;
    Ok(norm)
}

fn column(
    master: &Linear,
    comm: &TpComm,
    sequence_parallel: bool,
    stride: usize,
) -> Result<ColumnParallelLinear> {
    let opts = ColumnOptions {
        gather_output: false,
        sequence_parallel,
        stride,
    };
    ColumnParallelLinear::from_master(master, comm, opts)
}

fn row(master: &Linear, comm: &TpComm, sequence_parallel: bool) -> Result<RowParallelLinear> {
    let opts = RowOptions {
        input_is_parallel: true,
        sequence_parallel,
    };
    RowParallelLinear::from_master(master, comm, opts)
}
