//! The instruction set of a pipeline schedule and the [`Schedule`] that
//! holds one program per stage (spec §5.1).

use std::fmt;

use crate::error::{CommError, Result};

/// One instruction of a stage's program (DeepSpeed's `PipeInstruction`s).
///
/// `mb` is the micro-batch, `chunk` the model chunk of this stage (always 0
/// without interleaving; chunk `c` of stage `r` is virtual stage
/// `c·stages + r`). For the four communication instructions, `chunk` names
/// this stage's chunk the data belongs to: the chunk whose output is sent
/// ([`Instr::SendAct`]) or whose output gradient arrives
/// ([`Instr::RecvGrad`]), and the chunk whose input arrives
/// ([`Instr::RecvAct`]) or whose input gradient is sent ([`Instr::SendGrad`]).
/// DeepSpeed's buffer ids are derived, not stored: see [`Schedule::buffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Instr {
    /// Fetch micro-batch `mb`: the inputs on the first virtual stage, the
    /// labels on the last.
    Load {
        /// The micro-batch.
        mb: usize,
    },
    /// Forward pass of chunk `chunk` on micro-batch `mb` (with the loss on
    /// the last virtual stage); its activations stay stashed until the
    /// matching [`Instr::Bwd`].
    Fwd {
        /// The micro-batch.
        mb: usize,
        /// The model chunk.
        chunk: usize,
    },
    /// Backward pass of chunk `chunk` on micro-batch `mb`; accumulates the
    /// parameter gradients and frees the stashed activations.
    Bwd {
        /// The micro-batch.
        mb: usize,
        /// The model chunk.
        chunk: usize,
    },
    /// Send the output of `Fwd{mb, chunk}` to the next virtual stage.
    SendAct {
        /// The micro-batch.
        mb: usize,
        /// The chunk that produced the activation.
        chunk: usize,
    },
    /// Receive the input of `Fwd{mb, chunk}` from the previous virtual stage.
    RecvAct {
        /// The micro-batch.
        mb: usize,
        /// The chunk that consumes the activation.
        chunk: usize,
    },
    /// Send the input gradient of `Bwd{mb, chunk}` to the previous virtual stage.
    SendGrad {
        /// The micro-batch.
        mb: usize,
        /// The chunk whose input gradient is sent.
        chunk: usize,
    },
    /// Receive the output gradient of `Bwd{mb, chunk}` from the next virtual stage.
    RecvGrad {
        /// The micro-batch.
        mb: usize,
        /// The chunk whose output gradient arrives.
        chunk: usize,
    },
    /// All-reduce the gradients of weights tied across stages (a shared
    /// embedding on the first and last stage).
    ReduceTiedGrads,
    /// Reduce the accumulated gradients over the data-parallel group.
    ReduceGrads,
    /// Apply the optimizer to the accumulated gradients.
    OptimizerStep,
}

impl Instr {
    /// The micro-batch and chunk the instruction concerns (`Load` has chunk
    /// 0); `None` for the three end-of-batch instructions.
    pub fn mb_chunk(&self) -> Option<(usize, usize)> {
        match *self {
            Instr::Load { mb } => Some((mb, 0)),
            Instr::Fwd { mb, chunk }
            | Instr::Bwd { mb, chunk }
            | Instr::SendAct { mb, chunk }
            | Instr::RecvAct { mb, chunk }
            | Instr::SendGrad { mb, chunk }
            | Instr::RecvGrad { mb, chunk } => Some((mb, chunk)),
            Instr::ReduceTiedGrads | Instr::ReduceGrads | Instr::OptimizerStep => None,
        }
    }

    /// True for the four point-to-point instructions.
    pub fn is_p2p(&self) -> bool {
        matches!(
            self,
            Instr::SendAct { .. } | Instr::RecvAct { .. } | Instr::SendGrad { .. } | Instr::RecvGrad { .. }
        )
    }
}

/// The spec's table notation: `Load0`, `F0`, `B0`, `SendAct0`, `RecvGrad0`,
/// `RTG`, `RG`, `OPT`; chunks other than 0 follow as `c1` (`F3c1`).
impl fmt::Display for Instr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Instr::Load { .. } => "Load",
            Instr::Fwd { .. } => "F",
            Instr::Bwd { .. } => "B",
            Instr::SendAct { .. } => "SendAct",
            Instr::RecvAct { .. } => "RecvAct",
            Instr::SendGrad { .. } => "SendGrad",
            Instr::RecvGrad { .. } => "RecvGrad",
            Instr::ReduceTiedGrads => return f.write_str("RTG"),
            Instr::ReduceGrads => return f.write_str("RG"),
            Instr::OptimizerStep => return f.write_str("OPT"),
        };
        let (mb, chunk) = self.mb_chunk().expect("per-micro-batch instruction");
        if chunk == 0 {
            write!(f, "{name}{mb}")
        } else {
            write!(f, "{name}{mb}c{chunk}")
        }
    }
}

/// Which schedule generated a [`Schedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// Fill-drain: all forwards, then all backwards (GPipe).
    GPipe,
    /// DeepSpeed's `TrainSchedule`: synchronous 1F1B in lockstep steps.
    DeepSpeed,
    /// Megatron's non-interleaved 1F1B (PipeDream-Flush).
    OneFOneB,
    /// Megatron's interleaved 1F1B with several model chunks per stage.
    Interleaved,
    /// DeepSpeed's `InferenceSchedule`: forwards only.
    Inference,
}

impl ScheduleKind {
    /// The name the command-line flags use (`gpipe`, `deepspeed`, `1f1b`,
    /// `interleaved`, `inference`).
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "gpipe",
            ScheduleKind::DeepSpeed => "deepspeed",
            ScheduleKind::OneFOneB => "1f1b",
            ScheduleKind::Interleaved => "interleaved",
            ScheduleKind::Inference => "inference",
        }
    }

    /// The kind named `name` (as [`ScheduleKind::name`] spells it); errors
    /// on any other name.
    pub fn parse(name: &str) -> Result<ScheduleKind> {
        Ok(match name {
            "gpipe" => ScheduleKind::GPipe,
            "deepspeed" => ScheduleKind::DeepSpeed,
            "1f1b" => ScheduleKind::OneFOneB,
            "interleaved" => ScheduleKind::Interleaved,
            "inference" => ScheduleKind::Inference,
            _ => {
                return Err(CommError::arg(
                    "pipeline schedule",
                    format!("unknown schedule {name:?} (gpipe, deepspeed, 1f1b, interleaved, inference)"),
                ))
            }
        })
    }

    /// True for the schedules that train (all but [`ScheduleKind::Inference`]).
    pub fn trains(self) -> bool {
        self != ScheduleKind::Inference
    }
}

/// One step of a stage's program: instructions that run in order. Steps
/// are what DeepSpeed yields: between two steps a barrier can be placed
/// without deadlock (lockstep schedules), and the point-to-point
/// instructions of one step may be posted together (Megatron's fused
/// `send_forward_recv_backward`).
pub type Step = Vec<Instr>;

/// A pipeline schedule as data: for each of `stages` stages, its program
/// (a list of [`Step`]s) for one batch of `micro_batches` micro-batches
/// through `chunks` model chunks per stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub(crate) kind: ScheduleKind,
    pub(crate) stages: usize,
    pub(crate) micro_batches: usize,
    pub(crate) chunks: usize,
    /// Megatron's micro-batch group size of interleaved schedules (the
    /// stage count elsewhere, where it plays no part).
    pub(crate) group: usize,
    pub(crate) programs: Vec<Vec<Step>>,
}

impl Schedule {
    /// The schedule of `kind` for `stages` stages and `micro_batches`
    /// micro-batches; `chunks` model chunks per stage for
    /// [`ScheduleKind::Interleaved`] (ignored by the others, which have
    /// one). Errors as the generator of that kind does.
    pub fn new(kind: ScheduleKind, stages: usize, micro_batches: usize, chunks: usize) -> Result<Schedule> {
        match kind {
            ScheduleKind::GPipe => Schedule::gpipe(stages, micro_batches),
            ScheduleKind::DeepSpeed => Schedule::deepspeed(stages, micro_batches),
            ScheduleKind::OneFOneB => Schedule::one_f_one_b(stages, micro_batches),
            ScheduleKind::Interleaved => Schedule::interleaved(stages, micro_batches, chunks),
            ScheduleKind::Inference => Schedule::inference(stages, micro_batches),
        }
    }

    /// The generator that made this schedule.
    pub fn kind(&self) -> ScheduleKind {
        self.kind
    }

    /// The number of pipeline stages (ranks of the pipeline group).
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// The number of micro-batches per batch.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Model chunks per stage (`v`; 1 unless interleaved).
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Virtual stages: `chunks · stages`.
    pub fn virtual_stages(&self) -> usize {
        self.chunks * self.stages
    }

    /// The steps of stage `stage`'s program. Panics when `stage` is not
    /// below [`Schedule::stages`] (an index, as slices do).
    pub fn steps(&self, stage: usize) -> &[Step] {
        &self.programs[stage]
    }

    /// Stage `stage`'s instructions in program order.
    pub fn instrs(&self, stage: usize) -> impl Iterator<Item = &Instr> + '_ {
        self.programs[stage].iter().flatten()
    }

    /// True for DeepSpeed's lockstep schedules, whose steps line up across
    /// stages: the sends of a step are received in the same step.
    pub fn is_lockstep(&self) -> bool {
        matches!(self.kind, ScheduleKind::DeepSpeed | ScheduleKind::Inference)
    }

    /// Virtual stage of chunk `chunk` on stage `stage`: `chunk·stages + stage`.
    pub fn virtual_stage(&self, stage: usize, chunk: usize) -> usize {
        chunk * self.stages + stage
    }

    /// The stage and chunk of virtual stage `k`.
    pub fn stage_chunk(&self, k: usize) -> (usize, usize) {
        (k % self.stages, k / self.stages)
    }

    /// Where a point-to-point instruction of stage `stage` goes: the peer
    /// stage, the direction and the message it carries; `None` for the
    /// other instructions and for a transfer past either end of the
    /// pipeline (which no valid schedule contains).
    pub fn route(&self, stage: usize, instr: &Instr) -> Option<Route> {
        let last = self.virtual_stages().checked_sub(1)?;
        let (send, grad, mb, chunk) = match *instr {
            Instr::SendAct { mb, chunk } => (true, false, mb, chunk),
            Instr::RecvAct { mb, chunk } => (false, false, mb, chunk),
            Instr::SendGrad { mb, chunk } => (true, true, mb, chunk),
            Instr::RecvGrad { mb, chunk } => (false, true, mb, chunk),
            _ => return None,
        };
        let k = self.virtual_stage(stage, chunk);
        // Activations flow to k + 1, gradients to k - 1.
        let (peer_k, dest_k) = match (send, grad) {
            (true, false) => (k + 1, k + 1),
            (false, false) => (k.checked_sub(1)?, k),
            (true, true) => (k.checked_sub(1)?, k.checked_sub(1)?),
            (false, true) => (k + 1, k),
        };
        if peer_k > last {
            return None;
        }
        Some(Route {
            peer: self.stage_chunk(peer_k).0,
            send,
            msg: Msg {
                grad,
                mb,
                dest: dest_k,
            },
        })
    }

    /// How many activation buffers stage `stage` needs: the most
    /// micro-batch chunks it holds between their forward and backward (2
    /// for inference, as DeepSpeed allocates; at least 1).
    pub fn num_pipe_buffers(&self, stage: usize) -> usize {
        if !self.kind.trains() {
            return 2;
        }
        match self.kind {
            // DeepSpeed allocates max(2, min(S - s, M)) whatever the peak.
            ScheduleKind::DeepSpeed => 2.max((self.stages - stage).min(self.micro_batches)),
            _ => self.peak_in_flight(stage).max(1),
        }
    }

    /// DeepSpeed's buffer of micro-batch `mb` on stage `stage`:
    /// `mb % num_pipe_buffers` (buffers are reused cyclically).
    pub fn buffer(&self, stage: usize, mb: usize) -> usize {
        mb % self.num_pipe_buffers(stage)
    }

    /// The schedule as a table, one line per step index and one column per
    /// stage, instructions in [`Instr`]'s `Display` notation (`-` for an
    /// empty step) — the layout of the spec's golden table.
    pub fn table(&self) -> String {
        let rows = self.programs.iter().map(Vec::len).max().unwrap_or(0);
        let mut out = String::new();
        for t in 0..rows {
            let cells: Vec<String> = self
                .programs
                .iter()
                .map(|p| match p.get(t) {
                    Some(step) if !step.is_empty() => {
                        step.iter().map(Instr::to_string).collect::<Vec<_>>().join(" ")
                    }
                    _ => "-".to_string(),
                })
                .collect();
            out.push_str(&format!("{t} | {}\n", cells.join(" | ")));
        }
        out
    }
}

/// A message between stages: an activation or a gradient of micro-batch
/// `mb`, addressed to virtual stage `dest`. Unique within one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    /// A gradient (true) or an activation.
    pub grad: bool,
    /// The micro-batch.
    pub mb: usize,
    /// The virtual stage it is for.
    pub dest: usize,
}

impl Msg {
    /// The message as a point-to-point tag: unique per message of a batch.
    pub fn tag(&self) -> u64 {
        ((self.dest as u64) << 33) | ((self.mb as u64) << 1) | u64::from(self.grad)
    }
}

/// Where a point-to-point instruction goes (see [`Schedule::route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The other stage.
    pub peer: usize,
    /// True for a send, false for a receive.
    pub send: bool,
    /// The message.
    pub msg: Msg,
}

/// Errors unless `stages` and `micro_batches` are positive.
pub(crate) fn check_sizes(op: &'static str, stages: usize, micro_batches: usize) -> Result<()> {
    if stages == 0 || micro_batches == 0 {
        return Err(CommError::arg(
            op,
            format!("needs at least one stage and one micro-batch, got {stages} stages and {micro_batches} micro-batches"),
        ));
    }
    Ok(())
}
