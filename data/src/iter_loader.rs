//! [`IterableLoader`]: batches from an [`IterableDataset`], with worker
//! threads that each read their own split and a round-robin merge.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::loader::{join_within, panic_message, DROP_GRACE};
use crate::{Collate, Error, IterableDataset, Result, WorkerInfo};

type BatchOf<I> = <<I as IterableDataset>::Item as Collate>::Batch;

/// Loads batches from a stream. As in PyTorch, each worker batches its own
/// split (so `drop_last` applies per worker) and the loader yields batch `k`
/// of worker `k mod W` in turn, skipping workers that have finished; the
/// order is therefore fixed for a given worker count. An error or panic in
/// a worker (opening its stream included) is yielded as `Err`, and so is a
/// batch that does not arrive within the timeout; the epoch then ends.
/// Dropping an epoch waits for stuck workers as [`crate::DataLoader`] does.
pub struct IterableLoader<I: IterableDataset>
where
    I::Item: Collate,
{
    dataset: Arc<I>,
    batch_size: usize,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    timeout: Option<Duration>,
    epoch: u64,
}

/// Options of an [`IterableLoader`].
pub struct IterableLoaderBuilder<I> {
    dataset: Arc<I>,
    batch_size: usize,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    timeout: Option<Duration>,
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
    /// How long to wait for a worker's next batch before the epoch yields
    /// [`Error::Timeout`] (default, and `Duration::ZERO`: forever; unused
    /// without workers).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = (!timeout.is_zero()).then_some(timeout);
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
            timeout: self.timeout,
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
            timeout: None,
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
            return Box::new(Batcher::open(
                &*self.dataset,
                epoch,
                WorkerInfo::SINGLE,
                bs,
                drop_last,
            ));
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
                    for batch in Batcher::open(&*ds, epoch, info, bs, drop_last) {
                        if tx.send(batch).is_err() {
                            break;
                        }
                    }
                });
                (Some(rx), Some(handle))
            })
            .collect();
        Box::new(RoundRobin {
            workers,
            next: 0,
            count: 0,
            timeout: self.timeout,
            done: false,
        })
    }
}

/// Groups a stream into collated batches; stops after the first error.
struct Batcher<'a, T> {
    /// The worker's stream, or the panic that opening it raised (yielded
    /// as the first and only item).
    it: std::result::Result<crate::SampleIter<'a, T>, Option<Error>>,
    batch_size: usize,
    drop_last: bool,
    worker: usize,
    count: usize,
    done: bool,
}

impl<'a, T: Collate> Batcher<'a, T> {
    /// Opens worker `info`'s stream of `dataset`. A panic in
    /// [`IterableDataset::iter`] becomes the stream's error, so the
    /// worker's share cannot vanish from the epoch as if it were empty.
    fn open<I>(dataset: &'a I, epoch: u64, info: WorkerInfo, batch_size: usize, drop_last: bool) -> Self
    where
        I: IterableDataset<Item = T>,
    {
        let it = catch_unwind(AssertUnwindSafe(|| dataset.iter(epoch, info))).map_err(|p| {
            Some(Error::Panic {
                batch: 0,
                msg: format!(
                    "worker {}: opening its stream: {}",
                    info.id,
                    panic_message(p.as_ref())
                ),
            })
        });
        Batcher {
            it,
            batch_size,
            drop_last,
            worker: info.id,
            count: 0,
            done: false,
        }
    }

    fn next_batch(&mut self) -> Option<Result<T::Batch>> {
        let it = match &mut self.it {
            Ok(it) => it,
            Err(e) => return e.take().map(Err),
        };
        let mut items = Vec::with_capacity(self.batch_size);
        while items.len() < self.batch_size {
            match it.next() {
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

/// A worker's batch channel (`None` once it is exhausted) and its thread
/// (`None` once joined).
type WorkerSlot<B> = (Option<Receiver<Result<B>>>, Option<JoinHandle<()>>);

/// Takes one batch from each live worker in turn.
struct RoundRobin<B> {
    workers: Vec<WorkerSlot<B>>,
    next: usize,
    /// Batches yielded so far.
    count: usize,
    timeout: Option<Duration>,
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
            let received = match self.timeout {
                Some(t) => rx.recv_timeout(t),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(r) => {
                    if r.is_err() {
                        self.done = true;
                    }
                    self.count += 1;
                    return Some(r);
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.done = true;
                    return Some(Err(Error::Timeout {
                        batch: self.count,
                        secs: self.timeout.map_or(0.0, |t| t.as_secs_f64()),
                    }));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // The worker closed its channel: exhausted, unless its
                    // thread died, which must not pass for an empty share.
                    self.workers[k].0 = None;
                    if let Some(Err(p)) = self.workers[k].1.take().map(JoinHandle::join) {
                        self.done = true;
                        return Some(Err(Error::Worker(format!(
                            "worker {k} died: {}",
                            panic_message(p.as_ref())
                        ))));
                    }
                }
            }
        }
        None
    }
}

impl<B> Drop for RoundRobin<B> {
    fn drop(&mut self) {
        // Closing the channels stops every worker at its next send.
        let handles = self.workers.drain(..).filter_map(|(_, h)| h).collect();
        join_within(handles, self.timeout.unwrap_or(DROP_GRACE));
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

    /// A stream whose `iter` itself panics for the last worker (the
    /// calling thread when there are no workers), as a shard that cannot
    /// be opened would.
    struct PanicsOnOpen;

    impl IterableDataset for PanicsOnOpen {
        type Item = i64;
        fn iter(&self, _epoch: u64, w: WorkerInfo) -> crate::SampleIter<'_, i64> {
            if w.id + 1 == w.num_workers {
                panic!("cannot open the shards of worker {}", w.id);
            }
            Box::new((0..4).map(Ok))
        }
    }

    #[test]
    fn panic_opening_a_worker_stream_is_an_error() {
        for workers in [0, 1, 2, 3] {
            let mut l = IterableLoader::builder(PanicsOnOpen)
                .batch_size(2)
                .num_workers(workers)
                .build()
                .unwrap();
            let got: Vec<_> = l.iter().collect();
            let err = got
                .iter()
                .find_map(|r| r.as_ref().err())
                .unwrap_or_else(|| panic!("{workers} workers: the panic vanished, {} batches", got.len()));
            let last = workers.max(1) - 1;
            assert!(
                err.to_string()
                    .contains(&format!("cannot open the shards of worker {last}")),
                "{workers} workers: {err}"
            );
            assert!(
                got.last().unwrap().is_err(),
                "{workers} workers: the epoch ends at the error"
            );
        }
    }

    /// Worker 1's stream stalls for a long time before its first sample.
    struct Stalls;

    impl IterableDataset for Stalls {
        type Item = i64;
        fn iter(&self, _epoch: u64, w: WorkerInfo) -> crate::SampleIter<'_, i64> {
            Box::new((0..4).map(move |i| {
                if w.id == 1 {
                    std::thread::sleep(std::time::Duration::from_secs(30));
                }
                Ok(i)
            }))
        }
    }

    #[test]
    fn stalled_worker_times_out_and_drop_does_not_wait_for_it() {
        let t = std::time::Instant::now();
        let mut l = IterableLoader::builder(Stalls)
            .batch_size(2)
            .num_workers(2)
            .timeout(Duration::from_millis(100))
            .build()
            .unwrap();
        let got: Vec<_> = l.iter().collect();
        assert_eq!(got.len(), 2, "worker 0's first batch, then the timeout");
        let e = got[1].as_ref().unwrap_err().to_string();
        assert!(e.contains("timed out") && e.contains("batch 1"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}
