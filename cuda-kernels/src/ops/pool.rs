//! 2-D max pooling forward (values and plane indices) and backward; average
//! pooling (fixed and adaptive windows) forward and backward.

use super::Float;
use crate::launch::{check_len, grid_for, mul, to_i32, to_i64, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::{Error, Result};

const BLOCK: u32 = 256;

/// Geometry of a max pooling over `planes` planes of `input` = [H, W],
/// giving `output` = [OH, OW] per plane. The caller computes the output
/// size (PyTorch's rules, ceil mode included); the kernels take it as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolGeom {
    /// Planes (batch × channels).
    pub planes: usize,
    /// Input height and width.
    pub input: [usize; 2],
    /// Output height and width.
    pub output: [usize; 2],
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Implicit padding before the first row/column.
    pub padding: [usize; 2],
    /// Spacing between window taps.
    pub dilation: [usize; 2],
}

impl PoolGeom {
    fn arg(&self, op: &'static str) -> Result<Arg> {
        if [self.kernel, self.stride, self.dilation]
            .iter()
            .any(|p| p.contains(&0))
        {
            return Err(Error::arg(
                op,
                format!("zero kernel, stride or dilation in {self:?}"),
            ));
        }
        let ints = [
            self.input[0],
            self.input[1],
            self.output[0],
            self.output[1],
            self.kernel[0],
            self.kernel[1],
            self.stride[0],
            self.stride[1],
            self.padding[0],
            self.padding[1],
            self.dilation[0],
            self.dilation[1],
        ];
        let mut fields = vec![Arg::i64(to_i64(op, "planes", self.planes)?)];
        for v in ints {
            fields.push(Arg::i32(to_i32(op, "geometry", v)?));
        }
        // Every window position the kernels form must fit in i32 too.
        for d in 0..2 {
            let reach = self.output[d]
                .checked_mul(self.stride[d])
                .and_then(|v| v.checked_add(self.input[d] + self.kernel[d] * self.dilation[d]))
                .ok_or_else(|| Error::arg(op, format!("geometry overflows: {self:?}")))?;
            to_i32(op, "window reach", reach)?;
        }
        Ok(Arg::fields(&fields))
    }

    fn numel(&self, op: &'static str, dims: [usize; 2]) -> Result<usize> {
        mul(op, mul(op, self.planes, dims[0])?, dims[1])
    }
}

/// y, idx = max pooling of x: `x` holds `planes·H·W` elements, `y` and
/// `idx` `planes·OH·OW`; `idx` gets each maximum's `y·W + x` in its plane.
///
/// Errors: a zero kernel, stride or dilation, buffers too short, sizes
/// past i32.
pub fn max_pool2d_fwd<T: Float>(
    g: &PoolGeom,
    x: DevPtr<T>,
    y: DevPtr<T>,
    idx: DevPtr<i64>,
) -> Result<Launch> {
    const OP: &str = "max_pool2d_fwd";
    let (ni, no) = (g.numel(OP, g.input)?, g.numel(OP, g.output)?);
    check_len(OP, "x", &x, ni)?;
    check_len(OP, "y", &y, no)?;
    check_len(OP, "idx", &idx, no)?;
    Ok(Launch {
        module: Module::Pool,
        kernel: format!("maxpool_fwd_{}", T::NAME),
        grid: [grid_for(no as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: vec![Arg::ptr(x), Arg::ptr(y), Arg::ptr(idx), g.arg(OP)?],
    })
}

/// dx = the gradient of [`max_pool2d_fwd`] in f32: each `dy` entry added
/// at the index `idx` names in its plane, one thread per plane in output
/// order (a fixed summation order). `dx` (`planes·plane` f32) must be
/// zeroed; indices outside `0..plane` add nothing.
///
/// Errors: buffers too short, sizes past i64.
pub fn max_pool2d_bwd<T: Float>(
    planes: usize,
    plane: usize,
    outs: usize,
    dy: DevPtr<T>,
    idx: DevPtr<i64>,
    dx: DevPtr<f32>,
) -> Result<Launch> {
    const OP: &str = "max_pool2d_bwd";
    let (ni, no) = (mul(OP, planes, plane)?, mul(OP, planes, outs)?);
    check_len(OP, "dy", &dy, no)?;
    check_len(OP, "idx", &idx, no)?;
    check_len(OP, "dx", &dx, ni)?;
    Ok(Launch {
        module: Module::Pool,
        kernel: format!("maxpool_bwd_{}", T::NAME),
        grid: [grid_for(planes as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(dy),
            Arg::ptr(idx),
            Arg::ptr(dx),
            Arg::i64(to_i64(OP, "planes", planes)?),
            Arg::i64(to_i64(OP, "plane", plane)?),
            Arg::i64(to_i64(OP, "outs", outs)?),
        ],
    })
}

/// The windows of an average pooling over `planes` planes of `input` =
/// [H, W], giving `output` = [OH, OW] per plane. The caller checks the
/// geometry (PyTorch's output sizes, padding at most half the window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AvgWindows {
    /// `avg_pool2d`: windows of `kernel` every `stride`, `padding` on both
    /// sides; each sum divided by `divisor` when given, else by the padded
    /// window size (`count_include_pad`) or the input elements in it.
    Fixed {
        /// Window height and width.
        kernel: [usize; 2],
        /// Step between windows.
        stride: [usize; 2],
        /// Implicit padding on both sides.
        padding: [usize; 2],
        /// Count padding in the divisor.
        count_include_pad: bool,
        /// PyTorch's `divisor_override`.
        divisor: Option<usize>,
    },
    /// `adaptive_avg_pool2d`: window `o` of `OUT` over `N` inputs covers
    /// `floor(o·N/OUT) .. ceil((o+1)·N/OUT)`.
    Adaptive,
}

/// Geometry of an average pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgGeom {
    /// Planes (batch × channels).
    pub planes: usize,
    /// Input height and width.
    pub input: [usize; 2],
    /// Output height and width.
    pub output: [usize; 2],
    /// The windows.
    pub windows: AvgWindows,
}

impl AvgGeom {
    fn arg(&self, op: &'static str) -> Result<Arg> {
        let (kernel, stride, padding, adaptive, include_pad, divisor) = match self.windows {
            AvgWindows::Fixed {
                kernel,
                stride,
                padding,
                count_include_pad,
                divisor,
            } => {
                if kernel.contains(&0) || stride.contains(&0) || divisor == Some(0) {
                    return Err(Error::arg(
                        op,
                        format!("zero kernel, stride or divisor in {self:?}"),
                    ));
                }
                (
                    kernel,
                    stride,
                    padding,
                    0,
                    count_include_pad as usize,
                    divisor.unwrap_or(0),
                )
            }
            AvgWindows::Adaptive => ([1, 1], [1, 1], [0, 0], 1, 0, 0),
        };
        let ints = [
            self.input[0],
            self.input[1],
            self.output[0],
            self.output[1],
            kernel[0],
            kernel[1],
            stride[0],
            stride[1],
            padding[0],
            padding[1],
            adaptive,
            include_pad,
            divisor,
            // Pads the struct to its 8-byte alignment (64 bytes), as C lays it out.
            0,
        ];
        let mut fields = vec![Arg::i64(to_i64(op, "planes", self.planes)?)];
        for v in ints {
            fields.push(Arg::i32(to_i32(op, "geometry", v)?));
        }
        // The window bounds the kernels form must fit: o·S + K + P in i32,
        // the adaptive (o + 1)·N + OUT in i64.
        for d in 0..2 {
            let (o, n) = (self.output[d], self.input[d]);
            let reach = if adaptive == 1 {
                o.checked_mul(n).and_then(|v| v.checked_add(n + o))
            } else {
                o.checked_mul(stride[d])
                    .and_then(|v| v.checked_add(n + kernel[d] + padding[d]))
            }
            .ok_or_else(|| Error::arg(op, format!("geometry overflows: {self:?}")))?;
            if adaptive == 1 {
                to_i64(op, "window reach", reach)?;
            } else {
                to_i32(op, "window reach", reach)?;
            }
        }
        Ok(Arg::fields(&fields))
    }

    fn numel(&self, op: &'static str, dims: [usize; 2]) -> Result<usize> {
        mul(op, mul(op, self.planes, dims[0])?, dims[1])
    }
}

/// y = average pooling of x: `x` holds `planes·H·W` elements, `y`
/// `planes·OH·OW`; each window summed in f32 in row-major order, then
/// divided once.
///
/// Errors: a zero kernel, stride or divisor, buffers too short, sizes past
/// i32.
pub fn avg_pool2d_fwd<T: Float>(g: &AvgGeom, x: DevPtr<T>, y: DevPtr<T>) -> Result<Launch> {
    const OP: &str = "avg_pool2d_fwd";
    let (ni, no) = (g.numel(OP, g.input)?, g.numel(OP, g.output)?);
    check_len(OP, "x", &x, ni)?;
    check_len(OP, "y", &y, no)?;
    Ok(Launch {
        module: Module::Pool,
        kernel: format!("avgpool_fwd_{}", T::NAME),
        grid: [grid_for(no as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: vec![Arg::ptr(x), Arg::ptr(y), g.arg(OP)?],
    })
}

/// dx = the gradient of [`avg_pool2d_fwd`]: each input element gathers
/// `dy / divisor` of every window holding it, in output order in f32 (the
/// CPU scatter's additions in its order), rounded once to `T`.
///
/// Errors: as [`avg_pool2d_fwd`].
pub fn avg_pool2d_bwd<T: Float>(g: &AvgGeom, dy: DevPtr<T>, dx: DevPtr<T>) -> Result<Launch> {
    const OP: &str = "avg_pool2d_bwd";
    let (ni, no) = (g.numel(OP, g.input)?, g.numel(OP, g.output)?);
    check_len(OP, "dy", &dy, no)?;
    check_len(OP, "dx", &dx, ni)?;
    Ok(Launch {
        module: Module::Pool,
        kernel: format!("avgpool_bwd_{}", T::NAME),
        grid: [grid_for(ni as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: vec![Arg::ptr(dy), Arg::ptr(dx), g.arg(OP)?],
    })
}
