//! Named random streams beside the default generator (Megatron's
//! `CudaRNGStatesTracker`): each thread keeps a table of named generator
//! states, and [`fork`] runs a closure with one of them swapped in as the
//! default generator, so ops that draw from the default generator
//! (dropout) draw from that stream instead, and the stream advances.
//!
//! Tensor parallelism uses it for the "model-parallel" stream, seeded
//! differently on each rank of a tensor-parallel group, while the default
//! generator stays seeded the same on every rank. The table is per thread,
//! like the default generator: ranks run as threads of one process.
//! [`snapshot`] and [`restore`] capture both the default generator and the
//! table, which is what gradient checkpointing saves so that a recomputed
//! segment replays the same draws on every stream.

use std::cell::RefCell;

use super::{default_state, set_default_state, Generator, RngState};
use crate::{Error, Result};

thread_local! {
    static TRACKED: RefCell<Vec<(String, RngState)>> = const { RefCell::new(Vec::new()) };
}

/// Adds the stream `name` seeded with `seed` (at offset 0) to this thread's
/// table (Megatron's `tracker.add`). Errors when `name` or `seed` is
/// already in the table (two streams with one seed would draw the same
/// numbers).
pub fn add_tracked(name: &str, seed: u64) -> Result<()> {
    TRACKED.with(|t| {
        let mut t = t.borrow_mut();
        if let Some((n, s)) = t.iter().find(|(n, s)| n == name || s.seed == seed) {
            return Err(Error::arg(
                "rng::add_tracked",
                format!(
                    "cannot add stream {name:?} with seed {seed}: stream {n:?} with seed {} exists",
                    s.seed
                ),
            ));
        }
        t.push((name.to_string(), Generator::new(seed).state()));
        Ok(())
    })
}

/// Empties this thread's table (Megatron's `tracker.reset`).
pub fn reset_tracked() {
    TRACKED.with(|t| t.borrow_mut().clear());
}

/// Every stream of this thread's table with its current state, in the
/// order they were added (Megatron's `tracker.get_states`).
pub fn tracked_states() -> Vec<(String, RngState)> {
    TRACKED.with(|t| t.borrow().clone())
}

/// Replaces this thread's table with `states` (Megatron's
/// `tracker.set_states`).
pub fn set_tracked_states(states: Vec<(String, RngState)>) {
    TRACKED.with(|t| *t.borrow_mut() = states);
}

/// Runs `f` with the stream `name` as this thread's default generator,
/// then stores the advanced stream back and restores the default generator
/// (Megatron's `with tracker.fork(name)`). Returns `f`'s result. Errors
/// when `name` is not in the table.
pub fn fork<R>(name: &str, f: impl FnOnce() -> R) -> Result<R> {
    let state = TRACKED
        .with(|t| t.borrow().iter().find(|(n, _)| n == name).map(|(_, s)| *s))
        .ok_or_else(|| {
            Error::arg(
                "rng::fork",
                format!("random stream {name:?} was not added on this thread"),
            )
        })?;
    let outer = default_state();
    set_default_state(state);
    let out = f();
    let advanced = default_state();
    set_default_state(outer);
    TRACKED.with(|t| {
        if let Some(entry) = t.borrow_mut().iter_mut().find(|(n, _)| n == name) {
            entry.1 = advanced;
        }
    });
    Ok(out)
}

/// The state of every random stream of this thread: the default generator
/// and the named streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RngSnapshot {
    default: RngState,
    tracked: Vec<(String, RngState)>,
}

/// Captures this thread's default generator and named streams.
pub fn snapshot() -> RngSnapshot {
    RngSnapshot {
        default: default_state(),
        tracked: tracked_states(),
    }
}

/// Restores a [`snapshot`]: the default generator and the whole table.
pub fn restore(s: &RngSnapshot) {
    set_default_state(s.default);
    set_tracked_states(s.tracked.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{manual_seed, DType, Tensor};

    fn draw() -> Vec<f32> {
        Tensor::rand(&[6], DType::F32).unwrap().to_vec::<f32>().unwrap()
    }

    #[test]
    fn fork_draws_from_the_named_stream_and_leaves_the_default_alone() {
        reset_tracked();
        manual_seed(1);
        add_tracked("mp", 2).unwrap();
        let in_fork = fork("mp", draw).unwrap();
        let default_after = draw();
        let in_fork2 = fork("mp", draw).unwrap();

        manual_seed(1);
        assert_eq!(
            draw(),
            default_after,
            "the default stream did not advance in the fork"
        );
        manual_seed(2);
        assert_eq!(draw(), in_fork, "the fork drew from seed 2");
        assert_eq!(draw(), in_fork2, "and the stream continued where it stopped");

        assert!(add_tracked("mp", 3).is_err(), "a name twice");
        assert!(add_tracked("other", 2).is_err(), "a seed twice");
        assert!(fork("missing", draw).is_err());
        reset_tracked();
    }

    #[test]
    fn snapshot_restores_every_stream() {
        reset_tracked();
        manual_seed(5);
        add_tracked("mp", 6).unwrap();
        let saved = snapshot();
        let a = (draw(), fork("mp", draw).unwrap());
        restore(&saved);
        let b = (draw(), fork("mp", draw).unwrap());
        assert_eq!(a, b);
        reset_tracked();
    }
}
