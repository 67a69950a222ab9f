//! The optimizer state of a ZeRO run: gathered into one unsharded state
//! dict (what the wrapped optimizer would hold on one process) and back,
//! and sharded checkpoints (one file per rank plus an index) that resume
//! on the same world size and consolidate offline to any other.

use std::path::Path;

use tessera_tensor::{with_float_dtype, Element, StateDict, Tensor};

use super::ZeroOptimizer;
use crate::comm::{CommExt, Communicator};
use crate::error::{CommError, Result};

/// The name of a sharded checkpoint's index file.
pub const INDEX_FILE: &str = "zero_index.safetensors";

/// The file of rank `rank` of `world` in a sharded checkpoint.
pub fn shard_file(rank: usize, world: usize) -> String {
    format!("zero_shard_{rank:05}_of_{world:05}.safetensors")
}

/// What places a group's flat partitions in the unsharded state: each
/// parameter's index in the wrapped optimizer (`state.{k}`), shape and
/// flat offset, the flat length and the group's parameter count.
#[derive(Debug, Clone, PartialEq)]
struct GroupInfo {
    index: Vec<usize>,
    shapes: Vec<Vec<usize>>,
    offsets: Vec<usize>,
    len: usize,
    group_len: usize,
}

impl GroupInfo {
    fn save(&self, g: usize, sd: &mut StateDict) {
        sd.set(format!("zero.group.{g}.index"), self.index.clone());
        sd.set(format!("zero.group.{g}.shapes"), self.shapes.clone());
        sd.set(format!("zero.group.{g}.offsets"), self.offsets.clone());
        sd.set(format!("zero.group.{g}.len"), self.len);
        sd.set(format!("zero.group.{g}.group_len"), self.group_len);
    }

    fn load(op: &'static str, g: usize, sd: &StateDict) -> Result<GroupInfo> {
        let key = |f: &str| format!("zero.group.{g}.{f}");
        Ok(GroupInfo {
            index: sd.get(op, &key("index"))?,
            shapes: sd.get(op, &key("shapes"))?,
            offsets: sd.get(op, &key("offsets"))?,
            len: sd.get(op, &key("len"))?,
            group_len: sd.get(op, &key("group_len"))?,
        })
    }
}

impl ZeroOptimizer<'_> {
    /// The optimizer state gathered from every rank's partitions into the
    /// state dict of the wrapped optimizer on one process (DeepSpeed's
    /// `zero_to_fp32`): per-parameter buffers with the parameters' shapes
    /// (padding dropped), step counts and hyperparameters, loadable by that
    /// optimizer with `load_state_dict` and by
    /// [`ZeroOptimizer::load_consolidated`] at any world size. A
    /// collective; every rank gets the result. Errors when communication
    /// fails.
    pub fn consolidated_state_dict(&self) -> Result<StateDict> {
        let infos = self.infos();
        assemble(&self.inner.state_dict(), &infos, |g, _, part| {
            gather(self.comm, part, infos[g].len)
        })
    }

    /// Restores a state saved by [`ZeroOptimizer::consolidated_state_dict`]
    /// (at any world size), by [`consolidate_sharded`] or by the wrapped
    /// optimizer on one process: each rank keeps its partition of every
    /// buffer. Errors, changing nothing, when the state does not fit the
    /// optimizer (kind, groups, shapes) or the parameters' step counts
    /// differ within a group.
    pub fn load_consolidated(&mut self, sd: &StateDict) -> Result<()> {
        const OP: &str = "ZeroOptimizer::load_consolidated";
        let rank = self.comm.rank();
        let mut inner = StateDict::new();
        copy_meta(sd, &mut inner);
        for (g, grp) in self.groups.iter().enumerate() {
            inner.set(format!("group.{g}.params"), 1usize);
            let (lo, hi) = grp.layout.partition(rank);
            let first = grp.index[0];
            let prefix = format!("state.{first}.");
            let names: Vec<String> = sd
                .keys()
                .filter_map(|k| k.strip_prefix(&prefix).map(str::to_string))
                .collect();
            for buf in names {
                let mut flat: Option<Tensor> = None;
                for ((p, &off), &k) in grp.params.iter().zip(&grp.layout.offsets).zip(&grp.index) {
                    let t = sd.require_shape(OP, &format!("state.{k}.{buf}"), &p.shape())?;
                    let f = match &mut flat {
                        Some(f) => f,
                        slot @ None => slot.insert(Tensor::zeros(&[grp.layout.len], t.dtype())?),
                    };
                    if t.dtype() != f.dtype() {
                        return Err(CommError::arg(
                            OP,
                            format!("state.{k}.{buf} is {}, not {}", t.dtype(), f.dtype()),
                        ));
                    }
                    with_float_dtype!(t.dtype(), T => {
                        f.make_mut::<T>()?[off..off + p.numel()].copy_from_slice(&t.contiguous()?.to_vec::<T>()?);
                    }, else return Err(CommError::arg(OP, format!("state.{k}.{buf} is {}, not floating point", t.dtype()))));
                }
                if let Some(f) = flat {
                    inner.insert(format!("state.{g}.{buf}"), copy(&f.narrow(0, lo, hi - lo)?)?);
                }
            }
            let steps: Vec<String> = grp
                .index
                .iter()
                .filter_map(|k| {
                    sd.meta(OP, &format!("state.{k}.step"))
                        .ok()
                        .map(|v| v.to_string())
                })
                .collect();
            if steps.iter().any(|s| s != &steps[0]) {
                return Err(CommError::arg(
                    OP,
                    format!(
                        "group {g}: the parameters' step counts differ ({steps:?}); ZeRO keeps one per group"
                    ),
                ));
            }
            if let Ok(step) = sd.meta(OP, &format!("state.{first}.step")) {
                inner.set(format!("state.{g}.step"), step.clone());
            }
        }
        self.inner.load_state_dict(&inner)?;
        Ok(())
    }

    /// Writes a sharded checkpoint of the optimizer state into `dir`: each
    /// rank its partitions ([`shard_file`]), rank 0 the index
    /// ([`INDEX_FILE`]), each file atomically. A collective (it ends with a
    /// barrier, so the checkpoint is complete when any rank returns).
    /// Errors on I/O or communication failure.
    pub fn save_sharded(&self, dir: &Path) -> Result<()> {
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        std::fs::create_dir_all(dir)
            .map_err(|e| CommError::io("ZeroOptimizer::save_sharded", format!("{}: {e}", dir.display())))?;
        let mut sd = self.inner.state_dict();
        sd.set("zero.world", world);
        sd.set("zero.rank", rank);
        sd.set("zero.groups", self.groups.len());
        for (g, info) in self.infos().iter().enumerate() {
            info.save(g, &mut sd);
        }
        sd.save(dir.join(shard_file(rank, world)))?;
        if rank == 0 {
            let mut index = StateDict::new();
            index.set("zero.world", world);
            index.set(
                "zero.files",
                (0..world).map(|r| shard_file(r, world)).collect::<Vec<_>>(),
            );
            index.save(dir.join(INDEX_FILE))?;
        }
        self.comm.barrier()
    }

    /// Resumes from a sharded checkpoint written by
    /// [`ZeroOptimizer::save_sharded`] at the same world size: this rank
    /// reads its own file. Errors, changing nothing, when the checkpoint
    /// was written by another number of ranks (consolidate it with
    /// [`consolidate_sharded`] and use [`ZeroOptimizer::load_consolidated`]),
    /// when its layout differs from this optimizer's, or a file is missing
    /// or corrupt.
    pub fn load_sharded(&mut self, dir: &Path) -> Result<()> {
        const OP: &str = "ZeroOptimizer::load_sharded";
        let (rank, world) = (self.comm.rank(), self.comm.world_size());
        let saved: usize = StateDict::load(dir.join(INDEX_FILE))?.get(OP, "zero.world")?;
        if saved != world {
            return Err(CommError::arg(
                OP,
                format!(
                    "{} was written by {saved} ranks, this run has {world}: consolidate it (consolidate_sharded) and load that with load_consolidated",
                    dir.display()
                ),
            ));
        }
        let sd = StateDict::load(dir.join(shard_file(rank, world)))?;
        let infos = self.infos();
        for (g, info) in infos.iter().enumerate() {
            if GroupInfo::load(OP, g, &sd)? != *info {
                return Err(CommError::arg(
                    OP,
                    format!(
                        "group {g} of {} holds other parameters (shapes or order) than this optimizer's",
                        dir.display()
                    ),
                ));
            }
        }
        self.inner.load_state_dict(&sd)?;
        Ok(())
    }

    fn infos(&self) -> Vec<GroupInfo> {
        self.groups
            .iter()
            .map(|g| GroupInfo {
                index: g.index.clone(),
                shapes: g.params.iter().map(|p| p.shape()).collect(),
                offsets: g.layout.offsets.clone(),
                len: g.layout.len,
                group_len: g.group_len,
            })
            .collect()
    }
}

/// The unsharded optimizer state of a sharded checkpoint in `dir` (see
/// [`ZeroOptimizer::consolidated_state_dict`]), read by one process
/// without communication; it loads at any world size with
/// [`ZeroOptimizer::load_consolidated`]. Errors when a file is missing or
/// corrupt or the files disagree.
pub fn consolidate_sharded(dir: &Path) -> Result<StateDict> {
    const OP: &str = "consolidate_sharded";
    let files: Vec<String> = StateDict::load(dir.join(INDEX_FILE))?.get(OP, "zero.files")?;
    let shards = files
        .iter()
        .map(|f| StateDict::load(dir.join(f)))
        .collect::<tessera_tensor::Result<Vec<_>>>()?;
    let first = shards
        .first()
        .ok_or_else(|| CommError::arg(OP, format!("{}: the index lists no files", dir.display())))?;
    let groups: usize = first.get(OP, "zero.groups")?;
    let infos = (0..groups)
        .map(|g| GroupInfo::load(OP, g, first))
        .collect::<Result<Vec<_>>>()?;
    assemble_from(&shards, &infos, dir)
}

/// [`consolidate_sharded`]'s assembly: every buffer's partitions
/// concatenated in rank order.
fn assemble_from(shards: &[StateDict], infos: &[GroupInfo], dir: &Path) -> Result<StateDict> {
    assemble(&shards[0], infos, |g, buf, part| {
        let mut parts = Vec::with_capacity(shards.len());
        for (r, sd) in shards.iter().enumerate() {
            let t = sd.tensor(&format!("state.{g}.{buf}")).ok_or_else(|| {
                CommError::arg(
                    "consolidate_sharded",
                    format!("{}: shard {r} lacks state.{g}.{buf}", dir.display()),
                )
            })?;
            parts.push(t.clone());
        }
        concat(&parts, part.dtype(), infos[g].len)
    })
}

/// The unsharded state from the wrapped optimizer's state over the
/// partitions (`inner`, for metadata and buffer names) and
/// `full(g, buffer, part)`, which turns group g's partition of a buffer
/// into the whole flat buffer.
fn assemble(
    inner: &StateDict,
    infos: &[GroupInfo],
    mut full: impl FnMut(usize, &str, &Tensor) -> Result<Tensor>,
) -> Result<StateDict> {
    let mut out = StateDict::new();
    copy_meta(inner, &mut out);
    for (g, info) in infos.iter().enumerate() {
        out.set(format!("group.{g}.params"), info.group_len);
        let prefix = format!("state.{g}.");
        let names: Vec<String> = inner
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_string))
            .collect();
        for buf in &names {
            let part = inner.tensor(&format!("{prefix}{buf}")).expect("listed");
            let flat = full(g, buf, part)?;
            for ((shape, &off), &k) in info.shapes.iter().zip(&info.offsets).zip(&info.index) {
                let n: usize = shape.iter().product();
                out.insert(
                    format!("state.{k}.{buf}"),
                    copy(&flat.narrow(0, off, n)?.view(shape.as_slice())?)?,
                );
            }
        }
        if let Ok(step) = inner.meta("ZeroOptimizer", &format!("state.{g}.step")) {
            for &k in &info.index {
                out.set(format!("state.{k}.step"), step.clone());
            }
        }
    }
    Ok(out)
}

/// Copies the metadata that is neither per-parameter state nor ZeRO's own.
fn copy_meta(from: &StateDict, to: &mut StateDict) {
    for (key, v) in from.metadata() {
        if !key.starts_with("state.") && !key.starts_with("zero.") {
            to.set(key.clone(), v.clone());
        }
    }
}

/// Every rank's `part` all-gathered into one tensor of `len` elements.
fn gather(comm: &dyn Communicator, part: &Tensor, len: usize) -> Result<Tensor> {
    with_float_dtype!(part.dtype(), T => {
        let mut full = vec![<T as Element>::ZERO; len];
        comm.all_gather_slice(&part.contiguous()?.to_vec::<T>()?, &mut full)?;
        Ok(Tensor::from_vec(full, &[len])?)
    }, else Err(CommError::arg("ZeroOptimizer::consolidated_state_dict", format!("state buffer of dtype {}", part.dtype()))))
}

/// The partitions `parts` (rank order) concatenated; errors unless they
/// make `len` elements of `dtype`.
fn concat(parts: &[Tensor], dtype: tessera_tensor::DType, len: usize) -> Result<Tensor> {
    with_float_dtype!(dtype, T => {
        let mut full = Vec::with_capacity(len);
        for p in parts {
            full.extend(p.to_dtype(dtype)?.to_vec::<T>()?);
        }
        if full.len() != len {
            return Err(CommError::arg("consolidate_sharded", format!("the shards hold {} elements of a flat buffer of {len}", full.len())));
        }
        Ok(Tensor::from_vec(full, &[len])?)
    }, else Err(CommError::arg("consolidate_sharded", format!("state buffer of dtype {dtype}"))))
}

/// A copy of `t` in its own storage (a state dict must not pin the flat
/// buffer a view comes from).
fn copy(t: &Tensor) -> Result<Tensor> {
    with_float_dtype!(t.dtype(), T => Ok(Tensor::from_vec(t.to_vec::<T>()?, t.shape())?),
        else Err(CommError::arg("ZeroOptimizer", format!("state buffer of dtype {}", t.dtype()))))
}
