//! `pad`: constant, reflect and replicate padding of any trailing dims.

#[cfg(feature = "cuda")]
#[path = "pad_cuda.rs"]
pub(crate) mod cuda;

use crate::ops::rows::for_each_row;
use crate::{Element, Error, Result, Tensor};

/// How [`Tensor::pad`] fills the new elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PadMode {
    /// Every new element is this value (converted to the dtype).
    Constant(f64),
    /// Mirror the elements next to the edge, not repeating the edge itself
    /// (`[a b c]` padded by 2 on the left gives `[c b a b c]`).
    Reflect,
    /// Repeat the edge element.
    Replicate,
}

impl Tensor {
    /// `self` padded along its trailing dims. `pads` holds (left, right)
    /// pairs starting from the last dim, as PyTorch's `F.pad`:
    /// `[l_last, r_last, l_prev, r_prev, ...]`. Errors when `pads` has an odd
    /// length or more than two entries per dim, when reflect padding is not
    /// smaller than its dim's size, or when replicate pads an empty dim.
    pub fn pad(&self, pads: &[usize], mode: PadMode) -> Result<Tensor> {
        const OP: &str = "pad";
        let be = crate::backend::dispatch(OP, &[self])?;
        padded_shape(self, pads, mode)?;
        be.pad(self, pads, mode)
    }
}

/// The shape of `x` padded by `pads` with `mode`. Errors as [`Tensor::pad`]
/// describes.
pub(crate) fn padded_shape(x: &Tensor, pads: &[usize], mode: PadMode) -> Result<Vec<usize>> {
    const OP: &str = "pad";
    let nd = x.ndim();
    if !pads.len().is_multiple_of(2) || pads.len() > 2 * nd {
        return Err(Error::arg(
            OP,
            format!(
                "pads {pads:?} must be (left, right) pairs for at most the {nd} dims of shape {:?}",
                x.shape()
            ),
        ));
    }
    let mut shape = Vec::with_capacity(nd);
    for (d, &n) in x.shape().iter().enumerate() {
        let (l, r) = pad_of(pads, nd, d);
        shape.push(padded_len(OP, mode, d, n, l, r)?);
    }
    crate::tensor::checked_numel(OP, &shape)?;
    Ok(shape)
}

/// The (left, right) padding of dim `d` of an `nd`-dim tensor.
pub(crate) fn pad_of(pads: &[usize], nd: usize, d: usize) -> (usize, usize) {
    let k = nd - 1 - d;
    pads.get(2 * k).map_or((0, 0), |&l| (l, pads[2 * k + 1]))
}

/// The CPU kernel of [`Tensor::pad`] (arguments checked).
pub(crate) fn cpu_pad(x: &Tensor, pads: &[usize], mode: PadMode) -> Result<Tensor> {
    const OP: &str = "pad";
    let nd = x.ndim();
    let shape = padded_shape(x, pads, mode)?;
    if nd == 0 {
        return Ok(x.clone());
    }
    let lr = |d: usize| pad_of(pads, nd, d);
    // Each map is no longer than the (now known to fit) output, or the
    // output is empty and has nothing to map.
    let maps: Vec<Vec<Option<usize>>> = if shape.contains(&0) {
        Vec::new()
    } else {
        (0..nd)
            .map(|d| source_map(mode, x.shape()[d], lr(d).0, shape[d]))
            .collect::<Result<_>>()?
    };
    if maps.is_empty() {
        return crate::with_dtype!(x.dtype(), T => Tensor::build::<T>(OP, &shape, |_| {}));
    }
    Ok(crate::with_dtype!(x.dtype(), T => {
        let value = match mode {
            PadMode::Constant(v) => T::from_f64(v),
            _ => T::ZERO,
        };
        pad_kernel::<T>(x, &maps, pads.first().copied().unwrap_or(0), &shape, value)?
    }))
}

/// The padded size of dimension `d` (size `n`, padding `l`, `r`). Errors as
/// [`Tensor::pad`] describes.
fn padded_len(op: &'static str, mode: PadMode, d: usize, n: usize, l: usize, r: usize) -> Result<usize> {
    let len = n
        .checked_add(l)
        .and_then(|x| x.checked_add(r))
        .ok_or_else(|| Error::arg(op, format!("padding ({l}, {r}) of dimension {d} overflows")))?;
    match mode {
        PadMode::Reflect if l >= n.max(1) || r >= n.max(1) => Err(Error::arg(
            op,
            format!("reflect padding ({l}, {r}) must be smaller than size {n} of dimension {d}"),
        )),
        PadMode::Replicate if n == 0 && len > 0 => Err(Error::arg(
            op,
            format!("replicate padding ({l}, {r}) needs a non-empty dimension {d}"),
        )),
        _ => Ok(len),
    }
}

/// For each of the `len` output positions along a dim of size `n` padded by
/// `l` on the left, the source position, or `None` for a constant fill.
/// Errors when memory for the map is out.
fn source_map(mode: PadMode, n: usize, l: usize, len: usize) -> Result<Vec<Option<usize>>> {
    let mut map = crate::tensor::try_vec::<Option<usize>>("pad", &[len])?;
    let (n, l) = (n as isize, l as isize);
    map.extend((0..len as isize).map(|j| {
        let s = j - l;
        if (0..n).contains(&s) {
            return Some(s as usize);
        }
        match mode {
            PadMode::Constant(_) => None,
            PadMode::Reflect => Some(if s < 0 { -s } else { 2 * (n - 1) - s } as usize),
            PadMode::Replicate => Some(s.clamp(0, n - 1) as usize),
        }
    }));
    Ok(map)
}

/// Fills `shape` row by row (last dim): a row is all `value` when an outer
/// coordinate maps to `None`, else the source row read through the last
/// dim's map, its interior (`left ..`) copied whole when the source row is
/// contiguous.
fn pad_kernel<T: Element>(
    src: &Tensor,
    maps: &[Vec<Option<usize>>],
    left: usize,
    shape: &[usize],
    value: T,
) -> Result<Tensor> {
    let s = src.storage().as_slice::<T>();
    let strides = src.strides();
    let nd = shape.len();
    let last = &maps[nd - 1];
    let st = strides[nd - 1];
    // Output positions left .. left + run of the last dim are the source row.
    let run = src.shape()[nd - 1];
    Tensor::build::<T>("pad", shape, |out| {
        for_each_row(out, shape[nd - 1], |r, row| {
            let mut rem = r;
            let mut base = Some(src.layout().offset() as isize);
            for d in (0..nd - 1).rev() {
                let j = rem % shape[d];
                rem /= shape[d];
                base = base.and_then(|b| maps[d][j].map(|i| b + i as isize * strides[d]));
            }
            let Some(base) = base else {
                row.fill(value);
                return;
            };
            let fill = |row: &mut [T], maps: &[Option<usize>]| {
                for (y, m) in row.iter_mut().zip(maps) {
                    *y = m.map_or(value, |i| s[(base + i as isize * st) as usize]);
                }
            };
            if st == 1 && run > 0 {
                let b = base as usize;
                let (head, rest) = row.split_at_mut(left);
                let (mid, tail) = rest.split_at_mut(run);
                fill(head, &last[..left]);
                mid.copy_from_slice(&s[b..b + run]);
                fill(tail, &last[left + run..]);
            } else {
                fill(row, last);
            }
        });
    })
}

#[cfg(test)]
mod tests {
    use super::PadMode;
    use crate::ops::naive::{ravel, unravel};
    use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
    use crate::{bf16, Element, Error, Tensor};

    /// The naive pad: each output coordinate mapped back dim by dim.
    fn naive(v: &[f64], shape: &[usize], pads: &[usize], mode: PadMode) -> (Vec<f64>, Vec<usize>) {
        let nd = shape.len();
        let lr = |d: usize| {
            let k = nd - 1 - d;
            pads.get(2 * k).map_or((0, 0), |&l| (l, pads[2 * k + 1]))
        };
        let out_shape: Vec<usize> = (0..nd).map(|d| shape[d] + lr(d).0 + lr(d).1).collect();
        let out = (0..out_shape.iter().product())
            .map(|lin| {
                let mut src = Vec::with_capacity(nd);
                for (d, &j) in unravel(lin, &out_shape).iter().enumerate() {
                    let n = shape[d] as i64;
                    let mut s = j as i64 - lr(d).0 as i64;
                    match mode {
                        PadMode::Constant(c) if s < 0 || s >= n => return c,
                        PadMode::Reflect if s < 0 => s = -s,
                        PadMode::Reflect if s >= n => s = 2 * n - 2 - s,
                        PadMode::Replicate => s = s.max(0).min(n - 1),
                        _ => {}
                    }
                    src.push(s as usize);
                }
                v[ravel(&src, shape)]
            })
            .collect();
        (out, out_shape)
    }

    fn pad_matches<T: Element>() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[5], &[2, 3]),
            (&[3, 4], &[1, 2]),
            (&[3, 4], &[0, 3, 2, 1]),
            (&[2, 3, 4], &[3, 1, 2, 0, 1, 1]),
            (&[2, 3, 4], &[]),
            (&[2, 1, 4], &[1, 1]),
        ];
        for (s, &(shape, pads)) in cases.iter().enumerate() {
            let v = rand_f64(s as u64, shape.iter().product());
            let vals = values_f64(&tensor_of::<T>(&v, shape));
            for mode in [
                PadMode::Constant(0.0),
                PadMode::Constant(-3.0),
                PadMode::Reflect,
                PadMode::Replicate,
            ] {
                let (want, want_shape) = naive(&vals, shape, pads, mode);
                let want: Vec<f64> = want.iter().map(|&x| T::from_f64(x).to_f64()).collect();
                for t in layouts_of::<T>(&v, shape) {
                    let got = t.pad(pads, mode).unwrap();
                    assert_eq!(got.shape(), &want_shape[..]);
                    assert_eq!(values_f64(&got), want, "{t:?} {pads:?} {mode:?}");
                }
            }
        }
    }

    #[test]
    fn pad_matches_naive() {
        pad_matches::<f32>();
        pad_matches::<f64>();
        pad_matches::<bf16>();
        pad_matches::<i64>();
        pad_matches::<bool>();
    }

    #[test]
    fn pad_like_torch_examples() {
        let t = Tensor::from_vec(vec![0.0f32, 1.0, 2.0], &[3]).unwrap();
        let run = |m| t.pad(&[2, 1], m).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(run(PadMode::Reflect), vec![2.0, 1.0, 0.0, 1.0, 2.0, 1.0]);
        assert_eq!(run(PadMode::Replicate), vec![0.0, 0.0, 0.0, 1.0, 2.0, 2.0]);
        assert_eq!(run(PadMode::Constant(9.0)), vec![9.0, 9.0, 0.0, 1.0, 2.0, 9.0]);
        let s = Tensor::scalar(1.0f32);
        assert_eq!(s.pad(&[], PadMode::Reflect).unwrap().shape(), &[] as &[usize]);
        let z = tensor_of::<f32>(&[], &[2, 0]);
        let zp = z.pad(&[1, 2], PadMode::Constant(5.0)).unwrap();
        assert_eq!(zp.to_vec::<f32>().unwrap(), vec![5.0; 6]);
        assert_eq!(z.pad(&[0, 0, 1, 0], PadMode::Replicate).unwrap().shape(), &[3, 0]);
    }

    #[test]
    fn large_pad_runs_in_parallel() {
        let shape = [64, 40, 33];
        let v = rand_f64(8, shape.iter().product());
        let pads = [2, 3, 1, 4, 5, 0];
        for mode in [PadMode::Constant(1.5), PadMode::Reflect] {
            let (want, _) = naive(&v, &shape, &pads, mode);
            for t in layouts_of::<f64>(&v, &shape) {
                assert_eq!(values_f64(&t.pad(&pads, mode).unwrap()), want);
            }
        }
    }

    #[test]
    fn pad_errors() {
        let t = tensor_of::<f32>(&rand_f64(1, 12), &[3, 4]);
        let e = t.pad(&[4, 0], PadMode::Reflect).unwrap_err().to_string();
        assert!(
            e.contains("pad") && e.contains("(4, 0)") && e.contains("size 4"),
            "{e}"
        );
        assert!(t.pad(&[0, 1, 3, 0], PadMode::Reflect).is_err());
        assert!(t.pad(&[0, 1, 2, 0], PadMode::Reflect).is_ok());
        assert!(matches!(
            t.pad(&[1], PadMode::Reflect),
            Err(Error::Arg { op: "pad", .. })
        ));
        assert!(t.pad(&[1, 1, 1, 1, 1, 1], PadMode::Constant(0.0)).is_err());
        assert!(t.pad(&[usize::MAX, 1], PadMode::Constant(0.0)).is_err());
        let z = tensor_of::<f32>(&[], &[0, 2]);
        assert!(z.pad(&[0, 0, 1, 0], PadMode::Replicate).is_err());
        assert!(z.pad(&[0, 0, 0, 0], PadMode::Reflect).is_ok());
        assert!(z.pad(&[0, 0, 1, 0], PadMode::Reflect).is_err());
    }
}
