//! Ops on [`Var`] that rearrange or mask elements: `pad` (constant, reflect,
//! replicate), `repeat`, `tril` and `triu`.

use tessera_tensor::{PadMode, Result, Tensor};

use super::index::zeros;
use super::record_op;
use super::registry as reg;
use crate::Var;

impl Var {
    /// `self` padded along its trailing dims (PyTorch's `F.pad`; `pads` are
    /// (left, right) pairs from the last dim). Constant padding passes the
    /// interior of the gradient back; reflect and replicate padding add the
    /// gradient of each copied element to its source.
    ///
    /// Errors as [`Tensor::pad`].
    pub fn pad(&self, pads: &[usize], mode: PadMode) -> Result<Var> {
        let y = self.tensor().pad(pads, mode)?;
        let (shape, pads) = (self.shape().to_vec(), pads.to_vec());
        record_op(reg::PAD, y, &[self], move |g, _| {
            let nd = shape.len();
            let mut g = g.clone();
            for (k, lr) in pads.chunks_exact(2).enumerate() {
                let (d, l, r) = (nd - 1 - k, lr[0], lr[1]);
                if l == 0 && r == 0 {
                    continue;
                }
                g = match mode {
                    PadMode::Constant(_) => g.narrow(d as isize, l, shape[d])?,
                    _ => fold_back(&g, d, shape[d], l, mode)?,
                };
            }
            Ok(vec![Some(g)])
        })
    }

    /// `self` tiled `repeats[k]` times along dim `k` (PyTorch's `repeat`;
    /// extra leading repeats add leading dims). The gradient sums the tiles.
    ///
    /// Errors as [`Tensor::repeat`].
    pub fn repeat(&self, repeats: &[usize]) -> Result<Var> {
        let y = self.tensor().repeat(repeats)?;
        let (shape, repeats) = (self.shape().to_vec(), repeats.to_vec());
        record_op(reg::REPEAT, y, &[self], move |g, _| {
            // [r0·s0, r1·s1, ...] → [r0, s0, r1, s1, ...], summed over the r's.
            let lead = repeats.len() - shape.len();
            let padded = std::iter::repeat_n(1, lead).chain(shape.iter().copied());
            let split: Vec<usize> = repeats.iter().zip(padded).flat_map(|(&r, s)| [r, s]).collect();
            let dims: Vec<isize> = (0..repeats.len() as isize).map(|k| 2 * k).collect();
            let summed = g.reshape(split)?.sum(&dims, false)?;
            Ok(vec![Some(summed.reshape(&shape)?)])
        })
    }

    /// The lower triangle of the last two dims (`j - i <= diagonal` kept).
    ///
    /// Errors as [`Tensor::tril`].
    pub fn tril(&self, diagonal: isize) -> Result<Var> {
        let y = self.tensor().tril(diagonal)?;
        record_op(reg::TRIL, y, &[self], move |g, _| {
            Ok(vec![Some(g.tril(diagonal)?)])
        })
    }

    /// The upper triangle of the last two dims (`j - i >= diagonal` kept).
    ///
    /// Errors as [`Tensor::triu`].
    pub fn triu(&self, diagonal: isize) -> Result<Var> {
        let y = self.tensor().triu(diagonal)?;
        record_op(reg::TRIU, y, &[self], move |g, _| {
            Ok(vec![Some(g.triu(diagonal)?)])
        })
    }
}

/// The gradient of reflect/replicate padding of dim `d` (input size `n`,
/// left padding `l`): each output position's gradient is added to the input
/// position it was copied from.
fn fold_back(g: &Tensor, d: usize, n: usize, l: usize, mode: PadMode) -> Result<Tensor> {
    let len = g.shape()[d];
    let last = n as isize - 1;
    let src: Vec<i64> = (0..len)
        .map(|j| {
            let i = j as isize - l as isize;
            let s = match mode {
                PadMode::Reflect if i < 0 => -i,
                PadMode::Reflect if i > last => 2 * last - i,
                _ => i.clamp(0, last),
            };
            s as i64
        })
        .collect();
    let mut unit = vec![1usize; g.ndim()];
    unit[d] = len;
    let idx = Tensor::from_vec(src, &unit)?
        .to_device(g.device())?
        .broadcast_to(g.shape())?;
    let mut shape = g.shape().to_vec();
    shape[d] = n;
    zeros(g, &shape)?.scatter_add(d as isize, &idx, g)
}
