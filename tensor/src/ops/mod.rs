//! Tensor operations, one module per family. Each module adds methods to
//! [`crate::Tensor`]; its CPU kernels sit beside it (`cpu.rs`), so a faster
//! kernel or a CUDA launch can replace one without touching callers.

/// `on_cuda!(cond => call)`: with the feature `cuda`, returns `call` from
/// the enclosing op when `cond` (an operand is on a GPU) holds; without the
/// feature it expands to nothing, so the CPU path pays nothing. Ops with a
/// CUDA path start with this one line.
macro_rules! on_cuda {
    ($cond:expr => $call:expr) => {
        #[cfg(feature = "cuda")]
        if $cond {
            return $call;
        }
    };
}

/// `cpu_only!(op, operands..)`: with the feature `cuda`, returns an
/// [`crate::Error::Device`] from the enclosing op when an operand (a
/// tensor, an `Option<&Tensor>` or a slice of tensors) is on a GPU, naming
/// the op, or when operands are on different devices, naming both; without
/// the feature it expands to nothing. Ops without a CUDA path start with
/// this one line, so no CPU kernel ever sees device memory.
macro_rules! cpu_only {
    ($op:expr, $($t:expr),+ $(,)?) => {
        #[cfg(feature = "cuda")]
        $crate::cuda::host_only($op, &[$(&$t as &dyn $crate::cuda::Operands),+])?;
    };
}

/// `same_device!(op, operands..)`: with the feature `cuda`, returns an
/// [`crate::Error::Device`] naming the op and both devices from the
/// enclosing op when its operands are on different devices; nothing
/// without the feature. For ops composed of other ops that may run on a
/// GPU, so a mixed call fails before any part of it runs.
macro_rules! same_device {
    ($op:expr, $($t:expr),+ $(,)?) => {
        #[cfg(feature = "cuda")]
        $crate::cuda::same_device($op, &[$(&$t as &dyn $crate::cuda::Operands),+])?;
    };
}

pub mod batch_norm;
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
