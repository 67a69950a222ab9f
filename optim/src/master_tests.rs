//! f32 master weights for f16/bf16 parameters, and the f16 range facts
//! that make them (and loss scaling) necessary (training-and-data.md §4).

use tessera_autograd::{Gradients, Parameter, Var};
use tessera_tensor::{DType, Tensor};

use crate::{Adam, AdamOptions, GradScaler, GradScalerOptions, Optimizer, Sgd, SgdOptions};

fn tensor(v: &[f32], dtype: DType) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()])
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn f16_flushes_below_2_pow_minus_24_and_bf16_keeps_those_values() {
    let tiny = [2f32.powi(-24), 2f32.powi(-25), 2f32.powi(-26), 1e-9, 3e-38];
    // 2⁻²⁴ is f16's smallest subnormal; half of it rounds (to even) to 0.
    let h = f32s(&tensor(&tiny, DType::F16));
    assert_eq!(h, vec![2f32.powi(-24), 0.0, 0.0, 0.0, 0.0]);
    // bf16 has f32's exponent range: each survives within its 8-bit
    // mantissa's rounding.
    for (b, x) in f32s(&tensor(&tiny, DType::BF16)).iter().zip(tiny) {
        assert!(*b != 0.0 && (b - x).abs() <= x * 2f32.powi(-8), "{b} vs {x}");
    }
    // The consequence for training: a gradient of 1e-8 vanishes in f16
    // unless the loss is scaled (GradScaler's 2¹⁶ brings it to 6.6e-4).
    assert_eq!(f32s(&tensor(&[1e-8], DType::F16)), vec![0.0]);
    let scaled = f32s(&tensor(&[1e-8 * 65536.0], DType::F16))[0];
    assert!((scaled / 65536.0 - 1e-8).abs() < 1e-11);
}

/// 0.5·Σ(w − t)² for a parameter `p` (any float dtype): the gradient is
/// w − t, computed by backward in `p`'s dtype.
fn quadratic_grads(p: &Parameter, target: &[f32]) -> Gradients {
    let t = Var::constant(tensor(target, p.dtype()));
    let d = p.var().unwrap().sub(&t).unwrap();
    d.mul(&d)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .mul_scalar(0.5)
        .unwrap()
        .backward()
        .unwrap()
}

#[test]
fn an_f16_model_with_f32_masters_follows_the_f32_run_where_pure_f16_stalls() {
    let w0: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 / 64.0).collect();
    let target: Vec<f32> = w0.iter().map(|w| w - 0.05).collect();
    let opts = SgdOptions {
        lr: 0.002,
        ..Default::default()
    };
    // Each step moves a weight by lr·(w − t) ≤ 1e-4, under half the f16
    // spacing at 1 (4.9e-4): rounded into f16 alone, nothing moves.
    let run = |dtype: DType| {
        let p = Parameter::new(tensor(&w0, dtype));
        let mut opt = Sgd::new(vec![p.clone()], opts).unwrap();
        for _ in 0..500 {
            opt.step(&quadratic_grads(&p, &target)).unwrap();
        }
        (f32s(&p.tensor().unwrap()), opt.master_weight(0, 0).map(f32s))
    };
    let (w32, none) = run(DType::F32);
    assert!(none.is_none(), "an f32 parameter is its own master");
    let (w16, master) = run(DType::F16);
    let master = master.expect("an f16 parameter has a master copy");
    // Pure f16: the same SGD step with the weight rounded to f16 each time.
    let mut pure: Vec<f32> = f32s(&tensor(&w0, DType::F16));
    for _ in 0..500 {
        let next: Vec<f32> = pure
            .iter()
            .zip(&target)
            .map(|(w, t)| w - 0.002 * (w - t))
            .collect();
        pure = f32s(&tensor(&next, DType::F16));
    }
    for i in 0..16 {
        let moved = w0[i] - w32[i];
        assert!(moved > 0.03, "the f32 run moves ({moved})");
        assert_eq!(pure[i], f32s(&tensor(&w0, DType::F16))[i], "pure f16 stalls");
        // The master follows f32 up to the f16 rounding of the gradient's
        // inputs; the parameter is the master rounded.
        assert!((master[i] - w32[i]).abs() < 2e-3, "{} vs {}", master[i], w32[i]);
        assert_eq!(w16[i], f32s(&tensor(&[master[i]], DType::F16))[0]);
    }
}

#[test]
fn adam_keeps_f32_master_and_state_for_bf16_and_f16_parameters_and_saves_them() {
    for dtype in [DType::F16, DType::BF16] {
        let w0: Vec<f32> = (0..8).map(|i| 0.5 - i as f32 / 16.0).collect();
        let target = vec![0.25f32; 8];
        let make = |p: &Parameter| {
            Adam::new(
                vec![p.clone()],
                AdamOptions {
                    lr: 1e-3,
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let p = Parameter::new(tensor(&w0, dtype));
        let mut opt = make(&p);
        for _ in 0..3 {
            opt.step(&quadratic_grads(&p, &target)).unwrap();
        }
        // ZeRO's accounting: 2 B of weight and 2 of gradient per element,
        // and 12 of optimizer state (f32 master, m and v).
        assert_eq!(p.tensor().unwrap().dtype().size_in_bytes(), 2);
        let sd = opt.state_dict();
        let state: Vec<(String, DType)> = sd.iter().map(|(k, t)| (k.to_string(), t.dtype())).collect();
        assert_eq!(
            state,
            vec![
                ("state.0.exp_avg".to_string(), DType::F32),
                ("state.0.exp_avg_sq".to_string(), DType::F32),
                ("state.0.master".to_string(), DType::F32),
            ],
            "{dtype}"
        );
        let state_bytes: usize = sd
            .iter()
            .map(|(_, t)| t.numel() * t.dtype().size_in_bytes())
            .sum();
        assert_eq!(state_bytes, 12 * 8);

        // A resumed optimizer continues from the saved master, bit for bit.
        let q = Parameter::new(p.tensor().unwrap());
        let mut resumed = make(&q);
        resumed.load_state_dict(&sd).unwrap();
        for _ in 0..3 {
            opt.step(&quadratic_grads(&p, &target)).unwrap();
            resumed.step(&quadratic_grads(&q, &target)).unwrap();
        }
        assert_eq!(f32s(&p.tensor().unwrap()), f32s(&q.tensor().unwrap()));
        assert_eq!(
            f32s(opt.master_weight(0, 0).unwrap()),
            f32s(resumed.master_weight(0, 0).unwrap())
        );
        // A master saved for an f32 parameter is not state it accepts.
        let r = Parameter::new(tensor(&w0, DType::F32));
        let err = make(&r).load_state_dict(&sd).unwrap_err().to_string();
        assert!(err.contains("master"), "{err}");
    }
}

#[test]
fn an_overflowing_f16_step_is_skipped_and_the_scale_backs_off() {
    let p = Parameter::new(tensor(&[1.0, -2.0, 0.5, 3.0], DType::F16));
    let mut opt = Sgd::new(
        vec![p.clone()],
        SgdOptions {
            lr: 0.1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut scaler = GradScaler::new(GradScalerOptions::default()).unwrap();
    let target = [0.0f32; 4];
    let loss = |p: &Parameter| {
        let d = p
            .var()
            .unwrap()
            .sub(&Var::constant(tensor(&target, DType::F16)))
            .unwrap();
        d.mul(&d).unwrap().sum(&[], false).unwrap()
    };
    // 65536 · d(Σw²)/dw = 65536 · 2w overflows f16 (max 65504) for every
    // weight: the step is skipped, the parameter and master untouched.
    let before = f32s(&p.tensor().unwrap());
    let mut grads = scaler.backward(&loss(&p)).unwrap();
    assert!(grads.get_id(p.id().unwrap()).is_some());
    assert!(!scaler.step(&mut opt, &mut grads).unwrap());
    scaler.update().unwrap();
    assert_eq!(f32s(&p.tensor().unwrap()), before);
    assert!(opt.master_weight(0, 0).is_none(), "no step was taken");
    assert_eq!(scaler.scale(), 32768.0);
    // The scale backs off until the scaled gradients fit, then steps run.
    let mut skipped = 1;
    loop {
        let mut grads = scaler.backward(&loss(&p)).unwrap();
        let stepped = scaler.step(&mut opt, &mut grads).unwrap();
        scaler.update().unwrap();
        if stepped {
            break;
        }
        skipped += 1;
    }
    // 2·3·S ≤ 65504 first holds at S = 8192 (6·16384 overflows).
    assert_eq!((skipped, scaler.scale()), (3, 8192.0));
    let after = f32s(&p.tensor().unwrap());
    for (a, b) in after.iter().zip(&before) {
        assert!(
            (a - b * 0.8).abs() <= 2e-3 * b.abs().max(1.0),
            "{a} vs {}",
            b * 0.8
        );
    }
}
