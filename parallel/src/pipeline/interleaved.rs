//! Megatron's interleaved 1F1B with `v` model chunks per stage
//! (`forward_backward_pipelining_with_interleaving`, spec §5.4).

use super::instr::{check_sizes, Schedule, ScheduleKind};
use super::lower::{lower, Pass};
use crate::error::{CommError, Result};

impl Schedule {
    /// Interleaved 1F1B with `chunks` (`v`) model chunks per stage and
    /// Megatron's default micro-batch group size `g = p`. Megatron requires
    /// the micro-batch count to be a multiple of the stage count: errors
    /// otherwise, and when a count is 0.
    pub fn interleaved(stages: usize, micro_batches: usize, chunks: usize) -> Result<Schedule> {
        Schedule::interleaved_grouped(stages, micro_batches, chunks, stages)
    }

    /// Interleaved 1F1B with micro-batch group size `group`
    /// (`microbatch_group_size_per_vp_stage`): forwards run through the
    /// schedule table (for each group of `g` micro-batches, for each chunk,
    /// each micro-batch of the group), backwards through the same table with
    /// the chunks mirrored. Stage `r` runs `min(2(p − r − 1) + (v − 1)·g,
    /// m·v)` warm-up forwards, then alternates, then drains. Errors unless
    /// `p ≤ g ≤ m` and `m mod g` is 0 or at least `p` (Megatron's
    /// conditions), when a count is 0, and for several chunks on 1 stage.
    pub fn interleaved_grouped(
        stages: usize,
        micro_batches: usize,
        chunks: usize,
        group: usize,
    ) -> Result<Schedule> {
        const OP: &str = "Schedule::interleaved";
        check_sizes(OP, stages, micro_batches)?;
        let (p, m, v, g) = (stages, micro_batches, chunks, group);
        if v == 0 {
            return Err(CommError::arg(OP, "needs at least one model chunk per stage"));
        }
        if p == 1 && v > 1 {
            // One stage holds the whole model: chunks would pass activations
            // to themselves, and there is no bubble to shrink.
            return Err(CommError::arg(
                OP,
                format!("{v} model chunks on 1 stage: interleaving needs at least 2 stages"),
            ));
        }
        if !(p <= g && g <= m) || !(m % g == 0 || m % g >= p) {
            return Err(CommError::arg(
                OP,
                format!(
                    "{m} micro-batches in groups of {g} on {p} stages: Megatron needs stages <= group <= micro-batches \
                     and micro-batches % group to be 0 or at least the stage count (with the default group = stages, \
                     the micro-batch count must be a multiple of the stage count)"
                ),
            ));
        }
        let table = schedule_table(m, v, g);
        let total = m * v;
        let mut schedule = lower(ScheduleKind::Interleaved, p, m, v, |r| {
            let warmup = ((p - r - 1) * 2 + (v - 1) * g).min(total);
            let fwd = |k: usize| Pass::f(table[k].0, table[k].1);
            let bwd = |k: usize| Pass::b(table[k].0, v - 1 - table[k].1);
            let mut order: Vec<Pass> = (0..warmup).map(fwd).collect();
            for k in 0..total - warmup {
                order.extend([fwd(warmup + k), bwd(k)]);
            }
            order.extend((total - warmup..total).map(bwd));
            order
        });
        schedule.group = g;
        Ok(schedule)
    }
}

/// Megatron's `get_schedule_table`: `(mb, chunk)` for each virtual
/// forward, group by group (the last group takes the rest).
pub(crate) fn schedule_table(m: usize, v: usize, g: usize) -> Vec<(usize, usize)> {
    let mut table = Vec::with_capacity(m * v);
    for lo in (0..m).step_by(g) {
        let hi = if lo + g >= m { m } else { lo + g };
        for chunk in 0..v {
            table.extend((lo..hi).map(|mb| (mb, chunk)));
        }
    }
    table
}
