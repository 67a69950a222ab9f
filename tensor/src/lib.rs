//! # tessera-tensor
//!
//! n-dimensional tensors with a runtime dtype ([`DType`]), shape and device
//! ([`Device`]); strided views that never copy (transpose, narrow, slice,
//! flip, expand, squeeze/unsqueeze, reshape of contiguous data); NumPy
//! broadcasting for every binary op; and a multi-threaded CPU backend.
//!
//! # Backends
//!
//! Every op validates its arguments and then reaches a kernel through one
//! backend interface (the crate-private `backend` module): a `Backend`
//! trait, without default methods, that the CPU backend and the CUDA
//! backend (feature `cuda`; feature `cuda-emu` runs it on a CPU emulator of
//! the device) implement. Dispatch happens once per op call on the device
//! of the operands (operands on different devices are an error naming
//! both). Whether an op has a GPU path is read off the CUDA backend's one
//! `impl` block and checked by the compiler; an op without one is an
//! [`Error::Device`] produced there, naming the op and the device.
//!
//! The elementwise and reduction ops are defined once, in
//! [`UnaryOp`], [`BinaryOp`] (which includes the fused derivative rules
//! such as `GeluErfBackward`) and `ReduceOp` of
//! `tessera_cuda_kernels::op_codes`; the CPU kernels match on them and the
//! CUDA sources are compiled with a header generated from them, so codes
//! cannot drift. Adding an elementwise op touches five places, and the
//! compiler reports each one left out:
//! 1. its definition: a variant in `cuda-kernels/src/op_codes.rs` and the
//!    one-line `Tensor` method calling [`Tensor::unary_op`] /
//!    [`Tensor::binary_op`];
//! 2. its CPU math: its arm in `ops/unary/cpu.rs` (`ops/binary/cpu.rs`),
//!    an exhaustive `match` (a SIMD kernel in `simd/` is optional);
//! 3. its CUDA math: `unary_<NAME>` (`binary_<NAME>`) in
//!    `cuda-kernels/src/kernels/elementwise.cu`, whose `switch` is generated
//!    from the op list;
//! 4. its derivative rule in `tessera-autograd`, composed of tensor ops;
//! 5. its test row: the CPU test against f64 in `ops/unary/tests.rs`; the
//!    device test (`tests/it/cuda_backend.rs`) covers every variant of
//!    `UnaryOp::ALL` / `BinaryOp::ALL` by itself.
//!
//! # Errors
//!
//! Every fallible operation returns [`Result`]; the error names the op and
//! the shapes or values involved. Only the arithmetic operators
//! (`&a + &b`, ...) panic, with that same message, as Rust's indexing does.
//!
//! ```
//! use tessera_tensor::Tensor;
//! let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! let t = a.t()?; // a view: no copy
//! assert_eq!(t.shape(), &[3, 2]);
//! assert_eq!(t.contiguous()?.to_vec::<f32>()?, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
//! # Ok::<(), tessera_tensor::Error>(())
//! ```

pub mod alloc;
mod backend;
mod checkpoint;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod display;
mod dtype;
mod durable;
mod error;
mod layout;
mod map;
mod map_simd;
mod meter;
pub mod ops;
pub mod profile;
pub mod rng;
pub mod safetensors;
mod shape_arg;
mod simd;
mod special;
mod state_dict;
mod storage;
pub mod strided;
mod tensor;
#[cfg(test)]
pub(crate) mod test_util;
mod thread_pool;
mod transfer;

pub use alloc::ALIGN;
pub use backend::{BinaryOp, UnaryOp};
pub use checkpoint::Checkpoint;
#[cfg(feature = "cuda")]
pub use cuda::fused_optim;
pub use device::Device;
pub use dtype::{DType, Element, FloatElement, FloatMath};
pub use error::{Error, Result};
pub use half::{bf16, f16};
pub use layout::{broadcast_shapes, checked_numel, contiguous_strides, dim_index, dim_indices, Layout};
pub use meter::{MemoryMeter, MeterGuard};
pub use ops::attention::{SdpaArgs, SdpaDropout, SdpaGrads, SdpaMask, SdpaOutput};
pub use ops::batch_norm::{BatchNormForward, BatchNormOutput};
pub use ops::creation::TensorOptions;
pub use ops::cross_entropy::{CrossEntropyOptions, Reduction};
pub use ops::pad::PadMode;
pub use ops::unary::GeluApprox;
pub use profile::{profile, Profile};
pub use rng::{manual_seed, Generator};
pub use shape_arg::{DimArg, ShapeArg};
pub use simd::Level as SimdLevel;
pub use special::erf;
pub use state_dict::StateDict;
pub use storage::{live_bytes, Storage};
pub use tensor::Tensor;
/// The CPU emulator's thread orders (feature `cuda-emu`), for tests that
/// run one computation under several orders of the emulated threads.
#[cfg(feature = "cuda-emu")]
pub use tessera_cuda_kernels::emu::{with_thread_order, ThreadOrder};
#[cfg(feature = "cuda")]
pub use tessera_cuda_kernels::MemoryStats;
pub use thread_pool::init_thread_pool;
