//! conv2d and its backward primitives against a direct naive convolution,
//! finite differences and thread-count determinism.

use proptest::prelude::*;

use super::{conv2d_backward_bias, conv2d_backward_input, conv2d_backward_weight, Conv2dParams};
use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
use crate::{DType, Tensor};

/// One convolution's sizes.
#[derive(Debug, Clone, Copy)]
struct Case {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    k: [usize; 2],
    p: Conv2dParams,
}

impl Case {
    fn out_hw(&self) -> Option<[usize; 2]> {
        let f = |i: usize, size: usize| {
            let span = self.p.dilation[i] * (self.k[i] - 1) + 1;
            (size + 2 * self.p.padding[i])
                .checked_sub(span)
                .map(|v| v / self.p.stride[i] + 1)
        };
        Some([f(0, self.h)?, f(1, self.w)?])
    }

    /// Calls `f(n, o, oy, ox, c, ki, kj, iy, ix)` for every tap that meets
    /// the (unpadded) input: the index relation all three naive routines share.
    fn taps(&self, mut f: impl FnMut([usize; 9])) {
        let [oh, ow] = self.out_hw().unwrap();
        let (cg, og) = (self.c / self.p.groups, self.o / self.p.groups);
        for n in 0..self.n {
            for o in 0..self.o {
                let grp = o / og;
                for oy in 0..oh {
                    for ox in 0..ow {
                        for ci in 0..cg {
                            for ki in 0..self.k[0] {
                                for kj in 0..self.k[1] {
                                    let iy = (oy * self.p.stride[0] + ki * self.p.dilation[0]) as isize
                                        - self.p.padding[0] as isize;
                                    let ix = (ox * self.p.stride[1] + kj * self.p.dilation[1]) as isize
                                        - self.p.padding[1] as isize;
                                    if iy >= 0 && ix >= 0 && (iy as usize) < self.h && (ix as usize) < self.w
                                    {
                                        f([n, o, oy, ox, grp * cg + ci, ki, kj, iy as usize, ix as usize]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn xi(&self, n: usize, c: usize, y: usize, x: usize) -> usize {
        ((n * self.c + c) * self.h + y) * self.w + x
    }
    fn wi(&self, o: usize, c: usize, ki: usize, kj: usize) -> usize {
        let cg = self.c / self.p.groups;
        ((o * cg + c % cg) * self.k[0] + ki) * self.k[1] + kj
    }
    fn oi(&self, n: usize, o: usize, y: usize, x: usize) -> usize {
        let [oh, ow] = self.out_hw().unwrap();
        ((n * self.o + o) * oh + y) * ow + x
    }
    fn out_len(&self) -> usize {
        let [oh, ow] = self.out_hw().unwrap();
        self.n * self.o * oh * ow
    }
    fn shapes(&self) -> ([usize; 4], [usize; 4], [usize; 4]) {
        let [oh, ow] = self.out_hw().unwrap();
        (
            [self.n, self.c, self.h, self.w],
            [self.o, self.c / self.p.groups, self.k[0], self.k[1]],
            [self.n, self.o, oh, ow],
        )
    }

    fn forward(&self, x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; self.out_len()];
        for n in 0..self.n {
            for o in 0..self.o {
                let [oh, ow] = self.out_hw().unwrap();
                for y in 0..oh {
                    for xx in 0..ow {
                        out[self.oi(n, o, y, xx)] = b[o];
                    }
                }
            }
        }
        self.taps(|[n, o, oy, ox, c, ki, kj, iy, ix]| {
            out[self.oi(n, o, oy, ox)] += x[self.xi(n, c, iy, ix)] * w[self.wi(o, c, ki, kj)];
        });
        out
    }

    fn backward(&self, x: &[f64], w: &[f64], go: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let mut dx = vec![0.0; x.len()];
        let mut dw = vec![0.0; w.len()];
        self.taps(|[n, o, oy, ox, c, ki, kj, iy, ix]| {
            let g = go[self.oi(n, o, oy, ox)];
            dx[self.xi(n, c, iy, ix)] += g * w[self.wi(o, c, ki, kj)];
            dw[self.wi(o, c, ki, kj)] += g * x[self.xi(n, c, iy, ix)];
        });
        (dx, dw)
    }
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}", what);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{}: element {}: got {}, want {}",
            what,
            i,
            g,
            w
        );
    }
    Ok(())
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        (1usize..3, 1usize..4, 1usize..4, 1usize..4, 1usize..10, 1usize..10),
        (
            1usize..4,
            1usize..4,
            1usize..3,
            1usize..3,
            0usize..3,
            0usize..3,
            1usize..3,
            1usize..3,
        ),
    )
        .prop_map(
            |((n, groups, cg, og, h, w), (kh, kw, sh, sw, ph, pw, dh, dw))| Case {
                n,
                c: cg * groups,
                h,
                w,
                o: og * groups,
                k: [kh, kw],
                p: Conv2dParams {
                    stride: [sh, sw],
                    padding: [ph, pw],
                    dilation: [dh, dw],
                    groups,
                },
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn conv2d_and_backwards_match_naive(case in case_strategy(), seed in 0u64..1000, sel in 0usize..5,
                                        f32_path in any::<bool>()) {
        let (xs, ws, os) = match case.out_hw() {
            Some(_) => case.shapes(),
            None => {
                let x = tensor_of::<f64>(&rand_f64(seed, case.n * case.c * case.h * case.w), &[case.n, case.c, case.h, case.w]);
                let w = tensor_of::<f64>(&rand_f64(seed, case.o * case.c / case.p.groups * case.k[0] * case.k[1]),
                    &[case.o, case.c / case.p.groups, case.k[0], case.k[1]]);
                prop_assert!(x.conv2d(&w, None, &case.p).is_err());
                return Ok(());
            }
        };
        let (xv, wv) = (rand_f64(seed, xs.iter().product()), rand_f64(seed + 1, ws.iter().product()));
        let (bv, gv) = (rand_f64(seed + 2, case.o), rand_f64(seed + 3, os.iter().product()));
        let (dtype, tol) = if f32_path { (DType::F32, 1e-5) } else { (DType::F64, 1e-12) };
        let of = |v: &[f64], s: &[usize]| crate::with_float_dtype!(dtype, T => {
            let all = layouts_of::<T>(v, s);
            all[sel % all.len()].clone()
        }, else unreachable!());
        let (x, w, b, go) = (of(&xv, &xs), of(&wv, &ws), of(&bv, &[case.o]), of(&gv, &os));
        let y = x.conv2d(&w, Some(&b), &case.p).unwrap();
        prop_assert_eq!(y.shape(), &os[..]);
        assert_close(&values_f64(&y), &case.forward(&xv, &wv, &bv), tol, "forward")?;
        let (dx, dw) = case.backward(&xv, &wv, &gv);
        let gx = conv2d_backward_input(&go, &w, &xs, &case.p).unwrap();
        assert_close(&values_f64(&gx), &dx, tol, "grad input")?;
        let gw = conv2d_backward_weight(&go, &x, &ws, &case.p).unwrap();
        assert_close(&values_f64(&gw), &dw, tol, "grad weight")?;
        // Both weight-gradient paths, whichever the dispatch picks here.
        let geom = super::Geom::new("t", &xs, &ws, &case.p).unwrap();
        for dot in [false, true] {
            let gw = crate::with_float_dtype!(dtype, S => super::backward::weight_grad::<S>(&go, &x, &geom, dot).unwrap(),
                else unreachable!());
            assert_close(&values_f64(&gw), &dw, tol, if dot { "grad weight (dot)" } else { "grad weight (gemm)" })?;
        }
        let gb = conv2d_backward_bias(&go).unwrap();
        let want_b: Vec<f64> = (0..case.o).map(|o| {
            (0..case.n).map(|n| gv[(n * case.o + o) * os[2] * os[3]..][..os[2] * os[3]].iter().sum::<f64>()).sum()
        }).collect();
        assert_close(&values_f64(&gb), &want_b, tol, "grad bias")?;
    }
}

/// A tap whose every output reads padding (width 1, padding 2, dilation
/// 2): the unfolding skips it instead of computing an input index below 0.
#[test]
fn taps_entirely_in_the_padding() {
    let case = Case {
        n: 1,
        c: 1,
        h: 5,
        w: 1,
        o: 1,
        k: [1, 3],
        p: Conv2dParams {
            stride: [1, 1],
            padding: [0, 2],
            dilation: [1, 2],
            groups: 1,
        },
    };
    let (xs, ws, os) = case.shapes();
    let (xv, wv, gv) = (
        rand_f64(4, xs.iter().product()),
        rand_f64(5, ws.iter().product()),
        rand_f64(6, os.iter().product()),
    );
    let (x, w, go) = (
        tensor_of::<f64>(&xv, &xs),
        tensor_of::<f64>(&wv, &ws),
        tensor_of::<f64>(&gv, &os),
    );
    let y = x.conv2d(&w, None, &case.p).unwrap();
    assert_close(&values_f64(&y), &case.forward(&xv, &wv, &[0.0]), 1e-12, "forward").unwrap();
    let (dx, dw) = case.backward(&xv, &wv, &gv);
    let gx = conv2d_backward_input(&go, &w, &xs, &case.p).unwrap();
    assert_close(&values_f64(&gx), &dx, 1e-12, "grad input").unwrap();
    let gw = conv2d_backward_weight(&go, &x, &ws, &case.p).unwrap();
    assert_close(&values_f64(&gw), &dw, 1e-12, "grad weight").unwrap();
}

/// loss(x, w) = Σ conv2d(x, w)·g: its central differences match the
/// backward primitives (the naive backward shares the index relation with
/// the naive forward, so this checks the relation itself).
#[test]
fn backward_matches_finite_differences() {
    let case = Case {
        n: 2,
        c: 4,
        h: 7,
        w: 6,
        o: 6,
        k: [3, 2],
        p: Conv2dParams {
            stride: [2, 1],
            padding: [1, 1],
            dilation: [1, 2],
            groups: 2,
        },
    };
    let (xs, ws, os) = case.shapes();
    let (xv, wv, gv) = (
        rand_f64(1, xs.iter().product()),
        rand_f64(2, ws.iter().product()),
        rand_f64(3, os.iter().product()),
    );
    let loss = |xv: &[f64], wv: &[f64]| -> f64 {
        let y = tensor_of::<f64>(xv, &xs)
            .conv2d(&tensor_of::<f64>(wv, &ws), None, &case.p)
            .unwrap();
        values_f64(&y).iter().zip(&gv).map(|(a, b)| a * b).sum()
    };
    let go = tensor_of::<f64>(&gv, &os);
    let gx = values_f64(&conv2d_backward_input(&go, &tensor_of::<f64>(&wv, &ws), &xs, &case.p).unwrap());
    let gw = values_f64(&conv2d_backward_weight(&go, &tensor_of::<f64>(&xv, &xs), &ws, &case.p).unwrap());
    let h = 1e-5;
    for i in (0..xv.len()).step_by(7) {
        let (mut p, mut m) = (xv.clone(), xv.clone());
        p[i] += h;
        m[i] -= h;
        let fd = (loss(&p, &wv) - loss(&m, &wv)) / (2.0 * h);
        assert!((fd - gx[i]).abs() < 1e-7, "dx[{i}]: fd {fd} vs {}", gx[i]);
    }
    for i in 0..wv.len() {
        let (mut p, mut m) = (wv.clone(), wv.clone());
        p[i] += h;
        m[i] -= h;
        let fd = (loss(&xv, &p) - loss(&xv, &m)) / (2.0 * h);
        assert!((fd - gw[i]).abs() < 1e-7, "dw[{i}]: fd {fd} vs {}", gw[i]);
    }
}

#[test]
fn depthwise_half_and_thread_determinism() {
    let p = Conv2dParams::default().padding(1).groups(8);
    let x = tensor_of::<f32>(&rand_f64(1, 9 * 8 * 12 * 12), &[9, 8, 12, 12]);
    let w = tensor_of::<f32>(&rand_f64(2, 8 * 9), &[8, 1, 3, 3]);
    let go = tensor_of::<f32>(&rand_f64(3, 9 * 8 * 144), &[9, 8, 12, 12]);
    let run = || {
        (
            x.conv2d(&w, None, &p).unwrap(),
            conv2d_backward_input(&go, &w, x.shape(), &p).unwrap(),
            conv2d_backward_weight(&go, &x, w.shape(), &p).unwrap(),
        )
    };
    let many = run();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(run);
    let bits = |t: &Tensor| {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&many.0), bits(&one.0));
    assert_eq!(bits(&many.1), bits(&one.1));
    assert_eq!(bits(&many.2), bits(&one.2));
    // bf16 runs on the bf16 GEMM (f32 accumulation, its own sum order) and
    // rounds once: within one bf16 rounding of the f32 convolution of the
    // same values.
    let yb = x
        .to_dtype(DType::BF16)
        .unwrap()
        .conv2d(&w.to_dtype(DType::BF16).unwrap(), None, &p)
        .unwrap();
    assert_eq!(yb.dtype(), DType::BF16);
    let y32 = x
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .conv2d(
            &w.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap(),
            None,
            &p,
        )
        .unwrap();
    for (b, w) in values_f64(&yb).iter().zip(values_f64(&y32)) {
        assert!((b - w).abs() <= w.abs() / 200.0 + 1e-5, "bf16 {b} vs f32 {w}");
    }
}

/// The long-dot-product weight gradient (few taps) at sizes the proptest
/// does not reach: several sample tasks, rows that are not whole vectors,
/// tap counts that split into several register blocks; against the naive
/// gradient and bitwise across thread counts. All with "same" padding, as
/// the forward (checked too) unfolds fastest.
#[test]
fn few_tap_weight_grad_matches_naive_on_any_thread_count() {
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for (c, k, h, w, pad) in [
        (1, 3, 28, 28, 1),
        (3, 3, 13, 11, 1),
        (1, 5, 9, 17, 2),
        (1, 1, 5, 7, 0),
    ] {
        let case = Case {
            n: 11,
            c,
            h,
            w,
            o: 5,
            k: [k, k],
            p: Conv2dParams::default().padding(pad),
        };
        let (xs, ws, os) = case.shapes();
        let (xv, wv, gv) = (
            rand_f64(1, xs.iter().product()),
            rand_f64(2, ws.iter().product()),
            rand_f64(3, os.iter().product()),
        );
        let (_, dw) = case.backward(&xv, &wv, &gv);
        let (x, go) = (tensor_of::<f32>(&xv, &xs), tensor_of::<f32>(&gv, &os));
        // "Same" padding at stride 1: the forward's unfolding takes its
        // shifted-plane copy here.
        let y = x.conv2d(&tensor_of::<f32>(&wv, &ws), None, &case.p).unwrap();
        let zeros = vec![0.0; case.o];
        assert_close(&values_f64(&y), &case.forward(&xv, &wv, &zeros), 1e-5, "forward").unwrap();
        let run = || conv2d_backward_weight(&go, &x, &ws, &case.p).unwrap();
        let (many, single) = (run(), one.install(run));
        assert_close(&values_f64(&many), &dw, 1e-4, "grad weight").unwrap();
        assert_eq!(values_f64(&many), values_f64(&single), "{case:?}");
        let x64 = tensor_of::<f64>(&xv, &xs);
        let g64 = conv2d_backward_weight(&tensor_of::<f64>(&gv, &os), &x64, &ws, &case.p).unwrap();
        assert_close(&values_f64(&g64), &dw, 1e-12, "grad weight f64").unwrap();
    }
}

/// Small feature maps put several samples into one GEMM (`samples_per_gemm`):
/// batches that leave a short last chunk, groups, strides and 1×1 maps,
/// against the naive convolution in f64, and bitwise across thread counts.
#[test]
fn samples_sharing_a_gemm_match_naive_on_any_thread_count() {
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for (n, c, o, hw, k, stride, pad, groups) in [
        (37, 8, 12, 4, 3, 1, 1, 1),
        (70, 6, 4, 7, 3, 2, 1, 2),
        (9, 4, 6, 1, 1, 1, 0, 1),
        (5, 8, 8, 3, 3, 1, 1, 4),
        // A group weight beyond L2: GEMMs on the whole pool, in turn.
        (40, 64, 256, 4, 3, 1, 1, 1),
    ] {
        let case = Case {
            n,
            c,
            h: hw,
            w: hw,
            o,
            k: [k, k],
            p: Conv2dParams::default().stride(stride).padding(pad).groups(groups),
        };
        let (xs, ws, os) = case.shapes();
        let geom = super::Geom::new("t", &xs, &ws, &case.p).unwrap();
        let blk = super::blocking::<f64>(&geom);
        assert_eq!(blk.shares_large_weights::<f64>(&geom), o == 256, "{case:?}");
        let (xv, wv, gv) = (
            rand_f64(4, xs.iter().product()),
            rand_f64(5, ws.iter().product()),
            rand_f64(6, os.iter().product()),
        );
        let bv = rand_f64(7, o);
        let (dx, dw) = case.backward(&xv, &wv, &gv);
        let (x, w, b, go) = (
            tensor_of::<f64>(&xv, &xs),
            tensor_of::<f64>(&wv, &ws),
            tensor_of::<f64>(&bv, &[o]),
            tensor_of::<f64>(&gv, &os),
        );
        let run = || {
            (
                x.conv2d(&w, Some(&b), &case.p).unwrap(),
                conv2d_backward_input(&go, &w, &xs, &case.p).unwrap(),
                super::backward::weight_grad::<f64>(
                    &go,
                    &x,
                    &super::Geom::new("t", &xs, &ws, &case.p).unwrap(),
                    false,
                )
                .unwrap(),
            )
        };
        let (many, single) = (run(), one.install(run));
        assert_close(
            &values_f64(&many.0),
            &case.forward(&xv, &wv, &bv),
            1e-12,
            "forward",
        )
        .unwrap();
        assert_close(&values_f64(&many.1), &dx, 1e-12, "grad input").unwrap();
        assert_close(&values_f64(&many.2), &dw, 1e-12, "grad weight").unwrap();
        for (a, b) in [(&many.0, &single.0), (&many.1, &single.1), (&many.2, &single.2)] {
            assert_eq!(values_f64(a), values_f64(b), "{case:?}");
        }
    }
}

#[test]
fn invalid_arguments_are_errors() {
    let x = tensor_of::<f32>(&rand_f64(1, 2 * 4 * 5 * 5), &[2, 4, 5, 5]);
    let w = tensor_of::<f32>(&rand_f64(2, 6 * 2 * 3 * 3), &[6, 2, 3, 3]);
    let ok = Conv2dParams::default().groups(2);
    assert_eq!(x.conv2d(&w, None, &ok).unwrap().shape(), &[2, 6, 3, 3]);
    for bad in [
        Conv2dParams::default(),
        ok.groups(0),
        ok.groups(3),
        ok.stride(0),
        ok.dilation(0),
        ok.dilation(3),
    ] {
        let e = x.conv2d(&w, None, &bad).unwrap_err();
        assert_eq!(e.op(), "conv2d");
    }
    assert!(x
        .conv2d(&w, Some(&tensor_of::<f32>(&[0.0; 5], &[5])), &ok)
        .is_err());
    assert!(x.reshape([8, 5, 5]).unwrap().conv2d(&w, None, &ok).is_err());
    assert!(x.conv2d(&w.to_dtype(DType::F64).unwrap(), None, &ok).is_err());
    let go = tensor_of::<f32>(&rand_f64(3, 2 * 6 * 9), &[2, 6, 3, 3]);
    assert!(conv2d_backward_input(&go, &w, &[2, 4, 6, 6], &ok).is_err());
    assert!(conv2d_backward_weight(&go, &x, &[6, 2, 2, 2], &ok).is_err());
    assert!(conv2d_backward_bias(&tensor_of::<f32>(&[1.0], &[1])).is_err());
}

/// The few-tap dot kernel gives the same bits on every instruction-set
/// level (one multiply-then-add order), for every tap count and row
/// lengths with and without a partial last vector.
#[test]
fn dot_kernel_is_bitwise_equal_on_every_isa() {
    use super::dot::{row_dot, LANES};
    for taps in 1..=9 {
        for len in [1usize, 15, 16, 17, 49, 784] {
            let lp = len.div_ceil(LANES) * LANES;
            let row: Vec<f32> = rand_f64(taps as u64, len).iter().map(|&v| v as f32).collect();
            let mut cols = vec![0.0f32; taps * lp];
            for t in 0..taps {
                for (i, v) in rand_f64(100 + t as u64, len).into_iter().enumerate() {
                    cols[t * lp + i] = v as f32;
                }
            }
            let start: Vec<[f32; LANES]> = (0..taps).map(|t| [t as f32 * 0.5 - 1.0; LANES]).collect();
            let runs: Vec<Vec<u32>> = crate::ops::matmul::kernel::Isa::available()
                .into_iter()
                .map(|isa| {
                    let mut acc = start.clone();
                    row_dot(isa, &row, &cols, lp, &mut acc);
                    acc.iter().flatten().map(|v| v.to_bits()).collect()
                })
                .collect();
            assert!(runs.iter().all(|r| r == &runs[0]), "{taps} taps, length {len}");
        }
    }
}

/// The backward of a bf16/f16 convolution runs its GEMMs on the operands in
/// the storage type (bf16 kernels, f32 accumulation) and rounds once: within
/// one rounding of the f32 gradients of the same rounded values, for the
/// per-sample and the shared-GEMM layouts, groups, and the GEMM (many taps)
/// and dot (few taps) weight gradients; bitwise alike on any thread count.
#[test]
fn half_backward_is_one_rounding_of_the_f32_gradients() {
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    for (n, c, o, hw, k, groups) in [
        (3, 8, 6, 12, 3, 1),
        (37, 8, 12, 4, 3, 2),
        (6, 2, 4, 9, 3, 1),
        (5, 16, 8, 23, 1, 1),
    ] {
        let p = Conv2dParams::default().padding(k / 2).groups(groups);
        let (xs, ws, os) = ([n, c, hw, hw], [o, c / groups, k, k], [n, o, hw, hw]);
        for dt in [DType::BF16, DType::F16] {
            let half = |seed, shape: &[usize]| {
                tensor_of::<f32>(&rand_f64(seed, shape.iter().product()), shape)
                    .to_dtype(dt)
                    .unwrap()
            };
            let (x, w, go) = (half(1, &xs), half(2, &ws), half(3, &os));
            let f32_of = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let run = || {
                (
                    conv2d_backward_input(&go, &w, &xs, &p).unwrap(),
                    conv2d_backward_weight(&go, &x, &ws, &p).unwrap(),
                )
            };
            let (dx, dw) = run();
            assert_eq!((dx.dtype(), dw.dtype()), (dt, dt));
            let single = one.install(run);
            assert_eq!(
                values_f64(&dx),
                values_f64(&single.0),
                "{dt:?} grad input threads"
            );
            assert_eq!(
                values_f64(&dw),
                values_f64(&single.1),
                "{dt:?} grad weight threads"
            );
            let dx32 = conv2d_backward_input(&f32_of(&go), &f32_of(&w), &xs, &p).unwrap();
            let dw32 = conv2d_backward_weight(&f32_of(&go), &f32_of(&x), &ws, &p).unwrap();
            for (what, got, want) in [("input", &dx, &dx32), ("weight", &dw, &dw32)] {
                let want = values_f64(want);
                let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                for (g, w) in values_f64(got).iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= w.abs() / 200.0 + scale * 1e-5,
                        "{dt:?} grad {what} ({n},{c},{o},{hw},{k},{groups}): {g} vs f32 {w}"
                    );
                }
            }
        }
    }
}

/// Feature maps whose unfolding exceeds L2 run one sample at a time in
/// bands of output rows on the direct kernels (`blocking`): the forward,
/// input gradient and weight gradient against the naive convolution in f64,
/// with groups, a stride, output channels off the register tile (the
/// weight gradient's fallback), f32 and f64, and bitwise across thread
/// counts.
#[test]
fn banded_convolutions_match_naive_on_any_thread_count() {
    fn check<S: crate::FloatElement>(case: Case, tol: f64)
    where
        S::Math: crate::ops::matmul::kernel::GemmScalar + crate::FloatElement<Math = S::Math>,
    {
        let (xs, ws, os) = case.shapes();
        let g = super::Geom::new("t", &xs, &ws, &case.p).unwrap();
        let blk = super::blocking::<S>(&g);
        assert!(blk.banded && blk.rows < g.oh, "{case:?} is not banded: {blk:?}");
        let (xv, wv, gv) = (
            rand_f64(14, xs.iter().product()),
            rand_f64(15, ws.iter().product()),
            rand_f64(16, os.iter().product()),
        );
        let bv = rand_f64(17, case.o);
        let (dx, dw) = case.backward(&xv, &wv, &gv);
        let dtype = tensor_of::<S>(&[0.0], &[1]).dtype();
        let t = |v: &[f64], s: &[usize]| tensor_of::<f64>(v, s).to_dtype(dtype).unwrap();
        let (x, w, b, go) = (t(&xv, &xs), t(&wv, &ws), t(&bv, &[case.o]), t(&gv, &os));
        let run = || {
            [
                x.conv2d(&w, Some(&b), &case.p).unwrap(),
                conv2d_backward_input(&go, &w, &xs, &case.p).unwrap(),
                conv2d_backward_weight(&go, &x, &ws, &case.p).unwrap(),
            ]
            .map(|t| values_f64(&t))
        };
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let (many, single) = (run(), one.install(run));
        let want = [case.forward(&xv, &wv, &bv), dx, dw];
        for ((got, want), what) in many
            .iter()
            .zip(&want)
            .zip(["forward", "grad input", "grad weight"])
        {
            assert_close(got, want, tol, &format!("{case:?} {what}")).unwrap();
        }
        assert_eq!(many, single, "{case:?}");
    }
    let case = |n, c, o, hw, stride, groups| Case {
        n,
        c,
        h: hw,
        w: hw,
        o,
        k: [3, 3],
        p: Conv2dParams::default().stride(stride).padding(1).groups(groups),
    };
    check::<f32>(case(3, 64, 64, 32, 1, 1), 2e-4);
    check::<f32>(case(2, 128, 40, 64, 2, 2), 2e-4);
    check::<f64>(case(2, 64, 32, 32, 1, 1), 1e-12);
}
