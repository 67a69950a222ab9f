//! # tessera-autograd
//!
//! Define-by-run automatic differentiation. Ops on [`Var`]s run eagerly and,
//! when an input requires a gradient, record a node (op, inputs, a backward
//! closure holding only what it reads). [`Var::backward`] walks the recorded
//! nodes reachable from the output in reverse creation order and returns
//! [`Gradients`] keyed by leaf. Saved tensors are freed as each node runs.
//!
//! - [`no_grad`] turns recording off on this thread; [`Var::detach`] cuts a
//!   value from the graph; [`Var::requires_grad_`] freezes a leaf.
//! - [`Var::register_hook`] runs a callback with a leaf's gradient as soon
//!   as it is final during backward (DDP and ZeRO start communication there).
//! - [`checkpoint`] recomputes a segment during backward instead of keeping
//!   its activations.
//! - [`autocast`] runs a closure with PyTorch's mixed-precision op policy
//!   ([`cast_policy`]): matmul/linear/conv/attention in f16 or bf16,
//!   softmax, norms, losses and reductions in f32.
//! - New differentiable ops are written with [`record`] / [`record_multi`].
//! - [`Parameter`] is a shared handle to a trainable leaf: the module that
//!   reads it and the optimizer that updates it in place see one value;
//!   it can be released and fetched back on demand (ZeRO-3), and ops keep
//!   such a parameter for backward as a [`Saved`] reference.

mod autocast;
mod checkpoint;
mod engine;
mod gradcheck;
mod mode;
mod node;
pub mod ops;
mod param;
mod record;
mod saved;
mod var;

pub use autocast::{autocast, autocast_dtype, cast_policy, no_autocast, CastPolicy};
pub use checkpoint::{checkpoint, checkpoint_sequential};
pub use engine::{backward_many, Gradients};
pub use gradcheck::{gradcheck, op_names, GradcheckOptions, GradcheckReport};
pub use mode::{enable_grad, is_grad_enabled, no_grad, GradModeGuard};
pub use node::{BackwardFn, Hook};
pub use ops::attention::{
    scaled_dot_product_attention, scaled_dot_product_attention_composite, AttnMask, AttnOptions,
};
pub use ops::loss::{CrossEntropyOptions, Reduction, Target};
pub use ops::registry::DIFFERENTIABLE_OPS;
pub use ops::sum_to;
pub use param::{FetchHook, Parameter, ValueMut};
pub use record::{record, record_multi};
pub use saved::Saved;
pub use tessera_tensor::BatchNormOutput;
pub use var::{Var, VarId};

#[cfg(test)]
mod tests;
