//! Five steps of every PyTorch optimizer on fixed gradients, against
//! values PyTorch 2.15 computed (float64, and float32 for three cases).
//! The reference numbers below were printed by this script
//! (`foreach=False`, i.e. the single-tensor kernels):
//!
//! ```python
//! import torch
//! torch.set_printoptions(precision=17)
//! def init(n, k): return [((i * 5 + k) % 9 - 4) / 8 for i in range(n)]
//! def grad(n, t, k): return [((i * 7 + t * 3 + k) % 11 - 5) / 4 for i in range(n)]
//! CASES = [
//!   ("sgd_plain", torch.optim.SGD, dict(lr=0.1)),
//!   ("sgd_momentum", torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
//!   ("sgd_nesterov_max", torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True)),
//!   ("adam_default", torch.optim.Adam, dict(lr=0.01)),
//!   ("adam_l2_amsgrad", torch.optim.Adam, dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
//!   ("adamw_default", torch.optim.AdamW, dict(lr=0.01)),
//!   ("adamw_amsgrad_max", torch.optim.AdamW, dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True, maximize=True)),
//!   ("adagrad", torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
//!   ("rmsprop_default", torch.optim.RMSprop, dict(lr=0.01)),
//!   ("rmsprop_centered_momentum", torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, centered=True, momentum=0.9, weight_decay=0.1)),
//!   ("rmsprop_momentum", torch.optim.RMSprop, dict(lr=0.01, momentum=0.5)),
//!   ("rmsprop_centered", torch.optim.RMSprop, dict(lr=0.01, centered=True, eps=1e-3)),
//! ]
//! for dtype in (torch.float64, torch.float32):
//!   for name, cls, kw in CASES:
//!     if dtype == torch.float32 and name not in ("adam_default", "sgd_momentum", "rmsprop_centered_momentum"): continue
//!     w = torch.tensor(init(6, 0), dtype=dtype).reshape(2, 3).requires_grad_()
//!     b = torch.tensor(init(3, 1), dtype=dtype).requires_grad_()
//!     opt = cls([w, b], foreach=False, **kw)
//!     for t in range(5):
//!       w.grad = torch.tensor(grad(6, t, 0), dtype=dtype).reshape(2, 3)
//!       b.grad = torch.tensor(grad(3, t, 1), dtype=dtype)
//!       opt.step()
//!     vals = w.detach().flatten().tolist() + b.detach().tolist()
//!     print(f"{name} {str(dtype)[6:]}: [" + ", ".join(repr(v) for v in vals) + "]")
//! ```

use tessera_autograd::{Gradients, Parameter};
use tessera_tensor::{DType, Tensor};

use crate::test_util::assert_close;
use crate::*;

const SGD_PLAIN_F64: [f64; 9] = [
    -0.3500000000000001,
    -0.05000000000000001,
    -0.32500000000000007,
    0.25,
    -0.3,
    0.55,
    -0.35,
    0.22499999999999995,
    -0.325,
];
const SGD_MOMENTUM_F64: [f64; 9] = [
    0.02863582328257911,
    -0.35128894470046335,
    -0.29380546183719564,
    -0.0471152697931656,
    -0.4163952464819704,
    0.7523491069036302,
    -0.1532047350519878,
    0.31601270699204226,
    -0.47564602017176255,
];
const SGD_NESTEROV_MAX_F64: [f64; 9] = [
    -1.1104320221817048,
    0.7501647181583125,
    -0.4746881202014571,
    0.48711868516488743,
    -0.03758190444620966,
    -0.15629118749349555,
    -0.5684950785355122,
    0.1715544768308323,
    0.06724882344473528,
];
const ADAM_DEFAULT_F64: [f64; 9] = [
    -0.47203771937855066,
    0.09531569673562124,
    -0.3641872594801888,
    0.23366420814005173,
    -0.2699391626073564,
    0.39962858590803507,
    -0.3561721090732034,
    0.2484557665736127,
    -0.25475535061237287,
];
const ADAM_L2_AMSGRAD_F64: [f64; 9] = [
    -0.4705437285152462,
    0.0949492557490459,
    -0.3619117169245172,
    0.23265996755375482,
    -0.2688014808280027,
    0.39777326486943115,
    -0.35471821760901895,
    0.24740399065878815,
    -0.25336163021618335,
];
const ADAMW_DEFAULT_F64: [f64; 9] = [
    -0.4717956278142602,
    0.0952609393315987,
    -0.36400378085304846,
    0.2335444769592526,
    -0.269807507068285,
    0.39943488794747034,
    -0.3559914710432563,
    0.24833281833503712,
    -0.2546316569040647,
];
const ADAMW_AMSGRAD_MAX_F64: [f64; 9] = [
    -0.5229153920222934,
    0.15286770220842383,
    -0.3831793511363419,
    0.2631135514093448,
    -0.23001381265583876,
    0.3493236605578762,
    -0.3891807800072461,
    0.2500359466722881,
    -0.2434280750690684,
];
const ADAGRAD_F64: [f64; 9] = [
    -0.38426144244209953,
    -0.043739373950650584,
    -0.32125845162769073,
    0.21244360467937706,
    -0.3410550162854414,
    0.487474705177609,
    -0.32189098318059267,
    0.2001453796549294,
    -0.2962206917748049,
];
const RMSPROP_DEFAULT_F64: [f64; 9] = [
    -0.3893062797322493,
    -0.06330360832923806,
    -0.32498251403980233,
    0.21663332020951634,
    -0.3927519224904478,
    0.5099222629338541,
    -0.32795297360469305,
    0.1977839336733649,
    -0.2826494087841215,
];
const RMSPROP_CENTERED_MOMENTUM_F64: [f64; 9] = [
    -0.3483208559209209,
    -0.09458923494543703,
    -0.30965206622525354,
    0.15734300059655312,
    -0.43555453095130986,
    0.4953839047353497,
    -0.27584770025566435,
    0.20530642132577376,
    -0.26171245010365657,
];
const RMSPROP_MOMENTUM_F64: [f64; 9] = [
    -0.3064948058752948,
    -0.2016922322179562,
    -0.3031133298788942,
    0.14494419463895905,
    -0.510408369237153,
    0.5886574551737497,
    -0.28294897418831844,
    0.19554552885768572,
    -0.31164332521367727,
];
const RMSPROP_CENTERED_F64: [f64; 9] = [
    -0.3893305347591295,
    -0.062103950166052066,
    -0.32566175039093564,
    0.2164602137721473,
    -0.3895398652885184,
    0.5094937909140375,
    -0.32803000059335663,
    0.1983081145726555,
    -0.28468166325671396,
];
const SGD_MOMENTUM_F32: [f64; 9] = [
    0.028635775670409203,
    -0.35128897428512573,
    -0.29380539059638977,
    -0.04711531102657318,
    -0.41639524698257446,
    0.7523490786552429,
    -0.15320473909378052,
    0.3160126805305481,
    -0.4756460189819336,
];
const ADAM_DEFAULT_F32: [f64; 9] = [
    -0.47203773260116577,
    0.09531569480895996,
    -0.3641872704029083,
    0.23366419970989227,
    -0.2699391841888428,
    0.39962857961654663,
    -0.356172114610672,
    0.24845576286315918,
    -0.2547553479671478,
];
const RMSPROP_CENTERED_MOMENTUM_F32: [f64; 9] = [
    -0.348320871591568,
    -0.09458921104669571,
    -0.30965206027030945,
    0.15734301507472992,
    -0.43555453419685364,
    0.4953839182853699,
    -0.2758477032184601,
    0.20530644059181213,
    -0.2617124319076538,
];

fn init(n: usize, k: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 5 + k) % 9) as f64 / 8.0 - 0.5).collect()
}

fn grad(n: usize, t: usize, k: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 7 + t * 3 + k) % 11) as f64 / 4.0 - 1.25)
        .collect()
}

fn tensor(v: Vec<f64>, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v, shape).unwrap().to_dtype(dtype).unwrap()
}

/// The script's two parameters, a [2, 3] weight and a [3] bias.
fn params(dtype: DType) -> [Parameter; 2] {
    [
        Parameter::new(tensor(init(6, 0), &[2, 3], dtype)),
        Parameter::new(tensor(init(3, 1), &[3], dtype)),
    ]
}

/// Runs the script's five steps and compares the flattened parameters.
fn check(
    mut make: impl FnMut(Vec<Parameter>) -> Box<dyn Optimizer>,
    dtype: DType,
    expected: &[f64; 9],
    tol: f64,
    what: &str,
) {
    let [w, b] = params(dtype);
    let mut opt = make(vec![w.clone(), b.clone()]);
    for t in 0..5 {
        let mut grads = Gradients::default();
        grads.insert(w.id().unwrap(), tensor(grad(6, t, 0), &[2, 3], dtype));
        grads.insert(b.id().unwrap(), tensor(grad(3, t, 1), &[3], dtype));
        opt.step(&grads).unwrap();
    }
    let mut got = w
        .tensor()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    got.extend(
        b.tensor()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec::<f64>()
            .unwrap(),
    );
    assert_close(&got, expected, tol, what);
}

fn sgd(h: SgdOptions) -> impl FnMut(Vec<Parameter>) -> Box<dyn Optimizer> {
    move |p| Box::new(Sgd::new(p, h).unwrap())
}
fn adam(h: AdamOptions) -> impl FnMut(Vec<Parameter>) -> Box<dyn Optimizer> {
    move |p| Box::new(Adam::new(p, h).unwrap())
}
fn adamw(h: AdamWOptions) -> impl FnMut(Vec<Parameter>) -> Box<dyn Optimizer> {
    move |p| Box::new(AdamW::new(p, h).unwrap())
}
fn rmsprop(h: RmsPropOptions) -> impl FnMut(Vec<Parameter>) -> Box<dyn Optimizer> {
    move |p| Box::new(RmsProp::new(p, h).unwrap())
}

// f64 tolerance: a few ulps over five steps; PyTorch's vectorised kernels
// may fuse multiply-adds where we round twice.
const F64_TOL: f64 = 1e-14;
// f32: one rounding per operation, compared after five steps.
const F32_TOL: f64 = 1e-6;

#[test]
fn the_script_inputs_match() {
    assert_eq!(init(6, 0), vec![-0.5, 0.125, -0.375, 0.25, -0.25, 0.375]);
    assert_eq!(grad(3, 1, 1), vec![-0.25, -1.25, 0.5]);
}

#[test]
fn sgd_matches_pytorch() {
    let lr = SgdOptions {
        lr: 0.1,
        ..Default::default()
    };
    check(sgd(lr), DType::F64, &SGD_PLAIN_F64, F64_TOL, "plain");
    let mom = SgdOptions {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.1,
        weight_decay: 0.01,
        ..Default::default()
    };
    check(sgd(mom), DType::F64, &SGD_MOMENTUM_F64, F64_TOL, "momentum");
    check(sgd(mom), DType::F32, &SGD_MOMENTUM_F32, F32_TOL, "momentum f32");
    let nest = SgdOptions {
        lr: 0.1,
        momentum: 0.9,
        nesterov: true,
        weight_decay: 0.01,
        maximize: true,
        ..Default::default()
    };
    check(
        sgd(nest),
        DType::F64,
        &SGD_NESTEROV_MAX_F64,
        F64_TOL,
        "nesterov maximize",
    );
}

#[test]
fn adam_and_adamw_match_pytorch() {
    let a = AdamOptions {
        lr: 0.01,
        ..Default::default()
    };
    check(adam(a), DType::F64, &ADAM_DEFAULT_F64, F64_TOL, "adam");
    check(adam(a), DType::F32, &ADAM_DEFAULT_F32, F32_TOL, "adam f32");
    let a = AdamOptions {
        lr: 0.01,
        weight_decay: 0.1,
        amsgrad: true,
        ..Default::default()
    };
    check(
        adam(a),
        DType::F64,
        &ADAM_L2_AMSGRAD_F64,
        F64_TOL,
        "adam l2 amsgrad",
    );
    let w = AdamWOptions {
        lr: 0.01,
        ..Default::default()
    };
    check(adamw(w), DType::F64, &ADAMW_DEFAULT_F64, F64_TOL, "adamw");
    let w = AdamWOptions {
        lr: 0.01,
        beta1: 0.8,
        beta2: 0.99,
        weight_decay: 0.1,
        amsgrad: true,
        maximize: true,
        ..Default::default()
    };
    check(
        adamw(w),
        DType::F64,
        &ADAMW_AMSGRAD_MAX_F64,
        F64_TOL,
        "adamw amsgrad maximize",
    );
}

#[test]
fn adagrad_matches_pytorch() {
    let h = AdagradOptions {
        lr: 0.1,
        lr_decay: 0.01,
        weight_decay: 0.1,
        initial_accumulator_value: 0.1,
        ..Default::default()
    };
    check(
        move |p| Box::new(Adagrad::new(p, h).unwrap()),
        DType::F64,
        &ADAGRAD_F64,
        F64_TOL,
        "adagrad",
    );
}

#[test]
fn rmsprop_matches_pytorch() {
    let d = RmsPropOptions {
        lr: 0.01,
        ..Default::default()
    };
    check(rmsprop(d), DType::F64, &RMSPROP_DEFAULT_F64, F64_TOL, "default");
    let cm = RmsPropOptions {
        lr: 0.01,
        alpha: 0.9,
        centered: true,
        momentum: 0.9,
        weight_decay: 0.1,
        ..Default::default()
    };
    check(
        rmsprop(cm),
        DType::F64,
        &RMSPROP_CENTERED_MOMENTUM_F64,
        F64_TOL,
        "centered momentum",
    );
    check(
        rmsprop(cm),
        DType::F32,
        &RMSPROP_CENTERED_MOMENTUM_F32,
        F32_TOL,
        "centered momentum f32",
    );
    let m = RmsPropOptions {
        lr: 0.01,
        momentum: 0.5,
        ..Default::default()
    };
    check(rmsprop(m), DType::F64, &RMSPROP_MOMENTUM_F64, F64_TOL, "momentum");
    let c = RmsPropOptions {
        lr: 0.01,
        centered: true,
        eps: 1e-3,
        ..Default::default()
    };
    check(rmsprop(c), DType::F64, &RMSPROP_CENTERED_F64, F64_TOL, "centered");
}
