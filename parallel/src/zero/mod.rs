//! ZeRO stages 1 and 2 (DeepSpeed's `stage_1_and_2.py`, spec §3): a
//! wrapper over any elementwise [`Optimizer`] that partitions its state
//! (stage 1) and the gradients (stage 2) over the data-parallel ranks.
//!
//! Each parameter group is laid out flat, padded to a multiple of
//! `2 · world` ([`FlatLayout`]), and split into one equal partition per
//! rank; the model's parameters become views into the flat buffer. Rank r
//! keeps a master copy of partition r (f32 for f16/bf16 parameters) and an
//! inner optimizer built over it ([`Optimizer::with_params`]), so its state
//! exists for 1/N of the parameters. Gradients are bucketed in reverse
//! definition order, pre-divided by N and summed onto their owners (a
//! reduce-scatter); stage 2 launches each bucket from the gradient hooks
//! during backward and keeps only the rank's partition afterwards, stage 1
//! reduces after backward and keeps the full buffers. [`ZeroOptimizer::step`]
//! updates the partition and all-gathers the flat parameters.
//!
//! Gradient accumulation: the micro-batches before the last of a step go
//! through [`ZeroOptimizer::backward_no_sync`], the last through
//! [`ZeroOptimizer::backward`]. Stage 1 accumulates them locally in the
//! buckets and reduces the sum once (PyTorch's `no_sync`); stage 2, whose
//! full gradients do not outlive backward, reduces every micro-batch and
//! accumulates the rank's partition (DeepSpeed's stage-2 accumulation).
//!
//! Stage 3 partitions the parameters too and needs the model: see
//! [`Zero3`].

mod comm_thread;
mod fetch;
mod model;
mod partition;
mod stage3;
mod stage3_consolidate;
mod stage3_state;
mod state;

use std::sync::{Arc, Mutex};

use tessera_autograd::{Gradients, Parameter, Var};
use tessera_optim::{GradScaler, Optimizer};
use tessera_tensor::{with_float_dtype, DType, Device, Tensor};

pub use model::{comm_model, memory_model, memory_model_with, ZeroStage};
pub use partition::{FlatLayout, ALIGNMENT_FACTOR};
pub use stage3::{Zero3, Zero3Config};
pub use stage3_consolidate::consolidate_zero3_sharded;
pub use stage3_state::{zero3_shard_file, ZERO3_INDEX_FILE};
pub use state::{consolidate_sharded, shard_file, INDEX_FILE};

use crate::comm::{CommExt, Communicator};
use crate::ddp::reducer::{self, local_backward, lock, owned_ranges, synced_backward, ReduceKind, Reducer};
use crate::ddp::{assign_buckets, broadcast_coalesced, verify_same_shapes, DdpStepStats};
use crate::error::{CommError, Result};

/// Settings of [`ZeroOptimizer`], with DeepSpeed's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ZeroConfig {
    /// The stage: [`ZeroStage::One`] or [`ZeroStage::Two`].
    pub stage: ZeroStage,
    /// Elements per gradient bucket (DeepSpeed's `reduce_bucket_size`,
    /// default 5e8).
    pub reduce_bucket_size: usize,
}

impl ZeroConfig {
    /// The settings of `stage` with the default bucket size.
    pub fn stage(stage: ZeroStage) -> ZeroConfig {
        ZeroConfig {
            stage,
            reduce_bucket_size: 500_000_000,
        }
    }
}

/// Bytes a rank holds, counted buffer by buffer (not RSS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroMemory {
    /// The flat parameter buffers (padding included).
    pub params: usize,
    /// Gradient buffers: the full bucket buffers (stage 1) or the rank's
    /// gradient partitions (stage 2).
    pub grads: usize,
    /// The master partitions and the inner optimizer's state.
    pub optimizer: usize,
}

impl ZeroMemory {
    /// The sum of the three.
    pub fn total(&self) -> usize {
        self.params + self.grads + self.optimizer
    }
}

/// One parameter group laid out flat.
struct Group {
    dtype: DType,
    layout: FlatLayout,
    params: Vec<Parameter>,
    /// Each parameter's index in the wrapped optimizer's numbering (its
    /// state dict's `state.{k}`), which counts frozen parameters too.
    index: Vec<usize>,
    /// The number of parameters of the wrapped optimizer's group.
    group_len: usize,
    /// Index of the group's first parameter in the reducer's list.
    first: usize,
    /// This rank's master partition, which the inner optimizer updates.
    master: Parameter,
    /// This rank's averaged gradient partition, between backward and step.
    grad: Option<Tensor>,
}

/// An optimizer whose state (stage 1) and gradients (stage 2) are
/// partitioned over the ranks of a communicator (DeepSpeed's ZeRO).
///
/// `backward` replaces `loss.backward()` and `step` the optimizer's step;
/// every rank makes the same calls in the same order. The result equals
/// plain data parallelism (and one process on the union of the batches)
/// up to the reduction order: bitwise for power-of-two world sizes where
/// the sums are exact.
pub struct ZeroOptimizer<'c> {
    comm: &'c dyn Communicator,
    config: ZeroConfig,
    groups: Vec<Group>,
    /// Per bucket: its group and its start in the group's flat buffer.
    buckets: Vec<(usize, usize, usize)>,
    reducer: Arc<Mutex<Reducer>>,
    inner: Box<dyn Optimizer>,
    last_backward: DdpStepStats,
    comm_elements: usize,
    /// A backward or backward_no_sync ran since the last step (the next
    /// one starts a new count of communicated elements).
    in_step: bool,
    /// The synchronising backward of this step ran.
    synced: bool,
}

impl<'c> ZeroOptimizer<'c> {
    /// Partitions `optimizer` (built over the model's parameters; its
    /// groups and hyperparameters are kept) over `comm`: a collective.
    /// Rank 0's parameter values are broadcast first. Errors for stage 3
    /// and the baseline, for LAMB and LARS (their trust ratios need whole
    /// parameters' norms), when a group mixes dtypes or holds a non-float or
    /// non-CPU parameter, and when communication fails.
    pub fn new(optimizer: &dyn Optimizer, comm: &'c dyn Communicator, config: ZeroConfig) -> Result<Self> {
        const OP: &str = "ZeroOptimizer::new";
        if !matches!(config.stage, ZeroStage::One | ZeroStage::Two) {
            return Err(CommError::arg(
                OP,
                format!(
                    "stage {:?} is not available here: ZeroOptimizer implements stages One and Two (use Zero3 for stage Three, DistributedDataParallel for the baseline)",
                    config.stage
                ),
            ));
        }
        if matches!(optimizer.name(), "Lamb" | "Lars") {
            return Err(CommError::arg(
                OP,
                format!(
                    "{} computes per-parameter trust ratios, which a flat partition splits; use an elementwise optimizer (SGD, Adam, AdamW, Adagrad, RMSprop)",
                    optimizer.name()
                ),
            ));
        }
        let (world, rank) = (comm.world_size(), comm.rank());
        let mut all: Vec<Parameter> = Vec::new();
        let mut groups = Vec::new();
        let mut k = 0;
        for g in 0..optimizer.num_groups() {
            let listed = optimizer.group_params(g);
            let (index, params): (Vec<usize>, Vec<Parameter>) = listed
                .iter()
                .enumerate()
                .filter(|(_, p)| p.requires_grad())
                .map(|(i, p)| (k + i, p.clone()))
                .unzip();
            k += listed.len();
            let dtype = params.first().map_or(DType::F32, Parameter::dtype);
            for p in &params {
                let t = p.tensor()?;
                if t.dtype() != dtype || !dtype.is_float() || t.device() != Device::Cpu {
                    return Err(CommError::arg(
                        OP,
                        format!(
                            "group {g}: a parameter of shape {:?} is {} on {}; a group must hold floating-point CPU parameters of one dtype ({dtype})",
                            t.shape(),
                            t.dtype(),
                            t.device()
                        ),
                    ));
                }
            }
            let numels: Vec<usize> = params.iter().map(Parameter::numel).collect();
            let layout = FlatLayout::new(&numels, world);
            groups.push((dtype, layout, params.clone(), index, listed.len(), all.len()));
            all.extend(params);
        }
        // The same parameters on every rank, rank 0's values everywhere,
        // then flat buffers with the parameters as views into them.
        let tensors: Vec<Tensor> = all
            .iter()
            .map(Parameter::tensor)
            .collect::<tessera_tensor::Result<_>>()?;
        let named: Vec<(&str, Tensor)> = tensors.iter().map(|t| ("parameter", t.clone())).collect();
        verify_same_shapes(comm, &named).map_err(|e| e.in_op(OP))?;
        let synced = broadcast_coalesced(comm, &tensors, 0)?;
        for (p, t) in all.iter().zip(synced) {
            p.set(t)?;
        }
        let master_dtype = |d: DType| {
            if matches!(d, DType::F16 | DType::BF16) {
                DType::F32
            } else {
                d
            }
        };
        let mut built = Vec::new();
        for (dtype, layout, params, index, group_len, first) in groups {
            let flat = flatten(&params, &layout, dtype)?;
            point_into(&params, &layout, &flat)?;
            let (lo, hi) = layout.partition(rank);
            let master = Parameter::new(copy_range(&flat, lo, hi)?.to_dtype(master_dtype(dtype))?);
            built.push(Group {
                dtype,
                layout,
                params,
                index,
                group_len,
                first,
                master,
                grad: None,
            });
        }
        // Buckets: later groups first, each in reverse definition order.
        let mut specs = Vec::new();
        let mut buckets = Vec::new();
        for (g, grp) in built.iter().enumerate().rev() {
            let cap = config
                .reduce_bucket_size
                .saturating_mul(grp.dtype.size_in_bytes());
            let shapes: Vec<_> = grp.params.iter().map(|p| (grp.dtype, p.numel())).collect();
            for mut spec in assign_buckets(&shapes, cap, cap) {
                let start = grp.layout.offsets[spec.params[0]];
                buckets.push((g, start, spec.numel));
                spec.params.iter_mut().for_each(|i| *i += grp.first);
                specs.push(spec);
            }
        }
        let names = built
            .iter()
            .enumerate()
            .flat_map(|(g, grp)| {
                grp.params
                    .iter()
                    .enumerate()
                    .map(move |(i, p)| format!("group {g} parameter {i} {:?}", p.shape()))
            })
            .collect();
        let ranges = buckets
            .iter()
            .map(|&(g, start, _)| (start, built[g].layout.part))
            .collect();
        let reducer = Arc::new(Mutex::new(Reducer::new(
            world,
            names,
            &all.iter().map(Parameter::numel).collect::<Vec<_>>(),
            specs,
            ReduceKind::ToOwners { ranges },
        )));
        reducer::register_hooks(&reducer, all.iter())?;
        let inner = optimizer.with_params(built.iter().map(|g| vec![g.master.clone()]).collect())?;
        Ok(ZeroOptimizer {
            comm,
            config,
            groups: built,
            buckets,
            reducer,
            inner,
            last_backward: DdpStepStats::default(),
            comm_elements: 0,
            in_step: false,
            synced: false,
        })
    }

    /// The stage.
    pub fn stage(&self) -> ZeroStage {
        self.config.stage
    }

    /// The inner optimizer over this rank's master partitions (its learning
    /// rates are the ones to schedule).
    pub fn inner(&mut self) -> &mut dyn Optimizer {
        self.inner.as_mut()
    }

    /// The flat layout of each parameter group.
    pub fn layouts(&self) -> Vec<FlatLayout> {
        self.groups.iter().map(|g| g.layout.clone()).collect()
    }

    /// Runs `loss.backward()` and reduces the gradients onto their owners
    /// (see [`ZeroOptimizer::backward_with`]).
    pub fn backward(&mut self, loss: &Var) -> Result<()> {
        self.backward_with(|| loss.backward())
    }

    /// Runs the backward pass `run` with the gradient hooks armed; each
    /// rank ends with the average over the ranks of its gradient partition
    /// (of the sum over this pass and the `backward_no_sync` passes since
    /// the last step). Stage 2 reduces each bucket as soon as its gradients
    /// are final and then frees the full buffers. Errors when backward
    /// fails, a parameter got no gradient (naming it), communication fails,
    /// or a synchronising backward already ran since the last step (the
    /// earlier micro-batches of a step go through `backward_no_sync`).
    pub fn backward_with(&mut self, run: impl FnOnce() -> tessera_tensor::Result<Gradients>) -> Result<()> {
        self.start_micro_batch("ZeroOptimizer::backward")?;
        self.reduce_now(run)?;
        self.synced = true;
        Ok(())
    }

    /// Runs `loss.backward()` for a micro-batch before the last of a step
    /// (see [`ZeroOptimizer::backward_no_sync_with`]).
    pub fn backward_no_sync(&mut self, loss: &Var) -> Result<()> {
        self.backward_no_sync_with(|| loss.backward())
    }

    /// Runs the backward pass `run` of a micro-batch before the last of a
    /// step (gradient accumulation, PyTorch's `no_sync`): stage 1 adds its
    /// gradients to the local buckets without communicating; stage 2
    /// reduces them onto their owners at once and adds the rank's partition
    /// to what earlier micro-batches left. The step's synchronising
    /// [`ZeroOptimizer::backward`] then completes the sum. Errors as
    /// [`ZeroOptimizer::backward_with`].
    pub fn backward_no_sync_with(
        &mut self,
        run: impl FnOnce() -> tessera_tensor::Result<Gradients>,
    ) -> Result<()> {
        self.start_micro_batch("ZeroOptimizer::backward_no_sync")?;
        match self.config.stage {
            ZeroStage::Two => self.reduce_now(run),
            _ => local_backward(&self.reducer, false, run).map(drop),
        }
    }

    /// Checks that the step's synchronising backward has not run yet, and
    /// starts counting communication at the first micro-batch of a step.
    fn start_micro_batch(&mut self, op: &'static str) -> Result<()> {
        if self.synced {
            return Err(CommError::arg(
                op,
                "a synchronising backward already ran since the last step: call step() first, or run the earlier micro-batches of a step through backward_no_sync",
            ));
        }
        if !self.in_step {
            self.in_step = true;
            self.comm_elements = 0;
        }
        Ok(())
    }

    /// A backward pass whose buckets are reduced onto their owners; stage
    /// 2 then adds the rank's partitions to its gradients and frees the
    /// buckets.
    fn reduce_now(&mut self, run: impl FnOnce() -> tessera_tensor::Result<Gradients>) -> Result<()> {
        let overlap = self.config.stage == ZeroStage::Two;
        let (grads, stats) = synced_backward(&self.reducer, self.comm, overlap, false, run)?;
        drop(grads);
        self.comm_elements += self.buckets.iter().map(|&(_, _, n)| n).sum::<usize>();
        self.last_backward = stats;
        if self.config.stage == ZeroStage::Two {
            self.add_partitions()?;
            lock(&self.reducer).release();
        }
        Ok(())
    }

    /// What the last backward measured (buckets, bytes, overlap).
    pub fn last_backward_stats(&self) -> &DdpStepStats {
        &self.last_backward
    }

    /// Clips the gradients to a global norm of `max_norm` as
    /// `clip_grad_norm_` does over the whole model (the partitions' squared
    /// norms are summed over the ranks), between backward and step; returns
    /// the norm before clipping. Errors when no backward ran since the last
    /// step, or communication fails.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64> {
        self.take_partitions()?;
        let norm = sharded_norm(
            self.groups.iter().map(|g| g.grad.as_ref().expect("taken")),
            self.comm,
        )?;
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            for g in &mut self.groups {
                let grad = g.grad.take().expect("taken");
                g.grad = Some(grad.mul_scalar(coef)?);
            }
        }
        Ok(norm)
    }

    /// Unscales this rank's gradient partitions with `scaler` (after a
    /// backward of the scaled loss, `backward_with(|| scaler.backward(&loss))`)
    /// and returns whether any rank found an inf or NaN: every rank records
    /// the same verdict, so [`ZeroOptimizer::step_scaled`] skips the step
    /// on all of them or none. Errors as `GradScaler::unscale_`, when no
    /// backward ran since the last step, or when communication fails.
    pub fn unscale_(&mut self, scaler: &mut GradScaler) -> Result<bool> {
        self.take_partitions()?;
        let mut grads = self.partition_grads()?;
        let comm = self.comm;
        let found = scaler.unscale_across(&mut grads, &mut |local| {
            crate::comm::any_rank(&*comm, local, "GradScaler::unscale_")
        })?;
        self.restore_partition_grads(grads)?;
        Ok(found)
    }

    /// The step under loss scaling: unscales (unless
    /// [`ZeroOptimizer::unscale_`] ran), then steps and all-gathers unless
    /// some rank found an inf or NaN, in which case no rank steps. Returns
    /// whether the step was taken; call `scaler.update()` after it. Errors
    /// as [`ZeroOptimizer::step`] and `GradScaler::step`.
    pub fn step_scaled(&mut self, scaler: &mut GradScaler) -> Result<bool> {
        self.take_partitions()?;
        let mut grads = self.partition_grads()?;
        let stepped = scaler.step(self.inner.as_mut(), &mut grads)?;
        self.end_step();
        if stepped {
            self.gather_params()?;
        }
        Ok(stepped)
    }

    /// Updates this rank's partition with the inner optimizer and
    /// all-gathers the flat parameters, so every rank holds the same new
    /// parameters. Errors when no backward ran since the last step, as the
    /// inner optimizer's step does, or when communication fails.
    pub fn step(&mut self) -> Result<()> {
        self.take_partitions()?;
        let grads = self.partition_grads()?;
        self.end_step();
        self.inner.step(&grads)?;
        self.gather_params()
    }

    /// Drops the step's gradient partitions and starts the next step's
    /// accumulation.
    fn end_step(&mut self) {
        for g in &mut self.groups {
            g.grad = None;
        }
        self.synced = false;
        self.in_step = false;
    }

    /// The gradient partitions keyed by their master partitions, in the
    /// masters' dtype.
    fn partition_grads(&self) -> Result<Gradients> {
        let mut grads = Gradients::default();
        for g in &self.groups {
            let grad = g.grad.as_ref().expect("taken");
            let id = g.master.id().expect("masters require grad");
            grads.insert(id, grad.to_dtype(g.master.dtype())?);
        }
        Ok(grads)
    }

    /// Puts edited partition gradients back (in the parameters' dtype).
    fn restore_partition_grads(&mut self, grads: Gradients) -> Result<()> {
        for g in &mut self.groups {
            if let Some(t) = g.master.id().and_then(|id| grads.get_id(id)) {
                g.grad = Some(t.to_dtype(g.dtype)?);
            }
        }
        Ok(())
    }

    /// All-gathers every group's flat parameters from the ranks' master
    /// partitions and points the parameters into them.
    fn gather_params(&mut self) -> Result<()> {
        for g in &self.groups {
            let mine = g.master.tensor()?.to_dtype(g.dtype)?;
            let flat = with_float_dtype!(g.dtype, T => {
                let mut full = vec![<T as tessera_tensor::Element>::ZERO; g.layout.len];
                self.comm.all_gather_slice(&mine.to_vec::<T>()?, &mut full)?;
                Tensor::from_vec(full, &[g.layout.len])?
            }, else unreachable!("groups are floating point"));
            point_into(&g.params, &g.layout, &flat)?;
            self.comm_elements += g.layout.len;
        }
        Ok(())
    }

    /// Elements communicated in the current (or last) step, from its first
    /// backward to its parameter all-gather, counted per collective as the
    /// paper does: the reduces onto the owners count the bucket sizes (a
    /// reduce-scatter, Ψ, once per stage-2 micro-batch), the all-gather the
    /// flat length.
    pub fn comm_elements(&self) -> usize {
        self.comm_elements
    }

    /// The bytes this rank holds now, buffer by buffer: flat parameters,
    /// gradient buffers and partitions, master partitions and the inner
    /// optimizer's state tensors.
    pub fn memory(&self) -> ZeroMemory {
        let mut m = ZeroMemory::default();
        let bytes = |t: &Tensor| t.numel() * t.dtype().size_in_bytes();
        let red = lock(&self.reducer);
        for (b, _) in self.buckets.iter().enumerate() {
            m.grads += red.flat(b).map_or(0, bytes);
        }
        for g in &self.groups {
            let mut seen: Vec<*const tessera_tensor::Storage> = Vec::new();
            for p in &g.params {
                let t = p.current();
                let s = Arc::as_ptr(t.storage());
                if !seen.contains(&s) {
                    seen.push(s);
                    m.params += t.storage().len() * t.dtype().size_in_bytes();
                }
            }
            m.grads += g.grad.as_ref().map_or(0, bytes);
            m.optimizer += bytes(&g.master.current());
        }
        let sd = self.inner.state_dict();
        m.optimizer += sd.iter().map(|(_, t)| bytes(t)).sum::<usize>();
        m
    }

    /// Stage 1: copies this rank's averaged gradient partition of every
    /// group out of the reduced buckets (once per step, after the
    /// synchronising backward). Stage 2 took them during backward. Errors
    /// when the step's synchronising backward has not run.
    fn take_partitions(&mut self) -> Result<()> {
        if !self.synced {
            return Err(CommError::arg(
                "ZeroOptimizer::step",
                "no gradients: run backward (the step's synchronising backward) before step",
            ));
        }
        if self.groups.iter().all(|g| g.grad.is_some()) {
            return Ok(());
        }
        self.add_partitions()
    }

    /// Adds this rank's averaged gradient partition of every group, out of
    /// the reduced buckets, to the group's gradient (or sets it).
    fn add_partitions(&mut self) -> Result<()> {
        let rank = self.comm.rank();
        let red = lock(&self.reducer);
        for (gi, g) in self.groups.iter_mut().enumerate() {
            let (lo, _) = g.layout.partition(rank);
            let part = g.layout.part;
            let mut shard = Tensor::zeros(&[part], g.dtype)?;
            for (b, &(bg, start, n)) in self.buckets.iter().enumerate() {
                if bg != gi {
                    continue;
                }
                let flat = red.flat(b).ok_or_else(|| {
                    CommError::arg("ZeroOptimizer::step", "no gradients: run backward before step")
                })?;
                with_float_dtype!(g.dtype, T => {
                    let src = flat.as_slice::<T>()?;
                    let dst = shard.make_mut::<T>()?;
                    for (owner, a, e) in owned_ranges(start, n, part) {
                        if owner == rank {
                            dst[start + a - lo..start + e - lo].copy_from_slice(&src[a..e]);
                        }
                    }
                }, else unreachable!("groups are floating point"));
            }
            g.grad = Some(match g.grad.take() {
                Some(sum) => sum.add(&shard)?,
                None => shard,
            });
        }
        Ok(())
    }
}

/// The parameters' values laid out flat as `layout` says, zero padded.
fn flatten(params: &[Parameter], layout: &FlatLayout, dtype: DType) -> Result<Tensor> {
    with_float_dtype!(dtype, T => {
        let mut flat = vec![<T as tessera_tensor::Element>::ZERO; layout.len];
        for (p, &off) in params.iter().zip(&layout.offsets) {
            let v = p.tensor()?.to_vec::<T>()?;
            flat[off..off + v.len()].copy_from_slice(&v);
        }
        Ok(Tensor::from_vec(flat, &[layout.len])?)
    }, else unreachable!("groups are floating point"))
}

/// Makes every parameter a view into `flat` (keeping its id and hooks).
fn point_into(params: &[Parameter], layout: &FlatLayout, flat: &Tensor) -> Result<()> {
    for (p, &off) in params.iter().zip(&layout.offsets) {
        p.set(flat.narrow(0, off, p.numel())?.view(p.shape().as_slice())?)?;
    }
    Ok(())
}

/// A copy (own storage) of elements `lo .. hi` of a flat tensor.
fn copy_range(flat: &Tensor, lo: usize, hi: usize) -> Result<Tensor> {
    let view = flat.narrow(0, lo, hi - lo)?;
    with_float_dtype!(flat.dtype(), T => Ok(Tensor::from_vec(view.to_vec::<T>()?, &[hi - lo])?),
        else unreachable!("groups are floating point"))
}

/// The global L2 norm of gradients sharded over `comm`'s ranks: each
/// rank's squared norm of its shards, summed over the ranks in f64 (the
/// shards' zero padding adds nothing). Errors when a dtype conversion or
/// the all-reduce fails.
pub(crate) fn sharded_norm<'a>(
    shards: impl IntoIterator<Item = &'a Tensor>,
    comm: &dyn Communicator,
) -> Result<f64> {
    let mut sq = [0.0f64];
    for g in shards {
        sq[0] += g
            .to_dtype(DType::F64)?
            .to_vec::<f64>()?
            .iter()
            .map(|v| v * v)
            .sum::<f64>();
    }
    comm.all_reduce_slice(&mut sq, crate::ReduceOp::Sum)?;
    Ok(sq[0].sqrt())
}
