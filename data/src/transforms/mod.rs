//! Transforms: per-image ([`Image`](crate::Image), u8 HWC) normalize, crops,
//! flips, resize and RandAugment; batched MixUp / CutMix on batch tensors;
//! the progressive-resizing schedule. Random transforms take an
//! [`Rng`](crate::Rng) — inside a dataset, the one
//! [`Dataset::map_random`](crate::Dataset::map_random) hands out, keyed by
//! `(seed, epoch, index)`.

mod basic;
mod mix;
mod progressive;
mod randaugment;

pub use basic::{
    center_crop, crop, hflip, normalize, pad, random_crop, random_hflip, random_resized_crop,
    random_resized_crop_params, resize, Padding,
};
pub use mix::{MixOutput, Mixup};
pub use progressive::ProgressiveResize;
pub use randaugment::{AugOp, RandAugment};
