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
//!
//! ```
//! use tessera_data::transforms::random_hflip;
//! use tessera_data::{DataLoader, Dataset, Image, VecDataset};
//!
//! let samples: Vec<(Image, i64)> = (0..10).map(|i| (Image::filled(4, 4, 1, i as u8), i)).collect();
//! let ds = VecDataset::new(samples).map_random(0, |(img, y), ctx| Ok((random_hflip(img, 0.5, &mut ctx.rng), y)));
//! let mut loader = DataLoader::builder(ds).batch_size(4).shuffle(true).num_workers(2).build()?;
//! for epoch in 0..2 {
//!     loader.set_epoch(epoch);
//!     for batch in loader.iter() {
//!         let (images, labels) = batch?; // u8 [B, 4, 4, 1], i64 [B]
//!         assert_eq!(images.shape()[1..], [4, 4, 1]);
//!         assert_eq!(labels.shape()[0], images.shape()[0]);
//!     }
//! }
//! # Ok::<(), tessera_data::Error>(())
//! ```

mod collate;
mod dataset;
mod error;
mod iter_loader;
mod iterable;
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
pub use loader::{DataLoader, DataLoaderBuilder, EpochIter, DROP_GRACE};
pub use rng::{mix64, Rng};
pub use sample::{Array, Image};
pub use sampler::{epoch_permutation, DistributedSampler, RandomSampler, Sampler, SequentialSampler};
