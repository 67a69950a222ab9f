//! The ops a training step of a CNN or a transformer needs, on the CUDA
//! backend (the emulated device under `cuda-emu`) against the CPU:
//! convolution and its gradients (im2col + the device GEMM: another
//! summation order, so within f32 tolerance), max pooling and its gradient
//! (the CPU's order: the same bits), `cat` and the gradient of views (pure
//! copies: the same bits), softmax gradients and `linear`.
#![cfg(feature = "cuda")]

use tessera_tensor::ops::conv::{
    conv2d_backward_bias, conv2d_backward_input, conv2d_backward_weight, Conv2dParams,
};
use tessera_tensor::ops::matmul::Activation;
use tessera_tensor::ops::pool::{max_pool2d_backward, Pool2dParams};
use tessera_tensor::{DType, Error, Layout, Tensor};

use super::cuda_backend::{assert_close, gpu, randn, DEV};

fn dev(t: &Tensor) -> Tensor {
    t.to_device(DEV).unwrap()
}

#[test]
fn conv2d_and_its_gradients_match_the_cpu() {
    if !gpu() {
        return;
    }
    let cases = [
        ([2, 3, 7, 6], [4, 3, 3, 2], Conv2dParams::default()),
        (
            [1, 2, 9, 8],
            [3, 2, 3, 3],
            Conv2dParams::default().padding(1).stride(2),
        ),
        (
            [3, 1, 8, 8],
            [2, 1, 2, 3],
            Conv2dParams::default().dilation(2).padding(1),
        ),
    ];
    for (i, (xs, ws, p)) in cases.into_iter().enumerate() {
        let (x, w, b) = (
            randn(&xs, DType::F32, i as u64),
            randn(&ws, DType::F32, 10 + i as u64),
            randn(&[ws[0]], DType::F32, 20 + i as u64),
        );
        let y = x.conv2d(&w, Some(&b), &p).unwrap();
        let yd = dev(&x).conv2d(&dev(&w), Some(&dev(&b)), &p).unwrap();
        assert_close(&format!("conv2d case {i}"), &y, &yd, 1e-5, 1.0);
        let g = randn(y.shape(), DType::F32, 30 + i as u64);
        let gd = dev(&g);
        assert_close(
            &format!("conv2d grad input case {i}"),
            &conv2d_backward_input(&g, &w, &xs, &p).unwrap(),
            &conv2d_backward_input(&gd, &dev(&w), &xs, &p).unwrap(),
            1e-5,
            1.0,
        );
        assert_close(
            &format!("conv2d grad weight case {i}"),
            &conv2d_backward_weight(&g, &x, &ws, &p).unwrap(),
            &conv2d_backward_weight(&gd, &dev(&x), &ws, &p).unwrap(),
            1e-5,
            1.0,
        );
        assert_close(
            &format!("conv2d grad bias case {i}"),
            &conv2d_backward_bias(&g).unwrap(),
            &conv2d_backward_bias(&gd).unwrap(),
            1e-5,
            1.0,
        );
    }
    // Grouped convolutions have no GPU path: a named error, not a wrong result.
    let (x, w) = (
        randn(&[1, 4, 5, 5], DType::F32, 1),
        randn(&[4, 2, 3, 3], DType::F32, 2),
    );
    let e = dev(&x)
        .conv2d(&dev(&w), None, &Conv2dParams::default().groups(2))
        .unwrap_err();
    assert!(matches!(e, Error::Device { op: "conv2d", .. }), "{e}");
    assert!(e.to_string().contains("groups = 2"), "{e}");
}

#[test]
fn max_pooling_and_its_gradient_equal_the_cpu_bit_for_bit() {
    if !gpu() {
        return;
    }
    let params = [
        Pool2dParams::new(2),
        Pool2dParams::new(3).stride(2).padding(1),
        Pool2dParams::new(3).stride(2).ceil_mode(true),
        Pool2dParams::new(2).dilation(2).stride(1),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (i, p) in params.iter().enumerate() {
            let what = format!("max_pool2d {dtype} case {i}");
            // Ties and a NaN: the index picked must be the CPU's.
            let mut x = randn(&[2, 3, 9, 8], dtype, i as u64)
                .mul_scalar(2.0)
                .unwrap()
                .round()
                .unwrap();
            if i == 1 {
                let nan = Tensor::full(&[1, 1, 1, 1], f64::NAN, dtype).unwrap();
                x = x.narrow(2, 0, 4).unwrap().contiguous().unwrap();
                x = Tensor::cat(&[x.clone(), nan.expand([2, 3, 1, 8]).unwrap()], 2).unwrap();
            }
            let (y, idx) = x.max_pool2d_with_indices(p).unwrap();
            let (yd, idxd) = dev(&x).max_pool2d_with_indices(p).unwrap();
            assert_close(&what, &y, &yd, 0.0, 0.0);
            assert_eq!(
                idx.to_vec::<i64>().unwrap(),
                idxd.cpu().unwrap().to_vec::<i64>().unwrap(),
                "{what}: indices"
            );
            let g = randn(y.shape(), dtype, 40 + i as u64);
            assert_close(
                &format!("{what} backward"),
                &max_pool2d_backward(&g, &idx, x.shape()).unwrap(),
                &max_pool2d_backward(&dev(&g), &idxd, x.shape()).unwrap(),
                0.0,
                0.0,
            );
        }
    }
}

#[test]
fn cat_and_view_gradients_copy_exactly() {
    if !gpu() {
        return;
    }
    for dtype in [DType::F32, DType::BF16, DType::I64, DType::Bool, DType::U8] {
        let a = randn(&[2, 3, 4], DType::F32, 1)
            .mul_scalar(9.0)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let b = randn(&[4, 3, 2], DType::F32, 2)
            .mul_scalar(9.0)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let bt = b.transpose(0, 2).unwrap();
        let c = randn(&[2, 5, 4], DType::F32, 3)
            .mul_scalar(9.0)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let cn = c.narrow(1, 1, 2).unwrap().flip(&[2]).unwrap();
        let cpu = Tensor::cat(&[&a, &bt, &cn], 1).unwrap();
        let gpu = Tensor::cat(&[&dev(&a), &dev(&bt), &dev(&cn)], 1).unwrap();
        assert_eq!(gpu.shape(), [2, 8, 4]);
        assert_eq!(gpu.device(), DEV);
        assert_eq!(
            cpu.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            gpu.cpu()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec::<f64>()
                .unwrap(),
            "cat {dtype}"
        );
        let stacked = Tensor::stack(&[dev(&a), dev(&a)], 0).unwrap();
        assert_eq!(stacked.shape(), [2, 2, 3, 4]);
    }
    // The gradient of narrow, select, a strided slice and a transpose of one.
    let base = [5usize, 6, 4];
    let full = Layout::contiguous(&base);
    let views = [
        full.narrow(1, 2, 3).unwrap(),
        full.slice(0, 1, 5, 2).unwrap(),
        full.slice(2, 0, 4, 3).unwrap().transpose(0, 2).unwrap(),
        full.narrow(0, 4, 1).unwrap(),
    ];
    for (i, v) in views.iter().enumerate() {
        let g = randn(v.shape(), DType::F32, 50 + i as u64);
        let cpu = g.view_backward(&base, v).unwrap();
        let gpu = dev(&g).view_backward(&base, v).unwrap();
        assert_close(&format!("view_backward {i}"), &cpu, &gpu, 0.0, 0.0);
    }
}

#[test]
fn softmax_gradients_and_linear_match_the_cpu() {
    if !gpu() {
        return;
    }
    let (dy, x) = (randn(&[3, 4, 7], DType::F32, 1), randn(&[3, 4, 7], DType::F32, 2));
    for dim in [-1isize, 1, 0] {
        let y = x.softmax(dim).unwrap();
        assert_close(
            &format!("softmax_backward dim {dim}"),
            &Tensor::softmax_backward(&dy, &y, dim).unwrap(),
            &Tensor::softmax_backward(&dev(&dy), &dev(&y), dim).unwrap(),
            1e-5,
            1.0,
        );
        let ly = x.log_softmax(dim).unwrap();
        assert_close(
            &format!("log_softmax_backward dim {dim}"),
            &Tensor::log_softmax_backward(&dy, &ly, dim).unwrap(),
            &Tensor::log_softmax_backward(&dev(&dy), &dev(&ly), dim).unwrap(),
            1e-5,
            1.0,
        );
    }
    let e = Tensor::softmax_backward(&dev(&dy), &dev(&x), 3).unwrap_err();
    assert!(e.to_string().contains("softmax_backward"), "{e}");
    let (w, b) = (randn(&[5, 7], DType::F32, 3), randn(&[5], DType::F32, 4));
    for act in [Activation::None, Activation::Relu] {
        assert_close(
            &format!("linear {act:?}"),
            &x.linear_act(&w, Some(&b), act).unwrap(),
            &dev(&x).linear_act(&dev(&w), Some(&dev(&b)), act).unwrap(),
            1e-5,
            1.0,
        );
    }
    assert!(dev(&x).linear(&dev(&w.t().unwrap()), None).is_err());
}
