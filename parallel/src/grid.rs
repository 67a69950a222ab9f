//! [`ParallelGrid`]: the 3-D process grid of tensor, pipeline and data
//! parallelism in Megatron's rank order (spec §6.6).

use std::sync::Arc;

use crate::comm::Communicator;
use crate::error::{CommError, Result};

/// This rank's place in a `tp × dp × pp` grid over one world, with
/// Megatron's default order (tensor-parallel rank fastest):
/// `rank = tp_rank + tp · (dp_rank + dp · pp_rank)`, and the groups it
/// belongs to, each made by `split` (rank in a group = coordinate on its
/// axis).
pub struct ParallelGrid {
    /// The tensor-parallel group (ranks that differ only in `tp_rank`).
    pub tp: Arc<dyn Communicator>,
    /// The data-parallel group (ranks that differ only in `dp_rank`).
    pub dp: Arc<dyn Communicator>,
    /// The pipeline group (ranks that differ only in `pp_rank`; rank =
    /// stage).
    pub pp: Arc<dyn Communicator>,
    /// The group of the first and last stage of this rank's pipeline (the
    /// tied-embedding group), `None` on the middle stages.
    pub embedding: Option<Arc<dyn Communicator>>,
    /// This rank's coordinates.
    pub coords: GridCoords,
    /// The sizes `(tp, pp, dp)`.
    pub sizes: (usize, usize, usize),
}

/// A rank's coordinates in the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridCoords {
    /// Index in the tensor-parallel group.
    pub tp: usize,
    /// Index in the data-parallel group.
    pub dp: usize,
    /// Pipeline stage.
    pub pp: usize,
}

/// The rank lists of every group of each kind, in Megatron's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GridGroups {
    /// `tp_group(dp_i, pp_k)` for `pp_k` then `dp_i` ascending.
    pub tp: Vec<Vec<usize>>,
    /// `dp_group(tp_j, pp_k)` for `pp_k` then `tp_j` ascending.
    pub dp: Vec<Vec<usize>>,
    /// `pp_group(tp_j, dp_i)` for `dp_i` then `tp_j` ascending.
    pub pp: Vec<Vec<usize>>,
}

impl ParallelGrid {
    /// Splits `world` into the grid (a collective over `world`: four
    /// `split`s). Errors when a size is 0 or `tp · pp · dp` is not the world
    /// size, and on communication failures.
    pub fn new(world: &dyn Communicator, tp: usize, pp: usize, dp: usize) -> Result<ParallelGrid> {
        const OP: &str = "ParallelGrid::new";
        check_sizes(world.world_size(), tp, pp, dp)?;
        let coords = Self::coords_of(world.rank(), tp, dp);
        let color = |c: usize| u32::try_from(c).map_err(|_| CommError::arg(OP, "too many ranks"));
        let missing = || CommError::arg(OP, "split returned no group for a colored rank");
        let tp_group = world.split(Some(color(coords.dp + dp * coords.pp)?), coords.tp as i64)?;
        let dp_group = world.split(Some(color(coords.tp + tp * coords.pp)?), coords.dp as i64)?;
        let pp_color = color(coords.tp + tp * coords.dp)?;
        let pp_group = world.split(Some(pp_color), coords.pp as i64)?;
        let ends = coords.pp == 0 || coords.pp + 1 == pp;
        let embedding = world.split(ends.then_some(pp_color), coords.pp as i64)?;
        Ok(ParallelGrid {
            tp: Arc::from(tp_group.ok_or_else(missing)?),
            dp: Arc::from(dp_group.ok_or_else(missing)?),
            pp: Arc::from(pp_group.ok_or_else(missing)?),
            embedding: embedding.map(Arc::from),
            coords,
            sizes: (tp, pp, dp),
        })
    }

    /// The coordinates of world rank `rank` in a grid with `tp`
    /// tensor-parallel and `dp` data-parallel ranks.
    pub fn coords_of(rank: usize, tp: usize, dp: usize) -> GridCoords {
        GridCoords {
            tp: rank % tp,
            dp: (rank / tp) % dp,
            pp: rank / (tp * dp),
        }
    }

    /// The world rank at `coords` (the inverse of [`ParallelGrid::coords_of`]).
    pub fn rank_of(coords: GridCoords, tp: usize, dp: usize) -> usize {
        coords.tp + tp * (coords.dp + dp * coords.pp)
    }

    /// The rank lists of every group (pure; no communication), e.g. the
    /// golden lists of Megatron's docstring for 16 ranks, `tp = 2`,
    /// `pp = 4`, `dp = 2`. Errors as [`ParallelGrid::new`] on the sizes.
    pub fn groups(world: usize, tp: usize, pp: usize, dp: usize) -> Result<GridGroups> {
        check_sizes(world, tp, pp, dp)?;
        let at = |t, d, p| Self::rank_of(GridCoords { tp: t, dp: d, pp: p }, tp, dp);
        let mut g = GridGroups {
            tp: Vec::new(),
            dp: Vec::new(),
            pp: Vec::new(),
        };
        for p in 0..pp {
            for d in 0..dp {
                g.tp.push((0..tp).map(|t| at(t, d, p)).collect());
            }
            for t in 0..tp {
                g.dp.push((0..dp).map(|d| at(t, d, p)).collect());
            }
        }
        for d in 0..dp {
            for t in 0..tp {
                g.pp.push((0..pp).map(|p| at(t, d, p)).collect());
            }
        }
        Ok(g)
    }
}

fn check_sizes(world: usize, tp: usize, pp: usize, dp: usize) -> Result<()> {
    let product = tp.checked_mul(pp).and_then(|x| x.checked_mul(dp));
    if tp == 0 || pp == 0 || dp == 0 || product != Some(world) {
        return Err(CommError::arg(
            "ParallelGrid",
            format!("tp {tp} × pp {pp} × dp {dp} must equal the world size {world}"),
        ));
    }
    Ok(())
}
