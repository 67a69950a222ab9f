//! Fused attention against a naive f64 reference (forward and every
//! gradient), its dropout mask against `rand`'s, and thread-count
//! independence.

use super::{SdpaArgs, SdpaMask};
use crate::test_util::{rand_f64, tensor_of, values_f64};
use crate::{manual_seed, DType, Tensor};

/// Sizes of one case: batch, L, S, E, Ev.
type Dims = (usize, usize, usize, usize, usize);

/// The reference of one case: output and (dq, dk, dv, dmask), every
/// matrix row-major over the batch. `bias` is `[L, S]` (−∞ masks) and
/// `keep` the dropout mask `[B, L, S]` with its factor.
struct Reference {
    out: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dmask: Vec<f64>,
}

#[allow(clippy::too_many_arguments)]
fn naive(
    (b, l, s, e, ev): Dims,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    bias: &[f64],
    drop: Option<(&[bool], f64)>,
    scale: f64,
) -> Reference {
    let mut r = Reference {
        out: vec![0.0; b * l * ev],
        dq: vec![0.0; b * l * e],
        dk: vec![0.0; b * s * e],
        dv: vec![0.0; b * s * ev],
        dmask: vec![0.0; b * l * s],
    };
    for bi in 0..b {
        let (q, k, v) = (&q[bi * l * e..], &k[bi * s * e..], &v[bi * s * ev..]);
        let d_o = &d_o[bi * l * ev..];
        for i in 0..l {
            let sc: Vec<f64> = (0..s)
                .map(|j| (0..e).map(|c| q[i * e + c] * k[j * e + c]).sum::<f64>() * scale + bias[i * s + j])
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            let p: Vec<f64> = w.iter().map(|x| x / z).collect();
            let zf = |j: usize| match drop {
                Some((keep, f)) => f64::from(u8::from(keep[(bi * l + i) * s + j])) * f,
                None => 1.0,
            };
            for c in 0..ev {
                r.out[(bi * l + i) * ev + c] = (0..s).map(|j| p[j] * zf(j) * v[j * ev + c]).sum();
            }
            let dp: Vec<f64> = (0..s)
                .map(|j| (0..ev).map(|c| d_o[i * ev + c] * v[j * ev + c]).sum::<f64>() * zf(j))
                .collect();
            let dot: f64 = (0..s).map(|j| p[j] * dp[j]).sum();
            for j in 0..s {
                let ds = p[j] * (dp[j] - dot);
                r.dmask[(bi * l + i) * s + j] = ds;
                for c in 0..e {
                    r.dq[(bi * l + i) * e + c] += scale * ds * k[j * e + c];
                    r.dk[(bi * s + j) * e + c] += scale * ds * q[i * e + c];
                }
                for c in 0..ev {
                    r.dv[(bi * s + j) * ev + c] += p[j] * zf(j) * d_o[i * ev + c];
                }
            }
        }
    }
    r
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// Runs one case in `dtype` with mask kind `kind` (0 none, 1 causal, 2
/// keep, 3 additive with its gradient, 4 causal + dropout) and compares
/// with [`naive`] within `tol`.
fn case(dims: Dims, kind: usize, dtype: DType, tol: f64, seed: u64) {
    let (b, l, s, e, ev) = dims;
    let t = |n: u64, shape: &[usize]| {
        let vals = rand_f64(seed * 10 + n, shape.iter().product());
        (
            vals.clone(),
            tensor_of::<f64>(&vals, shape).to_dtype(dtype).unwrap(),
        )
    };
    let ((qv, q), (kv, k), (vv, v), (dov, d_o)) = (
        t(1, &[b, l, e]),
        t(2, &[b, s, e]),
        t(3, &[b, s, ev]),
        t(4, &[b, l, ev]),
    );
    // Values as the dtype rounded them.
    let (qv, kv, vv, dov) = if dtype == DType::F64 {
        (qv, kv, vv, dov)
    } else {
        (values_f64(&q), values_f64(&k), values_f64(&v), values_f64(&d_o))
    };
    let keep_v: Vec<bool> = rand_f64(seed + 7, l * s)
        .iter()
        .enumerate()
        .map(|(f, x)| f % s == 0 || *x > 0.3)
        .collect();
    let keep = Tensor::from_vec(keep_v.clone(), &[l, s]).unwrap();
    let (biasv, bias) = t(5, &[l, s]);
    let mut args = SdpaArgs {
        scale: Some(0.6),
        ..SdpaArgs::default()
    };
    let mut add = vec![0.0; l * s];
    match kind {
        1 | 4 => {
            args.is_causal = true;
            for (f, a) in add.iter_mut().enumerate() {
                if f % s > f / s {
                    *a = f64::NEG_INFINITY;
                }
            }
        }
        2 => {
            args.mask = Some(SdpaMask::Keep(&keep));
            for (a, &kp) in add.iter_mut().zip(&keep_v) {
                if !kp {
                    *a = f64::NEG_INFINITY;
                }
            }
        }
        3 => {
            args.mask = Some(SdpaMask::Additive(&bias));
            add.clone_from(&biasv);
        }
        _ => {}
    }
    let mut drop_keep = Vec::new();
    if kind == 4 {
        let p = 0.3;
        manual_seed(seed);
        args.dropout = Tensor::sdpa_dropout(p, &q, &k, &v, None).unwrap();
        manual_seed(seed);
        let u = Tensor::rand(&[b, l, s], DType::F32).unwrap();
        drop_keep = u
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&x| x >= p as f32)
            .collect();
    }
    let drop = (kind == 4).then(|| (drop_keep.as_slice(), 1.0 / 0.7));
    let want = naive(dims, &qv, &kv, &vv, &dov, &add, drop, 0.6);
    let fwd = Tensor::sdpa(&q, &k, &v, &args).unwrap();
    assert_eq!(fwd.out.dtype(), dtype);
    assert_close("out", &values_f64(&fwd.out), &want.out, tol);
    let gr = Tensor::sdpa_backward(&d_o, &q, &k, &v, &fwd, &args, kind == 3).unwrap();
    assert_close("dq", &values_f64(&gr.dq), &want.dq, tol);
    assert_close("dk", &values_f64(&gr.dk), &want.dk, tol);
    assert_close("dv", &values_f64(&gr.dv), &want.dv, tol);
    if kind == 3 {
        assert_close("dmask", &values_f64(&gr.dmask.unwrap()), &want.dmask, tol);
    }
}

/// Sizes covering one partial tile, several tiles with ragged edges
/// (tiles of at most 128, balanced: 130 → 65 + 65, 257 → 86 + 86 + 85),
/// L < S and L > S, E ≠ Ev.
const SIZES: [Dims; 5] = [
    (2, 3, 5, 4, 3),
    (1, 70, 130, 9, 17),
    (2, 129, 65, 16, 8),
    (1, 64, 64, 32, 32),
    (1, 300, 257, 8, 5),
];

#[test]
fn matches_naive_in_f64_and_f32() {
    for (n, &dims) in SIZES.iter().enumerate() {
        for kind in 0..5 {
            case(dims, kind, DType::F64, 1e-10, n as u64 + 1);
            case(dims, kind, DType::F32, 2e-5, n as u64 + 1);
        }
    }
}

#[test]
fn half_precision_accumulates_in_f32() {
    // Inputs rounded to f16/bf16, math in f32, outputs rounded once: the
    // error is the output rounding (2^-11, 2^-8 relative) plus f32's.
    for kind in 0..5 {
        case((2, 70, 66, 8, 8), kind, DType::F16, 2e-3, 3);
        case((2, 70, 66, 8, 8), kind, DType::BF16, 1e-2, 3);
    }
}

#[test]
fn a_row_with_every_key_masked_is_nan() {
    let q = tensor_of::<f32>(&rand_f64(1, 12), &[1, 3, 4]);
    let k = tensor_of::<f32>(&rand_f64(2, 8), &[1, 2, 4]);
    let keep = Tensor::from_vec(vec![true, true, false, false, true, false], &[3, 2]).unwrap();
    let args = SdpaArgs {
        mask: Some(SdpaMask::Keep(&keep)),
        ..SdpaArgs::default()
    };
    let out = values_f64(&Tensor::sdpa(&q, &k, &k, &args).unwrap().out);
    assert!(out[..4].iter().all(|x| x.is_finite()));
    assert!(out[4..8].iter().all(|x| x.is_nan()));
    assert!(out[8..].iter().all(|x| x.is_finite()));
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let run = || {
        let (b, l, s, e) = (6, 150, 100, 24);
        let q = tensor_of::<f32>(&rand_f64(1, b * l * e), &[b, l, e]);
        let k = tensor_of::<f32>(&rand_f64(2, b * s * e), &[b, s, e]);
        let v = tensor_of::<f32>(&rand_f64(3, b * s * e), &[b, s, e]);
        let d_o = tensor_of::<f32>(&rand_f64(4, b * l * e), &[b, l, e]);
        manual_seed(5);
        let args = SdpaArgs {
            dropout: Tensor::sdpa_dropout(0.2, &q, &k, &v, None).unwrap(),
            ..SdpaArgs::default()
        };
        let fwd = Tensor::sdpa(&q, &k, &v, &args).unwrap();
        let g = Tensor::sdpa_backward(&d_o, &q, &k, &v, &fwd, &args, false).unwrap();
        [fwd.out, fwd.lse, g.dq, g.dk, g.dv].map(|t| t.to_vec::<f32>().unwrap())
    };
    let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
    assert_eq!(pool(1).install(run), pool(2).install(run));
}

#[test]
fn strided_and_broadcast_output_gradients_equal_their_dense_copies() {
    // The backward gathers an output gradient without unit columns into
    // dense rows (a sum's gradient is one value broadcast); any layout must
    // give the gradients of its dense copy, bit for bit.
    let (b, l, s, e) = (2, 70, 40, 16);
    let q = tensor_of::<f32>(&rand_f64(1, b * l * e), &[b, l, e]);
    let k = tensor_of::<f32>(&rand_f64(2, b * s * e), &[b, s, e]);
    let v = tensor_of::<f32>(&rand_f64(3, b * s * e), &[b, s, e]);
    let args = SdpaArgs::default();
    let fwd = Tensor::sdpa(&q, &k, &v, &args).unwrap();
    let grads = |d_o: &Tensor| {
        let g = Tensor::sdpa_backward(d_o, &q, &k, &v, &fwd, &args, false).unwrap();
        [g.dq, g.dk, g.dv].map(|t| t.to_vec::<f32>().unwrap())
    };
    let scalar = tensor_of::<f32>(&[0.75], &[1, 1, 1])
        .broadcast_to(&[b, l, e])
        .unwrap();
    let row = tensor_of::<f32>(&rand_f64(4, e), &[1, 1, e])
        .broadcast_to(&[b, l, e])
        .unwrap();
    let columns = tensor_of::<f32>(&rand_f64(5, b * l * e), &[b, e, l])
        .transpose(1, 2)
        .unwrap();
    for (what, d_o) in [("scalar", scalar), ("row", row), ("columns", columns)] {
        let dense = d_o.contiguous().unwrap();
        assert_eq!(grads(&d_o), grads(&dense), "{what}");
    }
}

#[test]
fn bad_operands_are_errors() {
    let q = Tensor::zeros(&[2, 3, 4], DType::F32).unwrap();
    let k5 = Tensor::zeros(&[2, 3, 5], DType::F32).unwrap();
    let k64 = Tensor::zeros(&[2, 3, 4], DType::F64).unwrap();
    let v1 = Tensor::zeros(&[4], DType::F32).unwrap();
    let none = SdpaArgs::default();
    for (k, v) in [(&k5, &q), (&k64, &q), (&q, &v1)] {
        let err = Tensor::sdpa(&q, k, v, &none).unwrap_err().to_string();
        assert!(err.contains("scaled_dot_product_attention"), "{err}");
    }
    let keep_f = Tensor::zeros(&[3, 3], DType::F32).unwrap();
    let big = Tensor::zeros(&[3, 7], DType::F32).unwrap();
    let both = SdpaArgs {
        mask: Some(SdpaMask::Additive(&keep_f)),
        is_causal: true,
        ..SdpaArgs::default()
    };
    for args in [
        SdpaArgs {
            mask: Some(SdpaMask::Keep(&keep_f)),
            ..none
        },
        SdpaArgs {
            mask: Some(SdpaMask::Additive(&big)),
            ..none
        },
        both,
    ] {
        assert!(Tensor::sdpa(&q, &q, &q, &args).is_err());
    }
    assert!(Tensor::sdpa_dropout(1.5, &q, &q, &q, None).is_err());
    let empty = Tensor::zeros(&[2, 0, 4], DType::F32).unwrap();
    assert!(!Tensor::sdpa_fused_available(&q, &empty, &empty, &none).unwrap());
    assert!(Tensor::sdpa(&q, &empty, &empty, &none).is_err());
}
