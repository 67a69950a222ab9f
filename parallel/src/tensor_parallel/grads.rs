//! Gradient bookkeeping of tensor-parallel models: summing the partial
//! gradients of sequence-parallel replicated parameters over the group, and
//! the global gradient norm that counts each replicated parameter once.

use tessera_autograd::{Gradients, Parameter};
use tessera_optim::{Hyper, Optimizer, StateDict};
use tessera_tensor::{DType, Result};

use super::mappings::{all_reduce, comm_error};
use super::{TpComm, TpRole};
use crate::comm::{CommExt, Communicator};
use crate::element::ReduceOp;

/// Sums over the TP group the gradients of the parameters whose role is
/// [`TpRole::SequenceParallel`] (Megatron's
/// `_allreduce_non_tensor_model_parallel_grads`), in place in `grads`. A
/// parameter without a gradient contributes zeros. A collective: every rank
/// passes the same parameters in the same order. Errors when one fails.
pub fn allreduce_sequence_parallel_grads(
    params: &[(Parameter, TpRole)],
    grads: &mut Gradients,
    comm: &TpComm,
) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    for (p, _) in params.iter().filter(|(_, r)| *r == TpRole::SequenceParallel) {
        let Some(id) = p.id() else { continue };
        let g = match grads.get_id(id) {
            Some(g) => g.clone(),
            None => p.tensor()?.zeros_like(None)?,
        };
        grads.insert(id, all_reduce(comm, &g, "allreduce_sequence_parallel_grads")?);
    }
    Ok(())
}

/// The global L2 norm of the gradients of a model split over a TP group
/// (and optionally the stages of a pipeline group `pp`): sharded
/// parameters count on every rank, replicated ones only on TP rank 0, and
/// the sums of squares are all-reduced over TP and then PP (Megatron's
/// `param_is_not_tensor_parallel_duplicate`). Every rank gets the same
/// value. Missing gradients count as zeros. Errors when a collective fails.
pub fn tp_grad_norm(
    params: &[(Parameter, TpRole)],
    grads: &Gradients,
    tp: &TpComm,
    pp: Option<&dyn Communicator>,
) -> Result<f64> {
    let mut sq = 0.0f64;
    for (p, role) in params {
        if *role != TpRole::Sharded && tp.rank() != 0 {
            continue;
        }
        if let Some(g) = p.grad(grads) {
            sq += g
                .to_dtype(DType::F64)?
                .to_vec::<f64>()?
                .iter()
                .map(|v| v * v)
                .sum::<f64>();
        }
    }
    let mut total = [sq];
    tp.all_reduce_slice(&mut total, ReduceOp::Sum)
        .map_err(comm_error("tp_grad_norm"))?;
    if let Some(pp) = pp {
        pp.all_reduce_slice(&mut total, ReduceOp::Sum)
            .map_err(comm_error("tp_grad_norm"))?;
    }
    Ok(total[0].sqrt())
}

/// An optimizer that first sums the sequence-parallel gradients over the TP
/// group ([`allreduce_sequence_parallel_grads`]), then steps the wrapped
/// optimizer: drop-in where an engine calls `step` (the pipeline engine).
pub struct SequenceParallelGradSync {
    inner: Box<dyn Optimizer>,
    params: Vec<(Parameter, TpRole)>,
    comm: TpComm,
}

impl SequenceParallelGradSync {
    /// Wraps `inner`; `params` lists (at least) the parameters `inner`
    /// updates, with their roles.
    pub fn new(inner: Box<dyn Optimizer>, params: Vec<(Parameter, TpRole)>, comm: TpComm) -> Self {
        SequenceParallelGradSync { inner, params, comm }
    }
}

impl Optimizer for SequenceParallelGradSync {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn num_groups(&self) -> usize {
        self.inner.num_groups()
    }
    fn group_params(&self, group: usize) -> &[Parameter] {
        self.inner.group_params(group)
    }
    fn hyper(&self, group: usize) -> Option<&dyn Hyper> {
        self.inner.hyper(group)
    }
    fn hyper_mut(&mut self, group: usize) -> Option<&mut dyn Hyper> {
        self.inner.hyper_mut(group)
    }
    fn with_params(&self, groups: Vec<Vec<Parameter>>) -> Result<Box<dyn Optimizer>> {
        let inner = self.inner.with_params(groups)?;
        Ok(Box::new(SequenceParallelGradSync::new(
            inner,
            self.params.clone(),
            self.comm.clone(),
        )))
    }
    /// Sums the sequence-parallel gradients over the group (a collective),
    /// then steps. Errors when the collective or the step fails.
    fn step(&mut self, grads: &Gradients) -> Result<()> {
        let mut synced = Gradients::default();
        for (id, g) in grads.iter() {
            synced.insert(*id, g.clone());
        }
        allreduce_sequence_parallel_grads(&self.params, &mut synced, &self.comm)?;
        self.inner.step(&synced)
    }
    fn state_dict(&self) -> StateDict {
        self.inner.state_dict()
    }
    fn load_state_dict(&mut self, sd: &StateDict) -> Result<()> {
        self.inner.load_state_dict(sd)
    }
}
