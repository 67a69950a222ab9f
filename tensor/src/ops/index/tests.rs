use proptest::prelude::*;

use super::embedding_backward;
use crate::ops::naive::{i64_tensor, rand_indices, ravel, unravel};
use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
use crate::{bf16, DType, Element, Error, Tensor};

const SHAPES: &[&[usize]] = &[&[5], &[3, 4], &[2, 3, 4], &[2, 0, 3], &[4, 1, 3]];

/// Runs `check::<T>` for every dtype the index ops are tested on.
macro_rules! for_dtypes {
    ($check:ident) => {
        $check::<f32>();
        $check::<f64>();
        $check::<bf16>();
        $check::<i64>();
        $check::<bool>();
    };
}

fn index_select_matches<T: Element>() {
    for (s, shape) in SHAPES.iter().enumerate() {
        let v = rand_f64(s as u64, shape.iter().product());
        let want_vals = values_f64(&tensor_of::<T>(&v, shape));
        for d in 0..shape.len() {
            for (m, len) in [0usize, 1, 7].into_iter().enumerate() {
                if shape[d] == 0 && len > 0 {
                    continue;
                }
                let idx = rand_indices(100 + m as u64, len, shape[d]);
                let mut out_shape = shape.to_vec();
                out_shape[d] = len;
                let want: Vec<f64> = (0..out_shape.iter().product())
                    .map(|lin| {
                        let mut i = unravel(lin, &out_shape);
                        i[d] = idx[i[d]] as usize;
                        want_vals[ravel(&i, shape)]
                    })
                    .collect();
                // The index itself as a flipped view, too.
                let rev: Vec<i64> = idx.iter().rev().copied().collect();
                let indices = [
                    i64_tensor(idx.clone(), &[len]),
                    i64_tensor(rev, &[len]).flip(&[0]).unwrap(),
                ];
                for t in layouts_of::<T>(&v, shape) {
                    for ix in &indices {
                        let neg = d as isize - shape.len() as isize;
                        for dim in [d as isize, neg] {
                            let got = t.index_select(dim, ix).unwrap();
                            assert_eq!(got.shape(), &out_shape[..]);
                            assert_eq!(values_f64(&got), want, "{t:?} dim {dim}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn index_select_matches_naive() {
    for_dtypes!(index_select_matches);
}

fn gather_matches<T: Element>() {
    for (s, shape) in SHAPES.iter().enumerate() {
        let v = rand_f64(s as u64, shape.iter().product());
        let want_vals = values_f64(&tensor_of::<T>(&v, shape));
        for d in 0..shape.len() {
            if shape[d] == 0 {
                continue;
            }
            // Index no larger than self outside d, any size along d.
            let mut ishape: Vec<usize> = shape.iter().map(|&n| n.saturating_sub(1).max(n.min(1))).collect();
            ishape[d] = shape[d] + 2;
            let n: usize = ishape.iter().product();
            let idx = rand_indices(7 + d as u64, n, shape[d]);
            let want: Vec<f64> = (0..n)
                .map(|lin| {
                    let mut i = unravel(lin, &ishape);
                    i[d] = idx[lin] as usize;
                    want_vals[ravel(&i, shape)]
                })
                .collect();
            let index = i64_tensor(idx, &ishape);
            for t in layouts_of::<T>(&v, shape) {
                for ix in [index.clone(), index.t_last().contiguous().unwrap().t_last()] {
                    let got = t.gather(d as isize - shape.len() as isize, &ix).unwrap();
                    assert_eq!(got.shape(), &ishape[..]);
                    assert_eq!(values_f64(&got), want, "{t:?} dim {d}");
                }
            }
        }
    }
}

#[test]
fn gather_matches_naive() {
    for_dtypes!(gather_matches);
}

impl Tensor {
    /// The last two dims swapped (a view), or `self` below 2 dims.
    fn t_last(&self) -> Tensor {
        if self.ndim() < 2 {
            self.clone()
        } else {
            self.transpose(-1, -2).unwrap()
        }
    }
}

/// The naive scatter: `base` (row-major over `shape`) updated in row-major
/// order of the index by `combine`.
fn naive_scatter(
    base: &[f64],
    shape: &[usize],
    d: usize,
    (idx, ishape): (&[i64], &[usize]),
    (src, sshape): (&[f64], &[usize]),
    combine: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let mut out = base.to_vec();
    for (lin, &k) in idx.iter().enumerate() {
        let i = unravel(lin, ishape);
        let x = src[ravel(&i, sshape)];
        let mut o = i.clone();
        o[d] = k as usize;
        let p = ravel(&o, shape);
        out[p] = combine(out[p], x);
    }
    out
}

fn scatter_matches<T: Element>() {
    let is_bool = T::DTYPE == DType::Bool;
    for (s, shape) in SHAPES.iter().enumerate() {
        let numel: usize = shape.iter().product();
        let v: Vec<f64> = rand_f64(s as u64, numel)
            .iter()
            .map(|x| (x * 4.0).round())
            .collect();
        let base = values_f64(&tensor_of::<T>(&v, shape));
        for d in 0..shape.len() {
            if shape[d] == 0 {
                continue;
            }
            let ishape: Vec<usize> = shape
                .iter()
                .enumerate()
                .map(|(k, &n)| if k == d { n + 3 } else { n })
                .collect();
            let sshape: Vec<usize> = ishape.iter().map(|&n| n + 1).collect();
            let n: usize = ishape.iter().product();
            let idx = rand_indices(11 + d as u64, n, shape[d]);
            let sv: Vec<f64> = rand_f64(50 + s as u64, sshape.iter().product())
                .iter()
                .map(|x| (x * 4.0).round())
                .collect();
            let src_t = tensor_of::<T>(&sv, &sshape);
            let src = values_f64(&src_t);
            let index = i64_tensor(idx.clone(), &ishape);
            let set = naive_scatter(&base, shape, d, (&idx, &ishape), (&src, &sshape), |_, x| x);
            let add = naive_scatter(&base, shape, d, (&idx, &ishape), (&src, &sshape), |a, x| {
                if is_bool {
                    ((a != 0.0) | (x != 0.0)) as u8 as f64
                } else {
                    a + x
                }
            });
            let fill = naive_scatter(
                &base,
                shape,
                d,
                (&idx, &ishape),
                (&vec![1.0; src.len()], &sshape),
                |_, x| x,
            );
            for t in layouts_of::<T>(&v, shape) {
                let dim = d as isize - shape.len() as isize;
                let src_views = layouts_of::<T>(&sv, &sshape);
                for sv_t in [&src_t, src_views.last().unwrap()] {
                    assert_eq!(values_f64(&t.scatter(dim, &index, sv_t).unwrap()), set, "{t:?}");
                    assert_eq!(
                        values_f64(&t.scatter_add(dim, &index, sv_t).unwrap()),
                        add,
                        "{t:?}"
                    );
                }
                assert_eq!(values_f64(&t.scatter_value(dim, &index, 1.0).unwrap()), fill);
            }
        }
    }
}

#[test]
fn scatter_family_matches_naive() {
    for_dtypes!(scatter_matches);
}

#[test]
fn large_scatter_add_is_exact_and_ordered() {
    // Above the parallel threshold, with many repeats per target.
    let (rows, cols) = (300, 257);
    let idx = rand_indices(3, rows * cols, 40);
    let src: Vec<f64> = rand_f64(4, rows * cols)
        .iter()
        .map(|x| (x * 8.0).round())
        .collect();
    for d in 0..2 {
        let shape = if d == 0 { [40, cols] } else { [rows, 40] };
        let got = Tensor::zeros_f64(&shape)
            .scatter_add(
                d as isize,
                &i64_tensor(idx.clone(), &[rows, cols]),
                &tensor_of::<f64>(&src, &[rows, cols]),
            )
            .unwrap();
        let zeros = vec![0.0; shape.iter().product()];
        let want = naive_scatter(
            &zeros,
            &shape,
            d,
            (&idx, &[rows, cols]),
            (&src, &[rows, cols]),
            |a, x| a + x,
        );
        assert_eq!(values_f64(&got), want);
    }
}

impl Tensor {
    fn zeros_f64(shape: &[usize]) -> Tensor {
        Tensor::from_vec(vec![0.0f64; shape.iter().product()], shape).unwrap()
    }
}

#[test]
fn masked_fill_broadcasts() {
    let shape = [3, 4, 5];
    let v = rand_f64(1, 60);
    let mv: Vec<bool> = rand_f64(2, 20).iter().map(|&x| x > 0.0).collect();
    let mask = Tensor::from_vec(mv.clone(), &[4, 5]).unwrap();
    for t in layouts_of::<f32>(&v, &shape) {
        let got = values_f64(&t.masked_fill(&mask, -2.5).unwrap());
        let want: Vec<f64> = (0..60)
            .map(|i| if mv[i % 20] { -2.5 } else { v[i] as f32 as f64 })
            .collect();
        assert_eq!(got, want);
    }
    let lm = Tensor::from_vec(vec![true, false], &[2, 1, 1, 1]).unwrap();
    assert_eq!(
        layouts_of::<i64>(&v, &shape)[2]
            .masked_fill(&lm, 7.0)
            .unwrap()
            .shape(),
        &[2, 3, 4, 5]
    );
    let err = tensor_of::<f32>(&v, &shape)
        .masked_fill(&tensor_of::<f32>(&v, &shape), 0.0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DType {
                op: "masked_fill",
                ..
            }
        ),
        "{err}"
    );
    assert!(tensor_of::<f32>(&v, &shape)
        .masked_fill(&Tensor::from_vec(vec![true; 3], &[3]).unwrap(), 0.0)
        .is_err());
}

#[test]
fn one_hot_like_torch() {
    let t = i64_tensor(vec![2, 0, 1, 2, 0, 0], &[2, 3]).flip(&[1]).unwrap();
    let got = t.one_hot(None).unwrap();
    assert_eq!(got.shape(), &[2, 3, 3]);
    assert_eq!(got.dtype(), DType::I64);
    assert_eq!(
        got.to_vec::<i64>().unwrap(),
        vec![0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1]
    );
    assert_eq!(t.one_hot(Some(5)).unwrap().shape(), &[2, 3, 5]);
    assert_eq!(i64_tensor(vec![], &[0]).one_hot(None).unwrap().shape(), &[0, 0]);
    let e = t.one_hot(Some(2)).unwrap_err().to_string();
    assert!(e.contains("one_hot") && e.contains('2'), "{e}");
    assert!(i64_tensor(vec![-1], &[1]).one_hot(None).is_err());
    assert!(tensor_of::<f32>(&[1.0], &[1]).one_hot(None).is_err());
}

#[test]
fn embedding_matches_index_select() {
    let (v, d) = (11, 6);
    let w = rand_f64(5, v * d);
    let ids = rand_indices(6, 24, v);
    for wt in layouts_of::<f32>(&w, &[v, d]) {
        for ix in [
            i64_tensor(ids.clone(), &[2, 3, 4]),
            i64_tensor(ids.clone(), &[4, 3, 2]).permute(&[2, 1, 0]).unwrap(),
        ] {
            let got = wt.embedding(&ix, None).unwrap();
            let mut shape = ix.shape().to_vec();
            shape.push(d);
            assert_eq!(got.shape(), &shape[..]);
            let flat = ix.contiguous().unwrap().reshape(((),)).unwrap();
            assert_eq!(values_f64(&got), values_f64(&wt.index_select(0, &flat).unwrap()));
        }
    }
    assert_eq!(
        tensor_of::<f32>(&w, &[v, d])
            .embedding(&i64_tensor(vec![], &[0, 2]), None)
            .unwrap()
            .shape(),
        &[0, 2, d]
    );
}

fn naive_embedding_backward(g: &[f64], ids: &[i64], v: usize, d: usize, pad: Option<usize>) -> Vec<f64> {
    let mut out = vec![0.0; v * d];
    for (p, &i) in ids.iter().enumerate() {
        if Some(i as usize) == pad {
            continue;
        }
        for k in 0..d {
            out[i as usize * d + k] += g[p * d + k];
        }
    }
    out
}

#[test]
fn embedding_backward_sums_rows_in_order() {
    for (n, v, d, pad) in [
        (7, 5, 3, None),
        (40, 9, 4, Some(2)),
        (3000, 50, 17, Some(0)),
        (0, 4, 3, None),
    ] {
        let ids = rand_indices(n as u64, n, v);
        let g = rand_f64(9, n * d);
        let want = naive_embedding_backward(&g, &ids, v, d, pad);
        for gt in layouts_of::<f64>(&g, &[n, d]) {
            let got = embedding_backward(&gt, &i64_tensor(ids.clone(), &[n]), v, pad).unwrap();
            let got = values_f64(&got);
            assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12), "n={n}");
        }
        // bf16 accumulates in f32 and rounds once per element.
        let gb = tensor_of::<bf16>(&g, &[n, d]).reshape([1, n, d]).unwrap();
        let gbv = values_f64(&gb);
        let want_b = naive_embedding_backward(&gbv, &ids, v, d, pad);
        let got_b = values_f64(&embedding_backward(&gb, &i64_tensor(ids.clone(), &[1, n]), v, pad).unwrap());
        for (a, b) in got_b.iter().zip(&want_b) {
            assert!((a - b).abs() <= 1e-2 * b.abs().max(1.0), "bf16 {a} vs {b}");
        }
    }
}

#[test]
fn errors_name_op_and_values() {
    let t = tensor_of::<f32>(&rand_f64(1, 12), &[3, 4]);
    let msg = |e: Error| e.to_string();
    let e = msg(t.index_select(1, &i64_tensor(vec![0, 4], &[2])).unwrap_err());
    assert!(
        e.contains("index_select") && e.contains("index 4") && e.contains("size 4"),
        "{e}"
    );
    let e = msg(t.index_select(0, &i64_tensor(vec![-1], &[1])).unwrap_err());
    assert!(e.contains("-1"), "{e}");
    assert!(matches!(
        t.index_select(0, &tensor_of::<f32>(&[0.0], &[1])),
        Err(Error::DType { .. })
    ));
    assert!(matches!(
        t.index_select(0, &i64_tensor(vec![0], &[1]).to_dtype(DType::U32).unwrap()),
        Err(Error::DType { .. })
    ));
    assert!(t.index_select(0, &i64_tensor(vec![0, 1], &[1, 2])).is_err());
    assert!(t.index_select(2, &i64_tensor(vec![0], &[1])).is_err());
    assert!(t.index_select(-3, &i64_tensor(vec![0], &[1])).is_err());
    let e = msg(t.gather(0, &i64_tensor(vec![3], &[1, 1])).unwrap_err());
    assert!(e.contains("gather") && e.contains("index 3"), "{e}");
    assert!(t.gather(0, &i64_tensor(vec![0; 5], &[1, 5])).is_err());
    assert!(t.gather(0, &i64_tensor(vec![0], &[1])).is_err());
    let src = tensor_of::<f32>(&[1.0; 12], &[3, 4]);
    let e = msg(t
        .scatter_add(1, &i64_tensor(vec![1, 9], &[1, 2]), &src)
        .unwrap_err());
    assert!(
        e.contains("scatter_add") && e.contains("index 9") && e.contains("size 4"),
        "{e}"
    );
    // Nothing is written before the bad index is found: the op has no effect.
    assert!(t
        .scatter(
            0,
            &i64_tensor(vec![0, 1], &[1, 2]),
            &src.to_dtype(DType::F64).unwrap()
        )
        .is_err());
    assert!(t
        .scatter(
            0,
            &i64_tensor(vec![0; 8], &[4, 2]),
            &tensor_of::<f32>(&[1.0; 4], &[2, 2])
        )
        .is_err());
    assert!(t.scatter_value(0, &i64_tensor(vec![5], &[1, 1]), 1.0).is_err());
    let w = tensor_of::<f32>(&[0.0; 6], &[3, 2]);
    let e = msg(w.embedding(&i64_tensor(vec![3], &[1]), None).unwrap_err());
    assert!(
        e.contains("embedding") && e.contains("index 3") && e.contains("size 3"),
        "{e}"
    );
    assert!(tensor_of::<f32>(&[0.0; 6], &[6])
        .embedding(&i64_tensor(vec![0], &[1]), None)
        .is_err());
    let g = tensor_of::<f32>(&[0.0; 4], &[2, 2]);
    assert!(embedding_backward(&g, &i64_tensor(vec![0, 1], &[2]), 2, Some(2)).is_err());
    assert!(embedding_backward(&g, &i64_tensor(vec![0, 2], &[2]), 2, None).is_err());
    assert!(embedding_backward(&g, &i64_tensor(vec![0], &[1]), 2, None).is_err());
    assert!(embedding_backward(
        &g.to_dtype(DType::I64).unwrap(),
        &i64_tensor(vec![0, 1], &[2]),
        2,
        None
    )
    .is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// gather is the adjoint of scatter_add: <gather(y, i), s> == <y, scatter_add(0, i, s)>.
    #[test]
    fn gather_is_adjoint_of_scatter_add(
        shape in proptest::collection::vec(1usize..5, 1..4),
        dim_pick in 0usize..3,
        extra in 0usize..4,
        seed in 0u64..1000,
    ) {
        let d = dim_pick % shape.len();
        let mut ishape = shape.clone();
        ishape[d] = extra + 1;
        let n: usize = ishape.iter().product();
        let idx = i64_tensor(rand_indices(seed, n, shape[d]), &ishape);
        let yv: Vec<f64> = rand_f64(seed + 1, shape.iter().product()).iter().map(|x| (x * 8.0).round()).collect();
        let sv: Vec<f64> = rand_f64(seed + 2, n).iter().map(|x| (x * 8.0).round()).collect();
        let y = tensor_of::<f64>(&yv, &shape);
        let s = tensor_of::<f64>(&sv, &ishape);
        let g = values_f64(&y.gather(d as isize, &idx).unwrap());
        let z = Tensor::zeros_f64(&shape).scatter_add(d as isize, &idx, &s).unwrap();
        let lhs: f64 = g.iter().zip(&sv).map(|(a, b)| a * b).sum();
        let rhs: f64 = values_f64(&z).iter().zip(&yv).map(|(a, b)| a * b).sum();
        prop_assert_eq!(lhs, rhs);
        prop_assert_eq!(values_f64(&z).iter().sum::<f64>(), sv.iter().sum::<f64>());
    }
}
