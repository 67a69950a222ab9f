//! The 2-D grid of pipeline and data parallelism over one world, in
//! Megatron's rank order (spec §6.6 with tensor parallelism 1).

use crate::comm::Communicator;
use crate::error::{CommError, Result};

/// This rank's place in a `stages × replicas` grid: world rank
/// `r = dp_rank + replicas · stage` (Megatron's `tp-dp-pp` order with one
/// tensor-parallel rank), with the pipeline group of the ranks that share
/// its replica index and the data-parallel group of the ranks that share
/// its stage.
pub struct PipelineGrid {
    /// The pipeline group: rank in it = stage.
    pub pipe: Box<dyn Communicator>,
    /// The data-parallel group: the replicas of this stage.
    pub data: Box<dyn Communicator>,
    /// This rank's stage.
    pub stage: usize,
    /// This rank's replica index.
    pub dp_rank: usize,
}

impl PipelineGrid {
    /// Splits `world` into the grid of `stages` pipeline stages (a
    /// collective over `world`). Errors when `stages` is 0 or does not
    /// divide the world size, and on communication failures.
    pub fn new(world: &dyn Communicator, stages: usize) -> Result<PipelineGrid> {
        let n = world.world_size();
        if stages == 0 || !n.is_multiple_of(stages) {
            return Err(CommError::arg(
                "PipelineGrid::new",
                format!("{stages} pipeline stages do not divide a world of {n} ranks"),
            ));
        }
        let replicas = n / stages;
        let r = world.rank();
        let (stage, dp_rank) = (r / replicas, r % replicas);
        let color =
            |c: usize| u32::try_from(c).map_err(|_| CommError::arg("PipelineGrid::new", "too many ranks"));
        let pipe = world.split(Some(color(dp_rank)?), stage as i64)?;
        let data = world.split(Some(color(stage)?), dp_rank as i64)?;
        let missing = || CommError::arg("PipelineGrid::new", "split returned no group for a colored rank");
        Ok(PipelineGrid {
            pipe: pipe.ok_or_else(missing)?,
            data: data.ok_or_else(missing)?,
            stage,
            dp_rank,
        })
    }
}
