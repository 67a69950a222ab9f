//! DeepSpeed's schedules (`deepspeed/runtime/pipe/schedule.py`, spec §5.2):
//! the lockstep synchronous 1F1B `TrainSchedule` and the forward-only
//! `InferenceSchedule`. Both alternate the order of sends and receives by
//! stage parity, so even blocking send/recv cannot deadlock.

use super::instr::{check_sizes, Instr, Schedule, ScheduleKind, Step};
use crate::error::Result;

impl Schedule {
    /// DeepSpeed's `TrainSchedule` for `stages` stages and `micro_batches`
    /// micro-batches: `2·(M + S − 1)` lockstep steps per stage, a forward or
    /// a backward in each, the result of step `t` sent in step `t + 1`, and
    /// `ReduceTiedGrads, ReduceGrads, OptimizerStep` in the last step.
    /// Errors when either count is 0.
    pub fn deepspeed(stages: usize, micro_batches: usize) -> Result<Schedule> {
        check_sizes("Schedule::deepspeed", stages, micro_batches)?;
        Ok(Schedule {
            kind: ScheduleKind::DeepSpeed,
            stages,
            micro_batches,
            chunks: 1,
            group: stages,
            programs: (0..stages)
                .map(|s| train_steps(stages, micro_batches, s))
                .collect(),
        })
    }

    /// DeepSpeed's `InferenceSchedule`: `M + S − 1` steps in which stage `s`
    /// runs the forward of micro-batch `t − s` and passes on the previous
    /// one's activation (two buffers per stage). Errors when either count is 0.
    pub fn inference(stages: usize, micro_batches: usize) -> Result<Schedule> {
        check_sizes("Schedule::inference", stages, micro_batches)?;
        Ok(Schedule {
            kind: ScheduleKind::Inference,
            stages,
            micro_batches,
            chunks: 1,
            group: stages,
            programs: (0..stages)
                .map(|s| inference_steps(stages, micro_batches, s))
                .collect(),
        })
    }
}

/// Micro-batch ids run from −S to M + S in the step formulas; negative and
/// too-large ids are idle slots.
fn valid(mb: isize, m: usize) -> Option<usize> {
    usize::try_from(mb).ok().filter(|&mb| mb < m)
}

/// `TrainSchedule._step_to_micro_batch`: which micro-batch stage `s` works
/// on in step `t`, and whether it is a forward.
fn step_to_mb(t: usize, stages: usize, s: usize) -> (isize, bool) {
    let (t, big_s, s) = (t as isize, stages as isize, s as isize);
    match (t % 2 == 0, s % 2 == 0) {
        (true, true) => (t / 2 - s / 2, true),
        (false, false) => ((t - 1) / 2 - s / 2, true),
        (true, false) => (t / 2 - big_s + (s + 1) / 2, false),
        (false, true) => ((t - 1) / 2 - big_s + 1 + s / 2, false),
    }
}

fn train_steps(stages: usize, m: usize, s: usize) -> Vec<Step> {
    let total = 2 * (m + stages - 1);
    let (first, last) = (s == 0, s + 1 == stages);
    let mut prev: Option<usize> = None;
    let mut steps = Vec::with_capacity(total);
    for t in 0..total {
        let (mb, fwd) = step_to_mb(t, stages, s);
        let mb = valid(mb, m);
        let mut step = Vec::new();
        if fwd {
            if let (Some(p), false) = (prev, first) {
                step.push(Instr::SendGrad { mb: p, chunk: 0 });
            }
            if let (Some(mb), false) = (mb, first) {
                step.push(Instr::RecvAct { mb, chunk: 0 });
            }
        } else {
            if let (Some(mb), false) = (mb, last) {
                step.push(Instr::RecvGrad { mb, chunk: 0 });
            }
            if let (Some(p), false) = (prev, last) {
                step.push(Instr::SendAct { mb: p, chunk: 0 });
            }
        }
        if let Some(mb) = mb {
            if fwd && (first || last) {
                step.push(Instr::Load { mb });
            }
            step.push(if fwd {
                Instr::Fwd { mb, chunk: 0 }
            } else {
                Instr::Bwd { mb, chunk: 0 }
            });
        }
        if t + 1 == total {
            step.extend([Instr::ReduceTiedGrads, Instr::ReduceGrads, Instr::OptimizerStep]);
        }
        // The step's result goes out in the next step, whether or not this
        // step had work (an idle slot sends nothing next time).
        prev = mb;
        steps.push(step);
    }
    steps
}

fn inference_steps(stages: usize, m: usize, s: usize) -> Vec<Step> {
    let (first, last) = (s == 0, s + 1 == stages);
    (0..m + stages - 1)
        .map(|t| {
            let mb = t as isize - s as isize;
            let (cur, prev) = (valid(mb, m), valid(mb - 1, m));
            let mut step = Vec::new();
            if let (Some(mb), true) = (cur, first || last) {
                step.push(Instr::Load { mb });
            }
            let send = prev.filter(|_| !last).map(|mb| Instr::SendAct { mb, chunk: 0 });
            let recv = cur.filter(|_| !first).map(|mb| Instr::RecvAct { mb, chunk: 0 });
            if s.is_multiple_of(2) {
                step.extend(send.into_iter().chain(recv));
            } else {
                step.extend(recv.into_iter().chain(send));
            }
            if let Some(mb) = cur {
                step.push(Instr::Fwd { mb, chunk: 0 });
            }
            step
        })
        .collect()
}
