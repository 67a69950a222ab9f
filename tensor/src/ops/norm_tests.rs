//! layer_norm, batch_norm and group_norm against a naive f64 formula
//! (forward) and central finite differences in f64 (backward).

use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
use crate::{bf16, f16, DType, Element, Tensor};

/// Naive normalization: element i belongs to statistics group `grp(i)` and
/// affine channel `ch(i)`. Returns (y, mean per group, rstd per group).
fn naive_norm(
    x: &[f64],
    ngroups: usize,
    grp: &dyn Fn(usize) -> usize,
    ch: &dyn Fn(usize) -> usize,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut sum = vec![0.0; ngroups];
    let mut cnt = vec![0.0; ngroups];
    for (i, v) in x.iter().enumerate() {
        sum[grp(i)] += v;
        cnt[grp(i)] += 1.0;
    }
    let mean: Vec<f64> = sum.iter().zip(&cnt).map(|(s, c)| s / c).collect();
    let mut sq = vec![0.0; ngroups];
    for (i, v) in x.iter().enumerate() {
        sq[grp(i)] += (v - mean[grp(i)]).powi(2);
    }
    let rstd: Vec<f64> = sq
        .iter()
        .zip(&cnt)
        .map(|(s, c)| 1.0 / (s / c + eps).sqrt())
        .collect();
    let y = x
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let g = grp(i);
            (v - mean[g]) * rstd[g] * w.map_or(1.0, |w| w[ch(i)]) + b.map_or(0.0, |b| b[ch(i)])
        })
        .collect();
    (y, mean, rstd)
}

/// Central differences of `f` at `x`.
fn fd(f: &dyn Fn(&[f64]) -> f64, x: &[f64]) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let (mut p, mut m) = (x.to_vec(), x.to_vec());
            p[i] += h;
            m[i] -= h;
            (f(&p) - f(&m)) / (2.0 * h)
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn f64s(t: &Tensor) -> Vec<f64> {
    values_f64(t)
}

fn check_layer_norm_forward<T: Element>(tol: f64) {
    let cases: &[(&[usize], &[usize])] = &[
        (&[4, 6], &[6]),
        (&[2, 3, 4], &[3, 4]),
        (&[5], &[5]),
        (&[0, 3], &[3]),
    ];
    for (ci, &(shape, norm)) in cases.iter().enumerate() {
        let n: usize = shape.iter().product();
        let k: usize = norm.iter().product();
        let x = values_f64(&tensor_of::<T>(&rand_f64(ci as u64, n), shape));
        let w = values_f64(&tensor_of::<T>(&rand_f64(ci as u64 + 7, k), norm));
        let b = values_f64(&tensor_of::<T>(&rand_f64(ci as u64 + 8, k), norm));
        let (wt, bt) = (tensor_of::<T>(&w, norm), tensor_of::<T>(&b, norm));
        for affine in [false, true] {
            let (wo, bo) = if affine {
                (Some(&w[..]), Some(&b[..]))
            } else {
                (None, None)
            };
            let (y, mean, rstd) = naive_norm(&x, n / k, &|i| i / k, &|i| i % k, wo, bo, 1e-5);
            for t in layouts_of::<T>(&x, shape) {
                let (ws, bs) = if affine {
                    (Some(&wt), Some(&bt))
                } else {
                    (None, None)
                };
                let (gy, gm, gr) = t.layer_norm_forward(norm, ws, bs, 1e-5).unwrap();
                let lead = shape.len() - norm.len();
                let mut stat_shape = shape[..lead].to_vec();
                stat_shape.resize(shape.len(), 1);
                assert_eq!(gm.shape(), &stat_shape[..]);
                assert_eq!(
                    gr.dtype(),
                    if T::DTYPE == DType::F64 {
                        DType::F64
                    } else {
                        DType::F32
                    }
                );
                assert_eq!((gy.shape(), gy.dtype()), (shape, T::DTYPE));
                assert_close(&f64s(&gy), &y, tol, "layer_norm y");
                assert_close(&f64s(&gm), &mean, tol, "layer_norm mean");
                assert_close(&f64s(&gr), &rstd, tol, "layer_norm rstd");
            }
        }
    }
}

#[test]
fn layer_norm_forward_matches_naive() {
    check_layer_norm_forward::<f64>(1e-10);
    check_layer_norm_forward::<f32>(1e-4);
    check_layer_norm_forward::<f16>(4e-3);
    check_layer_norm_forward::<bf16>(3e-2);
}

#[test]
fn layer_norm_backward_matches_finite_differences() {
    let (shape, norm) = ([3usize, 2, 4], [2usize, 4]);
    let (n, k) = (24, 8);
    let x = rand_f64(1, n);
    let w: Vec<f64> = rand_f64(2, k).iter().map(|v| v + 1.5).collect();
    let b = rand_f64(3, k);
    let r = rand_f64(4, n);
    let eps = 1e-3;
    let loss = |x: &[f64], w: &[f64], b: &[f64]| {
        dot(
            &naive_norm(x, n / k, &|i| i / k, &|i| i % k, Some(w), Some(b), eps).0,
            &r,
        )
    };
    let (wt, bt) = (tensor_of::<f64>(&w, &norm), tensor_of::<f64>(&b, &norm));
    for (li, xt) in layouts_of::<f64>(&x, &shape).into_iter().enumerate() {
        let dy = layouts_of::<f64>(&r, &shape).swap_remove(li % 3);
        let (_, mean, rstd) = xt.layer_norm_forward(&norm, Some(&wt), Some(&bt), eps).unwrap();
        let (dx, dw, db) = Tensor::layer_norm_backward(&dy, &xt, &mean, &rstd, &norm, Some(&wt)).unwrap();
        assert_eq!((dw.shape(), db.shape()), (&norm[..], &norm[..]));
        assert_close(&f64s(&dx), &fd(&|x| loss(x, &w, &b), &x), 1e-6, "dx");
        assert_close(&f64s(&dw), &fd(&|w| loss(&x, w, &b), &w), 1e-6, "dweight");
        assert_close(&f64s(&db), &fd(&|b| loss(&x, &w, b), &b), 1e-6, "dbias");
    }
    // Without weight, dx is the weight = 1 gradient.
    let xt = tensor_of::<f64>(&x, &shape);
    let (_, mean, rstd) = xt.layer_norm_forward(&norm, None, None, eps).unwrap();
    let dy = tensor_of::<f64>(&r, &shape);
    let (dx, _, _) = Tensor::layer_norm_backward(&dy, &xt, &mean, &rstd, &norm, None).unwrap();
    let ones = vec![1.0; k];
    assert_close(
        &f64s(&dx),
        &fd(&|x| loss(x, &ones, &b), &x),
        1e-6,
        "dx without weight",
    );
    // f32 backward agrees with the f64 one.
    let x32 = tensor_of::<f32>(&x, &shape);
    let (_, m32, r32) = x32.layer_norm_forward(&norm, None, None, eps).unwrap();
    let dy32 = tensor_of::<f32>(&r, &shape);
    let (dx32, _, _) = Tensor::layer_norm_backward(&dy32, &x32, &m32, &r32, &norm, None).unwrap();
    assert_close(&f64s(&dx32), &f64s(&dx), 1e-4, "dx f32");
}

#[test]
fn layer_norm_rejects_bad_arguments() {
    let x = Tensor::from_vec(vec![1.0f32; 12], &[3, 4]).unwrap();
    assert!(x.layer_norm(&[3], None, None, 1e-5).is_err());
    assert!(x.layer_norm(&[], None, None, 1e-5).is_err());
    assert!(x.layer_norm(&[2, 3, 4], None, None, 1e-5).is_err());
    assert!(x.layer_norm(&[4], None, None, -1.0).is_err());
    let w = Tensor::from_vec(vec![1.0f32; 3], &[3]).unwrap();
    assert!(x.layer_norm(&[4], Some(&w), None, 1e-5).is_err());
    assert!(x
        .to_dtype(DType::I64)
        .unwrap()
        .layer_norm(&[4], None, None, 1e-5)
        .is_err());
    let (_, m, r) = x.layer_norm_forward(&[4], None, None, 1e-5).unwrap();
    assert!(Tensor::layer_norm_backward(&x.t().unwrap(), &x, &m, &r, &[4], None).is_err());
    assert!(Tensor::layer_norm_backward(&x, &x, &r.narrow(0, 0, 2).unwrap(), &r, &[4], None).is_err());
}

/// Batch-norm channel of element i in an `[n, c, s]` input.
fn bn_ch(c: usize, s: usize) -> impl Fn(usize) -> usize {
    move |i| (i / s) % c
}

#[test]
fn batch_norm_training_and_eval_match_naive() {
    for (si, shape) in [vec![4usize, 3], vec![2, 3, 5], vec![2, 2, 3, 2]]
        .into_iter()
        .enumerate()
    {
        let (c, s) = (shape[1], shape[2..].iter().product::<usize>());
        let n: usize = shape.iter().product();
        let count = (n / c) as f64;
        let x = rand_f64(si as u64 + 20, n);
        let w = rand_f64(31, c);
        let b = rand_f64(32, c);
        let rm = rand_f64(33, c);
        let rv: Vec<f64> = rand_f64(34, c).iter().map(|v| v + 1.5).collect();
        let ch = bn_ch(c, s);
        let (y, mean, rstd) = naive_norm(&x, c, &ch, &ch, Some(&w), Some(&b), 1e-5);
        let ts = |v: &[f64]| tensor_of::<f64>(v, &[c]);
        for t in layouts_of::<f64>(&x, &shape) {
            let o = t
                .batch_norm_forward(
                    Some(&ts(&rm)),
                    Some(&ts(&rv)),
                    Some(&ts(&w)),
                    Some(&ts(&b)),
                    true,
                    0.1,
                    1e-5,
                )
                .unwrap();
            assert_close(&f64s(&o.y), &y, 1e-10, "bn y");
            assert_close(&f64s(&o.mean), &mean, 1e-12, "bn mean");
            assert_close(&f64s(&o.invstd), &rstd, 1e-10, "bn invstd");
            let (sm, sv) = t.batch_norm_stats().unwrap();
            assert_close(&f64s(&sm), &mean, 1e-12, "stats mean");
            let var_b: Vec<f64> = rstd.iter().map(|r| 1.0 / (r * r) - 1e-5).collect();
            assert_close(&f64s(&sv), &var_b, 1e-9, "stats var");
            let want_rm: Vec<f64> = rm.iter().zip(&mean).map(|(r, m)| 0.9 * r + 0.1 * m).collect();
            let want_rv: Vec<f64> = rv
                .iter()
                .zip(&var_b)
                .map(|(r, v)| 0.9 * r + 0.1 * v * count / (count - 1.0))
                .collect();
            assert_close(&f64s(&o.running_mean.unwrap()), &want_rm, 1e-12, "running mean");
            assert_close(&f64s(&o.running_var.unwrap()), &want_rv, 1e-9, "running var");

            let e = t
                .batch_norm(
                    Some(&ts(&rm)),
                    Some(&ts(&rv)),
                    Some(&ts(&w)),
                    Some(&ts(&b)),
                    false,
                    0.1,
                    1e-5,
                )
                .unwrap();
            assert!(e.running_mean.is_none() && e.running_var.is_none());
            let want: Vec<f64> = x
                .iter()
                .enumerate()
                .map(|(i, v)| (v - rm[ch(i)]) / (rv[ch(i)] + 1e-5).sqrt() * w[ch(i)] + b[ch(i)])
                .collect();
            assert_close(&f64s(&e.y), &want, 1e-10, "bn eval y");
        }
        // f32 and bf16 inputs.
        let o32 = tensor_of::<f32>(&x, &shape)
            .batch_norm(None, None, None, None, true, 0.1, 1e-5)
            .unwrap();
        let (y0, _, _) = naive_norm(&x, c, &ch, &ch, None, None, 1e-5);
        assert_close(&f64s(&o32.y), &y0, 1e-4, "bn f32");
        assert!(o32.running_mean.is_none());
        let xb = values_f64(&tensor_of::<bf16>(&x, &shape));
        let ob = tensor_of::<bf16>(&x, &shape)
            .batch_norm(None, None, None, None, true, 0.1, 1e-5)
            .unwrap();
        let (yb, _, _) = naive_norm(&xb, c, &ch, &ch, None, None, 1e-5);
        assert_eq!(ob.y.dtype(), DType::BF16);
        assert_close(&f64s(&ob.y), &yb, 2e-2, "bn bf16");
    }
}

#[test]
fn batch_norm_backward_matches_finite_differences() {
    let shape = [3usize, 2, 2, 2];
    let (c, s, n) = (2, 4, 24);
    let x = rand_f64(40, n);
    let w: Vec<f64> = rand_f64(41, c).iter().map(|v| v + 1.5).collect();
    let b = rand_f64(42, c);
    let r = rand_f64(43, n);
    let (rm, rv) = (vec![0.2, -0.1], vec![0.7, 1.3]);
    let eps = 1e-3;
    let ch = bn_ch(c, s);
    let train =
        |x: &[f64], w: &[f64], b: &[f64]| dot(&naive_norm(x, c, &ch, &ch, Some(w), Some(b), eps).0, &r);
    let eval = |x: &[f64], w: &[f64], b: &[f64]| {
        let y: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, v)| (v - rm[ch(i)]) / (rv[ch(i)] + eps).sqrt() * w[ch(i)] + b[ch(i)])
            .collect();
        dot(&y, &r)
    };
    let ts = |v: &[f64]| tensor_of::<f64>(v, &[c]);
    for (li, xt) in layouts_of::<f64>(&x, &shape).into_iter().enumerate() {
        let dy = layouts_of::<f64>(&r, &shape).swap_remove((li + 1) % 3);
        for training in [true, false] {
            let o = xt
                .batch_norm_forward(
                    Some(&ts(&rm)),
                    Some(&ts(&rv)),
                    Some(&ts(&w)),
                    Some(&ts(&b)),
                    training,
                    0.1,
                    eps,
                )
                .unwrap();
            let (dx, dw, db) =
                Tensor::batch_norm_backward(&dy, &xt, &o.mean, &o.invstd, Some(&ts(&w)), training).unwrap();
            let f = if training {
                &train as &dyn Fn(&[f64], &[f64], &[f64]) -> f64
            } else {
                &eval
            };
            assert_close(&f64s(&dx), &fd(&|x| f(x, &w, &b), &x), 1e-6, "bn dx");
            assert_close(&f64s(&dw), &fd(&|w| f(&x, w, &b), &w), 1e-6, "bn dweight");
            assert_close(&f64s(&db), &fd(&|b| f(&x, &w, b), &b), 1e-6, "bn dbias");
        }
    }
}

#[test]
fn batch_norm_rejects_bad_arguments() {
    let x = Tensor::from_vec(vec![1.0f32; 12], &[2, 3, 2]).unwrap();
    let c3 = Tensor::from_vec(vec![1.0f32; 3], &[3]).unwrap();
    let c2 = Tensor::from_vec(vec![1.0f32; 2], &[2]).unwrap();
    assert!(x.batch_norm(None, None, None, None, false, 0.1, 1e-5).is_err());
    assert!(x
        .batch_norm(Some(&c2), None, None, None, true, 0.1, 1e-5)
        .is_err());
    assert!(x
        .batch_norm(None, None, Some(&c2), None, true, 0.1, 1e-5)
        .is_err());
    assert!(x.batch_norm(None, None, None, None, true, 0.1, f64::NAN).is_err());
    assert!(x
        .narrow(0, 0, 1)
        .unwrap()
        .narrow(2, 0, 1)
        .unwrap()
        .batch_norm(None, None, None, None, true, 0.1, 1e-5)
        .is_err());
    assert!(x
        .batch_norm(Some(&c3), Some(&c3), None, None, false, 0.1, 1e-5)
        .is_ok());
    assert!(Tensor::from_vec(vec![1.0f32; 3], &[3])
        .unwrap()
        .batch_norm_stats()
        .is_err());
    assert!(x.to_dtype(DType::U8).unwrap().batch_norm_stats().is_err());
    assert!(Tensor::batch_norm_backward(&x, &x, &c2, &c3, None, true).is_err());
}

#[test]
fn group_norm_forward_and_backward() {
    let shape = [2usize, 6, 3];
    let (nb, c, s, groups) = (2, 6, 3, 3);
    let n = nb * c * s;
    let per = c / groups;
    let x = rand_f64(50, n);
    let w: Vec<f64> = rand_f64(51, c).iter().map(|v| v + 1.5).collect();
    let b = rand_f64(52, c);
    let r = rand_f64(53, n);
    let eps = 1e-3;
    let grp = move |i: usize| i / (per * s);
    let ch = bn_ch(c, s);
    let run = |x: &[f64], w: &[f64], b: &[f64]| naive_norm(x, nb * groups, &grp, &ch, Some(w), Some(b), eps);
    let (y, mean, rstd) = run(&x, &w, &b);
    let loss = |x: &[f64], w: &[f64], b: &[f64]| dot(&run(x, w, b).0, &r);
    let ts = |v: &[f64]| tensor_of::<f64>(v, &[c]);
    for (li, xt) in layouts_of::<f64>(&x, &shape).into_iter().enumerate() {
        let (gy, gm, gr) = xt
            .group_norm_forward(groups, Some(&ts(&w)), Some(&ts(&b)), eps)
            .unwrap();
        assert_eq!(gm.shape(), &[nb, groups]);
        assert_close(&f64s(&gy), &y, 1e-10, "gn y");
        assert_close(&f64s(&gm), &mean, 1e-12, "gn mean");
        assert_close(&f64s(&gr), &rstd, 1e-10, "gn rstd");
        let dy = layouts_of::<f64>(&r, &shape).swap_remove(li % 3);
        let (dx, dw, db) = Tensor::group_norm_backward(&dy, &xt, &gm, &gr, groups, Some(&ts(&w))).unwrap();
        assert_close(&f64s(&dx), &fd(&|x| loss(x, &w, &b), &x), 1e-6, "gn dx");
        assert_close(&f64s(&dw), &fd(&|w| loss(&x, w, &b), &w), 1e-6, "gn dweight");
        assert_close(&f64s(&db), &fd(&|b| loss(&x, &w, b), &b), 1e-6, "gn dbias");
    }
    let x16 = tensor_of::<f16>(&x, &shape);
    let (y16, _, _) = x16.group_norm_forward(groups, None, None, eps).unwrap();
    let (y0, _, _) = naive_norm(&values_f64(&x16), nb * groups, &grp, &ch, None, None, eps);
    assert_close(&f64s(&y16), &y0, 4e-3, "gn f16");
    let xt = tensor_of::<f64>(&x, &shape);
    assert!(xt.group_norm(4, None, None, eps).is_err());
    assert!(xt.group_norm(0, None, None, eps).is_err());
    assert!(xt
        .group_norm(3, Some(&tensor_of::<f64>(&w[..4], &[4])), None, eps)
        .is_err());
}

/// The f32 batch norm (SIMD planes, f32 plane sums in f64) and its backward
/// against the f64 path on the same values: ragged planes, one-element
/// planes, a channel offset far from zero (the sums about the f32-rounded
/// mean), training and eval; and bit for bit the same on 1 and 3 threads.
#[test]
fn batch_norm_f32_planes_match_the_f64_path_on_any_thread_count() {
    let run = |shape: &[usize], training: bool, dtype: DType| -> Vec<Vec<f64>> {
        let (c, numel) = (shape[1], shape.iter().product::<usize>());
        let x: Vec<f64> = rand_f64(7, numel).iter().map(|v| 10.0 + 3.0 * v).collect();
        let dy = rand_f64(8, numel);
        let as_dt = |v: &[f64], shape: &[usize]| tensor_of::<f32>(v, shape).to_dtype(dtype).unwrap();
        let (xt, dyt) = (as_dt(&x, shape), as_dt(&dy, shape));
        let w: Vec<f64> = rand_f64(9, c).iter().map(|v| v + 1.5).collect();
        let (w, b, rm) = (
            as_dt(&w, &[c]),
            as_dt(&rand_f64(10, c), &[c]),
            as_dt(&rand_f64(11, c), &[c]),
        );
        let rv = as_dt(&vec![2.0; c], &[c]);
        let o = xt
            .batch_norm_forward(Some(&rm), Some(&rv), Some(&w), Some(&b), training, 0.1, 1e-5)
            .unwrap();
        let (dx, dw, db) =
            Tensor::batch_norm_backward(&dyt, &xt, &o.mean, &o.invstd, Some(&w), training).unwrap();
        let (sm, sv) = xt.batch_norm_stats().unwrap();
        [&o.y, &o.mean, &o.invstd, &dx, &dw, &db, &sm, &sv]
            .iter()
            .map(|t| f64s(t))
            .collect()
    };
    let names = [
        "y",
        "mean",
        "invstd",
        "dx",
        "dweight",
        "dbias",
        "stats mean",
        "stats var",
    ];
    for shape in [
        vec![3usize, 5, 37],
        vec![9, 4],
        vec![4, 3, 8, 8],
        vec![6, 40, 1037],
    ] {
        for training in [true, false] {
            let got = run(&shape, training, DType::F32);
            let want = run(&shape, training, DType::F64);
            for ((g, w), what) in got.iter().zip(&want).zip(names) {
                assert_close(g, w, 2e-5, &format!("{shape:?} training {training}: {what}"));
            }
        }
    }
    let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
    let shape = [6usize, 40, 1037];
    assert_eq!(
        pool(1).install(|| run(&shape, true, DType::F32)),
        pool(3).install(|| run(&shape, true, DType::F32))
    );
}
