//! The trainer's data: raw 8-bit images from any of the supported formats,
//! and the batches built from them each step (RandAugment, padding to the
//! model's side, progressive resizing, per-channel normalization, then
//! MixUp/CutMix on the batch).

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use tessera::data::formats::{Cifar, GroupByKey, Mnist, ShardSet, TarReader, TarSample};
use tessera::data::transforms::{pad, resize, Mixup, Padding, ProgressiveResize, RandAugment};
use tessera::data::{Dataset, Image, Rng};
use tessera::tensor::Tensor;

use super::common::{pixel_stats, BoxResult, Split};

/// One split as 8-bit HWC images with their labels.
pub struct Images {
    pub images: Vec<Image>,
    pub labels: Vec<i64>,
}

impl Images {
    /// The `train` (else test) split of `data`, the first `limit` samples
    /// if given. `data` is an MNIST-layout IDX directory, a CIFAR-10 binary
    /// directory (`data_batch_1.bin` … `test_batch.bin`, or its
    /// `cifar-10-batches-bin` parent), a directory of tessera shards
    /// `train-*.tshard` / `test-*.tshard` with an `image` (u8 image) and a
    /// `label` (i64) field, or a directory of WebDataset tar shards
    /// `train-*.tar` / `test-*.tar` (gzipped too) whose samples hold a
    /// `png` image and a `cls` label. Errors name the directory and what
    /// it lacks, or the shard and sample that do not decode.
    pub fn load(data: &Path, train: bool, limit: Option<usize>) -> BoxResult<Images> {
        let split = if train { "train" } else { "test" };
        let (images, labels) = match Format::detect(data)? {
            Format::Idx => read_all(&Mnist::open(data, train)?, limit, Ok)?,
            Format::Cifar10 => read_all(&Cifar::cifar10(data, train)?, limit, Ok)?,
            Format::Shards => {
                let paths = shard_paths(data, split, TSHARD)?;
                read_all(&ShardSet::open(&paths)?, limit, |mut r| {
                    Ok((r.take_image("image")?, r.i64("label")?))
                })?
            }
            Format::WebDataset => {
                let paths = shard_paths(data, split, TAR)?;
                read_webdataset(&paths, limit)?
            }
        };
        if let Some(first) = images.first() {
            if let Some((i, im)) = images
                .iter()
                .enumerate()
                .find(|(_, im)| im.shape() != first.shape())
            {
                let (a, b) = (im.shape(), first.shape());
                return Err(format!("image {i} is {a:?} (HWC) where image 0 is {b:?}").into());
            }
        }
        if let Some(i) = labels.iter().position(|&l| l < 0) {
            return Err(format!("label {i} is negative ({})", labels[i]).into());
        }
        Ok(Images { images, labels })
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// The channels of the images (all alike: checked at load).
    pub fn channels(&self) -> usize {
        self.images.first().map_or(1, Image::channels)
    }

    /// One more than the largest label.
    pub fn classes(&self) -> usize {
        self.labels.iter().max().map_or(0, |&m| m as usize + 1)
    }
}

/// How a batch is made from raw images.
pub struct Batcher {
    /// The model's input side: images are padded (centred, with 0) to it.
    pub img_size: usize,
    /// Per-channel `(mean, std)` of the training pixels scaled to [0, 1].
    pub stats: Vec<(f64, f64)>,
    pub randaugment: Option<RandAugment>,
    pub progressive: Option<ProgressiveResize>,
    pub mixup: Option<Mixup>,
    pub seed: u64,
}

/// A training batch: images `[B, C, r, r]`, the labels, and the soft
/// targets when MixUp/CutMix mixed it.
pub struct Batch {
    pub images: Tensor,
    pub labels: Tensor,
    pub soft_targets: Option<Tensor>,
}

impl Batcher {
    /// The side of the training images in `epoch`.
    pub fn resolution(&self, epoch: usize) -> usize {
        self.progressive
            .as_ref()
            .map_or(self.img_size, |p| p.resolution(epoch as u64))
    }

    /// The training batch of samples `idx` at optimizer-independent step
    /// `step` of `epoch`. Every random choice is keyed on the seed, the
    /// epoch, and the sample or step, so a resumed run and any thread count
    /// see the same batch.
    pub fn train_batch(&self, data: &Images, idx: &[usize], epoch: usize, step: usize) -> BoxResult<Batch> {
        let side = self.resolution(epoch);
        let images = self.stack(data, idx, side, |i, img| match &self.randaugment {
            Some(ra) => ra.apply(img, &mut Rng::for_sample(self.seed, epoch as u64, i as u64)),
            None => img.clone(),
        })?;
        let labels = Tensor::from_vec(idx.iter().map(|&i| data.labels[i]).collect(), &[idx.len()])?;
        match &self.mixup {
            Some(mix) => {
                let mut rng = Rng::keyed(self.seed, &[u64::MAX, step as u64]);
                let out = mix.apply(&images, &labels, &mut rng)?;
                Ok(Batch {
                    images: out.images,
                    labels,
                    soft_targets: Some(out.targets),
                })
            }
            None => Ok(Batch {
                images,
                labels,
                soft_targets: None,
            }),
        }
    }

    /// The whole of `data` at the model's side without augmentation, for
    /// evaluation.
    pub fn eval_split(&self, data: &Images) -> BoxResult<Split> {
        let idx: Vec<usize> = (0..data.len()).collect();
        Ok(Split {
            images: self.stack(data, &idx, self.img_size, |_, img| img.clone())?,
            labels: Tensor::from_vec(data.labels.clone(), &[data.len()])?,
        })
    }

    /// `[B, C, side, side]` f32 of the samples `idx`, each passed through
    /// `augment`, padded to `img_size`, resized to `side` and normalized.
    fn stack(
        &self,
        data: &Images,
        idx: &[usize],
        side: usize,
        augment: impl Fn(usize, &Image) -> Image + Sync,
    ) -> BoxResult<Tensor> {
        let c = self.stats.len();
        let per = c * side * side;
        let mut out = vec![0f32; idx.len() * per];
        out.par_chunks_mut(per)
            .zip(idx.par_iter())
            .try_for_each(|(dst, &i)| -> Result<(), String> {
                let img = augment(i, &data.images[i]);
                let img = self.fit(&img).map_err(|e| format!("sample {i}: {e}"))?;
                let img = if side == self.img_size {
                    img
                } else {
                    resize(&img, side, side).map_err(|e| format!("sample {i}: {e}"))?
                };
                for (ch, plane) in dst.chunks_mut(side * side).enumerate() {
                    let (mean, std) = self.stats[ch];
                    let (scale, shift) = ((1.0 / (255.0 * std)) as f32, (-mean / std) as f32);
                    for (k, v) in plane.iter_mut().enumerate() {
                        *v = img.at(k / side, k % side, ch) as f32 * scale + shift;
                    }
                }
                Ok(())
            })?;
        Ok(Tensor::from_vec(out, &[idx.len(), c, side, side])?)
    }

    /// `img` padded with 0 (centred) to `img_size`.
    fn fit(&self, img: &Image) -> Result<Image, String> {
        let (h, w) = (img.height(), img.width());
        if h == self.img_size && w == self.img_size {
            return Ok(img.clone());
        }
        if h != w || h > self.img_size || !(self.img_size - h).is_multiple_of(2) {
            return Err(format!(
                "a {h}×{w} image cannot be centred in {0}×{0} (square images, an even margin)",
                self.img_size
            ));
        }
        pad(img, (self.img_size - h) / 2, Padding::Constant(0)).map_err(|e| e.to_string())
    }
}

/// Per-channel `(mean, std)` of `images`' pixels scaled to [0, 1].
pub fn channel_stats(images: &Images) -> Vec<(f64, f64)> {
    (0..images.channels())
        .map(|ch| {
            let pixels: Vec<u8> = images
                .images
                .iter()
                .flat_map(|im| im.data().iter().skip(ch).step_by(im.channels()).copied())
                .collect();
            pixel_stats(&pixels)
        })
        .collect()
}

enum Format {
    Idx,
    Cifar10,
    Shards,
    WebDataset,
}

impl Format {
    fn detect(data: &Path) -> BoxResult<Format> {
        let has = |name: &str| data.join(name).exists();
        if has("train-images-idx3-ubyte") || has("train-images-idx3-ubyte.gz") {
            return Ok(Format::Idx);
        }
        if has("data_batch_1.bin") || has("test_batch.bin") || has("cifar-10-batches-bin") {
            return Ok(Format::Cifar10);
        }
        if shard_paths(data, "train", TSHARD).is_ok() {
            return Ok(Format::Shards);
        }
        if shard_paths(data, "train", TAR).is_ok() {
            return Ok(Format::WebDataset);
        }
        Err(format!(
            "--data {}: neither an MNIST-layout IDX directory, a CIFAR-10 binary directory, \
             a directory of train-*.tshard shards nor one of train-*.tar WebDataset shards",
            data.display()
        )
        .into())
    }
}

/// The file endings of tessera shards and of WebDataset shards (plain or
/// gzipped, which the tar reader detects).
const TSHARD: &[&str] = &[".tshard"];
const TAR: &[&str] = &[".tar", ".tar.gz", ".tgz"];

/// `dir/{split}-*` ending in one of `endings`, sorted; an error when there
/// is none.
fn shard_paths(dir: &Path, split: &str, endings: &[&str]) -> BoxResult<Vec<PathBuf>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(&format!("{split}-")) && endings.iter().any(|e| name.ends_with(e))
        })
        .collect();
    if paths.is_empty() {
        return Err(format!("{} has no {split}-*{} shard", dir.display(), endings[0]).into());
    }
    paths.sort();
    Ok(paths)
}

/// The first `limit` samples of the WebDataset shards `paths`, in order:
/// the tars are read one after the other, the images decoded in parallel.
fn read_webdataset(paths: &[PathBuf], limit: Option<usize>) -> BoxResult<(Vec<Image>, Vec<i64>)> {
    let limit = limit.unwrap_or(usize::MAX);
    let mut samples: Vec<TarSample> = Vec::new();
    for p in paths {
        if samples.len() >= limit {
            break;
        }
        let shard = GroupByKey::new(TarReader::open(p)?, p.display().to_string());
        for s in shard.take(limit - samples.len()) {
            samples.push(s?);
        }
    }
    let decoded = samples
        .par_iter()
        .map(|s| Ok((s.image()?, s.class()?)))
        .collect::<tessera::data::Result<Vec<_>>>()?;
    Ok(decoded.into_iter().unzip())
}

/// The first `limit` samples of `ds` through `sample`, read in parallel.
fn read_all<D: Dataset>(
    ds: &D,
    limit: Option<usize>,
    sample: impl Fn(D::Item) -> tessera::data::Result<(Image, i64)> + Sync,
) -> BoxResult<(Vec<Image>, Vec<i64>)> {
    let n = limit.map_or(ds.len(), |l| l.min(ds.len()));
    let samples = (0..n)
        .into_par_iter()
        .map(|i| sample(ds.get(i)?))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(samples.into_iter().unzip())
}
