//! From a stage's order of forward and backward passes to its program:
//! each pass gets the receive of its input before it and the send of its
//! result at the start of the next step. A step thus posts the previous
//! result's send together with the next input's receive, as Megatron's
//! fused `send_forward_recv_backward` / `send_backward_recv_forward` do.

use super::instr::{Instr, Schedule, ScheduleKind, Step};

/// A forward or backward pass of `(mb, chunk)` in a stage's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pass {
    pub fwd: bool,
    pub mb: usize,
    pub chunk: usize,
}

impl Pass {
    pub fn f(mb: usize, chunk: usize) -> Pass {
        Pass { fwd: true, mb, chunk }
    }

    pub fn b(mb: usize, chunk: usize) -> Pass {
        Pass {
            fwd: false,
            mb,
            chunk,
        }
    }
}

/// The schedule whose stage `r` runs the passes `order(r)` in order.
pub(crate) fn lower(
    kind: ScheduleKind,
    stages: usize,
    micro_batches: usize,
    chunks: usize,
    order: impl Fn(usize) -> Vec<Pass>,
) -> Schedule {
    Schedule {
        kind,
        stages,
        micro_batches,
        chunks,
        group: stages,
        programs: (0..stages)
            .map(|r| lower_stage(stages, chunks, r, &order(r)))
            .collect(),
    }
}

fn lower_stage(stages: usize, chunks: usize, r: usize, order: &[Pass]) -> Vec<Step> {
    let last_k = chunks * stages - 1;
    let mut steps = Vec::with_capacity(order.len() + 1);
    let mut result: Option<Instr> = None;
    for &Pass { fwd, mb, chunk } in order {
        let k = chunk * stages + r;
        let mut step: Step = result.take().into_iter().collect();
        if fwd {
            if k > 0 {
                step.push(Instr::RecvAct { mb, chunk });
            }
            if k == 0 || k == last_k {
                step.push(Instr::Load { mb });
            }
            step.push(Instr::Fwd { mb, chunk });
            result = (k < last_k).then_some(Instr::SendAct { mb, chunk });
        } else {
            if k < last_k {
                step.push(Instr::RecvGrad { mb, chunk });
            }
            step.push(Instr::Bwd { mb, chunk });
            result = (k > 0).then_some(Instr::SendGrad { mb, chunk });
        }
        steps.push(step);
    }
    let mut end: Step = result.into_iter().collect();
    end.extend([Instr::ReduceTiedGrads, Instr::ReduceGrads, Instr::OptimizerStep]);
    steps.push(end);
    steps
}
