//! The fused kernels (softmax/log_softmax backward, layer norm forward and
//! backward, cross-entropy forward and backward) against the same maths
//! composed from elementwise and reduction ops, values and gradients, plus
//! central finite differences of the fused forwards in f64.

use crate::ops::cross_entropy::{CrossEntropyOptions, Reduction};
use crate::test_util::{rand_f64, tensor_of, values_f64};
use crate::Tensor;

fn close(got: &Tensor, want: &Tensor, tol: f64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    for (i, (g, w)) in values_f64(got).iter().zip(values_f64(want)).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what} [{i}]: {g} vs {w}");
    }
}

fn rand_tensor(seed: u64, shape: &[usize], scale: f64) -> Tensor {
    let n = shape.iter().product();
    let v: Vec<f64> = rand_f64(seed, n).iter().map(|x| x * scale).collect();
    tensor_of::<f32>(&v, shape)
}

#[test]
fn softmax_backward_matches_composed_ops() {
    for (shape, dim) in [
        (vec![7usize, 33], -1isize),
        (vec![3, 5, 4], 1),
        (vec![300, 130], 0),
    ] {
        let x = rand_tensor(1, &shape, 4.0);
        let dy = rand_tensor(2, &shape, 1.0);
        let y = x.softmax(dim).unwrap();
        let fused = Tensor::softmax_backward(&dy, &y, dim).unwrap();
        // y·(dy − Σ dy·y)
        let s = dy.mul(&y).unwrap().sum(&[dim], true).unwrap();
        let composed = y.mul(&dy.sub(&s).unwrap()).unwrap();
        close(&fused, &composed, 1e-5, "softmax_backward");
        let ly = x.log_softmax(dim).unwrap();
        let fused = Tensor::log_softmax_backward(&dy, &ly, dim).unwrap();
        // dy − exp(y)·Σ dy
        let s = dy.sum(&[dim], true).unwrap();
        let composed = dy.sub(&ly.exp().unwrap().mul(&s).unwrap()).unwrap();
        close(&fused, &composed, 1e-5, "log_softmax_backward");
    }
    let y = rand_tensor(3, &[4, 4], 1.0);
    assert!(Tensor::softmax_backward(&y.narrow(0, 0, 2).unwrap(), &y, -1).is_err());
    assert!(Tensor::softmax_backward(&y, &y, 2).is_err());
}

#[test]
fn softmax_forward_of_transposed_and_strided_f32_matches_contiguous() {
    let x = rand_tensor(4, &[37, 70], 10.0);
    for dim in [0isize, 1] {
        let want = x.softmax(dim).unwrap();
        let xt = x.t().unwrap().contiguous().unwrap().t().unwrap();
        assert_eq!(values_f64(&xt.softmax(dim).unwrap()), values_f64(&want));
    }
}

/// layer_norm composed from mean/var/sub/mul/add.
fn layer_norm_composed(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Tensor {
    let mean = x.mean(&[-1], true).unwrap();
    let xc = x.sub(&mean).unwrap();
    let var = xc.mul(&xc).unwrap().mean(&[-1], true).unwrap();
    let rstd = var.add_scalar(eps).unwrap().rsqrt().unwrap();
    xc.mul(&rstd).unwrap().mul(w).unwrap().add(b).unwrap()
}

#[test]
fn layer_norm_matches_composed_ops_values_and_gradients() {
    for (rows, k) in [(5usize, 7usize), (64, 768), (33, 100)] {
        let x = rand_tensor(5, &[rows, k], 3.0).add_scalar(0.5).unwrap();
        let w = rand_tensor(6, &[k], 1.0);
        let b = rand_tensor(7, &[k], 1.0);
        let dy = rand_tensor(8, &[rows, k], 1.0);
        let (y, mean, rstd) = x.layer_norm_forward(&[k], Some(&w), Some(&b), 1e-5).unwrap();
        close(&y, &layer_norm_composed(&x, &w, &b, 1e-5), 2e-5, "layer_norm");
        let (dx, dw, db) = Tensor::layer_norm_backward(&dy, &x, &mean, &rstd, &[k], Some(&w)).unwrap();
        // Composed backward: x̂ = (x − mean)·rstd, g = dy·w,
        // dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), dw = Σ_rows dy·x̂, db = Σ_rows dy.
        let xhat = x.sub(&mean).unwrap().mul(&rstd).unwrap();
        let g = dy.mul(&w).unwrap();
        let a = g.mean(&[-1], true).unwrap();
        let c = g.mul(&xhat).unwrap().mean(&[-1], true).unwrap();
        let dx_c = g
            .sub(&a)
            .unwrap()
            .sub(&xhat.mul(&c).unwrap())
            .unwrap()
            .mul(&rstd)
            .unwrap();
        close(&dx, &dx_c, 5e-5, "layer_norm dx");
        close(
            &dw,
            &dy.mul(&xhat).unwrap().sum(&[0], false).unwrap(),
            1e-4,
            "layer_norm dw",
        );
        close(&db, &dy.sum(&[0], false).unwrap(), 1e-4, "layer_norm db");
    }
}

/// A one-hot (1 − ε)·[c = t] + ε/C matrix for the targets, zero rows for
/// ignored targets, and the per-row mask.
fn smoothed_targets(t: &[i64], c: usize, eps: f64, ignore: i64) -> (Tensor, Tensor) {
    let mut v = vec![0.0f32; t.len() * c];
    let mut mask = vec![0.0f32; t.len()];
    for (r, &ti) in t.iter().enumerate() {
        if ti == ignore {
            continue;
        }
        mask[r] = 1.0;
        for k in 0..c {
            v[r * c + k] = (eps / c as f64) as f32 + if k as i64 == ti { (1.0 - eps) as f32 } else { 0.0 };
        }
    }
    (
        Tensor::from_vec(v, &[t.len(), c]).unwrap(),
        Tensor::from_vec(mask, &[t.len(), 1]).unwrap(),
    )
}

#[test]
fn cross_entropy_matches_log_softmax_composition() {
    let (n, c) = (37usize, 11usize);
    let x = rand_tensor(9, &[n, c], 5.0);
    let mut t: Vec<i64> = rand_f64(10, n)
        .iter()
        .map(|v| ((v + 1.0) * 5.5) as i64 % c as i64)
        .collect();
    t[3] = -100;
    t[20] = -100;
    let target = Tensor::from_vec(t.clone(), &[n]).unwrap();
    for eps in [0.0, 0.1] {
        let (q, mask) = smoothed_targets(&t, c, eps, -100);
        let logp = x.log_softmax(-1).unwrap();
        // Per-row loss: −Σ_c q·log p.
        let per_row = logp.mul(&q).unwrap().sum(&[-1], false).unwrap().neg().unwrap();
        let count = n as f64 - 2.0;
        for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
            let opts = CrossEntropyOptions {
                label_smoothing: eps,
                reduction,
                ..Default::default()
            };
            let (loss, lse) = x.cross_entropy_forward(&target, opts).unwrap();
            let want = match reduction {
                Reduction::None => per_row.clone(),
                Reduction::Sum => per_row.sum(&[], false).unwrap(),
                Reduction::Mean => per_row.sum(&[], false).unwrap().div_scalar(count).unwrap(),
            };
            close(&loss, &want, 1e-5, "cross_entropy loss");
            // Composed gradient: (softmax − q)·mask·scale.
            let dloss = match reduction {
                Reduction::None => rand_tensor(11, &[n], 1.0),
                _ => Tensor::scalar(0.7f32),
            };
            let scale = match reduction {
                Reduction::None => dloss.reshape([n, 1]).unwrap(),
                Reduction::Sum => dloss.clone(),
                Reduction::Mean => dloss.div_scalar(count).unwrap(),
            };
            let want = x
                .softmax(-1)
                .unwrap()
                .sub(&q)
                .unwrap()
                .mul(&mask)
                .unwrap()
                .mul(&scale)
                .unwrap();
            let got = Tensor::cross_entropy_backward(&dloss, &x, &target, &lse, opts).unwrap();
            close(&got, &want, 1e-5, "cross_entropy dlogits");
        }
    }
}

#[test]
fn cross_entropy_gradient_matches_finite_differences_in_f64() {
    let (n, c) = (4usize, 5usize);
    let xv = rand_f64(12, n * c);
    let x = tensor_of::<f64>(&xv, &[n, c]);
    let target = Tensor::from_vec(vec![1i64, 4, -100, 0], &[n]).unwrap();
    let opts = CrossEntropyOptions {
        label_smoothing: 0.2,
        ..Default::default()
    };
    let (_, lse) = x.cross_entropy_forward(&target, opts).unwrap();
    let g = Tensor::cross_entropy_backward(&Tensor::scalar(1.0f64), &x, &target, &lse, opts).unwrap();
    let g = values_f64(&g);
    let h = 1e-6;
    for i in 0..n * c {
        let at = |d: f64| {
            let mut v = xv.clone();
            v[i] += d;
            values_f64(
                &tensor_of::<f64>(&v, &[n, c])
                    .cross_entropy_forward(&target, opts)
                    .unwrap()
                    .0,
            )[0]
        };
        let fd = (at(h) - at(-h)) / (2.0 * h);
        assert!((fd - g[i]).abs() < 1e-8, "[{i}] {fd} vs {}", g[i]);
    }
}

#[test]
fn cross_entropy_spatial_shapes_and_errors() {
    // [N, C, d] logits against [N, d] targets equal the [N·d, C] rows.
    let x = rand_tensor(13, &[2, 3, 4], 2.0);
    let t = Tensor::from_vec(vec![0i64, 1, 2, 1, 2, 0, -100, 1], &[2, 4]).unwrap();
    let opts = CrossEntropyOptions {
        reduction: Reduction::None,
        ..Default::default()
    };
    let (loss, lse) = x.cross_entropy_forward(&t, opts).unwrap();
    let rows = x.permute(&[0, 2, 1]).unwrap().reshape([8, 3]).unwrap();
    let (want, _) = rows
        .cross_entropy_forward(&t.reshape([8]).unwrap(), opts)
        .unwrap();
    close(&loss.reshape([8]).unwrap(), &want, 1e-6, "spatial loss");
    let dl = rand_tensor(14, &[2, 4], 1.0);
    let g = Tensor::cross_entropy_backward(&dl, &x, &t, &lse, opts).unwrap();
    let gr = Tensor::cross_entropy_backward(
        &dl.reshape([8]).unwrap(),
        &rows,
        &t.reshape([8]).unwrap(),
        &lse,
        opts,
    )
    .unwrap();
    close(
        &g,
        &gr.reshape([2, 4, 3]).unwrap().permute(&[0, 2, 1]).unwrap(),
        1e-6,
        "spatial grad",
    );
    // Unbatched [C] logits with a 0-d target.
    let (l1, _) = x
        .narrow(0, 0, 1)
        .unwrap()
        .reshape([12])
        .unwrap()
        .cross_entropy_forward(&Tensor::scalar(3i64), CrossEntropyOptions::default())
        .unwrap();
    assert_eq!(l1.shape(), &[] as &[usize]);
    // A strided 1-D row (a column of a matrix) equals its contiguous copy.
    let col = rand_tensor(15, &[5, 4], 2.0).select(1, 2).unwrap();
    let target = Tensor::scalar(1i64);
    let d = CrossEntropyOptions::default();
    let (got, lse) = col.cross_entropy_forward(&target, d).unwrap();
    let (want, _) = col
        .contiguous()
        .unwrap()
        .cross_entropy_forward(&target, d)
        .unwrap();
    close(&got, &want, 0.0, "strided 1-D loss");
    let g = Tensor::cross_entropy_backward(&Tensor::scalar(1.0f32), &col, &target, &lse, d).unwrap();
    let gc = Tensor::cross_entropy_backward(
        &Tensor::scalar(1.0f32),
        &col.contiguous().unwrap(),
        &target,
        &lse,
        d,
    )
    .unwrap();
    close(&g, &gc, 0.0, "strided 1-D grad");
    // Errors, never panics.
    let d = CrossEntropyOptions::default();
    assert!(x
        .cross_entropy_forward(&Tensor::from_vec(vec![5i64; 8], &[2, 4]).unwrap(), d)
        .is_err());
    assert!(x
        .cross_entropy_forward(&t.to_dtype(crate::DType::F32).unwrap(), d)
        .is_err());
    assert!(x.cross_entropy_forward(&t.reshape([8]).unwrap(), d).is_err());
    assert!(x
        .cross_entropy_forward(
            &t,
            CrossEntropyOptions {
                label_smoothing: 1.5,
                ..d
            }
        )
        .is_err());
    // Every target ignored: the mean is NaN, the gradient 0.
    let all = Tensor::from_vec(vec![-100i64; 8], &[2, 4]).unwrap();
    let (m, lse) = x.cross_entropy_forward(&all, d).unwrap();
    assert!(values_f64(&m)[0].is_nan());
    let g = Tensor::cross_entropy_backward(&Tensor::scalar(1.0f32), &x, &all, &lse, d).unwrap();
    assert!(values_f64(&g).iter().all(|&v| v == 0.0));
}
