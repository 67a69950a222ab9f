//! Megatron's model-parallel RNG (`tensor_parallel/random.py`, spec §6.3):
//! dropout inside the tensor-parallel region (on each rank's own heads)
//! must draw different masks on each TP rank, and dropout on replicated
//! activations must draw the same mask on every TP rank.
//!
//! [`model_parallel_manual_seed`] seeds this thread's default generator
//! with `seed` (the same on every TP rank: Megatron's "data-parallel"
//! seed) and adds the named stream [`MODEL_PARALLEL_RNG`] seeded with
//! `seed + 2718 + tp_rank` to the thread's table of `tessera_tensor::rng`
//! (Megatron's `CudaRNGStatesTracker`). [`region_dropout`] applies a
//! dropout layer on the right stream. Gradient checkpointing saves and
//! restores both, so a recomputed segment replays the same masks.
//!
//! Which stream each GPT dropout uses, as in Megatron:
//! * attention-probability dropout (each rank's heads): model-parallel;
//! * embedding and residual ("hidden") dropout without sequence
//!   parallelism: the default stream, so the replicated activations stay
//!   bitwise equal across TP ranks;
//! * the same with sequence parallelism: model-parallel, because each rank
//!   holds a different `s/t` slice of the sequence and must drop its own
//!   tokens independently (Megatron runs the whole transformer under
//!   `get_cuda_rng_tracker().fork()` when `sequence_parallel`, and forks
//!   around the embedding dropout).
//!
//! Data-parallel replicas get the same seeds (Megatron's default: only the
//! pipeline rank offsets the seed, by `100 · pp_rank`; see
//! [`super::train_gpt_3d`]), and see different data.

use tessera_autograd::Var;
use tessera_nn::{Dropout, Module};
use tessera_tensor::{rng, Error, Result};

/// The name of the model-parallel stream (Megatron's
/// `_MODEL_PARALLEL_RNG_TRACKER_NAME`).
pub const MODEL_PARALLEL_RNG: &str = "model-parallel-rng";

/// The offset of the model-parallel seed from the data-parallel one
/// (Megatron's `seed + 2718 + tp_rank`).
pub const MODEL_PARALLEL_SEED_OFFSET: u64 = 2718;

/// Seeds this thread's random streams for TP rank `tp_rank` (Megatron's
/// `model_parallel_cuda_manual_seed`): the default generator with `seed`,
/// and, after emptying the thread's table of named streams, the
/// [`MODEL_PARALLEL_RNG`] stream with `seed + 2718 + tp_rank`. Call it on
/// each rank's thread before the forward. Errors only if the seeds
/// overflow `u64`.
pub fn model_parallel_manual_seed(seed: u64, tp_rank: usize) -> Result<()> {
    let mp_seed = seed
        .checked_add(MODEL_PARALLEL_SEED_OFFSET)
        .and_then(|s| s.checked_add(tp_rank as u64))
        .ok_or_else(|| {
            Error::arg(
                "model_parallel_manual_seed",
                format!("seed {seed} + 2718 + tp rank {tp_rank} overflows u64"),
            )
        })?;
    rng::manual_seed(seed);
    rng::reset_tracked();
    rng::add_tracked(MODEL_PARALLEL_RNG, mp_seed)
}

/// Runs `f` on the model-parallel stream (Megatron's
/// `get_cuda_rng_tracker().fork()`). Errors, naming `op`, when
/// [`model_parallel_manual_seed`] was not called on this thread.
pub fn fork_model_parallel<R>(op: &'static str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    rng::fork(MODEL_PARALLEL_RNG, f)
        .map_err(|_| {
            Error::arg(
                op,
                "dropout in the tensor-parallel region needs the model-parallel RNG: \
                 call tensor_parallel::model_parallel_manual_seed(seed, tp_rank) on this thread first",
            )
        })
        .and_then(|r| r)
}

/// `drop` applied to `x`, drawing from the model-parallel stream when
/// `model_parallel` and from the default generator otherwise. Draws
/// nothing (and needs no stream) when `drop` is in eval mode or has
/// `p == 0`. Errors as [`fork_model_parallel`] and [`Dropout`].
pub fn region_dropout(drop: &Dropout, x: &Var, model_parallel: bool, op: &'static str) -> Result<Var> {
    if !drop.is_training() || drop.p == 0.0 || !model_parallel {
        return drop.forward(x);
    }
    fork_model_parallel(op, || drop.forward(x))
}
