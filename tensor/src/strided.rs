//! Walking strided layouts: the loops every CPU kernel is built on.
//!
//! Kernels see a tensor as rows: runs of elements along the innermost
//! (coalesced) dimension, each with a start offset and a stride per operand.
//! Work above [`PAR_THRESHOLD`] elements is split across rayon threads by
//! output range, so results do not depend on the thread count.

use std::ops::Range;

use rayon::prelude::*;

use crate::Layout;

/// Element count above which CPU kernels split work across threads.
pub const PAR_THRESHOLD: usize = 1 << 15;

/// A view of `N` layouts of the same shape with size-1 dimensions dropped and
/// adjacent dimensions merged wherever every layout allows it.
#[derive(Debug, Clone)]
pub struct Coalesced<const N: usize> {
    shape: Vec<usize>,
    strides: [Vec<isize>; N],
    offsets: [usize; N],
}

impl<const N: usize> Coalesced<N> {
    /// Coalesces `layouts`, which must all have the same shape.
    pub fn new(layouts: [&Layout; N]) -> Self {
        let shape0 = layouts[0].shape();
        debug_assert!(layouts.iter().all(|l| l.shape() == shape0));
        let mut shape: Vec<usize> = Vec::with_capacity(shape0.len());
        let mut strides: [Vec<isize>; N] = std::array::from_fn(|_| Vec::with_capacity(shape0.len()));
        for (d, &n) in shape0.iter().enumerate() {
            if n == 1 {
                continue;
            }
            let mergeable = !shape.is_empty()
                && (0..N).all(|k| {
                    let prev = *strides[k].last().expect("non-empty");
                    prev == layouts[k].strides()[d] * n as isize
                });
            if mergeable {
                *shape.last_mut().expect("non-empty") *= n;
                for k in 0..N {
                    *strides[k].last_mut().expect("non-empty") = layouts[k].strides()[d];
                }
            } else {
                shape.push(n);
                for k in 0..N {
                    strides[k].push(layouts[k].strides()[d]);
                }
            }
        }
        Coalesced {
            shape,
            strides,
            offsets: std::array::from_fn(|k| layouts[k].offset()),
        }
    }

    /// Total number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Calls `f(dst, offsets, strides, len)` for every row segment covering
    /// the row-major element range `range`: `dst` is the row-major index of the
    /// segment's first element, `offsets[k]` its storage index in operand `k`,
    /// `strides[k]` the step between consecutive elements of the segment.
    pub fn for_each_row(&self, range: Range<usize>, mut f: impl FnMut(usize, [usize; N], [isize; N], usize)) {
        if range.is_empty() {
            return;
        }
        let nd = self.shape.len();
        if nd == 0 {
            f(range.start, self.offsets, [0; N], 1);
            return;
        }
        let inner = self.shape[nd - 1];
        let inner_strides: [isize; N] = std::array::from_fn(|k| self.strides[k][nd - 1]);
        // Multi-index of range.start.
        let mut idx = vec![0usize; nd];
        let mut rem = range.start;
        for d in (0..nd).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
        }
        let mut pos: [isize; N] = std::array::from_fn(|k| {
            self.offsets[k] as isize
                + idx
                    .iter()
                    .zip(&self.strides[k])
                    .map(|(&i, &s)| i as isize * s)
                    .sum::<isize>()
        });
        let mut dst = range.start;
        while dst < range.end {
            let len = (inner - idx[nd - 1]).min(range.end - dst);
            f(dst, pos.map(|p| p as usize), inner_strides, len);
            dst += len;
            // Advance to the start of the next row.
            for (p, st) in pos.iter_mut().zip(inner_strides) {
                *p += len as isize * st;
            }
            idx[nd - 1] += len;
            let mut d = nd - 1;
            while idx[d] == self.shape[d] && d > 0 {
                for (p, st) in pos.iter_mut().zip(&self.strides) {
                    *p += st[d - 1] - self.shape[d] as isize * st[d];
                }
                idx[d] = 0;
                idx[d - 1] += 1;
                d -= 1;
            }
        }
    }
}

/// Fills the row-major output `out` (one element per element of the common
/// shape of `layouts`) by calling `f(out_segment, offsets, strides)` on row
/// segments, in parallel when `out` is large. `f` must write every element of
/// its segment; segment `i` of `out_segment` corresponds to operand `k`'s
/// storage index `offsets[k] + i * strides[k]`.
pub fn fill_rows<T: Send, const N: usize>(
    out: &mut [T],
    layouts: [&Layout; N],
    f: impl Fn(&mut [T], [usize; N], [isize; N]) + Sync,
) {
    let c = Coalesced::new(layouts);
    debug_assert_eq!(c.numel(), out.len());
    let chunk = chunk_len(out.len());
    if out.len() <= chunk {
        c.for_each_row(0..out.len(), |dst, offs, strides, len| {
            f(&mut out[dst..dst + len], offs, strides)
        });
    } else {
        out.par_chunks_mut(chunk).enumerate().for_each(|(i, part)| {
            let start = i * chunk;
            c.for_each_row(start..start + part.len(), |dst, offs, strides, len| {
                f(&mut part[dst - start..dst - start + len], offs, strides)
            });
        });
    }
}

/// The per-task chunk length for `n` elements: everything in one task below
/// [`PAR_THRESHOLD`], else enough chunks to balance the thread pool.
pub fn chunk_len(n: usize) -> usize {
    if n <= PAR_THRESHOLD {
        n.max(1)
    } else {
        let tasks = rayon::current_num_threads() * 4;
        n.div_ceil(tasks).max(PAR_THRESHOLD / 4)
    }
}

/// Elements [`map_run`] gathers per batch when a row is strided.
const GATHER: usize = 256;

/// Calls `f(src_run, dst_run)` over the output row `out` whose elements are
/// `src[off + i*stride]`: once with the contiguous source slice when the
/// stride is 1, else on batches gathered into a stack buffer, so a slice
/// kernel serves strided rows too and every element goes through the same
/// instructions either way.
#[inline(always)]
pub fn map_run<S: Copy + Default, T>(
    src: &[S],
    off: usize,
    stride: isize,
    out: &mut [T],
    mut f: impl FnMut(&[S], &mut [T]),
) {
    if stride == 1 {
        f(&src[off..off + out.len()], out);
        return;
    }
    let mut buf = [S::default(); GATHER];
    let mut p = off as isize;
    for part in out.chunks_mut(GATHER) {
        for b in buf.iter_mut().take(part.len()) {
            *b = src[p as usize];
            p += stride;
        }
        f(&buf[..part.len()], part);
    }
}

/// Reads `len` elements of `src` starting at storage index `off` with step
/// `stride`, passing each to `f` with its position in the segment.
#[inline(always)]
pub fn read_row<T: Copy>(src: &[T], off: usize, stride: isize, len: usize, mut f: impl FnMut(usize, T)) {
    if stride == 1 {
        for (i, &x) in src[off..off + len].iter().enumerate() {
            f(i, x);
        }
    } else {
        let mut p = off as isize;
        for i in 0..len {
            f(i, src[p as usize]);
            p += stride;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets_naive(l: &Layout) -> Vec<usize> {
        let n = l.numel();
        let mut out = Vec::with_capacity(n);
        for lin in 0..n {
            let mut rem = lin;
            let mut off = l.offset() as isize;
            for d in (0..l.ndim()).rev() {
                let i = rem % l.shape()[d];
                rem /= l.shape()[d];
                off += i as isize * l.strides()[d];
            }
            out.push(off as usize);
        }
        out
    }

    #[test]
    fn rows_cover_every_element_in_order() {
        let base = Layout::contiguous(&[3, 4, 5]);
        let views = [
            base.clone(),
            base.transpose(0, 2).unwrap(),
            base.flip(&[1]).unwrap(),
            base.slice(2, 1, 5, 2).unwrap(),
            base.narrow(1, 1, 2).unwrap().permute(&[2, 0, 1]).unwrap(),
            Layout::contiguous(&[4, 1]).broadcast_to(&[3, 4, 5]).unwrap(),
        ];
        for v in &views {
            let want = offsets_naive(v);
            for start in [0, 1, 7, want.len() / 2] {
                let mut got = Vec::new();
                Coalesced::new([v]).for_each_row(start..want.len(), |dst, [o], [s], len| {
                    assert_eq!(dst, start + got.len());
                    for i in 0..len {
                        got.push((o as isize + i as isize * s) as usize);
                    }
                });
                assert_eq!(got, want[start..], "layout {v:?} from {start}");
            }
        }
    }
}
