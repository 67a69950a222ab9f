//! Executing a schedule without threads or tensors: a timed simulation with
//! unit (or any) costs per pass, which gives the makespan and the bubble of
//! every stage, and an untimed run under blocking-rendezvous semantics
//! that finds deadlocks (spec §5.6 items 4 and 6).

use std::collections::HashMap;

use super::instr::{Instr, Msg, Schedule};
use crate::error::{CommError, Result};

/// The cost of one pass of one model chunk on one micro-batch, in ticks
/// (with `v` chunks per stage, a chunk costs `1/v` of a stage's pass).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Costs {
    /// Ticks of a forward pass.
    pub fwd: u64,
    /// Ticks of a backward pass.
    pub bwd: u64,
}

impl Costs {
    /// One tick per forward and per backward.
    pub const UNIT: Costs = Costs { fwd: 1, bwd: 1 };
}

/// The result of [`simulate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// When the last pass of any stage ends.
    pub makespan: u64,
    /// Ticks each stage spends in passes.
    pub busy: Vec<u64>,
    /// `(start, end)` of every pass, by stage and instruction.
    pub passes: HashMap<(usize, Instr), (u64, u64)>,
}

impl Timeline {
    /// The fraction of the makespan stage `stage` sits idle.
    pub fn idle_fraction(&self, stage: usize) -> f64 {
        if self.makespan == 0 {
            return 0.0;
        }
        (self.makespan - self.busy[stage]) as f64 / self.makespan as f64
    }

    /// The pipeline's bubble: the mean idle fraction over the stages.
    pub fn bubble_fraction(&self) -> f64 {
        let n = self.busy.len().max(1) as f64;
        (0..self.busy.len()).map(|s| self.idle_fraction(s)).sum::<f64>() / n
    }
}

impl Schedule {
    /// The bubble fraction the formula gives for this schedule with equal
    /// per-stage costs: `(p − 1)/(v·m + p − 1)` (`v = 1` except
    /// interleaved; spec §5.5). 0 for inference's forward-only pipeline is
    /// not special-cased: it has the same fill and drain.
    pub fn bubble_theory(&self) -> f64 {
        let p = self.stages as f64;
        (p - 1.0) / (self.chunks as f64 * self.micro_batches as f64 + p - 1.0)
    }
}

/// Runs `schedule` with `costs`: every stage executes its instructions in
/// order, sends are buffered (they never wait), a receive waits for the
/// matching send, passes take their cost. Errors (naming each stage's
/// blocked instruction) when the stages deadlock, and when a message is
/// sent twice or a transfer leaves the pipeline.
pub fn simulate(schedule: &Schedule, costs: Costs) -> Result<Timeline> {
    let programs: Vec<Vec<Instr>> = (0..schedule.stages())
        .map(|s| schedule.instrs(s).copied().collect())
        .collect();
    let n = programs.len();
    let mut pos = vec![0usize; n];
    let mut clock = vec![0u64; n];
    let mut busy = vec![0u64; n];
    let mut passes = HashMap::new();
    let mut wire: HashMap<Msg, u64> = HashMap::new();
    loop {
        let mut progress = false;
        for s in 0..n {
            while let Some(instr) = programs[s].get(pos[s]) {
                match instr {
                    Instr::Fwd { .. } | Instr::Bwd { .. } => {
                        let cost = if matches!(instr, Instr::Fwd { .. }) {
                            costs.fwd
                        } else {
                            costs.bwd
                        };
                        passes.insert((s, *instr), (clock[s], clock[s] + cost));
                        clock[s] += cost;
                        busy[s] += cost;
                    }
                    i if i.is_p2p() => {
                        let route = route(schedule, s, i)?;
                        if route.send {
                            if wire.insert(route.msg, clock[s]).is_some() {
                                return Err(bad(format!("stage {s} sends {i} twice")));
                            }
                        } else {
                            match wire.remove(&route.msg) {
                                Some(t) => clock[s] = clock[s].max(t),
                                None => break,
                            }
                        }
                    }
                    _ => {}
                }
                pos[s] += 1;
                progress = true;
            }
        }
        if pos.iter().zip(&programs).all(|(&p, prog)| p == prog.len()) {
            break;
        }
        if !progress {
            return Err(deadlock(&programs, &pos, "buffered sends"));
        }
    }
    Ok(Timeline {
        makespan: clock.iter().copied().max().unwrap_or(0),
        busy,
        passes,
    })
}

/// How the point-to-point instructions of the untimed run complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Semantics {
    /// A send completes at once (buffered), a receive when its message
    /// was sent: the semantics of tessera's communicators.
    Buffered,
    /// Rendezvous: a send and its receive complete together, once both are
    /// posted. The point-to-point instructions that follow each other
    /// within one step are posted together and complete independently
    /// (NCCL's grouped calls, Megatron's `batch_isend_irecv`).
    Batched,
    /// Rendezvous with one instruction posted at a time (blocking
    /// send/recv): the strictest model.
    Blocking,
}

/// Runs `schedule` without time under `semantics`; errors when the stages
/// deadlock (naming each stage's blocked instruction), or when a
/// point-to-point instruction leaves the pipeline.
pub fn run_untimed(schedule: &Schedule, semantics: Semantics) -> Result<()> {
    if semantics == Semantics::Buffered {
        return simulate(schedule, Costs::UNIT).map(drop);
    }
    let n = schedule.stages();
    // Per stage: (step, index in step), and the posted run with matched flags.
    let mut at = vec![(0usize, 0usize); n];
    let mut posted: Vec<Vec<(Instr, bool)>> = vec![Vec::new(); n];
    loop {
        let mut progress = false;
        for s in 0..n {
            let steps = schedule.steps(s);
            // Leave a completed run, then skip what does not communicate.
            if !posted[s].is_empty() && posted[s].iter().all(|(_, done)| *done) {
                at[s].1 += posted[s].len();
                posted[s].clear();
                progress = true;
            }
            if !posted[s].is_empty() {
                continue;
            }
            while let Some(step) = steps.get(at[s].0) {
                match step.get(at[s].1) {
                    None => at[s] = (at[s].0 + 1, 0),
                    Some(i) if !i.is_p2p() => at[s].1 += 1,
                    Some(_) => break,
                }
                progress = true;
            }
            if let Some(step) = steps.get(at[s].0) {
                let run = step[at[s].1..].iter().take_while(|i| i.is_p2p());
                let len = if semantics == Semantics::Blocking {
                    1
                } else {
                    usize::MAX
                };
                posted[s] = run.take(len).map(|i| (*i, false)).collect();
            }
        }
        for a in 0..n {
            for k in 0..posted[a].len() {
                let (instr, done) = posted[a][k];
                let r = route(schedule, a, &instr)?;
                if done || !r.send {
                    continue;
                }
                let b = r.peer;
                let found = posted[b].iter().position(|(j, d)| {
                    !*d && route(schedule, b, j).is_ok_and(|q| !q.send && q.peer == a && q.msg == r.msg)
                });
                if let Some(j) = found {
                    posted[a][k].1 = true;
                    posted[b][j].1 = true;
                    progress = true;
                }
            }
        }
        let finished = (0..n).all(|s| at[s].0 >= schedule.steps(s).len() && posted[s].is_empty());
        if finished {
            return Ok(());
        }
        if !progress {
            let blocked: Vec<String> = (0..n)
                .map(|s| match posted[s].iter().find(|(_, d)| !*d) {
                    Some((i, _)) => format!("stage {s} at step {} blocked on {i}", at[s].0),
                    None => format!("stage {s} finished"),
                })
                .collect();
            return Err(bad(format!(
                "{} deadlocks under {semantics:?} semantics: {}",
                schedule.kind().name(),
                blocked.join(", ")
            )));
        }
    }
}

fn route(schedule: &Schedule, s: usize, i: &Instr) -> Result<super::instr::Route> {
    schedule
        .route(s, i)
        .ok_or_else(|| bad(format!("{i} on stage {s} leaves the pipeline")))
}

fn deadlock(programs: &[Vec<Instr>], pos: &[usize], how: &str) -> CommError {
    let blocked: Vec<String> = programs
        .iter()
        .zip(pos)
        .enumerate()
        .map(|(s, (p, &i))| match p.get(i) {
            Some(instr) => format!("stage {s} blocked on {instr}"),
            None => format!("stage {s} finished"),
        })
        .collect();
    bad(format!("deadlock under {how}: {}", blocked.join(", ")))
}

fn bad(msg: String) -> CommError {
    CommError::arg("pipeline schedule", msg)
}
