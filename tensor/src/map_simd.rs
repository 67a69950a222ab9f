//! The f32 elementwise engine on the SIMD row kernels: unary maps, binary
//! ops with broadcasting (a broadcast row, column or scalar is read in place,
//! never materialised), and scalar operands.
//!
//! When every operand that is not broadcast stores its dims in the same
//! non-row-major order (two transposed tensors, say), the engine walks them
//! in that memory order and the result takes their layout, as PyTorch's
//! TensorIterator does: contiguous rows instead of strided ones.

use crate::backend::{BinaryOp, UnaryOp};
use crate::layout::broadcast_shapes;
use crate::simd::kernels;
use crate::simd::Level;
use crate::strided::{fill_rows, map_run};
use crate::{Layout, Result, Tensor};

/// Elements gathered per batch when a row is strided.
const GATHER: usize = 256;

/// `op` applied to every element of the f32 tensor `t`; errors, naming
/// `name`, when memory is out.
pub(crate) fn unary_f32(name: &'static str, t: &Tensor, op: UnaryOp) -> Result<Tensor> {
    let level = Level::best();
    let src = t.storage().as_slice::<f32>();
    in_memory_order(t.shape(), &[t.layout().clone()], |shape, ls| {
        Tensor::build_overwrite::<f32>(name, shape, |out| {
            fill_rows(out, [&ls[0]], |o, [off], [st]| {
                map_run(src, off, st, o, |x, y| kernels::unary(level, op, x, y))
            })
        })
    })
}

/// `a op b` for f32 tensors, broadcasting. Errors, naming `name`, when the
/// shapes do not broadcast or the devices differ.
pub(crate) fn binary_f32(a: &Tensor, b: &Tensor, name: &'static str, op: BinaryOp) -> Result<Tensor> {
    a.device().same_as(b.device(), name)?;
    let shape = broadcast_shapes(name, a.shape(), b.shape())?;
    let layouts = [a.layout().broadcast_to(&shape)?, b.layout().broadcast_to(&shape)?];
    let level = Level::best();
    let (sa, sb) = (a.storage().as_slice::<f32>(), b.storage().as_slice::<f32>());
    in_memory_order(&shape, &layouts, |shape, ls| {
        Tensor::build_overwrite::<f32>(name, shape, |out| {
            fill_rows(out, [&ls[0], &ls[1]], |o, [oa, ob], [ta, tb]| {
                let n = o.len();
                match (ta, tb) {
                    (1, 1) => kernels::binary(level, op, &sa[oa..oa + n], &sb[ob..ob + n], o),
                    (1, 0) => kernels::binary_scalar(level, op, &sa[oa..oa + n], sb[ob], false, o),
                    (0, 1) => kernels::binary_scalar(level, op, &sb[ob..ob + n], sa[oa], true, o),
                    _ => {
                        let (mut ga, mut gb) = ([0.0f32; GATHER], [0.0f32; GATHER]);
                        let (mut pa, mut pb) = (oa as isize, ob as isize);
                        for part in o.chunks_mut(GATHER) {
                            for (x, y) in ga.iter_mut().zip(gb.iter_mut()).take(part.len()) {
                                (*x, *y) = (sa[pa as usize], sb[pb as usize]);
                                pa += ta;
                                pb += tb;
                            }
                            let m = part.len();
                            kernels::binary(level, op, &ga[..m], &gb[..m], part);
                        }
                    }
                }
            })
        })
    })
}

/// `t op s` (or `s op t` with `scalar_first`) for an f32 tensor and scalar.
/// Errors, naming `name`, when memory is out.
pub(crate) fn scalar_f32(
    name: &'static str,
    t: &Tensor,
    s: f32,
    op: BinaryOp,
    scalar_first: bool,
) -> Result<Tensor> {
    let level = Level::best();
    let src = t.storage().as_slice::<f32>();
    in_memory_order(t.shape(), &[t.layout().clone()], |shape, ls| {
        Tensor::build_overwrite::<f32>(name, shape, |out| {
            fill_rows(out, [&ls[0]], |o, [off], [st]| {
                if st == 1 {
                    kernels::binary_scalar(level, op, &src[off..off + o.len()], s, scalar_first, o);
                } else {
                    let mut buf = [0.0f32; GATHER];
                    let mut p = off as isize;
                    for part in o.chunks_mut(GATHER) {
                        for b in buf.iter_mut().take(part.len()) {
                            *b = src[p as usize];
                            p += st;
                        }
                        kernels::binary_scalar(level, op, &buf[..part.len()], s, scalar_first, part);
                    }
                }
            })
        })
    })
}

/// Runs `build(shape, layouts)` either as given or, when the operands share
/// a non-row-major memory order, on the dims permuted into that order, and
/// returns the result seen in the original dim order.
fn in_memory_order<const N: usize>(
    shape: &[usize],
    layouts: &[Layout; N],
    build: impl FnOnce(&[usize], &[Layout; N]) -> Result<Tensor>,
) -> Result<Tensor> {
    let Some(perm) = memory_order(shape, layouts) else {
        return build(shape, layouts);
    };
    let dims: Vec<isize> = perm.iter().map(|&d| d as isize).collect();
    let permuted: [Layout; N] =
        std::array::from_fn(|k| layouts[k].permute(&dims).expect("a permutation of the dims"));
    let pshape: Vec<usize> = perm.iter().map(|&d| shape[d]).collect();
    let mut inverse = vec![0isize; perm.len()];
    for (k, &d) in perm.iter().enumerate() {
        inverse[d] = k as isize;
    }
    Ok(build(&pshape, &permuted)?
        .permute(&inverse)
        .expect("the inverse permutation"))
}

/// The dims of `shape` ordered by decreasing stride of the first operand
/// that is not broadcast, when that order is not row-major and every
/// operand's non-broadcast strides are positive and decrease in it.
fn memory_order<const N: usize>(shape: &[usize], layouts: &[Layout; N]) -> Option<Vec<usize>> {
    let live = |l: &Layout, d: usize| shape[d] > 1 && l.strides()[d] != 0;
    let reference = layouts
        .iter()
        .find(|l| (0..shape.len()).all(|d| shape[d] <= 1 || l.strides()[d] > 0))?;
    let mut perm: Vec<usize> = (0..shape.len()).collect();
    // Size-1 dims sort last; they carry no elements.
    perm.sort_by_key(|&d| std::cmp::Reverse(if shape[d] > 1 { reference.strides()[d] } else { 0 }));
    let identity = (0..shape.len()).filter(|&d| shape[d] > 1).collect::<Vec<_>>()
        == perm.iter().copied().filter(|&d| shape[d] > 1).collect::<Vec<_>>();
    if identity {
        return None;
    }
    for l in layouts {
        let strides: Vec<isize> = perm
            .iter()
            .filter(|&&d| live(l, d))
            .map(|&d| l.strides()[d])
            .collect();
        if strides.iter().any(|&s| s <= 0) || strides.windows(2).any(|w| w[0] <= w[1]) {
            return None;
        }
    }
    Some(perm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{layouts_of, rand_f64, values_f64};

    #[test]
    fn binary_ops_match_the_scalar_engine_on_every_layout_and_broadcast() {
        let shapes: [(&[usize], &[usize]); 6] = [
            (&[4, 37], &[4, 37]),
            (&[4, 37], &[37]),
            (&[4, 37], &[4, 1]),
            (&[4, 37], &[]),
            (&[3, 1, 5], &[1, 4, 5]),
            (&[0, 3], &[3]),
        ];
        for (sa, sb) in shapes {
            let va = rand_f64(1, sa.iter().product());
            let vb: Vec<f64> = rand_f64(2, sb.iter().product()).iter().map(|v| v + 2.0).collect();
            for a in layouts_of::<f32>(&va, sa) {
                for b in layouts_of::<f32>(&vb, sb) {
                    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
                        let got = binary_f32(&a, &b, "op", op).unwrap();
                        let want = a
                            .zip_map::<f32, f32, f32>(&b, "op", |x, y| kernels::binary_scalar_op(op, x, y))
                            .unwrap();
                        assert_eq!(got.shape(), want.shape());
                        assert_eq!(values_f64(&got), values_f64(&want), "{op:?} {sa:?} {sb:?}");
                        let got = binary_f32(&b, &a, "op", op).unwrap();
                        let want = b
                            .zip_map::<f32, f32, f32>(&a, "op", |x, y| kernels::binary_scalar_op(op, x, y))
                            .unwrap();
                        assert_eq!(values_f64(&got), values_f64(&want), "{op:?} {sb:?} {sa:?}");
                    }
                }
            }
        }
        let a = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
        assert!(binary_f32(&a, &a.t().unwrap(), "add", BinaryOp::Add).is_err());
    }

    #[test]
    fn operands_sharing_a_memory_order_are_walked_in_it() {
        let v = rand_f64(3, 64 * 48);
        let a = Tensor::from_vec(v.iter().map(|&x| x as f32).collect(), &[64, 48]).unwrap();
        let b = a.mul_scalar(3.0).unwrap();
        let (at, bt) = (a.t().unwrap(), b.t().unwrap());
        let s = binary_f32(&at, &bt, "add", BinaryOp::Add).unwrap();
        // The result takes the operands' (transposed) layout ...
        assert_eq!(s.strides(), at.strides());
        // ... and the values of the row-major walk.
        let want = at.zip_map::<f32, f32, f32>(&bt, "add", |x, y| x + y).unwrap();
        assert_eq!(values_f64(&s), values_f64(&want));
        // A broadcast bias along the transposed rows keeps that order too.
        let bias = Tensor::from_vec((0..64).map(|x| x as f32).collect(), &[64]).unwrap();
        let s = binary_f32(&at, &bias, "add", BinaryOp::Add).unwrap();
        assert_eq!(s.strides(), at.strides());
        let want = at.zip_map::<f32, f32, f32>(&bias, "add", |x, y| x + y).unwrap();
        assert_eq!(values_f64(&s), values_f64(&want));
        // Mixed orders fall back to a row-major result.
        let mixed = binary_f32(&at, &b.t().unwrap().contiguous().unwrap(), "add", BinaryOp::Add).unwrap();
        assert!(mixed.is_contiguous());
        let u = unary_f32("t", &at, UnaryOp::Exp).unwrap();
        assert_eq!(u.strides(), at.strides());
        assert_eq!(
            values_f64(&u),
            values_f64(&unary_f32("t", &at.contiguous().unwrap(), UnaryOp::Exp).unwrap())
        );
    }

    #[test]
    fn unary_and_scalar_ops_give_the_same_bits_on_every_layout() {
        let shape = [5usize, 41];
        let v: Vec<f64> = rand_f64(4, 205).iter().map(|x| x * 6.0).collect();
        let base = layouts_of::<f32>(&v, &shape)[0].clone();
        for op in [UnaryOp::Exp, UnaryOp::GeluErf, UnaryOp::Tanh, UnaryOp::Relu] {
            let want = values_f64(&unary_f32("t", &base, op).unwrap());
            for t in layouts_of::<f32>(&v, &shape) {
                assert_eq!(values_f64(&unary_f32("t", &t, op).unwrap()), want, "{op:?} {t:?}");
            }
        }
        for t in layouts_of::<f32>(&v, &shape) {
            let got = scalar_f32("t", &t, 2.0, BinaryOp::Div, true).unwrap();
            let want = t.map::<f32, f32>(|x| 2.0 / x);
            assert_eq!(values_f64(&got), values_f64(&want));
        }
    }
}
