//! Tensor operations, one module per family. Each module adds methods to
//! [`crate::Tensor`]; its CPU kernels sit beside it (`cpu.rs`), so a faster
//! kernel or a CUDA launch can replace one without touching callers.

/// `same_device!(op, operands..)`: returns an [`crate::Error::Device`]
/// naming the op and both devices from the enclosing op when its operands
/// are on different devices. For ops composed of other ops that may run on
/// a GPU, so a mixed call fails before any part of it runs.
macro_rules! same_device {
    ($op:expr, $($t:expr),+ $(,)?) => {
        $crate::backend::same_device($op, &[$(&$t as &dyn $crate::backend::Operands),+])?;
    };
}

pub mod attention;
pub mod batch_norm;
mod batch_norm_f32;
pub mod binary;
pub mod compare;
pub mod conv;
pub mod creation;
pub mod cross_entropy;
pub mod cumsum;
#[cfg(test)]
mod fused_tests;
pub mod group_norm;
pub mod interpolate;
pub(crate) mod lanes;
pub mod layer_norm;
mod layer_norm_f32;
pub(crate) mod math_view;
pub mod matmul;
pub(crate) mod norm_common;
#[cfg(test)]
mod norm_tests;
pub mod operators;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod softmax;
pub mod softmax_backward;
pub mod unary;
pub mod view_backward;

pub mod index;
pub mod join;
#[cfg(test)]
mod naive;
#[cfg(test)]
mod no_panic_tests;
pub mod pad;
pub mod repeat;
mod rows;
#[cfg(test)]
mod threads_tests;
pub mod topk;
pub mod tri;
