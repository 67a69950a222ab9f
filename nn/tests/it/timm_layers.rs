//! The layers the model zoo adds — DropPath, SqueezeExcite, RelPosBias,
//! LayerNorm2d, Conv2d with `padding="same"`, `init::skip_init` — against
//! naive f64 references and central finite differences (gradcheck with f64
//! parameters built from the checked leaves).

use tessera_autograd::{gradcheck, no_grad, GradcheckOptions, Parameter, Var};
use tessera_nn::*;
use tessera_tensor::ops::conv::Conv2dParams;
use tessera_tensor::{rng, DType, PadMode, Tensor};

fn randn(shape: &[usize], seed: u64) -> Tensor {
    rng::manual_seed(seed);
    Tensor::normal(shape, 0.0, 1.0, DType::F64).unwrap()
}

fn vec64(t: &Tensor) -> Vec<f64> {
    t.contiguous().unwrap().to_vec::<f64>().unwrap()
}

fn param(v: &Var) -> Parameter {
    Parameter::from_var(v.clone()).unwrap()
}

fn conv(w: &Var, b: Option<&Var>, params: Conv2dParams) -> Conv2d {
    Conv2d {
        weight: param(w),
        bias: b.map(param),
        params,
        pad_same: None,
    }
}

#[test]
fn drop_path_drops_whole_samples_and_scales_the_rest() {
    let p = 0.25;
    let mut dp = DropPath::new(p).unwrap();
    let x = Var::constant(Tensor::ones(&[4000, 3, 2], DType::F32).unwrap());
    rng::manual_seed(3);
    let y = dp.forward(&x).unwrap().into_tensor().to_vec::<f32>().unwrap();
    let mut kept = 0;
    for sample in y.chunks(6) {
        let first = sample[0];
        assert!(sample.iter().all(|v| *v == first), "a sample is dropped whole");
        assert!(first == 0.0 || (first - 1.0 / 0.75).abs() < 1e-6, "{first}");
        kept += usize::from(first != 0.0);
    }
    // Binomial(4000, 0.75): sd ≈ 27; 6 sd either side.
    assert!((2840..=3160).contains(&kept), "kept {kept} of 4000");
    dp.eval();
    assert_eq!(
        dp.forward(&x).unwrap().into_tensor().to_vec::<f32>().unwrap(),
        x.tensor().to_vec::<f32>().unwrap()
    );
    assert!(DropPath::new(1.5).is_err());
    let scalar = Var::constant(Tensor::scalar(1.0f32));
    dp.train(true);
    assert!(dp.forward(&scalar).is_err());
}

#[test]
fn drop_path_gradcheck() {
    let dp = DropPath::new(0.5).unwrap();
    let x = randn(&[6, 3, 2], 1);
    let report = gradcheck(
        |v| {
            // The same mask on every evaluation.
            rng::manual_seed(11);
            dp.forward(&v[0])
        },
        &[x],
        GradcheckOptions::default(),
    )
    .unwrap();
    assert!(report.ops.contains("mul"), "{:?}", report.ops);
}

#[test]
fn squeeze_excite_matches_naive_and_gradcheck() {
    let (b, c, rd, hw) = (2, 4, 2, 3);
    let x = randn(&[b, c, hw, hw], 2);
    let w1 = randn(&[rd, c, 1, 1], 3);
    let b1 = randn(&[rd], 4);
    let w2 = randn(&[c, rd, 1, 1], 5);
    let b2 = randn(&[c], 6);
    let build = |v: &[Var]| SqueezeExcite {
        fc1: conv(&v[1], Some(&v[2]), Conv2dParams::default()),
        act: Box::new(SiLU),
        fc2: conv(&v[3], Some(&v[4]), Conv2dParams::default()),
    };
    let inputs = [x.clone(), w1.clone(), b1.clone(), w2.clone(), b2.clone()];
    let vars: Vec<Var> = inputs.iter().cloned().map(Var::constant).collect();
    let got = vec64(no_grad(|| build(&vars).forward(&vars[0])).unwrap().tensor());

    let (xs, w1, b1, w2, b2) = (vec64(&x), vec64(&w1), vec64(&b1), vec64(&w2), vec64(&b2));
    let n = hw * hw;
    for bi in 0..b {
        let mean: Vec<f64> = (0..c)
            .map(|ci| xs[(bi * c + ci) * n..][..n].iter().sum::<f64>() / n as f64)
            .collect();
        let h: Vec<f64> = (0..rd)
            .map(|r| {
                let z = b1[r] + (0..c).map(|ci| w1[r * c + ci] * mean[ci]).sum::<f64>();
                z / (1.0 + (-z).exp())
            })
            .collect();
        for ci in 0..c {
            let z = b2[ci] + (0..rd).map(|r| w2[ci * rd + r] * h[r]).sum::<f64>();
            let gate = 1.0 / (1.0 + (-z).exp());
            for k in 0..n {
                let at = (bi * c + ci) * n + k;
                assert!((got[at] - xs[at] * gate).abs() < 1e-12, "element {at}");
            }
        }
    }
    gradcheck(|v| build(v).forward(&v[0]), &inputs, GradcheckOptions::default()).unwrap();
    let f32_se = SqueezeExcite::new(4, 2, ReLU).unwrap();
    assert!(f32_se
        .forward(&Var::constant(Tensor::zeros(&[1, 3, 2, 2], DType::F32).unwrap()))
        .is_err());
    assert!(SqueezeExcite::new(4, 0, ReLU).is_err());
}

#[test]
fn rel_pos_bias_index_table_and_gradcheck() {
    let (h, w, heads) = (2, 3, 2);
    let rp = RelPosBias::new([h, w], heads).unwrap();
    assert_eq!(
        rp.relative_position_bias_table.shape(),
        [(2 * h - 1) * (2 * w - 1), heads]
    );
    // Non-persistent: a buffer of the module, not in its state dict.
    assert_eq!(
        rp.state_dict().keys().collect::<Vec<_>>(),
        ["relative_position_bias_table"]
    );
    assert_eq!(rp.named_buffers()[0].0, "relative_position_index");
    let idx = rp.relative_position_index.tensor().to_vec::<i64>().unwrap();
    let n = h * w;
    for i in 0..n {
        for j in 0..n {
            let dh = (i / w) as i64 - (j / w) as i64;
            let dw = (i % w) as i64 - (j % w) as i64;
            let want = (dh + h as i64 - 1) * (2 * w as i64 - 1) + dw + w as i64 - 1;
            assert_eq!(idx[i * n + j], want, "pair ({i}, {j})");
        }
    }
    let table = randn(&[15, heads], 7);
    let logits = randn(&[2, heads, n, n], 8);
    let build = |t: &Var| RelPosBias {
        relative_position_bias_table: param(t),
        ..rp.clone()
    };
    let vars = [Var::constant(table.clone()), Var::constant(logits.clone())];
    let out = vec64(build(&vars[0]).forward(&vars[1]).unwrap().tensor());
    let (tv, lv) = (vec64(&table), vec64(&logits));
    for (k, o) in out.iter().enumerate() {
        let (hd, ij) = ((k / (n * n)) % heads, k % (n * n));
        let want = lv[k] + tv[idx[ij] as usize * heads + hd];
        assert!((o - want).abs() < 1e-12, "element {k}");
    }
    gradcheck(
        |v| build(&v[0]).forward(&v[1]),
        &[table, logits],
        GradcheckOptions::default(),
    )
    .unwrap();
    let wrong = Var::constant(Tensor::zeros(&[1, heads, n, n + 1], DType::F32).unwrap());
    assert!(rp.forward(&wrong).is_err());
    assert!(RelPosBias::new([0, 3], 2).is_err());
}

#[test]
fn layer_norm_2d_is_channel_layer_norm_and_gradcheck() {
    let x = randn(&[2, 3, 2, 2], 9);
    let w = randn(&[3], 10);
    let b = randn(&[3], 11);
    let build = |v: &[Var]| LayerNorm2d {
        weight: param(&v[1]),
        bias: param(&v[2]),
        eps: 1e-6,
    };
    let vars: Vec<Var> = [&x, &w, &b].iter().map(|t| Var::constant((*t).clone())).collect();
    let got = vec64(build(&vars).forward(&vars[0]).unwrap().tensor());
    let (xs, ws, bs) = (vec64(&x), vec64(&w), vec64(&b));
    for bi in 0..2 {
        for pos in 0..4 {
            let at = |c: usize| (bi * 3 + c) * 4 + pos;
            let mean = (0..3).map(|c| xs[at(c)]).sum::<f64>() / 3.0;
            let var = (0..3).map(|c| (xs[at(c)] - mean).powi(2)).sum::<f64>() / 3.0;
            for c in 0..3 {
                let want = (xs[at(c)] - mean) / (var + 1e-6).sqrt() * ws[c] + bs[c];
                assert!((got[at(c)] - want).abs() < 1e-10, "element {}", at(c));
            }
        }
    }
    gradcheck(
        |v| build(v).forward(&v[0]),
        &[x, w, b],
        GradcheckOptions::default(),
    )
    .unwrap();
    let ln = LayerNorm2d::new(3, 1e-6).unwrap();
    assert!(ln
        .forward(&Var::constant(Tensor::zeros(&[2, 4, 1, 1], DType::F32).unwrap()))
        .is_err());
}

#[test]
fn conv2d_padding_same_keeps_the_size_and_pads_right_bottom() {
    for (k, d) in [(1, 1), (2, 1), (3, 1), (4, 1), (3, 2), (2, 3)] {
        let c = Conv2d::new(2, 3, k, Conv2dOptions::default().padding_same().dilation(d)).unwrap();
        let x = Var::constant(Tensor::ones(&[1, 2, 5, 6], DType::F32).unwrap());
        assert_eq!(
            c.forward(&x).unwrap().shape(),
            [1, 3, 5, 6],
            "kernel {k} dilation {d}"
        );
    }
    assert!(Conv2d::new(2, 3, 3, Conv2dOptions::default().padding_same().stride(2)).is_err());
    // Kernel 2: total padding 1, all of it on the right and bottom.
    let x = randn(&[1, 2, 4, 5], 12);
    let w = randn(&[3, 2, 2, 2], 13);
    let b = randn(&[3], 14);
    let mut same = Conv2d::new(2, 3, 2, Conv2dOptions::default().padding_same()).unwrap();
    same.weight = Parameter::new(w.clone());
    same.bias = Some(Parameter::new(b.clone()));
    let vars: Vec<Var> = [&x, &w, &b].iter().map(|t| Var::constant((*t).clone())).collect();
    let got = vec64(same.forward(&vars[0]).unwrap().tensor());
    let padded = x.pad(&[0, 1, 0, 1], PadMode::Constant(0.0)).unwrap();
    let want = Var::constant(padded)
        .conv2d(&vars[1], Some(&vars[2]), &Conv2dParams::default())
        .unwrap();
    assert_eq!(got, vec64(want.tensor()));
    let build = |v: &[Var]| Conv2d {
        weight: param(&v[1]),
        bias: Some(param(&v[2])),
        ..same.clone()
    };
    gradcheck(
        |v| build(v).forward(&v[0]),
        &[x, w, b],
        GradcheckOptions::default(),
    )
    .unwrap();
}

#[test]
fn skip_init_leaves_the_allocated_values() {
    let l = init::skip_init(|| Linear::new(3, 4, true)).unwrap();
    assert!(l
        .weight
        .tensor()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|v| *v == 0.0));
    assert!(!init::is_init_skipped());
    let l = Linear::new(3, 4, true).unwrap();
    assert!(l
        .weight
        .tensor()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .any(|v| *v != 0.0));
    init::skip_init(|| {
        init::skip_init(|| ());
        assert!(init::is_init_skipped(), "nesting restores the outer setting");
    });
}
