//! Padding on the GPU, one padded dim at a time, composed of device views
//! and `cat`: constant pieces from the device's creation path, reflected
//! pieces as flipped narrows, replicated ones as an edge slice broadcast.
//! Every element is copied, never computed: the CPU's bits.

use super::{pad_of, PadMode};
use crate::{Result, Tensor};

/// `x` padded by the checked `pads` with `mode`, as [`Tensor::pad`].
///
/// Errors: a device failure.
pub(crate) fn pad(x: &Tensor, pads: &[usize], mode: PadMode) -> Result<Tensor> {
    let nd = x.ndim();
    let mut y = x.clone();
    for d in 0..nd {
        let (l, r) = pad_of(pads, nd, d);
        if l == 0 && r == 0 {
            continue;
        }
        let (n, dim) = (y.shape()[d], d as isize);
        let piece = |len: usize, left: bool| -> Result<Tensor> {
            let mut shape = y.shape().to_vec();
            shape[d] = len;
            match mode {
                PadMode::Constant(v) => Tensor::full(&shape, v, y.dtype())?.to_device(y.device()),
                // [a b c] reflected by 2 on the left is [c b | a b c].
                PadMode::Reflect => y
                    .narrow(dim, if left { 1 } else { n - 1 - len }, len)?
                    .flip(&[dim]),
                PadMode::Replicate => y.narrow(dim, if left { 0 } else { n - 1 }, 1)?.expand(shape),
            }
        };
        let mut parts = Vec::with_capacity(3);
        if l > 0 {
            parts.push(piece(l, true)?);
        }
        parts.push(y.clone());
        if r > 0 {
            parts.push(piece(r, false)?);
        }
        y = Tensor::cat(&parts, dim)?;
    }
    y.contiguous()
}
