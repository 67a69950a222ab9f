//! Bilinear resampling (`upsample_bilinear2d`) forward and backward over
//! planes, with per-axis tap tables the caller forms and uploads.

use super::Float;
use crate::launch::{check_len, grid_for, mul, to_i64, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::Result;

const BLOCK: u32 = 256;

/// One output coordinate's two source indices and weights, as the kernels
/// read it (24 bytes: two i64, two f32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tap {
    /// The first source index.
    pub i0: usize,
    /// The second source index.
    pub i1: usize,
    /// The first source's weight.
    pub l0: f32,
    /// The second source's weight.
    pub l1: f32,
}

impl Tap {
    /// The table of `taps` as the kernels read it: 3 u64 per tap.
    pub fn table(taps: &[Tap]) -> Vec<u64> {
        taps.iter()
            .flat_map(|t| {
                [
                    t.i0 as u64,
                    t.i1 as u64,
                    t.l0.to_bits() as u64 | ((t.l1.to_bits() as u64) << 32),
                ]
            })
            .collect()
    }
}

/// Geometry of a bilinear resampling of `planes` planes of `input` =
/// [H, W] to `output` = [OH, OW], with the tap tables (from [`Tap::table`],
/// on the device) of the rows (`OH` taps) and columns (`OW` taps). Every
/// tap's indices must lie in the input (the caller forms them so).
#[derive(Debug, Clone, Copy)]
pub struct Bilinear {
    /// Planes (batch × channels).
    pub planes: usize,
    /// Input height and width.
    pub input: [usize; 2],
    /// Output height and width.
    pub output: [usize; 2],
    /// Row taps: 3 u64 per output row.
    pub rows: DevPtr<u64>,
    /// Column taps: 3 u64 per output column.
    pub cols: DevPtr<u64>,
}

impl Bilinear {
    fn args(&self, op: &'static str) -> Result<Vec<Arg>> {
        check_len(op, "row taps", &self.rows, mul(op, 3, self.output[0])?)?;
        check_len(op, "column taps", &self.cols, mul(op, 3, self.output[1])?)?;
        Ok(vec![
            Arg::ptr(self.rows),
            Arg::ptr(self.cols),
            Arg::i64(to_i64(op, "planes", self.planes)?),
            Arg::i64(to_i64(op, "H", self.input[0])?),
            Arg::i64(to_i64(op, "W", self.input[1])?),
            Arg::i64(to_i64(op, "OH", self.output[0])?),
            Arg::i64(to_i64(op, "OW", self.output[1])?),
        ])
    }

    fn numel(&self, op: &'static str, dims: [usize; 2]) -> Result<usize> {
        mul(op, mul(op, self.planes, dims[0])?, dims[1])
    }
}

/// y = bilinear resampling of x (`planes·H·W` → `planes·OH·OW`), blended
/// in f32 and rounded once.
///
/// Errors: buffers or tap tables too short, sizes past i64.
pub fn bilinear_fwd<T: Float>(g: &Bilinear, x: DevPtr<T>, y: DevPtr<T>) -> Result<Launch> {
    const OP: &str = "bilinear_fwd";
    let (ni, no) = (g.numel(OP, g.input)?, g.numel(OP, g.output)?);
    check_len(OP, "x", &x, ni)?;
    check_len(OP, "y", &y, no)?;
    let mut args = vec![Arg::ptr(x), Arg::ptr(y)];
    args.extend(g.args(OP)?);
    Ok(Launch {
        module: Module::Resample,
        kernel: format!("bilinear_fwd_{}", T::NAME),
        grid: [grid_for(no as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args,
    })
}

/// dx (f32, zeroed by the caller) += the gradient of [`bilinear_fwd`]: one
/// thread per plane spreads each `dy` over its four sources in output
/// order (a fixed summation order).
///
/// Errors: as [`bilinear_fwd`].
pub fn bilinear_bwd<T: Float>(g: &Bilinear, dy: DevPtr<T>, dx: DevPtr<f32>) -> Result<Launch> {
    const OP: &str = "bilinear_bwd";
    let (ni, no) = (g.numel(OP, g.input)?, g.numel(OP, g.output)?);
    check_len(OP, "dy", &dy, no)?;
    check_len(OP, "dx", &dx, ni)?;
    let mut args = vec![Arg::ptr(dy), Arg::ptr(dx)];
    args.extend(g.args(OP)?);
    Ok(Launch {
        module: Module::Resample,
        kernel: format!("bilinear_bwd_{}", T::NAME),
        grid: [grid_for(g.planes as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args,
    })
}
