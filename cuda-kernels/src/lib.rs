//! Hand-written CUDA kernels, typed launch wrappers, and the small runtime
//! interface a tensor backend runs them through.
//!
//! The CUDA C++ sources live in `src/kernels/*.cu` (one per kernel family,
//! plus `common.cuh`, the only place with inline PTX) and are embedded in the
//! binary; [`Gpu`] compiles them at run time with NVRTC for the device's
//! architecture. Building needs no CUDA toolkit, and a machine without a
//! driver gets [`Error::NoDriver`] from [`Gpu::new`], never a panic.
//!
//! Each wrapper in [`ops`] checks shapes and buffer lengths and returns a
//! [`Launch`]; a [`Runtime`] runs it: [`Gpu`] on a real device, or (feature
//! `cuda-emu`) [`emu::Emu`], the CPU emulator of the CUDA execution model
//! that runs the same `.cu` sources compiled as C++. [`runtime::open`] picks
//! one per process (a GPU when present, else the emulator when built in).

//!
//! Without the default feature `cuda` only [`op_codes`] is built: the op
//! definitions the tensor crate's CPU kernels share with the CUDA kernels.

pub mod op_codes;

#[cfg(feature = "cuda")]
pub mod caching;
#[cfg(feature = "cuda-emu")]
pub mod emu;
#[cfg(feature = "cuda")]
pub mod error;
#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
pub mod launch;
#[cfg(feature = "cuda")]
pub mod module;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod ops;
#[cfg(feature = "cuda")]
pub mod philox;
#[cfg(feature = "cuda")]
pub mod runtime;

#[cfg(feature = "cuda")]
pub use caching::{CachingAllocator, MemoryStats};
#[cfg(feature = "cuda")]
pub use error::{Error, Result};
#[cfg(feature = "cuda")]
pub use gpu::{driver_available, Gpu};
#[cfg(feature = "cuda")]
pub use launch::{Arg, DevPtr, KernelType, Launch};
#[cfg(feature = "cuda")]
pub use module::Module;
#[cfg(feature = "cuda")]
pub use runtime::{DeviceInfo, Runtime, RuntimeKind};
