//! Softmax / log_softmax over rows, cross-entropy forward and backward.

use super::Float;
use crate::launch::{check_len, grid_for, mul, to_i64, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::{Error, Result};

const BLOCK: u32 = 256;
const ROWS_PER_BLOCK: u64 = (BLOCK / 32) as u64;

fn row_launch(op: &'static str, kernel: String, rows: usize, args: Vec<Arg>) -> Result<Launch> {
    let grid = (rows as u64).div_ceil(ROWS_PER_BLOCK).max(1);
    let grid = u32::try_from(grid).map_err(|_| Error::arg(op, format!("{rows} rows exceed the grid")))?;
    Ok(Launch {
        module: Module::Softmax,
        kernel,
        grid: [grid, 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args,
    })
}

/// y = softmax(x) (or log_softmax when `log`) over each row of [rows, cols].
///
/// Errors: `cols == 0`, buffers too short.
pub fn softmax<T: Float>(x: DevPtr<T>, y: DevPtr<T>, rows: usize, cols: usize, log: bool) -> Result<Launch> {
    const OP: &str = "softmax";
    if cols == 0 {
        return Err(Error::arg(OP, "rows of length 0"));
    }
    let n = mul(OP, rows, cols)?;
    check_len(OP, "x", &x, n)?;
    check_len(OP, "y", &y, n)?;
    row_launch(
        OP,
        format!("softmax_{}", T::NAME),
        rows,
        vec![
            Arg::ptr(x),
            Arg::ptr(y),
            Arg::i64(to_i64(OP, "rows", rows)?),
            Arg::i64(to_i64(OP, "cols", cols)?),
            Arg::i32(log as i32),
        ],
    )
}

/// Cross-entropy forward with label smoothing ε: loss[r] = (1 − ε)·(lse −
/// x[r, target[r]]) + ε·(lse − mean(x[r])) with lse = logsumexp(x[r]) (0
/// where target == `ignore_index`; NaN for a target outside [0, cols)), and
/// lse[r] saved for the backward.
///
/// Errors: `cols == 0`, ε outside [0, 1], buffers too short.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_fwd<T: Float>(
    logits: DevPtr<T>,
    targets: DevPtr<i64>,
    loss: DevPtr<f32>,
    lse: DevPtr<f32>,
    rows: usize,
    cols: usize,
    ignore_index: i64,
    smoothing: f32,
) -> Result<Launch> {
    const OP: &str = "cross_entropy_fwd";
    if cols == 0 {
        return Err(Error::arg(OP, "0 classes"));
    }
    check_smoothing(OP, smoothing)?;
    check_len(OP, "logits", &logits, mul(OP, rows, cols)?)?;
    check_len(OP, "targets", &targets, rows)?;
    check_len(OP, "loss", &loss, rows)?;
    check_len(OP, "lse", &lse, rows)?;
    row_launch(
        OP,
        format!("ce_fwd_{}", T::NAME),
        rows,
        vec![
            Arg::ptr(logits),
            Arg::ptr(targets),
            Arg::ptr(loss),
            Arg::ptr(lse),
            Arg::i64(to_i64(OP, "rows", rows)?),
            Arg::i64(to_i64(OP, "cols", cols)?),
            Arg::i64(ignore_index),
            Arg::f32(smoothing),
        ],
    )
}

/// Cross-entropy backward with label smoothing ε: dlogits[r, c] = grad[r] ·
/// (softmax(x[r])[c] − ε/cols − (1 − ε)·[c == target[r]]), 0 on ignored rows. `grad` is the upstream gradient per
/// row (for a mean loss, 1/count on every row).
///
/// Errors: `cols == 0`, buffers too short.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_bwd<T: Float>(
    logits: DevPtr<T>,
    targets: DevPtr<i64>,
    lse: DevPtr<f32>,
    grad: DevPtr<f32>,
    dlogits: DevPtr<T>,
    rows: usize,
    cols: usize,
    ignore_index: i64,
    smoothing: f32,
) -> Result<Launch> {
    const OP: &str = "cross_entropy_bwd";
    if cols == 0 {
        return Err(Error::arg(OP, "0 classes"));
    }
    check_smoothing(OP, smoothing)?;
    let n = mul(OP, rows, cols)?;
    check_len(OP, "logits", &logits, n)?;
    check_len(OP, "dlogits", &dlogits, n)?;
    check_len(OP, "targets", &targets, rows)?;
    check_len(OP, "lse", &lse, rows)?;
    check_len(OP, "grad", &grad, rows)?;
    Ok(Launch {
        module: Module::Softmax,
        kernel: format!("ce_bwd_{}", T::NAME),
        grid: [grid_for(n as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(logits),
            Arg::ptr(targets),
            Arg::ptr(lse),
            Arg::ptr(grad),
            Arg::ptr(dlogits),
            Arg::i64(to_i64(OP, "rows", rows)?),
            Arg::i64(to_i64(OP, "cols", cols)?),
            Arg::i64(ignore_index),
            Arg::f32(smoothing),
        ],
    })
}

fn check_smoothing(op: &'static str, eps: f32) -> Result<()> {
    if !(0.0..=1.0).contains(&eps) {
        return Err(Error::arg(
            op,
            format!("label smoothing must be in [0, 1], got {eps}"),
        ));
    }
    Ok(())
}
