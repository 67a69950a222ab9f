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
//!   from the second step on, prefetches the next unit of the recorded
//!   trace in the same all-gather;
//! - backward: a node that saved a parameter reads it by reference
//!   ([`tessera_autograd::Saved`]) when it runs, which gathers its unit
//!   again together with the unit before it in the trace (the next one
//!   backward reaches); a unit is released, and its gradients
//!   reduce-scattered (pre-divided by n, the chunks of its parameters
//!   interleaved rank by rank, one collective), as soon as all of them are
//!   final.
//!
//! Communication runs on the thread that reads the parameter, under the
//! coordinator's lock: every rank reads in the same order (the same model
//! and graph), so the collectives match.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tessera_autograd::Parameter;
use tessera_tensor::{with_float_dtype, DType, Element, MemoryMeter, Tensor};

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
}

/// The parameters of one module, gathered and released together.
pub(crate) struct Unit {
    pub name: String,
    pub parts: Vec<usize>,
    pub available: bool,
    /// Final gradients received in the current backward, per part.
    grads: Vec<Option<Tensor>>,
    reduced: bool,
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

/// Installs the fetch and gradient hooks on every partitioned parameter.
/// They hold weak handles and do nothing once the coordinator is gone.
pub(crate) fn install_hooks(core: &Arc<Mutex<Core>>) -> Result<()> {
    let params: Vec<(usize, usize, Parameter)> = lock(core)
        .parts
        .iter()
        .enumerate()
        .map(|(i, p)| (i, p.unit, p.param.clone()))
        .collect();
    for (i, unit, p) in params {
        let weak: Weak<Mutex<Core>> = Arc::downgrade(core);
        p.var().register_hook(move |g| {
            if let Some(c) = weak.upgrade() {
                let mut c = lock(&c);
                if let Err(e) = c.on_grad(i, g) {
                    c.error.get_or_insert(e);
                }
            }
        })?;
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
    /// Errors with the first communication error, if any.
    pub fn check(&self) -> Result<()> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Makes unit `u` available, as the phase says (module docs).
    fn fetch(&mut self, u: usize) -> Result<()> {
        self.check()?;
        let mut want = vec![u];
        match self.phase {
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
                    .flatten();
                want.extend(next.filter(|&v| v != u));
                let keep = want.clone();
                for v in 0..self.units.len() {
                    if !keep.contains(&v) {
                        self.release(v)?;
                    }
                }
            }
            Phase::Backward => {
                let prev = self
                    .trace
                    .iter()
                    .rposition(|&v| v == u)
                    .and_then(|p| p.checked_sub(1))
                    .map(|p| self.trace[p]);
                want.extend(prev.filter(|&v| v != u && !self.units[v].reduced));
            }
        }
        want.retain(|&v| !self.units[v].available);
        if want.is_empty() {
            return Ok(());
        }
        let r = self.gather(&want);
        if let Err(e) = &r {
            self.error.get_or_insert(e.clone());
        }
        r
    }

    /// One all-gather of the shards of `units`' parameters; sets their
    /// values.
    fn gather(&mut self, units: &[usize]) -> Result<()> {
        let n = self.comm.world_size();
        let parts: Vec<usize> = units
            .iter()
            .flat_map(|&u| self.units[u].parts.iter().copied())
            .collect();
        let per_rank: usize = parts.iter().map(|&i| self.parts[i].ps).sum();
        let _charged = self.meter.enter();
        let values = with_float_dtype!(self.dtype, T => {
            let mut mine: Vec<T> = Vec::with_capacity(per_rank);
            for &i in &parts {
                let p = &self.parts[i];
                let shard = self.shards[p.group].as_slice::<T>()?;
                mine.extend_from_slice(&shard[p.offset..p.offset + p.ps]);
            }
            let mut all = vec![T::ZERO; n * per_rank];
            self.comm.all_gather_slice(&mine, &mut all)?;
            let mut at = 0;
            let mut values = Vec::with_capacity(parts.len());
            for &i in &parts {
                let p = &self.parts[i];
                let mut full: Vec<T> = Vec::with_capacity(n * p.ps);
                for r in 0..n {
                    full.extend_from_slice(&all[r * per_rank + at..r * per_rank + at + p.ps]);
                }
                full.truncate(p.numel);
                at += p.ps;
                values.push(Tensor::from_vec(full, &p.param.shape())?);
            }
            values
        }, else unreachable!("parameters are floating point"));
        self.comm_elements += n * per_rank;
        for (&i, v) in parts.iter().zip(values) {
            self.parts[i].param.set(v)?;
        }
        for &u in units {
            self.units[u].available = true;
        }
        Ok(())
    }

    /// Frees the gathered values of unit `u`.
    pub fn release(&mut self, u: usize) -> Result<()> {
        if self.units[u].available {
            for &i in &self.units[u].parts {
                self.parts[i].param.release_()?;
            }
            self.units[u].available = false;
        }
        Ok(())
    }

    /// Releases every unit.
    pub fn release_all(&mut self) -> Result<()> {
        (0..self.units.len()).try_for_each(|u| self.release(u))
    }

    /// Starts a backward pass.
    pub fn begin_backward(&mut self) -> Result<()> {
        self.check()?;
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
    /// releases everything and starts the next forward's trace.
    pub fn end_backward(&mut self) -> Result<()> {
        let r = (|| {
            self.check()?;
            for u in 0..self.units.len() {
                if !self.units[u].reduced {
                    self.reduce_unit(u)?;
                }
            }
            self.release_all()
        })();
        self.phase = Phase::Forward;
        self.frozen = std::mem::take(&mut self.trace);
        if let Err(e) = &r {
            self.error.get_or_insert(e.clone());
        }
        r
    }

    /// A parameter's final gradient: once its unit has all of them, the
    /// unit is reduce-scattered and released.
    fn on_grad(&mut self, i: usize, g: &Tensor) -> Result<()> {
        if self.phase != Phase::Backward || self.error.is_some() {
            return Ok(());
        }
        let (u, k) = {
            let unit = self.parts[i].unit;
            let k = self.units[unit]
                .parts
                .iter()
                .position(|&p| p == i)
                .expect("part of its unit");
            (unit, k)
        };
        self.units[u].grads[k] = Some(g.clone());
        if self.units[u].grads.iter().all(Option::is_some) {
            self.reduce_unit(u)?;
            self.release(u)?;
        }
        Ok(())
    }

    /// Reduce-scatters unit `u`'s gradients (zeros where missing) and adds
    /// this rank's averaged slices to the gradient shards.
    fn reduce_unit(&mut self, u: usize) -> Result<()> {
        let n = self.comm.world_size();
        let parts = self.units[u].parts.clone();
        let grads: Vec<Option<Tensor>> = self.units[u].grads.iter_mut().map(Option::take).collect();
        let per_rank: usize = parts.iter().map(|&i| self.parts[i].ps).sum();
        with_float_dtype!(self.dtype, T => {
            let flat: Vec<Vec<T>> = parts
                .iter()
                .zip(&grads)
                .map(|(&i, g)| -> Result<Vec<T>> {
                    let p = &self.parts[i];
                    let mut v = match g {
                        Some(g) => g.to_dtype(self.dtype)?.contiguous()?.to_vec::<T>()?,
                        None => Vec::new(),
                    };
                    v.resize(n * p.ps, T::ZERO);
                    // DeepSpeed pre-divides by the world size.
                    v.iter_mut().for_each(|x| *x = T::from_f64(x.to_f64() / n as f64));
                    Ok(v)
                })
                .collect::<Result<_>>()?;
            let mut send: Vec<T> = Vec::with_capacity(n * per_rank);
            for r in 0..n {
                for (&i, v) in parts.iter().zip(&flat) {
                    let ps = self.parts[i].ps;
                    send.extend_from_slice(&v[r * ps..(r + 1) * ps]);
                }
            }
            drop(flat);
            let mut mine = vec![T::ZERO; per_rank];
            self.comm.reduce_scatter_slice(&send, &mut mine, ReduceOp::Sum)?;
            let mut at = 0;
            for &i in &parts {
                let (g, off, ps) = (self.parts[i].group, self.parts[i].offset, self.parts[i].ps);
                let len = self.shards[g].numel();
                let acc = match self.grads[g].take() {
                    Some(t) => t,
                    None => Tensor::zeros(&[len], self.dtype)?,
                };
                let mut acc = acc;
                let dst = acc.make_mut::<T>()?;
                for (d, s) in dst[off..off + ps].iter_mut().zip(&mine[at..at + ps]) {
                    *d = T::from_f64(d.to_f64() + s.to_f64());
                }
                self.grads[g] = Some(acc);
                at += ps;
            }
        }, else unreachable!("parameters are floating point"));
        self.comm_elements += n * per_rank;
        self.units[u].reduced = true;
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
                available: true,
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
