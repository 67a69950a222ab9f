//! Pipeline parallelism: schedules as data and one executor for them.
//!
//! A [`Schedule`] is a program per stage, a list of steps of [`Instr`]s
//! (DeepSpeed's instruction set, spec §5.1), produced by a generator:
//! [`Schedule::gpipe`], DeepSpeed's lockstep [`Schedule::deepspeed`],
//! Megatron's [`Schedule::one_f_one_b`] and [`Schedule::interleaved`], and
//! [`Schedule::inference`]. Schedules are checked without threads
//! ([`Schedule::check`]: completeness, causality, matching sends and
//! receives, deadlock freedom, buffer bounds) and simulated with unit
//! costs ([`simulate`]) to get the bubble `(p − 1)/(v·m + p − 1)`.
//!
//! One executor runs them all: a [`PipelineModule`] splits a list of layers
//! (a `Sequential`) into `p·v` parts by layer count, parameter count or
//! explicit boundaries ([`Partition`]); each rank keeps its
//! [`PipelineStage`] and drives it with a [`PipelineEngine`] over the
//! pipeline group (any backend): activations go forward and gradients back
//! as point-to-point messages, the loss is taken on the last stage, the
//! micro-batch gradients are summed in micro-batch order (so a pipeline
//! step equals single-process gradient accumulation bitwise), tied weights
//! are summed over their stages ([`PipelineEngine::tie`]), and a
//! [`PipelineGrid`] adds a data-parallel axis whose all-reduce averages the
//! gradients ([`PipelineEngine::with_data_parallel`]).
//!
//! ```
//! use tessera_parallel::pipeline::{simulate, Costs, Schedule};
//! let s = Schedule::one_f_one_b(4, 8)?;
//! s.check()?;
//! let t = simulate(&s, Costs::UNIT)?;
//! assert_eq!(t.makespan, 2 * (8 + 4 - 1));
//! assert!((t.bubble_fraction() - s.bubble_theory()).abs() < 1e-12);
//! # Ok::<(), tessera_parallel::CommError>(())
//! ```

mod check;
mod deepspeed;
mod engine;
mod gpipe;
mod grid;
mod instr;
mod interleaved;
mod lower;
mod module;
mod one_f_one_b;
mod partition;
mod simulate;

pub use engine::{LossFn, PipelineEngine, StepReport};
pub use grid::PipelineGrid;
pub use instr::{Instr, Msg, Route, Schedule, ScheduleKind, Step};
pub use module::{PipelineModule, PipelineStage, StageChunk};
pub use partition::Partition;
pub use simulate::{run_untimed, simulate, Costs, Semantics, Timeline};

#[cfg(test)]
mod tests;
