//! Indexing, reshaping and ordering ops on the CUDA backend (the emulated
//! device under `cuda-emu`) against the CPU over awkward views and dtypes:
//! tril/triu, cumsum/cumprod, topk/sort/argsort, pad (all modes), repeat,
//! index_select/gather, masked_fill, and bilinear resampling with its
//! gradient. Each is a copy, a comparison, or arithmetic in the CPU's order
//! and math type, so the results are the same bits; group normalization
//! (f32 statistics on the device, f64 on the CPU) within tolerance.
#![cfg(feature = "cuda")]

use tessera_tensor::ops::interpolate::upsample_bilinear2d_backward;
use tessera_tensor::ops::pad::PadMode;
use tessera_tensor::{DType, Tensor};

use super::cuda_backend::{assert_close, gpu, randn, tol, views, DEV, FLOATS};

fn dev(t: &Tensor) -> Tensor {
    t.to_device(DEV).unwrap()
}

fn same(what: &str, cpu: &Tensor, gpu: &Tensor) {
    assert_close(what, cpu, gpu, 0.0, 0.0);
}

#[test]
fn triangles_scans_and_tiling_equal_the_cpu() {
    if !gpu() {
        return;
    }
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::I64, DType::Bool] {
        for (name, x) in views(&[2, 4, 5], DType::F32, 3) {
            let x = x.to_dtype(dtype).unwrap();
            let xd = dev(&x);
            for diag in [-7isize, -1, 0, 2, isize::MAX] {
                same(
                    &format!("tril {dtype} {name} {diag}"),
                    &x.tril(diag).unwrap(),
                    &xd.tril(diag).unwrap(),
                );
                same(
                    &format!("triu {dtype} {name} {diag}"),
                    &x.triu(diag).unwrap(),
                    &xd.triu(diag).unwrap(),
                );
            }
            for reps in [&[2, 1, 3][..], &[2, 1, 1, 2]] {
                same(
                    &format!("repeat {dtype} {name} {reps:?}"),
                    &x.repeat(reps).unwrap(),
                    &xd.repeat(reps).unwrap(),
                );
            }
            for (mode, ok) in [
                (PadMode::Constant(1.5), true),
                (PadMode::Reflect, true),
                (PadMode::Replicate, true),
            ] {
                let pads = [1, 2, 3, 0];
                if ok {
                    same(
                        &format!("pad {dtype} {name} {mode:?}"),
                        &x.pad(&pads, mode).unwrap(),
                        &xd.pad(&pads, mode).unwrap(),
                    );
                }
            }
        }
    }
    for dtype in FLOATS {
        for (name, x) in views(&[3, 4, 5], dtype, 7) {
            let xd = dev(&x);
            for dim in [0isize, 1, -1] {
                same(
                    &format!("cumsum {dtype} {name} {dim}"),
                    &x.cumsum(dim).unwrap(),
                    &xd.cumsum(dim).unwrap(),
                );
                same(
                    &format!("cumprod {dtype} {name} {dim}"),
                    &x.cumprod(dim).unwrap(),
                    &xd.cumprod(dim).unwrap(),
                );
            }
        }
    }
    // Reflect padding as wide as the dim is the CPU's error on the device too.
    let x = dev(&randn(&[2, 3], DType::F32, 1));
    assert!(x.pad(&[3, 0], PadMode::Reflect).is_err());
}

#[test]
fn topk_sort_and_argsort_equal_the_cpu() {
    if !gpu() {
        return;
    }
    for dtype in FLOATS {
        for (name, x) in views(&[3, 9], dtype, 5) {
            // Ties, a NaN and signed zeros: the order must be the CPU's total order.
            let mut v = x
                .to_dtype(DType::F64)
                .unwrap()
                .contiguous()
                .unwrap()
                .to_vec::<f64>()
                .unwrap();
            for (i, e) in v.iter_mut().enumerate() {
                *e = (*e * 2.0).round() / 2.0;
                if i == 4 {
                    *e = f64::NAN;
                }
                if i == 7 {
                    *e = -0.0;
                }
            }
            let x = Tensor::from_vec(v, &[3, 9]).unwrap().to_dtype(dtype).unwrap();
            let x = if name == "transposed" { x.t().unwrap() } else { x };
            let xd = dev(&x);
            for dim in 0..x.ndim() as isize {
                for largest in [true, false] {
                    let what = format!("{dtype} {name} dim {dim} largest {largest}");
                    let k = x.shape()[dim as usize].min(4);
                    let (v, i) = x.topk(k, dim, largest, true).unwrap();
                    let (vd, id) = xd.topk(k, dim, largest, true).unwrap();
                    same(&format!("topk values {what}"), &v, &vd);
                    same(&format!("topk indices {what}"), &i, &id);
                    let (v, i) = x.sort(dim, largest).unwrap();
                    let (vd, id) = xd.sort(dim, largest).unwrap();
                    same(&format!("sort values {what}"), &v, &vd);
                    same(&format!("sort indices {what}"), &i, &id);
                    same(
                        &format!("argsort {what}"),
                        &x.argsort(dim, largest).unwrap(),
                        &xd.argsort(dim, largest).unwrap(),
                    );
                }
            }
        }
    }
}

#[test]
fn gathers_and_masked_fill_equal_the_cpu() {
    if !gpu() {
        return;
    }
    let idx1 = Tensor::from_vec(vec![2i64, 0, 2, 1], &[4]).unwrap();
    let idx2 = Tensor::from_vec(vec![0i64, 2, 1, 1, 0, 2], &[2, 3]).unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::I64] {
        for (name, x) in views(&[3, 3], DType::F32, 9) {
            let x = x.to_dtype(dtype).unwrap();
            let xd = dev(&x);
            for dim in [0isize, 1] {
                same(
                    &format!("index_select {dtype} {name} {dim}"),
                    &x.index_select(dim, &idx1).unwrap(),
                    &xd.index_select(dim, &dev(&idx1)).unwrap(),
                );
                same(
                    &format!("gather {dtype} {name} {dim}"),
                    &x.gather(dim, &idx2).unwrap(),
                    &xd.gather(dim, &dev(&idx2)).unwrap(),
                );
            }
            if dtype.is_float() {
                let m = x.gt_scalar(0.0).unwrap();
                same(
                    &format!("masked_fill {dtype} {name}"),
                    &x.masked_fill(&m, -2.5).unwrap(),
                    &xd.masked_fill(&dev(&m), -2.5).unwrap(),
                );
            }
        }
    }
    // An index out of range is the CPU's named error.
    let bad = dev(&Tensor::from_vec(vec![3i64], &[1]).unwrap());
    let e = dev(&randn(&[3, 3], DType::F32, 1))
        .index_select(0, &bad)
        .unwrap_err();
    assert!(e.to_string().contains('3'), "{e}");
}

#[test]
fn bilinear_resampling_and_its_gradient_equal_the_cpu_bit_for_bit() {
    if !gpu() {
        return;
    }
    let cases = [
        ([5, 4], Some([9, 7]), None, false),
        ([5, 4], Some([3, 2]), None, true),
        ([4, 6], None, Some([1.5, 0.5]), false),
        ([3, 3], Some([1, 1]), None, true),
    ];
    for dtype in FLOATS {
        for (i, (hw, size, scale, ac)) in cases.into_iter().enumerate() {
            let x = randn(&[2, 3, hw[0], hw[1]], dtype, 20 + i as u64);
            let what = format!("interpolate {dtype} case {i}");
            let y = x.interpolate_bilinear(size, scale, ac).unwrap();
            same(&what, &y, &dev(&x).interpolate_bilinear(size, scale, ac).unwrap());
            let g = randn(y.shape(), dtype, 30 + i as u64);
            let scales = scale.map_or([None, None], |s| [Some(s[0]), Some(s[1])]);
            same(
                &format!("{what} backward"),
                &upsample_bilinear2d_backward(&g, x.shape(), ac, scales).unwrap(),
                &upsample_bilinear2d_backward(&dev(&g), x.shape(), ac, scales).unwrap(),
            );
        }
    }
}

#[test]
fn group_norm_and_its_gradients_equal_the_cpu() {
    if !gpu() {
        return;
    }
    for dtype in FLOATS {
        let t = tol(dtype).max(2e-5);
        for (shape, groups) in [(&[2, 6, 3, 2][..], 3), (&[3, 4][..], 2), (&[2, 4, 5][..], 1)] {
            let c = shape[1];
            let x = randn(shape, dtype, 1)
                .mul_scalar(2.0)
                .unwrap()
                .add_scalar(0.5)
                .unwrap();
            let (w, b) = (randn(&[c], dtype, 2), randn(&[c], dtype, 3));
            let (xd, wd, bd) = (dev(&x), dev(&w), dev(&b));
            for affine in [true, false] {
                let what = format!("group_norm {shape:?} {dtype} groups {groups} affine {affine}");
                let (wo, bo, wdo, bdo) = if affine {
                    (Some(&w), Some(&b), Some(&wd), Some(&bd))
                } else {
                    (None, None, None, None)
                };
                let (y, m, r) = x.group_norm_forward(groups, wo, bo, 1e-5).unwrap();
                let (yd, md, rd) = xd.group_norm_forward(groups, wdo, bdo, 1e-5).unwrap();
                assert_close(&format!("{what} y"), &y, &yd, t, 1.0);
                assert_close(&format!("{what} mean"), &m, &md, 1e-5, 1.0);
                assert_close(&format!("{what} rstd"), &r, &rd, 1e-5, 0.0);
                let dy = randn(shape, dtype, 9);
                let g = Tensor::group_norm_backward(&dy, &x, &m, &r, groups, wo).unwrap();
                let gd = Tensor::group_norm_backward(&dev(&dy), &xd, &md, &rd, groups, wdo).unwrap();
                assert_close(&format!("{what} dx"), &g.0, &gd.0, t, 1.0);
                assert_close(&format!("{what} dweight"), &g.1, &gd.1, t, 1.0);
                assert_close(&format!("{what} dbias"), &g.2, &gd.2, t, 1.0);
            }
        }
    }
}
