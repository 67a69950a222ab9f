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

pub mod caching;
#[cfg(feature = "cuda-emu")]
pub mod emu;
pub mod error;
pub mod gpu;
pub mod launch;
pub mod module;
pub mod nvrtc;
pub mod ops;
pub mod philox;
pub mod runtime;

pub use caching::{CachingAllocator, MemoryStats};
pub use error::{Error, Result};
pub use gpu::{driver_available, Gpu};
pub use launch::{Arg, DevPtr, KernelType, Launch};
pub use module::Module;
pub use runtime::{DeviceInfo, Runtime, RuntimeKind};
