//! The reducer: gradient hooks copy each parameter's final gradient into
//! its bucket, and a bucket whose last gradient arrived is handed, strictly
//! in bucket order, to the communication thread that all-reduces it while
//! backward goes on (PyTorch's `reducer.cpp`, spec §2.2).

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tessera_autograd::{Gradients, Parameter};

use tessera_tensor::{with_float_dtype, DType, FloatElement, FloatMath, Tensor};

use super::bucket::BucketSpec;
use super::DdpStepStats;
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

/// What a bucket's reduction leaves where.
#[derive(Debug, Clone)]
pub(crate) enum ReduceKind {
    /// DDP: every rank gets the sum of the whole bucket.
    AllReduce,
    /// ZeRO: bucket b covers the elements from `ranges[b].0` on of a flat
    /// buffer split into partitions of `ranges[b].1` elements, rank r
    /// owning partition r. Each owner gets the sum of its part of the
    /// bucket (a reduce to it); the rest of the bucket is left unspecified.
    ToOwners { ranges: Vec<(usize, usize)> },
}

/// Reduces (sums) `job`'s buffer in place over `comm` as `kind` says.
fn reduce_job(comm: &dyn Communicator, kind: &ReduceKind, mut job: Job) -> Done {
    let t0 = Instant::now();
    let r = reduce_flat(comm, kind, job.bucket, &mut job.flat).map(|()| job.flat);
    (job.bucket, r, t0.elapsed())
}

fn reduce_flat(comm: &dyn Communicator, kind: &ReduceKind, bucket: usize, flat: &mut Tensor) -> Result<()> {
    let dtype = flat.dtype();
    with_float_dtype!(dtype, T => {
        let buf = flat.make_mut::<T>()?;
        match kind {
            ReduceKind::AllReduce => comm.all_reduce_slice(buf, ReduceOp::Sum),
            ReduceKind::ToOwners { ranges } => {
                let (start, part) = ranges[bucket];
                for (owner, lo, hi) in owned_ranges(start, buf.len(), part) {
                    comm.reduce_slice(&mut buf[lo..hi], ReduceOp::Sum, owner)?;
                }
                Ok(())
            }
        }
    }, else Err(not_float(dtype)))
}

/// The pieces of the range `start .. start + len` of a buffer split into
/// partitions of `part` elements: (owner, local start, local end).
pub(crate) fn owned_ranges(start: usize, len: usize, part: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut at = start;
    while at < start + len && part > 0 {
        let owner = at / part;
        let end = ((owner + 1) * part).min(start + len);
        out.push((owner, at - start, end - start));
        at = end;
    }
    out
}

/// A reducer that all-reduces the gradients of the trainable `params`
/// (named, in definition order) over a group of `world` ranks, in buckets
/// planned by [`super::assign_buckets_by_module`] with the limits
/// `first_bytes` and `cap_bytes` (a module is what precedes the last `.` of
/// a parameter's name), with its hooks registered. Frozen parameters are left out.
/// Errors when a parameter is not a floating-point CPU tensor (naming it,
/// for `op`).
pub(crate) fn all_reduce_reducer(
    op: &'static str,
    world: usize,
    params: &[(String, Parameter)],
    first_bytes: usize,
    cap_bytes: usize,
) -> Result<Arc<Mutex<Reducer>>> {
    let params: Vec<&(String, Parameter)> = params.iter().filter(|(_, p)| p.requires_grad()).collect();
    for (name, p) in &params {
        let t = p.tensor()?;
        if !t.dtype().is_float() || t.device() != tessera_tensor::Device::Cpu {
            return Err(CommError::arg(
                op,
                format!(
                    "parameter `{name}` is {} on {}; data parallelism reduces floating-point CPU gradients",
                    t.dtype(),
                    t.device()
                ),
            ));
        }
    }
    let layout: Vec<_> = params.iter().map(|(_, p)| (p.dtype(), p.numel())).collect();
    let modules: Vec<&str> = params
        .iter()
        .map(|(n, _)| n.rsplit_once('.').map_or("", |(m, _)| m))
        .collect();
    let specs = super::assign_buckets_by_module(&layout, &modules, first_bytes, cap_bytes);
    let numels: Vec<usize> = layout.iter().map(|&(_, n)| n).collect();
    let mut red = Reducer::new(
        world,
        params.iter().map(|(n, _)| n.clone()).collect(),
        &numels,
        specs,
        ReduceKind::AllReduce,
    );
    red.set_modules(modules.iter().map(|m| m.to_string()).collect());
    let reducer = Arc::new(Mutex::new(red));
    register_hooks(&reducer, params.iter().map(|(_, p)| p))?;
    Ok(reducer)
}

/// Registers, on every parameter, the hook that hands its final gradient
/// to `reducer` (as parameter `i` of the list). The hooks hold a weak
/// handle: a leaf keeps its hooks, and they do nothing once the reducer is
/// gone. Errors when a parameter is frozen.
pub(crate) fn register_hooks<'a>(
    reducer: &Arc<Mutex<Reducer>>,
    params: impl Iterator<Item = &'a Parameter>,
) -> Result<()> {
    for (i, p) in params.enumerate() {
        let weak: Weak<Mutex<Reducer>> = Arc::downgrade(reducer);
        p.var()?.register_hook(move |g| {
            if let Some(r) = weak.upgrade() {
                lock(&r).on_grad(i, g);
            }
        })?;
    }
    Ok(())
}

/// Locks the reducer. A panic in a hook cannot leave counts that later
/// calls rely on (`begin` resets them), so a poisoned lock is still usable.
pub(crate) fn lock(r: &Mutex<Reducer>) -> MutexGuard<'_, Reducer> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs a backward pass that only accumulates into the buckets (`no_sync`):
/// returns its local gradients.
pub(crate) fn local_backward(
    reducer: &Mutex<Reducer>,
    find_unused: bool,
    run: impl FnOnce() -> tessera_tensor::Result<Gradients>,
) -> Result<Gradients> {
    lock(reducer).begin(None, false);
    let grads = run();
    let ended = lock(reducer).end(grads.is_ok(), find_unused);
    let grads = grads?;
    ended?;
    Ok(grads)
}

/// Runs a backward pass whose buckets are reduced on a communication thread
/// (from the hooks when `overlap`, else once backward returned), waits for
/// every reduction, and returns the pass's gradients (untouched: the
/// reduced values are in the buckets) with what it measured. Errors when
/// backward fails, a parameter got no gradient (unless `find_unused`), or a
/// reduction fails.
pub(crate) fn synced_backward(
    reducer: &Mutex<Reducer>,
    comm: &dyn Communicator,
    overlap: bool,
    find_unused: bool,
    run: impl FnOnce() -> tessera_tensor::Result<Gradients>,
) -> Result<(Gradients, DdpStepStats)> {
    let kind = lock(reducer).kind.clone();
    std::thread::scope(|scope| {
        let (job_tx, job_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<Done>();
        let kind = &kind;
        let worker = std::thread::Builder::new()
            .name("tessera-reducer".into())
            .spawn_scoped(scope, move || {
                for job in job_rx {
                    if done_tx.send(reduce_job(comm, kind, job)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| CommError::io("DistributedDataParallel::backward", e))?;
        let t0 = Instant::now();
        lock(reducer).begin(Some(job_tx), overlap);
        let grads = run();
        let backward = t0.elapsed();
        let launched = lock(reducer).end(grads.is_ok(), find_unused);
        let t1 = Instant::now();
        let mut failure = None;
        let mut stats = DdpStepStats {
            backward,
            ..Default::default()
        };
        for (b, reduced, took) in done_rx {
            stats.communication += took;
            match reduced {
                Ok(flat) => {
                    stats.buckets += 1;
                    stats.bytes_reduced += flat.numel() * flat.dtype().size_in_bytes();
                    lock(reducer).restore(b, flat);
                }
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        stats.exposed = t1.elapsed();
        stats.launched_during_backward = lock(reducer).launched_by_hooks();
        if worker.join().is_err() {
            failure.get_or_insert(CommError::arg(
                "DistributedDataParallel::backward",
                "the communication thread panicked",
            ));
        }
        let grads = grads?;
        launched?;
        if let Some(e) = failure {
            return Err(e);
        }
        Ok((grads, stats))
    })
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
    kind: ReduceKind,
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
    /// The parameters in the order their gradients arrived in this
    /// backward (for [`Reducer::rebuild`]).
    arrived: Vec<usize>,
    /// Each parameter's module name (bucket boundaries fall between
    /// modules).
    modules: Vec<String>,
}

impl Reducer {
    pub fn new(
        world: usize,
        names: Vec<String>,
        numels: &[usize],
        buckets: Vec<BucketSpec>,
        kind: ReduceKind,
    ) -> Reducer {
        let mut slots = vec![(0, 0, 0); names.len()];
        for (b, spec) in buckets.iter().enumerate() {
            for (&p, &off) in spec.params.iter().zip(&spec.offsets) {
                slots[p] = (b, off, numels[p]);
            }
        }
        let n = names.len();
        Reducer {
            world,
            kind,
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
            arrived: Vec::with_capacity(n),
            modules: vec![String::new(); n],
        }
    }

    /// Names each parameter's module, so that [`Reducer::rebuild`] keeps
    /// modules whole.
    pub fn set_modules(&mut self, modules: Vec<String>) {
        self.modules = modules;
    }

    /// The order in which the parameters got their gradients in the last
    /// backward, those that got none last (in reverse definition order).
    pub fn observed_order(&self) -> Vec<usize> {
        let mut order = self.arrived.clone();
        let mut seen = vec![false; self.slots.len()];
        order.iter().for_each(|&i| seen[i] = true);
        order.extend((0..self.slots.len()).rev().filter(|&i| !seen[i]));
        order
    }

    /// Re-plans the buckets in the gradient-ready order `order` (a
    /// permutation of the parameters), packed as [`super::assign_buckets_by_module`]
    /// packs the reverse definition order, so bucket 0 holds the first
    /// gradients to arrive (PyTorch's `_rebuild_buckets`). Returns whether
    /// the plan changed. Must not run while `no_sync` accumulation is held
    /// (the slots move); errors then, and when `order` is not a permutation.
    pub fn rebuild(&mut self, order: &[usize], first_bytes: usize, cap_bytes: usize) -> Result<bool> {
        let n = self.slots.len();
        let mut seen = vec![false; n];
        if order.len() != n
            || order
                .iter()
                .any(|&i| i >= n || std::mem::replace(&mut seen[i], true))
        {
            return Err(CommError::arg(
                "DistributedDataParallel::backward",
                format!("the rebuilt bucket order {order:?} is not a permutation of {n} parameters"),
            ));
        }
        if self.holds.iter().any(|&h| h) {
            return Err(CommError::arg(
                "DistributedDataParallel::backward",
                "cannot rebuild the buckets while no_sync gradients are held",
            ));
        }
        // Packing the reversed order and reversing the buckets puts the
        // first-ready parameters in bucket 0.
        let perm: Vec<usize> = order.iter().rev().copied().collect();
        let layout: Vec<_> = perm
            .iter()
            .map(|&i| (self.buckets[self.slots[i].0].spec.dtype, self.slots[i].2))
            .collect();
        let modules: Vec<&str> = perm.iter().map(|&i| self.modules[i].as_str()).collect();
        let mut specs = super::assign_buckets_by_module(&layout, &modules, first_bytes, cap_bytes);
        for spec in &mut specs {
            spec.params.iter_mut().for_each(|j| *j = perm[*j]);
        }
        if specs.iter().eq(self.specs()) {
            return Ok(false);
        }
        for (b, spec) in specs.iter().enumerate() {
            for (&p, &off) in spec.params.iter().zip(&spec.offsets) {
                self.slots[p] = (b, off, self.slots[p].2);
            }
        }
        self.buckets = specs
            .into_iter()
            .map(|spec| Bucket {
                spec,
                flat: None,
                pending: 0,
            })
            .collect();
        Ok(true)
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
        self.arrived.clear();
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
        self.arrived.push(i);
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
        // After a failed backward nothing more is launched: the buckets
        // already in flight are the ones every rank could have started.
        if out.is_ok() && self.sync && backward_ok {
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

    /// Forgets what backward passes under `no_sync` accumulated (a batch
    /// that failed half-way must not leak into the next).
    pub fn discard_accumulated(&mut self) {
        self.holds.iter_mut().for_each(|h| *h = false);
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

    /// The buffer of bucket `b`, if it holds one.
    pub fn flat(&self, b: usize) -> Option<&Tensor> {
        self.buckets[b].flat.as_ref()
    }

    /// Frees every bucket buffer (they are made again, zeroed, when the
    /// next gradient arrives).
    pub fn release(&mut self) {
        for b in &mut self.buckets {
            b.flat = None;
        }
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
