//! [`GradAccumulator`]: gradient accumulation over k micro-batches.

use tessera_autograd::Gradients;
use tessera_tensor::{with_float_dtype, Error, FloatElement, Result};

use crate::clip::{scale_in_place, sorted_ids};

/// Sums the [`Gradients`] of `k` micro-batches in place, then hands back
/// their sum or mean for one optimizer step: the effective batch is `k`
/// micro-batches. The first micro-batch's gradients are kept (no copy);
/// later ones are added into them, so accumulating allocates nothing when
/// every micro-batch reaches the same parameters.
///
/// ```
/// # use tessera_optim::GradAccumulator;
/// # use tessera_autograd::{Gradients, Parameter};
/// # use tessera_tensor::Tensor;
/// let p = Parameter::new(Tensor::from_vec(vec![0.0f32], &[1])?);
/// let mut acc = GradAccumulator::new(2, true)?;
/// for g in [1.0f32, 3.0] {
///     let mut grads = Gradients::default();
///     grads.insert(p.id().unwrap(), Tensor::from_vec(vec![g], &[1])?);
///     if let Some(mean) = acc.add(grads)? {
///         assert_eq!(p.grad(&mean).unwrap().to_vec::<f32>()?, vec![2.0]);
///     }
/// }
/// # Ok::<(), tessera_tensor::Error>(())
/// ```
pub struct GradAccumulator {
    k: usize,
    average: bool,
    count: usize,
    sum: Gradients,
}

impl GradAccumulator {
    /// An accumulator over `k` micro-batches that returns the mean of their
    /// gradients (`average`, as when each micro-batch loss is divided by
    /// `k`) or their sum. Errors when `k` is 0.
    pub fn new(k: usize, average: bool) -> Result<GradAccumulator> {
        if k == 0 {
            return Err(Error::arg("GradAccumulator::new", "k must be at least 1"));
        }
        Ok(GradAccumulator {
            k,
            average,
            count: 0,
            sum: Gradients::default(),
        })
    }

    /// Adds one micro-batch's gradients. Returns the accumulated gradients
    /// (summed, or divided by `k`) when this was the `k`-th micro-batch,
    /// and starts over; `None` before. A parameter missing from some
    /// micro-batches gets the sum of the ones it appears in (divided by
    /// `k` all the same). Errors when a gradient's shape or dtype differs
    /// from what was accumulated for the same parameter (nothing is added then).
    pub fn add(&mut self, grads: Gradients) -> Result<Option<Gradients>> {
        if self.count == 0 {
            self.sum = grads;
        } else {
            for (id, g) in grads.iter() {
                if let Some(acc) = self.sum.get_id(*id) {
                    check_same(acc, g)?;
                }
            }
            for (id, g) in grads.iter() {
                match self.sum.get_id_mut(*id) {
                    None => self.sum.insert(*id, g.clone()),
                    Some(acc) => add_into(acc, g)?,
                }
            }
        }
        self.count += 1;
        if self.count < self.k {
            return Ok(None);
        }
        Ok(Some(self.finish()?))
    }

    /// How many micro-batches have been added since the last step.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The number of micro-batches per step.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Hands back what has been accumulated so far (e.g. at the end of an
    /// epoch with fewer than `k` micro-batches left), divided by the number
    /// of micro-batches added when averaging, and starts over. `None` when
    /// nothing was added.
    pub fn flush(&mut self) -> Result<Option<Gradients>> {
        if self.count == 0 {
            return Ok(None);
        }
        Ok(Some(self.finish()?))
    }

    fn finish(&mut self) -> Result<Gradients> {
        let mut out = std::mem::take(&mut self.sum);
        if self.average && self.count > 1 {
            let inv = 1.0 / self.count as f64;
            for id in sorted_ids(&out) {
                scale_in_place(out.get_id_mut(id).expect("listed id"), inv)?;
            }
        }
        self.count = 0;
        Ok(out)
    }
}

fn check_same(acc: &tessera_tensor::Tensor, g: &tessera_tensor::Tensor) -> Result<()> {
    if acc.shape() != g.shape() || acc.dtype() != g.dtype() {
        return Err(Error::shape(
            "GradAccumulator::add",
            format!(
                "gradient of shape {:?} ({}) added to an accumulated one of shape {:?} ({})",
                g.shape(),
                g.dtype(),
                acc.shape(),
                acc.dtype()
            ),
        ));
    }
    Ok(())
}

fn add_into(acc: &mut tessera_tensor::Tensor, g: &tessera_tensor::Tensor) -> Result<()> {
    let dtype = acc.dtype();
    with_float_dtype!(dtype, T => acc.zip_map_::<T, T>(g, "GradAccumulator::add", |a, b| {
        T::from_math(a.to_math() + b.to_math())
    }), else Err(Error::dtype("GradAccumulator::add", format!("gradients must be floating point, got {dtype}"))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::param;
    use tessera_tensor::Tensor;

    fn grads(p: &tessera_autograd::Parameter, v: &[f64]) -> Gradients {
        let mut g = Gradients::default();
        g.insert(p.id().unwrap(), Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap());
        g
    }

    #[test]
    fn sums_or_averages_k_micro_batches_in_place() {
        let p = param(&[0.0, 0.0], &[2]);
        let q = param(&[0.0], &[1]);
        let mut acc = GradAccumulator::new(3, true).unwrap();
        let first = grads(&p, &[1.0, 2.0]);
        let ptr = first
            .get_id(p.id().unwrap())
            .unwrap()
            .storage()
            .as_bytes()
            .as_ptr();
        assert!(acc.add(first).unwrap().is_none());
        let mut second = grads(&p, &[3.0, 4.0]);
        second.insert(q.id().unwrap(), Tensor::from_vec(vec![6.0f64], &[1]).unwrap());
        assert!(acc.add(second).unwrap().is_none());
        assert_eq!(acc.count(), 2);
        let out = acc.add(grads(&p, &[5.0, 9.0])).unwrap().unwrap();
        let g = p.grad(&out).unwrap();
        assert_eq!(g.storage().as_bytes().as_ptr(), ptr, "accumulated in place");
        assert_eq!(g.to_vec::<f64>().unwrap(), vec![3.0, 5.0]);
        assert_eq!(q.grad(&out).unwrap().to_vec::<f64>().unwrap(), vec![2.0]);
        assert_eq!(acc.count(), 0);

        let mut sum = GradAccumulator::new(2, false).unwrap();
        assert!(sum.add(grads(&p, &[1.0, 1.0])).unwrap().is_none());
        let out = sum.add(grads(&p, &[2.0, 3.0])).unwrap().unwrap();
        assert_eq!(p.grad(&out).unwrap().to_vec::<f64>().unwrap(), vec![3.0, 4.0]);
    }

    #[test]
    fn flush_averages_over_what_was_added_and_mismatches_are_errors() {
        let p = param(&[0.0, 0.0], &[2]);
        let mut acc = GradAccumulator::new(4, true).unwrap();
        assert!(acc.flush().unwrap().is_none());
        acc.add(grads(&p, &[1.0, 2.0])).unwrap();
        acc.add(grads(&p, &[3.0, 2.0])).unwrap();
        let out = acc.flush().unwrap().unwrap();
        assert_eq!(p.grad(&out).unwrap().to_vec::<f64>().unwrap(), vec![2.0, 2.0]);
        acc.add(grads(&p, &[1.0, 2.0])).unwrap();
        assert!(acc.add(grads(&p, &[1.0, 2.0, 3.0])).is_err());
        assert!(GradAccumulator::new(0, true).is_err());
    }
}
