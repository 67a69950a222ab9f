//! GPU dispatch of matmul: f16/bf16 through the tensor-core GEMM of
//! `tessera-cuda-kernels`, f32 through the runtime's vendor GEMM
//! (cuBLAS). Operands are used in place
//! when their matrices are row-major or transposed with one stride between
//! batches; other views are copied contiguous first.

use tessera_cuda_kernels::ops::gemm::{gemm, GemmShape};
use tessera_cuda_kernels::DevPtr;

use crate::cuda::{buffer_of, common_device, contiguous, kernel_err, launch, no_kernel, DeviceState, Output};
use crate::{broadcast_shapes, DType, Error, Result, Tensor};

/// `a @ b` with `torch.matmul` semantics for GPU operands.
///
/// Errors: operands on different devices, shapes that do not multiply or
/// broadcast, dtypes that differ or have no GPU GEMM (f64, integers),
/// cuBLAS missing for f32, a device failure.
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    const OP: &str = "matmul";
    let state = common_device(OP, &[a, b])?;
    if a.dtype() != b.dtype() {
        return Err(Error::dtype(
            OP,
            format!(
                "operands have different dtypes {} and {}; cast one with to_dtype first",
                a.dtype(),
                b.dtype()
            ),
        ));
    }
    let (na, nb) = (a.ndim(), b.ndim());
    if na == 0 || nb == 0 {
        return Err(Error::shape(
            OP,
            format!(
                "both operands need at least 1 dimension, got shapes {:?} and {:?}",
                a.shape(),
                b.shape()
            ),
        ));
    }
    let a2 = if na == 1 { a.unsqueeze(0)? } else { a.clone() };
    let b2 = if nb == 1 { b.unsqueeze(1)? } else { b.clone() };
    let (m, k) = (a2.shape()[a2.ndim() - 2], a2.shape()[a2.ndim() - 1]);
    let (k2, n) = (b2.shape()[b2.ndim() - 2], b2.shape()[b2.ndim() - 1]);
    if k != k2 {
        return Err(Error::shape(
            OP,
            format!(
                "inner sizes differ: shapes {:?} and {:?} (k = {k} vs {k2})",
                a.shape(),
                b.shape()
            ),
        ));
    }
    let batch = broadcast_shapes(OP, &a2.shape()[..a2.ndim() - 2], &b2.shape()[..b2.ndim() - 2])?;
    let count: usize = batch.iter().product();
    let full = |r: usize, c: usize| [batch.clone(), vec![r, c]].concat();
    let (oa, ob) = (
        Operand::of(&a2.broadcast_to(&full(m, k))?)?,
        Operand::of(&b2.broadcast_to(&full(k, n))?)?,
    );
    let out = if k == 0 {
        Output::zeros(OP, &state, a.dtype(), count * m * n)?
    } else {
        Output::new(OP, &state, a.dtype(), count * m * n)?
    };
    if count * m * n > 0 && k > 0 {
        let g = GemmShape {
            m,
            n,
            k,
            batch: count,
            trans_a: oa.trans,
            trans_b: ob.trans,
            lda: oa.ld,
            ldb: ob.ld,
            ldc: n,
            stride_a: oa.batch_stride,
            stride_b: ob.batch_stride,
            stride_c: m * n,
        };
        run(OP, &state, a.dtype(), &g, &oa, &ob, &out)?;
    }
    let mut shape = batch;
    if na > 1 {
        shape.push(m);
    }
    if nb > 1 {
        shape.push(n);
    }
    Ok(out.into_tensor(&shape))
}

/// One GEMM operand: the tensor (kept alive for the launch), whether its
/// matrices are stored transposed, their leading dimension, and the
/// elements between batches.
struct Operand {
    t: Tensor,
    trans: bool,
    ld: usize,
    batch_stride: usize,
}

impl Operand {
    /// `t` (shape `[batch.., r, c]`) in place when its layout allows,
    /// else a contiguous copy.
    fn of(t: &Tensor) -> Result<Operand> {
        if let Some(o) = Self::in_place(t) {
            return Ok(o);
        }
        let c = contiguous(t)?;
        let nd = c.ndim();
        let (r, cols) = (c.shape()[nd - 2], c.shape()[nd - 1]);
        Ok(Operand {
            t: c,
            trans: false,
            ld: cols,
            batch_stride: r * cols,
        })
    }

    fn in_place(t: &Tensor) -> Option<Operand> {
        let nd = t.ndim();
        let (r, c) = (t.shape()[nd - 2], t.shape()[nd - 1]);
        let (rs, cs) = (t.strides()[nd - 2], t.strides()[nd - 1]);
        let (trans, ld) = if (cs == 1 || c == 1) && (r == 1 || rs >= c as isize) {
            (false, if r == 1 { c } else { rs as usize })
        } else if (rs == 1 || r == 1) && (c == 1 || cs >= r as isize) {
            (true, if c == 1 { r } else { cs as usize })
        } else {
            return None;
        };
        let batch_stride = single_stride(&t.shape()[..nd - 2], &t.strides()[..nd - 2])?;
        Some(Operand {
            t: t.clone(),
            trans,
            ld: ld.max(1),
            batch_stride,
        })
    }

    /// The operand from its first element to the end of its storage.
    fn ptr<T>(&self) -> DevPtr<T> {
        let off = self.t.layout().offset();
        let addr = buffer_of(&self.t).addr() + (off * std::mem::size_of::<T>()) as u64;
        DevPtr::from_raw(addr, self.t.storage().len().saturating_sub(off))
    }
}

/// The one stride that walks batch dims `shape`/`strides` in row-major
/// order (0 for a broadcast operand), or `None` when no single stride does.
fn single_stride(shape: &[usize], strides: &[isize]) -> Option<usize> {
    let dims: Vec<(usize, isize)> = shape
        .iter()
        .zip(strides)
        .filter(|(&n, _)| n != 1)
        .map(|(&n, &s)| (n, s))
        .collect();
    let Some(&(_, last)) = dims.last() else {
        return Some(0);
    };
    if last < 0 {
        return None;
    }
    let chained = dims.windows(2).all(|w| w[0].1 == w[1].1 * w[1].0 as isize);
    chained.then_some(last as usize)
}

fn run(
    op: &'static str,
    state: &DeviceState,
    dtype: DType,
    g: &GemmShape,
    a: &Operand,
    b: &Operand,
    out: &Output,
) -> Result<()> {
    match dtype {
        DType::F16 => {
            let l =
                gemm::<crate::f16>(g, a.ptr(), b.ptr(), out.ptr()).map_err(kernel_err(op, state.device()))?;
            launch(op, state, &[l])
        }
        DType::BF16 => {
            let l = gemm::<crate::bf16>(g, a.ptr(), b.ptr(), out.ptr())
                .map_err(kernel_err(op, state.device()))?;
            launch(op, state, &[l])
        }
        DType::F32 => sgemm(op, state, g, a, b, out),
        other => Err(no_kernel(op, state.device(), format_args!("{other} tensors"))),
    }
}

/// Row-major f32 C = op(A)·op(B) by the device's vendor GEMM (cuBLAS on a
/// GPU, a reference GEMM on the emulator).
fn sgemm(
    op: &'static str,
    state: &DeviceState,
    g: &GemmShape,
    a: &Operand,
    b: &Operand,
    out: &Output,
) -> Result<()> {
    // SAFETY: the operand views lie in their storage (layouts of live
    // tensors, checked against `g` by the runtime), C is a fresh buffer of
    // batch·m·n elements; everything runs on the device's one stream.
    unsafe { state.runtime().sgemm(g, a.ptr(), b.ptr(), out.ptr()) }.map_err(kernel_err(op, state.device()))
}

/// `x·wᵀ + bias` (then `act`) on the GPU, composed of the GEMM and the
/// elementwise kernels: one GEMM over the rows of `x` as a matrix, the
/// bias a broadcast add. Arguments are checked by [`Tensor::linear_act`].
///
/// Errors as [`matmul`].
pub(crate) fn linear(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    act: super::Activation,
) -> Result<Tensor> {
    let in_f = weight.shape()[1];
    let lead = &x.shape()[..x.ndim() - 1];
    let rows: usize = lead.iter().product();
    let mut y = x.reshape([rows, in_f])?.matmul(&weight.t()?)?;
    if let Some(b) = bias {
        y = y.add(b)?;
    }
    if act == super::Activation::Relu {
        y = y.relu()?;
    }
    let mut shape = lead.to_vec();
    shape.push(weight.shape()[0]);
    y.reshape(shape)
}

/// `beta·c + alpha·(a·b)` for checked GPU matrices `a` `[m, k]`, `b`
/// `[k, n]` and `c` broadcastable to `[m, n]`: the device GEMM, then the
/// scaling and the addition in f32, rounded once to `a`'s dtype. With
/// `beta == 0`, `c` is not read.
///
/// Errors as [`matmul`].
pub(crate) fn addmm(c: &Tensor, a: &Tensor, b: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
    let mut y = matmul(a, b)?.to_dtype(DType::F32)?;
    if alpha != 1.0 {
        y = y.mul_scalar(alpha)?;
    }
    if beta != 0.0 {
        let mut init = c.to_dtype(DType::F32)?;
        if beta != 1.0 {
            init = init.mul_scalar(beta)?;
        }
        y = y.add(&init)?;
    }
    y.to_dtype(a.dtype())
}
