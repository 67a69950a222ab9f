//! Matrix products: [`Tensor::matmul`] (torch.matmul semantics),
//! [`Tensor::linear`] / [`Tensor::linear_act`] (x·wᵀ + b with a fused
//! epilogue) and [`Tensor::addmm`] (β·C + α·A·B), all on our own packed,
//! cache-blocked, multi-threaded GEMM (the `gemm`, `pack` and `kernel`
//! submodules: a BLIS-style driver, panel packing, register-tile kernels).
//!
//! Dtypes: f32 and f64 compute natively; bf16 runs on the bf16 GEMM of
//! [`bf16`] (bf16 products, f32 sums); f16 is converted to f32 while packing
//! and runs on the f32 kernels. Both round once at the end. Operands of
//! different dtypes are an error asking for an explicit cast (as in
//! PyTorch's matmul); integer and bool operands are an error.

pub(crate) mod bf16;
pub(crate) mod bf16_kernel;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod direct;
pub(crate) mod gemm;
pub(crate) mod kernel;
pub(crate) mod pack;
mod shared;
pub(crate) mod split;
pub(crate) mod transpose;

#[cfg(test)]
mod bf16_tests;
#[cfg(test)]
mod tests;

use gemm::{Bias, Epilogue, GemmShape, MatMut};
use kernel::{GemmScalar, Isa};
use pack::MatRef;

use crate::{broadcast_shapes, DType, Element, Error, FloatElement, Layout, Result, Tensor};

/// An activation fused into the GEMM epilogue of [`Tensor::linear_act`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// The identity.
    #[default]
    None,
    /// `max(x, 0)`.
    Relu,
}

impl Tensor {
    /// The matrix product with `torch.matmul` semantics: 1-D·1-D is a dot
    /// product (0-d result); 2-D·1-D and 1-D·2-D are matrix-vector products
    /// (the 1-D side gets a temporary unit dimension, removed again); 2-D·2-D
    /// is a matrix product; with more dimensions the leading ones are batch
    /// dimensions and broadcast (`[2,1,3,4] @ [5,4,6] → [2,5,3,6]`).
    ///
    /// Errors when either operand is 0-d, the inner sizes differ, the batch
    /// dimensions do not broadcast, the dtypes differ or are not floats, or
    /// the devices differ.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        const OP: &str = "matmul";
        crate::backend::dispatch(OP, &[self, other])?.matmul(self, other)
    }

    /// The CPU kernel of [`Tensor::matmul`].
    pub(crate) fn matmul_cpu(&self, other: &Tensor) -> Result<Tensor> {
        const OP: &str = "matmul";
        check_operands(OP, self, other)?;
        let (na, nb) = (self.ndim(), other.ndim());
        if na == 0 || nb == 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "both operands need at least 1 dimension, got shapes {:?} and {:?}",
                    self.shape(),
                    other.shape()
                ),
            ));
        }
        let a = if na == 1 { self.unsqueeze(0)? } else { self.clone() };
        let b = if nb == 1 {
            other.unsqueeze(1)?
        } else {
            other.clone()
        };
        let (m, k) = (a.shape()[a.ndim() - 2], a.shape()[a.ndim() - 1]);
        let (k2, n) = (b.shape()[b.ndim() - 2], b.shape()[b.ndim() - 1]);
        if k != k2 {
            return Err(Error::shape(
                OP,
                format!(
                    "inner sizes differ: shapes {:?} and {:?} (k = {k} vs {k2})",
                    self.shape(),
                    other.shape()
                ),
            ));
        }
        let batch =
            broadcast_shapes(OP, &a.shape()[..a.ndim() - 2], &b.shape()[..b.ndim() - 2]).map_err(|_| {
                Error::shape(
                    OP,
                    format!(
                        "batch dimensions of shapes {:?} and {:?} do not broadcast",
                        self.shape(),
                        other.shape()
                    ),
                )
            })?;
        let full = |rows: usize, cols: usize| {
            let mut s = batch.clone();
            s.extend([rows, cols]);
            s
        };
        let la = a.layout().broadcast_to(&full(m, k))?;
        let lb = b.layout().broadcast_to(&full(k, n))?;
        let out = batched(self.dtype(), &a, &la, &b, &lb, &batch, (m, n, k))?;
        let mut shape = batch;
        if na > 1 {
            shape.push(m);
        }
        if nb > 1 {
            shape.push(n);
        }
        Ok(out.with_layout(Layout::contiguous(&shape)))
    }

    /// A linear layer, `x·wᵀ + bias`, for `self = x` of shape `[..., in]`,
    /// `weight` of shape `[out, in]` (PyTorch's layout) and an optional
    /// `bias` of shape `[out]`; returns `[..., out]`. The bias is added in
    /// the GEMM epilogue, not in a second pass.
    ///
    /// Errors on shape, dtype or device mismatches (messages name `linear`).
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.linear_act(weight, bias, Activation::None)
    }

    /// [`Tensor::linear`] followed by the activation `act`, fused into the
    /// same pass over the output. Errors as [`Tensor::linear`].
    pub fn linear_act(&self, weight: &Tensor, bias: Option<&Tensor>, act: Activation) -> Result<Tensor> {
        const OP: &str = "linear";
        check_operands(OP, self, weight)?;
        if let Some(b) = bias {
            check_operands(OP, self, b)?;
        }
        let shape_err = || {
            Error::shape(
                OP,
                format!(
                    "input {:?}, weight {:?} (want [out, in] with in = input's last size), bias {:?} (want [out])",
                    self.shape(),
                    weight.shape(),
                    bias.map(|b| b.shape().to_vec())
                ),
            )
        };
        if self.ndim() == 0 || weight.ndim() != 2 || weight.shape()[1] != self.shape()[self.ndim() - 1] {
            return Err(shape_err());
        }
        let out_f = weight.shape()[0];
        if bias.is_some_and(|b| b.shape() != [out_f]) {
            return Err(shape_err());
        }
        crate::backend::dispatch(OP, &[self, weight, &bias])?.linear(self, weight, bias, act)
    }

    /// `beta·self + alpha·(a·b)` for matrices `a` `[m, k]` and `b` `[k, n]`,
    /// with `self` broadcastable to `[m, n]` (PyTorch's `addmm`). With
    /// `beta == 0`, `self` is not read (NaNs in it do not propagate).
    ///
    /// Errors on shape, dtype or device mismatches (messages name `addmm`).
    pub fn addmm(&self, a: &Tensor, b: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        const OP: &str = "addmm";
        let be = crate::backend::dispatch(OP, &[self, a, b])?;
        check_operands(OP, a, b)?;
        check_operands(OP, a, self)?;
        if a.ndim() != 2 || b.ndim() != 2 || a.shape()[1] != b.shape()[0] {
            return Err(Error::shape(
                OP,
                format!(
                    "expects matrices [m, k] and [k, n], got {:?} and {:?}",
                    a.shape(),
                    b.shape()
                ),
            ));
        }
        let (m, n) = (a.shape()[0], b.shape()[1]);
        self.broadcast_to(&[m, n]).map_err(|_| {
            Error::shape(
                OP,
                format!(
                    "input of shape {:?} does not broadcast to [{m}, {n}]",
                    self.shape()
                ),
            )
        })?;
        be.addmm(self, a, b, beta, alpha)
    }

    /// The CPU kernel of [`Tensor::addmm`] (operands checked).
    pub(crate) fn addmm_cpu(&self, a: &Tensor, b: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
        let init = self.broadcast_to(&[m, n])?;
        Ok(crate::with_float_dtype!(a.dtype(), S => {
            type T = <S as FloatElement>::Math;
            let mut c: Vec<T> = if beta == 0.0 {
                vec![<T as Element>::ZERO; m * n]
            } else {
                init.to_dtype(<T as Element>::DTYPE)?.contiguous()?.to_vec::<T>()?
            };
            let shp = GemmShape { m, n, k, alpha: <T as crate::FloatMath>::of(alpha), beta: <T as crate::FloatMath>::of(beta) };
            let (ra, rb) = (mat_ref::<S>(a, a.layout()), mat_ref::<S>(b, b.layout()));
            let cm = MatMut { data: &mut c, off: 0, rs: n as isize, cs: 1 };
            gemm::gemm::<S>(shp, ra, rb, cm, Epilogue::none(), Isa::best(), true);
            Tensor::from_vec(c, &[m, n])?.to_dtype(S::DTYPE)?
        }, else unreachable!("check_operands admits only floats")))
    }
}

/// The CPU's [`Tensor::linear_act`] on checked operands: one GEMM of the
/// flattened input with `weightᵀ`, the bias and ReLU in its epilogue.
pub(crate) fn cpu_linear(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<Tensor> {
    let (out_f, in_f) = (weight.shape()[0], weight.shape()[1]);
    let lead: usize = x.shape()[..x.ndim() - 1].iter().product();
    let flat = x.reshape([lead, in_f])?;
    let mut shape = x.shape()[..x.ndim() - 1].to_vec();
    shape.push(out_f);
    let wt = weight.t()?;
    Ok(crate::with_float_dtype!(x.dtype(), S => {
        let bias_m = bias.map(crate::ops::math_view::math_view::<S>).transpose()?;
        let epi = Epilogue {
            bias: bias_m.as_deref().map_or(Bias::None, Bias::Col),
            relu: act == Activation::Relu,
        };
        let shp = GemmShape { m: lead, n: out_f, k: in_f, alpha: ONE::<S>(), beta: ZERO::<S>() };
        gemm_fresh::<S>(shp, &flat, &wt, epi, &shape)?
    }, else unreachable!("check_operands admits only floats")))
}

/// Checks that `a` and `b` are float tensors of one dtype on one device
/// (which kernel runs is the backend's business).
pub(crate) fn check_operands(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    a.device().same_as(b.device(), op)?;
    if a.dtype() != b.dtype() {
        return Err(Error::dtype(
            op,
            format!(
                "operands have different dtypes {} and {}; cast one with to_dtype first",
                a.dtype(),
                b.dtype()
            ),
        ));
    }
    if !a.dtype().is_float() {
        return Err(Error::dtype(
            op,
            format!(
                "expects float operands, got {}; cast with to_dtype first",
                a.dtype()
            ),
        ));
    }
    Ok(())
}

#[allow(non_snake_case)]
fn ONE<S: FloatElement>() -> S::Math {
    <S::Math as crate::FloatMath>::ONE
}

#[allow(non_snake_case)]
fn ZERO<S: FloatElement>() -> S::Math {
    <S::Math as crate::FloatMath>::ZERO
}

/// The last two dimensions of `layout` over `t`'s storage as a matrix.
pub(crate) fn mat_ref<'a, S: FloatElement>(t: &'a Tensor, layout: &Layout) -> MatRef<'a, S> {
    let nd = layout.ndim();
    MatRef {
        data: t.storage().as_slice::<S>(),
        off: layout.offset(),
        rs: layout.strides()[nd - 2],
        cs: layout.strides()[nd - 1],
    }
}

/// One GEMM `x·w` (2-D operands, any strides) into a fresh tensor of `shape`
/// and of `x`'s dtype.
fn gemm_fresh<S: FloatElement>(
    s: GemmShape<S::Math>,
    x: &Tensor,
    w: &Tensor,
    epi: Epilogue<S::Math>,
    shape: &[usize],
) -> Result<Tensor>
where
    S::Math: GemmScalar,
{
    // beta = 0: the GEMM writes every element, so skip zero-filling.
    let out = Tensor::build_overwrite::<S::Math>("matmul", shape, |c| {
        let cm = MatMut {
            data: c,
            off: 0,
            rs: s.n as isize,
            cs: 1,
        };
        gemm::gemm::<S>(
            s,
            mat_ref(x, x.layout()),
            mat_ref(w, w.layout()),
            cm,
            epi,
            Isa::best(),
            true,
        );
    })?;
    out.to_dtype(S::DTYPE)
}

/// Multiply-adds below which a batch of at least as many products as
/// threads runs one product per task rather than each on all threads.
const BATCH_FLOPS: usize = 1 << 22;

/// The batched product of `a` seen through `la` (`[batch.., m, k]`) and `b`
/// through `lb` (`[batch.., k, n]`) into a fresh contiguous
/// `[batch.., m, n]` tensor of `dtype`. Many small products run one per
/// thread; large ones run one after another, each on all threads. Errors
/// when a copy of an operand fails.
fn batched(
    dtype: DType,
    a: &Tensor,
    la: &Layout,
    b: &Tensor,
    lb: &Layout,
    batch: &[usize],
    mnk: (usize, usize, usize),
) -> Result<Tensor> {
    crate::with_float_dtype!(dtype, S => batched_typed::<S>(a, la, b, lb, batch, mnk),
        else unreachable!("check_operands admits only floats"))
}

fn batched_typed<S: FloatElement>(
    a: &Tensor,
    la: &Layout,
    b: &Tensor,
    lb: &Layout,
    batch: &[usize],
    (m, n, k): (usize, usize, usize),
) -> Result<Tensor>
where
    S::Math: GemmScalar,
{
    use rayon::prelude::*;
    let count: usize = batch.iter().product();
    let offsets = |l: &Layout| -> Vec<usize> {
        (0..count)
            .map(|mut lin| {
                let mut off = l.offset() as isize;
                for d in (0..batch.len()).rev() {
                    off += (lin % batch[d]) as isize * l.strides()[d];
                    lin /= batch[d];
                }
                off as usize
            })
            .collect()
    };
    let (oa, ob) = (offsets(la), offsets(lb));
    let mut shape = batch.to_vec();
    shape.extend([m, n]);
    let shp = GemmShape {
        m,
        n,
        k,
        alpha: ONE::<S>(),
        beta: ZERO::<S>(),
    };
    let (sa, sb) = (a.storage().as_slice::<S>(), b.storage().as_slice::<S>());
    let nd = la.ndim();
    let one = |i: usize, c: &mut [S::Math], shp: GemmShape<S::Math>, par: bool| {
        let ra = MatRef {
            data: sa,
            off: oa[i],
            rs: la.strides()[nd - 2],
            cs: la.strides()[nd - 1],
        };
        let rb = MatRef {
            data: sb,
            off: ob[i],
            rs: lb.strides()[nd - 2],
            cs: lb.strides()[nd - 1],
        };
        let cm = MatMut {
            data: c,
            off: 0,
            rs: n as isize,
            cs: 1,
        };
        gemm::gemm::<S>(shp, ra, rb, cm, Epilogue::none(), Isa::best(), par);
    };
    // A batch of evenly spaced row blocks against one shared matrix (a
    // layer's weight): the products are the rows of one GEMM, which packs
    // the shared matrix once where a loop would pack it per product. Each
    // element sums in the same order either way (the order depends on k
    // alone), except at depths of 4096 and more, where products small
    // enough to be summed in depth slices (`split.rs`) may stack into one
    // that is not.
    let fold = count > 1 && lb.strides()[..nd - 2].iter().all(|&s| s == 0) && rows_fold(la, m);
    // beta = 0: each GEMM writes every element of its chunk.
    let out = Tensor::build_overwrite::<S::Math>("matmul", &shape, |c| {
        if m * n == 0 {
            return;
        }
        if fold {
            one(0, c, GemmShape { m: count * m, ..shp }, true);
            return;
        }
        // One product per task when a product alone would not keep the
        // threads busy (attention heads: 18 × 65×64×65): the per-product
        // fork-join and packing handoffs cost more than they spread. Every
        // product sums in the same order either way.
        let work = m.saturating_mul(n).saturating_mul(k);
        let per_task =
            work < gemm::PAR_FLOPS || (count >= rayon::current_num_threads() && work < BATCH_FLOPS);
        if count > 1 && per_task {
            c.par_chunks_mut(m * n)
                .enumerate()
                .for_each(|(i, ci)| one(i, ci, shp, false));
        } else {
            c.chunks_mut(m * n)
                .enumerate()
                .for_each(|(i, ci)| one(i, ci, shp, true));
        }
    })?;
    out.to_dtype(S::DTYPE)
}

/// Whether the `[batch.., m, k]` view `l` is one `[count·m, k]` matrix:
/// row `i` of product `b` lies one row stride after row `i − 1`, and the
/// first row of product `b + 1` one row stride after the last of `b`
/// (batch-major, as a contiguous tensor or a row slice of one).
fn rows_fold(l: &Layout, m: usize) -> bool {
    let nd = l.ndim();
    let (shape, strides) = (l.shape(), l.strides());
    let mut step = strides[nd - 2] * m as isize;
    for d in (0..nd - 2).rev() {
        if shape[d] != 1 && strides[d] != step {
            return false;
        }
        step *= shape[d] as isize;
    }
    true
}
