//! Autocast (PyTorch's `torch.autocast`): inside [`autocast`], ops on
//! [`Var`]s pick their compute dtype from one policy table,
//! [`cast_policy`], instead of from their inputs.
//!
//! # Where the casts happen
//!
//! At the `Var`-level entry of each op, before its value is computed: the
//! op hands its inputs to `cast_inputs`, which returns them cast as the
//! policy says (or `None` when nothing changes), and the op calls itself
//! again on the cast values. The casts are [`Var::to_dtype`] nodes, so they
//! are recorded like any op and a gradient comes back to each input in that
//! input's own dtype: an f32 parameter used by a bf16 matmul gets an f32
//! gradient. Tensor-level ops (`Tensor::matmul`, ...) are not affected;
//! they run in their operands' dtype, as PyTorch's ops below the autocast
//! dispatch key do.
//!
//! # The cast cache
//!
//! An f32 leaf that requires a gradient (a parameter) is cast to the low
//! dtype once per autocast region and the cast value reused, as PyTorch's
//! cast cache does: a weight read by several ops (tied embeddings, a layer
//! applied twice) costs one conversion and one graph node. The cache is
//! keyed by the leaf's [`crate::VarId`] and emptied when the outermost
//! autocast scope (enabled or not) of the thread exits. Updating a
//! parameter inside a region is therefore not seen by later casts of the
//! same region (as in PyTorch): step the optimizer outside it. Casts made
//! with recording off are not cached (gradient checkpointing must see
//! every read of a parameter).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use tessera_tensor::{DType, Error, Result};

use crate::mode::is_grad_enabled;
use crate::ops::registry::{self as reg, Op};
use crate::{Var, VarId};

thread_local! {
    static DTYPE: Cell<Option<DType>> = const { Cell::new(None) };
    static NESTING: Cell<usize> = const { Cell::new(0) };
    static CACHE: RefCell<HashMap<(VarId, DType), Var>> = RefCell::new(HashMap::new());
}

/// How autocast treats an op's floating-point inputs (PyTorch's op lists
/// in `aten/src/ATen/autocast_mode.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastPolicy {
    /// Cast to the autocast dtype (f16 or bf16): the GEMM-bound ops. f64
    /// inputs are left alone.
    LowerPrecision,
    /// f16/bf16 inputs cast up to f32, so the op computes and returns f32:
    /// ops whose range or accumulation needs it.
    Fp32,
    /// Inputs of different floating dtypes cast to the widest of them
    /// (f16 with bf16 gives f32).
    Promote,
    /// Inputs used as they are.
    Unchanged,
}

/// The autocast policy of `op`: the single table every op entry consults.
/// Ops not listed here ([`CastPolicy::Unchanged`]) run in their inputs'
/// dtype.
pub fn cast_policy(op: Op) -> CastPolicy {
    use reg::*;
    match op {
        MATMUL | LINEAR | CONV2D | SCALED_DOT_PRODUCT_ATTENTION => CastPolicy::LowerPrecision,
        EXP | LOG | LOG1P | EXPM1 | RSQRT | RECIP | POW | POW_SCALAR | RPOW_SCALAR | SOFTMAX
        | LOG_SOFTMAX | LOGSUMEXP | SUM | MEAN | PROD | CUMSUM | NORM | LAYER_NORM | BATCH_NORM
        | GROUP_NORM | CROSS_ENTROPY | NLL_LOSS | MSE_LOSS | BCE_WITH_LOGITS => CastPolicy::Fp32,
        ADD | SUB | MUL | DIV | MAXIMUM | MINIMUM | WHERE | CAT | STACK | SCATTER_ADD => CastPolicy::Promote,
        _ => CastPolicy::Unchanged,
    }
}

/// Runs `f` with autocast to `dtype` on this thread (PyTorch's
/// `with torch.autocast(device, dtype):`) and returns its result. Scopes
/// nest: an inner scope's dtype (or [`no_autocast`]) holds until it exits,
/// and the previous state is restored after `f`, also when it errors or
/// panics. The cast cache is emptied when the outermost scope exits.
///
/// Errors, without running `f`, unless `dtype` is f16 or bf16.
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> Result<R>) -> Result<R> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(Error::dtype(
            "autocast",
            format!("autocast runs ops in f16 or bf16, got {dtype}"),
        ));
    }
    let _scope = Scope::enter(Some(dtype));
    f()
}

/// Runs `f` with autocast off on this thread (PyTorch's
/// `torch.autocast(..., enabled=False)` inside an autocast region): ops use
/// their inputs' dtypes again. The enclosing state comes back afterwards.
pub fn no_autocast<R>(f: impl FnOnce() -> R) -> R {
    let _scope = Scope::enter(None);
    f()
}

/// The dtype autocast casts to on this thread, `None` outside autocast (or
/// inside [`no_autocast`]).
pub fn autocast_dtype() -> Option<DType> {
    DTYPE.with(Cell::get)
}

/// Runs `f` under the autocast `dtype` with a cache of its own, restoring
/// the thread's state and cache afterwards: gradient checkpointing
/// recomputes a segment this way under the state its forward ran in,
/// without reusing casts recorded in another graph.
pub(crate) fn isolated<R>(dtype: Option<DType>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<HashMap<(VarId, DType), Var>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(outer) = self.0.take() {
                CACHE.with(|c| *c.borrow_mut() = outer);
            }
        }
    }
    let _restore = Restore(Some(CACHE.with(|c| std::mem::take(&mut *c.borrow_mut()))));
    let _scope = Scope::enter(dtype);
    f()
}

/// One autocast scope on this thread: sets the dtype, restores the previous
/// one on drop, and empties the cache when the outermost scope ends.
struct Scope {
    prev: Option<DType>,
}

impl Scope {
    fn enter(dtype: Option<DType>) -> Scope {
        NESTING.with(|n| n.set(n.get() + 1));
        Scope {
            prev: DTYPE.with(|d| d.replace(dtype)),
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        DTYPE.with(|d| d.set(self.prev));
        let depth = NESTING.with(|n| {
            n.set(n.get() - 1);
            n.get()
        });
        if depth == 0 {
            CACHE.with(|c| c.borrow_mut().clear());
        }
    }
}

/// `inputs` as `op` should see them under the current autocast state:
/// `None` when autocast is off, the op is [`CastPolicy::Unchanged`], or
/// every input already has the dtype the policy asks for; otherwise every
/// input, the ones to change cast (recorded, so gradients flow back in each
/// input's dtype). Errors as [`Var::to_dtype`].
pub(crate) fn cast_inputs(op: Op, inputs: &[&Var]) -> Result<Option<Vec<Var>>> {
    let Some(low) = autocast_dtype() else {
        return Ok(None);
    };
    let target = |d: DType| -> Option<DType> {
        match cast_policy(op) {
            CastPolicy::LowerPrecision => (d.is_float() && d != DType::F64).then_some(low),
            CastPolicy::Fp32 => matches!(d, DType::F16 | DType::BF16).then_some(DType::F32),
            CastPolicy::Promote => {
                let widest = inputs
                    .iter()
                    .map(|v| v.dtype())
                    .filter(|d| d.is_float())
                    .reduce(DType::promote)?;
                d.is_float().then_some(widest)
            }
            CastPolicy::Unchanged => None,
        }
    };
    if inputs
        .iter()
        .all(|v| target(v.dtype()).is_none_or(|t| t == v.dtype()))
    {
        return Ok(None);
    }
    inputs
        .iter()
        .map(|v| match target(v.dtype()) {
            Some(t) if t != v.dtype() => cast(v, t),
            _ => Ok((*v).clone()),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// `v` converted to `dtype`, through the cast cache when `v` is a parameter
/// (a leaf requiring a gradient) cast from f32 to the autocast dtype while
/// recording.
fn cast(v: &Var, dtype: DType) -> Result<Var> {
    let key = match v.id() {
        Some(id) if is_grad_enabled() && v.dtype() == DType::F32 && Some(dtype) == autocast_dtype() => {
            Some((id, dtype))
        }
        _ => None,
    };
    let Some(key) = key else {
        return v.to_dtype(dtype);
    };
    if let Some(hit) = CACHE.with(|c| c.borrow().get(&key).cloned()) {
        return Ok(hit);
    }
    let out = v.to_dtype(dtype)?;
    CACHE.with(|c| c.borrow_mut().insert(key, out.clone()));
    Ok(out)
}

/// Runs an op under autocast: when [`cast_inputs`] changes `$inputs`, the
/// enclosing function returns `$call` on the cast values `$c`, which
/// re-enters the op with inputs already in the policy's dtype.
macro_rules! autocast_entry {
    ($op:expr, [$($v:expr),* $(,)?], |$c:ident| $call:expr) => {
        if let Some($c) = $crate::autocast::cast_inputs($op, &[$($v),*])? {
            return $call;
        }
    };
}
pub(crate) use autocast_entry;

#[cfg(test)]
#[path = "autocast_tests.rs"]
mod tests;
