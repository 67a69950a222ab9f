//! Tensor operations, one module per family. Each module adds methods to
//! [`crate::Tensor`]; its CPU kernels sit beside it (`cpu.rs`), so a faster
//! kernel or a CUDA launch can replace one without touching callers.
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
