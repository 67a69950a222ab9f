//! # tessera-parallel
//!
//! Communicators and collectives: the [`Communicator`] trait (point-to-point
//! send/recv and the NCCL collectives, sub-groups by [`Communicator::split`]),
//! its typed-slice and tensor forms in [`CommExt`], and the backends:
//!
//! * `local` ([`LocalGroup`]): N ranks as threads of one process;
//! * `tcp` ([`tcp`]): ranks as processes on one or many hosts, rendezvous
//!   from the torchrun or SLURM environment ([`env`]);
//! * `nccl` (feature `cuda`): NCCL through cudarc, one thread per GPU.
//!
//! [`CompressedAllReduce`] is DeepSpeed's error-compensated 1-bit
//! all-reduce over any communicator, for `tessera-optim`'s `OnebitAdam`
//! and `OnebitLamb` (with [`DistributedDataParallel::backward_for`]).
//!
//! On `local` and `tcp` the collectives are tessera's own: ring all-reduce
//! (ring reduce-scatter + ring all-gather, segmented and pipelined) with a
//! fixed fold order, so every rank gets bitwise the same result and reruns
//! repeat it (see [`ring_chunk`] and [`fold_reference`]). On `local`,
//! all-reduce instead reduces the ranks' buffers where they lie, in the
//! same fold order (same bits), reading and writing each byte once
//! ([`CommConfig::shared_memory`]). A dead or stalled
//! peer, or ranks that disagree about a call, give an `Err` on every rank
//! within the timeout, never a hang.
//!
//! ```
//! use tessera_parallel::{CommExt, Communicator, LocalGroup, ReduceOp};
//! let sums = LocalGroup::run(4, |comm| {
//!     let mut x = vec![comm.rank() as f32; 3];
//!     comm.all_reduce_slice(&mut x, ReduceOp::Sum).map(|_| x)
//! })?;
//! assert!(sums.iter().all(|x| x.as_ref().unwrap() == &vec![6.0; 3]));
//! # Ok::<(), tessera_parallel::CommError>(())
//! ```

mod collectives;
mod comm;
pub mod compressed;
pub mod ddp;
mod element;
pub mod env;
mod error;
mod frame;
mod grid;
mod group;
mod local;
mod mailbox;
#[cfg(feature = "cuda")]
pub mod nccl;
mod op;
pub mod pipeline;
mod ring;
mod shm;
pub mod tcp;
pub mod tensor_parallel;
pub mod zero;

pub use comm::{CommExt, Communicator};
pub use compressed::CompressedAllReduce;
pub use ddp::{DdpConfig, DdpStepStats, DistributedDataParallel};
pub use element::{accumulate, is_comm_dtype, reduce_into, Buf, BufMut, CommElement, ReduceOp};
pub use error::{CommError, Result};
pub use grid::{GridCoords, GridGroups, ParallelGrid};
pub use group::{CommConfig, CpuComm};
pub use local::LocalGroup;
pub use ring::{fold_reference, ring_chunk};
pub use tessera_tensor::{bf16, f16};
pub use zero::{Zero3, Zero3Config, ZeroConfig, ZeroOptimizer, ZeroStage};
