//! Typed launch wrappers, one module per kernel family. Each function checks
//! its arguments (shapes, buffer lengths, dtype support) and returns the
//! [`crate::Launch`] that runs the kernel, or [`crate::Error::Arg`].

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
pub mod layernorm;
pub mod optim;
pub mod pool;
pub mod reduce;
pub mod resample;
pub mod softmax;

use crate::launch::KernelType;

/// Floating element types with f32 compute: f32, f16, bf16.
pub trait Float: KernelType {}
impl Float for f32 {}
impl Float for half::f16 {}
impl Float for half::bf16 {}

/// Half-precision element types the tensor cores take: f16, bf16.
pub trait Half: Float {}
impl Half for half::f16 {}
impl Half for half::bf16 {}
