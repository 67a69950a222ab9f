//! The parameter coordinator of ZeRO stage 3 (DeepSpeed's
//! `partitioned_param_coordinator.py`, spec §3.3): which module's
//! parameters are gathered, when they are freed, and the reduce-scatter of
//! their gradients.
//!
//! Every rank holds, per parameter, its shard of `ps = ⌈numel / n⌉`
//! elements (the parameter zero-padded to `n · ps`). The parameters of one
//! module form a *unit*, gathered with one coalesced all-gather. The
//! parameters themselves carry a fetch hook ([`Parameter::set_fetch_hook`])
//! and are released between uses, so the coordinator runs where the
//! values are read:
//! - forward: a module reading a released parameter gathers its unit,
//!   releases the units gathered before it (their forward is over) and,
//!   from the second step on, launches the all-gather of the next unit of
//!   the recorded trace, which runs on the communication thread while this
//!   module computes (DeepSpeed's prefetch);
//! - backward: a node that saved a parameter reads it by reference
//!   ([`tessera_autograd::Saved`]) when it runs, which gathers its unit
//!   again and launches the gather of the unit before it in the trace (the
//!   next one backward reaches); a unit is released, and its gradients
//!   reduce-scattered (pre-divided by n, the chunks of its parameters
//!   interleaved rank by rank, one collective, on the communication
//!   thread while backward goes on), as soon as all of them are final.
//!
//! Parameters of at most the persistence threshold's elements (DeepSpeed's
//! `stage3_param_persistence_threshold`) are *persistent*: they stay
//! gathered on every rank, have no fetch hook, and are gathered once after
//! each step instead of twice per step; their gradients and optimizer
//! state are partitioned like the others'.
//!
//! Every collective of the coordinator runs on its communication thread,
//! in the order the hooks submit them: every rank reads the parameters in
//! the same order (the same model and graph), so the collectives match.
//! Results are applied on the reading thread, in submission order, under
//! the coordinator's lock.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tessera_autograd::Parameter;
use tessera_tensor::{with_float_dtype, DType, Element, MemoryMeter, Tensor};

use super::comm_thread::{CommThread, Pending};
use crate::comm::{CommExt, Communicator};
use crate::error::{CommError, Result};
use crate::ReduceOp;

/// One partitioned parameter.
pub(crate) struct Part {
    /// The parameter's dotted name in the model.
    pub name: String,
    pub param: Parameter,
    pub numel: usize,
    /// Elements of each rank's shard (`⌈numel / n⌉`).
    pub ps: usize,
    /// The optimizer group it belongs to and its offset in that group's
    /// flat shard.
    pub group: usize,
    pub offset: usize,
    pub unit: usize,
    /// Stays gathered (see the module docs).
    pub persistent: bool,
}

/// Where a unit's released parameters are.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Status {
    Released,
    /// An all-gather of them is queued or running.
    Inflight,
    Available,
}

/// The parameters of one module, gathered and released together.
pub(crate) struct Unit {
    pub name: String,
    pub parts: Vec<usize>,
    pub status: Status,
    /// Final gradients received in the current backward, per part.
    grads: Vec<Option<Tensor>>,
    reduced: bool,
}

/// A collective submitted to the communication thread and not yet applied.
enum Inflight {
    /// The values of `parts`, making `units` available.
    Gather {
        units: Vec<usize>,
        parts: Vec<usize>,
        values: Pending<Vec<Tensor>>,
    },
    /// This rank's averaged slices of the gradients of `parts`.
    Reduce {
        parts: Vec<usize>,
        mine: Pending<Tensor>,
    },
}

/// The most forward passes' worth of units the trace keeps.
const TRACE_CAP: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Forward,
    Backward,
}

/// What the hooks share with [`super::Zero3`].
pub(crate) struct Core {
    pub comm: Arc<dyn Communicator>,
    pub dtype: DType,
    pub parts: Vec<Part>,
    pub units: Vec<Unit>,
    /// Each optimizer group's flat shard (this rank's slices of its
    /// parameters, in order).
    pub shards: Vec<Tensor>,
    /// Each group's averaged gradient shard, summed over the backward
    /// passes since the last step.
    pub grads: Vec<Option<Tensor>>,
    pub phase: Phase,
    /// Units in the order this step's forward gathered them.
    pub trace: Vec<usize>,
    /// The previous step's trace, which forward prefetches from.
    pub frozen: Vec<usize>,
    /// Launch the gather of the unit read next ahead of its use.
    prefetch: bool,
    worker: CommThread,
    inflight: VecDeque<Inflight>,
    /// The first communication error: every later call reports it.
    pub error: Option<CommError>,
    /// Elements communicated since the counter was last taken.
    pub comm_elements: usize,
    /// Charged with the gathered parameter values.
    pub meter: MemoryMeter,
}

/// Locks the coordinator. A panic in a hook cannot leave a state later
/// calls rely on half-written (statuses are set after their collective),
/// so a poisoned lock is still usable.
pub(crate) fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs the gradient hooks on every partitioned parameter and the
/// fetch hooks on the ones that are not persistent. They hold weak handles
/// and do nothing once the coordinator is gone.
pub(crate) fn install_hooks(core: &Arc<Mutex<Core>>) -> Result<()> {
    let params: Vec<(usize, usize, bool, Parameter)> = lock(core)
        .parts
        .iter()
        .enumerate()
        .map(|(i, p)| (i, p.unit, p.persistent, p.param.clone()))
        .collect();
    for (i, unit, persistent, p) in params {
        let weak: Weak<Mutex<Core>> = Arc::downgrade(core);
        p.var()?.register_hook(move |g| {
            if let Some(c) = weak.upgrade() {
                let mut c = lock(&c);
                if let Err(e) = c.on_grad(i, g) {
                    c.error.get_or_insert(e);
                }
            }
        })?;
        if persistent {
            continue;
        }
        let weak = Arc::downgrade(core);
        p.set_fetch_hook(Some(Arc::new(move || {
            let c = weak.upgrade().ok_or_else(|| {
                tessera_tensor::Error::arg(
                    "Zero3",
                    "the ZeRO-3 optimizer that partitioned this parameter was dropped",
                )
            })?;
            let mut c = lock(&c);
            c.fetch(unit).map_err(|e| {
                tessera_tensor::Error::io("Zero3::fetch", format!("gathering the parameters failed: {e}"))
            })
        })));
    }
    Ok(())
}

impl Core {
    /// A coordinator over `parts` grouped in `units` (from [`units_of`],
    /// every unit available: the caller releases them once the hooks are
    /// installed). Errors when the communication thread cannot start.
    pub fn new(
        comm: Arc<dyn Communicator>,
        dtype: DType,
        parts: Vec<Part>,
        units: Vec<Unit>,
        shards: Vec<Tensor>,
        prefetch: bool,
    ) -> Result<Core> {
        Ok(Core {
            worker: CommThread::spawn(&format!("tessera-zero3-r{}", comm.rank()))?,
            comm,
            dtype,
            parts,
            units,
            grads: vec![None; shards.len()],
            shards,
            phase: Phase::Forward,
            trace: Vec::new(),
            frozen: Vec::new(),
            prefetch,
            inflight: VecDeque::new(),
            error: None,
            comm_elements: 0,
            meter: MemoryMeter::new(),
        })
    }

    /// Errors with the first communication error, if any.
    pub fn check(&self) -> Result<()> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// The communicator, once every submitted collective has been applied
    /// (a collective on it from this thread would otherwise race the
    /// communication thread's). Errors with the first communication error.
    pub fn idle_comm(&mut self) -> Result<Arc<dyn Communicator>> {
        self.settle(None)?;
        Ok(self.comm.clone())
    }

    /// Makes unit `u` available, as the phase says (module docs).
    fn fetch(&mut self, u: usize) -> Result<()> {
        self.check()?;
        let next = match self.phase {
            Phase::Forward => {
                if self.trace.last() != Some(&u) {
                    // Forward passes without a backward (evaluation) would
                    // grow the trace forever; backward only needs the
                    // latest pass.
                    if self.trace.len() >= TRACE_CAP * self.units.len().max(1) {
                        self.trace.drain(..self.trace.len() / 2);
                    }
                    self.trace.push(u);
                }
                let pos = self.trace.len() - 1;
                let next = (self.frozen.get(pos) == Some(&u))
                    .then(|| self.frozen.get(pos + 1).copied())
                    .flatten()
                    .filter(|&v| v != u);
                for v in 0..self.units.len() {
                    if v != u && Some(v) != next {
                        self.release(v)?;
                    }
                }
                next
            }
            Phase::Backward => self
                .trace
                .iter()
                .rposition(|&v| v == u)
                .and_then(|p| p.checked_sub(1))
                .map(|p| self.trace[p])
                .filter(|&v| v != u && !self.units[v].reduced),
        };
        let r = (|| {
            if self.units[u].status == Status::Released {
                self.launch_gather(&[u])?;
            }
            if self.units[u].status == Status::Inflight {
                self.settle(Some(u))?;
            }
            match next {
                Some(v) if self.prefetch && self.units[v].status == Status::Released => {
                    self.launch_gather(&[v])
                }
                _ => Ok(()),
            }
        })();
        self.record(r)
    }

    /// Keeps the first error.
    fn record<R>(&mut self, r: Result<R>) -> Result<R> {
        if let Err(e) = &r {
            self.error.get_or_insert(e.clone());
            self.inflight.clear();
        }
        r
    }

    /// Submits one all-gather of the shards of `units`' gathered (not
    /// persistent) parameters; they are set when the result is applied.
    fn launch_gather(&mut self, units: &[usize]) -> Result<()> {
        let parts: Vec<usize> = units
            .iter()
            .flat_map(|&u| self.units[u].parts.iter().copied())
            .filter(|&i| !self.parts[i].persistent)
            .collect();
        let values = self.submit_gather(&parts, true)?;
        for &u in units {
            self.units[u].status = Status::Inflight;
        }
        self.inflight.push_back(Inflight::Gather {
            units: units.to_vec(),
            parts,
            values,
        });
        Ok(())
    }

    /// Submits the all-gather of `parts`' shards (charged to the meter when
    /// `charge`); its result is their full values, in order.
    fn submit_gather(&mut self, parts: &[usize], charge: bool) -> Result<Pending<Vec<Tensor>>> {
        let n = self.comm.world_size();
        let per_rank: usize = parts.iter().map(|&i| self.parts[i].ps).sum();
        let layout: Vec<(usize, usize, Vec<usize>)> = parts
            .iter()
            .map(|&i| (self.parts[i].numel, self.parts[i].ps, self.parts[i].param.shape()))
            .collect();
        let mine = with_float_dtype!(self.dtype, T => {
            let mut mine: Vec<T> = Vec::with_capacity(per_rank);
            for &i in parts {
                let p = &self.parts[i];
                let shard = self.shards[p.group].as_slice::<T>()?;
                mine.extend_from_slice(&shard[p.offset..p.offset + p.ps]);
            }
            Tensor::from_vec(mine, &[per_rank])?
        }, else unreachable!("parameters are floating point"));
        self.comm_elements += n * per_rank;
        let (comm, dtype) = (self.comm.clone(), self.dtype);
        let meter = charge.then(|| self.meter.clone());
        Ok(self.worker.submit(move || {
            let _charged = meter.as_ref().map(MemoryMeter::enter);
            with_float_dtype!(dtype, T => {
                let mut all = vec![T::ZERO; n * per_rank];
                comm.all_gather_slice(mine.as_slice::<T>()?, &mut all)?;
                let mut at = 0;
                let mut values = Vec::with_capacity(layout.len());
                for (numel, ps, shape) in layout {
                    let mut full: Vec<T> = Vec::with_capacity(n * ps);
                    for r in 0..n {
                        full.extend_from_slice(&all[r * per_rank + at..r * per_rank + at + ps]);
                    }
                    full.truncate(numel);
                    at += ps;
                    values.push(Tensor::from_vec(full, &shape)?);
                }
                Ok(values)
            }, else unreachable!("parameters are floating point"))
        }))
    }

    /// Applies submitted collectives in order: until the gather of unit `u`
    /// is applied, or all of them for `None`.
    fn settle(&mut self, u: Option<usize>) -> Result<()> {
        self.check()?;
        let r = (|| {
            while let Some(job) = self.inflight.pop_front() {
                let done = match job {
                    Inflight::Gather { units, parts, values } => {
                        for (&i, v) in parts.iter().zip(values.wait()?) {
                            self.parts[i].param.set(v)?;
                        }
                        for &v in &units {
                            self.units[v].status = Status::Available;
                        }
                        u.is_some_and(|u| units.contains(&u))
                    }
                    Inflight::Reduce { parts, mine } => {
                        self.accumulate(&parts, &mine.wait()?)?;
                        false
                    }
                };
                if done {
                    break;
                }
            }
            Ok(())
        })();
        self.record(r)
    }

    /// Frees the gathered values of unit `u` (waiting for its gather first
    /// when one is in flight).
    pub fn release(&mut self, u: usize) -> Result<()> {
        if self.units[u].status == Status::Inflight {
            self.settle(Some(u))?;
        }
        let gathered = self.units[u].parts.iter().any(|&i| !self.parts[i].persistent);
        if self.units[u].status == Status::Available && gathered {
            for &i in &self.units[u].parts {
                if !self.parts[i].persistent {
                    self.parts[i].param.release_()?;
                }
            }
            self.units[u].status = Status::Released;
        }
        Ok(())
    }

    /// Releases every unit.
    pub fn release_all(&mut self) -> Result<()> {
        (0..self.units.len()).try_for_each(|u| self.release(u))
    }

    /// Sets the persistent parameters to the full values of their shards
    /// (one all-gather): after a step or a restored checkpoint.
    pub fn refresh_persistent(&mut self) -> Result<()> {
        self.settle(None)?;
        let parts: Vec<usize> = (0..self.parts.len())
            .filter(|&i| self.parts[i].persistent)
            .collect();
        if parts.is_empty() {
            return Ok(());
        }
        let r = self.submit_gather(&parts, false).and_then(Pending::wait);
        for (&i, v) in parts.iter().zip(self.record(r)?) {
            self.parts[i].param.set(v)?;
        }
        Ok(())
    }

    /// Starts a backward pass.
    pub fn begin_backward(&mut self) -> Result<()> {
        self.settle(None)?;
        self.release_all()?;
        self.phase = Phase::Backward;
        for u in &mut self.units {
            u.grads.iter_mut().for_each(|g| *g = None);
            u.reduced = false;
        }
        Ok(())
    }

    /// Ends a backward pass: reduces the units some of whose parameters got
    /// no gradient (as zeros, so every rank makes the same collectives),
    /// waits for every reduction, releases everything and starts the next
    /// forward's trace.
    pub fn end_backward(&mut self) -> Result<()> {
        let r = (|| {
            self.check()?;
            for u in 0..self.units.len() {
                if !self.units[u].reduced {
                    self.launch_reduce(u)?;
                }
            }
            self.settle(None)?;
            self.release_all()
        })();
        self.phase = Phase::Forward;
        self.frozen = std::mem::take(&mut self.trace);
        self.record(r)
    }

    /// A parameter's final gradient: once its unit has all of them, the
    /// unit's reduce-scatter is launched and the unit released.
    fn on_grad(&mut self, i: usize, g: &Tensor) -> Result<()> {
        if self.phase != Phase::Backward || self.error.is_some() {
            return Ok(());
        }
        let u = self.parts[i].unit;
        let k = self.units[u]
            .parts
            .iter()
            .position(|&p| p == i)
            .expect("part of its unit");
        self.units[u].grads[k] = Some(g.clone());
        if self.units[u].grads.iter().all(Option::is_some) {
            self.launch_reduce(u)?;
            self.release(u)?;
        }
        Ok(())
    }

    /// Submits the reduce-scatter of unit `u`'s gradients (zeros where
    /// missing); applying it adds this rank's averaged slices to the
    /// gradient shards.
    fn launch_reduce(&mut self, u: usize) -> Result<()> {
        let n = self.comm.world_size();
        let parts = self.units[u].parts.clone();
        let grads: Vec<Option<Tensor>> = self.units[u].grads.iter_mut().map(Option::take).collect();
        let sizes: Vec<usize> = parts.iter().map(|&i| self.parts[i].ps).collect();
        let per_rank: usize = sizes.iter().sum();
        let (comm, dtype) = (self.comm.clone(), self.dtype);
        let mine = self.worker.submit(move || {
            with_float_dtype!(dtype, T => {
                let flat: Vec<Vec<T>> = sizes
                    .iter()
                    .zip(&grads)
                    .map(|(&ps, g)| -> Result<Vec<T>> {
                        let mut v = match g {
                            Some(g) => g.to_dtype(dtype)?.contiguous()?.to_vec::<T>()?,
                            None => Vec::new(),
                        };
                        v.resize(n * ps, T::ZERO);
                        // DeepSpeed pre-divides by the world size.
                        v.iter_mut().for_each(|x| *x = T::from_f64(x.to_f64() / n as f64));
                        Ok(v)
                    })
                    .collect::<Result<_>>()?;
                drop(grads);
                let mut send: Vec<T> = Vec::with_capacity(n * per_rank);
                for r in 0..n {
                    for (&ps, v) in sizes.iter().zip(&flat) {
                        send.extend_from_slice(&v[r * ps..(r + 1) * ps]);
                    }
                }
                drop(flat);
                let mut mine = vec![T::ZERO; per_rank];
                comm.reduce_scatter_slice(&send, &mut mine, ReduceOp::Sum)?;
                Ok(Tensor::from_vec(mine, &[per_rank])?)
            }, else unreachable!("parameters are floating point"))
        });
        self.comm_elements += n * per_rank;
        self.units[u].reduced = true;
        self.inflight.push_back(Inflight::Reduce { parts, mine });
        Ok(())
    }

    /// Adds the reduced slices `mine` of `parts` to the gradient shards.
    fn accumulate(&mut self, parts: &[usize], mine: &Tensor) -> Result<()> {
        with_float_dtype!(self.dtype, T => {
            let mine = mine.as_slice::<T>()?;
            let mut at = 0;
            for &i in parts {
                let (g, off, ps) = (self.parts[i].group, self.parts[i].offset, self.parts[i].ps);
                let mut acc = match self.grads[g].take() {
                    Some(t) => t,
                    None => Tensor::zeros(&[self.shards[g].numel()], self.dtype)?,
                };
                let dst = acc.make_mut::<T>()?;
                for (d, s) in dst[off..off + ps].iter_mut().zip(&mine[at..at + ps]) {
                    *d = T::from_f64(d.to_f64() + s.to_f64());
                }
                self.grads[g] = Some(acc);
                at += ps;
            }
        }, else unreachable!("parameters are floating point"));
        Ok(())
    }
}

/// A unit per module: the parameters sharing a name up to the last dot,
/// in order of first appearance.
pub(crate) fn units_of(names: &[String]) -> Vec<Unit> {
    let mut units: Vec<Unit> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let module = name.rsplit_once('.').map_or("", |(m, _)| m);
        match units.iter_mut().find(|u| u.name == module) {
            Some(u) => u.parts.push(i),
            None => units.push(Unit {
                name: module.to_string(),
                parts: vec![i],
                status: Status::Available,
                grads: Vec::new(),
                reduced: false,
            }),
        }
    }
    for u in &mut units {
        u.grads = vec![None; u.parts.len()];
    }
    units
}
