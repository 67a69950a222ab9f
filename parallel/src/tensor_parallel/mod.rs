//! Megatron-style tensor parallelism and sequence parallelism (spec §6).
//!
//! * [`mappings`]: the conjugate operators `f`/`g`, scatter/gather along the
//!   hidden dim and the sequence, as differentiable ops on a group.
//! * Layers built by slicing the serial ("master") layer, so a TP-t model
//!   starts identical to the unsharded one: [`ColumnParallelLinear`],
//!   [`RowParallelLinear`], [`VocabParallelEmbedding`],
//!   [`vocab_parallel_cross_entropy`], the blocks [`ParallelMlp`],
//!   [`ParallelSelfAttention`], [`ParallelTransformerLayer`], and the GPT
//!   of `tessera_nn::models` as pipeline-ready layers ([`GptParallel`]).
//! * Gradient bookkeeping ([`TensorParallel::tp_params`] gives each
//!   parameter a [`TpRole`]): the TP all-reduce of sequence-parallel
//!   gradients ([`SequenceParallelGradSync`]) and a global gradient norm
//!   counting TP-duplicated parameters once ([`tp_grad_norm`]).
//! * [`random`]: Megatron's model-parallel RNG for dropout inside and
//!   outside the tensor-parallel region ([`model_parallel_manual_seed`]).
//! * [`TrafficMeter`]: a communicator wrapper counting the bytes each rank
//!   sends, to check the communication volume against the formulas.
//!
//! Every rank of the group must build the same layers from the same master
//! and run the same forward and backward: the collectives of the layers
//! pair up by order.

use std::sync::Arc;

use tessera_autograd::Parameter;

use crate::comm::Communicator;

mod blocks;
mod cross_entropy;
mod gpt;
mod grads;
mod layers;
pub mod mappings;
pub mod random;
mod shard;
mod traffic;
mod trainer;

pub use blocks::{ParallelMlp, ParallelSelfAttention, ParallelTransformerLayer};
pub use cross_entropy::vocab_parallel_cross_entropy;
pub use gpt::{GptEmbedding, GptHead, GptParallel, GptParallelLayers};
pub use grads::{allreduce_sequence_parallel_grads, tp_grad_norm, SequenceParallelGradSync};
pub use layers::{
    ColumnOptions, ColumnParallelLinear, RowOptions, RowParallelLinear, VocabParallelEmbedding,
};
pub use random::{model_parallel_manual_seed, MODEL_PARALLEL_RNG};
pub use shard::{shard, unshard};
pub use traffic::TrafficMeter;
pub use trainer::{train_gpt_3d, Gpt3dOptions, Gpt3dOutcome, MakeOptimizer};

/// A tensor-parallel group as the layers hold it (their backward closures
/// keep it alive).
pub type TpComm = Arc<dyn Communicator>;

/// How a parameter of a tensor-parallel model is laid out over the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpRole {
    /// Each rank holds a different slice (Megatron's
    /// `tensor_model_parallel = True`): counted on every rank.
    Sharded,
    /// Every rank holds the same value and gets the same gradient: counted
    /// once (on TP rank 0) in the gradient norm.
    Replicated,
    /// Replicated, but each rank's gradient covers only its `s/t` tokens
    /// (LayerNorm and row-parallel bias under sequence parallelism): the
    /// gradients are summed over the group before the optimizer step.
    SequenceParallel,
}

/// A module of tensor-parallel layers that can list its parameters with
/// their [`TpRole`].
pub trait TensorParallel {
    /// Every parameter with its role, in `named_parameters` order.
    fn tp_params(&self) -> Vec<(Parameter, TpRole)>;
}
