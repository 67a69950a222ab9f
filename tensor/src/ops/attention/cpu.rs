//! The CPU kernels of fused attention: FlashAttention-2 tiled per (batch,
//! head) with an online softmax; the inner products are the crate's packed
//! GEMM on tiles of at most `MAX_BLOCK × MAX_BLOCK` read straight from the
//! strided operands.
//!
//! The forward runs one task per (batch·head, query block); the backward
//! one task per batch·head, walking key blocks outside and query blocks
//! inside so dK/dV of a key block and dQ of the whole head accumulate in
//! one fixed order without atomics. Each task's GEMMs run on its own thread
//! and every element is summed in an order that depends only on the sizes,
//! so results are bitwise the same on any number of threads.
//!
//! Results take their operand's row order ([`RowOrder`]): when `q` is a
//! head-split view (`[b, T, h, d]` storage seen as `[b, h, T, d]`, as
//! MultiheadAttention makes), the output is stored `[b, L, h, Ev]` and
//! returned as the same kind of view, so merging the heads back is a
//! reshape, not a copy; dQ/dK/dV likewise follow q/k/v. The backward reads
//! the output gradient and the output with their strides.

use rayon::prelude::*;

use super::{Geom, SdpaArgs, SdpaDropout, SdpaGrads, SdpaMask, SdpaOutput};
use crate::ops::matmul::gemm::{gemm, Epilogue, GemmShape, MatMut};
use crate::ops::matmul::kernel::{GemmScalar, Isa};
use crate::ops::matmul::pack::MatRef;
use crate::simd::{kernels, Level};
use crate::{DType, Element, FloatElement, FloatMath, Layout, Result, Tensor};

/// The most rows (queries) or columns (keys) of one score tile.
const MAX_BLOCK: usize = 128;

/// The tile length along a dimension of `len`: the fewest tiles of at most
/// [`MAX_BLOCK`], of equal length but the last (65 keys are one tile of
/// 65, not 64 and a 1-key tile paying a whole GEMM call). A function of
/// `len` alone, so the summation order is too.
fn block(len: usize) -> usize {
    len.div_ceil(len.div_ceil(MAX_BLOCK).max(1)).max(1)
}

/// Multiply-adds below which a call runs on the calling thread.
const PAR_FLOPS: usize = 1 << 18;

/// The row operations of the online softmax, SIMD for f32.
pub(crate) trait AttnMath: GemmScalar + FloatElement<Math = Self> {
    /// max of a row (NaN if any element is NaN, −∞ when empty).
    fn row_max(x: &[Self]) -> Self;
    /// `y = exp(x − m)`.
    fn exp_shift(x: &[Self], m: Self, y: &mut [Self]);
    /// Σ x in a fixed order.
    fn row_sum(x: &[Self]) -> Self;
    /// `y = exp(x − m)` with a shift per element.
    fn exp_sub(x: &[Self], m: &[Self], y: &mut [Self]);
    /// `ds = p·(ds − δ)·scale` in place.
    fn attention_grad(p: &[Self], delta: &[Self], scale: Self, ds: &mut [Self]);
    /// Σ a·b in a fixed order.
    fn dot(a: &[Self], b: &[Self]) -> Self;
}

impl AttnMath for f32 {
    fn row_max(x: &[f32]) -> f32 {
        kernels::max(Level::best(), x)
    }
    fn exp_shift(x: &[f32], m: f32, y: &mut [f32]) {
        kernels::exp_shift(Level::best(), x, m, y)
    }
    fn row_sum(x: &[f32]) -> f32 {
        kernels::sum(Level::best(), x)
    }
    fn exp_sub(x: &[f32], m: &[f32], y: &mut [f32]) {
        kernels::exp_sub(Level::best(), x, m, y)
    }
    fn attention_grad(p: &[f32], delta: &[f32], scale: f32, ds: &mut [f32]) {
        kernels::attention_grad(Level::best(), p, delta, scale, ds)
    }
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        kernels::dot(Level::best(), a, b)
    }
}

impl AttnMath for f64 {
    fn row_max(x: &[f64]) -> f64 {
        x.iter().fold(f64::NEG_INFINITY, |a, &b| a.max_nan(b))
    }
    fn exp_shift(x: &[f64], m: f64, y: &mut [f64]) {
        y.iter_mut().zip(x).for_each(|(y, &x)| *y = (x - m).exp());
    }
    fn row_sum(x: &[f64]) -> f64 {
        x.iter().sum()
    }
    fn exp_sub(x: &[f64], m: &[f64], y: &mut [f64]) {
        y.iter_mut()
            .zip(x.iter().zip(m))
            .for_each(|(y, (&x, &m))| *y = (x - m).exp());
    }
    fn attention_grad(p: &[f64], delta: &[f64], scale: f64, ds: &mut [f64]) {
        ds.iter_mut()
            .zip(p.iter().zip(delta))
            .for_each(|(g, (&p, &d))| *g = p * (*g - d) * scale);
    }
    fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(&a, &b)| a * b).sum()
    }
}

/// A `[batch.., rows, cols]` operand broadcast over the call's batch dims:
/// matrix `b` starts at `offs[b]`.
struct Operand<'a, T> {
    data: &'a [T],
    offs: Vec<usize>,
    rs: isize,
    cs: isize,
}

impl<'a, T> Operand<'a, T> {
    fn new(data: &'a [T], layout: &Layout, g: &Geom, rows: usize, cols: usize) -> Result<Self> {
        let l = layout.broadcast_to(&g.shape(&[rows, cols]))?;
        let nb = g.batch.len();
        let offs = (0..g.count())
            .map(|mut lin| {
                let mut off = l.offset() as isize;
                for d in (0..nb).rev() {
                    off += (lin % g.batch[d]) as isize * l.strides()[d];
                    lin /= g.batch[d];
                }
                off as usize
            })
            .collect();
        Ok(Operand {
            data,
            offs,
            rs: l.strides()[nb],
            cs: l.strides()[nb + 1],
        })
    }

    /// Rows `row0..` of matrix `b`.
    fn rows(&self, b: usize, row0: usize) -> MatRef<'a, T> {
        MatRef {
            data: self.data,
            off: (self.offs[b] as isize + row0 as isize * self.rs) as usize,
            rs: self.rs,
            cs: self.cs,
        }
    }

    /// Element `(i, j)` of matrix `b`.
    #[inline]
    fn at(&self, b: usize, i: usize, j: usize) -> &'a T {
        &self.data[(self.offs[b] as isize + i as isize * self.rs + j as isize * self.cs) as usize]
    }
}

/// Where the rows of a `[batch.., rows, width]` result lie: batch-major
/// (`heads == 1`), or with the last batch dim (the heads, `heads` of them)
/// inside the rows, i.e. stored `[pre.., rows, heads, width]`.
#[derive(Debug, Clone, Copy)]
struct RowOrder {
    heads: usize,
    rows: usize,
    width: usize,
}

impl RowOrder {
    /// The order of a `[.., rows, width]` result of an operand whose layout
    /// is `layout`: heads inside the rows when the operand's last batch dim
    /// has a nonzero stride smaller than its row stride.
    fn of(layout: &Layout, g: &Geom, rows: usize, width: usize) -> Result<Self> {
        let nb = g.batch.len();
        let own = &layout.shape()[layout.ndim() - 2..];
        let l = layout.broadcast_to(&g.shape(own))?;
        let heads_inner = nb > 0 && {
            let (hs, rs) = (l.strides()[nb - 1], l.strides()[nb]);
            hs != 0 && hs.unsigned_abs() < rs.unsigned_abs() && g.batch[nb - 1] > 1
        };
        Ok(RowOrder {
            heads: if heads_inner { g.batch[nb - 1] } else { 1 },
            rows,
            width,
        })
    }

    /// The storage row of row `i` of matrix `b`.
    fn at(&self, b: usize, i: usize) -> usize {
        let (pre, h) = (b / self.heads, b % self.heads);
        (pre * self.rows + i) * self.heads + h
    }

    /// The rows of each of the `count` matrices over `data`, in row order.
    fn split<'a, T>(&self, data: &'a mut [T], count: usize) -> Vec<Vec<&'a mut [T]>> {
        let mut rows: Vec<Option<&mut [T]>> = data.chunks_mut(self.width).map(Some).collect();
        (0..count)
            .map(|b| {
                (0..self.rows)
                    .map(|i| {
                        rows[self.at(b, i)]
                            .take()
                            .expect("each row belongs to one matrix")
                    })
                    .collect()
            })
            .collect()
    }

    /// A new `[batch.., rows, width]` tensor stored in this order, whose
    /// rows `fill` writes (given [`RowOrder::split`]'s rows).
    fn build<T: Element>(
        &self,
        op: &'static str,
        g: &Geom,
        fill: impl FnOnce(Vec<Vec<&mut [T]>>),
    ) -> Result<Tensor> {
        let nb = g.batch.len();
        let mut stored = g.shape(&[self.rows, self.width]);
        if self.heads > 1 {
            stored.swap(nb - 1, nb);
        }
        let t = Tensor::build_overwrite::<T>(op, &stored, |data| fill(self.split(data, g.count())))?;
        if self.heads > 1 {
            t.transpose(nb as isize - 1, nb as isize)
        } else {
            Ok(t)
        }
    }
}

/// Writes the contiguous `rows × width` block `src` into `dst`'s rows.
fn write_rows<T: Copy>(dst: &mut [&mut [T]], src: &[T]) {
    let width = src.len() / dst.len().max(1);
    for (d, s) in dst.iter_mut().zip(src.chunks(width)) {
        d.copy_from_slice(s);
    }
}

/// The mask of one call, read where the scores are.
enum Mask<'a, T> {
    None,
    Causal,
    Additive(Operand<'a, T>),
    Keep(Operand<'a, bool>),
}

/// What every tile of one call reads.
struct Ctx<'a, T> {
    g: &'a Geom,
    q: Operand<'a, T>,
    k: Operand<'a, T>,
    v: Operand<'a, T>,
    mask: Mask<'a, T>,
    dropout: Option<SdpaDropout>,
    scale: T,
}

/// A tile of scores or weights: query rows `i0..` and key columns `j0..`
/// of matrix `b`, `cols` elements to a stored row; stored transposed (a
/// row per key, a column per query) when `keys_down`.
#[derive(Clone, Copy)]
struct Tile {
    b: usize,
    i0: usize,
    j0: usize,
    cols: usize,
    keys_down: bool,
}

impl Tile {
    /// The (query, key) of stored element `(r, c)`.
    #[inline]
    fn at(&self, r: usize, c: usize) -> (usize, usize) {
        if self.keys_down {
            (self.i0 + c, self.j0 + r)
        } else {
            (self.i0 + r, self.j0 + c)
        }
    }

    /// The stored columns of row `r` that the causal mask hides (a key
    /// after its query): a suffix of a query's row, a prefix of a key's.
    fn causal_hidden(&self, r: usize) -> std::ops::Range<usize> {
        if self.keys_down {
            0..(self.j0 + r).saturating_sub(self.i0).min(self.cols)
        } else {
            (self.i0 + r + 1).saturating_sub(self.j0).min(self.cols)..self.cols
        }
    }
}

impl<T: AttnMath> Ctx<'_, T> {
    /// Masks the scores `sc` of tile `t`.
    fn apply_mask(&self, t: Tile, sc: &mut [T]) {
        let neg_inf = <T as FloatMath>::NEG_INFINITY;
        for (r, row) in sc.chunks_mut(t.cols).enumerate() {
            match &self.mask {
                Mask::None => {}
                Mask::Causal => row[t.causal_hidden(r)].fill(neg_inf),
                Mask::Additive(m) => {
                    for (c, x) in row.iter_mut().enumerate() {
                        let (i, j) = t.at(r, c);
                        *x += *m.at(t.b, i, j);
                    }
                }
                Mask::Keep(m) => {
                    for (c, x) in row.iter_mut().enumerate() {
                        let (i, j) = t.at(r, c);
                        if !*m.at(t.b, i, j) {
                            *x = neg_inf;
                        }
                    }
                }
            }
        }
    }

    /// Scales each weight of tile `t` in `p` by the dropout factor where it
    /// is kept, zeroing the rest.
    fn apply_dropout(&self, d: &SdpaDropout, t: Tile, p: &mut [T]) {
        let keep_scale = T::of(d.scale());
        let g = self.g;
        for (r, row) in p.chunks_mut(t.cols).enumerate() {
            for (c, x) in row.iter_mut().enumerate() {
                let (i, j) = t.at(r, c);
                *x = if d.keeps(((t.b * g.l + i) * g.s + j) as u64) {
                    *x * keep_scale
                } else {
                    <T as FloatMath>::ZERO
                };
            }
        }
    }

    /// The key blocks query rows `i0..i1` see (all, or up to the causal edge).
    fn key_end(&self, i1: usize) -> usize {
        match self.mask {
            Mask::Causal => i1.min(self.g.s),
            _ => self.g.s,
        }
    }

    /// `c = alpha·a·b + beta·c` for `a` `m × k`, `b` `k × n` into `c` with
    /// row stride `rs`, on this thread.
    #[allow(clippy::too_many_arguments)]
    fn mm(
        &self,
        (m, n, k): (usize, usize, usize),
        alpha: T,
        a: MatRef<T>,
        b: MatRef<T>,
        beta: T,
        c: &mut [T],
        rs: usize,
    ) {
        let s = GemmShape { m, n, k, alpha, beta };
        let cm = MatMut {
            data: c,
            off: 0,
            rs: rs as isize,
            cs: 1,
        };
        gemm::<T>(s, a, b, cm, Epilogue::none(), Isa::best(), false);
    }

    /// Output rows `i0 .. i0 + rows.len()` of matrix `b` into `rows` and
    /// their log-sum-exp into `lse`.
    fn forward_tile(&self, b: usize, i0: usize, rows: &mut [&mut [T]], lse: &mut [T]) {
        let (g, br) = (self.g, lse.len());
        let mut acc = vec![<T as FloatMath>::ZERO; br * g.ev];
        let out = &mut acc[..];
        let kb = block(g.s);
        let mut sc = vec![<T as FloatMath>::ZERO; br * kb];
        let mut p = vec![<T as FloatMath>::ZERO; br * kb];
        let mut m = vec![<T as FloatMath>::NEG_INFINITY; br];
        let mut l = vec![<T as FloatMath>::ZERO; br];
        let end = self.key_end(i0 + br);
        for j0 in (0..end).step_by(kb) {
            let bc = kb.min(g.s - j0);
            let (sc, p) = (&mut sc[..br * bc], &mut p[..br * bc]);
            let qk = (br, bc, g.e);
            self.mm(
                qk,
                self.scale,
                self.q.rows(b, i0),
                self.k.rows(b, j0).t(),
                <T as FloatMath>::ZERO,
                sc,
                bc,
            );
            let tile = Tile {
                b,
                i0,
                j0,
                cols: bc,
                keys_down: false,
            };
            self.apply_mask(tile, sc);
            for r in 0..br {
                let (srow, prow) = (&sc[r * bc..(r + 1) * bc], &mut p[r * bc..(r + 1) * bc]);
                let m_new = m[r].max_nan(T::row_max(srow));
                if m_new == <T as FloatMath>::NEG_INFINITY {
                    // Nothing seen yet: this block adds nothing to the row.
                    prow.fill(<T as FloatMath>::ZERO);
                    continue;
                }
                T::exp_shift(srow, m_new, prow);
                let alpha = (m[r] - m_new).exp();
                l[r] = l[r] * alpha + T::row_sum(prow);
                if alpha != <T as FloatMath>::ONE {
                    out[r * g.ev..(r + 1) * g.ev]
                        .iter_mut()
                        .for_each(|o| *o = *o * alpha);
                }
                m[r] = m_new;
            }
            if let Some(d) = &self.dropout {
                self.apply_dropout(d, tile, p);
            }
            self.mm(
                (br, g.ev, bc),
                <T as FloatMath>::ONE,
                dense(p, bc),
                self.v.rows(b, j0),
                <T as FloatMath>::ONE,
                out,
                g.ev,
            );
        }
        for r in 0..br {
            // A row that saw no key has l = 0 and output 0/0 = NaN, as PyTorch.
            let inv = <T as FloatMath>::ONE / l[r];
            out[r * g.ev..(r + 1) * g.ev]
                .iter_mut()
                .for_each(|o| *o = *o * inv);
            lse[r] = m[r] + l[r].ln();
        }
        write_rows(rows, out);
    }
}

/// The tensor `t` in the math type `T`, on the CPU (a copy only when its
/// dtype differs).
fn in_math<T: AttnMath>(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(<T as Element>::DTYPE)
}

/// The context of one call on math-typed tensors.
fn context<'a, T: AttnMath>(
    g: &'a Geom,
    (q, k, v): (&'a Tensor, &'a Tensor, &'a Tensor),
    mask: Option<&'a Tensor>,
    args: &SdpaArgs<'_>,
) -> Result<Ctx<'a, T>> {
    let op = |t: &'a Tensor, rows: usize, cols: usize| {
        Operand::new(t.storage().as_slice::<T>(), t.layout(), g, rows, cols)
    };
    let mask = match (args.mask, mask) {
        (Some(SdpaMask::Keep(_)), Some(m)) => Mask::Keep(Operand::new(
            m.storage().as_slice::<bool>(),
            m.layout(),
            g,
            g.l,
            g.s,
        )?),
        (Some(SdpaMask::Additive(_)), Some(m)) => Mask::Additive(op(m, g.l, g.s)?),
        _ if args.is_causal => Mask::Causal,
        _ => Mask::None,
    };
    Ok(Ctx {
        g,
        q: op(q, g.l, g.e)?,
        k: op(k, g.s, g.e)?,
        v: op(v, g.s, g.ev)?,
        mask,
        dropout: args.dropout,
        scale: T::of(g.scale),
    })
}

/// The inputs of a call in its math type, and its mask (additive masks in
/// the math type, keep masks as they are).
struct MathInputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Option<Tensor>,
}

impl MathInputs {
    fn new<T: AttnMath>(q: &Tensor, k: &Tensor, v: &Tensor, args: &SdpaArgs<'_>) -> Result<Self> {
        let mask = match args.mask {
            Some(SdpaMask::Additive(m)) => Some(in_math::<T>(m)?),
            Some(SdpaMask::Keep(m)) => Some(m.clone()),
            None => None,
        };
        Ok(MathInputs {
            q: in_math::<T>(q)?,
            k: in_math::<T>(k)?,
            v: in_math::<T>(v)?,
            mask,
        })
    }
}

/// Runs `f` on each task, in parallel when the call does `flops`
/// multiply-adds or more.
fn run<I: Send>(tasks: Vec<I>, flops: usize, f: impl Fn(I) + Sync + Send) {
    if flops < PAR_FLOPS || tasks.len() < 2 {
        tasks.into_iter().for_each(f);
    } else {
        tasks.into_par_iter().for_each(f);
    }
}

/// The math type of a dtype's kernel: f64 for f64, f32 otherwise.
fn math_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// The CPU's [`Tensor::sdpa`] on checked operands.
pub(crate) fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Geom,
    args: &SdpaArgs<'_>,
) -> Result<SdpaOutput> {
    let (out, lse) = match math_dtype(q.dtype()) {
        DType::F64 => forward_typed::<f64>(q, k, v, g, args)?,
        _ => forward_typed::<f32>(q, k, v, g, args)?,
    };
    Ok(SdpaOutput {
        out: out.to_dtype(q.dtype())?,
        lse,
    })
}

fn forward_typed<T: AttnMath>(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Geom,
    args: &SdpaArgs<'_>,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "scaled_dot_product_attention";
    let x = MathInputs::new::<T>(q, k, v, args)?;
    let ctx = context::<T>(g, (&x.q, &x.k, &x.v), x.mask.as_ref(), args)?;
    let flops = g.count() * g.l * g.s * (g.e + g.ev);
    let order = RowOrder::of(q.layout(), g, g.l, g.ev)?;
    let mut lse_t = None;
    let out = order.build::<T>(OP, g, |out_rows| {
        lse_t = Some(Tensor::build_overwrite::<T>(OP, &g.shape(&[g.l]), |lse| {
            let mut out_rows = out_rows;
            let mut tasks = Vec::new();
            for (b, (rows, ls)) in out_rows.iter_mut().zip(lse.chunks_mut(g.l)).enumerate() {
                let mut rest = &mut rows[..];
                let qb = block(g.l);
                for (qi, lb) in ls.chunks_mut(qb).enumerate() {
                    let (tile, tail) = rest.split_at_mut(lb.len());
                    rest = tail;
                    tasks.push((b, qi * qb, tile, lb));
                }
            }
            run(tasks, flops, |(b, i0, tile, lb)| {
                ctx.forward_tile(b, i0, tile, lb)
            });
        }));
    })?;
    let lse = lse_t.expect("the output's fill ran")?;
    Ok((out, lse))
}

impl<T: AttnMath> Ctx<'_, T> {
    /// The gradients of matrix `b` from the output gradient `d_o`, the
    /// output `o` and the forward's `lse` of its rows, into the rows of dQ
    /// (L), dK (S) and dV (S), and the mask gradient `[L, S]` when asked.
    ///
    /// Tiles are worked transposed, a row per key: then Pᵀ and dSᵀ are
    /// row-major left operands, and dV += Pᵀ·dO and dK += dSᵀ·Q run on the
    /// direct kernels, reading their operands in place instead of packing
    /// them (only Sᵀ, dPᵀ and dQ pack). The softmax scale is folded into dS
    /// so those products have alpha 1, as the direct kernels require.
    #[allow(clippy::too_many_arguments)]
    fn backward_head(
        &self,
        b: usize,
        (d_o, o): (&Operand<'_, T>, &Operand<'_, T>),
        lse: &[T],
        dq: &mut [&mut [T]],
        dk: &mut [&mut [T]],
        dv: &mut [&mut [T]],
        mut dmask: Option<&mut [T]>,
    ) {
        let g = self.g;
        let zero = <T as FloatMath>::ZERO;
        let one = <T as FloatMath>::ONE;
        let (q, k, v, o) = (
            self.q.rows(b, 0),
            self.k.rows(b, 0),
            self.v.rows(b, 0),
            o.rows(b, 0),
        );
        // The direct kernels read rows with unit columns; a broadcast output
        // gradient (a sum's) is gathered into such rows once per head.
        let gathered: Vec<T>;
        let d_o = match d_o.rows(b, 0) {
            m if m.cs == 1 => m,
            m => {
                gathered = gather_rows(m, g.l, g.ev);
                dense(&gathered, g.ev)
            }
        };
        // δ_i = Σ_c dO_ic·O_ic: the row sums of P∘dP (FlashAttention-2).
        let delta: Vec<T> = (0..g.l)
            .map(|i| match (row(d_o, i, g.ev), row(o, i, g.ev)) {
                (Some(a), Some(c)) => T::dot(a, c),
                _ => (0..g.ev).fold(zero, |acc, c| acc + d_o.data[d_o.at(i, c)] * o.data[o.at(i, c)]),
            })
            .collect();
        let (mut dq_h, mut dk_h, mut dv_h) = (
            vec![zero; g.l * g.e],
            vec![zero; g.s * g.e],
            vec![zero; g.s * g.ev],
        );
        let (qb, kb) = (block(g.l), block(g.s));
        let mut pt = vec![zero; kb * qb];
        let mut st = vec![zero; kb * qb];
        let mut dropped = vec![zero; if self.dropout.is_some() { kb * qb } else { 0 }];
        // The mask gradient is dS itself, so the scale is applied after it.
        let ds_scale = if dmask.is_some() { one } else { self.scale };
        let causal = matches!(self.mask, Mask::Causal);
        for j0 in (0..g.s).step_by(kb) {
            let bc = kb.min(g.s - j0);
            let dk_j = &mut dk_h[j0 * g.e..(j0 + bc) * g.e];
            let dv_j = &mut dv_h[j0 * g.ev..(j0 + bc) * g.ev];
            // Under the causal mask, query rows before j0 see no key here.
            let first = if causal { j0 } else { 0 };
            for i0 in (first..g.l).step_by(qb) {
                let br = qb.min(g.l - i0);
                let tile = Tile {
                    b,
                    i0,
                    j0,
                    cols: br,
                    keys_down: true,
                };
                let (pt, st) = (&mut pt[..bc * br], &mut st[..bc * br]);
                let (q_i, k_j, v_j, do_i) = (
                    from_row(q, i0),
                    from_row(k, j0),
                    from_row(v, j0),
                    from_row(d_o, i0),
                );
                // Sᵀ = scale·K_j·Q_iᵀ, Pᵀ = exp(Sᵀ − lse) column by column.
                self.mm((bc, br, g.e), self.scale, k_j, q_i.t(), zero, st, br);
                self.apply_mask(tile, st);
                let lse_i = &lse[i0..i0 + br];
                for (s_row, p_row) in st.chunks(br).zip(pt.chunks_mut(br)) {
                    T::exp_sub(s_row, lse_i, p_row);
                }
                let pdt: &[T] = match &self.dropout {
                    Some(d) => {
                        let dropped = &mut dropped[..bc * br];
                        dropped.copy_from_slice(pt);
                        self.apply_dropout(d, tile, dropped);
                        dropped
                    }
                    None => pt,
                };
                // dV_j += Pdᵀ·dO_i
                self.mm((bc, g.ev, br), one, dense(pdt, br), do_i, one, dv_j, g.ev);
                // dPᵀ = V_j·dO_iᵀ (through the dropout mask), dSᵀ = Pᵀ∘(dPᵀ − δ).
                self.mm((bc, br, g.ev), one, v_j, do_i.t(), zero, st, br);
                if let Some(d) = &self.dropout {
                    self.apply_dropout(d, tile, st);
                }
                let delta_i = &delta[i0..i0 + br];
                for (p_row, ds_row) in pt.chunks(br).zip(st.chunks_mut(br)) {
                    T::attention_grad(p_row, delta_i, ds_scale, ds_row);
                }
                if let Some(dm) = dmask.as_deref_mut() {
                    for (r, ds_row) in st.chunks_mut(br).enumerate() {
                        for (c, x) in ds_row.iter_mut().enumerate() {
                            let (i, j) = tile.at(r, c);
                            dm[i * g.s + j] = *x;
                            *x = *x * self.scale;
                        }
                    }
                }
                // dK_j += scale·dSᵀ·Q_i, dQ_i += scale·dS·K_j (scale in dS)
                let dst = dense(st, br);
                self.mm((bc, g.e, br), one, dst, q_i, one, dk_j, g.e);
                let dq_i = &mut dq_h[i0 * g.e..(i0 + br) * g.e];
                self.mm((br, g.e, bc), one, dst.t(), k_j, one, dq_i, g.e);
            }
        }
        write_rows(dq, &dq_h);
        write_rows(dk, &dk_h);
        write_rows(dv, &dv_h);
    }
}

/// The row-major matrix of `width`-element rows over `data`.
fn dense<T>(data: &[T], width: usize) -> MatRef<'_, T> {
    MatRef {
        data,
        off: 0,
        rs: width as isize,
        cs: 1,
    }
}

/// Rows `i0..` of `m`.
fn from_row<T>(m: MatRef<'_, T>, i0: usize) -> MatRef<'_, T> {
    MatRef {
        off: m.at(i0, 0),
        ..m
    }
}

/// The `rows × width` matrix `m` copied into rows with unit columns (a
/// broadcast row, column stride 0, is one value filled).
fn gather_rows<T: Copy>(m: MatRef<'_, T>, rows: usize, width: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(rows * width);
    for i in 0..rows {
        if m.cs == 0 {
            out.extend(std::iter::repeat_n(m.data[m.at(i, 0)], width));
        } else {
            out.extend((0..width).map(|c| m.data[m.at(i, c)]));
        }
    }
    out
}

/// Row `i` of `m` as a slice of `width` elements, when its columns are
/// adjacent.
fn row<'a, T>(m: MatRef<'a, T>, i: usize, width: usize) -> Option<&'a [T]> {
    (m.cs == 1).then(|| &m.data[m.at(i, 0)..][..width])
}

/// The CPU's [`Tensor::sdpa_backward`] on checked operands.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    fwd: &SdpaOutput,
    g: &Geom,
    args: &SdpaArgs<'_>,
    mask_grad: bool,
) -> Result<SdpaGrads> {
    let grads = match math_dtype(q.dtype()) {
        DType::F64 => backward_typed::<f64>(dout, q, k, v, fwd, g, args, mask_grad)?,
        _ => backward_typed::<f32>(dout, q, k, v, fwd, g, args, mask_grad)?,
    };
    let mask_dtype = match args.mask {
        Some(SdpaMask::Additive(m)) => m.dtype(),
        _ => q.dtype(),
    };
    Ok(SdpaGrads {
        dq: grads.dq.to_dtype(q.dtype())?,
        dk: grads.dk.to_dtype(q.dtype())?,
        dv: grads.dv.to_dtype(q.dtype())?,
        dmask: grads.dmask.map(|m| m.to_dtype(mask_dtype)).transpose()?,
    })
}

#[allow(clippy::too_many_arguments)]
fn backward_typed<T: AttnMath>(
    dout: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    fwd: &SdpaOutput,
    g: &Geom,
    args: &SdpaArgs<'_>,
    mask_grad: bool,
) -> Result<SdpaGrads> {
    const OP: &str = "scaled_dot_product_attention_backward";
    let x = MathInputs::new::<T>(q, k, v, args)?;
    let ctx = context::<T>(g, (&x.q, &x.k, &x.v), x.mask.as_ref(), args)?;
    let (d_o, o) = (in_math::<T>(dout)?, in_math::<T>(&fwd.out)?);
    let d_o = Operand::new(d_o.storage().as_slice::<T>(), d_o.layout(), g, g.l, g.ev)?;
    let o = Operand::new(o.storage().as_slice::<T>(), o.layout(), g, g.l, g.ev)?;
    let lse = in_math::<T>(&fwd.lse)?.contiguous()?;
    let lse = lse.as_slice::<T>()?;
    let flops = 2 * g.count() * g.l * g.s * (g.e + g.ev);
    let mut dmask = mask_grad.then(|| vec![<T as FloatMath>::ZERO; g.count() * g.l * g.s]);
    let (oq, ok, ov) = (
        RowOrder::of(q.layout(), g, g.l, g.e)?,
        RowOrder::of(k.layout(), g, g.s, g.e)?,
        RowOrder::of(v.layout(), g, g.s, g.ev)?,
    );
    let (mut dk_t, mut dv_t) = (None, None);
    let dq = oq.build::<T>(OP, g, |mut dq| {
        dk_t = Some(ok.build::<T>(OP, g, |mut dk| {
            dv_t = Some(ov.build::<T>(OP, g, |mut dv| {
                let dmask_chunks: Vec<Option<&mut [T]>> = match dmask.as_mut() {
                    Some(m) => m.chunks_mut(g.l * g.s).map(Some).collect(),
                    None => (0..g.count()).map(|_| None).collect(),
                };
                let tasks: Vec<_> = dq
                    .iter_mut()
                    .zip(dk.iter_mut())
                    .zip(dv.iter_mut())
                    .zip(dmask_chunks)
                    .enumerate()
                    .collect();
                run(tasks, flops, |(b, (((dq, dk), dv), dmask))| {
                    let rows = b * g.l..(b + 1) * g.l;
                    ctx.backward_head(b, (&d_o, &o), &lse[rows], dq, dk, dv, dmask);
                });
            }));
        }));
    })?;
    Ok(SdpaGrads {
        dq,
        dk: dk_t.expect("the fill ran")?,
        dv: dv_t.expect("the fill ran")?,
        dmask: dmask
            .map(|m| Tensor::from_vec(m, &g.shape(&[g.l, g.s])))
            .transpose()?,
    })
}
