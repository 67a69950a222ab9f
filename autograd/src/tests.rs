//! Tests of the tape itself (engine, hooks, modes, checkpointing), using two
//! tiny ops defined here so they do not depend on the op library.

use std::sync::{Arc, Mutex};

use tessera_tensor::{Result, Tensor};

use crate::{checkpoint, no_grad, record, Var};

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

/// Elementwise product of same-shaped f64 values.
fn mul(a: &Var, b: &Var) -> Var {
    let y = a
        .tensor()
        .zip_map::<f64, f64, f64>(b.tensor(), "mul", |x, y| x * y)
        .unwrap();
    let (sa, sb) = (a.tensor().clone(), b.tensor().clone());
    record("mul", y, &[a, b], move |g, needs| {
        let ga = needs[0].then(|| g.zip_map::<f64, f64, f64>(&sb, "mul", |x, y| x * y).unwrap());
        let gb = needs[1].then(|| g.zip_map::<f64, f64, f64>(&sa, "mul", |x, y| x * y).unwrap());
        Ok(vec![ga, gb])
    })
}

/// Sum of all elements of an f64 value, as a 0-d value.
fn sum(a: &Var) -> Var {
    let s: f64 = vals(a.tensor()).iter().sum();
    let shape = a.shape().to_vec();
    record("sum", Tensor::scalar(s), &[a], move |g, _| {
        let gv = g.to_scalar::<f64>()?;
        Ok(vec![Some(Tensor::from_vec(
            vec![gv; shape.iter().product()],
            &shape,
        )?)])
    })
}

/// Multiplies by a fresh random mask from the default generator, like dropout.
fn noisy(a: &Var) -> Var {
    let mask = tessera_tensor::Tensor::rand(a.shape(), tessera_tensor::DType::F64).unwrap();
    let y = a
        .tensor()
        .zip_map::<f64, f64, f64>(&mask, "noisy", |x, m| x * m)
        .unwrap();
    record("noisy", y, &[a], move |g, _| {
        Ok(vec![Some(g.zip_map::<f64, f64, f64>(
            &mask,
            "noisy",
            |x, m| x * m,
        )?)])
    })
}

#[test]
fn reused_value_accumulates_and_constants_get_nothing() {
    let x = Var::leaf(t(&[1.0, 2.0, 3.0], &[3]));
    let c = Var::constant(t(&[4.0, 5.0, 6.0], &[3]));
    // loss = sum(x*x*c + x)  => d/dx = 2xc + 1
    let y = mul(&mul(&x, &x), &c);
    let loss = sum(&crate::record::record(
        "add",
        y.tensor()
            .zip_map::<f64, f64, f64>(x.tensor(), "add", |a, b| a + b)
            .unwrap(),
        &[&y, &x],
        |g, _| Ok(vec![Some(g.clone()), Some(g.clone())]),
    ));
    let grads = loss.backward().unwrap();
    assert_eq!(vals(grads.get(&x).unwrap()), vec![9.0, 21.0, 37.0]);
    assert!(grads.get(&c).is_none());
    assert_eq!(grads.len(), 1);
}

#[test]
fn second_backward_and_bad_gradients_are_errors() {
    let x = Var::leaf(t(&[1.0, 2.0], &[2]));
    let y = mul(&x, &x);
    assert!(y.backward().is_err(), "non-scalar output needs a gradient");
    assert!(y.backward_with(&t(&[1.0, 1.0, 1.0], &[3])).is_err());
    let loss = sum(&y);
    loss.backward().unwrap();
    let err = loss.backward().err().unwrap().to_string();
    assert!(err.contains("already used"), "{err}");
    assert!(Var::constant(t(&[1.0], &[1])).backward().is_err());
}

#[test]
fn no_grad_records_nothing_and_detach_cuts() {
    let x = Var::leaf(t(&[2.0], &[1]));
    let y = no_grad(|| mul(&x, &x));
    assert!(!y.requires_grad());
    let z = mul(&x.detach(), &x);
    let g = sum(&z).backward().unwrap();
    assert_eq!(vals(g.get(&x).unwrap()), vec![2.0]);
}

#[test]
fn requires_grad_false_freezes_a_leaf() {
    let mut w = Var::leaf(t(&[3.0], &[1]));
    let x = Var::leaf(t(&[2.0], &[1]));
    w.requires_grad_(false).unwrap();
    assert!(!w.requires_grad() && w.id().is_none());
    let g = sum(&mul(&w, &x)).backward().unwrap();
    assert_eq!(g.len(), 1, "only x gets a gradient");
    assert_eq!(vals(g.get(&x).unwrap()), vec![3.0]);
    // Unfreezing gives a new leaf; an op result cannot be frozen.
    w.requires_grad_(true).unwrap();
    let g = sum(&mul(&w, &x)).backward().unwrap();
    assert_eq!(vals(g.get(&w).unwrap()), vec![2.0]);
    let mut y = mul(&w, &x);
    assert!(y.requires_grad_(false).is_err());
}

#[test]
fn hooks_fire_once_when_final_in_reverse_use_order() {
    let a = Var::leaf(t(&[1.0], &[1]));
    let b = Var::leaf(t(&[2.0], &[1]));
    let log = Arc::new(Mutex::new(Vec::new()));
    for (name, v) in [("a", &a), ("b", &b)] {
        let log = log.clone();
        v.register_hook(move |g| log.lock().unwrap().push((name, g.to_scalar::<f64>().unwrap())))
            .unwrap();
    }
    // loss = (a·a)·b: b's gradient is final after the last op, a's one op later.
    let h = mul(&a, &a);
    let h = mul(&h, &b);
    sum(&h).backward().unwrap();
    assert_eq!(*log.lock().unwrap(), vec![("b", 1.0), ("a", 4.0)]);
    assert!(Var::constant(t(&[1.0], &[1])).register_hook(|_| {}).is_err());
}

fn run_twice<F: Fn() -> Result<Vec<f64>>>(f: F) -> (Vec<f64>, Vec<f64>) {
    (f().unwrap(), f().unwrap())
}

#[test]
fn checkpoint_matches_plain_run_bitwise_with_randomness_on_every_stream() {
    let w1 = Var::leaf(t(&[0.5, -1.5, 2.0], &[3]));
    let w2 = Var::leaf(t(&[1.25, 0.75, -0.5], &[3]));
    let x = Var::leaf(t(&[1.0, 2.0, 3.0], &[3]));
    let segment = {
        let (w1, w2) = (w1.clone(), w2.clone());
        move |xs: &[Var]| -> Result<Vec<Var>> {
            // One draw from the default generator, one from a named stream
            // (tensor parallelism's model-parallel dropout): the replay must
            // restore both.
            let h = noisy(&mul(&xs[0], &w1));
            let h = tessera_tensor::rng::fork("ckpt-test", || noisy(&h))?;
            Ok(vec![mul(&h, &w2)])
        }
    };
    let go = |ckpt: bool| -> Result<Vec<f64>> {
        tessera_tensor::rng::manual_seed(7);
        tessera_tensor::rng::reset_tracked();
        tessera_tensor::rng::add_tracked("ckpt-test", 8)?;
        let h = if ckpt {
            checkpoint(segment.clone(), std::slice::from_ref(&x))?.remove(0)
        } else {
            segment(std::slice::from_ref(&x))?.remove(0)
        };
        let g = sum(&mul(&h, &h)).backward()?;
        Ok([&x, &w1, &w2]
            .iter()
            .flat_map(|v| vals(g.get(v).unwrap()))
            .collect())
    };
    let (plain, plain2) = run_twice(|| go(false));
    assert_eq!(plain, plain2);
    let (ck, _) = run_twice(|| go(true));
    assert_eq!(plain, ck, "checkpointed gradients equal the plain ones bitwise");
}

#[test]
fn checkpoint_keeps_only_inputs() {
    let n = 1 << 15;
    let w = Var::leaf(t(&vec![1.5; n], &[n]));
    let x = Var::leaf(t(&vec![2.0; n], &[n]));
    let seg = {
        let w = w.clone();
        move |xs: &[Var]| -> Result<Vec<Var>> {
            let mut h = xs[0].clone();
            for _ in 0..6 {
                h = mul(&h, &w);
            }
            Ok(vec![h])
        }
    };
    let base = tessera_tensor::live_bytes();
    let plain = seg(std::slice::from_ref(&x)).unwrap().remove(0);
    let plain_bytes = tessera_tensor::live_bytes() - base;
    drop(plain);
    let base = tessera_tensor::live_bytes();
    let ck = checkpoint(seg, std::slice::from_ref(&x)).unwrap().remove(0);
    let ck_bytes = tessera_tensor::live_bytes() - base;
    assert!(
        ck_bytes * 3 < plain_bytes,
        "checkpoint kept {ck_bytes} bytes, plain {plain_bytes}"
    );
    let g = sum(&ck).backward().unwrap();
    assert_eq!(vals(g.get(&x).unwrap())[0], 1.5f64.powi(6));
    assert!((vals(g.get(&w).unwrap())[0] - 6.0 * 2.0 * 1.5f64.powi(5)).abs() < 1e-9);
}

#[test]
fn threads_build_independent_graphs() {
    let work = |seed: f64| {
        let x = Var::leaf(t(&[seed, seed + 1.0], &[2]));
        let mut h = x.clone();
        for _ in 0..50 {
            h = mul(&h, &Var::constant(t(&[1.01, 0.99], &[2])));
        }
        vals(sum(&h).backward().unwrap().get(&x).unwrap())
    };
    let serial: Vec<_> = (0..4).map(|i| work(i as f64)).collect();
    let threaded: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4).map(|i| s.spawn(move || work(i as f64))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(serial, threaded);
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Var>();
}

/// A 200,000-op chain is dropped without recursing once per node, whether
/// or not backward ran over it (the backward closures are gone then, the
/// node chain is not). Runs on a thread with a 512 KiB stack, where a
/// recursive drop of even a few thousand nodes overflows.
#[test]
fn dropping_a_very_long_graph_does_not_overflow_the_stack() {
    const OPS: usize = 200_000;
    let chain = |backward: bool| {
        let x = Var::leaf(t(&[0.5], &[1]));
        let mut h = x.clone();
        for _ in 0..OPS {
            h = h.mul_scalar(1.0).unwrap();
        }
        if backward {
            let g = h.backward_with(&t(&[2.0], &[1])).unwrap();
            assert_eq!(vals(g.get(&x).unwrap()), vec![2.0]);
        }
        // The output owns the whole chain; the leaf goes last.
        drop(h);
        drop(x);
    };
    std::thread::Builder::new()
        .stack_size(512 << 10)
        .spawn(move || {
            chain(false);
            chain(true);
        })
        .unwrap()
        .join()
        .expect("the chains drop without overflowing the stack");
}

#[test]
fn gradcheck_passes_correct_and_catches_wrong_gradients() {
    let x = t(&[0.3, -1.2, 2.5], &[3]);
    let y = t(&[1.1, 0.4, -0.7], &[3]);
    let report = crate::gradcheck(
        |v| Ok(mul(&mul(&v[0], &v[1]), &v[0])),
        &[x.clone(), y.clone()],
        Default::default(),
    )
    .unwrap();
    assert_eq!(report.ops.iter().copied().collect::<Vec<_>>(), vec!["mul"]);

    // An op whose backward is off by a factor of 2 must be caught.
    let wrong = |v: &[Var]| -> Result<Var> {
        let out = v[0].tensor().map::<f64, f64>(|a| a * a);
        let saved = v[0].tensor().clone();
        Ok(record("square", out, &[&v[0]], move |g, _| {
            Ok(vec![Some(g.zip_map::<f64, f64, f64>(
                &saved,
                "square",
                |g, a| g * a,
            )?)])
        }))
    };
    let err = crate::gradcheck(wrong, &[x], Default::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("input 0"), "{err}");
    assert!(crate::gradcheck(
        wrong,
        &[y.to_dtype(tessera_tensor::DType::F32).unwrap()],
        Default::default()
    )
    .is_err());
}
