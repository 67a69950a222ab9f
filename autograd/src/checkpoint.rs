//! Gradient checkpointing: keep a segment's inputs, drop its activations,
//! recompute them during backward.

use std::sync::Arc;

use tessera_tensor::{rng, Error, Result, Tensor};

use crate::autocast::{self, autocast_dtype};
use crate::engine::run;
use crate::mode::{collect_edges, enable_grad, is_grad_enabled, no_grad};
use crate::node::{id_watermark, Edge};
use crate::ops::{record_op_multi, registry};
use crate::Var;

/// Runs `f(inputs)` without recording its intermediate values, and records
/// one node that, during backward, reruns `f` (with the default random
/// generator restored to its state at the forward, so dropout draws the same
/// masks) and backpropagates through the recomputed segment.
///
/// Only `inputs`, the random state and the outputs are kept between forward
/// and backward. Parameters and other values that `f` captures and that
/// require a gradient receive their gradients as without checkpointing; the
/// results are bitwise equal to the un-checkpointed run when each captured
/// value is used once inside the segment (several uses are summed inside the
/// segment first, which can round differently).
///
/// `f` must be deterministic given its inputs and the random state. Errors
/// from `f` are returned from this call (forward) or from `backward`
/// (recomputation).
pub fn checkpoint<F>(f: F, inputs: &[Var]) -> Result<Vec<Var>>
where
    F: Fn(&[Var]) -> Result<Vec<Var>> + Send + Sync + 'static,
{
    if !is_grad_enabled() {
        return f(inputs);
    }
    let f = Arc::new(f);
    let rng_state = rng::snapshot();
    // Recomputed under the autocast state of this forward, so the segment
    // produces the same dtypes (and values) again.
    let cast_dtype = autocast_dtype();
    let detached: Vec<Var> = inputs.iter().map(Var::detach).collect();
    let (outputs, captured) = collect_edges(|| no_grad(|| f(&detached)));
    let outputs: Vec<Tensor> = outputs?.into_iter().map(Var::into_tensor).collect();

    // The node's inputs: the explicit ones, then what the segment read from
    // the graph outside it.
    let mut node_inputs: Vec<Var> = inputs.to_vec();
    node_inputs.extend(
        captured
            .iter()
            .map(|e| Var::from_edge(placeholder(), Some(e.clone()))),
    );
    let n_explicit = inputs.len();
    let saved: Vec<Tensor> = inputs.iter().map(|v| v.tensor().clone()).collect();
    let refs: Vec<&Var> = node_inputs.iter().collect();

    record_op_multi(registry::CHECKPOINT, outputs, &refs, move |grads, needs| {
        autocast::isolated(cast_dtype, || {
            recompute_backward(&*f, &saved, &captured, &rng_state, grads, &needs[..n_explicit])
        })
    })
}

/// Checkpoints a chain of blocks: every `every`-th group of `every` blocks
/// is run through [`checkpoint`] as one segment, so only segment boundaries
/// are kept. `every = 1` checkpoints each block; errors when `every` is 0.
pub fn checkpoint_sequential<F>(blocks: Vec<F>, every: usize, input: &Var) -> Result<Var>
where
    F: Fn(&Var) -> Result<Var> + Send + Sync + 'static,
{
    if every == 0 {
        return Err(Error::arg(
            "checkpoint_sequential",
            "segment length must be at least 1",
        ));
    }
    let mut blocks: Vec<Arc<F>> = blocks.into_iter().map(Arc::new).collect();
    let mut x = input.clone();
    while !blocks.is_empty() {
        let segment: Vec<Arc<F>> = blocks.drain(..every.min(blocks.len())).collect();
        let out = checkpoint(
            move |xs: &[Var]| {
                let mut h = xs[0].clone();
                for b in &segment {
                    h = b(&h)?;
                }
                Ok(vec![h])
            },
            &[x],
        )?;
        x = out.into_iter().next().expect("one output");
    }
    Ok(x)
}

/// A stand-in value for captured inputs: the node only needs their edges
/// (shapes are checked against the edge's own node).
fn placeholder() -> Tensor {
    Tensor::scalar(0.0f32)
}

fn recompute_backward<F>(
    f: &F,
    saved: &[Tensor],
    captured: &[Edge],
    rng_state: &rng::RngSnapshot,
    grads: &[Option<Tensor>],
    needs_explicit: &[bool],
) -> Result<Vec<Option<Tensor>>>
where
    F: Fn(&[Var]) -> Result<Vec<Var>>,
{
    let boundary = id_watermark();
    let fresh: Vec<Var> = saved
        .iter()
        .zip(needs_explicit)
        .map(|(t, &need)| {
            if need {
                Var::leaf(t.clone())
            } else {
                Var::constant(t.clone())
            }
        })
        .collect();
    let outer_rng = rng::snapshot();
    rng::restore(rng_state);
    let outputs = enable_grad(|| f(&fresh));
    rng::restore(&outer_rng);
    let outputs = outputs?;
    if outputs.len() != grads.len() {
        return Err(Error::arg(
            "checkpoint",
            format!(
                "the recomputed segment returned {} outputs, the forward {}",
                outputs.len(),
                grads.len()
            ),
        ));
    }
    let seeds: Vec<(Edge, Tensor)> = outputs
        .iter()
        .zip(grads)
        .filter_map(|(o, g)| Some((o.edge()?.clone(), g.clone()?)))
        .collect();
    let mut outcome = run(seeds, boundary)?;
    let mut result: Vec<Option<Tensor>> = fresh
        .iter()
        .map(|v| v.id().and_then(|id| outcome.leaves.remove(&id.0)))
        .collect();
    for e in captured {
        let pos = outcome.boundary.iter().position(|(b, _)| b.same(e));
        result.push(pos.map(|p| outcome.boundary.swap_remove(p).1));
    }
    Ok(result)
}
