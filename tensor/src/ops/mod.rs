//! Tensor operations, one module per family. Each module adds methods to
//! [`crate::Tensor`]; its CPU kernels sit beside it (`cpu.rs`), so a faster
//! kernel or a CUDA launch can replace one without touching callers.

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
