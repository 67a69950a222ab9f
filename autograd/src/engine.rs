//! The backward pass: a reverse walk over the recorded nodes reachable from
//! the outputs, by descending creation id (creation order is a topological
//! order, so no sort by dependencies is needed), accumulating gradients in
//! place and firing leaf hooks as soon as a leaf's gradient is final.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use tessera_tensor::{Error, Result, Tensor};

use crate::node::{Edge, Node, NodeKind};
use crate::{Var, VarId};

/// The gradients of the leaves a backward pass reached, by leaf id.
#[derive(Default)]
pub struct Gradients {
    map: HashMap<VarId, Tensor>,
}

impl Gradients {
    /// The gradient of `var`, if it is a leaf the backward pass reached.
    pub fn get(&self, var: &Var) -> Option<&Tensor> {
        var.id().and_then(|id| self.map.get(&id))
    }

    /// The gradient of the leaf with id `id`.
    pub fn get_id(&self, id: VarId) -> Option<&Tensor> {
        self.map.get(&id)
    }

    /// Mutable access to the gradient of the leaf with id `id` (to scale or
    /// clip it in place).
    pub fn get_id_mut(&mut self, id: VarId) -> Option<&mut Tensor> {
        self.map.get_mut(&id)
    }

    /// Removes and returns the gradient of `var`.
    pub fn remove(&mut self, var: &Var) -> Option<Tensor> {
        var.id().and_then(|id| self.map.remove(&id))
    }

    /// Inserts (or replaces) the gradient for `id` — for code that edits
    /// gradients between backward and the optimizer (clipping, all-reduce).
    pub fn insert(&mut self, id: VarId, grad: Tensor) {
        self.map.insert(id, grad);
    }

    /// The number of leaves with a gradient.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no leaf received a gradient.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Iterates over (leaf id, gradient) pairs in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&VarId, &Tensor)> {
        self.map.iter()
    }

    /// Iterates over (leaf id, mutable gradient) pairs in no particular order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&VarId, &mut Tensor)> {
        self.map.iter_mut()
    }
}

impl Var {
    /// Backpropagates from this scalar (one-element) value with gradient 1.
    /// Errors when the value has more than one element (use
    /// [`Var::backward_with`]), does not require grad, or its graph was
    /// already consumed by an earlier backward.
    pub fn backward(&self) -> Result<Gradients> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "backward",
                format!(
                    "backward() needs a one-element output, got shape {:?}; pass a gradient with backward_with",
                    self.shape()
                ),
            ));
        }
        let one = Tensor::from_vec(vec![1.0f64], &[])?
            .to_dtype(self.dtype())?
            .reshape(self.shape())?
            .to_device(self.device())?;
        self.backward_with(&one)
    }

    /// Backpropagates from this value with `grad` as its gradient. Errors
    /// when `grad`'s shape or dtype differ from the value's, when the value
    /// does not require grad, or when the graph was already consumed.
    pub fn backward_with(&self, grad: &Tensor) -> Result<Gradients> {
        backward_many(&[(self, grad)])
    }
}

/// Backpropagates from several outputs at once (their gradients add up where
/// the graphs meet). Errors as [`Var::backward_with`].
pub fn backward_many(roots: &[(&Var, &Tensor)]) -> Result<Gradients> {
    let mut seeds = Vec::with_capacity(roots.len());
    for (var, grad) in roots {
        let edge = var.edge().ok_or_else(|| {
            Error::arg(
                "backward",
                "the output does not require grad: no input was a leaf with requires_grad, or it was computed under no_grad",
            )
        })?;
        if grad.shape() != var.shape() || grad.dtype() != var.dtype() {
            return Err(Error::shape(
                "backward",
                format!(
                    "gradient of shape {:?} ({}) given for an output of shape {:?} ({})",
                    grad.shape(),
                    grad.dtype(),
                    var.shape(),
                    var.dtype()
                ),
            ));
        }
        seeds.push((edge.clone(), (*grad).clone()));
    }
    let out = run(seeds, 0)?;
    Ok(Gradients {
        map: out.leaves.into_iter().map(|(id, g)| (VarId(id), g)).collect(),
    })
}

/// What a walk produced: final gradients of the leaves it owns, and the
/// gradients that reached nodes at or below the boundary (left for an outer
/// walk, which owns those nodes).
pub(crate) struct Outcome {
    pub leaves: IdMap<Tensor>,
    pub boundary: Vec<(Edge, Tensor)>,
}

/// Walks the graph from `seeds`. Nodes with id ≤ `boundary` are not entered:
/// the gradients reaching them are returned instead (gradient checkpointing
/// runs an inner walk over a recomputed segment this way). `boundary = 0`
/// walks everything.
pub(crate) fn run(seeds: Vec<(Edge, Tensor)>, boundary: u64) -> Result<Outcome> {
    // Discover the op nodes to run and count, for every node, how many edges
    // from those ops point at it: a leaf's gradient is final when all have run.
    let mut pending: IdMap<usize> = IdMap::default();
    let mut ops: Vec<Arc<Node>> = Vec::new();
    let mut seen: IdSet = IdSet::default();
    let mut stack: Vec<Arc<Node>> = Vec::new();
    for (e, _) in &seeds {
        if seen.insert(e.node.id) {
            stack.push(e.node.clone());
        }
    }
    while let Some(node) = stack.pop() {
        if node.id <= boundary {
            continue;
        }
        if let NodeKind::Op { inputs, .. } = &node.kind {
            for e in inputs.iter().flatten() {
                *pending.entry(e.node.id).or_default() += 1;
                if seen.insert(e.node.id) {
                    stack.push(e.node.clone());
                }
            }
            ops.push(node);
        }
    }
    ops.sort_unstable_by_key(|n| std::cmp::Reverse(n.id));

    let mut grads: IdMap<(Arc<Node>, Vec<Option<Tensor>>)> = IdMap::default();
    let mut out = Outcome {
        leaves: IdMap::default(),
        boundary: Vec::new(),
    };
    for (e, g) in seeds {
        accumulate(&mut grads, &e, g)?;
    }
    // Seeds that are leaves no op feeds into are final right away.
    let ready: Vec<u64> = grads
        .iter()
        .filter(|(id, (n, _))| **id > boundary && is_leaf(n) && !pending.contains_key(id))
        .map(|(id, _)| *id)
        .collect();
    for id in ready {
        finish_leaf(&mut grads, &mut out, id);
    }

    let _phase = tessera_tensor::profile::backward_scope();
    for node in ops {
        let NodeKind::Op {
            name,
            inputs,
            outputs,
            backward,
        } = &node.kind
        else {
            unreachable!("only op nodes are queued")
        };
        if let Some((_, out_grads)) = grads.remove(&node.id) {
            let f = backward.lock().expect("backward lock").take().ok_or_else(|| {
                Error::arg(
                    "backward",
                    format!(
                        "the graph through `{name}` (output shapes {:?}) was already used by a backward pass and its saved tensors freed",
                        outputs.iter().map(|m| &m.shape).collect::<Vec<_>>()
                    ),
                )
            })?;
            let needs: Vec<bool> = inputs.iter().map(Option::is_some).collect();
            // The node's span holds those of the ops its rule runs (see
            // `tessera_tensor::profile`); accumulating into the input
            // gradients below counts as the node's too.
            let _span = tessera_tensor::profile::op_span(name, out_grads.iter().flatten());
            let in_grads = f(&out_grads, &needs)?;
            if in_grads.len() != inputs.len() {
                return Err(Error::arg(
                    "backward",
                    format!(
                        "`{name}` returned {} gradients for {} inputs",
                        in_grads.len(),
                        inputs.len()
                    ),
                ));
            }
            for (e, g) in inputs.iter().zip(in_grads) {
                if let (Some(e), Some(g)) = (e, g) {
                    check_grad(name, e, &g)?;
                    accumulate(&mut grads, e, g)?;
                }
            }
        }
        for e in inputs.iter().flatten() {
            let left = pending.get_mut(&e.node.id).expect("counted during discovery");
            *left -= 1;
            if *left == 0 && e.node.id > boundary && is_leaf(&e.node) {
                finish_leaf(&mut grads, &mut out, e.node.id);
            }
        }
    }
    for (_, (node, gs)) in grads {
        debug_assert!(node.id <= boundary, "every node above the boundary was consumed");
        for (k, g) in gs.into_iter().enumerate() {
            if let Some(g) = g {
                out.boundary.push((
                    Edge {
                        node: node.clone(),
                        output: k,
                    },
                    g,
                ));
            }
        }
    }
    Ok(out)
}

fn is_leaf(node: &Node) -> bool {
    matches!(node.kind, NodeKind::Leaf { .. })
}

/// Moves a leaf's final gradient to the outcome and runs its hooks.
fn finish_leaf(grads: &mut IdMap<(Arc<Node>, Vec<Option<Tensor>>)>, out: &mut Outcome, id: u64) {
    let Some((node, mut gs)) = grads.remove(&id) else {
        return;
    };
    let Some(g) = gs[0].take() else { return };
    if let NodeKind::Leaf { hooks, .. } = &node.kind {
        let hooks = hooks.lock().expect("hook list lock").clone();
        for h in hooks {
            h(&g);
        }
    }
    out.leaves.insert(id, g);
}

fn check_grad(op: &'static str, e: &Edge, g: &Tensor) -> Result<()> {
    let meta = e.node.meta(e.output);
    if g.shape() != meta.shape.as_slice() || g.dtype() != meta.dtype {
        return Err(Error::shape(
            "backward",
            format!(
                "`{op}` produced a gradient of shape {:?} ({}) for an input of shape {:?} ({})",
                g.shape(),
                g.dtype(),
                meta.shape,
                meta.dtype
            ),
        ));
    }
    Ok(())
}

/// Adds `g` into the gradient slot of `e`, in place when the slot's buffer
/// is not shared.
fn accumulate(grads: &mut IdMap<(Arc<Node>, Vec<Option<Tensor>>)>, e: &Edge, g: Tensor) -> Result<()> {
    let (_, slots) = grads
        .entry(e.node.id)
        .or_insert_with(|| (e.node.clone(), vec![None; e.node.num_outputs()]));
    match &mut slots[e.output] {
        slot @ None => *slot = Some(g),
        Some(acc) => {
            if !acc.dtype().is_float() {
                let msg = format!("gradients must be floating point, got {}", acc.dtype());
                return Err(Error::dtype("accumulate_grad", msg));
            }
            *acc = acc.add(&g)?;
        }
    }
    Ok(())
}

/// A map keyed by node id.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// Hashes node ids (consecutive counters, never attacker-chosen) with one
/// multiplication instead of SipHash: the walk does a few lookups per
/// recorded op, which is the tape's overhead on small tensors.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
