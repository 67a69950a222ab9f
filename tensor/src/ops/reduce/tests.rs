//! Reductions against a naive f64 reference over shapes, dim subsets,
//! layouts and dtypes; edge cases; thread-count determinism.

use proptest::prelude::*;

use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
use crate::{bf16, f16, DType, Element, Tensor};

/// The reduced values of each output (row-major, reduced positions in
/// row-major order) and the output shape, computed naively.
fn groups(values: &[f64], shape: &[usize], dims: &[isize], keepdim: bool) -> (Vec<usize>, Vec<Vec<f64>>) {
    let nd = shape.len();
    let red: Vec<bool> = (0..nd)
        .map(|d| {
            dims.is_empty()
                || dims
                    .iter()
                    .any(|&x| (if x < 0 { x + nd as isize } else { x }) as usize == d)
        })
        .collect();
    let out_shape: Vec<usize> = (0..nd)
        .filter_map(|d| match (red[d], keepdim) {
            (false, _) => Some(shape[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    let n_out: usize = (0..nd).filter(|&d| !red[d]).map(|d| shape[d]).product();
    let mut out = vec![Vec::new(); n_out];
    for (lin, &v) in values.iter().enumerate() {
        let mut rem = lin;
        let mut idx = vec![0; nd];
        for d in (0..nd).rev() {
            idx[d] = rem % shape[d];
            rem /= shape[d];
        }
        let mut o = 0;
        for d in 0..nd {
            if !red[d] {
                o = o * shape[d] + idx[d];
            }
        }
        out[o].push(v);
    }
    (out_shape, out)
}

/// Every subset of `0..nd`, each also written with negative dims.
fn dim_subsets(nd: usize) -> Vec<Vec<isize>> {
    let mut out = Vec::new();
    for mask in 0..(1usize << nd) {
        let pos: Vec<isize> = (0..nd)
            .filter(|d| mask >> d & 1 == 1)
            .map(|d| d as isize)
            .collect();
        if !pos.is_empty() {
            out.push(pos.iter().map(|&d| d - nd as isize).collect());
        }
        out.push(pos);
    }
    out
}

const SHAPES: &[&[usize]] = &[&[], &[7], &[3, 4], &[2, 3, 5], &[2, 1, 3, 4], &[0, 3], &[3, 0, 2]];

fn close(got: f64, want: f64, tol: f64, scale: f64) -> bool {
    (got.is_nan() && want.is_nan()) || got == want || (got - want).abs() <= tol * (scale + want.abs())
}

fn naive_var(g: &[f64], corr: f64) -> f64 {
    let n = g.len() as f64;
    let m = g.iter().sum::<f64>() / n;
    g.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - corr).max(0.0)
}

type FloatCase = (
    &'static str,
    fn(&Tensor, &[isize], bool) -> crate::Result<Tensor>,
    fn(&[f64]) -> f64,
);

fn float_cases() -> Vec<FloatCase> {
    vec![
        ("sum", |t, d, k| t.sum(d, k), |g| g.iter().sum()),
        (
            "mean",
            |t, d, k| t.mean(d, k),
            |g| g.iter().sum::<f64>() / g.len() as f64,
        ),
        ("prod", |t, d, k| t.prod(d, k), |g| g.iter().product()),
        ("var", |t, d, k| t.var(d, 1.0, k), |g| naive_var(g, 1.0)),
        ("var0", |t, d, k| t.var(d, 0.0, k), |g| naive_var(g, 0.0)),
        ("std", |t, d, k| t.std(d, 1.0, k), |g| naive_var(g, 1.0).sqrt()),
        (
            "logsumexp",
            |t, d, k| t.logsumexp(d, k),
            |g| g.iter().map(|x| x.exp()).sum::<f64>().ln(),
        ),
        (
            "norm1",
            |t, d, k| t.norm(1.0, d, k),
            |g| g.iter().map(|x| x.abs()).sum(),
        ),
        (
            "norm2",
            |t, d, k| t.norm(2.0, d, k),
            |g| g.iter().map(|x| x * x).sum::<f64>().sqrt(),
        ),
        (
            "norm3",
            |t, d, k| t.norm(3.0, d, k),
            |g| g.iter().map(|x| x.abs().powi(3)).sum::<f64>().cbrt(),
        ),
        (
            "norm0",
            |t, d, k| t.norm(0.0, d, k),
            |g| g.iter().filter(|&&x| x != 0.0).count() as f64,
        ),
        (
            "max",
            |t, d, k| t.max(d, k),
            |g| g.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        ),
        (
            "min",
            |t, d, k| t.min(d, k),
            |g| g.iter().cloned().fold(f64::INFINITY, f64::min),
        ),
        (
            "norm_inf",
            |t, d, k| t.norm(f64::INFINITY, d, k),
            |g| g.iter().fold(0.0, |m, x| x.abs().max(m)),
        ),
    ]
}

fn check_floats<T: Element>(tol: f64) {
    for (si, &shape) in SHAPES.iter().enumerate() {
        let n: usize = shape.iter().product();
        let raw = rand_f64(si as u64 + 10, n);
        // The reference sees the values rounded to T.
        let values = values_f64(&tensor_of::<T>(&raw, shape));
        for dims in dim_subsets(shape.len()) {
            for keepdim in [false, true] {
                let (oshape, gs) = groups(&values, shape, &dims, keepdim);
                for t in layouts_of::<T>(&values, shape) {
                    for (name, f, naive) in float_cases() {
                        let res = f(&t, &dims, keepdim);
                        let empty = gs.first().is_some_and(|g| g.is_empty());
                        if empty && ["max", "min", "norm_inf"].contains(&name) {
                            assert!(res.is_err(), "{name} of empty {shape:?} {dims:?}");
                            continue;
                        }
                        let r = res.unwrap_or_else(|e| panic!("{name} {shape:?} {dims:?}: {e}"));
                        assert_eq!(r.shape(), &oshape[..], "{name} {shape:?} {dims:?} {keepdim}");
                        assert_eq!(r.dtype(), T::DTYPE);
                        for (got, g) in values_f64(&r).iter().zip(&gs) {
                            let want = naive(g);
                            let scale = g.iter().map(|x| x.abs()).sum::<f64>() + 1.0;
                            let scale = if name.starts_with("var") || name == "std" {
                                1.0
                            } else {
                                scale
                            };
                            assert!(
                                close(*got, want, tol, scale),
                                "{name} {:?} {shape:?} dims {dims:?} layout {t:?}: got {got}, want {want}",
                                T::DTYPE
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn float_reductions_match_naive_f64() {
    check_floats::<f64>(1e-12);
    check_floats::<f32>(1e-5);
    check_floats::<f16>(2e-3);
    check_floats::<bf16>(1.6e-2);
}

fn check_ints<T: Element>(lo: f64, span: f64) {
    for (si, &shape) in SHAPES.iter().enumerate() {
        let n: usize = shape.iter().product();
        let values: Vec<f64> = rand_f64(si as u64 + 50, n)
            .iter()
            .map(|x| T::from_f64((lo + (x + 1.0) / 2.0 * span).floor()).to_f64())
            .collect();
        for dims in dim_subsets(shape.len()) {
            for keepdim in [false, true] {
                let (oshape, gs) = groups(&values, shape, &dims, keepdim);
                for t in layouts_of::<T>(&values, shape) {
                    let s = t.sum(&dims, keepdim).unwrap();
                    assert_eq!((s.dtype(), s.shape()), (DType::I64, &oshape[..]));
                    let want: Vec<f64> = gs.iter().map(|g| g.iter().sum()).collect();
                    assert_eq!(values_f64(&s), want, "sum {:?} {shape:?} {dims:?}", T::DTYPE);
                    let p = t.prod(&dims, keepdim).unwrap();
                    let want: Vec<f64> = gs.iter().map(|g| g.iter().product()).collect();
                    assert_eq!(values_f64(&p), want, "prod {:?} {shape:?} {dims:?}", T::DTYPE);
                    let all = t.all(&dims, keepdim).unwrap();
                    assert_eq!(all.dtype(), DType::Bool);
                    let want: Vec<f64> = gs
                        .iter()
                        .map(|g| g.iter().all(|&x| x != 0.0) as u8 as f64)
                        .collect();
                    assert_eq!(values_f64(&all), want);
                    let any = t.any(&dims, keepdim).unwrap();
                    let want: Vec<f64> = gs
                        .iter()
                        .map(|g| g.iter().any(|&x| x != 0.0) as u8 as f64)
                        .collect();
                    assert_eq!(values_f64(&any), want);
                    if gs.first().is_some_and(|g| g.is_empty()) {
                        assert!(t.max(&dims, keepdim).is_err() && t.min(&dims, keepdim).is_err());
                        continue;
                    }
                    let mx = t.max(&dims, keepdim).unwrap();
                    assert_eq!(mx.dtype(), T::DTYPE);
                    let want: Vec<f64> = gs
                        .iter()
                        .map(|g| g.iter().cloned().fold(f64::MIN, f64::max))
                        .collect();
                    assert_eq!(values_f64(&mx), want);
                    let mn = t.min(&dims, keepdim).unwrap();
                    let want: Vec<f64> = gs
                        .iter()
                        .map(|g| g.iter().cloned().fold(f64::MAX, f64::min))
                        .collect();
                    assert_eq!(values_f64(&mn), want);
                }
            }
        }
    }
}

#[test]
fn integer_and_bool_reductions_are_exact() {
    check_ints::<i64>(-2.0, 5.0);
    check_ints::<u8>(0.0, 4.0);
    check_ints::<u32>(0.0, 6.0);
    check_ints::<bool>(0.0, 2.0);
    for dt in [DType::I64, DType::U8, DType::Bool] {
        let t = Tensor::from_vec(vec![1i64, 2], &[2])
            .unwrap()
            .to_dtype(dt)
            .unwrap();
        for r in [
            t.mean(&[], false),
            t.var(&[], 1.0, false),
            t.logsumexp(&[], false),
            t.norm(2.0, &[], false),
        ] {
            assert!(matches!(r, Err(crate::Error::DType { .. })), "{dt}");
        }
    }
}

/// First index of the max (min) of `g`, NaN counting as the max.
fn naive_arg(g: &[f64], max: bool) -> usize {
    let mut best = 0;
    for (i, &x) in g.iter().enumerate() {
        let b = g[best];
        let better = !b.is_nan() && (x.is_nan() || if max { x > b } else { x < b });
        if better {
            best = i;
        }
    }
    best
}

#[test]
fn argmax_argmin_and_max_dim_take_the_first_occurrence() {
    for (si, &shape) in SHAPES.iter().enumerate() {
        let n: usize = shape.iter().product();
        // Few distinct values, so ties are common.
        let mut values: Vec<f64> = rand_f64(si as u64 + 90, n)
            .iter()
            .map(|x| (x * 2.0).round())
            .collect();
        if n > 5 {
            values[n / 2] = f64::NAN;
        }
        let nd = shape.len() as isize;
        let dims: Vec<Option<isize>> = std::iter::once(None).chain((-nd..nd).map(Some)).collect();
        for dim in dims {
            for keepdim in [false, true] {
                let dl: Vec<isize> = dim.into_iter().collect();
                let (oshape, gs) = groups(&values, shape, &dl, keepdim);
                for t in layouts_of::<f32>(&values, shape) {
                    for max in [true, false] {
                        let r = if max {
                            t.argmax(dim, keepdim)
                        } else {
                            t.argmin(dim, keepdim)
                        };
                        if gs.first().is_some_and(|g| g.is_empty()) {
                            assert!(r.is_err());
                            continue;
                        }
                        let r = r.unwrap();
                        assert_eq!((r.shape(), r.dtype()), (&oshape[..], DType::I64));
                        let want: Vec<i64> = gs.iter().map(|g| naive_arg(g, max) as i64).collect();
                        assert_eq!(r.to_vec::<i64>().unwrap(), want, "{shape:?} {dim:?} max={max}");
                        if let Some(d) = dim {
                            let (v, i) = if max {
                                t.max_dim(d, keepdim)
                            } else {
                                t.min_dim(d, keepdim)
                            }
                            .unwrap();
                            assert_eq!(i.to_vec::<i64>().unwrap(), want);
                            let wv: Vec<f64> = gs.iter().zip(&want).map(|(g, &k)| g[k as usize]).collect();
                            let gv = values_f64(&v);
                            assert!(gv
                                .iter()
                                .zip(&wv)
                                .all(|(a, b)| a == b || (a.is_nan() && b.is_nan())));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn edge_cases_follow_pytorch() {
    let e = Tensor::from_vec(Vec::<f32>::new(), &[0, 3]).unwrap();
    assert_eq!(e.sum(&[], false).unwrap().to_vec::<f32>().unwrap(), vec![0.0]);
    assert_eq!(
        e.prod(&[0], false).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0; 3]
    );
    assert!(e.mean(&[], false).unwrap().to_scalar::<f32>().unwrap().is_nan());
    assert_eq!(
        e.logsumexp(&[0], false).unwrap().to_vec::<f32>().unwrap(),
        vec![f32::NEG_INFINITY; 3]
    );
    assert!(e.max(&[0], false).is_err() && e.argmax(None, false).is_err() && e.max_dim(0, false).is_err());
    assert_eq!(e.max(&[1], false).unwrap().shape(), &[0]);
    assert!(e.all(&[], false).unwrap().to_scalar::<bool>().unwrap());
    assert!(!e.any(&[], false).unwrap().to_scalar::<bool>().unwrap());

    let t = Tensor::from_vec(vec![1.0f32, f32::NAN, 3.0, 2.0], &[2, 2]).unwrap();
    assert!(t.max(&[], false).unwrap().to_scalar::<f32>().unwrap().is_nan());
    assert_eq!(t.max(&[0], false).unwrap().to_vec::<f32>().unwrap()[0], 3.0);
    assert!(t.min(&[1], false).unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(t.argmax(None, false).unwrap().to_scalar::<i64>().unwrap(), 1);
    assert_eq!(t.argmax(None, true).unwrap().shape(), &[1, 1]);

    // A 0-d tensor reduces over dim 0 / -1 to itself.
    let s = Tensor::scalar(2.5f64);
    assert_eq!(s.sum(&[0], true).unwrap().to_scalar::<f64>().unwrap(), 2.5);
    assert_eq!(s.argmax(Some(-1), false).unwrap().to_scalar::<i64>().unwrap(), 0);
    assert!(s.sum(&[1], false).is_err());

    // Bad dims and arguments are errors naming the op.
    let x = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
    assert_eq!(x.sum(&[2], false).unwrap_err().op(), "sum");
    assert_eq!(x.mean(&[0, -2], false).unwrap_err().op(), "mean");
    assert!(x.norm(f64::NAN, &[], false).is_err());
    assert!(x.var(&[], -1.0, false).is_err());
    assert!(x.argmax(Some(-3), false).is_err());
    // N ≤ correction: inf / NaN like PyTorch.
    let one = Tensor::from_vec(vec![1.0f32, 2.0], &[2, 1]).unwrap();
    assert!(one.var(&[1], 1.0, false).unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    assert!(one
        .var(&[0], 3.0, false)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
        .is_infinite());

    // logsumexp stays finite for huge inputs and handles infinities.
    let big = Tensor::from_vec(
        vec![1000.0f32, 1000.0, -1000.0, f32::NEG_INFINITY, f32::INFINITY, 0.0],
        &[3, 2],
    )
    .unwrap();
    let l = big.logsumexp(&[1], false).unwrap().to_vec::<f32>().unwrap();
    assert!((l[0] - (1000.0 + 2f32.ln())).abs() < 1e-3);
    assert_eq!(l[1], -1000.0);
    assert_eq!(l[2], f32::INFINITY);

    // var_mean agrees with var and mean.
    let r = Tensor::from_vec(rand_f64(3, 24), &[4, 6]).unwrap();
    let (v, m) = r.var_mean(&[1], 1.0, true).unwrap();
    assert_eq!(values_f64(&v), values_f64(&r.var(&[1], 1.0, true).unwrap()));
    let mm = values_f64(&r.mean(&[1], true).unwrap());
    assert!(values_f64(&m).iter().zip(&mm).all(|(a, b)| (a - b).abs() < 1e-14));
}

#[test]
fn long_f32_sums_are_accurate() {
    let n = 1 << 22;
    let t = Tensor::from_vec(vec![0.1f32; n], &[n]).unwrap();
    let want = 0.1f32 as f64 * n as f64;
    let got = t.sum(&[], false).unwrap().to_scalar::<f32>().unwrap() as f64;
    assert!((got - want).abs() / want < 1e-6, "{got} vs {want}");
    let m = t.reshape((64, ())).unwrap().mean(&[1], false).unwrap();
    assert!(m
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|&x| (x as f64 - 0.1f32 as f64).abs() < 1e-7));
    let v = Tensor::from_vec(vec![bf16::from_f32(0.5); 1 << 16], &[1 << 16]).unwrap();
    assert_eq!(v.sum(&[], false).unwrap().to_scalar::<f32>().unwrap(), 32768.0);
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let raw = rand_f64(7, 3 << 18);
    let big = tensor_of::<f32>(&raw, &[3, 1 << 18]);
    let wide = tensor_of::<f32>(&raw, &[1 << 12, 192]).t().unwrap();
    let half = tensor_of::<f16>(&raw, &[768, 1024]).flip(&[1]).unwrap();
    let run = || -> Vec<Vec<u8>> {
        let mut outs = Vec::new();
        for t in [&big, &wide, &half] {
            let nd = t.ndim() as isize;
            for dims in [vec![], vec![nd - 1], vec![0]] {
                for r in [
                    t.sum(&dims, false),
                    t.var(&dims, 1.0, false),
                    t.logsumexp(&dims, false),
                    t.norm(2.0, &dims, false),
                    t.max(&dims, false),
                ] {
                    outs.push(r.unwrap().storage().as_bytes().to_vec());
                }
                outs.push(
                    t.argmax(dims.first().copied(), false)
                        .unwrap()
                        .storage()
                        .as_bytes()
                        .to_vec(),
                );
            }
        }
        outs
    };
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(run);
    let three = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap()
        .install(run);
    assert_eq!(one, run());
    assert_eq!(three, run());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn random_shapes_and_dims_match_naive(
        shape in proptest::collection::vec(0usize..5, 0..5),
        mask in 0u32..32,
        keepdim: bool,
        layout in 0usize..5,
        seed in 0u64..1000,
    ) {
        let n: usize = shape.iter().product();
        let values = rand_f64(seed, n);
        let nd = shape.len();
        let dims: Vec<isize> = (0..nd).filter(|d| mask >> d & 1 == 1).map(|d| d as isize).collect();
        let (oshape, gs) = groups(&values, &shape, &dims, keepdim);
        let ts = layouts_of::<f64>(&values, &shape);
        let t = &ts[layout % ts.len()];
        let s = t.sum(&dims, keepdim).unwrap();
        prop_assert_eq!(s.shape(), &oshape[..]);
        for (got, g) in values_f64(&s).iter().zip(&gs) {
            prop_assert!((got - g.iter().sum::<f64>()).abs() < 1e-12);
        }
        let v = values_f64(&t.var(&dims, 1.0, keepdim).unwrap());
        for (got, g) in v.iter().zip(&gs) {
            prop_assert!(close(*got, naive_var(g, 1.0), 1e-10, 1.0));
        }
        match t.max(&dims, keepdim) {
            Ok(m) => for (got, g) in values_f64(&m).iter().zip(&gs) {
                prop_assert_eq!(*got, g.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
            },
            Err(_) => prop_assert!(n == 0 || gs.iter().any(|g| g.is_empty())),
        }
    }
}
