//! Test bodies of the SIMT kernels: elementwise, Philox, reductions,
//! softmax, cross-entropy, LayerNorm, AdamW, embedding, im2col.

use half::{bf16, f16};
use tessera_cuda_kernels::ops::conv::{col2im, im2col, ConvGeom};
use tessera_cuda_kernels::ops::elementwise::{self as ew, BinaryOp, Operand, UnaryOp};
use tessera_cuda_kernels::ops::embedding::{embedding_bwd, embedding_fwd};
use tessera_cuda_kernels::ops::layernorm::{layer_norm_bwd, layer_norm_bwd_workspace, layer_norm_fwd};
use tessera_cuda_kernels::ops::optim::{adamw, adamw_tables, AdamConfig, AdamTensor};
use tessera_cuda_kernels::ops::reduce::{arg_extreme, reduce, ReduceOp};
use tessera_cuda_kernels::ops::softmax::{cross_entropy_bwd, cross_entropy_fwd, softmax};
use tessera_cuda_kernels::philox;

use super::{assert_close, to64, Digest, Exec, Rng, TF};

/// Calls `$f::<T>` for f32, f16 and bf16.
macro_rules! all_floats {
    ($f:ident, $e:expr, $d:expr) => {{
        $f::<f32>($e, $d);
        $f::<f16>($e, $d);
        $f::<bf16>($e, $d);
    }};
}

fn erf(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse; integrate the series instead.
    let mut sum = x;
    let mut term = x;
    for n in 1..60 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Identity => x,
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
        UnaryOp::GeluTanh => 0.5 * x * (1.0 + (0.7978845608028654 * (x + 0.044715 * x * x * x)).tanh()),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Square => x * x,
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Log1p => x.ln_1p(),
        UnaryOp::Expm1 => x.exp_m1(),
        UnaryOp::Erf => erf(x),
    }
}

fn binary_ref(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Maximum => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        BinaryOp::Minimum => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        BinaryOp::Pow => a.powf(b),
        BinaryOp::GeluErfBackward => {
            let pdf = (-0.5 * b * b).exp() / (2.0 * std::f64::consts::PI).sqrt();
            a * (0.5 * (1.0 + erf(b / 2f64.sqrt())) + b * pdf)
        }
        BinaryOp::GeluTanhBackward => {
            let k = 0.7978845608028654;
            let t = (k * (b + 0.044715 * b * b * b)).tanh();
            a * (0.5 * (1.0 + t) + 0.5 * b * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * b * b))
        }
        BinaryOp::SiluBackward => {
            let s = 1.0 / (1.0 + (-b).exp());
            a * s * (1.0 + b * (1.0 - s))
        }
        BinaryOp::SigmoidBackward => a * b * (1.0 - b),
        BinaryOp::TanhBackward => a * (1.0 - b * b),
        BinaryOp::ReluBackward => {
            if b > 0.0 {
                a
            } else {
                0.0
            }
        }
        BinaryOp::AbsBackward => a * unary_ref(UnaryOp::Sign, b),
    }
}

/// Index of element `idx` (row-major over `shape`) under `strides` + `offset`.
fn at(shape: &[usize], strides: &[isize], offset: usize, mut idx: usize) -> usize {
    let mut off = offset as isize;
    for d in (0..shape.len()).rev() {
        off += (idx % shape[d]) as isize * strides[d];
        idx /= shape[d];
    }
    off as usize
}

fn unary_t<T: TF>(e: &impl Exec, dg: &mut Digest) {
    let mut r = Rng::new(1);
    // A [3, 5, 7] output read through a permuted, offset view of a
    // [7, 3, 5] buffer (plus slack), and a contiguous length-37 vector.
    let shape = [3usize, 5, 7];
    let base: Vec<T> = r.vec(2 + 7 * 3 * 5, -2.0, 2.0);
    let strides = [5isize, 1, 15];
    let contig: Vec<T> = r.vec(37, -2.0, 2.0);
    let (xb, xc) = (e.upload(&base), e.upload(&contig));
    for op in UnaryOp::ALL {
        let y = e.upload(&[T::default(); 105]);
        e.go(&[ew::unary(
            op,
            Operand {
                ptr: xb,
                offset: 2,
                strides: &strides,
            },
            y,
            &shape,
        )
        .unwrap()]);
        let want: Vec<f64> = (0..105)
            .map(|i| unary_ref(op, base[at(&shape, &strides, 2, i)].to_f64()))
            .collect();
        let got = e.download(y);
        assert_close(
            &format!("{op:?} strided {}", T::NAME),
            &to64(&got),
            &want,
            4.0 * T::EPS + 1e-6,
            1e-6,
        );
        let y2 = e.upload(&[T::default(); 37]);
        e.go(&[ew::unary(op, Operand::new(xc, &[1]), y2, &[37]).unwrap()]);
        let want: Vec<f64> = contig.iter().map(|x| unary_ref(op, x.to_f64())).collect();
        let got2 = e.download(y2);
        assert_close(
            &format!("{op:?} contiguous {}", T::NAME),
            &to64(&got2),
            &want,
            4.0 * T::EPS + 1e-6,
            1e-6,
        );
        dg.add(&got);
        dg.add(&got2);
    }
}

pub fn elementwise_unary(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    all_floats!(unary_t, e, &mut d);
    d
}

fn binary_t<T: TF>(e: &impl Exec, dg: &mut Digest) {
    let mut r = Rng::new(2);
    let shape = [4usize, 5, 6];
    let a: Vec<T> = r.vec(24, -2.0, 2.0);
    let b: Vec<T> = r.vec(30, 0.25, 2.0);
    let (sa, sb) = ([6isize, 0, 1], [0isize, 6, 1]);
    let (pa, pb) = (e.upload(&a), e.upload(&b));
    for op in BinaryOp::ALL {
        let y = e.upload(&[T::default(); 120]);
        e.go(&[ew::binary(op, Operand::new(pa, &sa), Operand::new(pb, &sb), y, &shape).unwrap()]);
        let want: Vec<f64> = (0..120)
            .map(|i| {
                binary_ref(
                    op,
                    a[at(&shape, &sa, 0, i)].to_f64(),
                    b[at(&shape, &sb, 0, i)].to_f64(),
                )
            })
            .collect();
        let got = e.download(y);
        assert_close(
            &format!("{op:?} broadcast {}", T::NAME),
            &to64(&got),
            &want,
            4.0 * T::EPS + 1e-6,
            1e-6,
        );
        dg.add(&got);
        let y2 = e.upload(&[T::default(); 24]);
        e.go(&[ew::binary(op, Operand::new(pa, &[1]), Operand::new(pb, &[1]), y2, &[24]).unwrap()]);
        let want: Vec<f64> = (0..24)
            .map(|i| binary_ref(op, a[i].to_f64(), b[i].to_f64()))
            .collect();
        assert_close(
            &format!("{op:?} contiguous {}", T::NAME),
            &to64(&e.download(y2)),
            &want,
            4.0 * T::EPS + 1e-6,
            1e-6,
        );
    }
    // where over a broadcast condition, fill, and a zero-size output.
    let cond: Vec<u8> = (0..6).map(|i| (i % 3 == 0) as u8).collect();
    let pc = e.upload(&cond);
    let y = e.upload(&[T::default(); 120]);
    e.go(&[ew::where_(
        Operand::new(pc, &[0, 0, 1]),
        Operand::new(pa, &sa),
        Operand::new(pb, &sb),
        y,
        &shape,
    )
    .unwrap()]);
    let want: Vec<f64> = (0..120)
        .map(|i| {
            if cond[i % 6] != 0 {
                a[at(&shape, &sa, 0, i)].to_f64()
            } else {
                b[at(&shape, &sb, 0, i)].to_f64()
            }
        })
        .collect();
    assert_close(
        &format!("where {}", T::NAME),
        &to64(&e.download(y)),
        &want,
        0.0,
        0.0,
    );
    let f = e.upload(&[T::default(); 33]);
    e.go(&[ew::fill(f, 33, 1.5).unwrap()]);
    assert_close("fill", &to64(&e.download(f)), &[1.5; 33], 0.0, 0.0);
    e.go(&[ew::unary(UnaryOp::Exp, Operand::new(pa, &[1, 1]), y, &[0, 3]).unwrap()]);
}

pub fn elementwise_binary(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    all_floats!(binary_t, e, &mut d);
    d
}

/// Normals from counter block `first`, against the f64 reference rounded
/// once to `T`: bit for bit on the emulator (same libm); on a GPU, whose
/// f64 `log`/`cos`/`sin` may differ in the last bit, within one ulp of `T`.
fn philox_normal<T: TF + PartialEq>(e: &impl Exec, seed: u64, first: u64, len: usize) {
    for (mean, std) in [(0.0, 1.0), (0.5, 2.0), (-1e3, 1e-3)] {
        let y = e.upload(&vec![T::from_f64(0.0); len]);
        e.go(&[ew::normal(y, len, seed, first, mean, std).unwrap()]);
        let got = e.download(y);
        let want = philox::normal(seed, first, len, mean, std);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let exact = *g == T::from_f64(*w);
            let near = (g.to_f64() - w).abs() <= 2.0 * T::EPS * w.abs().max(1e-30);
            assert!(
                exact || (!e.name().contains("emu") && near),
                "[{}] normal {} #{i} seed {seed} block {first}: {} vs {w}",
                e.name(),
                T::NAME,
                g.to_f64()
            );
        }
    }
}

pub fn casts_and_philox(e: &impl Exec) -> Digest {
    let mut r = Rng::new(3);
    let x: Vec<f32> = (0..41)
        .map(|_| r.uniform(-70000.0, 70000.0) as f32)
        .chain([0.0, -0.0, 1e-8, 65519.0, 65520.0, f32::NAN])
        .collect();
    let n = x.len();
    let px = e.upload(&x);
    let (h, b) = (e.upload(&vec![f16::ZERO; n]), e.upload(&vec![bf16::ZERO; n]));
    e.go(&[
        ew::cast::<f32, f16>(px, h, n).unwrap(),
        ew::cast::<f32, bf16>(px, b, n).unwrap(),
    ]);
    let (hv, bv) = (e.download(h), e.download(b));
    for i in 0..n {
        assert!(
            hv[i].to_bits() == f16::from_f32(x[i]).to_bits() || (x[i].is_nan() && hv[i].is_nan()),
            "f32->f16 of {}",
            x[i]
        );
        assert!(
            bv[i].to_bits() == bf16::from_f32(x[i]).to_bits() || (x[i].is_nan() && bv[i].is_nan()),
            "f32->bf16 of {}",
            x[i]
        );
    }
    let (h2, b2) = (e.upload(&vec![f16::ZERO; n]), e.upload(&vec![bf16::ZERO; n]));
    e.go(&[
        ew::cast::<bf16, f16>(b, h2, n).unwrap(),
        ew::cast::<f16, bf16>(h, b2, n).unwrap(),
    ]);
    let back = e.upload(&vec![0f32; n]);
    e.go(&[ew::cast::<f16, f32>(h, back, n).unwrap()]);
    let bv2 = e.download(back);
    for i in 0..n {
        assert!(
            bv2[i].to_bits() == hv[i].to_f32().to_bits() || bv2[i].is_nan(),
            "f16->f32"
        );
        let hb = e.download(h2)[i];
        assert!(
            hb.to_bits() == f16::from_f32(bv[i].to_f32()).to_bits() || hb.is_nan(),
            "bf16->f16"
        );
    }
    assert!(ew::cast::<f32, f32>(px, px, n).is_err());
    // Philox: uniforms bit-exact with the CPU generator from any offset,
    // with as many random bits as the type holds (so never `high`).
    let mut d = Digest::default();
    for (seed, offset, len) in [(0u64, 0u64, 1usize), (42, 5, 37), (u64::MAX, 1 << 33, 70)] {
        let y = e.upload(&vec![0f32; len]);
        e.go(&[ew::uniform(y, len, seed, offset, -1.0, 3.0).unwrap()]);
        let got = e.download(y);
        let want = philox::uniform_f32(seed, offset, len, -1.0, 3.0, 24);
        assert!(
            got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "uniform seed {seed} offset {offset}"
        );
        let hz = e.upload(&vec![bf16::ZERO; len]);
        e.go(&[ew::uniform(hz, len, seed, offset, -1.0, 3.0).unwrap()]);
        let want8 = philox::uniform_f32(seed, offset, len, -1.0, 3.0, 8);
        assert!(
            e.download(hz)
                .iter()
                .zip(&want8)
                .all(|(a, b)| a.to_bits() == bf16::from_f32(*b).to_bits()),
            "bf16 uniform"
        );
        let unit = e.upload(&vec![f16::ZERO; len]);
        e.go(&[ew::uniform(unit, len, seed, offset, 0.0, 1.0).unwrap()]);
        let want11 = philox::uniform_f32(seed, offset, len, 0.0, 1.0, 11);
        let got11 = e.download(unit);
        assert!(
            got11
                .iter()
                .zip(&want11)
                .all(|(a, b)| a.to_f32() == *b && a.to_f32() < 1.0),
            "f16 rand is exact"
        );
        philox_normal::<f32>(e, seed, offset, len);
        philox_normal::<f16>(e, seed, offset, len);
        philox_normal::<bf16>(e, seed, offset, len);
        d.add(&got);
    }
    d
}

fn reduce_t<T: TF>(e: &impl Exec, dg: &mut Digest) {
    let mut r = Rng::new(4);
    for (outer, len, inner) in [
        (3usize, 37usize, 1usize),
        (2, 5, 7),
        (1, 1, 1),
        (9, 70, 3),
        (1, 100, 1),
    ] {
        let n = outer * len * inner;
        let mut x: Vec<T> = r.vec(n, -3.0, 3.0);
        if n > 4 {
            // A tie for argmax and one for argmin: the first index must win.
            x[n - 1] = T::from_f64(5.0);
            x[n - 1 - inner] = T::from_f64(5.0);
            x[0] = T::from_f64(-5.0);
            x[inner] = T::from_f64(-5.0);
        }
        let px = e.upload(&x);
        let m = outer * inner;
        let (ys, ym, ya, yi) = (
            e.upload(&vec![T::default(); m]),
            e.upload(&vec![T::default(); m]),
            e.upload(&vec![0i64; m]),
            e.upload(&vec![0i64; m]),
        );
        e.go(&[
            reduce(ReduceOp::Sum, px, ys, outer, len, inner).unwrap(),
            reduce(ReduceOp::Max, px, ym, outer, len, inner).unwrap(),
            arg_extreme(px, ya, outer, len, inner, true).unwrap(),
            arg_extreme(px, yi, outer, len, inner, false).unwrap(),
        ]);
        let (mut ws, mut wm, mut wa) = (vec![0.0; m], vec![f64::NEG_INFINITY; m], vec![0i64; m]);
        let (mut wmin, mut wi) = (vec![f64::INFINITY; m], vec![0i64; m]);
        for o in 0..outer {
            for i in 0..inner {
                for l in 0..len {
                    let v = x[(o * len + l) * inner + i].to_f64();
                    ws[o * inner + i] += v;
                    if v > wm[o * inner + i] {
                        wm[o * inner + i] = v;
                        wa[o * inner + i] = l as i64;
                    }
                    if v < wmin[o * inner + i] {
                        wmin[o * inner + i] = v;
                        wi[o * inner + i] = l as i64;
                    }
                }
            }
        }
        let what = format!("reduce {outer}x{len}x{inner} {}", T::NAME);
        assert_close(
            &format!("sum {what}"),
            &to64(&e.download(ys)),
            &ws,
            2.0 * T::EPS,
            1e-5 * len as f64 + 2.0 * T::EPS,
        );
        assert_close(&format!("max {what}"), &to64(&e.download(ym)), &wm, 0.0, 0.0);
        assert_eq!(e.download(ya), wa, "argmax {what}");
        assert_eq!(e.download(yi), wi, "argmin {what}");
        dg.add(&e.download(ys));
        // Min and product: every op of the shared `ReduceOp` runs here.
        // Factors near 1, so a product of 100 stays in f16's range.
        let xp: Vec<T> = r.vec(n, 0.95, 1.05);
        let pp = e.upload(&xp);
        let (yn, yp) = (e.upload(&vec![T::default(); m]), e.upload(&vec![T::default(); m]));
        e.go(&[
            reduce(ReduceOp::Min, px, yn, outer, len, inner).unwrap(),
            reduce(ReduceOp::Prod, pp, yp, outer, len, inner).unwrap(),
        ]);
        let (mut wn, mut wp) = (vec![f64::INFINITY; m], vec![1.0; m]);
        for o in 0..outer {
            for i in 0..inner {
                for l in 0..len {
                    let v = x[(o * len + l) * inner + i].to_f64();
                    wn[o * inner + i] = wn[o * inner + i].min(v);
                    wp[o * inner + i] *= xp[(o * len + l) * inner + i].to_f64();
                }
            }
        }
        assert_close(&format!("min {what}"), &to64(&e.download(yn)), &wn, 0.0, 0.0);
        // An f32 running product of `len` factors, rounded once to T.
        let rel = 2.0 * len as f64 * 6e-8 + 2.0 * T::EPS;
        assert_close(&format!("prod {what}"), &to64(&e.download(yp)), &wp, rel, 1e-30);
    }
}

pub fn reductions(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    all_floats!(reduce_t, e, &mut d);
    d
}

fn softmax_t<T: TF>(e: &impl Exec, dg: &mut Digest) {
    let mut r = Rng::new(5);
    for (rows, cols) in [(5usize, 37usize), (9, 1), (3, 100)] {
        let x: Vec<T> = r.vec(rows * cols, -4.0, 4.0);
        let px = e.upload(&x);
        let (y, ly) = (
            e.upload(&vec![T::default(); rows * cols]),
            e.upload(&vec![T::default(); rows * cols]),
        );
        e.go(&[
            softmax(px, y, rows, cols, false).unwrap(),
            softmax(px, ly, rows, cols, true).unwrap(),
        ]);
        let mut want = vec![0.0; rows * cols];
        let mut lwant = vec![0.0; rows * cols];
        let mut lse = vec![0.0; rows];
        for rr in 0..rows {
            let row = &x[rr * cols..(rr + 1) * cols];
            let m = row.iter().map(|v| v.to_f64()).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v.to_f64() - m).exp()).sum();
            lse[rr] = m + s.ln();
            for c in 0..cols {
                lwant[rr * cols + c] = row[c].to_f64() - lse[rr];
                want[rr * cols + c] = lwant[rr * cols + c].exp();
            }
        }
        let tag = format!("{rows}x{cols} {}", T::NAME);
        assert_close(
            &format!("softmax {tag}"),
            &to64(&e.download(y)),
            &want,
            2.0 * T::EPS + 1e-6,
            1e-6,
        );
        assert_close(
            &format!("log_softmax {tag}"),
            &to64(&e.download(ly)),
            &lwant,
            2.0 * T::EPS + 1e-6,
            1e-5,
        );
        dg.add(&e.download(y));
        // Cross-entropy with an ignored row and an out-of-range target.
        let targets: Vec<i64> = (0..rows)
            .map(|i| {
                if i == 1 {
                    -100
                } else if i == 2 && rows > 3 {
                    cols as i64
                } else {
                    (i * 7 % cols) as i64
                }
            })
            .collect();
        let pt = e.upload(&targets);
        let (loss, lse_d) = (e.upload(&vec![0f32; rows]), e.upload(&vec![0f32; rows]));
        e.go(&[cross_entropy_fwd(px, pt, loss, lse_d, rows, cols, -100, 0.0).unwrap()]);
        let want_loss: Vec<f64> = (0..rows)
            .map(|i| match targets[i] {
                -100 => 0.0,
                t if t as usize >= cols => f64::NAN,
                t => lse[i] - x[i * cols + t as usize].to_f64(),
            })
            .collect();
        let got_loss: Vec<f64> = e.download(loss).iter().map(|&v| v as f64).collect();
        assert_close(&format!("ce_fwd {tag}"), &got_loss, &want_loss, 1e-5, 1e-5);
        let g: Vec<f32> = (0..rows).map(|i| 0.5 + i as f32).collect();
        let (pg, dx) = (e.upload(&g), e.upload(&vec![T::default(); rows * cols]));
        e.go(&[cross_entropy_bwd(px, pt, lse_d, pg, dx, rows, cols, -100, 0.0).unwrap()]);
        let want_dx: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let (rr, c) = (i / cols, i % cols);
                if targets[rr] == -100 {
                    0.0
                } else {
                    g[rr] as f64 * (want[i] - if c as i64 == targets[rr] { 1.0 } else { 0.0 })
                }
            })
            .collect();
        assert_close(
            &format!("ce_bwd {tag}"),
            &to64(&e.download(dx)),
            &want_dx,
            2.0 * T::EPS + 1e-5,
            1e-5 * rows as f64,
        );
    }
}

pub fn softmax_and_cross_entropy(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    all_floats!(softmax_t, e, &mut d);
    d
}

fn layernorm_t<T: TF>(e: &impl Exec, dg: &mut Digest) {
    let mut r = Rng::new(6);
    for (rows, cols, affine) in [
        (37usize, 45usize, true),
        (1, 1, false),
        (40, 200, true),
        (3, 33, false),
    ] {
        let n = rows * cols;
        let x: Vec<T> = r.vec(n, -2.0, 3.0);
        let gm: Vec<T> = r.vec(cols, 0.5, 1.5);
        let bt: Vec<T> = r.vec(cols, -0.5, 0.5);
        let dy: Vec<T> = r.vec(n, -1.0, 1.0);
        let (px, pg, pb, pdy) = (e.upload(&x), e.upload(&gm), e.upload(&bt), e.upload(&dy));
        let (y, mean, rstd) = (
            e.upload(&vec![T::default(); n]),
            e.upload(&vec![0f32; rows]),
            e.upload(&vec![0f32; rows]),
        );
        let (gopt, bopt) = if affine {
            (Some(pg), Some(pb))
        } else {
            (None, None)
        };
        let eps = 1e-5f32;
        e.go(&[layer_norm_fwd(px, gopt, bopt, y, mean, rstd, rows, cols, eps).unwrap()]);
        let (dx, dgam, dbet) = (
            e.upload(&vec![T::default(); n]),
            e.upload(&vec![T::default(); cols]),
            e.upload(&vec![T::default(); cols]),
        );
        let ws = e.upload(&vec![0f32; layer_norm_bwd_workspace(rows, cols)]);
        e.go(&layer_norm_bwd(px, gopt, pdy, mean, rstd, dx, dgam, dbet, ws, rows, cols).unwrap());
        let (mut wy, mut wdx, mut wdg, mut wdb) =
            (vec![0.0; n], vec![0.0; n], vec![0.0; cols], vec![0.0; cols]);
        let gv = |c: usize| if affine { gm[c].to_f64() } else { 1.0 };
        for rr in 0..rows {
            let row: Vec<f64> = (0..cols).map(|c| x[rr * cols + c].to_f64()).collect();
            let mu = row.iter().sum::<f64>() / cols as f64;
            let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / cols as f64;
            let rs = 1.0 / (var + eps as f64).sqrt();
            let xh: Vec<f64> = row.iter().map(|v| (v - mu) * rs).collect();
            let gdy: Vec<f64> = (0..cols).map(|c| dy[rr * cols + c].to_f64() * gv(c)).collect();
            let a = gdy.iter().zip(&xh).map(|(g, h)| g * h).sum::<f64>() / cols as f64;
            let b = gdy.iter().sum::<f64>() / cols as f64;
            for c in 0..cols {
                wy[rr * cols + c] = xh[c] * gv(c) + if affine { bt[c].to_f64() } else { 0.0 };
                wdx[rr * cols + c] = rs * (gdy[c] - b - xh[c] * a);
                wdg[c] += dy[rr * cols + c].to_f64() * xh[c];
                wdb[c] += dy[rr * cols + c].to_f64();
            }
        }
        let tag = format!("{rows}x{cols} {}", T::NAME);
        // Inputs rounded to T change xhat by about EPS relative to its scale.
        let tol = 8.0 * T::EPS + 1e-5;
        assert_close(&format!("ln y {tag}"), &to64(&e.download(y)), &wy, tol, tol);
        assert_close(
            &format!("ln dx {tag}"),
            &to64(&e.download(dx)),
            &wdx,
            tol,
            tol * 4.0,
        );
        assert_close(
            &format!("ln dgamma {tag}"),
            &to64(&e.download(dgam)),
            &wdg,
            tol,
            tol * rows as f64,
        );
        assert_close(
            &format!("ln dbeta {tag}"),
            &to64(&e.download(dbet)),
            &wdb,
            tol,
            tol * rows as f64,
        );
        dg.add(&e.download(dx));
        dg.add(&e.download(dgam));
    }
}

pub fn layer_norm(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    all_floats!(layernorm_t, e, &mut d);
    d
}

fn adamw_t<G: TF>(e: &impl Exec, dg: &mut Digest) {
    let mut r = Rng::new(7);
    let sizes = [1usize, 37, 5000];
    let cfg = AdamConfig {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
        decoupled: true,
        maximize: false,
        step: 1,
        grad_scale: 0.5,
    };
    let mut host: Vec<(Vec<f32>, Vec<G>)> = sizes
        .iter()
        .map(|&n| (r.vec::<f32>(n, -1.0, 1.0), r.vec::<G>(n, -2.0, 2.0)))
        .collect();
    let dev: Vec<AdamTensor<G>> = host
        .iter()
        .map(|(p, g)| AdamTensor {
            param: e.upload(p),
            grad: e.upload(g),
            exp_avg: e.upload(&vec![0f32; p.len()]),
            exp_avg_sq: e.upload(&vec![0f32; p.len()]),
        })
        .collect();
    let tables = adamw_tables(&dev).unwrap();
    let (tt, tc) = (e.upload(&tables.tensors), e.upload(&tables.chunks));
    let mut m: Vec<Vec<f64>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    let mut v = m.clone();
    let mut p: Vec<Vec<f64>> = host
        .iter()
        .map(|(p, _)| p.iter().map(|&x| x as f64).collect())
        .collect();
    for step in 1..=2u64 {
        let c = AdamConfig { step, ..cfg };
        e.go(&[adamw::<G>(tt, tc, tables.chunks.len() / 2, &c).unwrap()]);
        let (b1, b2) = (c.beta1, c.beta2);
        for t in 0..sizes.len() {
            for i in 0..sizes[t] {
                let g = host[t].1[i].to_f64() * c.grad_scale as f64;
                m[t][i] = b1 * m[t][i] + (1.0 - b1) * g;
                v[t][i] = b2 * v[t][i] + (1.0 - b2) * g * g;
                p[t][i] *= 1.0 - c.lr * c.weight_decay;
                let mh = m[t][i] / (1.0 - b1.powi(step as i32));
                let vh = v[t][i] / (1.0 - b2.powi(step as i32));
                p[t][i] -= c.lr * mh / (vh.sqrt() + c.eps);
            }
        }
    }
    for (t, d) in dev.iter().enumerate() {
        let got: Vec<f64> = e.download(d.param).iter().map(|&x| x as f64).collect();
        assert_close(&format!("adamw param {t} {}", G::NAME), &got, &p[t], 1e-5, 1e-6);
        let gm: Vec<f64> = e.download(d.exp_avg).iter().map(|&x| x as f64).collect();
        assert_close(&format!("adamw exp_avg {t}"), &gm, &m[t], 1e-5, 1e-7);
        dg.add64(&got);
    }
    host.clear();
}

pub fn adamw_multi_tensor(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    all_floats!(adamw_t, e, &mut d);
    d
}

fn embedding_t<T: TF>(e: &impl Exec, dg: &mut Digest) {
    let mut r = Rng::new(8);
    let (vocab, dim) = (11usize, 13usize);
    let idx: Vec<i64> = (0..29)
        .map(|i| {
            if i == 5 {
                11
            } else if i == 6 {
                -1
            } else {
                (i * 7 % 11) as i64
            }
        })
        .collect();
    let n = idx.len();
    let w: Vec<T> = r.vec(vocab * dim, -1.0, 1.0);
    let go: Vec<T> = r.vec(n * dim, -1.0, 1.0);
    let (pw, pi, pgo) = (e.upload(&w), e.upload(&idx), e.upload(&go));
    let (out, gw) = (
        e.upload(&vec![T::default(); n * dim]),
        e.upload(&vec![0f32; vocab * dim]),
    );
    e.go(&[
        embedding_fwd(pw, pi, out, n, vocab, dim).unwrap(),
        embedding_bwd(pgo, pi, gw, n, vocab, dim).unwrap(),
    ]);
    let mut want = vec![f64::NAN; n * dim];
    let mut wgw = vec![0.0; vocab * dim];
    for (i, &k) in idx.iter().enumerate() {
        if (0..vocab as i64).contains(&k) {
            for d in 0..dim {
                want[i * dim + d] = w[k as usize * dim + d].to_f64();
                wgw[k as usize * dim + d] += go[i * dim + d].to_f64();
            }
        }
    }
    assert_close(
        &format!("embedding fwd {}", T::NAME),
        &to64(&e.download(out)),
        &want,
        0.0,
        0.0,
    );
    let got: Vec<f64> = e.download(gw).iter().map(|&x| x as f64).collect();
    assert_close(&format!("embedding bwd {}", T::NAME), &got, &wgw, 1e-6, 1e-6);
    dg.add(&e.download(out));
}

pub fn embedding(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    all_floats!(embedding_t, e, &mut d);
    d
}

fn conv_t<T: TF>(e: &impl Exec, dg: &mut Digest) {
    let mut r = Rng::new(9);
    for g in [
        ConvGeom {
            batch: 2,
            channels: 3,
            input: [7, 6],
            kernel: [3, 2],
            padding: [1, 1],
            stride: [2, 1],
            dilation: [1, 2],
        },
        ConvGeom {
            batch: 1,
            channels: 1,
            input: [1, 1],
            kernel: [1, 1],
            padding: [0, 0],
            stride: [1, 1],
            dilation: [1, 1],
        },
    ] {
        let [oh, ow] = g.output().unwrap();
        let (il, cl) = (g.image_len().unwrap(), g.col_len().unwrap());
        let x: Vec<T> = r.vec(g.batch * il, -1.0, 1.0);
        let y: Vec<T> = r.vec(g.batch * cl, -1.0, 1.0);
        let (px, py) = (e.upload(&x), e.upload(&y));
        let (col, img) = (
            e.upload(&vec![T::default(); g.batch * cl]),
            e.upload(&vec![T::default(); g.batch * il]),
        );
        e.go(&[im2col(&g, px, col).unwrap(), col2im(&g, py, img).unwrap()]);
        let (mut want_col, mut want_img) = (vec![0.0; g.batch * cl], vec![0.0; g.batch * il]);
        let [h, w] = g.input;
        for b in 0..g.batch {
            for c in 0..g.channels {
                for ki in 0..g.kernel[0] {
                    for kj in 0..g.kernel[1] {
                        let row = (c * g.kernel[0] + ki) * g.kernel[1] + kj;
                        for oy in 0..oh {
                            for ox in 0..ow {
                                let yy =
                                    (oy * g.stride[0] + ki * g.dilation[0]) as isize - g.padding[0] as isize;
                                let xx =
                                    (ox * g.stride[1] + kj * g.dilation[1]) as isize - g.padding[1] as isize;
                                if yy < 0 || xx < 0 || yy >= h as isize || xx >= w as isize {
                                    continue;
                                }
                                let ci = b * cl + row * oh * ow + oy * ow + ox;
                                let xi = b * il + (c * h + yy as usize) * w + xx as usize;
                                want_col[ci] = x[xi].to_f64();
                                want_img[xi] += y[ci].to_f64();
                            }
                        }
                    }
                }
            }
        }
        assert_close(
            &format!("im2col {}", T::NAME),
            &to64(&e.download(col)),
            &want_col,
            0.0,
            0.0,
        );
        assert_close(
            &format!("col2im {}", T::NAME),
            &to64(&e.download(img)),
            &want_img,
            2.0 * T::EPS,
            2.0 * T::EPS,
        );
        dg.add(&e.download(img));
    }
}

pub fn im2col_col2im(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    all_floats!(conv_t, e, &mut d);
    d
}
