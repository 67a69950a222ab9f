//! GPU `tril`/`triu`: the `tri` kernel of `elementwise.cu`, by element
//! size (every dtype), over the contiguous input as `[batch, rows, cols]`.

use tessera_cuda_kernels::ops::elementwise::tri as tri_launch;

use super::matrix_dims;
use crate::cuda::{contiguous, contiguous_ptr, kernel_err, launch, state_of, with_element_size, Output};
use crate::{Result, Tensor};

/// The lower (`lower`) or upper triangle of the GPU tensor `x` about
/// `diagonal`, reported as `op`.
///
/// Errors: fewer than 2 dims, a device failure.
pub(crate) fn tri(op: &'static str, x: &Tensor, diagonal: isize, lower: bool) -> Result<Tensor> {
    let (rows, cols) = matrix_dims(op, x)?;
    let state = state_of(op, x)?;
    let x = contiguous(x)?;
    let out = Output::new(op, &state, x.dtype(), x.numel())?;
    let batch = x.numel() / (rows * cols).max(1);
    // Beyond ±(rows + cols) every diagonal keeps (or drops) the same elements.
    let reach = (rows + cols) as i64;
    let diag = (diagonal as i64).clamp(-reach, reach);
    let l = with_element_size!(x.dtype(), T => tri_launch::<T>(
        contiguous_ptr(&x),
        out.ptr(),
        batch,
        rows,
        cols,
        diag,
        lower,
    ))
    .map_err(kernel_err(op, state.device()))?;
    launch(op, &state, &[l])?;
    Ok(out.into_tensor(x.shape()))
}
