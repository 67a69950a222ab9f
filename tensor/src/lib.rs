//! # tessera-tensor
//!
//! n-dimensional tensors with a runtime dtype ([`DType`]), shape and device
//! ([`Device`]); strided views that never copy (transpose, narrow, slice,
//! flip, expand, squeeze/unsqueeze, reshape of contiguous data); NumPy
//! broadcasting for every binary op; and a multi-threaded CPU backend.
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
pub mod ops;
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
mod transfer;

pub use alloc::ALIGN;
pub use backend::{BinaryOp, UnaryOp};
pub use checkpoint::Checkpoint;
pub use device::Device;
pub use dtype::{DType, Element, FloatElement, FloatMath};
pub use error::{Error, Result};
pub use half::{bf16, f16};
pub use layout::{broadcast_shapes, checked_numel, contiguous_strides, dim_index, dim_indices, Layout};
pub use ops::batch_norm::{BatchNormForward, BatchNormOutput};
pub use ops::creation::TensorOptions;
pub use ops::cross_entropy::{CrossEntropyOptions, Reduction};
pub use ops::pad::PadMode;
pub use ops::unary::GeluApprox;
pub use rng::{manual_seed, Generator};
pub use shape_arg::{DimArg, ShapeArg};
pub use simd::Level as SimdLevel;
pub use special::erf;
pub use state_dict::StateDict;
pub use storage::{live_bytes, Storage};
pub use tensor::Tensor;
#[cfg(feature = "cuda")]
pub use tessera_cuda_kernels::MemoryStats;
