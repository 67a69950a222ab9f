//! The ops a training step of a BN/pooling CNN needs beyond convolution, on
//! the CUDA backend (the emulated device under `cuda-emu`) against the CPU
//! over awkward views and f32/f16/bf16: comparisons, logical ops, `where`
//! and clamp (exact: the same bits); average and adaptive average pooling
//! and their gradients (the CPU's summation order: the same bits); and, in
//! f32 on the device against the CPU's f64 statistics, within tolerance:
//! var/std/logsumexp/norm, all/any, addmm, fused cross-entropy with label
//! smoothing and ignore_index, batch normalization in training and eval.
#![cfg(feature = "cuda")]

use tessera_tensor::ops::pool::{adaptive_avg_pool2d_backward, avg_pool2d_backward, Pool2dParams};
use tessera_tensor::{CrossEntropyOptions, DType, Error, Reduction, Tensor};

use super::cuda_backend::{assert_close, gpu, randn, tol, views, DEV, FLOATS};

type BinaryFn = fn(&Tensor, &Tensor) -> tessera_tensor::Result<Tensor>;
type ScalarFn = fn(&Tensor, f64) -> tessera_tensor::Result<Tensor>;

/// The tensor–tensor comparisons and logical ops.
const COMPARISONS: [(&str, BinaryFn); 9] = [
    ("eq", Tensor::eq),
    ("ne", Tensor::ne),
    ("lt", Tensor::lt),
    ("le", Tensor::le),
    ("gt", Tensor::gt),
    ("ge", Tensor::ge),
    ("logical_and", Tensor::logical_and),
    ("logical_or", Tensor::logical_or),
    ("logical_xor", Tensor::logical_xor),
];

/// The tensor–scalar comparisons.
const SCALAR_COMPARISONS: [(&str, ScalarFn); 6] = [
    ("eq_scalar", Tensor::eq_scalar),
    ("ne_scalar", Tensor::ne_scalar),
    ("lt_scalar", Tensor::lt_scalar),
    ("le_scalar", Tensor::le_scalar),
    ("gt_scalar", Tensor::gt_scalar),
    ("ge_scalar", Tensor::ge_scalar),
];

fn dev(t: &Tensor) -> Tensor {
    t.to_device(DEV).unwrap()
}

/// `x` with ties (values rounded to halves) and a NaN at element 1.
fn with_ties_and_nan(x: &Tensor) -> Tensor {
    let t = x
        .mul_scalar(2.0)
        .unwrap()
        .round()
        .unwrap()
        .div_scalar(2.0)
        .unwrap();
    let mut v = t
        .to_dtype(DType::F64)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    if v.len() > 1 {
        v[1] = f64::NAN;
    }
    Tensor::from_vec(v, x.shape())
        .unwrap()
        .to_dtype(x.dtype())
        .unwrap()
}

/// i64 comparisons (tensor–tensor broadcast, and against integral scalars
/// such as an `ignore_index`), logical ops of i64 masks, and `where` /
/// `masked_fill` of i64, f64 and bool tensors (kernels by element size) on
/// the device equal the CPU; an i64 tensor against a fractional scalar is
/// an error naming the op, never a silently different answer.
#[test]
fn integer_comparisons_and_where_of_any_dtype_equal_the_cpu() {
    if !gpu() {
        return;
    }
    let v: Vec<i64> = (0..21).map(|i| [-100, 0, 3, 7, i64::MAX, -1, 3][i % 7]).collect();
    let x = Tensor::from_vec(v, &[3, 7]).unwrap();
    let y = Tensor::from_vec(vec![3i64, 0, 7, -100, 5, i64::MAX, -1], &[1, 7]).unwrap();
    let (xd, yd) = (dev(&x), dev(&y));
    for (op, f) in COMPARISONS {
        assert_close(
            &format!("{op} i64"),
            &f(&x, &y).unwrap(),
            &f(&xd, &yd).unwrap(),
            0.0,
            0.0,
        );
    }
    for (op, f) in SCALAR_COMPARISONS {
        for s in [-100.0, 3.0, 0.0] {
            assert_close(
                &format!("{op} i64 {s}"),
                &f(&x, s).unwrap(),
                &f(&xd, s).unwrap(),
                0.0,
                0.0,
            );
        }
    }
    let err = xd.ne_scalar(0.5).unwrap_err().to_string();
    assert!(err.contains("ne_scalar") && err.contains("0.5"), "{err}");
    let m = x.ne_scalar(-100.0).unwrap();
    let md = dev(&m);
    assert_close(
        "logical_not i64",
        &x.logical_not().unwrap(),
        &xd.logical_not().unwrap(),
        0.0,
        0.0,
    );
    assert_close(
        "where i64",
        &Tensor::where_(&m, &x, &y).unwrap(),
        &Tensor::where_(&md, &xd, &yd).unwrap(),
        0.0,
        0.0,
    );
    assert_close(
        "masked_fill i64",
        &x.masked_fill(&m.logical_not().unwrap(), 0.0).unwrap(),
        &xd.masked_fill(&md.logical_not().unwrap(), 0.0).unwrap(),
        0.0,
        0.0,
    );
    for dtype in [DType::F64, DType::Bool, DType::U8, DType::U32] {
        let a = x.to_dtype(dtype).unwrap();
        let b = y.to_dtype(dtype).unwrap();
        assert_close(
            &format!("where {dtype}"),
            &Tensor::where_(&m, &a, &b).unwrap(),
            &Tensor::where_(&md, &dev(&a), &dev(&b)).unwrap(),
            0.0,
            0.0,
        );
    }
}

#[test]
fn comparisons_logical_ops_where_and_clamp_equal_the_cpu() {
    if !gpu() {
        return;
    }
    for dtype in FLOATS {
        for (name, x) in views(&[3, 7], dtype, 3) {
            let x = with_ties_and_nan(&x);
            // A broadcast operand [1, 7] sharing some values with x.
            let y = with_ties_and_nan(&randn(&[1, 7], dtype, 9));
            let (xd, yd) = (dev(&x), dev(&y));
            let what = |op: &str| format!("{op} {dtype} {name}");
            for (op, f) in COMPARISONS {
                assert_close(&what(op), &f(&x, &y).unwrap(), &f(&xd, &yd).unwrap(), 0.0, 0.0);
            }
            for (op, f) in SCALAR_COMPARISONS {
                assert_close(&what(op), &f(&x, 0.5).unwrap(), &f(&xd, 0.5).unwrap(), 0.0, 0.0);
            }
            assert_close(
                &what("logical_not"),
                &x.logical_not().unwrap(),
                &xd.logical_not().unwrap(),
                0.0,
                0.0,
            );
            // Mixed dtypes: a bool mask with a float tensor.
            let (m, md) = (x.gt_scalar(0.0).unwrap(), xd.gt_scalar(0.0).unwrap());
            assert_close(
                &what("and mixed"),
                &m.logical_and(&y).unwrap(),
                &md.logical_and(&yd).unwrap(),
                0.0,
                0.0,
            );
            assert_close(
                &what("not bool"),
                &m.logical_not().unwrap(),
                &md.logical_not().unwrap(),
                0.0,
                0.0,
            );
            assert_close(
                &what("where"),
                &Tensor::where_(&m, &x, &y).unwrap(),
                &Tensor::where_(&md, &xd, &yd).unwrap(),
                0.0,
                0.0,
            );
            for (lo, hi) in [
                (Some(-0.5), Some(0.7)),
                (None, Some(0.1)),
                (Some(0.2), None),
                (Some(1.0), Some(-1.0)),
            ] {
                assert_close(
                    &what(&format!("clamp {lo:?} {hi:?}")),
                    &x.clamp(lo, hi).unwrap(),
                    &xd.clamp(lo, hi).unwrap(),
                    0.0,
                    0.0,
                );
            }
        }
    }
    // where with a non-bool condition is a named error on the device too.
    let x = dev(&randn(&[4], DType::F32, 1));
    let e = Tensor::where_(&x, &x, &x).unwrap_err();
    assert!(matches!(e, Error::DType { .. }), "{e}");
}

#[test]
fn statistics_reductions_equal_the_cpu_within_f32() {
    if !gpu() {
        return;
    }
    let dims: [&[isize]; 4] = [&[1], &[0, 2], &[], &[-1]];
    for dtype in FLOATS {
        let t = tol(dtype).max(2e-5);
        for (name, x) in views(&[3, 4, 5], dtype, 5) {
            let xd = dev(&x);
            for d in dims {
                for keep in [false, true] {
                    let what = |op: &str| format!("{op} {dtype} {name} dims {d:?} keepdim {keep}");
                    assert_close(
                        &what("var"),
                        &x.var(d, 1.0, keep).unwrap(),
                        &xd.var(d, 1.0, keep).unwrap(),
                        t,
                        0.0,
                    );
                    assert_close(
                        &what("std"),
                        &x.std(d, 0.0, keep).unwrap(),
                        &xd.std(d, 0.0, keep).unwrap(),
                        t,
                        0.0,
                    );
                    let (v, m) = x.var_mean(d, 1.0, keep).unwrap();
                    let (vd, md) = xd.var_mean(d, 1.0, keep).unwrap();
                    assert_close(&what("var_mean var"), &v, &vd, t, 0.0);
                    assert_close(&what("var_mean mean"), &m, &md, t, 1.0);
                    assert_close(
                        &what("logsumexp"),
                        &x.logsumexp(d, keep).unwrap(),
                        &xd.logsumexp(d, keep).unwrap(),
                        t,
                        1.0,
                    );
                    for p in [0.0, 1.0, 2.0, 3.0, f64::INFINITY, f64::NEG_INFINITY] {
                        assert_close(
                            &what(&format!("norm p {p}")),
                            &x.norm(p, d, keep).unwrap(),
                            &xd.norm(p, d, keep).unwrap(),
                            t,
                            0.0,
                        );
                    }
                }
            }
        }
    }
    // log-sum-exp of rows of −inf, of +inf and with a NaN; var of one element.
    let inf = f64::INFINITY;
    let x = Tensor::from_vec(vec![-inf, -inf, 1.0, inf, 2.0, f64::NAN], &[3, 2])
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    assert_close(
        "logsumexp inf",
        &x.logsumexp(&[1], false).unwrap(),
        &dev(&x).logsumexp(&[1], false).unwrap(),
        0.0,
        0.0,
    );
    let one = randn(&[1, 3], DType::F32, 2);
    assert_close(
        "var of 1",
        &one.var(&[0], 1.0, false).unwrap(),
        &dev(&one).var(&[0], 1.0, false).unwrap(),
        0.0,
        0.0,
    );
    // The ±inf norm of nothing is an error on both.
    let empty = dev(&Tensor::zeros(&[0, 3], DType::F32).unwrap());
    assert!(empty.norm(f64::INFINITY, &[0], false).is_err());
}

#[test]
fn all_and_any_equal_the_cpu() {
    if !gpu() {
        return;
    }
    let v = vec![0.0, 1.0, f64::NAN, 0.0, 0.0, 0.0, 2.0, -1.0, 3.0, 0.0, 0.0, 5.0];
    let x = Tensor::from_vec(v, &[3, 4]).unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::Bool] {
        let x = x.to_dtype(dtype).unwrap();
        for (name, x) in [("contiguous", x.clone()), ("transposed", x.t().unwrap())] {
            let xd = dev(&x);
            for d in [&[0isize][..], &[1], &[]] {
                for keep in [false, true] {
                    let what = format!("{dtype} {name} dims {d:?} keepdim {keep}");
                    assert_close(
                        &format!("all {what}"),
                        &x.all(d, keep).unwrap(),
                        &xd.all(d, keep).unwrap(),
                        0.0,
                        0.0,
                    );
                    assert_close(
                        &format!("any {what}"),
                        &x.any(d, keep).unwrap(),
                        &xd.any(d, keep).unwrap(),
                        0.0,
                        0.0,
                    );
                }
            }
        }
    }
    let empty = Tensor::zeros(&[0, 2], DType::F32).unwrap();
    assert_close(
        "all empty",
        &empty.all(&[0], false).unwrap(),
        &dev(&empty).all(&[0], false).unwrap(),
        0.0,
        0.0,
    );
    assert_close(
        "any empty",
        &empty.any(&[0], false).unwrap(),
        &dev(&empty).any(&[0], false).unwrap(),
        0.0,
        0.0,
    );
}

#[test]
fn addmm_equals_the_cpu() {
    if !gpu() {
        return;
    }
    let (a, b) = (randn(&[5, 7], DType::F32, 1), randn(&[7, 3], DType::F32, 2));
    for (i, c) in [randn(&[5, 3], DType::F32, 3), randn(&[3], DType::F32, 4)]
        .iter()
        .enumerate()
    {
        for (beta, alpha) in [(1.0, 1.0), (0.5, -2.0), (0.0, 1.0)] {
            assert_close(
                &format!("addmm c{i} beta {beta} alpha {alpha}"),
                &c.addmm(&a, &b, beta, alpha).unwrap(),
                &dev(c).addmm(&dev(&a), &dev(&b), beta, alpha).unwrap(),
                1e-5,
                1.0,
            );
        }
    }
    // beta = 0 does not read c: its NaNs do not propagate.
    let nan = Tensor::full(&[5, 3], f64::NAN, DType::F32).unwrap();
    let y = dev(&nan).addmm(&dev(&a), &dev(&b), 0.0, 1.0).unwrap();
    assert_close("addmm beta 0", &a.matmul(&b).unwrap(), &y, 1e-5, 1.0);
}

#[test]
fn average_pooling_and_its_gradients_equal_the_cpu_bit_for_bit() {
    if !gpu() {
        return;
    }
    let mut params = vec![
        Pool2dParams::new(2),
        Pool2dParams::new(3).stride(2).padding(1),
        Pool2dParams::new(3).stride(2).padding(1).ceil_mode(true),
        Pool2dParams::new(3).stride(1).padding(1),
    ];
    params[3].count_include_pad = false;
    let mut over = Pool2dParams::new(2).stride(1);
    over.divisor_override = Some(3);
    params.push(over);
    for dtype in FLOATS {
        for (i, p) in params.iter().enumerate() {
            for (name, x) in views(&[2, 3, 7, 6], dtype, 10 + i as u64) {
                let what = format!("avg_pool2d {dtype} case {i} {name}");
                let y = x.avg_pool2d(p).unwrap();
                assert_close(&what, &y, &dev(&x).avg_pool2d(p).unwrap(), 0.0, 0.0);
                let g = randn(y.shape(), dtype, 40 + i as u64);
                assert_close(
                    &format!("{what} backward"),
                    &avg_pool2d_backward(&g, x.shape(), p).unwrap(),
                    &avg_pool2d_backward(&dev(&g), x.shape(), p).unwrap(),
                    0.0,
                    0.0,
                );
            }
        }
        for (i, (hw, out)) in [
            ([7, 5], [3, 2]),
            ([4, 4], [4, 4]),
            ([5, 7], [1, 1]),
            ([3, 3], [5, 4]),
        ]
        .into_iter()
        .enumerate()
        {
            let x = randn(&[2, 3, hw[0], hw[1]], dtype, 60 + i as u64);
            let what = format!("adaptive_avg_pool2d {dtype} {hw:?} -> {out:?}");
            let y = x.adaptive_avg_pool2d(out).unwrap();
            assert_close(&what, &y, &dev(&x).adaptive_avg_pool2d(out).unwrap(), 0.0, 0.0);
            let g = randn(y.shape(), dtype, 70 + i as u64);
            assert_close(
                &format!("{what} backward"),
                &adaptive_avg_pool2d_backward(&g, x.shape()).unwrap(),
                &adaptive_avg_pool2d_backward(&dev(&g), x.shape()).unwrap(),
                0.0,
                0.0,
            );
        }
    }
}

#[test]
fn fused_cross_entropy_equals_the_cpu() {
    if !gpu() {
        return;
    }
    let cases: [(&[usize], Vec<i64>); 3] = [
        (&[5, 7], vec![3, -100, 0, 6, 2]),
        (&[2, 4, 3, 2], vec![0, 1, 2, 3, -100, 1, 3, 3, 0, 2, 1, 0]),
        (&[6], vec![4]),
    ];
    for (shape, t) in cases {
        let tshape: Vec<usize> = match shape.len() {
            1 => vec![],
            _ => shape
                .iter()
                .enumerate()
                .filter(|(d, _)| *d != 1)
                .map(|(_, &s)| s)
                .collect(),
        };
        let target = Tensor::from_vec(t, &tshape).unwrap();
        for dtype in FLOATS {
            let x = randn(shape, dtype, shape.len() as u64).mul_scalar(3.0).unwrap();
            for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
                for eps in [0.0, 0.1] {
                    let opts = CrossEntropyOptions {
                        label_smoothing: eps,
                        reduction,
                        ..Default::default()
                    };
                    let what = format!("cross_entropy {shape:?} {dtype} {reduction:?} eps {eps}");
                    let (loss, lse) = x.cross_entropy_forward(&target, opts).unwrap();
                    let (xd, td) = (dev(&x), dev(&target));
                    let (lossd, lsed) = xd.cross_entropy_forward(&td, opts).unwrap();
                    let t = tol(dtype).max(1e-5);
                    assert_close(&what, &loss, &lossd, t, 1.0);
                    assert_close(&format!("{what} lse"), &lse, &lsed, 1e-5, 1.0);
                    let g = randn(loss.shape(), dtype, 7);
                    assert_close(
                        &format!("{what} backward"),
                        &Tensor::cross_entropy_backward(&g, &x, &target, &lse, opts).unwrap(),
                        &Tensor::cross_entropy_backward(&dev(&g), &xd, &td, &lsed, opts).unwrap(),
                        t,
                        0.1,
                    );
                }
            }
        }
    }
    // A target out of range is a named error, as on the CPU.
    let x = dev(&randn(&[2, 3], DType::F32, 1));
    let t = dev(&Tensor::from_vec(vec![1i64, 3], &[2]).unwrap());
    let e = x
        .cross_entropy_forward(&t, CrossEntropyOptions::default())
        .unwrap_err();
    assert!(
        e.to_string().contains("target 3 is out of range for 3 classes"),
        "{e}"
    );
}

#[test]
fn batch_norm_and_its_gradients_equal_the_cpu() {
    if !gpu() {
        return;
    }
    for dtype in FLOATS {
        let t = tol(dtype).max(2e-5);
        for shape in [&[4, 3, 5, 2][..], &[6, 4]] {
            let c = shape[1];
            let x = randn(shape, dtype, 1)
                .mul_scalar(2.0)
                .unwrap()
                .add_scalar(0.5)
                .unwrap();
            let (w, b) = (randn(&[c], dtype, 2), randn(&[c], dtype, 3));
            let rm = randn(&[c], DType::F32, 4);
            let rv = randn(&[c], DType::F32, 5).abs().unwrap().add_scalar(0.5).unwrap();
            let (xd, wd, bd, rmd, rvd) = (dev(&x), dev(&w), dev(&b), dev(&rm), dev(&rv));
            for training in [true, false] {
                for affine in [true, false] {
                    let what = format!("batch_norm {shape:?} {dtype} training {training} affine {affine}");
                    let (wo, bo, wdo, bdo) = if affine {
                        (Some(&w), Some(&b), Some(&wd), Some(&bd))
                    } else {
                        (None, None, None, None)
                    };
                    let f = x
                        .batch_norm_forward(Some(&rm), Some(&rv), wo, bo, training, 0.1, 1e-5)
                        .unwrap();
                    let fd = xd
                        .batch_norm_forward(Some(&rmd), Some(&rvd), wdo, bdo, training, 0.1, 1e-5)
                        .unwrap();
                    assert_close(&format!("{what} y"), &f.y, &fd.y, t, 1.0);
                    assert_close(&format!("{what} mean"), &f.mean, &fd.mean, 1e-5, 1.0);
                    assert_close(&format!("{what} invstd"), &f.invstd, &fd.invstd, 1e-5, 0.0);
                    assert_eq!(f.running_mean.is_some(), fd.running_mean.is_some(), "{what}");
                    if let (Some(a), Some(b)) = (&f.running_mean, &fd.running_mean) {
                        assert_close(&format!("{what} running_mean"), a, b, 1e-5, 1.0);
                    }
                    if let (Some(a), Some(b)) = (&f.running_var, &fd.running_var) {
                        assert_close(&format!("{what} running_var"), a, b, 1e-5, 1.0);
                    }
                    let dy = randn(shape, dtype, 9);
                    let g = Tensor::batch_norm_backward(&dy, &x, &f.mean, &f.invstd, wo, training).unwrap();
                    let gd = Tensor::batch_norm_backward(&dev(&dy), &xd, &fd.mean, &fd.invstd, wdo, training)
                        .unwrap();
                    assert_close(&format!("{what} dx"), &g.0, &gd.0, t, 1.0);
                    assert_close(&format!("{what} dweight"), &g.1, &gd.1, t, 1.0);
                    assert_close(&format!("{what} dbias"), &g.2, &gd.2, t, 1.0);
                }
            }
            let (m, v) = x.batch_norm_stats().unwrap();
            let (md, vd) = xd.batch_norm_stats().unwrap();
            assert_close(
                &format!("batch_norm_stats {shape:?} {dtype} mean"),
                &m,
                &md,
                1e-5,
                1.0,
            );
            assert_close(
                &format!("batch_norm_stats {shape:?} {dtype} var"),
                &v,
                &vd,
                1e-5,
                0.0,
            );
        }
    }
    // Eval without running stats is the CPU's named error.
    let x = dev(&randn(&[2, 3, 2], DType::F32, 1));
    let e = x
        .batch_norm_forward(None, None, None, None, false, 0.1, 1e-5)
        .unwrap_err();
    assert!(e.to_string().contains("eval mode needs running_mean"), "{e}");
}
