//! The CUDA backend against the CPU backend: every op with a CUDA path runs
//! on both over awkward shapes and views and must agree within per-dtype
//! tolerances. Without a device each GPU test prints
//! `skipped: no CUDA device (<reason>)` and passes; the error-path tests
//! run everywhere.
#![cfg(feature = "cuda")]

use tessera_tensor::{BinaryOp, DType, Device, Error, Generator, Result, Tensor, UnaryOp};

pub(crate) const DEV: Device = Device::Cuda(0);
pub(crate) const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Whether `cuda:0` works; prints why not.
pub(crate) fn gpu() -> bool {
    DEV.available()
        .map_err(|e| println!("skipped: no CUDA device ({e})"))
        .is_ok()
}

/// Relative tolerance of one rounding in `dtype` (plus kernel-vs-libm slack).
pub(crate) fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 2e-5,
    }
}

pub(crate) fn randn(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    let mut g = Generator::new(seed);
    Tensor::randn_with(shape, dtype, &mut g).unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.cpu()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
}

/// Asserts `gpu` (on the device) equals `cpu` elementwise within
/// `rtol·(|cpu| + scale)`, with equal shapes, dtypes and NaN positions.
pub(crate) fn assert_close(what: &str, cpu: &Tensor, gpu: &Tensor, rtol: f64, scale: f64) {
    assert_eq!(gpu.device(), DEV, "{what}: result not on the GPU");
    assert_eq!(cpu.shape(), gpu.shape(), "{what}: shape");
    assert_eq!(cpu.dtype(), gpu.dtype(), "{what}: dtype");
    for (i, (c, g)) in f64s(cpu).iter().zip(f64s(gpu)).enumerate() {
        let ok = (c.is_nan() && g.is_nan()) || c == &g || (c - g).abs() <= rtol * (c.abs() + scale);
        assert!(ok, "{what}: element {i}: cpu {c} vs gpu {g} (rtol {rtol})");
    }
}

/// Awkward views of a fresh tensor of `shape`: contiguous, transposed,
/// flipped, narrowed.
pub(crate) fn views(shape: &[usize], dtype: DType, seed: u64) -> Vec<(String, Tensor)> {
    let t = randn(shape, dtype, seed);
    let mut v = vec![("contiguous".to_string(), t.clone())];
    if t.ndim() >= 2 {
        let mut s = shape.to_vec();
        let n = s.len();
        s.swap(n - 1, n - 2);
        v.push((
            "transposed".into(),
            randn(&s, dtype, seed + 1).transpose(-1, -2).unwrap(),
        ));
    }
    if t.ndim() >= 1 {
        v.push(("flipped".into(), t.flip(&[0]).unwrap()));
        let mut s = shape.to_vec();
        s[0] += 2;
        v.push((
            "narrowed".into(),
            randn(&s, dtype, seed + 2).narrow(0, 1, shape[0]).unwrap(),
        ));
    }
    v
}

const SHAPES: [&[usize]; 5] = [&[1], &[37], &[3, 33], &[2, 5, 67], &[0, 3]];

#[test]
fn round_trips_keep_every_dtype_and_view() {
    if !gpu() {
        return;
    }
    for dtype in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::U8,
        DType::Bool,
    ] {
        for shape in SHAPES {
            for (name, x) in views(shape, DType::F32, 1) {
                let x = x.to_dtype(dtype).unwrap();
                let g = x.to_device(DEV).unwrap();
                assert_eq!(g.device(), DEV);
                assert_close(
                    &format!("{dtype} {shape:?} {name}"),
                    &x.contiguous().unwrap(),
                    &g,
                    0.0,
                    0.0,
                );
                // A strided GPU view copies back strided.
                let view = if g.ndim() >= 2 {
                    g.transpose(0, 1).unwrap()
                } else {
                    g.flip(&[0]).unwrap()
                };
                let want = if x.ndim() >= 2 {
                    x.transpose(0, 1).unwrap()
                } else {
                    x.flip(&[0]).unwrap()
                };
                let back = view.cpu().unwrap();
                assert_eq!(back.device(), Device::Cpu);
                assert_eq!(f64s(&back), f64s(&want), "{dtype} {shape:?} {name} strided");
            }
        }
    }
}

/// `t` moved into `op`'s domain (positive for logs and roots).
fn unary_domain(op: UnaryOp, t: &Tensor) -> Result<Tensor> {
    match op {
        UnaryOp::Log | UnaryOp::Log1p | UnaryOp::Sqrt | UnaryOp::Rsqrt => t.abs()?.add_scalar(0.5),
        _ => Ok(t.clone()),
    }
}

#[test]
fn unary_ops_match_the_cpu() {
    if !gpu() {
        return;
    }
    for dtype in FLOATS {
        for shape in SHAPES {
            for (view, x) in views(shape, dtype, 2) {
                let g = x.to_device(DEV).unwrap();
                // Every op of the shared definition, without a list here.
                for op in UnaryOp::ALL {
                    let what = format!("{op:?} {dtype} {shape:?} {view}");
                    let f = |t: &Tensor| unary_domain(op, t)?.unary_op(op);
                    assert_close(&what, &f(&x).unwrap(), &f(&g).unwrap(), 2.0 * tol(dtype), 1e-3);
                }
            }
        }
    }
    let ints = Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap();
    assert_close(
        "exp i64",
        &ints.exp().unwrap(),
        &ints.to_device(DEV).unwrap().exp().unwrap(),
        1e-6,
        0.0,
    );
}

#[test]
fn binary_ops_broadcast_like_the_cpu() {
    if !gpu() {
        return;
    }
    let pairs: [(&[usize], &[usize]); 5] = [
        (&[37], &[37]),
        (&[5, 1, 7], &[3, 1]),
        (&[1], &[4, 33]),
        (&[0, 3], &[3]),
        (&[2, 3, 65], &[65]),
    ];
    for dtype in FLOATS {
        for (sa, sb) in pairs {
            for (va, a) in views(sa, dtype, 3) {
                let b = randn(sb, dtype, 4).flip(&[-1]).unwrap();
                let (ga, gb) = (a.to_device(DEV).unwrap(), b.to_device(DEV).unwrap());
                for op in BinaryOp::ALL {
                    let what = format!("{op:?} {dtype} {sa:?} {va} with {sb:?}");
                    let f = |a: &Tensor, b: &Tensor| match op {
                        BinaryOp::Pow => a.abs()?.pow(b),
                        _ => a.binary_op(op, b),
                    };
                    assert_close(
                        &what,
                        &f(&a, &b).unwrap(),
                        &f(&ga, &gb).unwrap(),
                        2.0 * tol(dtype),
                        1e-2,
                    );
                }
            }
        }
    }
    let (h, f) = (randn(&[4, 5], DType::F16, 5), randn(&[5], DType::F32, 6));
    let gpu = h.to_device(DEV).unwrap().add(&f.to_device(DEV).unwrap()).unwrap();
    assert_close("f16 + f32 promotes", &h.add(&f).unwrap(), &gpu, 1e-6, 0.0);
    let cpu_scalar = Tensor::scalar(2.0f32);
    assert_close(
        "gpu * cpu scalar",
        &f.mul(&cpu_scalar).unwrap(),
        &f.to_device(DEV).unwrap().mul(&cpu_scalar).unwrap(),
        0.0,
        0.0,
    );
}

#[test]
fn scalar_forms_match_the_cpu() {
    if !gpu() {
        return;
    }
    type F = fn(&Tensor) -> Result<Tensor>;
    let ops: [(&str, F); 7] = [
        ("add_scalar", |t| t.add_scalar(0.1)),
        ("sub_scalar", |t| t.sub_scalar(0.3)),
        ("rsub_scalar", |t| t.rsub_scalar(1.5)),
        ("mul_scalar", |t| t.mul_scalar(-2.5)),
        ("div_scalar", |t| t.div_scalar(3.0)),
        ("rdiv_scalar", |t| t.rdiv_scalar(1.0)),
        ("pow_scalar", |t| t.abs()?.pow_scalar(1.7)),
    ];
    for dtype in FLOATS {
        for (view, x) in views(&[3, 33], dtype, 7) {
            let g = x.to_device(DEV).unwrap();
            for (name, f) in ops {
                assert_close(
                    &format!("{name} {dtype} {view}"),
                    &f(&x).unwrap(),
                    &f(&g).unwrap(),
                    tol(dtype),
                    1e-3,
                );
            }
        }
    }
}

#[test]
fn casts_round_like_the_cpu() {
    if !gpu() {
        return;
    }
    let x = randn(&[3, 67], DType::F32, 8).mul_scalar(300.0).unwrap();
    for from in [DType::F32, DType::F16, DType::BF16, DType::I64] {
        for to in [DType::F32, DType::F16, DType::BF16, DType::I64, DType::U8] {
            let c = x.to_dtype(from).unwrap();
            let g = c.to_device(DEV).unwrap().transpose(0, 1).unwrap();
            assert_close(
                &format!("{from} -> {to}"),
                &c.t().unwrap().to_dtype(to).unwrap().contiguous().unwrap(),
                &g.to_dtype(to).unwrap(),
                0.0,
                0.0,
            );
        }
    }
}

/// argmax/argmin and max_dim/min_dim on ties (the first index wins), NaN
/// (it wins either way, as in PyTorch) and signed zeros, along rows (one
/// warp per row) and columns (one thread per column).
#[test]
fn arg_extremes_take_ties_and_nan_as_the_cpu() {
    if !gpu() {
        return;
    }
    let rows = [
        [1.0, 3.0, 3.0, -2.0, -2.0, 0.5],
        [f32::NAN, 3.0, f32::NAN, -2.0, 7.0, 0.5],
        [0.0, -0.0, 0.0, -0.0, 0.0, -0.0],
        [-1.0, -1.0, -1.0, -1.0, -1.0, -1.0],
    ];
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    for dtype in FLOATS {
        let x = Tensor::from_vec(flat.clone(), &[4, 6])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let g = x.to_device(DEV).unwrap();
        for dim in [0isize, 1] {
            for (name, c, d) in [
                ("argmax", x.argmax(Some(dim), false), g.argmax(Some(dim), false)),
                ("argmin", x.argmin(Some(dim), false), g.argmin(Some(dim), false)),
                (
                    "max_dim",
                    x.max_dim(dim, false).map(|p| p.1),
                    g.max_dim(dim, false).map(|p| p.1),
                ),
                (
                    "min_dim",
                    x.min_dim(dim, false).map(|p| p.1),
                    g.min_dim(dim, false).map(|p| p.1),
                ),
            ] {
                assert_close(
                    &format!("{name} {dtype} dim {dim}"),
                    &c.unwrap(),
                    &d.unwrap(),
                    0.0,
                    0.0,
                );
            }
        }
        let (c, d) = (x.argmin(None, false).unwrap(), g.argmin(None, false).unwrap());
        assert_eq!(
            c.to_scalar::<i64>().unwrap(),
            6,
            "argmin of a tensor with NaN: the first NaN"
        );
        assert_close(&format!("argmin all {dtype}"), &c, &d, 0.0, 0.0);
    }
}

#[test]
fn reductions_match_the_cpu() {
    if !gpu() {
        return;
    }
    let dims: [&[isize]; 5] = [&[], &[0], &[-1], &[0, 2], &[1]];
    for dtype in FLOATS {
        for (view, x) in views(&[3, 33, 65], dtype, 9) {
            let g = x.to_device(DEV).unwrap();
            for d in dims {
                for keep in [false, true] {
                    let what = format!("{dtype} {view} dims {d:?} keepdim {keep}");
                    assert_close(
                        &format!("sum {what}"),
                        &x.sum(d, keep).unwrap(),
                        &g.sum(d, keep).unwrap(),
                        4.0 * tol(dtype),
                        1.0,
                    );
                    assert_close(
                        &format!("mean {what}"),
                        &x.mean(d, keep).unwrap(),
                        &g.mean(d, keep).unwrap(),
                        4.0 * tol(dtype),
                        0.1,
                    );
                    assert_close(
                        &format!("max {what}"),
                        &x.max(d, keep).unwrap(),
                        &g.max(d, keep).unwrap(),
                        0.0,
                        0.0,
                    );
                    assert_close(
                        &format!("min {what}"),
                        &x.min(d, keep).unwrap(),
                        &g.min(d, keep).unwrap(),
                        0.0,
                        0.0,
                    );
                    // Factors near 1: products of thousands stay finite.
                    let (xp, gp) = (
                        x.mul_scalar(0.01).unwrap().exp().unwrap(),
                        g.mul_scalar(0.01).unwrap().exp().unwrap(),
                    );
                    assert_close(
                        &format!("prod {what}"),
                        &xp.prod(d, keep).unwrap(),
                        &gp.prod(d, keep).unwrap(),
                        8.0 * tol(dtype),
                        0.0,
                    );
                }
            }
            for max in [true, false] {
                let name = if max { "max" } else { "min" };
                let extreme_dim = |t: &Tensor, dim| {
                    if max {
                        t.max_dim(dim, true)
                    } else {
                        t.min_dim(dim, true)
                    }
                };
                let arg = |t: &Tensor, dim, keep| {
                    if max {
                        t.argmax(dim, keep)
                    } else {
                        t.argmin(dim, keep)
                    }
                };
                for dim in [0isize, 1, -1] {
                    let (cv, ci) = extreme_dim(&x, dim).unwrap();
                    let (gv, gi) = extreme_dim(&g, dim).unwrap();
                    assert_close(&format!("{name}_dim values {dim}"), &cv, &gv, 0.0, 0.0);
                    assert_close(&format!("{name}_dim indices {dim}"), &ci, &gi, 0.0, 0.0);
                    let what = format!("arg{name} {dtype} {view} {dim}");
                    assert_close(
                        &what,
                        &arg(&x, Some(dim), false).unwrap(),
                        &arg(&g, Some(dim), false).unwrap(),
                        0.0,
                        0.0,
                    );
                }
                assert_close(
                    &format!("arg{name} all"),
                    &arg(&x, None, true).unwrap(),
                    &arg(&g, None, true).unwrap(),
                    0.0,
                    0.0,
                );
            }
        }
    }
    let empty = Tensor::zeros(&[0, 3], DType::F32)
        .unwrap()
        .to_device(DEV)
        .unwrap();
    assert_eq!(f64s(&empty.sum(&[0], false).unwrap()), vec![0.0; 3]);
    assert_eq!(f64s(&empty.prod(&[0], false).unwrap()), vec![1.0; 3]);
    assert!(empty.max(&[0], false).is_err());
    assert!(empty.min(&[0], false).is_err());
}

#[test]
fn softmax_matches_the_cpu() {
    if !gpu() {
        return;
    }
    let shapes: [&[usize]; 4] = [&[1, 1], &[7, 33], &[3, 129, 5], &[0, 4]];
    for dtype in FLOATS {
        for shape in shapes {
            for (view, x) in views(shape, dtype, 10) {
                let x = x.mul_scalar(4.0).unwrap();
                let g = x.to_device(DEV).unwrap();
                for dim in [0isize, -1] {
                    let what = format!("{dtype} {shape:?} {view} dim {dim}");
                    assert_close(
                        &format!("softmax {what}"),
                        &x.softmax(dim).unwrap(),
                        &g.softmax(dim).unwrap(),
                        2.0 * tol(dtype),
                        1e-3,
                    );
                    let (c, gl) = (x.log_softmax(dim).unwrap(), g.log_softmax(dim).unwrap());
                    assert_close(&format!("log_softmax {what}"), &c, &gl, 2.0 * tol(dtype), 1.0);
                }
            }
        }
    }
}

#[test]
fn layer_norm_forward_and_backward_match_the_cpu() {
    if !gpu() {
        return;
    }
    let shapes: [&[usize]; 3] = [&[1, 1], &[5, 33], &[3, 7, 257]];
    for dtype in FLOATS {
        for shape in shapes {
            let k = shape[shape.len() - 1];
            let x = randn(shape, dtype, 11).add_scalar(3.0).unwrap();
            let (w, b) = (randn(&[k], dtype, 12), randn(&[k], dtype, 13));
            let dy = randn(shape, dtype, 14);
            let on_gpu = |t: &Tensor| t.to_device(DEV).unwrap();
            let (gx, gw, gb, gdy) = (on_gpu(&x), on_gpu(&w), on_gpu(&b), on_gpu(&dy));
            for affine in [false, true] {
                let (cw, cb) = if affine {
                    (Some(&w), Some(&b))
                } else {
                    (None, None)
                };
                let (gw_, gb_) = if affine {
                    (Some(&gw), Some(&gb))
                } else {
                    (None, None)
                };
                let what = format!("{dtype} {shape:?} affine {affine}");
                let c = x.layer_norm_forward(&[k], cw, cb, 1e-5).unwrap();
                let g = gx.layer_norm_forward(&[k], gw_, gb_, 1e-5).unwrap();
                assert_close(&format!("y {what}"), &c.0, &g.0, 4.0 * tol(dtype), 1.0);
                assert_close(&format!("mean {what}"), &c.1, &g.1, 1e-4, 1.0);
                assert_close(&format!("rstd {what}"), &c.2, &g.2, 1e-3, 0.0);
                let cb_ = Tensor::layer_norm_backward(&dy, &x, &c.1, &c.2, &[k], cw).unwrap();
                let gb2 = Tensor::layer_norm_backward(&gdy, &gx, &g.1, &g.2, &[k], gw_).unwrap();
                let rows = (x.numel() / k) as f64;
                assert_close(&format!("dx {what}"), &cb_.0, &gb2.0, 8.0 * tol(dtype), 1.0);
                assert_close(
                    &format!("dw {what}"),
                    &cb_.1,
                    &gb2.1,
                    8.0 * tol(dtype),
                    rows.sqrt(),
                );
                assert_close(
                    &format!("db {what}"),
                    &cb_.2,
                    &gb2.2,
                    8.0 * tol(dtype),
                    rows.sqrt(),
                );
            }
        }
    }
}

#[test]
fn matmul_matches_the_cpu() {
    if !gpu() {
        return;
    }
    let cases: [(&[usize], &[usize]); 7] = [
        (&[1, 1], &[1, 1]),
        (&[33, 65], &[65, 17]),
        (&[130, 129], &[129, 131]),
        (&[2, 1, 5, 7], &[3, 7, 9]),
        (&[7], &[7, 5]),
        (&[4, 7], &[7]),
        (&[3, 0], &[0, 5]),
    ];
    for dtype in FLOATS {
        for (sa, sb) in cases {
            let k = sa[sa.len() - 1] as f64;
            let (a, b) = (randn(sa, dtype, 15), randn(sb, dtype, 16));
            let (ga, gb) = (a.to_device(DEV).unwrap(), b.to_device(DEV).unwrap());
            let what = format!("{dtype} {sa:?} @ {sb:?}");
            let (c, g) = (a.matmul(&b).unwrap(), ga.matmul(&gb).unwrap());
            assert_close(&what, &c, &g, 4.0 * tol(dtype), k.sqrt());
            if a.ndim() >= 2 && b.ndim() >= 2 {
                // Transposed operands (used in place) and a flipped one (copied).
                let (at, bt) = (
                    a.transpose(-1, -2).unwrap().contiguous().unwrap(),
                    b.transpose(-1, -2).unwrap().contiguous().unwrap(),
                );
                let (gat, gbt) = (at.to_device(DEV).unwrap(), bt.to_device(DEV).unwrap());
                let c = at
                    .transpose(-1, -2)
                    .unwrap()
                    .matmul(&bt.transpose(-1, -2).unwrap())
                    .unwrap();
                let g = gat
                    .transpose(-1, -2)
                    .unwrap()
                    .matmul(&gbt.transpose(-1, -2).unwrap())
                    .unwrap();
                assert_close(&format!("{what} transposed"), &c, &g, 4.0 * tol(dtype), k.sqrt());
                let c = a.flip(&[-1]).unwrap().matmul(&b.flip(&[-2]).unwrap()).unwrap();
                let g = ga.flip(&[-1]).unwrap().matmul(&gb.flip(&[-2]).unwrap()).unwrap();
                assert_close(&format!("{what} flipped"), &c, &g, 4.0 * tol(dtype), k.sqrt());
            }
        }
    }
}

#[test]
fn embedding_matches_the_cpu() {
    if !gpu() {
        return;
    }
    let idx = Tensor::from_vec(vec![0i64, 6, 3, 3, 1, 6], &[2, 3]).unwrap();
    for dtype in FLOATS {
        let w = randn(&[7, 33], dtype, 17);
        let g = w
            .to_device(DEV)
            .unwrap()
            .embedding(&idx.to_device(DEV).unwrap(), None)
            .unwrap();
        assert_close(
            &format!("embedding {dtype}"),
            &w.embedding(&idx, None).unwrap(),
            &g,
            0.0,
            0.0,
        );
    }
    let bad = Tensor::from_vec(vec![7i64], &[1])
        .unwrap()
        .to_device(DEV)
        .unwrap();
    let w = randn(&[7, 3], DType::F32, 18).to_device(DEV).unwrap();
    assert!(matches!(w.embedding(&bad, None), Err(Error::Index { .. })));
}

#[test]
fn random_tensors_equal_the_cpu_generator() {
    if !gpu() {
        return;
    }
    for dtype in FLOATS {
        for n in [1usize, 7, 1001] {
            let (mut gc, mut gg) = (Generator::new(99), Generator::new(99));
            let _ = Tensor::rand_with(&[3], DType::F32, &mut gc).unwrap();
            let _ = Tensor::rand_with(&[3], (DType::F32, DEV), &mut gg).unwrap();
            let c = Tensor::rand_with(&[n], dtype, &mut gc).unwrap();
            let g = Tensor::rand_with(&[n], (dtype, DEV), &mut gg).unwrap();
            assert_close(&format!("rand {dtype} {n}"), &c, &g, 0.0, 0.0);
            assert_eq!(gc.offset(), gg.offset());
            // CUDA's f64 log/cos/sin may differ from libm in the last bit,
            // which moves a value on a rounding boundary by one ulp.
            let c = Tensor::randn_with(&[n], dtype, &mut gc).unwrap();
            let g = Tensor::randn_with(&[n], (dtype, DEV), &mut gg).unwrap();
            assert_close(&format!("randn {dtype} {n}"), &c, &g, ulp(dtype), 0.0);
            let c = Tensor::normal_with(&[n], 0.5, 3.0, dtype, &mut gc).unwrap();
            let g = Tensor::normal_with(&[n], 0.5, 3.0, (dtype, DEV), &mut gg).unwrap();
            assert_close(&format!("normal {dtype} {n}"), &c, &g, ulp(dtype), 0.0);
            assert_eq!(gc.offset(), gg.offset());
        }
    }
}

/// One unit in the last place of `dtype`, relative.
fn ulp(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 9.8e-4,
        DType::BF16 => 7.9e-3,
        _ => 1.2e-7,
    }
}

/// The GPU generator's reference (`tessera_cuda_kernels::philox`, which the
/// kernels match bit for bit in the kernel crate's emulator tests) equals
/// the CPU generator exactly, from any generator offset: so a GPU `rand`,
/// `randn` or `normal` gives the CPU's numbers. Runs without a GPU.
#[test]
fn the_gpu_generator_reference_is_the_cpu_generator() {
    use tessera_cuda_kernels::philox;
    for (seed, skip) in [(0u64, 0usize), (99, 5), (u64::MAX, 1001)] {
        for dtype in FLOATS {
            let digits = match dtype {
                DType::F16 => 11,
                DType::BF16 => 8,
                _ => 24,
            };
            let mut g = Generator::new(seed);
            let _ = Tensor::rand_with(&[skip], DType::F64, &mut g).unwrap();
            let (start, n) = (g.offset(), 37);
            let got = Tensor::rand_with(&[n], dtype, &mut g).unwrap();
            let want = philox::uniform_f32(seed, start * 4, n, 0.0, 1.0, digits);
            let want = Tensor::from_vec(want, &[n]).unwrap().to_dtype(dtype).unwrap();
            assert_eq!(
                got.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
                want.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
                "rand {dtype} seed {seed}"
            );
            for (mean, std) in [(0.0, 1.0), (-2.0, 0.25)] {
                let start = g.offset();
                let got = Tensor::normal_with(&[n], mean, std, dtype, &mut g).unwrap();
                let want = philox::normal(seed, start, n, mean, std);
                let want = Tensor::from_vec(want, &[n]).unwrap().to_dtype(dtype).unwrap();
                let (got, want) = (
                    got.to_dtype(DType::F64).unwrap(),
                    want.to_dtype(DType::F64).unwrap(),
                );
                assert_eq!(
                    got.to_vec::<f64>().unwrap(),
                    want.to_vec::<f64>().unwrap(),
                    "normal {dtype} seed {seed}"
                );
            }
        }
    }
}

#[test]
fn gpu_errors_name_the_op_and_device() {
    if !gpu() {
        return;
    }
    let c = randn(&[3, 4], DType::F32, 19);
    let g = c.to_device(DEV).unwrap();
    for e in [
        c.add(&g).unwrap_err(),
        g.matmul(&c.t().unwrap()).unwrap_err(),
        // Integer running sums have no kernel (the CPU gives i64).
        g.to_dtype(DType::I64).unwrap().cumsum(0).unwrap_err(),
    ] {
        assert!(matches!(e, Error::Device { .. }), "{e}");
        assert!(e.to_string().contains("cuda:0"), "{e}");
    }
    let e = g
        .to_dtype(DType::F64)
        .unwrap()
        .matmul(&g.to_dtype(DType::F64).unwrap().t().unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("matmul"), "{e}");
    assert!(c.to_device(Device::Cuda(4096)).is_err());
}

#[test]
fn moving_to_a_missing_gpu_is_an_error_naming_the_driver_or_device() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let e = t.to_device(Device::Cuda(4096)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Device { op: "to_device", .. }), "{msg}");
    assert!(msg.contains("cuda:4096"), "{msg}");
    assert!(
        msg.contains("no CUDA driver found") || msg.contains("no CUDA device") || msg.contains("NVRTC"),
        "{msg}"
    );
    if !gpu() {
        // No driver here: cuda:0 is the same clear error, never a panic.
        let e = t.cuda(0).unwrap_err();
        assert!(matches!(e, Error::Device { op: "to_device", .. }), "{e}");
        let e = Tensor::rand(&[2], (DType::F32, DEV)).unwrap_err();
        assert!(matches!(e, Error::Device { .. }), "{e}");
    }
}

#[test]
fn mixed_devices_are_an_error_naming_both() {
    let e = Device::Cpu.same_as(DEV, "add").unwrap_err();
    assert!(matches!(e, Error::Device { op: "add", .. }), "{e}");
    assert!(
        e.to_string().contains("cpu") && e.to_string().contains("cuda:0"),
        "{e}"
    );
    // Everything on the CPU is untouched by the feature.
    let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    assert_eq!(a.cpu().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    assert!(a.cpu().unwrap().shares_storage(&a));
}

/// The emulated device (feature `cuda-emu`, no GPU) under other thread
/// orders than the default forward one: a kernel with a missing barrier
/// or an order-dependent reduction gives other results under reverse or
/// random scheduling. The bodies are the tests above, so each order is
/// checked against the CPU. On a real GPU the orders do not apply.
#[cfg(feature = "cuda-emu")]
#[test]
fn emulated_thread_orders_match_the_cpu() {
    use tessera_cuda_kernels::emu::{with_thread_order, ThreadOrder};
    use tessera_cuda_kernels::runtime::{selected, RuntimeKind};
    if !gpu() {
        return;
    }
    if selected().ok() != Some(RuntimeKind::Emulator) {
        println!("skipped: cuda:0 is a real GPU, thread orders are the emulator's");
        return;
    }
    for order in [ThreadOrder::Reverse, ThreadOrder::Random(0x7e55e7a)] {
        with_thread_order(order, || {
            unary_ops_match_the_cpu();
            binary_ops_broadcast_like_the_cpu();
            reductions_match_the_cpu();
            softmax_matches_the_cpu();
            layer_norm_forward_and_backward_match_the_cpu();
            matmul_matches_the_cpu();
            embedding_matches_the_cpu();
        });
    }
}

/// The caching allocator behind GPU storage: a dropped tensor's block is
/// reused by the next of its size class without a device allocation, the
/// counters follow, and `empty_cache` gives the cache back. Runs on
/// `cuda:1`, which no other test uses, so the counters are this test's own
/// (the emulator has two devices; a one-GPU machine skips).
#[test]
fn the_caching_allocator_reuses_freed_device_memory() {
    let dev = Device::Cuda(1);
    if let Err(e) = Tensor::zeros(&[1], DType::F32).and_then(|t| t.to_device(dev)) {
        println!("skipped: no second CUDA device ({e})");
        return;
    }
    dev.empty_cache().unwrap();
    dev.reset_peak_memory_stats().unwrap();
    let s0 = dev.memory_stats().unwrap();
    assert_eq!(s0.cached(), 0);

    let t = Tensor::zeros(&[1000], DType::F32)
        .unwrap()
        .to_device(dev)
        .unwrap();
    let s1 = dev.memory_stats().unwrap();
    assert_eq!(
        s1.allocated - s0.allocated,
        4096,
        "1000 f32 round up to a 4 KiB class"
    );
    assert_eq!(s1.reserved - s0.reserved, 4096);
    drop(t);
    let s2 = dev.memory_stats().unwrap();
    assert_eq!(
        (s2.allocated, s2.reserved),
        (s0.allocated, s1.reserved),
        "freed into the cache"
    );

    // Same class: the cached block, no device allocation, fresh contents.
    let host = Tensor::arange(0.0, 1020.0, 1.0, DType::F32).unwrap();
    let u = host.to_device(dev).unwrap();
    let s3 = dev.memory_stats().unwrap();
    assert_eq!(s3.cache_hits, s2.cache_hits + 1);
    assert_eq!(s3.device_allocations, s2.device_allocations);
    assert_eq!(f64s(&u), f64s(&host));
    // A device-to-device copy between GPUs keeps the values.
    if gpu() {
        let on0 = u.to_device(DEV).unwrap();
        assert_eq!(on0.device(), DEV);
        assert_eq!(f64s(&on0.to_device(dev).unwrap()), f64s(&host));
    }
    drop(u);
    assert!(dev.memory_stats().unwrap().peak_allocated >= s1.allocated);
    dev.empty_cache().unwrap();
    let s4 = dev.memory_stats().unwrap();
    assert_eq!((s4.allocated, s4.cached()), (s0.allocated, 0));
    dev.synchronize().unwrap();

    let e = Device::Cpu.memory_stats().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Device {
                op: "memory_stats",
                ..
            }
        ),
        "{e}"
    );
}
