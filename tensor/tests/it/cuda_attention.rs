//! Fused attention on the CUDA backend (the flash-style kernels of
//! `attention.cu`; the emulated device under `cuda-emu`) against the CPU
//! kernel: output, log-sum-exp and every gradient, for the calls the
//! kernels cover (no mask, causal on square scores, broadcast batch dims,
//! strided operands), and the calls they do not cover are reported as
//! such (the autograd op then composes attention from device ops).
#![cfg(feature = "cuda")]

use tessera_tensor::{DType, SdpaArgs, SdpaMask, Tensor};

use super::cuda_backend::{assert_close, gpu, randn, DEV};

fn dev(t: &Tensor) -> Tensor {
    t.to_device(DEV).unwrap()
}

#[test]
fn fused_attention_matches_the_cpu() {
    if !gpu() {
        return;
    }
    // (q batch, kv batch, L, S, D, causal, q stored heads-inner)
    let cases = [
        ([2, 3], [2, 3], 33, 33, 16, false, false),
        ([2, 3], [2, 3], 40, 40, 8, true, true),
        ([2, 2], [1, 2], 7, 70, 24, false, false),
        ([1, 1], [1, 1], 65, 31, 64, false, true),
    ];
    for (n, (qb, kb, l, s, d, causal, heads_inner)) in cases.into_iter().enumerate() {
        let seed = 10 * n as u64;
        let q = if heads_inner {
            randn(&[qb[0], l, qb[1], d], DType::F32, seed)
                .transpose(1, 2)
                .unwrap()
        } else {
            randn(&[qb[0], qb[1], l, d], DType::F32, seed)
        };
        let k = randn(&[kb[0], kb[1], s, d], DType::F32, seed + 1);
        let v = randn(&[kb[0], kb[1], s, d], DType::F32, seed + 2);
        let d_o = randn(&[qb[0], qb[1], l, d], DType::F32, seed + 3);
        let args = SdpaArgs {
            is_causal: causal,
            scale: Some(0.2),
            ..SdpaArgs::default()
        };
        let (qd, kd, vd) = (dev(&q), dev(&k), dev(&v));
        assert!(
            Tensor::sdpa_fused_available(&qd, &kd, &vd, &args).unwrap(),
            "case {n}"
        );
        let cpu = Tensor::sdpa(&q, &k, &v, &args).unwrap();
        let gpu_out = Tensor::sdpa(&qd, &kd, &vd, &args).unwrap();
        assert_close(&format!("case {n} out"), &cpu.out, &gpu_out.out, 1e-5, 1.0);
        assert_close(&format!("case {n} lse"), &cpu.lse, &gpu_out.lse, 1e-5, 1.0);
        let gc = Tensor::sdpa_backward(&d_o, &q, &k, &v, &cpu, &args, false).unwrap();
        let gg = Tensor::sdpa_backward(&dev(&d_o), &qd, &kd, &vd, &gpu_out, &args, false).unwrap();
        for (what, c, g) in [
            ("dq", &gc.dq, &gg.dq),
            ("dk", &gc.dk, &gg.dk),
            ("dv", &gc.dv, &gg.dv),
        ] {
            assert_close(&format!("case {n} {what}"), c, g, 1e-4, 1.0);
        }
    }
}

#[test]
fn calls_the_kernels_lack_are_not_fused_on_the_gpu() {
    if !gpu() {
        return;
    }
    let q = dev(&randn(&[1, 2, 6, 8], DType::F32, 1));
    let v4 = dev(&randn(&[1, 2, 6, 4], DType::F32, 2));
    let k5 = dev(&randn(&[1, 2, 5, 8], DType::F32, 3));
    let keep = dev(&Tensor::from_vec(vec![true; 36], &[6, 6]).unwrap());
    let none = SdpaArgs::default();
    let causal = SdpaArgs {
        is_causal: true,
        ..none
    };
    let masked = SdpaArgs {
        mask: Some(SdpaMask::Keep(&keep)),
        ..none
    };
    assert!(!Tensor::sdpa_fused_available(&q, &q, &v4, &none).unwrap());
    assert!(!Tensor::sdpa_fused_available(&q, &k5, &k5, &causal).unwrap());
    assert!(!Tensor::sdpa_fused_available(&q, &q, &q, &masked).unwrap());
    let e = Tensor::sdpa(&q, &q, &q, &masked).unwrap_err().to_string();
    assert!(e.contains("scaled_dot_product_attention"), "{e}");
}
