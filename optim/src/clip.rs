//! Gradient clipping: by global norm (`torch.nn.utils.clip_grad_norm_`) and
//! by value (`clip_grad_value_`), in place on [`Gradients`].

use tessera_autograd::{Gradients, VarId};
use tessera_tensor::{with_float_dtype, Error, FloatElement, FloatMath, Result, Tensor};

use crate::kernel::{sum_by, sum_sq};

/// Scales every gradient by `min(1, max_norm / (total + 1e-6))`, where
/// `total` is the `norm_type`-norm of all gradients together (as if
/// concatenated; `f64::INFINITY` for the max-norm), and returns `total`
/// (PyTorch's `clip_grad_norm_`, a NaN or infinite total included: it then
/// turns the gradients into NaN, as PyTorch does). The sum runs in f64 in a
/// fixed order. Errors when `norm_type` is not positive, `max_norm` is
/// negative or NaN, or a gradient is not floating point.
pub fn clip_grad_norm(grads: &mut Gradients, max_norm: f64, norm_type: f64) -> Result<f64> {
    const OP: &str = "clip_grad_norm";
    if norm_type.is_nan() || norm_type <= 0.0 {
        return Err(Error::arg(
            OP,
            format!("norm_type must be > 0 or infinite, got {norm_type}"),
        ));
    }
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::arg(OP, format!("max_norm must be ≥ 0, got {max_norm}")));
    }
    let ids = sorted_ids(grads);
    let mut acc = 0.0f64;
    for &id in &ids {
        let g = grads.get_id(id).expect("listed id").contiguous()?;
        let n = with_float_dtype!(g.dtype(), T => tensor_norm(g.as_slice::<T>()?, norm_type),
            else return Err(not_float(OP, &g)));
        acc = if norm_type.is_infinite() {
            acc.max_nan(n)
        } else {
            acc + n.powf(norm_type)
        };
    }
    let total = if norm_type.is_infinite() {
        acc
    } else {
        acc.powf(1.0 / norm_type)
    };
    let coef = max_norm / (total + 1e-6);
    let coef = if coef.is_nan() { coef } else { coef.min(1.0) };
    if coef != 1.0 {
        for &id in &ids {
            let g = grads.get_id_mut(id).expect("listed id");
            scale_in_place(g, coef)?;
        }
    }
    Ok(total)
}

/// Clamps every gradient element to `[-clip_value, clip_value]` (NaN stays
/// NaN), PyTorch's `clip_grad_value_`. Errors when `clip_value` is negative
/// or NaN, or a gradient is not floating point.
pub fn clip_grad_value(grads: &mut Gradients, clip_value: f64) -> Result<()> {
    const OP: &str = "clip_grad_value";
    if clip_value.is_nan() || clip_value < 0.0 {
        return Err(Error::arg(
            OP,
            format!("clip_value must be ≥ 0, got {clip_value}"),
        ));
    }
    for (_, g) in grads.iter_mut() {
        let dtype = g.dtype();
        with_float_dtype!(dtype, T => {
            let c = <T as FloatElement>::Math::of(clip_value);
            for x in g.make_mut::<T>()? {
                let v = x.to_math();
                if v > c {
                    *x = T::from_math(c);
                } else if v < -c {
                    *x = T::from_math(-c);
                }
            }
        }, else return Err(not_float(OP, g)));
    }
    Ok(())
}

/// The gradients' ids in ascending order, so sums do not depend on the
/// map's iteration order.
pub(crate) fn sorted_ids(grads: &Gradients) -> Vec<VarId> {
    let mut ids: Vec<VarId> = grads.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids
}

/// Multiplies every element of `g` by `c` in place (copy-on-write).
pub(crate) fn scale_in_place(g: &mut Tensor, c: f64) -> Result<()> {
    let dtype = g.dtype();
    with_float_dtype!(dtype, T => {
        let c = <T as FloatElement>::Math::of(c);
        for x in g.make_mut::<T>()? {
            *x = T::from_math(x.to_math() * c);
        }
    }, else return Err(not_float("scale", g)));
    Ok(())
}

fn tensor_norm<T: FloatElement>(x: &[T], p: f64) -> f64 {
    if p.is_infinite() {
        x.iter().fold(0.0f64, |m, v| m.max_nan(v.to_f64().abs()))
    } else if p == 2.0 {
        sum_sq(x).sqrt()
    } else if p == 1.0 {
        sum_by(x, &f64::abs)
    } else {
        sum_by(x, &|v| v.abs().powf(p)).powf(1.0 / p)
    }
}

fn not_float(op: &'static str, g: &Tensor) -> Error {
    Error::dtype(op, format!("gradients must be floating point, got {}", g.dtype()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::grads_of;

    /// Two gradients [3, 4] and [12]: ‖·‖₂ = √(9+16+144) = 13, ‖·‖₁ = 19,
    /// ‖·‖∞ = 12. Clipping at 6.5 scales by 6.5/(13 + 1e-6).
    #[test]
    fn clips_by_the_global_norm_like_pytorch() {
        let (_, mut grads) = grads_of(&[(&[3.0, 4.0], &[2]), (&[12.0], &[1])]);
        let ids = sorted_ids(&grads);
        let total = clip_grad_norm(&mut grads, 6.5, 2.0).unwrap();
        assert_eq!(total, 13.0);
        let c = 6.5 / (13.0 + 1e-6);
        let a = grads.get_id(ids[0]).unwrap().to_vec::<f64>().unwrap();
        let b = grads.get_id(ids[1]).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(a, vec![3.0 * c, 4.0 * c]);
        assert_eq!(b, vec![12.0 * c]);

        // Below the threshold nothing changes (coefficient clamped to 1).
        let (_, mut grads) = grads_of(&[(&[3.0, 4.0], &[2]), (&[12.0], &[1])]);
        assert_eq!(clip_grad_norm(&mut grads, 100.0, 2.0).unwrap(), 13.0);
        let ids = sorted_ids(&grads);
        assert_eq!(grads.get_id(ids[1]).unwrap().to_vec::<f64>().unwrap(), vec![12.0]);

        let (_, mut grads) = grads_of(&[(&[3.0, -4.0], &[2]), (&[12.0], &[1])]);
        assert_eq!(clip_grad_norm(&mut grads, 100.0, 1.0).unwrap(), 19.0);
        assert_eq!(clip_grad_norm(&mut grads, 100.0, f64::INFINITY).unwrap(), 12.0);
        assert!(clip_grad_norm(&mut grads, 1.0, 0.0).is_err());
        assert!(clip_grad_norm(&mut grads, -1.0, 2.0).is_err());
        assert_eq!(clip_grad_norm(&mut Gradients::default(), 1.0, 2.0).unwrap(), 0.0);
    }

    #[test]
    fn a_non_finite_norm_poisons_the_gradients_like_pytorch() {
        let (_, mut grads) = grads_of(&[(&[f64::INFINITY, 1.0], &[2])]);
        assert_eq!(clip_grad_norm(&mut grads, 1.0, 2.0).unwrap(), f64::INFINITY);
        let id = sorted_ids(&grads)[0];
        // 1/(inf) = 0: finite entries become 0, inf·0 = NaN.
        let v = grads.get_id(id).unwrap().to_vec::<f64>().unwrap();
        assert!(v[0].is_nan() && v[1] == 0.0);
    }

    #[test]
    fn clamps_values_and_keeps_nan() {
        let (_, mut grads) = grads_of(&[(&[-3.0, 0.5, 2.0, f64::NAN], &[4])]);
        clip_grad_value(&mut grads, 1.0).unwrap();
        let id = sorted_ids(&grads)[0];
        let v = grads.get_id(id).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(&v[..3], &[-1.0, 0.5, 1.0]);
        assert!(v[3].is_nan());
        assert!(clip_grad_value(&mut grads, -1.0).is_err());
    }

    #[test]
    fn clipping_updates_unshared_gradients_in_place() {
        let (_, mut grads) = grads_of(&[(&[30.0, 40.0], &[2])]);
        let id = sorted_ids(&grads)[0];
        let before = grads.get_id(id).unwrap().storage().as_bytes().as_ptr();
        clip_grad_norm(&mut grads, 5.0, 2.0).unwrap();
        let g = grads.get_id(id).unwrap();
        assert_eq!(g.storage().as_bytes().as_ptr(), before);
        let v = g.to_vec::<f64>().unwrap();
        assert!((v[0] - 3.0).abs() < 1e-6 && (v[1] - 4.0).abs() < 1e-6);
    }
}
