//! GPipe (fill-drain): every forward, then every backward.

use super::instr::{check_sizes, Schedule, ScheduleKind};
use super::lower::{lower, Pass};
use crate::error::Result;

impl Schedule {
    /// GPipe for `stages` stages and `micro_batches` micro-batches: each
    /// stage runs the forwards of micro-batches `0..M`, then their
    /// backwards in the same (FIFO) order, as DeepSpeed and Megatron pop
    /// them. Every stage holds all `M` micro-batches' activations at the
    /// turn. Errors when either count is 0.
    pub fn gpipe(stages: usize, micro_batches: usize) -> Result<Schedule> {
        check_sizes("Schedule::gpipe", stages, micro_batches)?;
        let m = micro_batches;
        Ok(lower(ScheduleKind::GPipe, stages, m, 1, |_| {
            (0..m)
                .map(|mb| Pass::f(mb, 0))
                .chain((0..m).map(|mb| Pass::b(mb, 0)))
                .collect()
        }))
    }
}
