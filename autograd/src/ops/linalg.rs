//! Matrix products on [`Var`]: `matmul` with every `torch.matmul` case
//! (vectors, matrices, broadcast batches) and `linear` (`x·wᵀ + b`, the bias
//! added in the GEMM epilogue).

use tessera_tensor::{Result, Tensor};

use super::registry as reg;
use super::{check_same, record_op, sum_to};
use crate::autocast::autocast_entry;
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
        autocast_entry!(reg::MATMUL, [self, other], |c| c[0].matmul(&c[1]));
        check_same(reg::MATMUL, self, other)?;
        let y = self.tensor().matmul(other.tensor())?;
        // Each operand's gradient reads only the other operand.
        let a = other.requires_grad().then(|| self.saved());
        let b = self.requires_grad().then(|| other.saved());
        let (sa, sb) = (self.shape().to_vec(), other.shape().to_vec());
        record_op(reg::MATMUL, y, &[self, other], move |g, needs| {
            let a = a.map(|s| s.get()).transpose()?;
            let b = b.map(|s| s.get()).transpose()?;
            matmul_backward(g, a, b, &sa, &sb, needs)
        })
    }

    /// A linear layer `x·wᵀ + bias` for `self = x` `[..., in]`, `weight`
    /// `[out, in]` and an optional `bias` `[out]`; returns `[..., out]`.
    ///
    /// Errors when dtypes or devices differ or the shapes do not fit (the
    /// message names `linear`).
    pub fn linear(&self, weight: &Var, bias: Option<&Var>) -> Result<Var> {
        let mut all = vec![self, weight];
        all.extend(bias);
        if let Some(c) = crate::autocast::cast_inputs(reg::LINEAR, &all)? {
            return c[0].linear(&c[1], c.get(2));
        }
        check_same(reg::LINEAR, self, weight)?;
        if let Some(b) = bias {
            check_same(reg::LINEAR, self, b)?;
        }
        let y = self.tensor().linear(weight.tensor(), bias.map(Var::tensor))?;
        let x = weight.requires_grad().then(|| self.saved());
        let w = self.requires_grad().then(|| weight.saved());
        let (x_shape, w_shape) = (self.shape().to_vec(), weight.shape().to_vec());
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        record_op(reg::LINEAR, y, &inputs, move |g, needs| {
            let x = x.map(|s| s.get()).transpose()?;
            let w = w.map(|s| s.get()).transpose()?;
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

/// Σ over the rows of a `[rows, n]` gradient: linear's bias gradient, a
/// tensor reduction on `g`'s device (deterministic for any thread count).
fn sum_rows(g: &Tensor) -> Result<Tensor> {
    g.sum(&[0], false)
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
