//! Payload element types, reduce operators and the reduction kernels.

use tessera_tensor::{bf16, f16, DType, Element};

/// A reduction operator of `all_reduce`, `reduce_scatter` and `reduce`
/// (NCCL's `ncclRedOp_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Elementwise sum (integers wrap on overflow).
    Sum,
    /// Elementwise product (integers wrap on overflow).
    Prod,
    /// Elementwise maximum; a NaN anywhere gives NaN.
    Max,
    /// Elementwise minimum; a NaN anywhere gives NaN.
    Min,
    /// The sum divided by the group size once, after the reduction
    /// (NCCL's `ncclAvg` post-op; integers divide truncating toward zero).
    /// DDP instead pre-divides and sums: the two agree bitwise only when the
    /// group size is a power of two.
    Avg,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// The wire code of the operator.
    pub(crate) fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
        }
    }
}

/// A payload element type that collectives carry: f32, f64, f16, bf16 and
/// i64. f16 and bf16 reduce in f32 and round back after every step, as the
/// partial results travel in the payload dtype.
pub trait CommElement: Element + bytemuck::Pod {
    /// `a ⊕ b` under `op` (`Avg` adds; the division is [`CommElement::div_count`]).
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
    /// `x / n`, the post-op of [`ReduceOp::Avg`].
    fn div_count(x: Self, n: usize) -> Self;
    /// The slice as a dtype-tagged buffer.
    fn buf(s: &[Self]) -> Buf<'_>;
    /// The slice as a dtype-tagged mutable buffer.
    fn buf_mut(s: &mut [Self]) -> BufMut<'_>;
    /// The typed slice inside `b`, when `b` holds this type.
    fn unbuf(b: Buf<'_>) -> Option<&[Self]>;
}

#[inline(always)]
fn max_nan<T: PartialOrd + Copy>(a: T, b: T) -> T {
    // `a != a` is the NaN test that works for every float type.
    #[allow(clippy::eq_op)]
    let a_nan = a != a;
    if a_nan || a > b {
        a
    } else {
        b
    }
}

#[inline(always)]
fn min_nan<T: PartialOrd + Copy>(a: T, b: T) -> T {
    #[allow(clippy::eq_op)]
    let a_nan = a != a;
    if a_nan || a < b {
        a
    } else {
        b
    }
}

macro_rules! native_float {
    ($t:ty, $variant:ident) => {
        impl CommElement for $t {
            #[inline(always)]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Max => max_nan(a, b),
                    ReduceOp::Min => min_nan(a, b),
                }
            }
            #[inline(always)]
            fn div_count(x: Self, n: usize) -> Self {
                x / n as $t
            }
            fn buf(s: &[Self]) -> Buf<'_> {
                Buf::$variant(s)
            }
            fn buf_mut(s: &mut [Self]) -> BufMut<'_> {
                BufMut::$variant(s)
            }
            fn unbuf(b: Buf<'_>) -> Option<&[Self]> {
                match b {
                    Buf::$variant(s) => Some(s),
                    _ => None,
                }
            }
        }
    };
}
native_float!(f32, F32);
native_float!(f64, F64);

macro_rules! half_float {
    ($t:ty, $variant:ident) => {
        impl CommElement for $t {
            #[inline(always)]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                <$t>::from_f32(f32::combine(a.to_f32(), b.to_f32(), op))
            }
            #[inline(always)]
            fn div_count(x: Self, n: usize) -> Self {
                <$t>::from_f32(x.to_f32() / n as f32)
            }
            fn buf(s: &[Self]) -> Buf<'_> {
                Buf::$variant(s)
            }
            fn buf_mut(s: &mut [Self]) -> BufMut<'_> {
                BufMut::$variant(s)
            }
            fn unbuf(b: Buf<'_>) -> Option<&[Self]> {
                match b {
                    Buf::$variant(s) => Some(s),
                    _ => None,
                }
            }
        }
    };
}
half_float!(f16, F16);
half_float!(bf16, BF16);

impl CommElement for i64 {
    #[inline(always)]
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
            ReduceOp::Prod => a.wrapping_mul(b),
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
        }
    }
    #[inline(always)]
    fn div_count(x: Self, n: usize) -> Self {
        x / n as i64
    }
    fn buf(s: &[Self]) -> Buf<'_> {
        Buf::I64(s)
    }
    fn buf_mut(s: &mut [Self]) -> BufMut<'_> {
        BufMut::I64(s)
    }
    fn unbuf(b: Buf<'_>) -> Option<&[Self]> {
        match b {
            Buf::I64(s) => Some(s),
            _ => None,
        }
    }
}

/// A read-only payload: a typed slice tagged with its dtype, so that the
/// object-safe [`crate::Communicator`] methods take every payload type.
#[derive(Debug)]
pub enum Buf<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f64 elements.
    F64(&'a [f64]),
    /// f16 elements.
    F16(&'a [f16]),
    /// bf16 elements.
    BF16(&'a [bf16]),
    /// i64 elements.
    I64(&'a [i64]),
}

/// A writable payload: a typed mutable slice tagged with its dtype.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// f64 elements.
    F64(&'a mut [f64]),
    /// f16 elements.
    F16(&'a mut [f16]),
    /// bf16 elements.
    BF16(&'a mut [bf16]),
    /// i64 elements.
    I64(&'a mut [i64]),
}

/// Runs `$body` with `$s` bound to the typed slice inside a [`Buf`] or
/// [`BufMut`] (`$T` names its element type).
#[macro_export]
macro_rules! with_buf {
    ($buf:expr, $kind:ident, $s:ident, $T:ident => $body:expr) => {
        match $buf {
            $crate::$kind::F32($s) => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
            $crate::$kind::F64($s) => {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }
            $crate::$kind::F16($s) => {
                #[allow(dead_code)]
                type $T = $crate::f16;
                $body
            }
            $crate::$kind::BF16($s) => {
                #[allow(dead_code)]
                type $T = $crate::bf16;
                $body
            }
            $crate::$kind::I64($s) => {
                #[allow(dead_code)]
                type $T = i64;
                $body
            }
        }
    };
}

impl Buf<'_> {
    /// The element dtype.
    pub fn dtype(&self) -> DType {
        with_buf!(self, Buf, _s, T => <T as Element>::DTYPE)
    }
    /// The number of elements.
    pub fn len(&self) -> usize {
        with_buf!(self, Buf, s, T => s.len())
    }
    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl BufMut<'_> {
    /// The element dtype.
    pub fn dtype(&self) -> DType {
        with_buf!(self, BufMut, _s, T => <T as Element>::DTYPE)
    }
    /// The number of elements.
    pub fn len(&self) -> usize {
        with_buf!(self, BufMut, s, T => s.len())
    }
    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// True for the dtypes collectives carry.
pub fn is_comm_dtype(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::I64
    )
}

/// Applies `f(dst[i], src[i])` to every pair, with the operator matched
/// once outside the loop so that each monomorphised loop vectorises.
#[inline(always)]
fn zip_apply<T: CommElement>(dst: &mut [T], src: &[T], op: ReduceOp, f: impl Fn(T, T, ReduceOp) -> T) {
    #[inline(always)]
    fn run<T: Copy>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f(*d, s);
        }
    }
    match op {
        ReduceOp::Sum | ReduceOp::Avg => run(dst, src, |d, s| f(d, s, ReduceOp::Sum)),
        ReduceOp::Prod => run(dst, src, |d, s| f(d, s, ReduceOp::Prod)),
        ReduceOp::Max => run(dst, src, |d, s| f(d, s, ReduceOp::Max)),
        ReduceOp::Min => run(dst, src, |d, s| f(d, s, ReduceOp::Min)),
    }
}

/// `dst[i] = src[i] ⊕ dst[i]`: the incoming partial is the left operand,
/// the local value the right one (the ring's documented fold order).
pub fn reduce_into<T: CommElement>(dst: &mut [T], src: &[T], op: ReduceOp) {
    zip_apply(dst, src, op, |d, s, op| T::combine(s, d, op));
}

/// `acc[i] = acc[i] ⊕ x[i]`: the accumulated partial is the left operand.
pub fn accumulate<T: CommElement>(acc: &mut [T], x: &[T], op: ReduceOp) {
    zip_apply(acc, x, op, |d, s, op| T::combine(d, s, op));
}

/// `a[i] = b[i] = a[i] ⊕ b[i]` (divided by `n` for [`ReduceOp::Avg`]) in
/// one pass: the last fold step of two ranks, stored into both buffers.
pub(crate) fn fold_into_both<T: CommElement>(a: &mut [T], b: &mut [T], op: ReduceOp, n: usize) {
    #[inline(always)]
    fn run<T: Copy>(a: &mut [T], b: &mut [T], f: impl Fn(T, T) -> T) {
        for (x, y) in a.iter_mut().zip(b) {
            let v = f(*x, *y);
            *x = v;
            *y = v;
        }
    }
    match op {
        ReduceOp::Sum => run(a, b, |x, y| T::combine(x, y, ReduceOp::Sum)),
        ReduceOp::Avg => run(a, b, |x, y| T::div_count(T::combine(x, y, ReduceOp::Sum), n)),
        ReduceOp::Prod => run(a, b, |x, y| T::combine(x, y, ReduceOp::Prod)),
        ReduceOp::Max => run(a, b, |x, y| T::combine(x, y, ReduceOp::Max)),
        ReduceOp::Min => run(a, b, |x, y| T::combine(x, y, ReduceOp::Min)),
    }
}

/// The [`ReduceOp::Avg`] post-op: divides every element by the group size `n`.
pub(crate) fn divide_all<T: CommElement>(buf: &mut [T], n: usize) {
    for x in buf {
        *x = T::div_count(*x, n);
    }
}
