//! Helpers for the crate's unit tests: deterministic random data and the same
//! values under many different layouts, so every kernel is tested on
//! non-contiguous, transposed, flipped and offset views, not only on fresh
//! contiguous buffers.

use crate::{Element, Tensor};

/// `n` deterministic pseudo-random values in [-1, 1) from `seed` (SplitMix64;
/// independent of the tensor RNG so tests of that RNG stay independent).
pub fn rand_f64(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// A tensor of `shape` holding `values` (row-major) converted to `T`.
pub fn tensor_of<T: Element>(values: &[f64], shape: &[usize]) -> Tensor {
    let v: Vec<T> = values.iter().map(|&x| T::from_f64(x)).collect();
    Tensor::from_vec(v, shape).expect("test shape matches values")
}

/// The same logical tensor (`values` in row-major order, `shape`) under
/// several layouts: contiguous; offset inside a larger buffer; every other
/// element of an interleaved buffer (stride 2); the last two dims stored
/// transposed; every dim stored reversed (negative strides). All compare
/// equal element by element.
pub fn layouts_of<T: Element>(values: &[f64], shape: &[usize]) -> Vec<Tensor> {
    let n: usize = shape.iter().product();
    assert_eq!(values.len(), n);
    let nd = shape.len();
    let mut out = vec![tensor_of::<T>(values, shape)];

    // Offset: prepend 3 junk elements, then narrow the flat buffer.
    let mut padded = vec![9.0; 3];
    padded.extend_from_slice(values);
    let flat = tensor_of::<T>(&padded, &[n + 3]);
    out.push(flat.narrow(0, 3, n).unwrap().reshape(shape).unwrap());

    // Stride 2 in the last dim: interleave with junk.
    if nd > 0 {
        let mut inter = Vec::with_capacity(2 * n);
        for &v in values {
            inter.push(v);
            inter.push(-7.0);
        }
        let mut big = shape.to_vec();
        big[nd - 1] *= 2;
        let t = tensor_of::<T>(&inter, &big);
        out.push(t.slice(-1, 0, big[nd - 1], 2).unwrap());
    }

    // Last two dims stored transposed, then transposed back.
    if nd >= 2 {
        let src = tensor_of::<T>(values, shape);
        let stored = src.transpose(-1, -2).unwrap().contiguous().unwrap();
        out.push(stored.transpose(-1, -2).unwrap());
    }

    // Every dim stored reversed, then flipped back.
    if nd > 0 {
        let dims: Vec<isize> = (0..nd as isize).collect();
        let stored = tensor_of::<T>(values, shape)
            .flip(&dims)
            .unwrap()
            .contiguous()
            .unwrap();
        out.push(stored.flip(&dims).unwrap());
    }
    out
}

/// The tensor's values as f64, row-major, whatever its dtype.
pub fn values_f64(t: &Tensor) -> Vec<f64> {
    crate::with_dtype!(t.dtype(), T => t.to_vec::<T>().unwrap().into_iter().map(|x| x.to_f64()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_holds_the_same_values() {
        let shape = [2, 3, 4];
        let v = rand_f64(1, 24);
        for t in layouts_of::<f64>(&v, &shape) {
            assert_eq!(t.shape(), &shape);
            assert_eq!(values_f64(&t), v, "{t:?}");
        }
        assert!(
            layouts_of::<f32>(&v, &shape)
                .iter()
                .filter(|t| !t.is_contiguous())
                .count()
                >= 3
        );
    }
}
