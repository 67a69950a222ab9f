//! [`Collate`]: how a list of samples becomes one batch. Samples are copied
//! once, straight into the batch buffer of a fresh contiguous tensor.

use tessera_tensor::{with_dtype, Element, Tensor};

use crate::{Array, Error, Image, Result};

/// A sample type that can be stacked into a batch (PyTorch's
/// `default_collate`). Tuples collate field by field; implement this trait
/// for your own sample structs the same way.
pub trait Collate: Sized + Send + 'static {
    /// The batched form.
    type Batch: Send + 'static;

    /// Stacks `items` along a new leading dimension. Errors when their
    /// shapes or dtypes differ, or (for tensors) when `items` is empty.
    fn collate(items: Vec<Self>) -> Result<Self::Batch>;
}

/// Tensors of one shape and dtype → one tensor `[B, ...shape]`.
impl Collate for Tensor {
    type Batch = Tensor;
    fn collate(items: Vec<Tensor>) -> Result<Tensor> {
        let first = items
            .first()
            .ok_or_else(|| Error::arg("collate", "cannot stack an empty list of tensors"))?;
        let (shape, dtype) = (first.shape().to_vec(), first.dtype());
        for (k, t) in items.iter().enumerate() {
            if t.shape() != shape.as_slice() || t.dtype() != dtype {
                return Err(Error::arg(
                    "collate",
                    format!(
                        "sample {k} is {} {:?} but sample 0 is {dtype} {shape:?}",
                        t.dtype(),
                        t.shape()
                    ),
                ));
            }
        }
        let per = first.numel();
        let mut out_shape = vec![items.len()];
        out_shape.extend_from_slice(&shape);
        let contiguous = items
            .iter()
            .map(Tensor::contiguous)
            .collect::<tessera_tensor::Result<Vec<Tensor>>>()?;
        with_dtype!(dtype, T => stack_slices::<T>(&out_shape, per, &contiguous))
    }
}

fn stack_slices<T: Element>(shape: &[usize], per: usize, items: &[Tensor]) -> Result<Tensor> {
    let mut slices = Vec::with_capacity(items.len());
    for t in items {
        slices.push(t.as_slice::<T>()?);
    }
    Ok(Tensor::build::<T>("collate", shape, |out| {
        for (dst, src) in out.chunks_exact_mut(per.max(1)).zip(&slices) {
            dst.copy_from_slice(src);
        }
    })?)
}

/// Images of one size → a u8 tensor `[B, H, W, C]` (NHWC; permute for NCHW).
impl Collate for Image {
    type Batch = Tensor;
    fn collate(items: Vec<Image>) -> Result<Tensor> {
        let shape = items.first().map_or([0, 0, 0], Image::shape);
        for (k, im) in items.iter().enumerate() {
            if im.shape() != shape {
                return Err(Error::arg(
                    "collate",
                    format!("image {k} is {:?} (HWC) but image 0 is {shape:?}", im.shape()),
                ));
            }
        }
        let per: usize = shape.iter().product();
        Ok(Tensor::build::<u8>(
            "collate",
            &[items.len(), shape[0], shape[1], shape[2]],
            |out| {
                for (dst, im) in out.chunks_exact_mut(per.max(1)).zip(&items) {
                    dst.copy_from_slice(im.data());
                }
            },
        )?)
    }
}

/// Arrays of one shape → a tensor `[B, ...shape]` of their element type.
impl<T: Element> Collate for Array<T> {
    type Batch = Tensor;
    fn collate(items: Vec<Array<T>>) -> Result<Tensor> {
        let shape = items.first().map_or_else(Vec::new, |a| a.shape.clone());
        for (k, a) in items.iter().enumerate() {
            if a.shape != shape {
                return Err(Error::arg(
                    "collate",
                    format!("array {k} has shape {:?} but array 0 has {shape:?}", a.shape),
                ));
            }
        }
        let per: usize = shape.iter().product();
        let mut out_shape = vec![items.len()];
        out_shape.extend_from_slice(&shape);
        Ok(Tensor::build::<T>("collate", &out_shape, |out| {
            for (dst, a) in out.chunks_exact_mut(per.max(1)).zip(&items) {
                dst.copy_from_slice(&a.data);
            }
        })?)
    }
}

macro_rules! scalar_collate {
    ($($t:ty),*) => {$(
        /// Scalars → a 1-d tensor `[B]` of the same element type.
        impl Collate for $t {
            type Batch = Tensor;
            fn collate(items: Vec<$t>) -> Result<Tensor> {
                let n = items.len();
                Ok(Tensor::from_vec(items, &[n])?)
            }
        }
    )*};
}
scalar_collate!(i64, f32, f64, u8, u32);

/// A list of tensors per sample (a [`crate::TensorDataset`] sample) → one
/// stacked tensor per position. Errors when the lists differ in length.
impl Collate for Vec<Tensor> {
    type Batch = Vec<Tensor>;
    fn collate(items: Vec<Vec<Tensor>>) -> Result<Vec<Tensor>> {
        let width = items.first().map_or(0, Vec::len);
        let mut columns: Vec<Vec<Tensor>> = (0..width).map(|_| Vec::with_capacity(items.len())).collect();
        for (k, row) in items.into_iter().enumerate() {
            if row.len() != width {
                return Err(Error::arg(
                    "collate",
                    format!("sample {k} has {} tensors but sample 0 has {width}", row.len()),
                ));
            }
            for (col, t) in columns.iter_mut().zip(row) {
                col.push(t);
            }
        }
        columns.into_iter().map(Tensor::collate).collect()
    }
}

macro_rules! tuple_collate {
    ($($name:ident $v:ident),+) => {
        /// Tuples collate field by field.
        impl<$($name: Collate),+> Collate for ($($name,)+) {
            type Batch = ($($name::Batch,)+);
            fn collate(items: Vec<Self>) -> Result<Self::Batch> {
                $(let mut $v = Vec::with_capacity(items.len());)+
                for ($($name,)+) in items {
                    $($v.push($name);)+
                }
                Ok(($($name::collate($v)?,)+))
            }
        }
    };
}
#[allow(non_snake_case)]
mod tuples {
    use super::*;
    tuple_collate!(A a);
    tuple_collate!(A a, B b);
    tuple_collate!(A a, B b, C c);
    tuple_collate!(A a, B b, C c, D d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_images_labels_and_tensors() {
        let imgs = vec![Image::filled(2, 2, 1, 3), Image::filled(2, 2, 1, 5)];
        let (x, y) = <(Image, i64)>::collate(imgs.into_iter().zip([4i64, 6]).collect()).unwrap();
        assert_eq!(x.shape(), &[2, 2, 2, 1]);
        assert_eq!(x.to_vec::<u8>().unwrap(), vec![3, 3, 3, 3, 5, 5, 5, 5]);
        assert_eq!(y.to_vec::<i64>().unwrap(), vec![4, 6]);

        let base = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[2, 3]).unwrap();
        let t = base.t().unwrap(); // non-contiguous view
        let s = Tensor::collate(vec![t.clone(), t]).unwrap();
        assert_eq!(s.shape(), &[2, 3, 2]);
        assert_eq!(&s.to_vec::<f32>().unwrap()[..6], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn mismatches_are_errors() {
        let a = Tensor::from_vec(vec![1f32, 2.0], &[2]).unwrap();
        let b = Tensor::from_vec(vec![1f32, 2.0, 3.0], &[3]).unwrap();
        assert!(Tensor::collate(vec![a.clone(), b]).is_err());
        let c = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
        assert!(Tensor::collate(vec![a, c]).is_err());
        assert!(Tensor::collate(vec![]).is_err());
        assert!(Image::collate(vec![Image::filled(1, 1, 1, 0), Image::filled(1, 2, 1, 0)]).is_err());
    }
}
