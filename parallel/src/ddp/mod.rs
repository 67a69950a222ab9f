//! [`DistributedDataParallel`]: PyTorch's DDP over any [`Module`] and any
//! [`Communicator`] (spec §2).
//!
//! At construction every rank checks that the ranks hold the same parameter
//! shapes, and takes rank 0's parameters and buffers. Gradients are grouped
//! into buckets in reverse definition order ([`assign_buckets_by_module`]); during
//! [`DistributedDataParallel::backward`] a hook on each parameter copies its
//! final gradient into its bucket, pre-divided by the world size, and a
//! bucket whose last gradient arrived is all-reduced (summed) on a
//! communication thread while backward goes on. The gradients returned are
//! views into the reduced buckets. Buckets are launched strictly in bucket
//! order, so every rank issues the same collectives in the same order, and
//! the ring all-reduce's fixed fold order leaves every rank with bitwise the
//! same gradients, hence the same parameters after the optimizer step.
//!
//! Where tessera differs from PyTorch:
//! - Gradients are the value backward returns, not a `.grad` field: call
//!   [`DistributedDataParallel::backward`] (or `backward_with` for any
//!   backward form) instead of `loss.backward()`. Under `no_sync` the
//!   accumulation lives in DDP's buckets, and the synchronising backward
//!   returns the averaged sum of all micro-batches.
//! - The first step's buckets follow the reverse definition order (spec
//!   §2.1's decision: no single all-model bucket in step 1); after the
//!   first synchronising backward they are rebuilt once in the order the
//!   gradients arrived, rank 0's order broadcast to all (PyTorch's
//!   `_rebuild_buckets`; skipped with `find_unused_parameters`, as in
//!   PyTorch). Buckets close only between modules, never
//!   between a layer's weight and bias ([`assign_buckets_by_module`]):
//!   one fused backward node makes both gradients at once, so PyTorch's
//!   parameter-by-parameter packing can leave a small bias in a big
//!   bucket that then waits for the end of backward. A cap of 0 gives
//!   each module (not each parameter) its own bucket.
//! - With `find_unused_parameters`, parameters without a gradient are
//!   marked ready when backward returns (no graph walk before it), so the
//!   buckets holding them are reduced after backward rather than during it.
//! - Parameters must be CPU tensors (the `local` and `tcp` backends).
//!
//! ```
//! use tessera_autograd::Var;
//! use tessera_nn::{Linear, Module};
//! use tessera_optim::{Optimizer, Sgd, SgdOptions};
//! use tessera_parallel::{Communicator, DdpConfig, DistributedDataParallel, LocalGroup};
//! use tessera_tensor::Tensor;
//!
//! let finals = LocalGroup::run(2, |comm| -> tessera_parallel::Result<Vec<f32>> {
//!     let ddp = DistributedDataParallel::new(Linear::new(3, 1, true)?, comm, DdpConfig::default())?;
//!     let mut opt = Sgd::new(ddp.parameters(), SgdOptions { lr: 0.1, ..Default::default() })?;
//!     // Each rank sees its own half of the batch.
//!     let x = Var::constant(Tensor::full(&[2, 3], comm.rank() as f64, tessera_tensor::DType::F32)?);
//!     let loss = ddp.forward(&x)?.square()?.mean(&[], false)?;
//!     let grads = ddp.backward(&loss)?;
//!     opt.step(&grads)?;
//!     Ok(ddp.module().weight.tensor()?.to_vec::<f32>()?)
//! })?;
//! assert_eq!(finals[0].as_ref().unwrap(), finals[1].as_ref().unwrap());
//! # Ok::<(), tessera_parallel::CommError>(())
//! ```

mod bucket;
pub(crate) mod reducer;
mod sync;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_autograd::{Gradients, Parameter, Var};
use tessera_nn::{Buffer, Module, Visit, Visitor};
use tessera_optim::Optimizer;

pub use bucket::{
    assign_buckets, assign_buckets_by_module, BucketSpec, DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
};
pub use sync::{broadcast_coalesced, verify_same_shapes};

use crate::comm::{CommExt, Communicator};
use crate::error::Result;
use reducer::{local_backward, lock, synced_backward, Reducer};

/// Settings of [`DistributedDataParallel`], with PyTorch's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct DdpConfig {
    /// The size limit of a bucket in bytes (PyTorch's `bucket_cap_mb`,
    /// default 25 MiB).
    pub bucket_cap_bytes: usize,
    /// The limit of the bucket of the first-defined parameters (the last
    /// gradients backward produces), default 1 MiB, so that little
    /// communication is left once backward ends.
    pub first_bucket_bytes: usize,
    /// Tolerate parameters that get no gradient in a backward pass (they
    /// count as zero, or as what `no_sync` accumulated); without it they
    /// are an error naming them. Default false.
    pub find_unused_parameters: bool,
    /// Broadcast rank 0's buffers (BatchNorm's running statistics) before
    /// every forward, as PyTorch's `broadcast_buffers=True`. Default true.
    pub broadcast_buffers: bool,
    /// Start each bucket's all-reduce as soon as its gradients are final
    /// (default). When false, every all-reduce starts after backward
    /// returns: no overlap, for measuring what overlap gains.
    pub overlap: bool,
}

impl Default for DdpConfig {
    fn default() -> Self {
        DdpConfig {
            bucket_cap_bytes: DEFAULT_BUCKET_CAP_BYTES,
            first_bucket_bytes: DEFAULT_FIRST_BUCKET_BYTES,
            find_unused_parameters: false,
            broadcast_buffers: true,
            overlap: true,
        }
    }
}

/// What the last synchronising backward measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DdpStepStats {
    /// The number of buckets all-reduced.
    pub buckets: usize,
    /// How many of them were launched from gradient hooks, while backward
    /// was still running (the rest after it returned).
    pub launched_during_backward: usize,
    /// Payload bytes all-reduced (the buckets' sizes).
    pub bytes_reduced: usize,
    /// Time inside the backward pass (hooks included).
    pub backward: Duration,
    /// Sum over buckets of the time their all-reduces took: the
    /// communication time.
    pub communication: Duration,
    /// Time from the end of backward until the last all-reduce finished:
    /// the communication not hidden behind backward.
    pub exposed: Duration,
}

impl DdpStepStats {
    /// The fraction of the communication time hidden behind backward,
    /// `1 - exposed / communication` (0 when nothing was communicated).
    pub fn hidden_fraction(&self) -> f64 {
        let c = self.communication.as_secs_f64();
        if c == 0.0 {
            return 0.0;
        }
        (1.0 - self.exposed.as_secs_f64() / c).clamp(0.0, 1.0)
    }
}

/// A module replicated over the ranks of a communicator, trained as one
/// model on the union of the ranks' batches (`torch.nn.parallel.
/// DistributedDataParallel`).
///
/// Forward runs the wrapped module; [`DistributedDataParallel::backward`]
/// runs backward and returns the gradients averaged over the ranks, ready
/// for any optimizer. Every rank must make the same calls in the same
/// order (forward, backward, `no_sync`), as with PyTorch.
pub struct DistributedDataParallel<'c, M: Module> {
    module: M,
    comm: &'c dyn Communicator,
    config: DdpConfig,
    params: Vec<(String, Parameter)>,
    buffers: Vec<Buffer>,
    reducer: Arc<Mutex<Reducer>>,
    sync: AtomicBool,
    /// The buckets were rebuilt in the observed gradient order.
    rebuilt: AtomicBool,
    stats: Mutex<DdpStepStats>,
}

impl<'c, M: Module> DistributedDataParallel<'c, M> {
    /// Wraps `module` for data-parallel training over `comm`: a collective
    /// (every rank calls it). Checks that every rank holds the same
    /// trainable parameter shapes and dtypes, overwrites the parameters and
    /// buffers with rank 0's, plans the buckets and registers the gradient
    /// hooks. Frozen parameters are left out. Errors when the ranks' shapes
    /// differ (naming the ranks), a parameter is not a floating-point CPU
    /// tensor, or communication fails.
    pub fn new(module: M, comm: &'c dyn Communicator, config: DdpConfig) -> Result<Self> {
        const OP: &str = "DistributedDataParallel::new";
        let params: Vec<(String, Parameter)> = module
            .named_parameters()
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .collect();
        let reducer = reducer::all_reduce_reducer(
            OP,
            comm.world_size(),
            &params,
            config.first_bucket_bytes,
            config.bucket_cap_bytes,
        )?;
        let buffers: Vec<Buffer> = module.named_buffers().into_iter().map(|(_, b)| b).collect();
        let all: Vec<(String, Parameter)> = module.named_parameters();
        verify_same_shapes(
            comm,
            &all.iter()
                .map(|(n, p)| Ok((n.as_str(), p.tensor()?)))
                .collect::<tessera_tensor::Result<Vec<_>>>()?,
        )?;
        sync_module_states(
            comm,
            &all.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
            &buffers,
        )?;

        Ok(DistributedDataParallel {
            module,
            comm,
            config,
            params,
            buffers,
            reducer,
            sync: AtomicBool::new(true),
            rebuilt: AtomicBool::new(false),
            stats: Mutex::new(DdpStepStats::default()),
        })
    }

    /// The wrapped module (PyTorch's `ddp.module`).
    pub fn module(&self) -> &M {
        &self.module
    }

    /// Unwraps the module.
    pub fn into_inner(self) -> M {
        self.module
    }

    /// The settings.
    pub fn config(&self) -> &DdpConfig {
        &self.config
    }

    /// The communicator the gradients are averaged over.
    pub fn comm(&self) -> &'c dyn Communicator {
        self.comm
    }

    /// The buckets in launch order (bucket 0 holds the last-defined
    /// parameters until the first synchronising backward, then the first
    /// gradients to arrive); parameter indices refer to the trainable
    /// parameters in definition order.
    pub fn buckets(&self) -> Vec<BucketSpec> {
        lock(&self.reducer).specs().cloned().collect()
    }

    /// What the last synchronising backward measured.
    pub fn last_step_stats(&self) -> DdpStepStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Turns gradient synchronisation off until the guard is dropped
    /// (PyTorch's `no_sync()` context): backward passes in between only
    /// accumulate the gradients locally, in the buckets, and the first
    /// backward after the guard is gone all-reduces the accumulated sum.
    pub fn no_sync(&self) -> NoSync<'_> {
        NoSync {
            flag: &self.sync,
            before: self.sync.swap(false, Ordering::SeqCst),
        }
    }

    /// Runs `loss.backward()` and returns the gradients averaged over the
    /// ranks (see [`DistributedDataParallel::backward_with`]).
    pub fn backward(&self, loss: &Var) -> Result<Gradients> {
        self.backward_with(|| loss.backward())
    }

    /// Runs the backward pass `run` (any form: `backward_with` a seed
    /// gradient, a scaled loss, `backward_many`) with the gradient hooks
    /// armed, and returns its gradients. Outside `no_sync` the gradient of
    /// every DDP parameter is replaced by the average over the ranks of the
    /// gradients accumulated since the last synchronisation (a view into
    /// its bucket); under `no_sync` the local gradients of this pass are
    /// returned and their sum is kept for the next synchronising pass.
    ///
    /// Errors when backward fails, when a parameter got no gradient (naming
    /// it) unless `find_unused_parameters`, and when an all-reduce fails (a
    /// dead or stalled peer: within the communicator's timeout).
    pub fn backward_with(
        &self,
        run: impl FnOnce() -> tessera_tensor::Result<Gradients>,
    ) -> Result<Gradients> {
        let find_unused = self.config.find_unused_parameters;
        if !self.sync.load(Ordering::SeqCst) {
            return local_backward(&self.reducer, find_unused, run);
        }
        let (mut grads, stats) =
            synced_backward(&self.reducer, self.comm, self.config.overlap, find_unused, run)?;
        {
            let red = lock(&self.reducer);
            for (i, (_, p)) in self.params.iter().enumerate() {
                if let (Some(id), Some(g)) = (p.id(), red.grad_view(i, &p.shape())?) {
                    grads.insert(id, g);
                }
            }
        }
        *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = stats;
        if !find_unused && !self.rebuilt.swap(true, Ordering::SeqCst) {
            self.rebuild_buckets()?;
        }
        Ok(grads)
    }

    /// Runs `loss.backward()` for the step `opt` takes next: when
    /// `opt.wants_averaged_grads()` (every optimizer but the compressed ones
    /// after their warm-up), as [`DistributedDataParallel::backward`];
    /// otherwise with DDP's all-reduce skipped, returning this rank's local
    /// gradients, which the optimizer exchanges itself (DeepSpeed's
    /// `enable_backward_allreduce = false` under 1-bit Adam). A local pass
    /// leaves what `no_sync` accumulated for the next synchronising pass.
    /// Errors as `backward`.
    pub fn backward_for(&self, loss: &Var, opt: &dyn Optimizer) -> Result<Gradients> {
        if opt.wants_averaged_grads() {
            self.backward(loss)
        } else {
            // The hooks are disarmed outside a DDP backward: the buckets
            // are left alone.
            Ok(loss.backward()?)
        }
    }

    /// Re-plans the buckets in rank 0's observed gradient order (a
    /// collective, once, after the first synchronising backward; the
    /// gradients already returned keep their buffers).
    fn rebuild_buckets(&self) -> Result<()> {
        let mut order: Vec<i64> = lock(&self.reducer)
            .observed_order()
            .into_iter()
            .map(|i| i as i64)
            .collect();
        if self.comm.world_size() > 1 {
            self.comm.broadcast_slice(&mut order, 0)?;
        }
        let order: Vec<usize> = order
            .into_iter()
            .map(|i| usize::try_from(i).unwrap_or(usize::MAX))
            .collect();
        lock(&self.reducer).rebuild(
            &order,
            self.config.first_bucket_bytes,
            self.config.bucket_cap_bytes,
        )?;
        Ok(())
    }

    /// The trainable parameters DDP reduces, in definition order.
    pub fn parameters(&self) -> Vec<Parameter> {
        self.params.iter().map(|(_, p)| p.clone()).collect()
    }
}

/// Restores gradient synchronisation when dropped (see
/// [`DistributedDataParallel::no_sync`]).
pub struct NoSync<'a> {
    flag: &'a AtomicBool,
    before: bool,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        self.flag.store(self.before, Ordering::SeqCst);
    }
}

impl<M: Module> Visit for DistributedDataParallel<'_, M> {
    /// The wrapped module is the child `module`, so names carry PyTorch's
    /// `module.` prefix of a DDP state dict.
    fn visit<'a>(&'a self, visitor: &mut dyn Visitor<'a>) {
        visitor.child("module", &self.module);
    }

    fn type_name(&self) -> &'static str {
        "DistributedDataParallel"
    }
}

impl<M: Module> Module for DistributedDataParallel<'_, M> {
    /// Broadcasts rank 0's buffers first when `broadcast_buffers` (a
    /// collective), then runs the wrapped module. A failed broadcast is an
    /// I/O error naming it.
    fn forward(&self, input: &Var) -> tessera_tensor::Result<Var> {
        if self.config.broadcast_buffers && !self.buffers.is_empty() && self.comm.world_size() > 1 {
            sync_module_states(self.comm, &[], &self.buffers).map_err(|e| {
                tessera_tensor::Error::io(
                    "DistributedDataParallel::forward",
                    format!("broadcasting the buffers from rank 0 failed: {e}"),
                )
            })?;
        }
        self.module.forward(input)
    }
}

/// Overwrites `params` and `buffers` with rank 0's values (PyTorch's
/// `_sync_module_states`).
fn sync_module_states(comm: &dyn Communicator, params: &[Parameter], buffers: &[Buffer]) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let tensors: Vec<_> = params
        .iter()
        .map(Parameter::tensor)
        .chain(buffers.iter().map(|b| Ok(b.tensor())))
        .collect::<tessera_tensor::Result<_>>()?;
    let synced = broadcast_coalesced(comm, &tensors, 0)?;
    let mut synced = synced.into_iter();
    for p in params {
        p.set(synced.next().expect("one tensor per parameter"))?;
    }
    for b in buffers {
        b.set(synced.next().expect("one tensor per buffer"))?;
    }
    Ok(())
}
