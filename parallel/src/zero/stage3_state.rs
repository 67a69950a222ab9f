//! Sharded checkpoints of ZeRO stage 3: each rank writes its parameter
//! shards, its master shards and its inner optimizer's state to one file,
//! rank 0 an index; a run on the same number of ranks resumes from them.

use std::path::Path;

use tessera_tensor::StateDict;

use super::fetch::lock;
use super::stage3::{copy, Zero3};
use super::stage3_consolidate::Layout;
use crate::error::{CommError, Result};

/// The name of a ZeRO-3 sharded checkpoint's index file.
pub const ZERO3_INDEX_FILE: &str = "zero3_index.safetensors";

/// The file of rank `rank` of `world` in a ZeRO-3 sharded checkpoint.
pub fn zero3_shard_file(rank: usize, world: usize) -> String {
    format!("zero3_shard_{rank:05}_of_{world:05}.safetensors")
}

impl Zero3 {
    /// Writes a sharded checkpoint into `dir`: each rank its parameter
    /// shards, master shards and inner optimizer state
    /// ([`zero3_shard_file`]), rank 0 the index ([`ZERO3_INDEX_FILE`]),
    /// each file atomically. A collective (it ends with a barrier, so the
    /// checkpoint is complete when any rank returns). Errors on I/O or
    /// communication failure.
    pub fn save_sharded(&self, dir: &Path) -> Result<()> {
        const OP: &str = "Zero3::save_sharded";
        let comm = lock(&self.core).idle_comm()?;
        let (rank, world) = (comm.rank(), comm.world_size());
        std::fs::create_dir_all(dir).map_err(|e| CommError::io(OP, format!("{}: {e}", dir.display())))?;
        let mut sd = StateDict::new();
        sd.merge_prefixed("optimizer", self.inner.state_dict());
        sd.set("zero3.world", world);
        sd.set("zero3.rank", rank);
        self.layout().save(&mut sd);
        {
            let core = lock(&self.core);
            for (g, s) in core.shards.iter().enumerate() {
                sd.insert(format!("zero3.shard.{g}"), s.clone());
            }
        }
        for (g, m) in self.masters.iter().enumerate() {
            sd.insert(format!("zero3.master.{g}"), m.tensor()?);
        }
        sd.save(dir.join(zero3_shard_file(rank, world)))?;
        if rank == 0 {
            let mut index = StateDict::new();
            index.set("zero3.world", world);
            index.set(
                "zero3.files",
                (0..world).map(|r| zero3_shard_file(r, world)).collect::<Vec<_>>(),
            );
            index.save(dir.join(ZERO3_INDEX_FILE))?;
        }
        comm.barrier()
    }

    /// Resumes from a checkpoint written by [`Zero3::save_sharded`] on the
    /// same number of ranks: this rank reads its own file. Errors, changing
    /// nothing, when it was written by another number of ranks (consolidate
    /// it with [`super::consolidate_zero3_sharded`] and load that with
    /// [`Zero3::load_consolidated`]), when
    /// its parameters (names, sizes) differ from this model's, or a file is
    /// missing or corrupt.
    pub fn load_sharded(&mut self, dir: &Path) -> Result<()> {
        const OP: &str = "Zero3::load_sharded";
        let comm = lock(&self.core).idle_comm()?;
        let (rank, world) = (comm.rank(), comm.world_size());
        let saved: usize = StateDict::load(dir.join(ZERO3_INDEX_FILE))?.get(OP, "zero3.world")?;
        if saved != world {
            return Err(CommError::arg(
                OP,
                format!(
                    "{} was written by {saved} ranks, this run has {world}: consolidate it (consolidate_zero3_sharded) and load that with load_consolidated",
                    dir.display()
                ),
            ));
        }
        let sd = StateDict::load(dir.join(zero3_shard_file(rank, world)))?;
        if Layout::load(OP, &sd)? != self.layout() {
            return Err(CommError::arg(
                OP,
                format!(
                    "{} holds other parameters (names or sizes) than this model's",
                    dir.display()
                ),
            ));
        }
        let mut shards = Vec::new();
        {
            let core = lock(&self.core);
            for (g, s) in core.shards.iter().enumerate() {
                let t = entry(&sd, &format!("zero3.shard.{g}"), dir)?;
                if t.shape() != s.shape() || t.dtype() != s.dtype() {
                    return Err(CommError::arg(
                        OP,
                        format!("shard {g} of {} has another shape", dir.display()),
                    ));
                }
                shards.push(copy(t)?);
            }
        }
        let mut masters = Vec::new();
        for (g, m) in self.masters.iter().enumerate() {
            let t = entry(&sd, &format!("zero3.master.{g}"), dir)?;
            if t.shape() != m.shape().as_slice() || t.dtype() != m.dtype() {
                return Err(CommError::arg(
                    OP,
                    format!("master {g} of {} has another shape", dir.display()),
                ));
            }
            masters.push(copy(t)?);
        }
        self.inner.load_state_dict(&sd.prefixed("optimizer"))?;
        for (m, t) in self.masters.iter().zip(masters) {
            m.set(t)?;
        }
        let mut core = lock(&self.core);
        core.release_all()?;
        core.shards = shards;
        core.refresh_persistent()
    }
}

/// The tensor `key` of a shard file; errors naming the file when missing.
fn entry<'a>(sd: &'a StateDict, key: &str, dir: &Path) -> Result<&'a tessera_tensor::Tensor> {
    sd.tensor(key).ok_or_else(|| {
        CommError::arg(
            "Zero3::load_sharded",
            format!("the shard file in {} has no tensor {key}", dir.display()),
        )
    })
}
