//! Sum, product, max, min and argmax/argmin over one dimension of a contiguous tensor viewed as
//! `[outer, len, inner]`, and the running sum/product along it.

use super::Float;
use crate::launch::{check_len, grid_for, mul, to_i64, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::{Error, Result};

const BLOCK: u32 = 256;

pub use crate::op_codes::ReduceOp;

#[allow(clippy::too_many_arguments)]
fn plan(
    op: &'static str,
    kernel: String,
    code: Option<i32>,
    outer: usize,
    len: usize,
    inner: usize,
    x: u64,
    y: u64,
) -> Result<Launch> {
    if len == 0 {
        return Err(Error::arg(op, "cannot reduce a dimension of length 0"));
    }
    let grid = if inner == 1 {
        (outer as u64).div_ceil((BLOCK / 32) as u64).max(1) as u32
    } else {
        grid_for(mul(op, outer, inner)? as u64, BLOCK)
    };
    if inner == 1 && outer as u64 > (BLOCK / 32) as u64 * u32::MAX as u64 {
        return Err(Error::arg(op, format!("{outer} rows exceed the grid")));
    }
    Ok(Launch {
        module: Module::Reduce,
        kernel,
        grid: [grid, 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: code
            .map(Arg::i32)
            .into_iter()
            .chain([
                Arg::u64(x),
                Arg::u64(y),
                Arg::i64(to_i64(op, "outer", outer)?),
                Arg::i64(to_i64(op, "len", len)?),
                Arg::i64(to_i64(op, "inner", inner)?),
            ])
            .collect(),
    })
}

/// y[o, i] = reduce over r of x[o, r, i]; `y` holds `outer * inner` values.
///
/// Errors: `len == 0`, buffers too short, sizes overflowing.
pub fn reduce<T: Float>(
    r: ReduceOp,
    x: DevPtr<T>,
    y: DevPtr<T>,
    outer: usize,
    len: usize,
    inner: usize,
) -> Result<Launch> {
    const OP: &str = "reduce";
    check_len(OP, "x", &x, mul(OP, mul(OP, outer, len)?, inner)?)?;
    check_len(OP, "y", &y, mul(OP, outer, inner)?)?;
    plan(
        OP,
        format!("reduce_{}", T::NAME),
        Some(r.code()),
        outer,
        len,
        inner,
        x.addr(),
        y.addr(),
    )
}

/// y[o, i] = index r of the largest (`largest`) or smallest x[o, r, i]
/// (first on ties, NaN wins either way).
///
/// Errors: as [`reduce`].
pub fn arg_extreme<T: Float>(
    x: DevPtr<T>,
    y: DevPtr<i64>,
    outer: usize,
    len: usize,
    inner: usize,
    largest: bool,
) -> Result<Launch> {
    let op = if largest { "argmax" } else { "argmin" };
    check_len(op, "x", &x, mul(op, mul(op, outer, len)?, inner)?)?;
    check_len(op, "y", &y, mul(op, outer, inner)?)?;
    plan(
        op,
        format!("arg_extreme_{}", T::NAME),
        Some(i32::from(largest)),
        outer,
        len,
        inner,
        x.addr(),
        y.addr(),
    )
}

/// y[o, r, i] = `r` (Sum: cumsum, Prod: cumprod) over x[o, ..= r, i], in
/// f32 in index order, each prefix rounded to `T`. `y` is shaped like `x`.
///
/// Errors: max/min (no running form here), buffers too short, sizes
/// overflowing.
pub fn scan<T: Float>(
    r: ReduceOp,
    x: DevPtr<T>,
    y: DevPtr<T>,
    outer: usize,
    len: usize,
    inner: usize,
) -> Result<Launch> {
    const OP: &str = "scan";
    if !r.has_identity() {
        return Err(Error::arg(OP, format!("no running {} kernel", r.name())));
    }
    let n = mul(OP, mul(OP, outer, len)?, inner)?;
    check_len(OP, "x", &x, n)?;
    check_len(OP, "y", &y, n)?;
    Ok(Launch {
        module: Module::Reduce,
        kernel: format!("scan_{}", T::NAME),
        grid: [grid_for(mul(OP, outer, inner)? as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::i32(r.code()),
            Arg::ptr(x),
            Arg::ptr(y),
            Arg::i64(to_i64(OP, "outer", outer)?),
            Arg::i64(to_i64(OP, "len", len)?),
            Arg::i64(to_i64(OP, "inner", inner)?),
        ],
    })
}

/// The first `k` of each contiguous line of `n` elements of `x` (`lines`
/// lines) in the order value descending (`largest`) or ascending, NaN above
/// every number, then position: values into `vals` and positions into
/// `idx` (`lines·k` each).
///
/// Errors: `k > n`, buffers too short, sizes overflowing.
pub fn topk<T: Float>(
    x: DevPtr<T>,
    vals: DevPtr<T>,
    idx: DevPtr<i64>,
    lines: usize,
    n: usize,
    k: usize,
    largest: bool,
) -> Result<Launch> {
    const OP: &str = "topk";
    if k > n {
        return Err(Error::arg(OP, format!("k = {k} exceeds lines of {n}")));
    }
    check_len(OP, "x", &x, mul(OP, lines, n)?)?;
    check_len(OP, "vals", &vals, mul(OP, lines, k)?)?;
    check_len(OP, "idx", &idx, mul(OP, lines, k)?)?;
    Ok(Launch {
        module: Module::Reduce,
        kernel: format!("topk_{}", T::NAME),
        grid: [grid_for(lines as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(x),
            Arg::ptr(vals),
            Arg::ptr(idx),
            Arg::i64(to_i64(OP, "lines", lines)?),
            Arg::i64(to_i64(OP, "n", n)?),
            Arg::i64(to_i64(OP, "k", k)?),
            Arg::i32(largest as i32),
        ],
    })
}
