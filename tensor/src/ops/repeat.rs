//! `repeat`: tiling a tensor along every dim (PyTorch's `Tensor.repeat`).

use crate::{Error, Layout, Result, Tensor};

impl Tensor {
    /// `self` tiled `repeats[k]` times along dim `k`; when `repeats` is
    /// longer than the rank, `self` first gains leading size-1 dims (PyTorch's
    /// `repeat`). The result is a new contiguous tensor. Errors when
    /// `repeats` is shorter than the rank or the result would overflow.
    pub fn repeat(&self, repeats: &[usize]) -> Result<Tensor> {
        // A broadcast view made contiguous: the device's strided copy on a
        // GPU, the CPU's row copy elsewhere.
        const OP: &str = "repeat";
        let nd = self.ndim();
        if repeats.len() < nd {
            return Err(Error::arg(
                OP,
                format!(
                    "{} repeats {repeats:?} are fewer than the {nd} dims of shape {:?}",
                    repeats.len(),
                    self.shape()
                ),
            ));
        }
        let lead = repeats.len() - nd;
        // Seen as [r0, n0, r1, n1, ...] with stride 0 on each repeat, the
        // tiled tensor is a broadcast view; one strided copy materialises it.
        let mut big_shape = Vec::with_capacity(2 * repeats.len());
        let mut big_strides = Vec::with_capacity(2 * repeats.len());
        let mut shape = Vec::with_capacity(repeats.len());
        for (k, &r) in repeats.iter().enumerate() {
            let (n, st) = if k < lead {
                (1, 0)
            } else {
                (self.shape()[k - lead], self.strides()[k - lead])
            };
            big_shape.extend([r, n]);
            big_strides.extend([0, st]);
            shape.push(
                r.checked_mul(n)
                    .ok_or_else(|| Error::arg(OP, format!("repeating size {n} by {r} overflows")))?,
            );
        }
        crate::tensor::checked_numel(OP, &shape)?;
        let tiled = self.with_layout(Layout::new(big_shape, big_strides, self.layout().offset()));
        // The row-major copy of [r0, n0, r1, n1, ...] is the result's data
        // (possibly `self`'s own storage at an offset, when nothing repeats).
        let data = tiled.contiguous()?;
        let layout = Layout::new(
            shape.clone(),
            crate::contiguous_strides(&shape),
            data.layout().offset(),
        );
        Ok(data.with_layout(layout))
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::naive::{ravel, unravel};
    use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
    use crate::{bf16, Element, Error};

    fn repeat_matches<T: Element>() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[3], &[2]),
            (&[3], &[2, 1, 3]),
            (&[2, 3], &[1, 1]),
            (&[2, 3], &[3, 2]),
            (&[2, 3, 4], &[2, 1, 2]),
            (&[2, 3], &[0, 2]),
            (&[2, 0], &[2, 3]),
            (&[], &[2, 3]),
        ];
        for (s, &(shape, reps)) in cases.iter().enumerate() {
            let v = rand_f64(s as u64, shape.iter().product());
            let vals = values_f64(&tensor_of::<T>(&v, shape));
            let lead = reps.len() - shape.len();
            let full: Vec<usize> = (0..reps.len())
                .map(|k| if k < lead { 1 } else { shape[k - lead] })
                .collect();
            let out_shape: Vec<usize> = full.iter().zip(reps).map(|(n, r)| n * r).collect();
            let want: Vec<f64> = (0..out_shape.iter().product())
                .map(|lin| {
                    let i: Vec<usize> = unravel(lin, &out_shape)
                        .iter()
                        .zip(&full)
                        .map(|(j, n)| j % n)
                        .collect();
                    vals[ravel(&i[lead..], shape)]
                })
                .collect();
            for t in layouts_of::<T>(&v, shape) {
                let got = t.repeat(reps).unwrap();
                assert_eq!(got.shape(), &out_shape[..]);
                assert!(got.is_contiguous());
                assert_eq!(values_f64(&got), want, "{t:?} {reps:?}");
            }
        }
    }

    #[test]
    fn repeat_matches_naive() {
        repeat_matches::<f32>();
        repeat_matches::<f64>();
        repeat_matches::<bf16>();
        repeat_matches::<i64>();
        repeat_matches::<bool>();
    }

    #[test]
    fn repeat_errors() {
        let t = tensor_of::<f32>(&rand_f64(1, 6), &[2, 3]);
        let e = t.repeat(&[2]).unwrap_err();
        assert!(matches!(e, Error::Arg { op: "repeat", .. }), "{e}");
        assert!(e.to_string().contains("[2, 3]"), "{e}");
        assert!(t.repeat(&[usize::MAX, 2]).is_err());
        assert!(t.repeat(&[usize::MAX / 4, 1, 1]).is_err());
    }
}
