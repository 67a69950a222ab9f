//! Depth-split GEMMs: products with a small output and a long depth (the
//! weight gradient `gᵀ·x` of a layer, summed over thousands of tokens).
//!
//! The packed driver parallelises over the output, one parallel region per
//! depth block: a 192×192 output over 8320 tokens is 33 regions of nine
//! small tasks, and two threads ran it barely faster than one. Here the
//! depth is cut into slices that run as independent GEMMs into their own
//! partial outputs, which are then added in slice order. The slices are a
//! function of the shape alone, so results are the same on any number of
//! threads, whether or not the caller allowed parallelism.

use rayon::prelude::*;

use super::gemm::{combine, drive, Epilogue, GemmShape, MatMut, Packing};
use super::pack::MatRef;
use crate::FloatMath;

/// The shortest depth a slice gets.
const SLICE_DEPTH: usize = 2048;
/// The largest output (elements) that is split: the partial outputs are
/// written and read again, which pays only while they are small.
const MAX_OUTPUT: usize = 1 << 18;
/// The most slices.
const MAX_SLICES: usize = 8;

/// How many depth slices an `m × n × k` product is summed in, `None` when it
/// is not split.
pub(super) fn slices(m: usize, n: usize, k: usize) -> Option<usize> {
    let s = (k / SLICE_DEPTH).min(MAX_SLICES);
    (s >= 2 && m.saturating_mul(n) <= MAX_OUTPUT).then_some(s)
}

/// Runs the product in `slices` depth slices (see the module docs) through
/// packing `pk`, then combines their sum with C as the driver would:
/// `alpha·Σ + beta·C`, then the epilogue. `c` must be a checked view.
#[allow(clippy::too_many_arguments)]
pub(super) fn drive_split<S: Sync, P: Packing<S>>(
    pk: &P,
    s: GemmShape<P::Acc>,
    a: MatRef<S>,
    b: MatRef<S>,
    c: MatMut<P::Acc>,
    epi: Epilogue<P::Acc>,
    par: bool,
    slices: usize,
) {
    let GemmShape { m, n, k, .. } = s;
    let (zero, one) = (<P::Acc as FloatMath>::ZERO, <P::Acc as FloatMath>::ONE);
    let depth = k.div_ceil(slices);
    let mut parts = vec![zero; slices * m * n];
    // Slices beyond the threads split their output again inside.
    let inner_par = par && rayon::current_num_threads() > slices;
    let slice = |(t, part): (usize, &mut [P::Acc])| {
        let k0 = t * depth;
        let shape = GemmShape {
            m,
            n,
            k: depth.min(k - k0),
            alpha: one,
            beta: zero,
        };
        let at = MatRef {
            off: a.at(0, k0),
            ..a
        };
        let bt = MatRef {
            off: b.at(k0, 0),
            ..b
        };
        let out = MatMut {
            data: part,
            off: 0,
            rs: n as isize,
            cs: 1,
        };
        drive(pk, shape, at, bt, out, Epilogue::none(), inner_par);
    };
    if par {
        parts.par_chunks_mut(m * n).enumerate().for_each(slice);
    } else {
        parts.chunks_mut(m * n).enumerate().for_each(slice);
    }
    let (first, rest) = parts.split_at_mut(m * n);
    for part in rest.chunks(m * n) {
        first.iter_mut().zip(part).for_each(|(x, &y)| *x += y);
    }
    combine(first, s, c, &epi);
}
