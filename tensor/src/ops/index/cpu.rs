//! CPU kernels for the index ops: a strided row gather shared by
//! `index_select`, `gather` and `embedding`, and the block-parallel scatter.

use rayon::prelude::*;

use crate::strided::{fill_rows, PAR_THRESHOLD};
use crate::{bf16, f16, Element, Layout, Result, Tensor};

/// Element addition as `scatter_add` defines it: floats in their own
/// precision (f16/bf16 through f32), integers wrapping, bools OR-ed.
pub(crate) trait AddElement: Element {
    /// `self + other`.
    fn add(self, other: Self) -> Self;
}

macro_rules! add_native {
    ($($t:ty),*) => {$(
        impl AddElement for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self + other
            }
        }
    )*};
}
macro_rules! add_wrapping {
    ($($t:ty),*) => {$(
        impl AddElement for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
        }
    )*};
}
macro_rules! add_via_f32 {
    ($($t:ty),*) => {$(
        impl AddElement for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                <$t>::from_f32(self.to_f32() + other.to_f32())
            }
        }
    )*};
}
add_native!(f32, f64);
add_wrapping!(i64, u32, u8);
add_via_f32!(f16, bf16);

impl AddElement for bool {
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self | other
    }
}

/// A new contiguous tensor of `shape` with
/// `out[p] = src[src_layout(p) + index[idx_layout(p)] * dim_stride]`:
/// `src_layout` is the source seen with the gathered dimension's stride set
/// to 0, `idx_layout` the index seen in the output's shape. Indices must
/// already be checked. Where the index is constant along a row and the source
/// row is contiguous, the row is copied whole.
pub(super) fn gather_rows<T: Element>(
    op: &'static str,
    src: &Tensor,
    src_layout: &Layout,
    dim_stride: isize,
    index: &Tensor,
    idx_layout: &Layout,
    shape: &[usize],
) -> Result<Tensor> {
    let s = src.storage().as_slice::<T>();
    let ix = index.storage().as_slice::<i64>();
    Tensor::build::<T>(op, shape, |out| {
        fill_rows(out, [src_layout, idx_layout], |o, [so, io], [ss, is]| {
            let n = o.len();
            if is == 0 {
                let base = so as isize + ix[io] as isize * dim_stride;
                if ss == 1 {
                    let b = base as usize;
                    o.copy_from_slice(&s[b..b + n]);
                } else {
                    for (k, y) in o.iter_mut().enumerate() {
                        *y = s[(base + k as isize * ss) as usize];
                    }
                }
            } else {
                for (k, y) in o.iter_mut().enumerate() {
                    let i = ix[(io as isize + k as isize * is) as usize] as isize;
                    *y = s[(so as isize + k as isize * ss + i * dim_stride) as usize];
                }
            }
        })
    })
}

/// Where each element of an index tensor lands in a contiguous output for
/// scatter along `dim`. The output is seen as `[pre, size, post]` blocks
/// (one per coordinate of the dims before `dim`); index elements with the
/// same leading coordinates write only inside one block, so blocks run in
/// parallel while writes inside a block keep the index's row-major order.
pub(super) struct ScatterPlan {
    /// Output elements per block (`size * post` of the output).
    block: usize,
    /// Output elements per step along `dim` (`post` of the output).
    post_out: usize,
    /// Size of the index along `dim`.
    n_index: usize,
    /// For each output block, the index's block number, if it has one.
    block_of: Vec<Option<usize>>,
    /// For each row-major position in the index's trailing dims, the offset
    /// inside an output block (at dim coordinate 0).
    q_off: Vec<usize>,
}

impl ScatterPlan {
    /// The plan for scattering an index of `index_shape` along `dim` into a
    /// contiguous output of `out_shape`; the shapes must already satisfy
    /// the gather/scatter rule.
    pub(super) fn new(dim: usize, index_shape: &[usize], out_shape: &[usize]) -> Self {
        let post_out: usize = out_shape[dim + 1..].iter().product();
        let pre_out: usize = out_shape[..dim].iter().product();
        let mut block_of = vec![None; pre_out];
        for (i_lin, p) in row_major_offsets(&index_shape[..dim], &out_shape[..dim])
            .into_iter()
            .enumerate()
        {
            block_of[p] = Some(i_lin);
        }
        ScatterPlan {
            block: out_shape[dim] * post_out,
            post_out,
            n_index: index_shape[dim],
            block_of,
            q_off: row_major_offsets(&index_shape[dim + 1..], &out_shape[dim + 1..]),
        }
    }

    /// For each index element `r` (row-major), combines `val(r)` into its
    /// output element with `combine`.
    pub(super) fn run<T: Element>(
        &self,
        out: &mut [T],
        idx: &[i64],
        val: impl Fn(usize) -> T + Sync,
        combine: impl Fn(&mut T, T) + Sync,
    ) {
        if idx.is_empty() || self.block == 0 {
            return;
        }
        let per_block = self.n_index * self.q_off.len();
        let one = |(b, chunk): (usize, &mut [T])| {
            let Some(ib) = self.block_of[b] else { return };
            let mut r = ib * per_block;
            for _ in 0..self.n_index {
                for &q in &self.q_off {
                    combine(&mut chunk[idx[r] as usize * self.post_out + q], val(r));
                    r += 1;
                }
            }
        };
        if idx.len() > PAR_THRESHOLD {
            out.par_chunks_mut(self.block).enumerate().for_each(one);
        } else {
            out.chunks_mut(self.block).enumerate().for_each(one);
        }
    }
}

/// For every row-major multi-index of `inner` (a box inside `outer`, dim by
/// dim), its row-major linear position in `outer`.
fn row_major_offsets(inner: &[usize], outer: &[usize]) -> Vec<usize> {
    let mut offs = vec![0usize];
    for (&n, &m) in inner.iter().zip(outer) {
        offs = offs
            .iter()
            .flat_map(|&o| (0..n).map(move |i| o * m + i))
            .collect();
    }
    offs
}
