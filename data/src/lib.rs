//! # tessera-data
//!
//! Datasets, data loaders, samplers, file formats and augmentation.
//!
//! - Sources: map-style [`Dataset`]s (length + random access) with `map`,
//!   `map_random`, `filter`, `chain`, `subset`; in-memory [`VecDataset`] and
//!   [`TensorDataset`]; streaming [`IterableDataset`]s.
//! - [`DataLoader`] with PyTorch's semantics (batch size, shuffle, drop_last,
//!   samplers, [`Collate`], worker threads, bounded prefetch, persistent
//!   workers, in-order delivery, worker errors as `Err`), and
//!   [`IterableLoader`] for streams.
//! - Samplers: [`SequentialSampler`], [`RandomSampler`],
//!   [`DistributedSampler`] (PyTorch's padding rules).
//! - Formats ([`formats`]): MNIST IDX, CIFAR-10/100 binary, tessera's
//!   record shards (memory-mapped, checksummed; `FORMAT.md`), WebDataset tar
//!   shards.
//! - Transforms ([`transforms`]): normalize, crops, flips, resize,
//!   RandAugment, batched MixUp/CutMix, progressive resizing.
//!
//! Randomness comes from [`Rng`], a counter-based generator keyed by
//! `(seed, epoch, index)`: results never depend on the worker count.

mod collate;
mod dataset;
mod error;
mod iterable;
mod iter_loader;
mod loader;
mod rng;
mod sample;
mod sampler;

pub mod formats;
pub mod transforms;

pub use collate::Collate;
pub use dataset::{Chain, Dataset, Map, MapRandom, SampleCtx, Subset, TensorDataset, VecDataset};
pub use error::{Error, Result};
pub use iter_loader::{IterableLoader, IterableLoaderBuilder};
pub use iterable::{IterChain, IterFilter, IterMap, IterableDataset, SampleIter, Stream, WorkerInfo};
pub use loader::{DataLoader, DataLoaderBuilder, EpochIter};
pub use rng::{mix64, Rng};
pub use sample::{Array, Image};
pub use sampler::{epoch_permutation, DistributedSampler, RandomSampler, Sampler, SequentialSampler};
