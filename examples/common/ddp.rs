//! Data parallelism as the training examples share it (`train_mnist --ddp`,
//! `train --ddp`): starting the ranks, each rank's rows of a batch, and the
//! communication-compressed optimizers, which exchange their own momentum.

use tessera::optim::{
    OnebitAdam, OnebitLamb, OnebitLambConfig, OnebitOptions, Optimizer, ParamGroup, ZeroOneAdam,
    ZeroOneAdamConfig, DEFAULT_VARIANCE_MASK,
};
use tessera::parallel::{tcp, Communicator, CompressedAllReduce, LocalGroup};

use super::BoxResult;

/// The names `--optim`/`--opt` accepts for the compressed optimizers.
pub(crate) const COMPRESSED: [&str; 3] = ["onebit-adam", "onebit-lamb", "zero-one-adam"];

/// Settings of the compressed optimizers from the command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CompressedSettings {
    /// Warm-up steps of 1-bit Adam/LAMB, the last variance step of 0/1 Adam.
    pub freeze_step: u64,
    /// 0/1 Adam's local steps between doublings of the sync interval.
    pub local_step_scaler: u64,
    /// The ratio of the automatic low-variance mask (`None`: off, as
    /// DeepSpeed).
    pub variance_mask: Option<f64>,
}

impl Default for CompressedSettings {
    fn default() -> Self {
        CompressedSettings {
            freeze_step: 100,
            local_step_scaler: 32_678,
            variance_mask: Some(DEFAULT_VARIANCE_MASK),
        }
    }
}

/// Parses `--variance-mask`: a non-negative ratio, or `off`. Errors with
/// a message naming the value.
pub(crate) fn parse_variance_mask(value: &str) -> Result<Option<f64>, String> {
    if value == "off" {
        return Ok(None);
    }
    match value.parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.0 => Ok(Some(r)),
        _ => Err(format!(
            "bad value {value:?} for --variance-mask: expected a ratio >= 0 or off"
        )),
    }
}

/// The compressed optimizer `name` (one of [`COMPRESSED`]) over `groups`,
/// exchanging over `comm`; `None` for any other name. Errors when a
/// setting is out of its domain.
pub(crate) fn compressed_optimizer<'c>(
    name: &str,
    groups: Vec<ParamGroup<OnebitOptions>>,
    settings: CompressedSettings,
    comm: &'c dyn Communicator,
) -> BoxResult<Option<Box<dyn Optimizer + 'c>>> {
    let reducer = || CompressedAllReduce::new(comm);
    let mask = settings.variance_mask;
    Ok(Some(match name {
        "onebit-adam" => Box::new(
            OnebitAdam::with_groups(groups, settings.freeze_step)?
                .with_reducer(reducer())
                .with_variance_mask(mask)?,
        ),
        "onebit-lamb" => {
            let cfg = OnebitLambConfig {
                freeze_step: settings.freeze_step,
                ..Default::default()
            };
            Box::new(
                OnebitLamb::with_groups(groups, cfg)?
                    .with_reducer(reducer())
                    .with_variance_mask(mask)?,
            )
        }
        "zero-one-adam" => {
            let cfg = ZeroOneAdamConfig {
                var_freeze_step: settings.freeze_step,
                local_step_scaler: settings.local_step_scaler,
                ..Default::default()
            };
            Box::new(
                ZeroOneAdam::with_groups(groups, cfg)?
                    .with_reducer(reducer())
                    .with_variance_mask(mask)?,
            )
        }
        _ => return Ok(None),
    }))
}

/// Runs `rank` on every rank of a data-parallel group: `backend` `tcp`
/// joins the group the launcher (`tessera-run`, `srun`) describes in the
/// environment, this process being one rank; `local` runs `world` ranks
/// as threads of this process. Returns rank 0's result (this process's
/// under tcp). Errors when the group cannot be formed or any rank fails,
/// naming each failed `what` (rank, stage) and its error.
pub(crate) fn launch<T: Send>(
    backend: &str,
    world: usize,
    what: &str,
    rank: impl Fn(&dyn Communicator) -> BoxResult<T> + Sync,
) -> BoxResult<T> {
    if backend == "tcp" {
        let comm = tcp::init_from_env()?;
        return rank(&comm);
    }
    let outs = LocalGroup::run(world, |comm| rank(comm).map_err(|e| e.to_string()))?;
    rank_0_result(outs, what)
}

/// Rank 0's value among the ranks' results `outs`, or an error listing
/// every failed rank as `{what} {rank}: {error}`.
pub(crate) fn rank_0_result<T>(outs: Vec<Result<T, String>>, what: &str) -> BoxResult<T> {
    let mut first = None;
    let mut errors = Vec::new();
    for (rank, out) in outs.into_iter().enumerate() {
        match out {
            Ok(r) if rank == 0 => first = Some(r),
            Ok(_) => {}
            Err(e) => errors.push(format!("{what} {rank}: {e}")),
        }
    }
    match first {
        Some(r) if errors.is_empty() => Ok(r),
        _ => Err(errors.join("; ").into()),
    }
}

/// Rank `rank`'s rows of a batch of indices `idx` split into `n` equal
/// blocks (the caller skips batches whose size `n` does not divide).
pub(crate) fn rank_rows(idx: &[usize], rank: usize, n: usize) -> &[usize] {
    let rows = idx.len() / n;
    &idx[rank * rows..(rank + 1) * rows]
}
