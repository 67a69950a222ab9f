//! [`ShapeArg`]: the shape argument of `reshape`, `view` and `expand`, with
//! holes for the sizes the op fills in (PyTorch's `-1`) and no `isize`.

use std::fmt;

use crate::{Error, Result};

/// The target shape of [`crate::Tensor::reshape`], [`crate::Tensor::view`]
/// and [`crate::Tensor::expand`] (and the same methods on `Var`): a list of
/// sizes, some of which may be *holes* that the op fills in, where PyTorch
/// writes `-1`.
///
/// Every way of writing a shape converts into it:
///
/// | argument | meaning |
/// |---|---|
/// | `[2, 3]`, `&[2, 3]`, `vec![2, 3]`, `&v`, `t.shape()` | the sizes as given |
/// | `6` | the 1-D shape `[6]` |
/// | `(b, ())`, `((), 4, 4)`, `(b, h, ())` | a tuple of `usize` sizes where `()` is a hole |
/// | `vec![Some(b), None]`, `&[Option<usize>]` | a computed shape: `None` is a hole |
///
/// (Arrays of `Option` are left out so that `[]`, the 0-d shape, needs no
/// annotation.)
///
/// A hole means, for `reshape` and `view`, the size that makes the element
/// count match (at most one hole; PyTorch's `x.view(b, -1)` is
/// `x.view((b, ()))`), and for `expand`, the existing size of that dimension
/// (any number of holes, none in a new leading dimension; PyTorch's
/// `x.expand(4, -1)` is `x.expand((4, ()))`).
///
/// ```
/// use tessera_tensor::{DType, Tensor};
/// let x = Tensor::zeros(&[2, 3, 4], DType::F32)?;
/// assert_eq!(x.reshape([6, 4])?.shape(), &[6, 4]);
/// assert_eq!(x.reshape((2, ()))?.shape(), &[2, 12]);
/// assert_eq!(x.view(24)?.shape(), &[24]);
/// let row = Tensor::zeros(&[1, 4], DType::F32)?;
/// assert_eq!(row.expand((2, 3, ()))?.shape(), &[2, 3, 4]);
/// // Two holes cannot be resolved: an error naming the op and both shapes.
/// assert!(x.reshape(((), ())).is_err());
/// # Ok::<(), tessera_tensor::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ShapeArg {
    /// One entry per dimension: a size, or `None` for a hole.
    dims: Vec<Option<usize>>,
}

/// One entry of a tuple shape argument: a `usize` size, or `()` for a hole
/// (see [`ShapeArg`]).
pub trait DimArg {
    /// The size, or `None` for a hole.
    fn dim(self) -> Option<usize>;
}

impl DimArg for usize {
    fn dim(self) -> Option<usize> {
        Some(self)
    }
}

impl DimArg for () {
    fn dim(self) -> Option<usize> {
        None
    }
}

impl ShapeArg {
    /// The entries, `None` for a hole.
    pub fn dims(&self) -> &[Option<usize>] {
        &self.dims
    }

    /// The number of dimensions.
    pub fn len(&self) -> usize {
        self.dims.len()
    }

    /// True for the 0-d shape `[]`.
    pub fn is_empty(&self) -> bool {
        self.dims.is_empty()
    }

    /// The shape a tensor of shape `from` takes under `reshape`/`view` to
    /// `self`: the one hole (if any) gets the size that keeps the element
    /// count. Errors, naming `op` and both shapes, for more than one hole, a
    /// product that overflows `usize`, an element count that differs, or a
    /// hole beside a zero size (any size would fit: ambiguous, as PyTorch
    /// says).
    pub fn resolve_reshape(&self, op: &'static str, from: &[usize]) -> Result<Vec<usize>> {
        let numel = checked_product(op, from, || format!("{from:?}"))?;
        let mut holes = self.dims.iter().enumerate().filter(|(_, d)| d.is_none());
        let hole = holes.next().map(|(k, _)| k);
        if holes.next().is_some() {
            return Err(Error::arg(
                op,
                format!("shape {self:?} has more than one hole to infer (tensor of shape {from:?})"),
            ));
        }
        let known: Vec<usize> = self.dims.iter().map(|d| d.unwrap_or(1)).collect();
        let known_numel = checked_product(op, &known, || format!("{self:?}"))?;
        let mismatch = || {
            Error::shape(
                op,
                format!("shape {self:?} is invalid for a tensor of shape {from:?} ({numel} elements)"),
            )
        };
        let mut out = known;
        match hole {
            Some(k) => {
                if known_numel == 0 {
                    return Err(Error::shape(
                        op,
                        format!(
                            "shape {self:?} has a hole beside a zero size: any size fits a tensor of shape {from:?}, so the hole is ambiguous"
                        ),
                    ));
                }
                if !numel.is_multiple_of(known_numel) {
                    return Err(mismatch());
                }
                out[k] = numel / known_numel;
            }
            None if known_numel != numel => return Err(mismatch()),
            None => {}
        }
        Ok(out)
    }

    /// The shape a tensor of shape `from` takes under `expand` to `self`:
    /// each hole keeps the size of the dimension it aligns with (shapes
    /// align at their last dimension, as in broadcasting). Errors, naming
    /// `op` and both shapes, when `self` has fewer dimensions than `from`, a
    /// hole falls in a new leading dimension, or the product overflows
    /// `usize`. Whether the sizes broadcast is the caller's check.
    pub fn resolve_expand(&self, op: &'static str, from: &[usize]) -> Result<Vec<usize>> {
        let lead = self.dims.len().checked_sub(from.len()).ok_or_else(|| {
            Error::shape(
                op,
                format!("cannot expand shape {from:?} to {self:?}, which has fewer dimensions"),
            )
        })?;
        let mut out = Vec::with_capacity(self.dims.len());
        for (k, d) in self.dims.iter().enumerate() {
            out.push(match (d, k.checked_sub(lead)) {
                (Some(n), _) => *n,
                (None, Some(j)) => from[j],
                (None, None) => {
                    return Err(Error::arg(
                        op,
                        format!(
                            "shape {self:?} has a hole in dimension {k}, a new leading dimension of shape {from:?} with no size to keep"
                        ),
                    ))
                }
            });
        }
        checked_product(op, &out, || format!("{self:?}"))?;
        Ok(out)
    }
}

/// The product of `sizes`, or an error naming `op` and the shape `shown`
/// when it overflows `usize`.
fn checked_product(op: &'static str, sizes: &[usize], shown: impl Fn() -> String) -> Result<usize> {
    sizes
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .ok_or_else(|| {
            Error::arg(
                op,
                format!("shape {} has more elements than a usize can count", shown()),
            )
        })
}

/// Holes print as `_`: `[2, _]`.
impl fmt::Debug for ShapeArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (k, d) in self.dims.iter().enumerate() {
            if k > 0 {
                f.write_str(", ")?;
            }
            match d {
                Some(n) => write!(f, "{n}")?,
                None => f.write_str("_")?,
            }
        }
        f.write_str("]")
    }
}

impl From<&[usize]> for ShapeArg {
    fn from(sizes: &[usize]) -> Self {
        ShapeArg {
            dims: sizes.iter().map(|&n| Some(n)).collect(),
        }
    }
}

impl<const N: usize> From<[usize; N]> for ShapeArg {
    fn from(sizes: [usize; N]) -> Self {
        ShapeArg::from(&sizes[..])
    }
}

impl<const N: usize> From<&[usize; N]> for ShapeArg {
    fn from(sizes: &[usize; N]) -> Self {
        ShapeArg::from(&sizes[..])
    }
}

impl From<Vec<usize>> for ShapeArg {
    fn from(sizes: Vec<usize>) -> Self {
        ShapeArg::from(&sizes[..])
    }
}

impl From<&Vec<usize>> for ShapeArg {
    fn from(sizes: &Vec<usize>) -> Self {
        ShapeArg::from(&sizes[..])
    }
}

impl From<usize> for ShapeArg {
    fn from(n: usize) -> Self {
        ShapeArg { dims: vec![Some(n)] }
    }
}

impl From<&[Option<usize>]> for ShapeArg {
    fn from(dims: &[Option<usize>]) -> Self {
        ShapeArg { dims: dims.to_vec() }
    }
}

impl From<Vec<Option<usize>>> for ShapeArg {
    fn from(dims: Vec<Option<usize>>) -> Self {
        ShapeArg { dims }
    }
}

impl From<&Vec<Option<usize>>> for ShapeArg {
    fn from(dims: &Vec<Option<usize>>) -> Self {
        ShapeArg { dims: dims.clone() }
    }
}

impl From<&ShapeArg> for ShapeArg {
    fn from(shape: &ShapeArg) -> Self {
        shape.clone()
    }
}

/// `From<(A, B, ...)>` for tuples of up to six [`DimArg`]s.
macro_rules! tuple_shape {
    ($($name:ident)+) => {
        impl<$($name: DimArg),+> From<($($name,)+)> for ShapeArg {
            #[allow(non_snake_case)]
            fn from(($($name,)+): ($($name,)+)) -> Self {
                ShapeArg { dims: vec![$($name.dim()),+] }
            }
        }
    };
}

tuple_shape!(A);
tuple_shape!(A B);
tuple_shape!(A B C);
tuple_shape!(A B C D);
tuple_shape!(A B C D E);
tuple_shape!(A B C D E F);

#[cfg(test)]
#[path = "shape_arg_tests.rs"]
mod tests;
