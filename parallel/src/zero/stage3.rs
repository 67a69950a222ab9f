//! ZeRO stage 3 (DeepSpeed's `stage3.py`, spec §3.3): parameters,
//! gradients and optimizer state all partitioned over the ranks.
//!
//! [`Zero3::new`] broadcasts rank 0's parameters, keeps each rank's shard
//! of every trainable parameter (`ps = ⌈numel / n⌉` elements, zero-padded)
//! in one flat shard per optimizer group, and releases the full values.
//! From then on the model is used as usual — `model.forward(&x)` — and the
//! coordinator ([`super::fetch`]) gathers each module's parameters when
//! they are read, frees them after, gathers them again for backward
//! (prefetching the next module) and reduce-scatters their gradients.
//! [`Zero3::step`] updates the shard with the inner optimizer (any
//! elementwise one, over the rank's master shard); there is no all-gather
//! at step time (the next forward gathers lazily) except of the small
//! parameters that stay gathered ([`Zero3Config::param_persistence_threshold`]).
//!
//! Every rank must run the same forward and backward passes (the
//! collectives happen where the parameters are read). Reading a parameter
//! outside them, e.g. `model.state_dict()` on one rank, is a collective
//! too; [`Zero3::consolidated_model_state_dict`] gathers the model instead.

use std::sync::{Arc, Mutex};

use tessera_autograd::{Gradients, Parameter, Var};
use tessera_nn::Module;
use tessera_optim::{GradScaler, Optimizer};
use tessera_tensor::{with_float_dtype, DType, Device, Element, StateDict, Tensor};

use super::fetch::{install_hooks, lock, units_of, Core, Part};
use super::ZeroMemory;
use crate::comm::{CommExt, Communicator};
use crate::ddp::{broadcast_coalesced, verify_same_shapes};
use crate::error::{CommError, Result};

/// Settings of [`Zero3`], with DeepSpeed's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zero3Config {
    /// Parameters of at most this many elements are not released between
    /// uses: every rank keeps them gathered and refreshes them with one
    /// all-gather after each step (DeepSpeed's
    /// `stage3_param_persistence_threshold`, 100,000), which saves two
    /// small collectives per use for biases and norms. Their gradients
    /// and optimizer state are partitioned like the others'. 0 releases
    /// every parameter.
    pub param_persistence_threshold: usize,
    /// Launch the all-gather of the module read next (from the trace of
    /// the previous step) on the communication thread while the current
    /// module computes, in forward and backward (DeepSpeed's prefetch).
    pub prefetch: bool,
}

impl Default for Zero3Config {
    fn default() -> Self {
        Zero3Config {
            param_persistence_threshold: 100_000,
            prefetch: true,
        }
    }
}

/// An optimizer and a model partitioned over the ranks of a communicator
/// (DeepSpeed's ZeRO stage 3). See the module docs.
pub struct Zero3 {
    pub(super) core: Arc<Mutex<Core>>,
    /// Per optimizer group: this rank's master shard.
    pub(super) masters: Vec<Parameter>,
    pub(super) inner: Box<dyn Optimizer>,
    /// Elements communicated in the last completed step.
    last_comm: usize,
    /// A backward ran since the last step.
    synced: bool,
}

impl Zero3 {
    /// [`Zero3::with_config`] with DeepSpeed's defaults.
    pub fn new(model: &dyn Module, optimizer: &dyn Optimizer, comm: &dyn Communicator) -> Result<Zero3> {
        Zero3::with_config(model, optimizer, comm, Zero3Config::default())
    }

    /// Partitions `model`'s parameters and `optimizer`'s state over `comm`
    /// (a collective; the coordinator works on a duplicate of `comm`, made
    /// with `split`, on a communication thread of its own). Rank 0's
    /// parameter values are broadcast first.
    /// Errors for LAMB and LARS (trust ratios need whole parameters),
    /// when the optimizer holds a parameter the model does not, when the
    /// trainable parameters are not all floating point of one dtype on the
    /// CPU, when the ranks' shapes differ, and when communication fails.
    pub fn with_config(
        model: &dyn Module,
        optimizer: &dyn Optimizer,
        comm: &dyn Communicator,
        config: Zero3Config,
    ) -> Result<Zero3> {
        const OP: &str = "Zero3::new";
        if matches!(optimizer.name(), "Lamb" | "Lars") {
            return Err(CommError::arg(
                OP,
                format!(
                    "{} computes per-parameter trust ratios, which a partition splits; use an elementwise optimizer (SGD, Adam, AdamW, Adagrad, RMSprop)",
                    optimizer.name()
                ),
            ));
        }
        let named: Vec<(String, Parameter)> = model
            .named_parameters()
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .collect();
        let dtype = named.first().map_or(DType::F32, |(_, p)| p.dtype());
        for (name, p) in &named {
            let t = p.tensor()?;
            if t.dtype() != dtype || !dtype.is_float() || t.device() != Device::Cpu {
                return Err(CommError::arg(
                    OP,
                    format!(
                        "{name} of shape {:?} is {} on {}; ZeRO-3 partitions floating-point CPU parameters of one dtype ({dtype})",
                        t.shape(),
                        t.dtype(),
                        t.device()
                    ),
                ));
            }
        }
        let tensors: Vec<Tensor> = named
            .iter()
            .map(|(_, p)| p.tensor())
            .collect::<tessera_tensor::Result<_>>()?;
        let shapes: Vec<(&str, Tensor)> = named
            .iter()
            .zip(&tensors)
            .map(|((n, _), t)| (n.as_str(), t.clone()))
            .collect();
        verify_same_shapes(comm, &shapes).map_err(|e| e.in_op(OP))?;
        let synced = broadcast_coalesced(comm, &tensors, 0)?;
        drop(shapes);
        let (world, rank) = (comm.world_size(), comm.rank());
        let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
        let units = units_of(&names);

        // Each parameter's optimizer group and offset in its flat shard.
        let mut parts: Vec<Part> = Vec::new();
        let mut group_lists: Vec<Vec<usize>> = Vec::new();
        for g in 0..optimizer.num_groups() {
            let mut list = Vec::new();
            for p in optimizer.group_params(g).iter().filter(|p| p.requires_grad()) {
                let i = named.iter().position(|(_, q)| q.same(p)).ok_or_else(|| {
                    CommError::arg(
                        OP,
                        format!("the optimizer's group {g} holds a parameter of shape {:?} that the model does not", p.shape()),
                    )
                })?;
                list.push(i);
            }
            group_lists.push(list);
        }
        let mut placed = vec![None; named.len()];
        let mut shard_lens = Vec::new();
        for (g, list) in group_lists.iter().enumerate() {
            let mut off = 0;
            for &i in list {
                let numel = named[i].1.numel();
                let ps = numel.div_ceil(world);
                placed[i] = Some((g, off, ps));
                off += ps;
            }
            shard_lens.push(off);
        }
        for (i, (name, p)) in named.iter().enumerate() {
            let (group, offset, ps) = placed[i].ok_or_else(|| {
                CommError::arg(
                    OP,
                    format!("{name} requires grad but is in none of the optimizer's groups"),
                )
            })?;
            let unit = units
                .iter()
                .position(|u| u.parts.contains(&i))
                .expect("every parameter has a unit");
            parts.push(Part {
                name: name.clone(),
                param: p.clone(),
                numel: p.numel(),
                ps,
                group,
                offset,
                unit,
                persistent: p.numel() <= config.param_persistence_threshold,
            });
        }
        let shards = with_float_dtype!(dtype, T => {
            let mut flat: Vec<Vec<T>> = shard_lens.iter().map(|&l| vec![T::ZERO; l]).collect();
            for (p, t) in parts.iter().zip(&synced) {
                let v = t.contiguous()?.to_vec::<T>()?;
                let lo = (rank * p.ps).min(p.numel);
                let hi = ((rank + 1) * p.ps).min(p.numel);
                flat[p.group][p.offset..p.offset + hi - lo].copy_from_slice(&v[lo..hi]);
            }
            flat.into_iter()
                .map(|v| { let n = v.len(); Tensor::from_vec(v, &[n]) })
                .collect::<tessera_tensor::Result<Vec<Tensor>>>()?
        }, else unreachable!("checked floating point"));
        for (p, t) in parts.iter().zip(synced) {
            if p.persistent {
                p.param.set(t)?;
            }
        }
        drop(tensors);
        let master_dtype = if matches!(dtype, DType::F16 | DType::BF16) {
            DType::F32
        } else {
            dtype
        };
        let masters: Vec<Parameter> = shards
            .iter()
            .map(|s| Ok(Parameter::new(copy(&s.to_dtype(master_dtype)?)?)))
            .collect::<Result<_>>()?;
        let inner = optimizer.with_params(masters.iter().map(|m| vec![m.clone()]).collect())?;
        let comm = comm
            .split(Some(0), rank as i64)?
            .ok_or_else(|| CommError::arg(OP, "duplicating the communicator gave no group"))?;
        let core = Arc::new(Mutex::new(Core::new(
            Arc::from(comm),
            dtype,
            parts,
            units,
            shards,
            config.prefetch,
        )?));
        install_hooks(&core)?;
        lock(&core).release_all()?;
        Ok(Zero3 {
            core,
            masters,
            inner,
            last_comm: 0,
            synced: false,
        })
    }

    /// The inner optimizer over this rank's master shards (its learning
    /// rates are the ones to schedule).
    pub fn inner(&mut self) -> &mut dyn Optimizer {
        self.inner.as_mut()
    }

    /// Runs `loss.backward()` (see [`Zero3::backward_with`]).
    pub fn backward(&mut self, loss: &Var) -> Result<()> {
        self.backward_with(|| loss.backward())
    }

    /// Runs the backward pass `run`: each module's parameters are gathered
    /// again when its nodes read them and its gradients reduce-scattered
    /// when final, so each rank ends with the average over the ranks of
    /// its gradient shard, added to what earlier backward passes since the
    /// last step left (gradient accumulation). Errors when backward fails
    /// or communication fails (the first communication error, from a hook
    /// too).
    pub fn backward_with(&mut self, run: impl FnOnce() -> tessera_tensor::Result<Gradients>) -> Result<()> {
        lock(&self.core).begin_backward()?;
        let grads = run();
        let mut core = lock(&self.core);
        let ended = core.end_backward();
        core.check()?;
        drop(grads?);
        ended?;
        self.synced = true;
        Ok(())
    }

    /// Clips the gradients to a global norm of `max_norm` as
    /// `clip_grad_norm_` does over the whole model (the shards' squared
    /// norms summed over the ranks; padding is zero); returns the norm
    /// before clipping. Errors when no backward ran since the last step, or
    /// communication fails.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64> {
        self.need_grads("Zero3::clip_grad_norm")?;
        let mut core = lock(&self.core);
        let comm = core.idle_comm()?;
        let norm = super::sharded_norm(core.grads.iter().flatten(), comm.as_ref())?;
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            for g in core.grads.iter_mut() {
                if let Some(t) = g.take() {
                    *g = Some(t.mul_scalar(coef)?);
                }
            }
        }
        Ok(norm)
    }

    /// Unscales this rank's gradient shards with `scaler` (after a backward
    /// of the scaled loss) and returns whether any rank found an inf or
    /// NaN; every rank records the same verdict, so
    /// [`Zero3::step_scaled`] skips on all of them or none. Errors as
    /// `GradScaler::unscale_`, without a backward, or when communication
    /// fails.
    pub fn unscale_(&mut self, scaler: &mut GradScaler) -> Result<bool> {
        self.need_grads("Zero3::unscale_")?;
        let mut grads = self.shard_grads()?;
        let comm = lock(&self.core).idle_comm()?;
        let found = scaler.unscale_across(&mut grads, &mut |local| {
            crate::comm::any_rank(&*comm, local, "GradScaler::unscale_")
        })?;
        self.restore_grads(&grads)?;
        Ok(found)
    }

    /// The step under loss scaling: unscales (unless [`Zero3::unscale_`]
    /// ran) and steps unless some rank found an inf or NaN, in which case
    /// no rank steps. Returns whether the step was taken. Errors as
    /// [`Zero3::step`] and `GradScaler::step`.
    pub fn step_scaled(&mut self, scaler: &mut GradScaler) -> Result<bool> {
        self.need_grads("Zero3::step")?;
        let mut grads = self.shard_grads()?;
        let stepped = scaler.step(self.inner.as_mut(), &mut grads)?;
        if stepped {
            self.write_back()?;
        }
        self.end_step();
        Ok(stepped)
    }

    /// Updates this rank's shards with the inner optimizer. Errors when no
    /// backward ran since the last step, or as the inner optimizer's step.
    pub fn step(&mut self) -> Result<()> {
        self.need_grads("Zero3::step")?;
        let grads = self.shard_grads()?;
        self.inner.step(&grads)?;
        self.write_back()?;
        self.end_step();
        Ok(())
    }

    fn need_grads(&self, op: &'static str) -> Result<()> {
        lock(&self.core).check()?;
        if !self.synced {
            return Err(CommError::arg(op, "no gradients: run backward before step"));
        }
        Ok(())
    }

    /// The gradient shards keyed by their master shards, in the masters'
    /// dtype (zeros for a group no gradient reached).
    fn shard_grads(&self) -> Result<Gradients> {
        let core = lock(&self.core);
        let mut grads = Gradients::default();
        for (g, m) in self.masters.iter().enumerate() {
            let t = match &core.grads[g] {
                Some(t) => t.to_dtype(m.dtype())?,
                None => Tensor::zeros(&[m.numel()], m.dtype())?,
            };
            grads.insert(m.id().expect("masters require grad"), t);
        }
        Ok(grads)
    }

    fn restore_grads(&mut self, grads: &Gradients) -> Result<()> {
        let mut core = lock(&self.core);
        let dtype = core.dtype;
        for (g, m) in self.masters.iter().enumerate() {
            if let Some(t) = m.grad(grads) {
                core.grads[g] = Some(t.to_dtype(dtype)?);
            }
        }
        Ok(())
    }

    /// Copies the updated master shards into the parameter shards and
    /// gathers the persistent parameters' new values.
    fn write_back(&mut self) -> Result<()> {
        let mut core = lock(&self.core);
        let dtype = core.dtype;
        for (g, m) in self.masters.iter().enumerate() {
            core.shards[g] = copy(&m.tensor()?.to_dtype(dtype)?)?;
        }
        core.refresh_persistent()
    }

    fn end_step(&mut self) {
        let mut core = lock(&self.core);
        core.grads.iter_mut().for_each(|g| *g = None);
        self.last_comm = std::mem::take(&mut core.comm_elements);
        self.synced = false;
    }

    /// Elements communicated in the last completed step (forward and
    /// backward all-gathers, the gradient reduce-scatters and the gather of
    /// the persistent parameters after the step, each counted by the
    /// gathered or scattered length, as the paper counts Ψ per
    /// collective): about 3Ψ, less Ψ of the persistent parameters.
    pub fn comm_elements(&self) -> usize {
        self.last_comm
    }

    /// The bytes this rank holds now, buffer by buffer: parameter shards,
    /// the persistent parameters' full values and any gathered values
    /// still live, gradient shards, master shards and the inner
    /// optimizer's state.
    pub fn memory(&self) -> ZeroMemory {
        let core = lock(&self.core);
        let bytes = |t: &Tensor| t.numel() * t.dtype().size_in_bytes();
        let persistent: usize = core
            .parts
            .iter()
            .filter(|p| p.persistent)
            .map(|p| p.numel * core.dtype.size_in_bytes())
            .sum();
        let mut m = ZeroMemory {
            params: core.shards.iter().map(bytes).sum::<usize>() + persistent + core.meter.live_bytes(),
            grads: core.grads.iter().flatten().map(bytes).sum(),
            optimizer: self.masters.iter().map(|p| bytes(&p.current())).sum(),
        };
        m.optimizer += self
            .inner
            .state_dict()
            .iter()
            .map(|(_, t)| bytes(t))
            .sum::<usize>();
        m
    }

    /// The most bytes of gathered parameter values live at once since the
    /// last [`Zero3::reset_gathered_peak`], measured through the allocator
    /// (every gathered value is charged to a meter when allocated and
    /// released when its buffer is freed): what stage 3 saves over holding
    /// the whole model.
    pub fn gathered_peak_bytes(&self) -> usize {
        lock(&self.core).meter.peak_bytes()
    }

    /// Starts a new peak of [`Zero3::gathered_peak_bytes`].
    pub fn reset_gathered_peak(&self) {
        lock(&self.core).meter.reset_peak();
    }

    /// The element range `[lo, hi)` of parameter `name` this rank holds
    /// (spec §3.3: `flat[r·ps .. min((r+1)·ps, numel)]`, zero-padded to
    /// `ps` in the shard) and `ps`; `None` for a name that is not a
    /// partitioned parameter.
    pub fn partition(&self, name: &str) -> Option<(usize, usize, usize)> {
        let core = lock(&self.core);
        let rank = core.comm.rank();
        core.parts.iter().find(|p| p.name == name).map(|p| {
            let lo = (rank * p.ps).min(p.numel);
            (lo, ((rank + 1) * p.ps).min(p.numel), p.ps)
        })
    }

    /// The first communication error the coordinator met, if any, as the
    /// communicator reported it (a forward that read a parameter while the
    /// gather failed returns it wrapped in a `tessera_tensor::Error` naming
    /// `Zero3::fetch`; this gives the original, with `is_fatal`).
    pub fn error(&self) -> Option<CommError> {
        lock(&self.core).error.clone()
    }

    /// The model's state dict gathered on every rank (a collective): each
    /// trainable parameter's full value by its name, loadable by the model
    /// on one process. Errors when communication fails.
    pub fn consolidated_model_state_dict(&self) -> Result<StateDict> {
        let mut core = lock(&self.core);
        let comm = core.idle_comm()?;
        let n = comm.world_size();
        let mut sd = StateDict::new();
        for p in &core.parts {
            let v = with_float_dtype!(core.dtype, T => {
                let shard = core.shards[p.group].as_slice::<T>()?;
                let mut all = vec![T::ZERO; n * p.ps];
                comm.all_gather_slice(&shard[p.offset..p.offset + p.ps], &mut all)?;
                all.truncate(p.numel);
                Tensor::from_vec(all, &p.param.shape())?
            }, else unreachable!("parameters are floating point"));
            sd.insert(&p.name, v);
        }
        Ok(sd)
    }
}

/// A copy with its own storage.
pub(super) fn copy(t: &Tensor) -> Result<Tensor> {
    with_float_dtype!(t.dtype(), T => Ok(Tensor::from_vec(t.contiguous()?.to_vec::<T>()?, t.shape())?),
        else unreachable!("parameters are floating point"))
}
