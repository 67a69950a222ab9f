//! Differentiable ops on [`Var`], one family per file, and the pieces every
//! op is written with.
//!
//! An op computes its value with the tessera-tensor method of the same name
//! (errors come straight from there), then records itself with
//! [`record_op`] and a backward closure that:
//! - captures only the tensors it reads (saved tensors are freed when the
//!   node has run);
//! - computes nothing for an input whose `needs[i]` is false;
//! - returns gradients shaped and typed like the inputs, undoing
//!   broadcasting with [`sum_to`].
//!
//! Every op name is an [`registry::Op`], so each recorded op is in
//! [`registry::DIFFERENTIABLE_OPS`] (see [`registry`]).

mod binary;
mod norm;
mod operators;
mod reduce;
pub mod registry;
mod unary;
mod view;

// nn-level ops.
pub mod attention;
mod conv;
mod dropout;
mod index;
mod join;
mod linalg;
pub mod loss;
mod shape;

use tessera_tensor::{dim_indices, Error, Layout, Result, Tensor};

use crate::mode::is_grad_enabled;
use crate::Var;
use registry::Op;

/// Sums `grad` down to `shape`, undoing NumPy broadcasting: leading dims
/// that `shape` lacks are summed away and dims where `shape` has 1 are
/// summed with keepdim. Returns `grad` itself (no copy) when the shapes
/// already match. Errors when `shape` does not broadcast to `grad`'s shape.
pub fn sum_to(grad: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let g = grad.shape();
    if g == shape {
        return Ok(grad.clone());
    }
    let bad = || {
        Error::shape(
            "sum_to",
            format!("cannot sum a gradient of shape {g:?} to shape {shape:?}: it does not broadcast"),
        )
    };
    let lead = g.len().checked_sub(shape.len()).ok_or_else(bad)?;
    let mut dims: Vec<isize> = (0..lead as isize).collect();
    for (i, (&s, &n)) in shape.iter().zip(&g[lead..]).enumerate() {
        if s == n {
            continue;
        }
        if s != 1 {
            return Err(bad());
        }
        dims.push((lead + i) as isize);
    }
    grad.sum(&dims, true)?.reshape(shape)
}

/// The gradient of a reduction over `dims` (empty = all) broadcast back to
/// the input's `shape`: reduced dims are re-inserted as size 1 when the
/// reduction dropped them (`keepdim = false`), then expanded (a view, no
/// copy). Errors on bad dims.
pub(crate) fn unreduce(grad: &Tensor, shape: &[usize], dims: &[isize], keepdim: bool) -> Result<Tensor> {
    let mut g = grad.clone();
    if !keepdim {
        let mut ds = reduced_dims(shape.len(), dims)?;
        ds.sort_unstable();
        for d in ds {
            g = g.unsqueeze(d as isize)?;
        }
    }
    g.broadcast_to(shape)
}

/// The dims a reduction over `dims` covers, resolved (empty = every dim).
pub(crate) fn reduced_dims(ndim: usize, dims: &[isize]) -> Result<Vec<usize>> {
    if dims.is_empty() {
        Ok((0..ndim).collect())
    } else {
        dim_indices("reduce", dims, ndim)
    }
}

/// The gradient of an injective view such as narrow, slice or select:
/// [`Tensor::view_backward`] on the gradient's device. Errors when
/// `grad`'s shape is not `view`'s.
pub(crate) fn embed(grad: &Tensor, base: &[usize], view: &Layout) -> Result<Tensor> {
    grad.view_backward(base, view)
}

/// Errors unless `a` and `b` have the same dtype and device (ops on `Var`s
/// do not promote: a gradient must come back in its input's dtype).
pub(crate) fn check_same(op: Op, a: &Var, b: &Var) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::dtype(
            op.name(),
            format!(
                "operands have different dtypes: {} (shape {:?}) and {} (shape {:?}); cast one with to_dtype",
                a.dtype(),
                a.shape(),
                b.dtype(),
                b.shape()
            ),
        ));
    }
    if a.device() != b.device() {
        return Err(Error::device(
            op.name(),
            format!(
                "operands are on different devices: {} (shape {:?}) and {} (shape {:?})",
                a.device(),
                a.shape(),
                b.device(),
                b.shape()
            ),
        ));
    }
    Ok(())
}

/// Records `op` (one output) like [`crate::record`], after checking that
/// every input that requires a gradient is floating point. Errors (naming
/// the op and the input's shape) otherwise.
pub(crate) fn record_op(
    op: Op,
    output: Tensor,
    inputs: &[&Var],
    backward: impl FnOnce(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>> + Send + 'static,
) -> Result<Var> {
    check_float_inputs(op, inputs)?;
    Ok(crate::record(op.name(), output, inputs, backward))
}

/// Records `op` with several outputs like [`crate::record_multi`], with the
/// checks of [`record_op`].
pub(crate) fn record_op_multi(
    op: Op,
    outputs: Vec<Tensor>,
    inputs: &[&Var],
    backward: impl FnOnce(&[Option<Tensor>], &[bool]) -> Result<Vec<Option<Tensor>>> + Send + 'static,
) -> Result<Vec<Var>> {
    check_float_inputs(op, inputs)?;
    Ok(crate::record_multi(op.name(), outputs, inputs, backward))
}

fn check_float_inputs(op: Op, inputs: &[&Var]) -> Result<()> {
    if !is_grad_enabled() {
        return Ok(());
    }
    match inputs.iter().find(|v| v.requires_grad() && !v.dtype().is_float()) {
        Some(v) => Err(Error::dtype(
            op.name(),
            format!(
                "only floating-point values can require a gradient, got {} (shape {:?})",
                v.dtype(),
                v.shape()
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: Vec<f64>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape).unwrap()
    }

    #[test]
    fn sum_to_undoes_broadcasting() {
        let g = t((0..24).map(f64::from).collect(), &[2, 3, 4]);
        let s = sum_to(&g, &[3, 1]).unwrap();
        assert_eq!(s.shape(), &[3, 1]);
        // Σ over dim 0 and dim 2 of 12k + 4j + l.
        let want: Vec<f64> = (0..3)
            .map(|j| {
                (0..2)
                    .flat_map(|i| (0..4).map(move |l| (12 * i + 4 * j + l) as f64))
                    .sum()
            })
            .collect();
        assert_eq!(s.to_vec::<f64>().unwrap(), want);
        assert_eq!(sum_to(&g, &[]).unwrap().to_vec::<f64>().unwrap(), vec![276.0]);
        assert!(sum_to(&g, &[2, 3, 4]).unwrap().shares_storage(&g));
        assert!(sum_to(&g, &[4, 3]).is_err());
        assert!(sum_to(&g, &[1, 2, 3, 4]).is_err());
        // Broadcasting size 1 to size 0: the gradient is zero.
        let z = Tensor::zeros(&[0, 2], tessera_tensor::DType::F64).unwrap();
        assert_eq!(
            sum_to(&z, &[1, 2]).unwrap().to_vec::<f64>().unwrap(),
            vec![0.0, 0.0]
        );
    }

    #[test]
    fn embed_places_a_strided_view() {
        let g = t(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let view = Layout::contiguous(&[3, 4])
            .slice(1, 1, 4, 2)
            .unwrap()
            .narrow(0, 1, 2)
            .unwrap();
        let e = embed(&g, &[3, 4], &view).unwrap();
        assert_eq!(
            e.to_vec::<f64>().unwrap(),
            vec![0., 0., 0., 0., 0., 1., 0., 2., 0., 3., 0., 4.]
        );
        assert!(embed(&g, &[3, 4], &Layout::contiguous(&[3, 4])).is_err());
    }

    #[test]
    fn unreduce_reinserts_dims() {
        let g = t(vec![1.0, 2.0], &[2]);
        let u = unreduce(&g, &[2, 3], &[1], false).unwrap();
        assert_eq!(
            u.contiguous().unwrap().to_vec::<f64>().unwrap(),
            vec![1., 1., 1., 2., 2., 2.]
        );
        let u = unreduce(&t(vec![5.0], &[]), &[2, 2], &[], false).unwrap();
        assert_eq!(u.contiguous().unwrap().to_vec::<f64>().unwrap(), vec![5.0; 4]);
    }
}
