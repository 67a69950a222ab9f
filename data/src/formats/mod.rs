//! File formats: MNIST IDX, CIFAR binary, tessera's record shards,
//! WebDataset-style tar shards and PNG images.

pub mod cifar;
pub mod idx;

pub use cifar::{Cifar, CIFAR10_CLASSES};
pub use idx::{parse_idx, read_idx, write_idx, IdxArray, IdxData, Mnist, FASHION_MNIST_DIR};
pub mod shard;

pub use shard::{write_shards, Field, FieldKind, Record, ShardReader, ShardSet, ShardWriter, Value};
pub mod png;
pub mod tar;
pub mod webdataset;

pub use png::{decode_png, encode_png};
pub use tar::{TarEntry, TarReader, TarWriter};
pub use webdataset::{split_key, BufferShuffle, GroupByKey, TarSample, TarShards};
