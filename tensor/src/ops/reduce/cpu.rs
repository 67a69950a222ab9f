//! The CPU reduce engine: an output index space (the kept dims) times a
//! reduced index space (the reduced dims, row-major) over arbitrary strides,
//! and the reducers (accumulators) the public reductions plug into it.
//!
//! Determinism: every output is computed the same way whatever the thread
//! count. Its reduced range is cut into fixed chunks of [`RCHUNK`] elements,
//! each chunk is folded in order, and the chunk partials are merged by a fixed
//! binary tree. Threads only decide which outputs or chunks run where.

use rayon::prelude::*;

use crate::strided::PAR_THRESHOLD;
use crate::{dim_indices, Element, FloatElement, FloatMath, Layout, Result};

/// Reduced elements per chunk: the unit of parallel work when there are few
/// outputs, and the leaves of the merge tree.
pub(crate) const RCHUNK: usize = 1 << 13;

/// How one reduction walks its input: which dims are kept, which reduced,
/// and the output shapes.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The output shape (reduced dims removed, or kept as 1 with keepdim).
    pub out_shape: Vec<usize>,
    /// Number of outputs.
    pub n_out: usize,
    /// Number of reduced elements per output.
    pub n_red: usize,
    /// Kept dims (size, stride), row-major order, size-1 dims dropped.
    keep: Vec<(usize, isize)>,
    /// Reduced dims (size, stride), row-major order, coalesced.
    red: Vec<(usize, isize)>,
    offset: usize,
}

impl Plan {
    /// The plan reducing `layout` over `dims` (empty = all dims; negative
    /// dims count from the end). A 0-d tensor accepts dim 0 / -1 like
    /// PyTorch. Errors on out-of-range or repeated dims.
    pub fn new(op: &'static str, layout: &Layout, dims: &[isize], keepdim: bool) -> Result<Plan> {
        let nd = layout.ndim();
        let reduced: Vec<bool> = if nd == 0 {
            dim_indices(op, dims, 1)?;
            Vec::new()
        } else if dims.is_empty() {
            vec![true; nd]
        } else {
            let mut r = vec![false; nd];
            for d in dim_indices(op, dims, nd)? {
                r[d] = true;
            }
            r
        };
        let (shape, strides) = (layout.shape(), layout.strides());
        let mut out_shape = Vec::with_capacity(nd);
        let mut keep = Vec::new();
        let mut red: Vec<(usize, isize)> = Vec::new();
        let mut n_red = 1usize;
        for d in 0..nd {
            let (n, s) = (shape[d], strides[d]);
            if reduced[d] {
                n_red *= n;
                if keepdim {
                    out_shape.push(1);
                }
                if n == 1 {
                    continue;
                }
                match red.last_mut() {
                    Some(last) if last.1 == s * n as isize => *last = (last.0 * n, s),
                    _ => red.push((n, s)),
                }
            } else {
                out_shape.push(n);
                if n != 1 {
                    keep.push((n, s));
                }
            }
        }
        Ok(Plan {
            n_out: out_shape.iter().product(),
            out_shape,
            n_red,
            keep,
            red,
            offset: layout.offset(),
        })
    }

    /// `(cols, rows, row_stride, offset)` when the plan sums the rows of a
    /// block: one kept dim of unit stride (the columns) and one reduced dim
    /// after coalescing, with a non-negative stride (the rows); else `None`.
    pub(crate) fn as_columns(&self) -> Option<(usize, usize, usize, usize)> {
        match (self.keep.as_slice(), self.red.as_slice()) {
            ([(cols, 1)], [(rows, stride)]) if *stride >= 0 => {
                Some((*cols, *rows, *stride as usize, self.offset))
            }
            _ => None,
        }
    }

    /// Storage index of the first reduced element of output `o`.
    fn base(&self, mut o: usize) -> isize {
        let mut off = self.offset as isize;
        for &(n, s) in self.keep.iter().rev() {
            off += (o % n) as isize * s;
            o /= n;
        }
        off
    }

    /// Calls `f(pos, off, stride, len)` for the row segments covering the
    /// reduced positions `lo .. hi` of the output whose base is `base`.
    fn walk(&self, base: isize, lo: usize, hi: usize, mut f: impl FnMut(usize, usize, isize, usize)) {
        if lo >= hi {
            return;
        }
        let nd = self.red.len();
        if nd == 0 {
            f(lo, base as usize, 0, hi - lo);
            return;
        }
        let (inner, inner_stride) = self.red[nd - 1];
        let mut idx = vec![0usize; nd];
        let mut rem = lo;
        let mut pos = base;
        for d in (0..nd).rev() {
            idx[d] = rem % self.red[d].0;
            rem /= self.red[d].0;
            pos += idx[d] as isize * self.red[d].1;
        }
        let mut at = lo;
        while at < hi {
            let len = (inner - idx[nd - 1]).min(hi - at);
            f(at, pos as usize, inner_stride, len);
            at += len;
            pos += len as isize * inner_stride;
            idx[nd - 1] += len;
            let mut d = nd - 1;
            while d > 0 && idx[d] == self.red[d].0 {
                pos += self.red[d - 1].1 - self.red[d].0 as isize * self.red[d].1;
                idx[d] = 0;
                idx[d - 1] += 1;
                d -= 1;
            }
        }
    }
}

/// An accumulator for the reduce engine.
pub(crate) trait Reducer<T>: Sync {
    /// The running state.
    type Acc: Copy + Send + Sync;
    /// The state of an empty reduction.
    fn init(&self) -> Self::Acc;
    /// Folds the `len` elements `src[off + i·stride]`, whose reduced
    /// positions start at `pos`, into `acc`.
    fn fold(&self, acc: &mut Self::Acc, src: &[T], off: usize, stride: isize, len: usize, pos: usize);
    /// Combines two states, `a` covering positions before `b`'s.
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

/// Runs `r` for every output of `plan` over the storage slice `src` and
/// returns one final state per output (row-major over the output shape).
pub(crate) fn reduce<T: Sync, R: Reducer<T>>(src: &[T], plan: &Plan, r: &R) -> Vec<R::Acc> {
    let nch = plan.n_red.div_ceil(RCHUNK);
    let chunk = |base: isize, c: usize| {
        let mut acc = r.init();
        let lo = c * RCHUNK;
        plan.walk(base, lo, (lo + RCHUNK).min(plan.n_red), |pos, off, st, len| {
            r.fold(&mut acc, src, off, st, len, pos)
        });
        acc
    };
    let one = |o: usize| {
        let base = plan.base(o);
        tree(r, 0, nch, &|c| chunk(base, c))
    };
    let work = plan.n_out.saturating_mul(plan.n_red);
    if work <= PAR_THRESHOLD {
        (0..plan.n_out).map(one).collect()
    } else if plan.n_out >= 4 * rayon::current_num_threads() || nch <= 1 {
        (0..plan.n_out).into_par_iter().map(one).collect()
    } else {
        let parts: Vec<R::Acc> = (0..plan.n_out * nch)
            .into_par_iter()
            .map(|k| chunk(plan.base(k / nch), k % nch))
            .collect();
        (0..plan.n_out)
            .map(|o| tree(r, 0, nch, &|c| parts[o * nch + c]))
            .collect()
    }
}

/// Merges the partials `leaf(lo) .. leaf(hi)` by a fixed binary tree.
fn tree<T, R: Reducer<T>>(r: &R, lo: usize, hi: usize, leaf: &impl Fn(usize) -> R::Acc) -> R::Acc {
    match hi - lo {
        0 => r.init(),
        1 => leaf(lo),
        n => {
            let mid = lo + n / 2;
            r.merge(tree(r, lo, mid, leaf), tree(r, mid, hi, leaf))
        }
    }
}

/// Σ get(i) for i < n by pairwise summation over blocks of 8 lanes: error
/// grows with log n rather than n.
#[inline]
pub(crate) fn pairwise<M: FloatMath>(n: usize, get: &impl Fn(usize) -> M) -> M {
    pairwise_lanes::<M, 1>(&|i| [get(i)], 0, n)[0]
}

/// [`pairwise`] of `W` independent sums at once (`get(i)` gives element
/// `i` of each): every lane is summed exactly as [`pairwise`] sums one, so
/// column sums read a row per step and keep its bits.
pub(crate) fn pairwise_lanes<M: FloatMath, const W: usize>(
    get: &impl Fn(usize) -> [M; W],
    lo: usize,
    n: usize,
) -> [M; W] {
    if n <= 128 {
        let mut lanes = [[M::ZERO; W]; 8];
        let full = n / 8 * 8;
        let mut i = 0;
        while i < full {
            for (k, lane) in lanes.iter_mut().enumerate() {
                let row = get(lo + i + k);
                for j in 0..W {
                    lane[j] += row[j];
                }
            }
            i += 8;
        }
        let mut s: [M; W] = std::array::from_fn(|j| {
            let l = |k: usize| lanes[k][j];
            ((l(0) + l(1)) + (l(2) + l(3))) + ((l(4) + l(5)) + (l(6) + l(7)))
        });
        for k in full..n {
            let row = get(lo + k);
            for j in 0..W {
                s[j] += row[j];
            }
        }
        s
    } else {
        let half = n / 2 / 8 * 8;
        let (a, b) = (
            pairwise_lanes::<M, W>(get, lo, half),
            pairwise_lanes::<M, W>(get, lo + half, n - half),
        );
        std::array::from_fn(|j| a[j] + b[j])
    }
}

/// Σ f(x) over one row segment, pairwise, in the math type.
#[inline]
pub(crate) fn row_sum<T: FloatElement>(
    src: &[T],
    off: usize,
    stride: isize,
    len: usize,
    f: impl Fn(T::Math) -> T::Math,
) -> T::Math {
    if stride == 1 {
        let row = &src[off..off + len];
        pairwise(len, &|i| f(row[i].to_math()))
    } else {
        pairwise(len, &|i| {
            f(src[(off as isize + i as isize * stride) as usize].to_math())
        })
    }
}

/// Calls `g(i, x)` for each element of one row segment.
#[inline]
pub(crate) fn row_each<T: Copy>(src: &[T], off: usize, stride: isize, len: usize, g: impl FnMut(usize, T)) {
    crate::strided::read_row(src, off, stride, len, g)
}

/// Float sum (and mean, norms with `f`): pairwise in the math type.
pub(crate) struct FloatSum<F>(pub F);

impl<T: FloatElement, F: Fn(T::Math) -> T::Math + Sync> Reducer<T> for FloatSum<F> {
    type Acc = T::Math;
    fn init(&self) -> T::Math {
        T::Math::ZERO
    }
    fn fold(&self, acc: &mut T::Math, src: &[T], off: usize, stride: isize, len: usize, _: usize) {
        *acc += row_sum(src, off, stride, len, &self.0);
    }
    fn merge(&self, a: T::Math, b: T::Math) -> T::Math {
        a + b
    }
}

/// Integer and bool sum (or product) in i64, wrapping like PyTorch.
pub(crate) struct IntFold {
    /// Product instead of sum.
    pub prod: bool,
}

impl<T: Element> Reducer<T> for IntFold {
    type Acc = i64;
    fn init(&self) -> i64 {
        self.prod as i64
    }
    fn fold(&self, acc: &mut i64, src: &[T], off: usize, stride: isize, len: usize, _: usize) {
        let prod = self.prod;
        row_each(src, off, stride, len, |_, x| {
            *acc = if prod {
                acc.wrapping_mul(x.to_i64())
            } else {
                acc.wrapping_add(x.to_i64())
            }
        });
    }
    fn merge(&self, a: i64, b: i64) -> i64 {
        if self.prod {
            a.wrapping_mul(b)
        } else {
            a.wrapping_add(b)
        }
    }
}

/// Float product in the math type.
pub(crate) struct FloatProd;

impl<T: FloatElement> Reducer<T> for FloatProd {
    type Acc = T::Math;
    fn init(&self) -> T::Math {
        T::Math::ONE
    }
    fn fold(&self, acc: &mut T::Math, src: &[T], off: usize, stride: isize, len: usize, _: usize) {
        row_each(src, off, stride, len, |_, x| *acc = *acc * x.to_math());
    }
    fn merge(&self, a: T::Math, b: T::Math) -> T::Math {
        a * b
    }
}

/// The extreme value and the position of its first occurrence (max or min);
/// NaN wins over everything and the first NaN is kept, like PyTorch.
pub(crate) struct Extreme {
    /// Maximum instead of minimum.
    pub max: bool,
}

impl Extreme {
    #[inline(always)]
    fn better<T: PartialOrd>(&self, cand: T, best: T) -> bool {
        #[allow(clippy::eq_op)]
        let (cand_nan, best_nan) = (cand != cand, best != best);
        if best_nan {
            false
        } else if cand_nan {
            true
        } else if self.max {
            cand > best
        } else {
            cand < best
        }
    }
}

impl<T: Element> Reducer<T> for Extreme {
    type Acc = Option<(T, usize)>;
    fn init(&self) -> Self::Acc {
        None
    }
    fn fold(&self, acc: &mut Self::Acc, src: &[T], off: usize, stride: isize, len: usize, pos: usize) {
        let mut best = acc.unwrap_or((src[off], pos));
        row_each(src, off, stride, len, |i, x| {
            if self.better(x, best.0) {
                best = (x, pos + i);
            }
        });
        *acc = Some(best);
    }
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc {
        match (a, b) {
            (Some(x), Some(y)) if self.better(y.0, x.0) => b,
            (None, _) => b,
            _ => a,
        }
    }
}

/// Count, mean and sum of squared deviations, in f64: each row segment is
/// summarised by two passes and segments merge by Chan's formula.
pub(crate) struct Moments;

/// The state of [`Moments`]: (count, mean, m2).
pub(crate) type MomentsAcc = (f64, f64, f64);

impl<T: Element> Reducer<T> for Moments {
    type Acc = MomentsAcc;
    fn init(&self) -> MomentsAcc {
        (0.0, 0.0, 0.0)
    }
    fn fold(&self, acc: &mut MomentsAcc, src: &[T], off: usize, stride: isize, len: usize, _: usize) {
        let at = |i: usize| src[(off as isize + i as isize * stride) as usize].to_f64();
        let mean = pairwise(len, &at) / len as f64;
        let m2 = pairwise(len, &|i| {
            let d = at(i) - mean;
            d * d
        });
        *acc = <Moments as Reducer<T>>::merge(self, *acc, (len as f64, mean, m2));
    }
    fn merge(&self, a: MomentsAcc, b: MomentsAcc) -> MomentsAcc {
        merge_moments(a, b)
    }
}

/// Chan's parallel combination of two (count, mean, m2) summaries.
pub(crate) fn merge_moments(a: MomentsAcc, b: MomentsAcc) -> MomentsAcc {
    if a.0 == 0.0 {
        return b;
    }
    if b.0 == 0.0 {
        return a;
    }
    let n = a.0 + b.0;
    let d = b.1 - a.1;
    (n, a.1 + d * (b.0 / n), a.2 + b.2 + d * d * (a.0 * b.0 / n))
}

/// Stable log-sum-exp: the state is (running max, Σ exp(x − max)).
pub(crate) struct LogSumExp;

impl LogSumExp {
    fn combine<M: FloatMath>(a: (M, M), b: (M, M)) -> (M, M) {
        if a.0.is_nan() || b.0.is_nan() {
            return (M::of(f64::NAN), M::ONE);
        }
        let m = if a.0 >= b.0 { a.0 } else { b.0 };
        if m == M::INFINITY || m == M::NEG_INFINITY {
            return (m, M::ONE);
        }
        let scale = |x: (M, M)| {
            if x.0 == M::NEG_INFINITY {
                M::ZERO
            } else {
                x.1 * (x.0 - m).exp()
            }
        };
        (m, scale(a) + scale(b))
    }

    /// The final value of a state.
    pub fn finish<M: FloatMath>(acc: (M, M)) -> M {
        if acc.0.is_nan() || acc.0 == M::INFINITY || acc.0 == M::NEG_INFINITY {
            acc.0
        } else {
            acc.0 + acc.1.ln()
        }
    }
}

impl<T: FloatElement> Reducer<T> for LogSumExp {
    type Acc = (T::Math, T::Math);
    fn init(&self) -> Self::Acc {
        (T::Math::NEG_INFINITY, T::Math::ZERO)
    }
    fn fold(&self, acc: &mut Self::Acc, src: &[T], off: usize, stride: isize, len: usize, _: usize) {
        let mut m = T::Math::NEG_INFINITY;
        row_each(src, off, stride, len, |_, x| m = m.max_nan(x.to_math()));
        let s = if m.is_nan() || m == T::Math::INFINITY || m == T::Math::NEG_INFINITY {
            T::Math::ONE
        } else {
            row_sum(src, off, stride, len, |x| (x - m).exp())
        };
        *acc = Self::combine(*acc, (m, s));
    }
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc {
        Self::combine(a, b)
    }
}

/// Max (or min) of |x| in the math type, NaN propagating: the ∞-norms.
pub(crate) struct AbsExtreme {
    /// Maximum instead of minimum.
    pub max: bool,
}

impl<T: FloatElement> Reducer<T> for AbsExtreme {
    type Acc = T::Math;
    fn init(&self) -> T::Math {
        if self.max {
            T::Math::ZERO
        } else {
            T::Math::INFINITY
        }
    }
    fn fold(&self, acc: &mut T::Math, src: &[T], off: usize, stride: isize, len: usize, _: usize) {
        let max = self.max;
        row_each(src, off, stride, len, |_, x| {
            let a = x.to_math().abs();
            *acc = if max { acc.max_nan(a) } else { acc.min_nan(a) };
        });
    }
    fn merge(&self, a: T::Math, b: T::Math) -> T::Math {
        if self.max {
            a.max_nan(b)
        } else {
            a.min_nan(b)
        }
    }
}

/// all (every element non-zero) or any (some element non-zero).
pub(crate) struct Truth {
    /// `all` instead of `any`.
    pub all: bool,
}

impl<T: Element> Reducer<T> for Truth {
    type Acc = bool;
    fn init(&self) -> bool {
        self.all
    }
    fn fold(&self, acc: &mut bool, src: &[T], off: usize, stride: isize, len: usize, _: usize) {
        let all = self.all;
        row_each(src, off, stride, len, |_, x| {
            let nz = x != T::ZERO;
            *acc = if all { *acc && nz } else { *acc || nz };
        });
    }
    fn merge(&self, a: bool, b: bool) -> bool {
        if self.all {
            a && b
        } else {
            a || b
        }
    }
}
