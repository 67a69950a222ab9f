//! Hand-written CUDA kernels and typed launch wrappers over cudarc.
//!
//! The CUDA C++ sources live in `src/kernels/*.cu` (one per kernel family,
//! plus `common.cuh`, the only place with inline PTX) and are embedded in the
//! binary; [`Gpu`] compiles them at run time with NVRTC for the device's
//! architecture. Building needs no CUDA toolkit, and a machine without a
//! driver gets [`Error::NoDriver`] from [`Gpu::new`], never a panic.
//!
//! Each wrapper in [`ops`] checks shapes and buffer lengths and returns a
//! [`Launch`]; [`Gpu::launch`] runs it. The crate's tests run the very same
//! launches on a CPU emulator of the CUDA execution model (`emu/`).

pub mod error;
pub mod gpu;
pub mod launch;
pub mod module;
pub mod nvrtc;
pub mod ops;
pub mod philox;

pub use error::{Error, Result};
pub use gpu::{driver_available, Gpu};
pub use launch::{Arg, DevPtr, KernelType, Launch};
pub use module::Module;
