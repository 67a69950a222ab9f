//! Fused LayerNorm over the last dimension of `[rows, cols]`.

use super::Float;
use crate::launch::{check_len, mul, to_i64, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::{Error, Result};

/// Threads per row: a multiple of 32 near the row length, at most 512.
fn row_block(cols: usize) -> u32 {
    (cols.div_ceil(32) * 32).clamp(32, 512) as u32
}

fn grid_rows(op: &'static str, rows: usize) -> Result<u32> {
    u32::try_from(rows).map_err(|_| Error::arg(op, format!("{rows} rows exceed the grid")))
}

fn opt<T>(op: &'static str, what: &str, p: Option<DevPtr<T>>, cols: usize) -> Result<Arg> {
    match p {
        Some(p) => {
            check_len(op, what, &p, cols)?;
            Ok(Arg::ptr(p))
        }
        None => Ok(Arg::u64(0)),
    }
}

/// y = (x - mean) * rstd * gamma + beta per row, saving mean and rstd (f32,
/// one per row). `gamma`/`beta` are optional (1 and 0).
///
/// Errors: `cols == 0`, buffers too short, `eps` not positive and finite.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_fwd<T: Float>(
    x: DevPtr<T>,
    gamma: Option<DevPtr<T>>,
    beta: Option<DevPtr<T>>,
    y: DevPtr<T>,
    mean: DevPtr<f32>,
    rstd: DevPtr<f32>,
    rows: usize,
    cols: usize,
    eps: f32,
) -> Result<Launch> {
    const OP: &str = "layer_norm_fwd";
    if cols == 0 {
        return Err(Error::arg(OP, "rows of length 0"));
    }
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(Error::arg(OP, format!("eps = {eps} must be positive")));
    }
    let n = mul(OP, rows, cols)?;
    check_len(OP, "x", &x, n)?;
    check_len(OP, "y", &y, n)?;
    check_len(OP, "mean", &mean, rows)?;
    check_len(OP, "rstd", &rstd, rows)?;
    Ok(Launch {
        module: Module::LayerNorm,
        kernel: format!("ln_fwd_{}", T::NAME),
        grid: [grid_rows(OP, rows)?, 1, 1],
        block: [row_block(cols), 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(x),
            opt(OP, "gamma", gamma, cols)?,
            opt(OP, "beta", beta, cols)?,
            Arg::ptr(y),
            Arg::ptr(mean),
            Arg::ptr(rstd),
            Arg::i64(to_i64(OP, "cols", cols)?),
            Arg::f32(eps),
        ],
    })
}

/// Rows per chunk of the first dgamma/dbeta stage: at most 128 chunks.
fn rows_per_chunk(rows: usize) -> usize {
    rows.div_ceil(128).max(32)
}

/// f32 elements of workspace [`layer_norm_bwd`] needs.
pub fn layer_norm_bwd_workspace(rows: usize, cols: usize) -> usize {
    2 * rows.div_ceil(rows_per_chunk(rows)) * cols
}

/// Gradients of a LayerNorm given the saved mean and rstd: dx (one block per
/// row), then dgamma and dbeta in two stages through `workspace` (at least
/// [`layer_norm_bwd_workspace`] f32). Run the launches in order.
///
/// Errors: `cols == 0`, buffers too short.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_bwd<T: Float>(
    x: DevPtr<T>,
    gamma: Option<DevPtr<T>>,
    dy: DevPtr<T>,
    mean: DevPtr<f32>,
    rstd: DevPtr<f32>,
    dx: DevPtr<T>,
    dgamma: DevPtr<T>,
    dbeta: DevPtr<T>,
    workspace: DevPtr<f32>,
    rows: usize,
    cols: usize,
) -> Result<Vec<Launch>> {
    const OP: &str = "layer_norm_bwd";
    if cols == 0 {
        return Err(Error::arg(OP, "rows of length 0"));
    }
    let n = mul(OP, rows, cols)?;
    for (what, p) in [("x", &x), ("dy", &dy), ("dx", &dx)] {
        check_len(OP, what, p, n)?;
    }
    check_len(OP, "mean", &mean, rows)?;
    check_len(OP, "rstd", &rstd, rows)?;
    check_len(OP, "dgamma", &dgamma, cols)?;
    check_len(OP, "dbeta", &dbeta, cols)?;
    let rpc = rows_per_chunk(rows);
    let chunks = rows.div_ceil(rpc);
    check_len(OP, "workspace", &workspace, layer_norm_bwd_workspace(rows, cols))?;
    let part = chunks * cols;
    let pg = DevPtr::<f32>::from_raw(workspace.addr(), part);
    let pb = DevPtr::<f32>::from_raw(workspace.addr() + 4 * part as u64, part);
    let (cols64, rows64) = (to_i64(OP, "cols", cols)?, to_i64(OP, "rows", rows)?);
    let col_blocks = u32::try_from(cols.div_ceil(32))
        .map_err(|_| Error::arg(OP, format!("{cols} columns exceed the grid")))?;
    let dx_launch = Launch {
        module: Module::LayerNorm,
        kernel: format!("ln_bwd_dx_{}", T::NAME),
        grid: [grid_rows(OP, rows)?, 1, 1],
        block: [row_block(cols), 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(x),
            opt(OP, "gamma", gamma, cols)?,
            Arg::ptr(dy),
            Arg::ptr(mean),
            Arg::ptr(rstd),
            Arg::ptr(dx),
            Arg::i64(cols64),
        ],
    };
    let partial = Launch {
        module: Module::LayerNorm,
        kernel: format!("ln_bwd_partial_{}", T::NAME),
        grid: [col_blocks, chunks as u32, 1],
        block: [32, 8, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(x),
            Arg::ptr(dy),
            Arg::ptr(mean),
            Arg::ptr(rstd),
            Arg::ptr(pg),
            Arg::ptr(pb),
            Arg::i64(rows64),
            Arg::i64(cols64),
            Arg::i64(rpc as i64),
        ],
    };
    let final_ = Launch {
        module: Module::LayerNorm,
        kernel: format!("ln_bwd_final_{}", T::NAME),
        grid: [cols.div_ceil(256) as u32, 1, 1],
        block: [256, 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(pg),
            Arg::ptr(pb),
            Arg::ptr(dgamma),
            Arg::ptr(dbeta),
            Arg::i64(chunks as i64),
            Arg::i64(cols64),
        ],
    };
    // With no rows dgamma/dbeta are zeros: the final stage sums 0 chunks.
    Ok(vec![dx_launch, partial, final_])
}
