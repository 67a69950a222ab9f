//! Megatron's non-interleaved 1F1B (PipeDream-Flush; `schedules.py::
//! forward_backward_pipelining_without_interleaving`, spec §5.3).

use super::instr::{check_sizes, Schedule, ScheduleKind};
use super::lower::{lower, Pass};
use crate::error::Result;

impl Schedule {
    /// Megatron's 1F1B: stage `r` runs `w = min(p − r − 1, m)` warm-up
    /// forwards, then alternates one forward and one backward, then drains
    /// the last `w` backwards. Stage `r` holds at most `min(p − r, m)`
    /// micro-batches' activations. Errors when either count is 0.
    pub fn one_f_one_b(stages: usize, micro_batches: usize) -> Result<Schedule> {
        check_sizes("Schedule::one_f_one_b", stages, micro_batches)?;
        let m = micro_batches;
        Ok(lower(ScheduleKind::OneFOneB, stages, m, 1, |r| {
            let warmup = (stages - r - 1).min(m);
            let mut order: Vec<Pass> = (0..warmup).map(|mb| Pass::f(mb, 0)).collect();
            for i in 0..m - warmup {
                order.extend([Pass::f(warmup + i, 0), Pass::b(i, 0)]);
            }
            order.extend((m - warmup..m).map(|mb| Pass::b(mb, 0)));
            order
        }))
    }
}
