//! Lane kernels: ops that map each 1-d lane of a tensor along one dim to a
//! lane of the output (softmax, cumsum). Lanes are independent, so splitting
//! them across threads cannot change the results.

use rayon::prelude::*;

use crate::strided::{chunk_len, Coalesced, PAR_THRESHOLD};
use crate::{Element, Layout, Result, Tensor};

/// A tensor shaped like `x` whose every lane along `dim` (a resolved index,
/// `dim < x.ndim()`) is written by `f(src, off, stride, out)`: the lane's
/// input is `src[off + i·stride]` for `i < out.len()`, `src` being `x`'s
/// storage slice. `T` must be `x`'s dtype. Errors, naming `op`, when memory
/// is out or the copy that moves the lane dim back into place fails.
pub(crate) fn map_lanes<T: Element, U: Element>(
    op: &'static str,
    x: &Tensor,
    dim: usize,
    f: impl Fn(&[T], usize, isize, &mut [U]) + Sync,
) -> Result<Tensor> {
    let (shape, strides) = (x.shape(), x.strides());
    let n = shape[dim];
    let mut other_shape = shape.to_vec();
    let mut other_strides = strides.to_vec();
    other_shape.remove(dim);
    other_strides.remove(dim);
    let stride = strides[dim];
    let other = Layout::new(other_shape.clone(), other_strides, x.layout().offset());
    let src = x.storage().as_slice::<T>();
    let walk = Coalesced::new([&other]);
    let run = |first: usize, out: &mut [U]| {
        if n == 0 {
            return;
        }
        let count = out.len() / n;
        walk.for_each_row(first..first + count, |dst, [off], [st], len| {
            for i in 0..len {
                let lane = dst - first + i;
                let o = (off as isize + i as isize * st) as usize;
                f(src, o, stride, &mut out[lane * n..(lane + 1) * n]);
            }
        });
    };
    let mut lane_shape = other_shape;
    lane_shape.push(n);
    let built = Tensor::build_overwrite::<U>(op, &lane_shape, |out| {
        if out.len() <= PAR_THRESHOLD || n == 0 {
            run(0, out);
        } else {
            let per_task = chunk_len(out.len()).div_ceil(n);
            out.par_chunks_mut(per_task * n)
                .enumerate()
                .for_each(|(k, part)| run(k * per_task, part));
        }
    })?;
    let nd = shape.len();
    if dim + 1 == nd {
        return Ok(built);
    }
    // Built dims are [others..., dim]; move the lane dim back into place.
    let perm: Vec<isize> = (0..nd)
        .map(|k| match k {
            k if k < dim => k as isize,
            k if k == dim => nd as isize - 1,
            k => k as isize - 1,
        })
        .collect();
    built
        .permute(&perm)
        .expect("a permutation of the built dims")
        .contiguous()
}
