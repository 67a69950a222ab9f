//! `repeat`: tiling a tensor along every dim (PyTorch's `Tensor.repeat`).

use crate::{Error, Layout, Result, Tensor};

impl Tensor {
    /// `self` tiled `repeats[k]` times along dim `k`; when `repeats` is
    /// longer than the rank, `self` first gains leading size-1 dims (PyTorch's
    /// `repeat`). The result is a new contiguous tensor. Errors when
    /// `repeats` is shorter than the rank or the result would overflow.
    pub fn repeat(&self, repeats: &[usize]) -> Result<Tensor> {
        const OP: &str = "repeat";
        let nd = self.ndim();
        if repeats.len() < nd {
            return Err(Error::arg(
                OP,
                format!(
                    "{} repeats {repeats:?} are fewer than the {nd} dims of shape {:?}",
                    repeats.len(),
                    self.shape()
                ),
            ));
        }
        let lead = repeats.len() - nd;
        // Seen as [r0, n0, r1, n1, ...] with stride 0 on each repeat, the
        // tiled tensor is a broadcast view; one strided copy materialises it.
        let mut big_shape = Vec::with_capacity(2 * repeats.len());
        let mut big_strides = Vec::with_capacity(2 * repeats.len());
        let mut shape = Vec::with_capacity(repeats.len());
        for (k, &r) in repeats.iter().enumerate() {
            let (n, st) = if k < lead { (1, 0) } else { (self.shape()[k - lead], self.strides()[k - lead]) };
            big_shape.extend([r, n]);
            big_strides.extend([0, st]);
            shape.push(r.checked_mul(n).ok_or_else(|| {
                Error::arg(OP, format!("repeating size {n} by {r} overflows"))
            })?);
        }
        crate::tensor::checked_numel(OP, &shape)?;
        let tiled = self.with_layout(Layout::new(big_shape, big_strides, self.layout().offset()));
        let shape: Vec<isize> = shape.iter().map(|&n| n as isize).collect();
        tiled.contiguous().reshape(&shape)
    }
}
