//! Recording ops: the API every differentiable op is written against.
//!
//! An op computes its result eagerly, then calls [`record`] (one output) or
//! [`record_multi`] (several) with its inputs and a backward closure. The
//! closure captures only what the backward reads; it is dropped, freeing
//! those tensors, as soon as it has run.

use tessera_tensor::{Result, Tensor};

use crate::mode::{is_grad_enabled, note_edge};
use crate::node::{Edge, Meta, Node};
use crate::Var;

/// Wraps `output` of op `name` as a `Var`. When grad mode is on and some
/// input requires a gradient, records a node whose `backward(grad_out,
/// needs)` returns one optional gradient per input (`needs[i]` says whether
/// input `i` wants one; returning `None` there is fine). Otherwise the result
/// is a constant and `backward` is dropped unrun.
pub fn record(
    name: &'static str,
    output: Tensor,
    inputs: &[&Var],
    backward: impl FnOnce(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>> + Send + 'static,
) -> Var {
    let mut out = record_multi(name, vec![output], inputs, move |grads, needs| match &grads[0] {
        Some(g) => backward(g, needs),
        None => Ok(vec![None; needs.len()]),
    });
    out.pop().expect("one output")
}

/// Like [`record`] for an op with several outputs (split, topk, ...): the
/// backward receives one optional gradient per output, `None` for outputs no
/// gradient reached.
pub fn record_multi(
    name: &'static str,
    outputs: Vec<Tensor>,
    inputs: &[&Var],
    backward: impl FnOnce(&[Option<Tensor>], &[bool]) -> Result<Vec<Option<Tensor>>> + Send + 'static,
) -> Vec<Var> {
    let edges: Vec<Option<Edge>> = inputs.iter().map(|v| v.edge().cloned()).collect();
    if !is_grad_enabled() || edges.iter().all(Option::is_none) {
        edges.iter().flatten().for_each(note_edge);
        return outputs.into_iter().map(Var::constant).collect();
    }
    let metas = outputs.iter().map(Meta::of).collect();
    let node = Node::op(name, edges, metas, Box::new(backward));
    outputs
        .into_iter()
        .enumerate()
        .map(|(k, t)| {
            Var::from_edge(
                t,
                Some(Edge {
                    node: node.clone(),
                    output: k,
                }),
            )
        })
        .collect()
}
