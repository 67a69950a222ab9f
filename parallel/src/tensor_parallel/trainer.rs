//! Training the GPT on the 3-D grid: tensor parallelism inside each stage,
//! the pipeline engine across stages, data parallelism across replicas.

use tessera_autograd::Parameter;
use tessera_nn::models::Gpt;
use tessera_optim::Optimizer;
use tessera_tensor::{StateDict, Tensor};

use super::gpt::GptParallel;
use super::grads::SequenceParallelGradSync;
use super::random::model_parallel_manual_seed;
use crate::comm::{CommExt, Communicator};
use crate::error::{CommError, Result};
use crate::grid::ParallelGrid;
use crate::pipeline::{Partition, PipelineEngine, PipelineModule, Schedule, StepReport};

/// How [`train_gpt_3d`] lays the model over the world.
#[derive(Debug, Clone)]
pub struct Gpt3dOptions {
    /// Tensor-parallel size t.
    pub tp: usize,
    /// Data-parallel size d.
    pub dp: usize,
    /// The pipeline schedule (its stage count is the pipeline size p).
    pub schedule: Schedule,
    /// Sequence parallelism inside each tensor-parallel group.
    pub sequence_parallel: bool,
    /// The dropout seed (Megatron's `--seed`): each rank's thread is seeded
    /// with `model_parallel_manual_seed(seed + 100·pp_rank, tp_rank)`, as
    /// Megatron's `_set_random_seed` does, so the replicas of the data axis
    /// draw the same masks and the stages different ones.
    pub seed: u64,
}

/// What [`train_gpt_3d`] returns on one rank.
pub struct Gpt3dOutcome {
    /// This rank's parameters, named as in the pipeline (`"0.wte.weight"`,
    /// `"1.attn.c_attn.weight"` for block 0, …, the head last).
    pub params: Vec<(String, Parameter)>,
    /// On world rank 0: the trained model consolidated to the serial
    /// [`Gpt`]'s state dict (TP shards gathered, stages collected); `None`
    /// elsewhere.
    pub state_dict: Option<StateDict>,
}

/// Builds the optimizer of a rank's parameters.
pub type MakeOptimizer<'a> = &'a dyn Fn(Vec<Parameter>) -> tessera_tensor::Result<Box<dyn Optimizer>>;

/// Trains `master` (the same on every rank) on the `tp × pp × dp` grid of
/// `world` in Megatron's rank order: each rank slices its stage's layers
/// for its TP rank, ties the token embedding between the first and last
/// stage, and for each step `0 .. steps` takes the global batch
/// `batch(step) = (tokens [B, s], targets [B, s])`, keeps its replica's
/// `B/d` rows and trains them through the schedule (dropout seeded as
/// [`Gpt3dOptions::seed`] says); gradients are averaged
/// over the DP group and the sequence-parallel ones summed over TP before
/// `make_opt`'s optimizer steps. Calls `report(step, &report)` after each
/// step. Returns this rank's parameters and, on world rank 0, the
/// consolidated state dict ([`Gpt3dOutcome`]). Errors
/// when the grid does not fit the world, the model does not split, `B` does
/// not divide by `d` and the micro-batches, or a rank fails.
pub fn train_gpt_3d(
    world: &dyn Communicator,
    master: &Gpt,
    opts: &Gpt3dOptions,
    make_opt: MakeOptimizer<'_>,
    steps: usize,
    batch: &mut dyn FnMut(usize) -> Result<(Tensor, Tensor)>,
    report: &mut dyn FnMut(usize, &StepReport),
) -> Result<Gpt3dOutcome> {
    let pp = opts.schedule.stages();
    let grid = ParallelGrid::new(world, opts.tp, pp, opts.dp)?;
    let stage_seed = opts.seed.wrapping_add(100 * grid.coords.pp as u64);
    model_parallel_manual_seed(stage_seed, grid.coords.tp)?;
    let model = GptParallel::from_master(master, &grid.tp, opts.sequence_parallel)?;
    // The same parameter handles as the pipeline's layers, kept whole for
    // consolidation at the end.
    let shadow = model.clone();
    let parts = model.into_layers(pp > 1);
    let n_layers = parts.layers.len();
    let module = PipelineModule::new(parts.layers, pp, opts.schedule.chunks(), &Partition::Layers)?;
    let owner: Vec<usize> = (0..n_layers)
        .map(|l| {
            (0..pp)
                .find(|&s| (0..opts.schedule.chunks()).any(|c| module.layers_of(s, c).contains(&l)))
                .unwrap_or(0)
        })
        .collect();
    let stage = module.into_stage(grid.coords.pp)?;
    let params = stage.parameters();
    let roles = parts
        .roles
        .into_iter()
        .filter(|(p, _)| params.iter().any(|q| q.same(p)))
        .collect();
    let inner = make_opt(params)?;
    let mut opt = SequenceParallelGradSync::new(inner, roles, grid.tp.clone());
    let loss = GptParallel::loss_fn(grid.tp.clone());
    let mut engine = PipelineEngine::new(grid.pp.as_ref(), opts.schedule.clone(), stage, loss)?
        .with_data_parallel(grid.dp.as_ref());
    if pp > 1 {
        let (first, last) = (grid.coords.pp == 0, grid.coords.pp + 1 == pp);
        let mine = if first {
            Some(parts.wte.clone())
        } else if last {
            Some(parts.head_weight.clone())
        } else {
            None
        };
        engine.tie(&[0, pp - 1], mine)?;
    }
    for step in 0..steps {
        let (tokens, targets) = batch(step)?;
        let rows = tokens.shape().first().copied().unwrap_or(0);
        if rows == 0 || !rows.is_multiple_of(opts.dp) || targets.shape() != tokens.shape() {
            return Err(CommError::arg(
                "train_gpt_3d",
                format!(
                    "a batch of tokens {:?} and targets {:?} does not split over {} replicas",
                    tokens.shape(),
                    targets.shape(),
                    opts.dp
                ),
            ));
        }
        let part = rows / opts.dp;
        let mine = |t: &Tensor| t.narrow(0, grid.coords.dp * part, part);
        let r = engine.train_batch(&mine(&tokens)?, &mine(&targets)?, &mut opt)?;
        report(step, &r);
    }
    let params = engine.stage().named_parameters();
    let state_dict = collect_state_dict(&shadow, &grid, &owner)?;
    Ok(Gpt3dOutcome { params, state_dict })
}

/// Tag of the consolidation messages (above the pipeline engine's tags).
const CONSOLIDATE_TAG: u64 = 0x7e57_0000_0000;

/// Consolidates every stage's TP shards (a collective over each TP group),
/// then sends the entries each stage owns from replica 0's TP rank 0 to
/// world rank 0, which returns the whole state dict.
fn collect_state_dict(
    shadow: &GptParallel,
    grid: &ParallelGrid,
    owner: &[usize],
) -> Result<Option<StateDict>> {
    let sd = shadow.consolidate()?;
    if grid.coords.tp != 0 || grid.coords.dp != 0 {
        return Ok(None);
    }
    let n_layer = shadow.config().n_layer;
    let layer_of = |key: &str| -> usize {
        match key
            .strip_prefix("h.")
            .and_then(|r| r.split('.').next())
            .and_then(|i| i.parse::<usize>().ok())
        {
            Some(i) => i + 1,
            None if key.starts_with("ln_f.") => n_layer + 1,
            None => 0,
        }
    };
    let me = grid.coords.pp;
    let mut out = (me == 0).then(StateDict::new);
    for (i, (key, value)) in sd.iter().enumerate() {
        let from = owner.get(layer_of(key)).copied().unwrap_or(0);
        let tag = CONSOLIDATE_TAG + i as u64;
        match (me == from, out.as_mut()) {
            (true, Some(o)) => {
                o.insert(key, value.clone());
            }
            (false, Some(o)) => {
                o.insert(key, grid.pp.recv_tensor(from, tag)?);
            }
            (true, None) => grid.pp.send_tensor(value, 0, tag)?,
            (false, None) => {}
        }
    }
    Ok(out)
}
