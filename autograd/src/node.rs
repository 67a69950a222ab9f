//! Graph nodes. Every recorded op and every leaf that requires a gradient is
//! a [`Node`]; a `Var` points at one output of a node through an [`Edge`].
//! Node ids come from one process-wide counter, so creation order is id order
//! and backward can walk nodes by descending id without a topological sort.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tessera_tensor::{DType, Result, Tensor};

use crate::param::Slot;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The largest id handed out so far: every node made later has a larger one.
pub(crate) fn id_watermark() -> u64 {
    NEXT_ID.load(Ordering::Relaxed) - 1
}

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// An op's backward: given the gradient of each output (None where no
/// gradient reached it) and which inputs need one, returns a gradient (or
/// None) per input.
pub type BackwardFn =
    Box<dyn FnOnce(&[Option<Tensor>], &[bool]) -> Result<Vec<Option<Tensor>>> + Send + 'static>;

/// A callback run once with a leaf's final gradient.
pub type Hook = Arc<dyn Fn(&Tensor) + Send + Sync + 'static>;

/// Shape and dtype of a value a node produced, to check gradients against.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl Meta {
    pub fn of(t: &Tensor) -> Self {
        Meta {
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
        }
    }
}

pub(crate) struct Node {
    pub id: u64,
    pub kind: NodeKind,
}

pub(crate) enum NodeKind {
    Leaf {
        meta: Meta,
        hooks: Mutex<Vec<Hook>>,
        /// The parameter whose value ops save by reference, read when
        /// their backward runs (see [`crate::Saved`]); `None` for leaves
        /// saved by value.
        by_ref: Mutex<Option<Weak<Slot>>>,
    },
    Op {
        name: &'static str,
        inputs: Vec<Option<Edge>>,
        outputs: Vec<Meta>,
        backward: Mutex<Option<BackwardFn>>,
    },
}

impl Node {
    pub fn leaf(meta: Meta) -> Arc<Node> {
        Arc::new(Node {
            id: next_id(),
            kind: NodeKind::Leaf {
                meta,
                hooks: Mutex::new(Vec::new()),
                by_ref: Mutex::new(None),
            },
        })
    }

    pub fn op(
        name: &'static str,
        inputs: Vec<Option<Edge>>,
        outputs: Vec<Meta>,
        backward: BackwardFn,
    ) -> Arc<Node> {
        Arc::new(Node {
            id: next_id(),
            kind: NodeKind::Op {
                name,
                inputs,
                outputs,
                backward: Mutex::new(Some(backward)),
            },
        })
    }

    /// Shape and dtype of output `k`.
    pub fn meta(&self, k: usize) -> &Meta {
        match &self.kind {
            NodeKind::Leaf { meta, .. } => meta,
            NodeKind::Op { outputs, .. } => &outputs[k],
        }
    }

    pub fn num_outputs(&self) -> usize {
        match &self.kind {
            NodeKind::Leaf { .. } => 1,
            NodeKind::Op { outputs, .. } => outputs.len(),
        }
    }
}

impl Drop for Node {
    /// Frees the part of the graph only this node kept alive without
    /// recursing: a node owns its inputs' nodes, so the default drop of a
    /// long chain (hundreds of thousands of recorded ops) would nest one
    /// call per op and overflow the stack. Nodes whose last owner this is
    /// are taken out of their `Arc` and their inputs queued instead.
    fn drop(&mut self) {
        let NodeKind::Op { inputs, .. } = &mut self.kind else {
            return;
        };
        let mut owned: Vec<Node> = take_owned(inputs).collect();
        while let Some(mut node) = owned.pop() {
            if let NodeKind::Op { inputs, .. } = &mut node.kind {
                owned.extend(take_owned(inputs));
            }
            // `node` drops here with no inputs left: no recursion.
        }
    }
}

/// Empties `inputs`, yielding the nodes that no one else refers to.
fn take_owned(inputs: &mut Vec<Option<Edge>>) -> impl Iterator<Item = Node> + '_ {
    inputs.drain(..).flatten().filter_map(|e| Arc::into_inner(e.node))
}

/// One output of one node: where a gradient flows to.
#[derive(Clone)]
pub(crate) struct Edge {
    pub node: Arc<Node>,
    pub output: usize,
}

impl Edge {
    pub fn same(&self, other: &Edge) -> bool {
        Arc::ptr_eq(&self.node, &other.node) && self.output == other.output
    }
}
