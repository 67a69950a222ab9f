//! Map-style datasets: a length and random access to sample `i`, plus the
//! `map` / `map_random` / `filter` / `chain` / `subset` combinators and
//! in-memory datasets.

use std::sync::Arc;

use tessera_tensor::Tensor;

use crate::{Error, Result, Rng};

/// A dataset with a known length and random access to each sample.
///
/// Implementations must be `Send + Sync`: loader workers share one dataset
/// through an `Arc` and call [`Dataset::get_epoch`] concurrently.
pub trait Dataset: Send + Sync {
    /// One sample.
    type Item: Send + 'static;

    /// The number of samples.
    fn len(&self) -> usize;

    /// Sample `index`; errors when `index >= len()` or reading it fails.
    fn get(&self, index: usize) -> Result<Self::Item>;

    /// Sample `index` as seen in `epoch`. The loader calls this; random
    /// transforms ([`Dataset::map_random`]) key their generator on `epoch`,
    /// every other dataset returns [`Dataset::get`].
    fn get_epoch(&self, index: usize, epoch: u64) -> Result<Self::Item> {
        let _ = epoch;
        self.get(index)
    }

    /// True when the dataset has no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies `f` to each sample as it is read (lazily, in the worker).
    fn map<U, F>(self, f: F) -> Map<Self, F>
    where
        Self: Sized,
        U: Send + 'static,
        F: Fn(Self::Item) -> Result<U> + Send + Sync,
    {
        Map { inner: self, f }
    }

    /// Applies a random transform: `f` receives the sample and a
    /// [`SampleCtx`] whose generator is keyed by `(seed, epoch, index)`, so
    /// the result depends only on those, never on the worker count or timing.
    fn map_random<U, F>(self, seed: u64, f: F) -> MapRandom<Self, F>
    where
        Self: Sized,
        U: Send + 'static,
        F: Fn(Self::Item, &mut SampleCtx) -> Result<U> + Send + Sync,
    {
        MapRandom { inner: self, seed, f }
    }

    /// Keeps the samples for which `keep` is true. Reads every sample once
    /// now (epoch 0) to build the index list; errors when a read fails.
    fn filter<F>(self, keep: F) -> Result<Subset<Self>>
    where
        Self: Sized,
        F: Fn(&Self::Item) -> bool,
    {
        let mut kept = Vec::new();
        for i in 0..self.len() {
            if keep(&self.get(i)?) {
                kept.push(i);
            }
        }
        Ok(Subset {
            inner: self,
            indices: kept,
        })
    }

    /// The samples of `self` followed by those of `other`.
    fn chain<B>(self, other: B) -> Chain<Self, B>
    where
        Self: Sized,
        B: Dataset<Item = Self::Item>,
    {
        Chain { a: self, b: other }
    }

    /// The samples at `indices` (in that order); errors when one is out of range.
    fn subset(self, indices: Vec<usize>) -> Result<Subset<Self>>
    where
        Self: Sized,
    {
        let n = self.len();
        for &i in &indices {
            Error::check_index("subset", i, n)?;
        }
        Ok(Subset { inner: self, indices })
    }
}

/// What a random transform knows about the sample it transforms.
#[derive(Debug, Clone)]
pub struct SampleCtx {
    /// The epoch being loaded.
    pub epoch: u64,
    /// The index of the sample in the dataset the transform wraps.
    pub index: usize,
    /// A generator keyed by `(seed, epoch, index)`.
    pub rng: Rng,
}

impl<D: Dataset + ?Sized> Dataset for Arc<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        (**self).len()
    }
    fn get(&self, index: usize) -> Result<D::Item> {
        (**self).get(index)
    }
    fn get_epoch(&self, index: usize, epoch: u64) -> Result<D::Item> {
        (**self).get_epoch(index, epoch)
    }
}

/// A dataset whose samples pass through a function; see [`Dataset::map`].
pub struct Map<D, F> {
    inner: D,
    f: F,
}

impl<D, U, F> Dataset for Map<D, F>
where
    D: Dataset,
    U: Send + 'static,
    F: Fn(D::Item) -> Result<U> + Send + Sync,
{
    type Item = U;
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn get(&self, index: usize) -> Result<U> {
        (self.f)(self.inner.get(index)?)
    }
    fn get_epoch(&self, index: usize, epoch: u64) -> Result<U> {
        (self.f)(self.inner.get_epoch(index, epoch)?)
    }
}

/// A dataset whose samples pass through a seeded random function; see
/// [`Dataset::map_random`].
pub struct MapRandom<D, F> {
    inner: D,
    seed: u64,
    f: F,
}

impl<D, U, F> Dataset for MapRandom<D, F>
where
    D: Dataset,
    U: Send + 'static,
    F: Fn(D::Item, &mut SampleCtx) -> Result<U> + Send + Sync,
{
    type Item = U;
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn get(&self, index: usize) -> Result<U> {
        self.get_epoch(index, 0)
    }
    fn get_epoch(&self, index: usize, epoch: u64) -> Result<U> {
        let item = self.inner.get_epoch(index, epoch)?;
        let mut ctx = SampleCtx {
            epoch,
            index,
            rng: Rng::for_sample(self.seed, epoch, index as u64),
        };
        (self.f)(item, &mut ctx)
    }
}

/// Selected samples of a dataset; see [`Dataset::subset`] and [`Dataset::filter`].
pub struct Subset<D> {
    inner: D,
    indices: Vec<usize>,
}

impl<D: Dataset> Dataset for Subset<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn get(&self, index: usize) -> Result<D::Item> {
        self.get_epoch(index, 0)
    }
    fn get_epoch(&self, index: usize, epoch: u64) -> Result<D::Item> {
        Error::check_index("Subset::get", index, self.indices.len())?;
        self.inner.get_epoch(self.indices[index], epoch)
    }
}

/// Two datasets one after the other; see [`Dataset::chain`].
pub struct Chain<A, B> {
    a: A,
    b: B,
}

impl<A, B> Dataset for Chain<A, B>
where
    A: Dataset,
    B: Dataset<Item = A::Item>,
{
    type Item = A::Item;
    fn len(&self) -> usize {
        self.a.len() + self.b.len()
    }
    fn get(&self, index: usize) -> Result<A::Item> {
        self.get_epoch(index, 0)
    }
    fn get_epoch(&self, index: usize, epoch: u64) -> Result<A::Item> {
        let na = self.a.len();
        if index < na {
            self.a.get_epoch(index, epoch)
        } else {
            Error::check_index("Chain::get", index, self.len())?;
            self.b.get_epoch(index - na, epoch)
        }
    }
}

/// Samples held in memory; `get` clones one.
pub struct VecDataset<T> {
    items: Vec<T>,
}

impl<T> VecDataset<T> {
    /// A dataset over `items`.
    pub fn new(items: Vec<T>) -> Self {
        VecDataset { items }
    }
}

impl<T: Clone + Send + Sync + 'static> Dataset for VecDataset<T> {
    type Item = T;
    fn len(&self) -> usize {
        self.items.len()
    }
    fn get(&self, index: usize) -> Result<T> {
        self.items.get(index).cloned().ok_or(Error::Index {
            op: "VecDataset::get",
            index,
            len: self.items.len(),
        })
    }
}

/// Tensors that share their first dimension; sample `i` is the `i`-th slice
/// of each (PyTorch's `TensorDataset`). Slices are views: no copy until
/// collate.
pub struct TensorDataset {
    tensors: Vec<Tensor>,
    len: usize,
}

impl TensorDataset {
    /// A dataset over `tensors`; errors when there are none, one is 0-d, or
    /// their first dimensions differ.
    pub fn new(tensors: Vec<Tensor>) -> Result<Self> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::arg("TensorDataset::new", "needs at least one tensor"))?;
        let len = *first
            .shape()
            .first()
            .ok_or_else(|| Error::arg("TensorDataset::new", "tensor 0 is 0-dimensional"))?;
        for (k, t) in tensors.iter().enumerate() {
            if t.shape().first() != Some(&len) {
                return Err(Error::arg(
                    "TensorDataset::new",
                    format!(
                        "tensor {k} has shape {:?} but tensor 0 has {len} samples",
                        t.shape()
                    ),
                ));
            }
        }
        Ok(TensorDataset { tensors, len })
    }
}

impl Dataset for TensorDataset {
    type Item = Vec<Tensor>;
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        Error::check_index("TensorDataset::get", index, self.len)?;
        self.tensors
            .iter()
            .map(|t| Ok(t.select(0, index as isize)?))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinators_compose() {
        let a = VecDataset::new((0..5i64).collect());
        let b = VecDataset::new((100..103i64).collect());
        let ds = a.chain(b).map(|x| Ok(x * 2)).filter(|x| x % 4 == 0).unwrap();
        let got: Vec<i64> = (0..ds.len()).map(|i| ds.get(i).unwrap()).collect();
        assert_eq!(got, vec![0, 4, 8, 200, 204]);
        assert!(matches!(ds.get(5), Err(Error::Index { .. })));
    }

    #[test]
    fn map_random_depends_on_seed_epoch_index_only() {
        let ds = VecDataset::new(vec![0u64; 4]).map_random(9, |_, c| Ok(c.rng.next_u64()));
        assert_eq!(ds.get_epoch(2, 1).unwrap(), ds.get_epoch(2, 1).unwrap());
        assert_ne!(ds.get_epoch(2, 1).unwrap(), ds.get_epoch(2, 2).unwrap());
        assert_ne!(ds.get_epoch(2, 1).unwrap(), ds.get_epoch(3, 1).unwrap());
        assert_eq!(ds.get(1).unwrap(), ds.get_epoch(1, 0).unwrap());
    }

    #[test]
    fn tensor_dataset_slices_and_checks() {
        let x = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[3, 2]).unwrap();
        let y = Tensor::from_vec(vec![7i64, 8, 9], &[3]).unwrap();
        let ds = TensorDataset::new(vec![x.clone(), y]).unwrap();
        let s = ds.get(1).unwrap();
        assert_eq!(s[0].to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
        assert_eq!(s[1].to_scalar::<i64>().unwrap(), 8);
        assert!(ds.get(3).is_err());
        let bad = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
        assert!(TensorDataset::new(vec![x, bad]).is_err());
    }
}
