//! ZeRO-3 state independent of the world size (DeepSpeed's
//! `zero_to_fp32` for stage 3): every partitioned parameter's full value,
//! full master weights and full optimizer buffers, by parameter name. It is
//! gathered from a running job ([`Zero3::consolidated_state_dict`]) or read
//! from a sharded checkpoint by one process ([`consolidate_zero3_sharded`]),
//! and loads on any number of ranks ([`Zero3::load_consolidated`]).
//!
//! Keys: `model.<name>` (the parameter, in its dtype), `master.<name>`
//! (the f32 master, or the parameter's dtype for f32/f64 models),
//! `optimizer.<name>.<buffer>` (each per-element buffer of the inner
//! optimizer, e.g. Adam's `exp_avg`), all with the parameter's shape; the
//! inner optimizer's metadata (hyperparameters, step counts) under
//! `optimizer.`; the layout under `zero3.`.

use std::path::Path;

use tessera_tensor::{with_float_dtype, DType, Element, StateDict, Tensor};

use super::fetch::lock;
use super::stage3::{copy, Zero3};
use super::stage3_state::ZERO3_INDEX_FILE;
use crate::comm::CommExt;
use crate::error::{CommError, Result};

/// Where each partitioned parameter lives in the per-group flat shards:
/// what a sharded checkpoint records and consolidation needs.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Layout {
    pub names: Vec<String>,
    pub shapes: Vec<Vec<usize>>,
    /// Elements of each rank's piece (`⌈numel / n⌉`).
    pub ps: Vec<usize>,
    pub groups: Vec<usize>,
    pub offsets: Vec<usize>,
}

impl Layout {
    /// Records the layout in `sd` under `zero3.`.
    pub fn save(&self, sd: &mut StateDict) {
        sd.set("zero3.names", self.names.clone());
        sd.set("zero3.shapes", self.shapes.clone());
        sd.set("zero3.ps", self.ps.clone());
        sd.set("zero3.groups", self.groups.clone());
        sd.set("zero3.offsets", self.offsets.clone());
    }

    /// The layout recorded in `sd` by [`Layout::save`]. Errors naming `op`
    /// when an entry is missing or malformed, or the lists disagree in
    /// length.
    pub fn load(op: &'static str, sd: &StateDict) -> Result<Layout> {
        let l = Layout {
            names: sd.get(op, "zero3.names")?,
            shapes: sd.get(op, "zero3.shapes")?,
            ps: sd.get(op, "zero3.ps")?,
            groups: sd.get(op, "zero3.groups")?,
            offsets: sd.get(op, "zero3.offsets")?,
        };
        let n = l.names.len();
        if [l.shapes.len(), l.ps.len(), l.groups.len(), l.offsets.len()]
            .iter()
            .any(|&k| k != n)
        {
            return Err(CommError::arg(op, "the zero3 layout lists disagree in length"));
        }
        Ok(l)
    }

    fn numel(&self, i: usize) -> usize {
        self.shapes[i].iter().product()
    }
}

impl Zero3 {
    /// This run's layout.
    pub(super) fn layout(&self) -> Layout {
        let core = lock(&self.core);
        Layout {
            names: core.parts.iter().map(|p| p.name.clone()).collect(),
            shapes: core.parts.iter().map(|p| p.param.shape()).collect(),
            ps: core.parts.iter().map(|p| p.ps).collect(),
            groups: core.parts.iter().map(|p| p.group).collect(),
            offsets: core.parts.iter().map(|p| p.offset).collect(),
        }
    }

    /// The whole training state gathered on every rank (a collective), in
    /// the world-size-independent form of the module docs: loadable with
    /// [`Zero3::load_consolidated`] on any number of ranks, and its
    /// `model.` entries by the model on one process. Errors when
    /// communication fails.
    pub fn consolidated_state_dict(&self) -> Result<StateDict> {
        let layout = self.layout();
        let comm = lock(&self.core).idle_comm()?;
        let world = comm.world_size();
        let ours = self.own_pieces()?;
        assemble(&layout, &ours, |_, flat: &Tensor| {
            with_float_dtype!(flat.dtype(), T => {
                let local = flat.as_slice::<T>()?;
                let mut all = vec![T::ZERO; world * local.len()];
                comm.all_gather_slice(local, &mut all)?;
                split_ranks(all, world)
            }, else Err(CommError::arg("Zero3::consolidated_state_dict", format!("a {} buffer", flat.dtype()))))
        })
    }

    /// Restores a state from [`Zero3::consolidated_state_dict`] or
    /// [`consolidate_zero3_sharded`], written on any number of ranks: each
    /// rank keeps its piece of every parameter, master and optimizer
    /// buffer. Errors, changing nothing, when the parameters (names,
    /// shapes) differ from this model's, an entry is missing or has
    /// another dtype, or the inner optimizer refuses its state.
    pub fn load_consolidated(&mut self, sd: &StateDict) -> Result<()> {
        const OP: &str = "Zero3::load_consolidated";
        let layout = self.layout();
        let names: Vec<String> = sd.get(OP, "zero3.names")?;
        let shapes: Vec<Vec<usize>> = sd.get(OP, "zero3.shapes")?;
        if (&names, &shapes) != (&layout.names, &layout.shapes) {
            return Err(CommError::arg(
                OP,
                "the state holds other parameters (names or shapes) than this model's",
            ));
        }
        let rank = lock(&self.core).comm.rank();
        // Per group: the dtypes of this rank's parameter and master shards
        // and their length (what the restored pieces must match).
        let specs: Vec<(DType, DType, usize)> = {
            let core = lock(&self.core);
            core.shards
                .iter()
                .zip(&self.masters)
                .map(|(s, m)| (s.dtype(), m.dtype(), s.numel()))
                .collect()
        };
        // This rank's flat buffer of group g (`len` elements of `dtype`)
        // from the full tensors `key(name)`.
        let pieces = |g: usize, dtype: DType, len: usize, key: &dyn Fn(&str) -> String| -> Result<Tensor> {
            with_float_dtype!(dtype, T => {
                let mut flat = vec![T::ZERO; len];
                for (i, name) in layout.names.iter().enumerate().filter(|(i, _)| layout.groups[*i] == g) {
                    let k = key(name);
                    let t = sd.require_shape(OP, &k, &layout.shapes[i])?;
                    if t.dtype() != dtype {
                        return Err(CommError::arg(OP, format!("{k} is {}, not {dtype}", t.dtype())));
                    }
                    let v = t.contiguous()?.to_vec::<T>()?;
                    let (lo, hi) = ((rank * layout.ps[i]).min(v.len()), ((rank + 1) * layout.ps[i]).min(v.len()));
                    flat[layout.offsets[i]..layout.offsets[i] + hi - lo].copy_from_slice(&v[lo..hi]);
                }
                Ok(Tensor::from_vec(flat, &[len])?)
            }, else Err(CommError::arg(OP, format!("a {dtype} buffer"))))
        };
        let mut shards = Vec::new();
        let mut masters = Vec::new();
        let mut inner = StateDict::new();
        for (key, v) in sd.prefixed("optimizer").metadata() {
            inner.set(key.clone(), v.clone());
        }
        for (g, &(shard_dtype, master_dtype, len)) in specs.iter().enumerate() {
            shards.push(pieces(g, shard_dtype, len, &|n| format!("model.{n}"))?);
            masters.push(pieces(g, master_dtype, len, &|n| format!("master.{n}"))?);
            // The buffers are named by the state itself (a fresh inner
            // optimizer has none before its first step).
            let Some(first) = (0..layout.names.len()).find(|&i| layout.groups[i] == g) else {
                continue;
            };
            let prefix = format!("optimizer.{}.", layout.names[first]);
            let bufs: Vec<(String, DType)> = sd
                .iter()
                .filter_map(|(k, t)| k.strip_prefix(&prefix).map(|b| (b.to_string(), t.dtype())))
                .filter(|(b, _)| !b.contains('.'))
                .collect();
            for (buf, dtype) in bufs {
                let flat = pieces(g, dtype, len, &|n| format!("optimizer.{n}.{buf}"))?;
                inner.insert(format!("state.{g}.{buf}"), flat);
            }
        }
        self.inner.load_state_dict(&inner)?;
        for (m, t) in self.masters.iter().zip(masters) {
            m.set(t)?;
        }
        let mut core = lock(&self.core);
        core.release_all()?;
        core.shards = shards;
        core.refresh_persistent()
    }

    /// This rank's flat shards, masters and inner optimizer buffers.
    fn own_pieces(&self) -> Result<Pieces> {
        let shards = lock(&self.core).shards.iter().map(copy).collect::<Result<_>>()?;
        let masters = self
            .masters
            .iter()
            .map(|m| m.tensor())
            .collect::<tessera_tensor::Result<_>>()?;
        let meta = self.inner.state_dict();
        Ok(Pieces {
            shards,
            masters,
            buffers: group_buffers(&meta, self.masters.len()),
            meta,
        })
    }
}

/// The unsharded state (see the module docs) of a ZeRO-3 sharded
/// checkpoint in `dir`, read by one process without communication; it
/// loads on any number of ranks with [`Zero3::load_consolidated`]. Errors
/// when a file is missing or corrupt, was written before checkpoints
/// recorded their layout, or the files disagree.
pub fn consolidate_zero3_sharded(dir: &Path) -> Result<StateDict> {
    const OP: &str = "consolidate_zero3_sharded";
    let index = StateDict::load(dir.join(ZERO3_INDEX_FILE))?;
    let files: Vec<String> = index.get(OP, "zero3.files")?;
    let shards = files
        .iter()
        .map(|f| StateDict::load(dir.join(f)))
        .collect::<tessera_tensor::Result<Vec<_>>>()?;
    let first = shards
        .first()
        .ok_or_else(|| CommError::arg(OP, format!("{}: the index lists no files", dir.display())))?;
    let layout = Layout::load(OP, first)?;
    for (r, sd) in shards.iter().enumerate() {
        if Layout::load(OP, sd)? != layout {
            return Err(CommError::arg(
                OP,
                format!("{}: shard {r} records another layout than shard 0", dir.display()),
            ));
        }
    }
    let groups = layout.groups.iter().max().map_or(0, |g| g + 1);
    let inner0 = first.prefixed("optimizer");
    let piece = |r: usize, key: &str| -> Result<Tensor> {
        shards[r]
            .tensor(key)
            .cloned()
            .ok_or_else(|| CommError::arg(OP, format!("{}: shard {r} lacks {key}", dir.display())))
    };
    let ours = Pieces {
        shards: (0..groups)
            .map(|g| piece(0, &format!("zero3.shard.{g}")))
            .collect::<Result<_>>()?,
        masters: (0..groups)
            .map(|g| piece(0, &format!("zero3.master.{g}")))
            .collect::<Result<_>>()?,
        buffers: group_buffers(&inner0, groups),
        meta: inner0,
    };
    assemble(&layout, &ours, |key, _| {
        (0..shards.len()).map(|r| piece(r, key)).collect()
    })
}

/// One rank's flat buffers, per optimizer group: parameter shard, master
/// shard, the inner optimizer's per-element buffers by name; and the inner
/// optimizer's state dict (for its metadata).
struct Pieces {
    shards: Vec<Tensor>,
    masters: Vec<Tensor>,
    buffers: Vec<Vec<(String, Tensor)>>,
    meta: StateDict,
}

/// The per-element buffers `state.<g>.<buffer>` of an inner optimizer's
/// state dict (one master parameter per group), by group.
fn group_buffers(inner: &StateDict, groups: usize) -> Vec<Vec<(String, Tensor)>> {
    (0..groups)
        .map(|g| {
            let prefix = format!("state.{g}.");
            inner
                .iter()
                .filter_map(|(k, t)| k.strip_prefix(&prefix).map(|b| (b.to_string(), t.clone())))
                .collect()
        })
        .collect()
}

/// The consolidated state from one rank's pieces and `ranks(key, flat)`,
/// which returns every rank's version (rank order) of the piece `flat`,
/// named `key` as in a shard file.
fn assemble(
    layout: &Layout,
    ours: &Pieces,
    mut ranks: impl FnMut(&str, &Tensor) -> Result<Vec<Tensor>>,
) -> Result<StateDict> {
    let mut out = StateDict::new();
    for (key, v) in ours.meta.metadata() {
        out.set(format!("optimizer.{key}"), v.clone());
    }
    out.set("zero3.names", layout.names.clone());
    out.set("zero3.shapes", layout.shapes.clone());
    let mut put = |source: String, flat: &Tensor, g: usize, key: &dyn Fn(&str) -> String| -> Result<()> {
        let all = ranks(&source, flat)?;
        for i in (0..layout.names.len()).filter(|&i| layout.groups[i] == g) {
            let (ps, off, numel) = (layout.ps[i], layout.offsets[i], layout.numel(i));
            let parts: Vec<Tensor> = all
                .iter()
                .map(|t| t.narrow(0, off, ps))
                .collect::<tessera_tensor::Result<_>>()?;
            let whole = Tensor::cat(&parts, 0)?;
            out.insert(
                key(&layout.names[i]),
                copy(&whole.narrow(0, 0, numel)?.view(layout.shapes[i].as_slice())?)?,
            );
        }
        Ok(())
    };
    for g in 0..ours.shards.len() {
        put(format!("zero3.shard.{g}"), &ours.shards[g], g, &|n| {
            format!("model.{n}")
        })?;
        put(format!("zero3.master.{g}"), &ours.masters[g], g, &|n| {
            format!("master.{n}")
        })?;
        for (buf, t) in &ours.buffers[g] {
            put(format!("optimizer.state.{g}.{buf}"), t, g, &|n| {
                format!("optimizer.{n}.{buf}")
            })?;
        }
    }
    Ok(out)
}

/// `all` (every rank's equal-length piece, rank order) as one tensor per rank.
fn split_ranks<T: Element>(all: Vec<T>, world: usize) -> Result<Vec<Tensor>> {
    let n = all.len() / world.max(1);
    let whole = Tensor::from_vec(all, &[n * world])?;
    (0..world).map(|r| Ok(whole.narrow(0, r * n, n)?)).collect()
}
