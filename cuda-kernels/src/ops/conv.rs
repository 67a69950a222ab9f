//! im2col / col2im for 2-D convolution.

use super::Float;
use crate::launch::{check_len, grid_for, mul, to_i32, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::{Error, Result};

const BLOCK: u32 = 256;

/// Geometry of a 2-D convolution over images [channels, height, width].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeom {
    /// Images in the batch.
    pub batch: usize,
    /// Input channels.
    pub channels: usize,
    /// Input height and width.
    pub input: [usize; 2],
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Zero padding (top/bottom, left/right).
    pub padding: [usize; 2],
    /// Stride.
    pub stride: [usize; 2],
    /// Dilation.
    pub dilation: [usize; 2],
}

impl ConvGeom {
    /// Output height and width, or an error when the kernel does not fit.
    pub fn output(&self) -> Result<[usize; 2]> {
        let mut out = [0; 2];
        for (d, o) in out.iter_mut().enumerate() {
            if self.stride[d] == 0 || self.dilation[d] == 0 || self.kernel[d] == 0 {
                return Err(Error::arg(
                    "conv",
                    format!("zero kernel, stride or dilation in {self:?}"),
                ));
            }
            let overflow = || Error::arg("conv", format!("geometry overflows: {self:?}"));
            let span = self.dilation[d]
                .checked_mul(self.kernel[d] - 1)
                .and_then(|v| v.checked_add(1))
                .ok_or_else(overflow)?;
            let padded = self.padding[d]
                .checked_mul(2)
                .and_then(|p| p.checked_add(self.input[d]))
                .ok_or_else(overflow)?;
            if padded < span {
                return Err(Error::arg(
                    "conv",
                    format!("kernel span {span} exceeds the padded input {padded}"),
                ));
            }
            *o = (padded - span) / self.stride[d] + 1;
        }
        Ok(out)
    }

    /// Elements of one image's column matrix: channels*kh*kw x oh*ow.
    pub fn col_len(&self) -> Result<usize> {
        let [oh, ow] = self.output()?;
        [self.channels, self.kernel[0], self.kernel[1], oh, ow]
            .iter()
            .try_fold(1usize, |a, &b| mul("conv", a, b))
    }

    /// Elements of one input image.
    pub fn image_len(&self) -> Result<usize> {
        mul("conv", mul("conv", self.channels, self.input[0])?, self.input[1])
    }

    fn arg(&self) -> Result<Arg> {
        let [oh, ow] = self.output()?;
        let v = [
            self.channels,
            self.input[0],
            self.input[1],
            self.kernel[0],
            self.kernel[1],
            self.padding[0],
            self.padding[1],
            self.stride[0],
            self.stride[1],
            self.dilation[0],
            self.dilation[1],
            oh,
            ow,
        ];
        let fields = v
            .iter()
            .map(|&x| to_i32("conv", "geometry", x).map(Arg::i32))
            .collect::<Result<Vec<_>>>()?;
        Ok(Arg::fields(&fields))
    }
}

fn plan<A, B>(
    op: &'static str,
    k: String,
    g: &ConvGeom,
    items: usize,
    a: DevPtr<A>,
    b: DevPtr<B>,
) -> Result<Launch> {
    if g.batch > 65_535 {
        return Err(Error::arg(op, format!("batch {} above 65535", g.batch)));
    }
    Ok(Launch {
        module: Module::Im2col,
        kernel: k,
        grid: [grid_for(items as u64, BLOCK), g.batch as u32, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args: vec![Arg::ptr(a), Arg::ptr(b), g.arg()?],
    })
}

/// col[b] = im2col(x[b]) for every image.
///
/// Errors: geometry that does not fit, buffers too short.
pub fn im2col<T: Float>(g: &ConvGeom, x: DevPtr<T>, col: DevPtr<T>) -> Result<Launch> {
    const OP: &str = "im2col";
    let (il, cl) = (g.image_len()?, g.col_len()?);
    check_len(OP, "x", &x, mul(OP, g.batch, il)?)?;
    check_len(OP, "col", &col, mul(OP, g.batch, cl)?)?;
    plan(OP, format!("im2col_{}", T::NAME), g, cl, x, col)
}

/// x[b] = col2im(col[b]): each pixel the sum of the column entries that
/// read it (the adjoint of [`im2col`]).
///
/// Errors: as [`im2col`].
pub fn col2im<T: Float>(g: &ConvGeom, col: DevPtr<T>, x: DevPtr<T>) -> Result<Launch> {
    const OP: &str = "col2im";
    let (il, cl) = (g.image_len()?, g.col_len()?);
    check_len(OP, "x", &x, mul(OP, g.batch, il)?)?;
    check_len(OP, "col", &col, mul(OP, g.batch, cl)?)?;
    plan(OP, format!("col2im_{}", T::NAME), g, il, col, x)
}
