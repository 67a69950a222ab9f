//! Iterable (streaming) datasets: sources read front to back, such as tar
//! shards, that split themselves between loader workers.

use crate::{Dataset, Result};

/// Which loader worker is iterating, and how many there are (PyTorch's
/// `get_worker_info()`); `{ id: 0, num_workers: 1 }` in the main thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerInfo {
    /// This worker's index in `0 .. num_workers`.
    pub id: usize,
    /// The number of workers iterating the dataset together.
    pub num_workers: usize,
}

impl WorkerInfo {
    /// The main-thread view: one worker, index 0.
    pub const SINGLE: WorkerInfo = WorkerInfo {
        id: 0,
        num_workers: 1,
    };
}

/// A boxed stream of samples.
pub type SampleIter<'a, T> = Box<dyn Iterator<Item = Result<T>> + Send + 'a>;

/// A dataset read as a stream. Each worker calls [`IterableDataset::iter`]
/// with its [`WorkerInfo`] and must get a disjoint part of the data (the
/// union over workers being the whole epoch); otherwise samples repeat.
pub trait IterableDataset: Send + Sync {
    /// One sample.
    type Item: Send + 'static;

    /// The samples of `epoch` that worker `worker` reads.
    fn iter(&self, epoch: u64, worker: WorkerInfo) -> SampleIter<'_, Self::Item>;

    /// Applies `f` to each sample.
    fn map<U, F>(self, f: F) -> IterMap<Self, F>
    where
        Self: Sized,
        U: Send + 'static,
        F: Fn(Self::Item) -> Result<U> + Send + Sync,
    {
        IterMap { inner: self, f }
    }

    /// Keeps the samples for which `keep` is true (errors pass through).
    fn filter<F>(self, keep: F) -> IterFilter<Self, F>
    where
        Self: Sized,
        F: Fn(&Self::Item) -> bool + Send + Sync,
    {
        IterFilter { inner: self, keep }
    }

    /// The samples of `self` followed by those of `other`.
    fn chain<B>(self, other: B) -> IterChain<Self, B>
    where
        Self: Sized,
        B: IterableDataset<Item = Self::Item>,
    {
        IterChain { a: self, b: other }
    }
}

/// See [`IterableDataset::map`].
pub struct IterMap<I, F> {
    inner: I,
    f: F,
}

impl<I, U, F> IterableDataset for IterMap<I, F>
where
    I: IterableDataset,
    U: Send + 'static,
    F: Fn(I::Item) -> Result<U> + Send + Sync,
{
    type Item = U;
    fn iter(&self, epoch: u64, worker: WorkerInfo) -> SampleIter<'_, U> {
        Box::new(self.inner.iter(epoch, worker).map(|r| r.and_then(&self.f)))
    }
}

/// See [`IterableDataset::filter`].
pub struct IterFilter<I, F> {
    inner: I,
    keep: F,
}

impl<I, F> IterableDataset for IterFilter<I, F>
where
    I: IterableDataset,
    F: Fn(&I::Item) -> bool + Send + Sync,
{
    type Item = I::Item;
    fn iter(&self, epoch: u64, worker: WorkerInfo) -> SampleIter<'_, I::Item> {
        Box::new(
            self.inner
                .iter(epoch, worker)
                .filter(|r| r.as_ref().map_or(true, &self.keep)),
        )
    }
}

/// See [`IterableDataset::chain`].
pub struct IterChain<A, B> {
    a: A,
    b: B,
}

impl<A, B> IterableDataset for IterChain<A, B>
where
    A: IterableDataset,
    B: IterableDataset<Item = A::Item>,
{
    type Item = A::Item;
    fn iter(&self, epoch: u64, worker: WorkerInfo) -> SampleIter<'_, A::Item> {
        Box::new(self.a.iter(epoch, worker).chain(self.b.iter(epoch, worker)))
    }
}

/// A map-style dataset read as a stream: worker `w` of `W` reads indices
/// `w, w + W, w + 2W, ...` in order.
pub struct Stream<D>(pub D);

impl<D: Dataset> IterableDataset for Stream<D> {
    type Item = D::Item;
    fn iter(&self, epoch: u64, worker: WorkerInfo) -> SampleIter<'_, D::Item> {
        let step = worker.num_workers.max(1);
        Box::new(
            (worker.id..self.0.len())
                .step_by(step)
                .map(move |i| self.0.get_epoch(i, epoch)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::VecDataset;

    #[test]
    fn stream_splits_by_worker_and_combinators_apply() {
        let s = Stream(VecDataset::new((0..10i64).collect()))
            .chain(Stream(VecDataset::new(vec![100i64])))
            .map(|x| Ok(x + 1))
            .filter(|x| x % 2 == 1);
        let w = |id| WorkerInfo { id, num_workers: 2 };
        let a: Vec<i64> = s.iter(0, w(0)).map(|r| r.unwrap()).collect();
        let b: Vec<i64> = s.iter(0, w(1)).map(|r| r.unwrap()).collect();
        assert_eq!(a, vec![1, 3, 5, 7, 9, 101]);
        assert!(b.is_empty());
    }
}
