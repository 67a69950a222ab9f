//! [`IterableLoader`]: batches from an [`IterableDataset`], with worker
//! threads that each read their own split and a round-robin merge.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::loader::panic_message;
use crate::{Collate, Error, IterableDataset, Result, WorkerInfo};

type BatchOf<I> = <<I as IterableDataset>::Item as Collate>::Batch;

/// Loads batches from a stream. As in PyTorch, each worker batches its own
/// split (so `drop_last` applies per worker) and the loader yields batch `k`
/// of worker `k mod W` in turn, skipping workers that have finished; the
/// order is therefore fixed for a given worker count. An error or panic in
/// a worker is yielded as `Err`, after which the epoch ends.
pub struct IterableLoader<I: IterableDataset>
where
    I::Item: Collate,
{
    dataset: Arc<I>,
    batch_size: usize,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    epoch: u64,
}

/// Options of an [`IterableLoader`].
pub struct IterableLoaderBuilder<I> {
    dataset: Arc<I>,
    batch_size: usize,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
}

impl<I> IterableLoaderBuilder<I>
where
    I: IterableDataset + 'static,
    I::Item: Collate,
{
    /// Samples per batch (default 1).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }
    /// Drop each worker's last short batch (default false).
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }
    /// Worker threads (default 0: read in the calling thread).
    pub fn num_workers(mut self, n: usize) -> Self {
        self.num_workers = n;
        self
    }
    /// Batches each worker may have ready ahead of the consumer (default 2).
    pub fn prefetch_factor(mut self, n: usize) -> Self {
        self.prefetch_factor = n;
        self
    }
    /// The loader; errors when the batch size or prefetch factor is 0.
    pub fn build(self) -> Result<IterableLoader<I>> {
        if self.batch_size == 0 || self.prefetch_factor == 0 {
            return Err(Error::arg(
                "IterableLoader::build",
                "batch_size and prefetch_factor must be positive",
            ));
        }
        Ok(IterableLoader {
            dataset: self.dataset,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            num_workers: self.num_workers,
            prefetch_factor: self.prefetch_factor,
            epoch: 0,
        })
    }
}

impl<I> IterableLoader<I>
where
    I: IterableDataset + 'static,
    I::Item: Collate,
{
    /// A builder over `dataset`.
    pub fn builder(dataset: I) -> IterableLoaderBuilder<I> {
        IterableLoaderBuilder {
            dataset: Arc::new(dataset),
            batch_size: 1,
            drop_last: false,
            num_workers: 0,
            prefetch_factor: 2,
        }
    }

    /// Sets the epoch the next [`IterableLoader::iter`] runs.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Runs one epoch and advances the epoch counter.
    pub fn iter(&mut self) -> Box<dyn Iterator<Item = Result<BatchOf<I>>> + '_> {
        let epoch = self.epoch;
        self.epoch += 1;
        let (bs, drop_last) = (self.batch_size, self.drop_last);
        if self.num_workers == 0 {
            let it = self.dataset.iter(epoch, WorkerInfo::SINGLE);
            return Box::new(Batcher::new(it, bs, drop_last, 0));
        }
        let workers = (0..self.num_workers)
            .map(|id| {
                let (tx, rx) = sync_channel(self.prefetch_factor);
                let ds = self.dataset.clone();
                let info = WorkerInfo {
                    id,
                    num_workers: self.num_workers,
                };
                let handle = std::thread::spawn(move || {
                    let it = ds.iter(epoch, info);
                    for batch in Batcher::new(it, bs, drop_last, id) {
                        if tx.send(batch).is_err() {
                            break;
                        }
                    }
                });
                (Some(rx), handle)
            })
            .collect();
        Box::new(RoundRobin {
            workers,
            next: 0,
            done: false,
        })
    }
}

/// Groups a stream into collated batches; stops after the first error.
struct Batcher<'a, T> {
    it: crate::SampleIter<'a, T>,
    batch_size: usize,
    drop_last: bool,
    worker: usize,
    count: usize,
    done: bool,
}

impl<'a, T: Collate> Batcher<'a, T> {
    fn new(it: crate::SampleIter<'a, T>, batch_size: usize, drop_last: bool, worker: usize) -> Self {
        Batcher {
            it,
            batch_size,
            drop_last,
            worker,
            count: 0,
            done: false,
        }
    }

    fn next_batch(&mut self) -> Option<Result<T::Batch>> {
        let mut items = Vec::with_capacity(self.batch_size);
        while items.len() < self.batch_size {
            match self.it.next() {
                Some(Ok(x)) => items.push(x),
                Some(Err(e)) => return Some(Err(e)),
                None => break,
            }
        }
        if items.is_empty() || (self.drop_last && items.len() < self.batch_size) {
            return None;
        }
        Some(T::collate(items))
    }
}

impl<T: Collate> Iterator for Batcher<'_, T> {
    type Item = Result<T::Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = catch_unwind(AssertUnwindSafe(|| self.next_batch())).unwrap_or_else(|p| {
            Some(Err(Error::Panic {
                batch: self.count,
                msg: format!("worker {}: {}", self.worker, panic_message(p.as_ref())),
            }))
        });
        self.count += 1;
        match &r {
            Some(Ok(_)) => {}
            _ => self.done = true,
        }
        r
    }
}

/// A worker's batch channel (`None` once it is exhausted) and its thread.
type WorkerSlot<B> = (Option<Receiver<Result<B>>>, JoinHandle<()>);

/// Takes one batch from each live worker in turn.
struct RoundRobin<B> {
    workers: Vec<WorkerSlot<B>>,
    next: usize,
    done: bool,
}

impl<B> Iterator for RoundRobin<B> {
    type Item = Result<B>;

    fn next(&mut self) -> Option<Result<B>> {
        let n = self.workers.len();
        for _ in 0..n {
            if self.done {
                return None;
            }
            let k = self.next;
            self.next = (self.next + 1) % n;
            let Some(rx) = &self.workers[k].0 else { continue };
            match rx.recv() {
                Ok(r) => {
                    if r.is_err() {
                        self.done = true;
                    }
                    return Some(r);
                }
                Err(_) => self.workers[k].0 = None,
            }
        }
        None
    }
}

impl<B> Drop for RoundRobin<B> {
    fn drop(&mut self) {
        for (rx, _) in &mut self.workers {
            *rx = None;
        }
        for (_, h) in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Stream, VecDataset};

    fn collect(workers: usize, drop_last: bool) -> Vec<Vec<i64>> {
        let ds = Stream(VecDataset::new((0..10i64).collect()));
        let mut l = IterableLoader::builder(ds)
            .batch_size(2)
            .drop_last(drop_last)
            .num_workers(workers)
            .build()
            .unwrap();
        let got: Vec<Vec<i64>> = l.iter().map(|b| b.unwrap().to_vec::<i64>().unwrap()).collect();
        got
    }

    #[test]
    fn round_robin_over_worker_splits() {
        assert_eq!(
            collect(0, false),
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7], vec![8, 9]]
        );
        // worker 0 reads 0,3,6,9; worker 1 reads 1,4,7; worker 2 reads 2,5,8.
        assert_eq!(
            collect(3, false),
            vec![vec![0, 3], vec![1, 4], vec![2, 5], vec![6, 9], vec![7], vec![8]]
        );
        assert_eq!(
            collect(3, true),
            vec![vec![0, 3], vec![1, 4], vec![2, 5], vec![6, 9]]
        );
    }

    #[test]
    fn worker_panic_is_an_error() {
        let ds = Stream(VecDataset::new((0..10i64).collect())).map(|x| {
            if x == 5 {
                panic!("bad sample {x}");
            }
            Ok(x)
        });
        let mut l = IterableLoader::builder(ds)
            .batch_size(2)
            .num_workers(2)
            .build()
            .unwrap();
        let got: Vec<_> = l.iter().collect();
        let err = got.iter().find_map(|r| r.as_ref().err()).expect("an error");
        assert!(err.to_string().contains("bad sample 5"), "{err}");
        assert!(got.last().unwrap().is_err());
    }
}
