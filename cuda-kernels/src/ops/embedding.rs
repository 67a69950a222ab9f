//! Embedding lookup and its backward.

use super::Float;
use crate::launch::{check_len, grid_for, mul, to_i64, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::Result;

const BLOCK: u32 = 256;

fn plan<A, B>(
    op: &'static str,
    kernel: String,
    a: DevPtr<A>,
    idx: DevPtr<i64>,
    b: DevPtr<B>,
    [n, vocab, dim]: [usize; 3],
) -> Result<Launch> {
    Ok(Launch {
        module: Module::Embedding,
        kernel,
        grid: [grid_for(mul(op, n, dim)? as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(a),
            Arg::ptr(idx),
            Arg::ptr(b),
            Arg::i64(to_i64(op, "n", n)?),
            Arg::i64(to_i64(op, "vocab", vocab)?),
            Arg::i64(to_i64(op, "dim", dim)?),
        ],
    })
}

/// out[i, :] = weight[idx[i], :] for `n` indices into a [vocab, dim] table;
/// an index outside [0, vocab) gives a NaN row.
///
/// Errors: buffers too short.
pub fn embedding_fwd<T: Float>(
    weight: DevPtr<T>,
    idx: DevPtr<i64>,
    out: DevPtr<T>,
    n: usize,
    vocab: usize,
    dim: usize,
) -> Result<Launch> {
    const OP: &str = "embedding_fwd";
    check_len(OP, "weight", &weight, mul(OP, vocab, dim)?)?;
    check_len(OP, "idx", &idx, n)?;
    check_len(OP, "out", &out, mul(OP, n, dim)?)?;
    plan(
        OP,
        format!("emb_fwd_{}", T::NAME),
        weight,
        idx,
        out,
        [n, vocab, dim],
    )
}

/// grad_weight[idx[i], :] += grad_out[i, :] into an f32 [vocab, dim] buffer
/// (which the caller zeroes first); out-of-range indices are skipped.
///
/// Errors: buffers too short.
pub fn embedding_bwd<T: Float>(
    grad_out: DevPtr<T>,
    idx: DevPtr<i64>,
    grad_weight: DevPtr<f32>,
    n: usize,
    vocab: usize,
    dim: usize,
) -> Result<Launch> {
    const OP: &str = "embedding_bwd";
    check_len(OP, "grad_weight", &grad_weight, mul(OP, vocab, dim)?)?;
    check_len(OP, "idx", &idx, n)?;
    check_len(OP, "grad_out", &grad_out, mul(OP, n, dim)?)?;
    plan(
        OP,
        format!("emb_bwd_{}", T::NAME),
        grad_out,
        idx,
        grad_weight,
        [n, vocab, dim],
    )
}
