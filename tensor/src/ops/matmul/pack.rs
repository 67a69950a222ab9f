//! Packing of GEMM operands into the panel order the micro-kernel reads.
//!
//! The packers read any strided operand (transposed, negative or zero
//! strides, an offset view) straight from its storage and convert to the
//! math type on the way (f16/bf16 → f32), so no operand is copied first.

use rayon::prelude::*;

use super::kernel::GemmScalar;
use crate::FloatElement;

/// A read-only strided matrix: element `(i, j)` is
/// `data[off + i*rs + j*cs]`. Every index the driver forms must be in bounds;
/// callers build it from a valid [`crate::Layout`].
#[derive(Clone, Copy)]
pub struct MatRef<'a, S> {
    /// The storage.
    pub data: &'a [S],
    /// Index of element (0, 0).
    pub off: usize,
    /// Row stride, in elements.
    pub rs: isize,
    /// Column stride, in elements.
    pub cs: isize,
}

impl<S> MatRef<'_, S> {
    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> usize {
        (self.off as isize + i as isize * self.rs + j as isize * self.cs) as usize
    }
}

/// A 64-byte aligned, zero-initialised buffer of `len` math-type elements.
pub struct AlignedBuf<T> {
    raw: Vec<Align64>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Align64([u8; 64]);

impl<T: GemmScalar> AlignedBuf<T> {
    /// A buffer of `len` zeros.
    pub fn new(len: usize) -> Self {
        let blocks = (len * std::mem::size_of::<T>()).div_ceil(64);
        AlignedBuf {
            raw: vec![Align64([0; 64]); blocks],
            len,
            _t: std::marker::PhantomData,
        }
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        &bytemuck::cast_slice(&self.raw)[..self.len]
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.raw)[..self.len]
    }
}

/// Packs rows `0 .. m`, depth `p0 .. p0 + kc` of `a` into `dst` as
/// `ceil(m/mr)` micro-panels of `mr×kc` (element `(p, i)` of panel `r` at
/// `r*mr*kc + p*mr + i`), zero-padding the last panel's missing rows.
pub fn pack_a<S: FloatElement>(
    dst: &mut [S::Math],
    a: &MatRef<S>,
    m: usize,
    p0: usize,
    kc: usize,
    mr: usize,
    par: bool,
) where
    S::Math: GemmScalar,
{
    let panel = |(r, out): (usize, &mut [S::Math])| {
        let i0 = r * mr;
        let rows = mr.min(m - i0);
        if a.cs == 1 && a.rs != 1 {
            // Rows are contiguous: read each row once, scatter by mr.
            for i in 0..rows {
                let base = a.at(i0 + i, p0);
                for (p, &x) in a.data[base..base + kc].iter().enumerate() {
                    out[p * mr + i] = x.to_math();
                }
            }
            for p in 0..kc {
                out[p * mr + rows..(p + 1) * mr].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        } else {
            for p in 0..kc {
                let dst = &mut out[p * mr..(p + 1) * mr];
                for (i, d) in dst[..rows].iter_mut().enumerate() {
                    *d = a.data[a.at(i0 + i, p0 + p)].to_math();
                }
                dst[rows..].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        }
    };
    let dst = &mut dst[..m.div_ceil(mr) * mr * kc];
    if par {
        dst.par_chunks_mut(mr * kc).enumerate().for_each(panel);
    } else {
        dst.chunks_mut(mr * kc).enumerate().for_each(panel);
    }
}

/// Packs depth `p0 .. p0 + kc`, columns `j0 .. j0 + n` of `b` into `dst` as
/// `ceil(n/nr)` micro-panels of `kc×nr` (element `(p, j)` of panel `q` at
/// `q*nr*kc + p*nr + j`), zero-padding the last panel's missing columns.
#[allow(clippy::too_many_arguments)]
pub fn pack_b<S: FloatElement>(
    dst: &mut [S::Math],
    b: &MatRef<S>,
    p0: usize,
    kc: usize,
    j0: usize,
    n: usize,
    nr: usize,
    par: bool,
) where
    S::Math: GemmScalar,
{
    let panel = |(q, out): (usize, &mut [S::Math])| {
        let jq = j0 + q * nr;
        let cols = nr.min(j0 + n - jq);
        if b.rs == 1 && b.cs != 1 {
            // Columns are contiguous (a transposed operand): read each once.
            for j in 0..cols {
                let base = b.at(p0, jq + j);
                for (p, &x) in b.data[base..base + kc].iter().enumerate() {
                    out[p * nr + j] = x.to_math();
                }
            }
            for p in 0..kc {
                out[p * nr + cols..(p + 1) * nr].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        } else {
            for p in 0..kc {
                let dst = &mut out[p * nr..(p + 1) * nr];
                if b.cs == 1 {
                    let base = b.at(p0 + p, jq);
                    for (d, &x) in dst[..cols].iter_mut().zip(&b.data[base..base + cols]) {
                        *d = x.to_math();
                    }
                } else {
                    for (j, d) in dst[..cols].iter_mut().enumerate() {
                        *d = b.data[b.at(p0 + p, jq + j)].to_math();
                    }
                }
                dst[cols..].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        }
    };
    let dst = &mut dst[..n.div_ceil(nr) * nr * kc];
    if par {
        dst.par_chunks_mut(nr * kc).enumerate().for_each(panel);
    } else {
        dst.chunks_mut(nr * kc).enumerate().for_each(panel);
    }
}
