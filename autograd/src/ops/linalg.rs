//! Matrix products on [`Var`]: `matmul` with every `torch.matmul` case
//! (vectors, matrices, broadcast batches) and `linear` (`x·wᵀ + b`, the bias
//! added in the GEMM epilogue).

use rayon::prelude::*;
use tessera_tensor::{DType, Element, Result, Tensor};

use super::registry as reg;
use super::{check_same, record_op, sum_to};
use crate::Var;

impl Var {
    /// The matrix product with `torch.matmul` semantics (1-D operands are
    /// promoted to a row/column and the unit dimension removed again; leading
    /// dimensions are batch dimensions and broadcast). The gradients are
    /// summed over the batch dimensions an operand was broadcast along.
    ///
    /// Errors when dtypes or devices differ, either operand is 0-d, the inner
    /// sizes differ or the batch dimensions do not broadcast.
    pub fn matmul(&self, other: &Var) -> Result<Var> {
        check_same(reg::MATMUL, self, other)?;
        let y = self.tensor().matmul(other.tensor())?;
        // Each operand's gradient reads only the other operand.
        let a = other.requires_grad().then(|| self.tensor().clone());
        let b = self.requires_grad().then(|| other.tensor().clone());
        let (sa, sb) = (self.shape().to_vec(), other.shape().to_vec());
        record_op(reg::MATMUL, y, &[self, other], move |g, needs| {
            matmul_backward(g, a, b, &sa, &sb, needs)
        })
    }

    /// A linear layer `x·wᵀ + bias` for `self = x` `[..., in]`, `weight`
    /// `[out, in]` and an optional `bias` `[out]`; returns `[..., out]`.
    ///
    /// Errors when dtypes or devices differ or the shapes do not fit (the
    /// message names `linear`).
    pub fn linear(&self, weight: &Var, bias: Option<&Var>) -> Result<Var> {
        check_same(reg::LINEAR, self, weight)?;
        if let Some(b) = bias {
            check_same(reg::LINEAR, self, b)?;
        }
        let y = self.tensor().linear(weight.tensor(), bias.map(Var::tensor))?;
        let x = weight.requires_grad().then(|| self.tensor().clone());
        let w = self.requires_grad().then(|| weight.tensor().clone());
        let (x_shape, w_shape) = (self.shape().to_vec(), weight.shape().to_vec());
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        record_op(reg::LINEAR, y, &inputs, move |g, needs| {
            let (out_f, in_f) = (w_shape[0], w_shape[1]);
            let rows = x_shape[..x_shape.len().saturating_sub(1)]
                .iter()
                .product::<usize>();
            let g2 = g.reshape([rows, out_f])?;
            let gx = match (needs[0], &w) {
                (true, Some(w)) => Some(g.matmul(w)?.reshape(&x_shape)?),
                _ => None,
            };
            let gw = match (needs[1], &x) {
                (true, Some(x)) => {
                    let x2 = x.reshape([rows, in_f])?;
                    Some(g2.t()?.matmul(&x2)?)
                }
                _ => None,
            };
            let mut grads = vec![gx, gw];
            if needs.len() == 3 {
                grads.push(if needs[2] { Some(sum_rows(&g2)?) } else { None });
            }
            Ok(grads)
        })
    }
}

/// Σ over the rows of a `[rows, n]` gradient: linear's bias gradient. For
/// f32 and f64, one pass down the rows accumulating every column in f64
/// (row order, so the result depends neither on the thread count nor on
/// the batch split), blocks of columns on rayon threads; other dtypes use
/// [`Tensor::sum`]. Errors only when `g` is not 2-D.
fn sum_rows(g: &Tensor) -> Result<Tensor> {
    match g.dtype() {
        DType::F32 => column_sums::<f32>(g),
        DType::F64 => column_sums::<f64>(g),
        _ => g.sum(&[0], false),
    }
}

/// Columns per parallel block of [`column_sums`].
const SUM_COLS: usize = 256;

fn column_sums<T: Element>(g: &Tensor) -> Result<Tensor> {
    let (rows, n) = match g.shape() {
        &[rows, n] => (rows, n),
        s => {
            return Err(tessera_tensor::Error::shape(
                "linear",
                format!("bias gradient from a gradient of shape {s:?}, want 2-D"),
            ))
        }
    };
    let g = g.contiguous()?;
    let src = g.as_slice::<T>()?;
    Tensor::build::<T>("linear_backward", &[n], |out| {
        out.par_chunks_mut(SUM_COLS).enumerate().for_each(|(blk, o)| {
            let c0 = blk * SUM_COLS;
            let mut acc = [0.0f64; SUM_COLS];
            let acc = &mut acc[..o.len()];
            for row in src.chunks_exact(n).take(rows) {
                for (a, v) in acc.iter_mut().zip(&row[c0..c0 + o.len()]) {
                    *a += v.to_f64();
                }
            }
            for (o, &a) in o.iter_mut().zip(acc.iter()) {
                *o = T::from_f64(a);
            }
        })
    })
}

/// The gradients of `a @ b` given the output gradient `g`. `a` is present
/// when `b` needs a gradient and `b` when `a` does.
fn matmul_backward(
    g: &Tensor,
    a: Option<Tensor>,
    b: Option<Tensor>,
    sa: &[usize],
    sb: &[usize],
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    // Work on the promoted (≥ 2-D) operands and a gradient of full shape
    // batch + [m, n].
    let a2_shape = if sa.len() == 1 {
        vec![1, sa[0]]
    } else {
        sa.to_vec()
    };
    let b2_shape = if sb.len() == 1 {
        vec![sb[0], 1]
    } else {
        sb.to_vec()
    };
    let (m, k) = (a2_shape[a2_shape.len() - 2], a2_shape[a2_shape.len() - 1]);
    let n = b2_shape[b2_shape.len() - 1];
    let mut full: Vec<usize> = g.shape().to_vec();
    if sb.len() == 1 {
        full.push(1);
    }
    if sa.len() == 1 {
        full.insert(full.len() - 1, 1);
    }
    let g2 = g.reshape(&full)?;
    let batch = &full[..full.len() - 2];
    let rows: usize = batch.iter().product();

    let ga = match (needs[0], b) {
        (true, Some(b)) => {
            let b2 = b.reshape(&b2_shape)?;
            let ga2 = if a2_shape.len() == 2 && b2_shape.len() > 2 && b2_shape[..b2_shape.len() - 2] == *batch
            {
                // Σ over the batch of g·bᵀ as one GEMM: [m, B·n] · [B·n, k].
                let gm = rows_first(&g2)?.reshape([m, rows * n])?;
                let bm = b2.transpose(-1, -2)?.reshape([rows * n, k])?;
                gm.matmul(&bm)?
            } else {
                sum_to(&g2.matmul(&b2.transpose(-1, -2)?)?, &a2_shape)?
            };
            Some(ga2.reshape(sa)?)
        }
        _ => None,
    };
    let gb = match (needs[1], a) {
        (true, Some(a)) => {
            let a2 = a.reshape(&a2_shape)?;
            let gb2 = if b2_shape.len() == 2 && a2_shape.len() > 2 && a2_shape[..a2_shape.len() - 2] == *batch
            {
                // Σ over the batch of aᵀ·g as one GEMM: [k, B·m] · [B·m, n].
                let am = a2.reshape([rows * m, k])?;
                let gm = g2.reshape([rows * m, n])?;
                am.t()?.matmul(&gm)?
            } else {
                sum_to(&a2.transpose(-1, -2)?.matmul(&g2)?, &b2_shape)?
            };
            Some(gb2.reshape(sb)?)
        }
        _ => None,
    };
    Ok(vec![ga, gb])
}

/// `[B..., m, n]` → `[m, B..., n]` (a view).
fn rows_first(t: &Tensor) -> Result<Tensor> {
    let nd = t.ndim() as isize;
    let mut perm: Vec<isize> = vec![nd - 2];
    perm.extend(0..nd - 2);
    perm.push(nd - 1);
    t.permute(&perm)
}
