//! Row-parallel filling of a contiguous output, shared by the shaping ops.

use rayon::prelude::*;

use crate::strided::PAR_THRESHOLD;

/// Calls `f(r, row)` for every row of `row_len` elements of `out` (the last
/// row may be shorter only if `out.len()` is not a multiple). Rows go to
/// threads in blocks of about [`PAR_THRESHOLD`] elements, so each row is
/// computed the same way on any thread count.
pub(crate) fn for_each_row<T: Send>(out: &mut [T], row_len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if out.is_empty() || row_len == 0 {
        return;
    }
    let rows_per_task = (PAR_THRESHOLD / row_len).max(1);
    if out.len() <= PAR_THRESHOLD {
        for (r, row) in out.chunks_mut(row_len).enumerate() {
            f(r, row);
        }
    } else {
        out.par_chunks_mut(row_len * rows_per_task)
            .enumerate()
            .for_each(|(t, block)| {
                for (k, row) in block.chunks_mut(row_len).enumerate() {
                    f(t * rows_per_task + k, row);
                }
            });
    }
}
