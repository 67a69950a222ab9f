//! The reducer: gradient hooks copy each parameter's final gradient into
//! its bucket, and a bucket whose last gradient arrived is handed, strictly
//! in bucket order, to the communication thread that all-reduces it while
//! backward goes on (PyTorch's `reducer.cpp`, spec §2.2).

use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use tessera_tensor::{with_float_dtype, DType, FloatElement, FloatMath, Tensor};

use super::bucket::BucketSpec;
use crate::comm::{CommExt, Communicator};
use crate::element::ReduceOp;
use crate::error::{CommError, Result};

/// A bucket handed to the communication thread.
pub(crate) struct Job {
    pub bucket: usize,
    pub flat: Tensor,
}

/// What the communication thread hands back for one bucket: the reduced
/// buffer, and the time the all-reduce took.
pub(crate) type Done = (usize, Result<Tensor>, Duration);

/// All-reduces (sums) `job`'s buffer in place over `comm`.
pub(crate) fn reduce_job(comm: &dyn Communicator, mut job: Job) -> Done {
    let t0 = Instant::now();
    let r = all_reduce_flat(comm, &mut job.flat).map(|()| job.flat);
    (job.bucket, r, t0.elapsed())
}

fn all_reduce_flat(comm: &dyn Communicator, flat: &mut Tensor) -> Result<()> {
    let dtype = flat.dtype();
    with_float_dtype!(dtype, T => comm.all_reduce_slice(flat.make_mut::<T>()?, ReduceOp::Sum), else Err(not_float(dtype)))
}

fn not_float(dtype: DType) -> CommError {
    CommError::arg(
        "DistributedDataParallel",
        format!("gradients must be floating point, got {dtype}"),
    )
}

struct Bucket {
    spec: BucketSpec,
    /// The flat gradient buffer; `None` while the communication thread has
    /// it (or after a failed all-reduce lost it: it is made again).
    flat: Option<Tensor>,
    pending: usize,
}

/// The state the gradient hooks and [`super::DistributedDataParallel`]
/// share.
pub(crate) struct Reducer {
    world: usize,
    names: Vec<String>,
    /// Per parameter: (bucket, element offset, element count).
    slots: Vec<(usize, usize, usize)>,
    buckets: Vec<Bucket>,
    /// A backward run through DDP is under way (hooks of other backward
    /// passes, which DDP did not start, do nothing).
    active: bool,
    /// This backward all-reduces (outside `no_sync`).
    sync: bool,
    /// Launch buckets from the hooks (else all at once after backward).
    overlap: bool,
    /// Per parameter: its gradient arrived in this backward.
    ready: Vec<bool>,
    /// Per parameter: its slot holds gradients accumulated under `no_sync`.
    holds: Vec<bool>,
    next: usize,
    launch: Option<Sender<Job>>,
    failure: Option<CommError>,
    /// Buckets launched from hooks in this backward (overlapped).
    launched_by_hooks: usize,
}

impl Reducer {
    pub fn new(world: usize, names: Vec<String>, numels: &[usize], buckets: Vec<BucketSpec>) -> Reducer {
        let mut slots = vec![(0, 0, 0); names.len()];
        for (b, spec) in buckets.iter().enumerate() {
            for (&p, &off) in spec.params.iter().zip(&spec.offsets) {
                slots[p] = (b, off, numels[p]);
            }
        }
        let n = names.len();
        Reducer {
            world,
            names,
            slots,
            buckets: buckets
                .into_iter()
                .map(|spec| Bucket {
                    spec,
                    flat: None,
                    pending: 0,
                })
                .collect(),
            active: false,
            sync: true,
            overlap: true,
            ready: vec![false; n],
            holds: vec![false; n],
            next: 0,
            launch: None,
            failure: None,
            launched_by_hooks: 0,
        }
    }

    /// The buckets, in launch order.
    pub fn specs(&self) -> impl Iterator<Item = &BucketSpec> {
        self.buckets.iter().map(|b| &b.spec)
    }

    /// Starts a backward pass: `launch` is where ready buckets go when the
    /// pass all-reduces (`None` under `no_sync`).
    pub fn begin(&mut self, launch: Option<Sender<Job>>, overlap: bool) {
        self.active = true;
        self.sync = launch.is_some();
        self.overlap = overlap;
        self.launch = launch;
        self.next = 0;
        self.failure = None;
        self.launched_by_hooks = 0;
        self.ready.iter_mut().for_each(|r| *r = false);
        for b in &mut self.buckets {
            b.pending = b.spec.params.len();
        }
    }

    /// The hook of parameter `i`: its gradient `g` is final.
    pub fn on_grad(&mut self, i: usize, g: &Tensor) {
        if !self.active || self.failure.is_some() {
            return;
        }
        if std::mem::replace(&mut self.ready[i], true) {
            self.failure = Some(CommError::arg(
                "DistributedDataParallel::backward",
                format!(
                    "parameter `{}` received a gradient twice in one backward pass (run one backward per DDP backward call)",
                    self.names[i]
                ),
            ));
            return;
        }
        if let Err(e) = self.write(i, Some(g)) {
            self.failure = Some(e);
            return;
        }
        let b = self.slots[i].0;
        self.buckets[b].pending -= 1;
        if self.buckets[b].pending == 0 && self.sync && self.overlap {
            let before = self.next;
            self.launch_ready();
            self.launched_by_hooks += self.next - before;
        }
    }

    /// Ends a backward pass. A parameter that got no gradient is an error
    /// naming it, unless `find_unused` (then it counts as ready with
    /// whatever it accumulated under `no_sync`, or zero). When the pass
    /// all-reduces, launches every bucket not launched yet and closes the
    /// launch channel. Returns the number of buckets launched in all.
    pub fn end(&mut self, backward_ok: bool, find_unused: bool) -> Result<usize> {
        self.active = false;
        let launch = self.launch.take();
        let out = self.finish_marking(backward_ok, find_unused);
        if out.is_ok() && self.sync {
            self.launch = launch;
            self.launch_ready();
            self.launch = None;
        }
        out.map(|()| if self.sync { self.next } else { 0 })
    }

    fn finish_marking(&mut self, backward_ok: bool, find_unused: bool) -> Result<()> {
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        if !backward_ok {
            return Ok(());
        }
        let unused: Vec<usize> = (0..self.ready.len()).filter(|&i| !self.ready[i]).collect();
        if !unused.is_empty() && !find_unused {
            let names: Vec<&str> = unused.iter().map(|&i| self.names[i].as_str()).collect();
            return Err(CommError::arg(
                "DistributedDataParallel::backward",
                format!(
                    "parameters received no gradient in this backward pass: {}; every parameter must take part in the loss, or construct DDP with find_unused_parameters = true",
                    names.join(", ")
                ),
            ));
        }
        for i in unused {
            self.write(i, None)?;
            self.ready[i] = true;
            let b = self.slots[i].0;
            self.buckets[b].pending -= 1;
        }
        if !self.sync {
            for (i, h) in self.holds.iter_mut().enumerate() {
                *h = *h || self.ready[i];
            }
        }
        Ok(())
    }

    /// Launches, in bucket order, every bucket from `next` on whose
    /// gradients are all in.
    fn launch_ready(&mut self) {
        let Some(tx) = &self.launch else { return };
        while self.next < self.buckets.len() && self.buckets[self.next].pending == 0 {
            let b = self.next;
            if let Some(flat) = self.buckets[b].flat.take() {
                // The receiver lives until every job is answered; a send
                // can only fail after it panicked, which `join` reports.
                let _ = tx.send(Job { bucket: b, flat });
            }
            self.next += 1;
        }
    }

    /// Writes parameter `i`'s contribution into its slot: `g` added to what
    /// `no_sync` accumulated there (or zero for an unused parameter), and,
    /// when the pass all-reduces, divided by the world size (PyTorch's
    /// pre-division, spec §2.2).
    fn write(&mut self, i: usize, g: Option<&Tensor>) -> Result<()> {
        let (b, off, n) = self.slots[i];
        let bucket = &mut self.buckets[b];
        let dtype = bucket.spec.dtype;
        let flat = match &mut bucket.flat {
            Some(f) => f,
            slot @ None => slot.insert(Tensor::zeros(&[bucket.spec.numel], dtype)?),
        };
        let keep = self.holds[i];
        let div = self.sync.then_some(self.world);
        if self.sync {
            self.holds[i] = false;
        }
        let g = g.map(Tensor::contiguous).transpose()?;
        with_float_dtype!(dtype, T => {
            let src = match &g {
                Some(g) => Some(&g.storage().try_as_slice::<T>()?[g.layout().offset()..][..n]),
                None => None,
            };
            write_slot::<T>(&mut flat.make_mut::<T>()?[off..off + n], src, keep, div);
            Ok(())
        }, else Err(not_float(dtype)))
    }

    /// The number of buckets the hooks of the last backward launched
    /// (while backward was still running).
    pub fn launched_by_hooks(&self) -> usize {
        self.launched_by_hooks
    }

    /// Takes back the buffer of bucket `b` after its all-reduce.
    pub fn restore(&mut self, b: usize, flat: Tensor) {
        self.buckets[b].flat = Some(flat);
    }

    /// Parameter `i`'s reduced gradient: a view into its bucket (no copy),
    /// of `shape`.
    pub fn grad_view(&self, i: usize, shape: &[usize]) -> Result<Option<Tensor>> {
        let (b, off, n) = self.slots[i];
        match &self.buckets[b].flat {
            Some(flat) => Ok(Some(flat.narrow(0, off, n)?.view(shape)?)),
            None => Ok(None),
        }
    }
}

/// `dst = (keep ? dst : 0) + src`, then divided by `div` if given, in the
/// element type's math precision.
fn write_slot<T: FloatElement>(dst: &mut [T], src: Option<&[T]>, keep: bool, div: Option<usize>) {
    let d = div.map(|n| T::Math::of(n as f64));
    for (k, x) in dst.iter_mut().enumerate() {
        let acc = if keep { Some(x.to_math()) } else { None };
        let g = src.map(|s| s[k].to_math());
        let mut v = match (acc, g) {
            (Some(a), Some(g)) => a + g,
            (Some(a), None) => a,
            (None, Some(g)) => g,
            (None, None) => T::Math::of(0.0),
        };
        if let Some(d) = d {
            v = v / d;
        }
        *x = T::from_math(v);
    }
}
