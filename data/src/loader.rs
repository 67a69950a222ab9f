//! [`DataLoader`]: batches from a map-style [`Dataset`] with PyTorch's
//! semantics — batch size, shuffle, drop_last, samplers, collate, worker
//! threads, bounded prefetch, persistent workers, in-order delivery, a
//! timeout, and worker failures (errors, panics, stuck reads) surfacing as
//! `Err`.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Collate, Dataset, Error, RandomSampler, Result, Sampler, SequentialSampler};

type BatchOf<D> = <<D as Dataset>::Item as Collate>::Batch;

/// Loads batches from a dataset. Build one with [`DataLoader::builder`].
///
/// Each call to [`DataLoader::iter`] runs one epoch and then advances the
/// loader's epoch counter, so with `shuffle` every epoch has a new order;
/// the order of epoch `e` is a pure function of `(seed, e)`
/// ([`DataLoader::set_epoch`] picks the epoch, like PyTorch's
/// `sampler.set_epoch`). Random per-sample transforms
/// ([`Dataset::map_random`]) are keyed by `(seed, epoch, index)`, so the
/// batches are bit-identical for any `num_workers`.
///
/// With `num_workers > 0`, worker threads take whole batches from a shared
/// queue, load and collate them; at most `prefetch_factor · num_workers`
/// batches are in flight, and batches are yielded in sampler order whatever
/// the worker timing. An error or a panic while loading a batch is yielded as
/// `Err` in that batch's position, after which the epoch ends; so is a batch
/// that no worker delivers within the [`DataLoaderBuilder::timeout`].
///
/// Dropping an epoch or the loader never waits on a stuck worker for long:
/// workers get the timeout (or [`DROP_GRACE`] without one) to finish the
/// batch they are loading, and are then detached — they exit as soon as the
/// dataset call they are stuck in returns.
pub struct DataLoader<D: Dataset>
where
    D::Item: Collate,
{
    dataset: Arc<D>,
    sampler: Arc<dyn Sampler>,
    batch_size: usize,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    persistent_workers: bool,
    timeout: Option<Duration>,
    epoch: u64,
    pool: Option<Pool<BatchOf<D>>>,
}

/// How long dropping a loader or an epoch waits for busy workers to finish
/// their batch when the loader has no timeout; they are detached after it.
pub const DROP_GRACE: Duration = Duration::from_secs(1);

/// Options of a [`DataLoader`]; defaults follow PyTorch (batch size 1, no
/// shuffle, no workers, prefetch factor 2 with workers).
pub struct DataLoaderBuilder<D> {
    dataset: Arc<D>,
    batch_size: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    sampler: Option<Arc<dyn Sampler>>,
    num_workers: usize,
    prefetch_factor: Option<usize>,
    persistent_workers: bool,
    timeout: Option<Duration>,
}

impl<D> DataLoaderBuilder<D>
where
    D: Dataset + 'static,
    D::Item: Collate,
{
    /// Samples per batch (default 1).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }
    /// Visit the samples in a new random order each epoch (default false).
    pub fn shuffle(mut self, on: bool) -> Self {
        self.shuffle = on;
        self
    }
    /// The seed of the shuffle order (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Drop the last batch when it is smaller than the batch size (default false).
    pub fn drop_last(mut self, on: bool) -> Self {
        self.drop_last = on;
        self
    }
    /// Use `sampler` for the index order (exclusive with `shuffle`).
    pub fn sampler(mut self, sampler: impl Sampler + 'static) -> Self {
        self.sampler = Some(Arc::new(sampler));
        self
    }
    /// Worker threads (default 0: load in the calling thread).
    pub fn num_workers(mut self, n: usize) -> Self {
        self.num_workers = n;
        self
    }
    /// Batches in flight per worker (default 2; needs workers).
    pub fn prefetch_factor(mut self, n: usize) -> Self {
        self.prefetch_factor = Some(n);
        self
    }
    /// Keep the worker threads alive between epochs (default false; needs workers).
    pub fn persistent_workers(mut self, on: bool) -> Self {
        self.persistent_workers = on;
        self
    }
    /// How long to wait for the next batch from the workers before the
    /// epoch yields [`Error::Timeout`] (PyTorch's `timeout`; default, and
    /// `Duration::ZERO`: wait forever). Without workers it is unused, as in
    /// PyTorch: the calling thread cannot be interrupted. A timed-out
    /// persistent pool is replaced by fresh workers at the next epoch.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = (!timeout.is_zero()).then_some(timeout);
        self
    }

    /// The loader. Errors, as PyTorch does, when the batch size is 0, a
    /// sampler is combined with `shuffle`, or `prefetch_factor` /
    /// `persistent_workers` are set without workers, or the prefetch factor is 0.
    pub fn build(self) -> Result<DataLoader<D>> {
        const OP: &str = "DataLoader::build";
        if self.batch_size == 0 {
            return Err(Error::arg(OP, "batch_size must be positive"));
        }
        if self.num_workers == 0 && (self.prefetch_factor.is_some() || self.persistent_workers) {
            return Err(Error::arg(
                OP,
                "prefetch_factor and persistent_workers need num_workers > 0",
            ));
        }
        if self.prefetch_factor == Some(0) {
            return Err(Error::arg(OP, "prefetch_factor must be positive"));
        }
        let n = self.dataset.len();
        let sampler: Arc<dyn Sampler> = match (self.sampler, self.shuffle) {
            (Some(_), true) => return Err(Error::arg(OP, "sampler is mutually exclusive with shuffle")),
            (Some(s), false) => s,
            (None, true) => Arc::new(RandomSampler::new(n, self.seed)),
            (None, false) => Arc::new(SequentialSampler::new(n)),
        };
        Ok(DataLoader {
            dataset: self.dataset,
            sampler,
            batch_size: self.batch_size,
            drop_last: self.drop_last,
            num_workers: self.num_workers,
            prefetch_factor: self.prefetch_factor.unwrap_or(2),
            persistent_workers: self.persistent_workers,
            timeout: self.timeout,
            epoch: 0,
            pool: None,
        })
    }
}

impl<D> DataLoader<D>
where
    D: Dataset + 'static,
    D::Item: Collate,
{
    /// A builder over `dataset` with PyTorch's defaults.
    pub fn builder(dataset: D) -> DataLoaderBuilder<D> {
        Self::builder_shared(Arc::new(dataset))
    }

    /// A builder over a dataset shared with other owners.
    pub fn builder_shared(dataset: Arc<D>) -> DataLoaderBuilder<D> {
        DataLoaderBuilder {
            dataset,
            batch_size: 1,
            shuffle: false,
            seed: 0,
            drop_last: false,
            sampler: None,
            num_workers: 0,
            prefetch_factor: None,
            persistent_workers: false,
            timeout: None,
        }
    }

    /// Batches per epoch: `ceil(len/bs)`, or `floor(len/bs)` with drop_last,
    /// where `len` is the sampler's length.
    pub fn len(&self) -> usize {
        let n = self.sampler.len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// True when an epoch yields no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<D> {
        &self.dataset
    }

    /// The epoch the next [`DataLoader::iter`] runs.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Sets the epoch the next [`DataLoader::iter`] runs.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The index lists of the batches of `epoch`, in order.
    pub fn batch_indices(&self, epoch: u64) -> Vec<Vec<usize>> {
        let order = self.sampler.indices(epoch);
        let mut batches: Vec<Vec<usize>> = order.chunks(self.batch_size).map(<[usize]>::to_vec).collect();
        if self.drop_last && batches.last().is_some_and(|b| b.len() < self.batch_size) {
            batches.pop();
        }
        batches
    }

    /// Runs one epoch (the current one) and advances the epoch counter. The
    /// iterator yields `Ok(batch)` in order; on the first `Err` the epoch ends.
    pub fn iter(&mut self) -> EpochIter<'_, D> {
        let epoch = self.epoch;
        self.epoch += 1;
        let batches = self.batch_indices(epoch);
        let limit = self.prefetch_factor * self.num_workers;
        let grace = self.timeout.unwrap_or(DROP_GRACE);
        let pool = if self.num_workers == 0 {
            PoolSlot::None
        } else if self.persistent_workers {
            if self.pool.is_none() {
                self.pool = Some(Pool::spawn(self.dataset.clone(), self.num_workers, grace));
            }
            PoolSlot::Persistent
        } else {
            PoolSlot::Owned(Pool::spawn(self.dataset.clone(), self.num_workers, grace))
        };
        let generation = match &pool {
            PoolSlot::Owned(p) => p.begin(),
            PoolSlot::Persistent => self.pool.as_ref().map_or(0, Pool::begin),
            PoolSlot::None => 0,
        };
        EpochIter {
            loader: self,
            pool,
            batches,
            epoch,
            generation,
            limit,
            next_send: 0,
            next_yield: 0,
            pending: HashMap::new(),
            done: false,
        }
    }
}

/// One epoch of a [`DataLoader`]; see [`DataLoader::iter`].
pub struct EpochIter<'a, D: Dataset + 'static>
where
    D::Item: Collate,
{
    loader: &'a mut DataLoader<D>,
    pool: PoolSlot<BatchOf<D>>,
    batches: Vec<Vec<usize>>,
    epoch: u64,
    generation: u64,
    limit: usize,
    next_send: usize,
    next_yield: usize,
    pending: HashMap<usize, Result<BatchOf<D>>>,
    done: bool,
}

enum PoolSlot<B> {
    None,
    Owned(Pool<B>),
    Persistent,
}

impl<D> EpochIter<'_, D>
where
    D: Dataset + 'static,
    D::Item: Collate,
{
    fn pool(&self) -> Option<&Pool<BatchOf<D>>> {
        match &self.pool {
            PoolSlot::Owned(p) => Some(p),
            PoolSlot::Persistent => self.loader.pool.as_ref(),
            PoolSlot::None => None,
        }
    }

    /// Sends batches until `limit` are in flight or all are sent.
    fn fill(&mut self) {
        while self.next_send < self.batches.len() && self.next_send - self.next_yield < self.limit {
            let task = Task {
                generation: self.generation,
                batch: self.next_send,
                epoch: self.epoch,
                indices: std::mem::take(&mut self.batches[self.next_send]),
            };
            if let Some(p) = self.pool() {
                p.send(task);
            }
            self.next_send += 1;
        }
    }

    fn finish(&mut self) {
        self.done = true;
        if let Some(p) = self.pool() {
            p.cancel();
        }
    }
}

impl<D> Iterator for EpochIter<'_, D>
where
    D: Dataset + 'static,
    D::Item: Collate,
{
    type Item = Result<BatchOf<D>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.next_yield >= self.batches.len() {
            self.finish();
            return None;
        }
        let result = if self.pool().is_none() {
            let indices = std::mem::take(&mut self.batches[self.next_yield]);
            load_batch(&*self.loader.dataset, &indices, self.epoch, self.next_yield)
        } else {
            self.fill();
            loop {
                if let Some(r) = self.pending.remove(&self.next_yield) {
                    break r;
                }
                let timeout = self.loader.timeout;
                let received = self.pool().map(|p| match timeout {
                    Some(t) => p.results.recv_timeout(t),
                    None => p.results.recv().map_err(|_| RecvTimeoutError::Disconnected),
                });
                match received {
                    Some(Ok((g, batch, r))) if g == self.generation => {
                        self.pending.insert(batch, r);
                    }
                    Some(Ok(_)) => continue, // a stale batch of an abandoned epoch
                    Some(Err(RecvTimeoutError::Timeout)) => {
                        if let PoolSlot::Persistent = self.pool {
                            // A stuck worker would hold up every later epoch.
                            self.loader.pool = None;
                        }
                        break Err(Error::Timeout {
                            batch: self.next_yield,
                            secs: timeout.map_or(0.0, |t| t.as_secs_f64()),
                        });
                    }
                    _ => break Err(Error::Worker("every worker thread has exited".into())),
                }
            }
        };
        self.next_yield += 1;
        if result.is_err() {
            self.finish();
        } else if self.pool().is_some() {
            self.fill();
        }
        Some(result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = if self.done {
            0
        } else {
            self.batches.len() - self.next_yield
        };
        (left, Some(left))
    }
}

impl<D> Drop for EpochIter<'_, D>
where
    D: Dataset + 'static,
    D::Item: Collate,
{
    fn drop(&mut self) {
        self.finish();
    }
}

/// Loads and collates one batch, turning a panic into [`Error::Panic`].
fn load_batch<D>(dataset: &D, indices: &[usize], epoch: u64, batch: usize) -> Result<BatchOf<D>>
where
    D: Dataset,
    D::Item: Collate,
{
    let run = || {
        let items = indices
            .iter()
            .map(|&i| dataset.get_epoch(i, epoch))
            .collect::<Result<Vec<_>>>()?;
        D::Item::collate(items)
    };
    catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|payload| {
        Err(Error::Panic {
            batch,
            msg: panic_message(payload.as_ref()),
        })
    })
}

/// The text of a panic payload (`&str` or `String`), or a placeholder.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

struct Task {
    generation: u64,
    batch: usize,
    epoch: u64,
    indices: Vec<usize>,
}

type Delivery<B> = (u64, usize, Result<B>);

/// Worker threads sharing one task queue; results come back tagged with the
/// epoch generation and batch position.
struct Pool<B> {
    tasks: Option<Sender<Task>>,
    results: Receiver<Delivery<B>>,
    /// The generation whose tasks are still wanted; workers skip the others.
    live: Arc<AtomicU64>,
    handles: Vec<JoinHandle<()>>,
    /// How long dropping the pool waits for busy workers.
    grace: Duration,
}

impl<B: Send + 'static> Pool<B> {
    fn spawn<D>(dataset: Arc<D>, workers: usize, grace: Duration) -> Self
    where
        D: Dataset<Item: Collate<Batch = B>> + 'static,
    {
        let (task_tx, task_rx) = channel::<Task>();
        let (res_tx, res_rx) = channel::<Delivery<B>>();
        let task_rx = Arc::new(Mutex::new(task_rx));
        let live = Arc::new(AtomicU64::new(0));
        let handles = (0..workers)
            .map(|_| {
                let (ds, rx, tx, live) = (dataset.clone(), task_rx.clone(), res_tx.clone(), live.clone());
                std::thread::spawn(move || loop {
                    // A poisoned lock only means another worker panicked while
                    // holding it, which `recv` cannot do; keep going.
                    let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(task) = next else { break };
                    if task.generation != live.load(Ordering::Acquire) {
                        continue;
                    }
                    let r = load_batch(&*ds, &task.indices, task.epoch, task.batch);
                    if tx.send((task.generation, task.batch, r)).is_err() {
                        break;
                    }
                })
            })
            .collect();
        Pool {
            tasks: Some(task_tx),
            results: res_rx,
            live,
            handles,
            grace,
        }
    }

    /// Starts a new epoch generation and returns it.
    fn begin(&self) -> u64 {
        self.live.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Marks every queued task stale.
    fn cancel(&self) {
        self.live.fetch_add(1, Ordering::AcqRel);
    }

    fn send(&self, task: Task) {
        if let Some(tx) = &self.tasks {
            // A send fails only when every worker has exited; `next` then
            // reports it when the result channel disconnects.
            let _ = tx.send(task);
        }
    }
}

impl<B> Drop for Pool<B> {
    fn drop(&mut self) {
        self.live.fetch_add(1, Ordering::AcqRel);
        self.tasks = None;
        join_within(std::mem::take(&mut self.handles), self.grace);
    }
}

/// Joins the worker threads `handles`, waiting at most `grace` in all.
/// Threads still running then are stuck in user code; they are detached
/// and exit when that call returns and they find their channels closed.
pub(crate) fn join_within(handles: Vec<JoinHandle<()>>, grace: Duration) {
    // No deadline when `grace` reaches past the end of time.
    let deadline = Instant::now().checked_add(grace);
    for h in handles {
        while !h.is_finished() && deadline.map_or(true, |d| Instant::now() < d) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if h.is_finished() {
            let _ = h.join();
        }
    }
}
