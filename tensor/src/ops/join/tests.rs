use proptest::prelude::*;

use crate::ops::naive::{ravel, unravel};
use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
use crate::{bf16, f16, DType, Element, Error, Tensor};

/// The naive concatenation of row-major `parts` (with `shapes`) along `d`.
fn naive_cat(parts: &[Vec<f64>], shapes: &[Vec<usize>], d: usize) -> (Vec<f64>, Vec<usize>) {
    let mut shape = shapes[0].clone();
    shape[d] = shapes.iter().map(|s| s[d]).sum();
    let out = (0..shape.iter().product())
        .map(|lin| {
            let mut i = unravel(lin, &shape);
            let mut k = 0;
            while i[d] >= shapes[k][d] {
                i[d] -= shapes[k][d];
                k += 1;
            }
            parts[k][ravel(&i, &shapes[k])]
        })
        .collect();
    (out, shape)
}

fn cat_matches<T: Element>() {
    for base in [vec![3usize, 4, 5], vec![2, 3], vec![6]] {
        for d in 0..base.len() {
            let shapes: Vec<Vec<usize>> = [2usize, 0, 3, 1]
                .iter()
                .map(|&n| {
                    let mut s = base.clone();
                    s[d] = n;
                    s
                })
                .collect();
            let raw: Vec<Vec<f64>> = shapes
                .iter()
                .enumerate()
                .map(|(k, s)| rand_f64(k as u64 + 10, s.iter().product()))
                .collect();
            let vals: Vec<Vec<f64>> = raw
                .iter()
                .zip(&shapes)
                .map(|(v, s)| values_f64(&tensor_of::<T>(v, s)))
                .collect();
            let (want, want_shape) = naive_cat(&vals, &shapes, d);
            // Every part in each of its layouts (by position, cycling).
            let views: Vec<Vec<Tensor>> = raw
                .iter()
                .zip(&shapes)
                .map(|(v, s)| layouts_of::<T>(v, s))
                .collect();
            for l in 0..5 {
                let parts: Vec<&Tensor> = views.iter().map(|v| &v[l % v.len()]).collect();
                for dim in [d as isize, d as isize - base.len() as isize] {
                    let got = Tensor::cat(&parts, dim).unwrap();
                    assert_eq!(got.shape(), &want_shape[..]);
                    assert_eq!(got.dtype(), T::DTYPE);
                    assert_eq!(values_f64(&got), want, "layout {l} dim {dim}");
                }
            }
        }
    }
}

#[test]
fn cat_matches_naive() {
    cat_matches::<f32>();
    cat_matches::<f64>();
    cat_matches::<bf16>();
    cat_matches::<i64>();
    cat_matches::<bool>();
}

#[test]
fn cat_promotes_like_torch() {
    let a = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    let b = Tensor::from_vec(vec![0.5f32], &[1]).unwrap();
    let c = Tensor::cat(&[a.clone(), b], 0).unwrap();
    assert_eq!(c.dtype(), DType::F32);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 0.5]);
    let h = Tensor::from_vec(vec![f16::ONE], &[1]).unwrap();
    let bh = Tensor::from_vec(vec![bf16::ONE], &[1]).unwrap();
    assert_eq!(Tensor::cat(&[h, bh], 0).unwrap().dtype(), DType::F32);
    let t = Tensor::from_vec(vec![true], &[1]).unwrap();
    let u = Tensor::from_vec(vec![7u8], &[1]).unwrap();
    assert_eq!(
        Tensor::cat(&[t, u], 0).unwrap().to_vec::<u8>().unwrap(),
        vec![1, 7]
    );
}

#[test]
fn large_cat_copies_rows_in_parallel() {
    // Many short rows (cat along the last dim) and few long rows (dim 0).
    let (r, c) = (700, 90);
    let a = rand_f64(1, r * c);
    let b = rand_f64(2, r * 3 * c);
    for (sa, sb, d) in [([r, c], [r, 3 * c], 1usize), ([c, r], [3 * c, r], 0)] {
        let ta = tensor_of::<f32>(&a, &sa);
        let tb = tensor_of::<f32>(&b, &sb);
        let va = values_f64(&ta);
        let vb = values_f64(&tb);
        let (want, shape) = naive_cat(&[va, vb], &[sa.to_vec(), sb.to_vec()], d);
        let got = Tensor::cat(&[&ta, &tb], d as isize).unwrap();
        assert_eq!(got.shape(), &shape[..]);
        assert_eq!(values_f64(&got), want);
    }
}

#[test]
fn stack_adds_a_dim() {
    let shape = [2, 3];
    let vs: Vec<Vec<f64>> = (0..3).map(|k| rand_f64(k, 6)).collect();
    let ts: Vec<Tensor> = vs
        .iter()
        .enumerate()
        .map(|(k, v)| layouts_of::<f64>(v, &shape)[k + 1].clone())
        .collect();
    for dim in [0isize, 1, 2, -1, -3] {
        let got = Tensor::stack(&ts, dim).unwrap();
        let d = if dim < 0 { dim + 3 } else { dim } as usize;
        let mut want_shape = shape.to_vec();
        want_shape.insert(d, 3);
        assert_eq!(got.shape(), &want_shape[..]);
        let want: Vec<f64> = (0..18)
            .map(|lin| {
                let mut i = unravel(lin, &want_shape);
                let k = i.remove(d);
                vs[k][ravel(&i, &shape)]
            })
            .collect();
        assert_eq!(values_f64(&got), want, "dim {dim}");
    }
    assert!(Tensor::stack(&ts, 3).is_err());
    assert!(Tensor::stack(&[ts[0].clone(), ts[0].t().unwrap()], 0).is_err());
    let empty: [Tensor; 0] = [];
    assert!(Tensor::stack(&empty, 0).is_err());
    let s0 = Tensor::stack(&[Tensor::scalar(1.0f32), Tensor::scalar(2.0f32)], 0).unwrap();
    assert_eq!(s0.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn split_and_chunk_follow_torch_sizes() {
    let t = tensor_of::<f32>(&rand_f64(3, 30), &[3, 10]);
    let sizes = |v: Vec<Tensor>| v.iter().map(|p| p.shape()[1]).collect::<Vec<_>>();
    assert_eq!(sizes(t.split(3, 1).unwrap()), vec![3, 3, 3, 1]);
    assert_eq!(sizes(t.split(20, -1).unwrap()), vec![10]);
    assert_eq!(sizes(t.chunk(4, 1).unwrap()), vec![3, 3, 3, 1]);
    assert_eq!(
        sizes(t.narrow(1, 0, 6).unwrap().chunk(4, 1).unwrap()),
        vec![2, 2, 2]
    );
    assert_eq!(sizes(t.chunk(20, 1).unwrap()), vec![1; 10]);
    assert_eq!(sizes(t.split_with_sizes(&[0, 4, 6], 1).unwrap()), vec![0, 4, 6]);
    // Views: no copy.
    assert!(t.split(3, 1).unwrap().iter().all(|p| p.shares_storage(&t)));
    let z = tensor_of::<f32>(&[], &[3, 0]);
    assert_eq!(z.split(0, 1).unwrap().len(), 1);
    assert_eq!(z.chunk(3, 1).unwrap().len(), 1);
    let e = t.split(0, 1).unwrap_err();
    assert!(matches!(e, Error::Arg { op: "split", .. }), "{e}");
    let e = t.split_with_sizes(&[4, 5], 1).unwrap_err().to_string();
    assert!(e.contains("split_with_sizes") && e.contains("10"), "{e}");
    assert!(t.split_with_sizes(&[usize::MAX, 11], 1).is_err());
    assert!(t.chunk(0, 1).is_err());
    assert!(t.split(1, 2).is_err());
}

#[test]
fn cat_errors_name_shapes() {
    let a = tensor_of::<f32>(&[0.0; 6], &[2, 3]);
    let b = tensor_of::<f32>(&[0.0; 8], &[2, 4]);
    let e = Tensor::cat(&[&a, &b], 0).unwrap_err().to_string();
    assert!(
        e.contains("cat") && e.contains("[2, 3]") && e.contains("[2, 4]"),
        "{e}"
    );
    assert_eq!(Tensor::cat(&[&a, &b], 1).unwrap().shape(), &[2, 7]);
    assert!(Tensor::cat(&[&a, &b.reshape([8]).unwrap()], 0).is_err());
    assert!(Tensor::cat(&[&a], 2).is_err());
    let empty: [&Tensor; 0] = [];
    assert!(Tensor::cat(&empty, 0).is_err());
    assert!(Tensor::cat(&[Tensor::scalar(1.0f32)], 0).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Splitting (by size, by sizes, in chunks) then concatenating gives the original.
    #[test]
    fn split_then_cat_round_trips(
        shape in proptest::collection::vec(0usize..6, 1..4),
        dim_pick in 0usize..3,
        size in 1usize..5,
        layout in 0usize..5,
        seed in 0u64..1000,
    ) {
        let d = dim_pick % shape.len();
        let v = rand_f64(seed, shape.iter().product());
        let views = layouts_of::<f32>(&v, &shape);
        let t = &views[layout % views.len()];
        let want = values_f64(t);
        for parts in [t.split(size, d as isize).unwrap(), t.chunk(size, d as isize).unwrap()] {
            let back = Tensor::cat(&parts, d as isize).unwrap();
            prop_assert_eq!(back.shape(), t.shape());
            prop_assert_eq!(values_f64(&back), want.clone());
        }
        let n = shape[d];
        let sizes = [n / 3, n - n / 3];
        let back = Tensor::cat(&t.split_with_sizes(&sizes, d as isize).unwrap(), d as isize).unwrap();
        prop_assert_eq!(values_f64(&back), want);
    }
}
