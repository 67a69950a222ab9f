//! `pad`: constant, reflect and replicate padding of any trailing dims.

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
        let nd = self.ndim();
        if pads.len() % 2 != 0 || pads.len() > 2 * nd {
            return Err(Error::arg(
                OP,
                format!(
                    "pads {pads:?} must be (left, right) pairs for at most the {nd} dims of shape {:?}",
                    self.shape()
                ),
            ));
        }
        let mut maps = Vec::with_capacity(nd);
        let mut shape = Vec::with_capacity(nd);
        for (d, &n) in self.shape().iter().enumerate() {
            let k = nd - 1 - d;
            let (l, r) = if 2 * k < pads.len() { (pads[2 * k], pads[2 * k + 1]) } else { (0, 0) };
            let map = source_map(OP, mode, d, n, l, r)?;
            shape.push(map.len());
            maps.push(map);
        }
        if nd == 0 {
            return Ok(self.clone());
        }
        Ok(crate::with_dtype!(self.dtype(), T => {
            let value = match mode {
                PadMode::Constant(v) => T::from_f64(v),
                _ => T::ZERO,
            };
            pad_kernel::<T>(self, &maps, pads.first().copied().unwrap_or(0), &shape, value)
        }))
    }
}

/// For each output position along one dim, the source position, or `None`
/// for a constant fill. Errors as [`Tensor::pad`] describes.
fn source_map(op: &'static str, mode: PadMode, d: usize, n: usize, l: usize, r: usize) -> Result<Vec<Option<usize>>> {
    let len = n
        .checked_add(l)
        .and_then(|x| x.checked_add(r))
        .ok_or_else(|| Error::arg(op, format!("padding ({l}, {r}) of dimension {d} overflows")))?;
    match mode {
        PadMode::Reflect if l >= n.max(1) || r >= n.max(1) => {
            return Err(Error::arg(
                op,
                format!("reflect padding ({l}, {r}) must be smaller than size {n} of dimension {d}"),
            ))
        }
        PadMode::Replicate if n == 0 && l + r > 0 => {
            return Err(Error::arg(
                op,
                format!("replicate padding ({l}, {r}) needs a non-empty dimension {d}"),
            ))
        }
        _ => {}
    }
    let (n, l) = (n as isize, l as isize);
    Ok((0..len as isize)
        .map(|j| {
            let s = j - l;
            if (0..n).contains(&s) {
                return Some(s as usize);
            }
            match mode {
                PadMode::Constant(_) => None,
                PadMode::Reflect => Some(if s < 0 { -s } else { 2 * (n - 1) - s } as usize),
                PadMode::Replicate => Some(s.clamp(0, n - 1) as usize),
            }
        })
        .collect())
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
) -> Tensor {
    let s = src.storage().as_slice::<T>();
    let strides = src.strides();
    let nd = shape.len();
    let last = &maps[nd - 1];
    let st = strides[nd - 1];
    // Output positions left .. left + run of the last dim are the source row.
    let run = src.shape()[nd - 1];
    Tensor::build::<T>(shape, |out| {
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
            if st == 1 {
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
