//! GradScaler against PyTorch's update rule on sequences with injected
//! infs and NaNs (training-and-data.md §4 and §9).

use super::*;
use crate::test_util::{fixed_grads, param, values};
use crate::{Sgd, SgdOptions};
use tessera_autograd::{record, Parameter};

fn scaler(growth_interval: u32) -> GradScaler {
    GradScaler::new(GradScalerOptions {
        growth_interval,
        ..Default::default()
    })
    .unwrap()
}

/// One iteration: gradients `g` already multiplied by the current scale,
/// then step and update. Returns whether the step was taken.
fn iteration(s: &mut GradScaler, opt: &mut Sgd, p: &Parameter, g: f64) -> bool {
    let mut grads = fixed_grads(&[(p, &[g * s.scale(), 1.0])]);
    let stepped = s.step(opt, &mut grads).unwrap();
    s.update().unwrap();
    stepped
}

#[test]
fn defaults_are_pytorchs() {
    let o = GradScalerOptions::default();
    assert_eq!(
        (
            o.init_scale,
            o.growth_factor,
            o.backoff_factor,
            o.growth_interval,
            o.enabled
        ),
        (65536.0, 2.0, 0.5, 2000, true)
    );
    // 2000 clean steps double the scale.
    let p = param(&[0.0, 0.0], &[2]);
    let mut opt = Sgd::new(
        vec![p.clone()],
        SgdOptions {
            lr: 0.0,
            ..Default::default()
        },
    )
    .unwrap();
    let mut s = GradScaler::new(o).unwrap();
    for i in 0..2000 {
        assert_eq!(s.scale(), 65536.0, "step {i}");
        assert!(iteration(&mut s, &mut opt, &p, 1.0));
    }
    assert_eq!((s.scale(), s.growth_tracker()), (131072.0, 0));
}

/// A sequence with growth interval 3: S = 2^16; two clean steps (tracker
/// 1, 2); an inf (skipped, S = 2^15, tracker 0); three clean steps (S =
/// 2^16 at the third); a NaN (skipped, S = 2^15); then clean again.
#[test]
fn infs_skip_the_step_and_back_off() {
    let p = param(&[1.0, 1.0], &[2]);
    let mut opt = Sgd::new(
        vec![p.clone()],
        SgdOptions {
            lr: 0.5,
            ..Default::default()
        },
    )
    .unwrap();
    let mut s = scaler(3);
    let seq = [
        (1.0, true, 65536.0, 1),
        (1.0, true, 65536.0, 2),
        (f64::INFINITY, false, 32768.0, 0),
        (1.0, true, 32768.0, 1),
        (1.0, true, 32768.0, 2),
        (1.0, true, 65536.0, 0),
        (f64::NAN, false, 32768.0, 0),
        (-f64::INFINITY, false, 16384.0, 0),
        (1.0, true, 16384.0, 1),
    ];
    let mut taken = 0;
    for (i, &(g, stepped, scale, tracker)) in seq.iter().enumerate() {
        assert_eq!(iteration(&mut s, &mut opt, &p, g), stepped, "iteration {i}");
        assert_eq!((s.scale(), s.growth_tracker()), (scale, tracker), "iteration {i}");
        taken += stepped as usize;
        // Unscaled gradients are (1, 1/S·1): each taken step subtracts 0.5.
        assert_eq!(values(&p)[0], 1.0 - 0.5 * taken as f64, "iteration {i}");
    }
}

#[test]
fn unscale_divides_by_the_scale_and_reports_non_finite_values() {
    let p = param(&[0.0, 0.0], &[2]);
    let mut s = scaler(2000);
    let mut grads = fixed_grads(&[(&p, &[65536.0 * 3.0, -65536.0 / 4.0])]);
    assert!(!s.unscale_(&mut grads).unwrap());
    assert_eq!(p.grad(&grads).unwrap().to_vec::<f64>().unwrap(), vec![3.0, -0.25]);
    assert!(s.unscale_(&mut grads).is_err(), "twice before update");
    s.update().unwrap();
    let mut grads = fixed_grads(&[(&p, &[1.0, f64::NAN])]);
    assert!(s.unscale_(&mut grads).unwrap());
    // f16 gradients: scaled back in f32 math.
    let h = Parameter::new(
        tessera_tensor::Tensor::from_vec(vec![0.0f32], &[1])
            .unwrap()
            .to_dtype(tessera_tensor::DType::F16)
            .unwrap(),
    );
    let mut g16 = Gradients::default();
    g16.insert(
        h.id().unwrap(),
        Tensor::from_vec(vec![1024.0f32], &[1])
            .unwrap()
            .to_dtype(tessera_tensor::DType::F16)
            .unwrap(),
    );
    let mut s2 = GradScaler::new(GradScalerOptions {
        init_scale: 512.0,
        ..Default::default()
    })
    .unwrap();
    assert!(!s2.unscale_(&mut g16).unwrap());
    assert_eq!(
        h.grad(&g16)
            .unwrap()
            .to_dtype(tessera_tensor::DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![2.0]
    );
}

#[test]
fn misuse_is_an_error() {
    let p = param(&[0.0, 0.0], &[2]);
    let mut opt = Sgd::new(vec![p.clone()], SgdOptions::default()).unwrap();
    let mut s = scaler(10);
    assert!(s.update().is_err(), "no inf checks recorded");
    let mut grads = fixed_grads(&[(&p, &[1.0, 1.0])]);
    s.step(&mut opt, &mut grads).unwrap();
    assert!(s.step(&mut opt, &mut grads).is_err(), "step twice");
    assert!(s.unscale_(&mut grads).is_err(), "unscale after step");
    s.update().unwrap();
    for bad in [
        GradScalerOptions {
            growth_factor: 1.0,
            ..Default::default()
        },
        GradScalerOptions {
            backoff_factor: 1.0,
            ..Default::default()
        },
        GradScalerOptions {
            growth_interval: 0,
            ..Default::default()
        },
        GradScalerOptions {
            init_scale: f64::INFINITY,
            ..Default::default()
        },
    ] {
        assert!(GradScaler::new(bad).is_err(), "{bad:?}");
    }
}

/// A grown scale that overflows f32 is never adopted.
#[test]
fn an_infinite_scale_is_never_adopted() {
    let p = param(&[0.0, 0.0], &[2]);
    let mut opt = Sgd::new(vec![p.clone()], SgdOptions::default()).unwrap();
    let mut s = GradScaler::new(GradScalerOptions {
        init_scale: 3e38,
        growth_interval: 1,
        ..Default::default()
    })
    .unwrap();
    let mut grads = fixed_grads(&[(&p, &[0.0, 0.0])]);
    s.step(&mut opt, &mut grads).unwrap();
    s.update().unwrap();
    assert_eq!(s.scale(), 3e38f32 as f64);
    assert_eq!(s.growth_tracker(), 0);
}

#[test]
fn backward_scales_the_loss_and_disabled_does_nothing() {
    // loss = Σ w·c, so dloss/dw = c and the scaled gradient is S·c.
    let w = Parameter::new(Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap());
    let c = Tensor::from_vec(vec![0.5f32, -3.0], &[2]).unwrap();
    let x = w.var().unwrap();
    let v: f32 = x
        .tensor()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(c.to_vec::<f32>().unwrap())
        .map(|(a, b)| a * b)
        .sum();
    let cc = c.clone();
    let loss = record("dot", Tensor::scalar(v), &[&x], move |g, _| {
        let s = g.to_scalar::<f32>()?;
        Ok(vec![Some(cc.map::<f32, f32>(|y| y * s))])
    });
    let mut s = scaler(2000);
    let mut grads = s.backward(&loss).unwrap();
    assert_eq!(
        w.grad(&grads).unwrap().to_vec::<f32>().unwrap(),
        vec![32768.0, -196608.0]
    );
    s.unscale_(&mut grads).unwrap();
    assert_eq!(w.grad(&grads).unwrap().to_vec::<f32>().unwrap(), vec![0.5, -3.0]);

    let mut off = GradScaler::new(GradScalerOptions {
        enabled: false,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(off.scale(), 1.0);
    let p = param(&[1.0, 1.0], &[2]);
    let mut opt = Sgd::new(
        vec![p.clone()],
        SgdOptions {
            lr: 1.0,
            ..Default::default()
        },
    )
    .unwrap();
    let mut grads = fixed_grads(&[(&p, &[f64::INFINITY, 1.0])]);
    assert!(off.step(&mut opt, &mut grads).unwrap(), "disabled: always steps");
    off.update().unwrap();
}

#[test]
fn state_round_trips_with_pytorch_keys() {
    let p = param(&[0.0, 0.0], &[2]);
    let mut opt = Sgd::new(vec![p.clone()], SgdOptions::default()).unwrap();
    let mut s = scaler(5);
    iteration(&mut s, &mut opt, &p, f64::INFINITY);
    iteration(&mut s, &mut opt, &p, 1.0);
    iteration(&mut s, &mut opt, &p, 1.0);
    let sd = s.state_dict();
    for key in [
        "scale",
        "growth_factor",
        "backoff_factor",
        "growth_interval",
        "_growth_tracker",
    ] {
        assert!(sd.metadata().contains_key(key), "{key}");
    }
    let mut r = scaler(2000);
    r.load_state_dict(&sd).unwrap();
    assert_eq!(
        (r.scale(), r.growth_tracker(), r.options().growth_interval),
        (32768.0, 2, 5)
    );
    for _ in 0..3 {
        iteration(&mut s, &mut opt, &p, 1.0);
        iteration(&mut r, &mut opt, &p, 1.0);
    }
    assert_eq!((r.scale(), r.growth_tracker()), (s.scale(), s.growth_tracker()));
    assert_eq!(r.scale(), 65536.0);
}

/// f32 gradients on a GPU (the emulated device under `cuda-emu`) unscale
/// to the CPU's bits and give the CPU's verdict: all finite, or one inf,
/// -inf or NaN in the second of three tensors (one of them 0-d).
#[cfg(feature = "cuda")]
#[test]
fn device_gradients_unscale_and_flag_as_on_the_cpu() {
    use tessera_tensor::{DType, Device};
    let dev = Device::Cuda(0);
    if let Err(e) = dev.available() {
        println!("skipped: no CUDA device ({e})");
        return;
    }
    for bad in [None, Some(f64::INFINITY), Some(f64::NEG_INFINITY), Some(f64::NAN)] {
        let mut second = vec![3.0e4, -7.5, 0.25, 1.0e-3];
        if let Some(b) = bad {
            second[2] = b;
        }
        let list: [(&[f64], &[usize]); 3] =
            [(&[65536.0, -2.0, 0.5], &[3]), (&second, &[2, 2]), (&[4.0], &[])];
        let (_, cpu_grads) = crate::test_util::grads_of(&list);
        let as_f32 = |g: &Gradients, device: Device| {
            let mut out = Gradients::default();
            for (id, t) in g.iter() {
                out.insert(*id, t.to_dtype(DType::F32).unwrap().to_device(device).unwrap());
            }
            out
        };
        let (mut cpu, mut gpu) = (as_f32(&cpu_grads, Device::Cpu), as_f32(&cpu_grads, dev));
        let (mut s_cpu, mut s_gpu) = (scaler(2000), scaler(2000));
        let found_cpu = s_cpu.unscale_(&mut cpu).unwrap();
        let found_gpu = s_gpu.unscale_(&mut gpu).unwrap();
        assert_eq!(found_cpu, bad.is_some(), "{bad:?}");
        assert_eq!(found_gpu, found_cpu, "{bad:?}");
        for (id, c) in cpu.iter() {
            let g = gpu.get_id(*id).unwrap();
            assert!(!g.device().is_cpu(), "unscaled where it lies");
            let bits = |t: &Tensor| -> Vec<u32> {
                t.to_device(Device::Cpu)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(bits(g), bits(c), "{bad:?}");
        }
    }
}
