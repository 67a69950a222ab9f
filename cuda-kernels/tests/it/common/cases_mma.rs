//! Test bodies of the tensor-core GEMM and of flash attention.

use half::{bf16, f16};
use tessera_cuda_kernels::ops::attention::{attention_bwd, attention_fwd, AttnGrads, AttnMask, AttnShape};
use tessera_cuda_kernels::ops::gemm::{gemm, GemmShape};
use tessera_cuda_kernels::ops::Half;

use super::{assert_close, to64, Digest, Exec, Rng, TF};

fn gemm_t<T: TF + Half>(e: &impl Exec, dg: &mut Digest) {
    let mut r = Rng::new(10);
    // (m, n, k, batch, broadcast B): edge tiles everywhere, k not a multiple
    // of 8 or 32, length 1, and a multi-tile m with aligned leading dims.
    for (m, n, k, batch, bcast) in [
        (37usize, 45usize, 70usize, 1usize, false),
        (1, 1, 1, 1, false),
        (136, 24, 168, 2, true),
        (20, 33, 16, 3, false),
    ] {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let (ar, ac) = if ta { (k, m) } else { (m, k) };
            let (br, bc) = if tb { (n, k) } else { (k, n) };
            let a: Vec<T> = r.vec(batch * ar * ac, -1.0, 1.0);
            let bn = if bcast { 1 } else { batch };
            let b: Vec<T> = r.vec(bn * br * bc, -1.0, 1.0);
            let g = GemmShape {
                m,
                n,
                k,
                batch,
                trans_a: ta,
                trans_b: tb,
                lda: ac,
                ldb: bc,
                ldc: n,
                stride_a: ar * ac,
                stride_b: if bcast { 0 } else { br * bc },
                stride_c: m * n,
            };
            let (pa, pb, pc) = (
                e.upload(&a),
                e.upload(&b),
                e.upload(&vec![T::default(); batch * m * n]),
            );
            e.go(&[gemm(&g, pa, pb, pc).unwrap()]);
            let mut want = vec![0.0; batch * m * n];
            for bi in 0..batch {
                let ab = &a[bi * ar * ac..];
                let bb = &b[if bcast { 0 } else { bi * br * bc }..];
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0.0;
                        for kk in 0..k {
                            let av = if ta { ab[kk * ac + i] } else { ab[i * ac + kk] };
                            let bv = if tb { bb[j * bc + kk] } else { bb[kk * bc + j] };
                            s += av.to_f64() * bv.to_f64();
                        }
                        want[(bi * m + i) * n + j] = s;
                    }
                }
            }
            let got = e.download(pc);
            let tag = format!("gemm {m}x{n}x{k} b{batch} ta={ta} tb={tb} {}", T::NAME);
            assert_close(&tag, &to64(&got), &want, 2.0 * T::EPS, 1e-5 * (k as f64).sqrt());
            dg.add(&got);
        }
    }
    // Too-short buffers and a leading dimension below the row are errors.
    let p = e.upload(&[T::default(); 10]);
    assert!(gemm(&GemmShape::new(4, 4, 4), p, p, p).is_err());
    assert!(gemm(
        &GemmShape {
            lda: 2,
            ..GemmShape::new(2, 2, 3)
        },
        p,
        p,
        p
    )
    .is_err());
}

pub fn gemm_tensor_cores(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    gemm_t::<f16>(e, &mut d);
    gemm_t::<bf16>(e, &mut d);
    d
}

struct AttnRef {
    o: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

#[allow(clippy::too_many_arguments)]
fn attn_ref(
    s: &AttnShape,
    scale: f64,
    causal: bool,
    kv_len: Option<&[i32]>,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
) -> AttnRef {
    let (lq, lk, d) = (s.lq, s.lk, s.head_dim);
    let bh = s.batch * s.heads;
    let mut r = AttnRef {
        o: vec![0.0; bh * lq * d],
        lse: vec![f64::NEG_INFINITY; bh * lq],
        dq: vec![0.0; bh * lq * d],
        dk: vec![0.0; bh * lk * d],
        dv: vec![0.0; bh * lk * d],
    };
    for h in 0..bh {
        let kv = kv_len.map_or(lk, |l| (l[h / s.heads].max(0) as usize).min(lk));
        let (qh, kh, vh, doh) = (
            &q[h * lq * d..],
            &k[h * lk * d..],
            &v[h * lk * d..],
            &d_o[h * lq * d..],
        );
        for i in 0..lq {
            let visible =
                |j: usize| j < kv && (!causal || j as isize <= i as isize + lk as isize - lq as isize);
            let sc: Vec<f64> = (0..lk)
                .map(|j| {
                    if visible(j) {
                        scale * (0..d).map(|x| qh[i * d + x] * kh[j * d + x]).sum::<f64>()
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                continue;
            }
            let sum: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            let p: Vec<f64> = sc.iter().map(|x| (x - m).exp() / sum).collect();
            r.lse[h * lq + i] = m + sum.ln();
            let row = (h * lq + i) * d;
            for x in 0..d {
                r.o[row + x] = (0..lk).map(|j| p[j] * vh[j * d + x]).sum();
            }
            let di: f64 = (0..d).map(|x| doh[i * d + x] * r.o[row + x]).sum();
            for j in 0..lk {
                let dp: f64 = (0..d).map(|x| doh[i * d + x] * vh[j * d + x]).sum();
                let ds = p[j] * (dp - di);
                for x in 0..d {
                    r.dq[row + x] += scale * ds * kh[j * d + x];
                    r.dk[(h * lk + j) * d + x] += scale * ds * qh[i * d + x];
                    r.dv[(h * lk + j) * d + x] += p[j] * doh[i * d + x];
                }
            }
        }
    }
    r
}

fn attention_t<T: TF>(e: &impl Exec, dg: &mut Digest, s: AttnShape, causal: bool, kv_len: Option<Vec<i32>>) {
    let mut r = Rng::new(11 + s.head_dim as u64);
    let bh = s.batch * s.heads;
    let (nq, nk) = (bh * s.lq * s.head_dim, bh * s.lk * s.head_dim);
    let (q, k, v, d_o): (Vec<T>, Vec<T>, Vec<T>, Vec<T>) = (
        r.vec(nq, -1.0, 1.0),
        r.vec(nk, -1.0, 1.0),
        r.vec(nk, -1.0, 1.0),
        r.vec(nq, -1.0, 1.0),
    );
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    let mask = AttnMask {
        scale,
        causal,
        kv_len: kv_len.as_ref().map(|l| e.upload(l)),
    };
    let (pq, pk, pv, pdo) = (e.upload(&q), e.upload(&k), e.upload(&v), e.upload(&d_o));
    let (o, lse) = (
        e.upload(&vec![T::default(); nq]),
        e.upload(&vec![0f32; bh * s.lq]),
    );
    e.go(&[attention_fwd(&s, &mask, pq, pk, pv, o, lse).unwrap()]);
    let grads = AttnGrads {
        d_o: pdo,
        d_q: e.upload(&vec![T::default(); nq]),
        d_k: e.upload(&vec![T::default(); nk]),
        d_v: e.upload(&vec![T::default(); nk]),
        workspace: e.upload(&vec![0f32; bh * s.lq]),
    };
    e.go(&attention_bwd(&s, &mask, pq, pk, pv, o, lse, &grads).unwrap());
    let want = attn_ref(
        &s,
        scale as f64,
        causal,
        kv_len.as_deref(),
        &to64(&q),
        &to64(&k),
        &to64(&v),
        &to64(&d_o),
    );
    let tag = format!("attention {s:?} causal={causal} kv_len={kv_len:?} {}", T::NAME);
    // The backward starts from the rounded O, so half types get more slack.
    let tol = 8.0 * T::EPS + 2e-5;
    assert_close(&format!("O {tag}"), &to64(&e.download(o)), &want.o, tol, tol);
    let lse_got: Vec<f64> = e.download(lse).iter().map(|&x| x as f64).collect();
    assert_close(&format!("lse {tag}"), &lse_got, &want.lse, 1e-5, 1e-5);
    assert_close(
        &format!("dQ {tag}"),
        &to64(&e.download(grads.d_q)),
        &want.dq,
        4.0 * tol,
        4.0 * tol,
    );
    assert_close(
        &format!("dK {tag}"),
        &to64(&e.download(grads.d_k)),
        &want.dk,
        4.0 * tol,
        4.0 * tol,
    );
    assert_close(
        &format!("dV {tag}"),
        &to64(&e.download(grads.d_v)),
        &want.dv,
        4.0 * tol,
        4.0 * tol,
    );
    dg.add(&e.download(o));
    dg.add(&e.download(grads.d_q));
    dg.add(&e.download(grads.d_k));
}

pub fn attention_small_head(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    let s = AttnShape {
        batch: 2,
        heads: 2,
        lq: 37,
        lk: 45,
        head_dim: 40,
    };
    attention_t::<f32>(e, &mut d, s, true, Some(vec![45, 20]));
    attention_t::<bf16>(e, &mut d, s, false, Some(vec![0, 33]));
    attention_t::<f16>(
        e,
        &mut d,
        AttnShape {
            head_dim: 64,
            lq: 1,
            ..s
        },
        true,
        None,
    );
    d
}

pub fn attention_large_head(e: &impl Exec) -> Digest {
    let mut d = Digest::default();
    let s = AttnShape {
        batch: 1,
        heads: 2,
        lq: 33,
        lk: 33,
        head_dim: 72,
    };
    attention_t::<f32>(e, &mut d, s, true, None);
    attention_t::<f16>(
        e,
        &mut d,
        AttnShape {
            head_dim: 128,
            lq: 17,
            ..s
        },
        false,
        Some(vec![30]),
    );
    d
}
