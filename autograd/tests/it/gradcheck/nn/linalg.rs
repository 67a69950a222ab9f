//! matmul (every torch.matmul case, broadcast batches) and linear.

use proptest::prelude::*;
use tessera_autograd::Var;

use super::{bcast_offset, indices, seen_var, view};
use crate::gradcheck::common::{check, close, fail, input_of, prop, Checked, Domain};

/// Batch shapes that broadcast together: suffixes of a common shape of rank
/// 0–2 (sizes 1–3) with some dims set to 1.
fn batch_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec(1usize..=3, 0..=2).prop_flat_map(|out| {
        let r = out.len();
        (
            Just(out),
            0..=r,
            0..=r,
            prop::collection::vec(any::<bool>(), r),
            prop::collection::vec(any::<bool>(), r),
        )
            .prop_map(move |(out, ra, rb, oa, ob)| {
                let pick = |rank: usize, ones: &[bool]| -> Vec<usize> {
                    (r - rank..r).map(|d| if ones[d] { 1 } else { out[d] }).collect()
                };
                (pick(ra, &oa), pick(rb, &ob))
            })
    })
}

/// Naive `torch.matmul` in f64.
fn naive_matmul(a: &[f64], sa: &[usize], b: &[f64], sb: &[usize]) -> Vec<f64> {
    let a2: Vec<usize> = if sa.len() == 1 {
        vec![1, sa[0]]
    } else {
        sa.to_vec()
    };
    let b2: Vec<usize> = if sb.len() == 1 {
        vec![sb[0], 1]
    } else {
        sb.to_vec()
    };
    let (m, k, n) = (a2[a2.len() - 2], a2[a2.len() - 1], b2[b2.len() - 1]);
    let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let rank = ba.len().max(bb.len());
    let batch: Vec<usize> = (0..rank)
        .map(|d| {
            let get = |s: &[usize]| {
                if d + s.len() >= rank {
                    s[d + s.len() - rank]
                } else {
                    1
                }
            };
            let (x, y) = (get(ba), get(bb));
            if x == 1 {
                y
            } else {
                x
            }
        })
        .collect();
    let mut out = Vec::new();
    for bi in indices(&batch) {
        let (oa, ob) = (bcast_offset(&bi, ba) * m * k, bcast_offset(&bi, bb) * k * n);
        for i in 0..m {
            for j in 0..n {
                out.push((0..k).map(|p| a[oa + i * k + p] * b[ob + p * n + j]).sum());
            }
        }
    }
    out
}

pub fn matmul_case(n: u32) -> Checked {
    let s = (0usize..=4, 0usize..=3, 1usize..=3, 0usize..=3, batch_pair()).prop_flat_map(
        |(kind, m, k, nn, (ba, bb))| {
            let (sa, sb) = match kind {
                0 => (vec![k], vec![k]),
                1 => (vec![m, k], vec![k]),
                2 => (vec![k], vec![k, nn]),
                3 => (vec![m, k], vec![k, nn]),
                _ => ([ba, vec![m, k]].concat(), [bb, vec![k, nn]].concat()),
            };
            (input_of(sa, Domain::Any), input_of(sb, Domain::Any))
        },
    );
    prop(n, s, |(a, b)| {
        let report = check(&[a.leaf(), b.leaf()], |xs| {
            view(&a, &xs[0])?.matmul(&view(&b, &xs[1])?)
        })?;
        let y = seen_var(&a)?.matmul(&seen_var(&b)?).map_err(fail)?;
        close(
            y.tensor(),
            &naive_matmul(&a.seen(), &a.shape, &b.seen(), &b.shape),
            1e-12,
        )?;
        Ok(report)
    })
}

pub fn linear_case(n: u32) -> Checked {
    let s = (
        prop::collection::vec(0usize..=2, 0..=2),
        1usize..=3,
        1usize..=3,
        any::<bool>(),
    )
        .prop_flat_map(|(lead, fin, fout, bias)| {
            (
                input_of([lead, vec![fin]].concat(), Domain::Any),
                input_of(vec![fout, fin], Domain::Any),
                input_of(vec![if bias { fout } else { 0 }], Domain::Any),
                Just(bias),
            )
        });
    prop(n, s, |(x, w, b, bias)| {
        let report = if bias {
            check(&[x.leaf(), w.leaf(), b.leaf()], |xs| {
                view(&x, &xs[0])?.linear(&view(&w, &xs[1])?, Some(&view(&b, &xs[2])?))
            })?
        } else {
            check(&[x.leaf(), w.leaf()], |xs| {
                view(&x, &xs[0])?.linear(&view(&w, &xs[1])?, None)
            })?
        };
        // Forward: x·wᵀ (+ b) against the naive matmul.
        let (fout, fin) = (w.shape[0], w.shape[1]);
        let wv = w.seen();
        let wt: Vec<f64> = (0..fin)
            .flat_map(|i| (0..fout).map(|o| wv[o * fin + i]).collect::<Vec<_>>())
            .collect();
        let mut want = naive_matmul(&x.seen(), &x.shape, &wt, &[fin, fout]);
        if bias {
            let bv = b.seen();
            want.iter_mut().enumerate().for_each(|(i, v)| *v += bv[i % fout]);
        }
        let b_var = bias.then(|| seen_var(&b)).transpose()?;
        let y = seen_var(&x)?
            .linear(&seen_var(&w)?, b_var.as_ref())
            .map_err(fail)?;
        close(y.tensor(), &want, 1e-12)?;
        Ok(report)
    })
}

/// A frozen operand costs nothing: only the leaf that requires a gradient
/// gets one, for both matmul operands and linear's weight.
#[test]
fn frozen_operands_get_no_gradient() {
    let t = |v: Vec<f64>, s: &[usize]| tessera_tensor::Tensor::from_vec(v, s).unwrap();
    let a = Var::leaf(t(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]));
    let b = Var::constant(t(vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]));
    let g = a
        .matmul(&b)
        .unwrap()
        .backward_with(&t(vec![1.0; 4], &[2, 2]))
        .unwrap();
    assert_eq!(g.len(), 1);
    // d/da of Σ (a·b) = rows of b summed: [1, 1, 2] per row.
    assert_eq!(
        g.get(&a).unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 1.0, 2.0, 1.0, 1.0, 2.0]
    );
    let x = Var::constant(t(vec![1.0, 2.0, 3.0], &[1, 3]));
    let w = Var::leaf(t(vec![1.0; 6], &[2, 3]));
    let g = x
        .linear(&w, None)
        .unwrap()
        .backward_with(&t(vec![1.0, 2.0], &[1, 2]))
        .unwrap();
    assert_eq!(
        g.get(&w).unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 2.0, 3.0, 2.0, 4.0, 6.0]
    );
    assert!(g.get(&x).is_none());
}

/// linear (bias fused into the GEMM epilogue, its own backward) agrees with
/// its composition `x·wᵀ + b` in output and in every gradient.
#[test]
fn fused_linear_matches_composed() {
    use tessera_tensor::{manual_seed, DType, Tensor};
    manual_seed(3);
    let x = Var::leaf(Tensor::randn(&[2, 3, 5], DType::F64).unwrap());
    let w = Var::leaf(Tensor::randn(&[4, 5], DType::F64).unwrap());
    let b = Var::leaf(Tensor::randn(&[4], DType::F64).unwrap());
    let g = Tensor::randn(&[2, 3, 4], DType::F64).unwrap();
    let fused = x.linear(&w, Some(&b)).unwrap();
    let composed = x.matmul(&w.t().unwrap()).unwrap().add(&b).unwrap();
    let (gf, gc) = (
        fused.backward_with(&g).unwrap(),
        composed.backward_with(&g).unwrap(),
    );
    let vals = |t: &Tensor| t.contiguous().unwrap().to_vec::<f64>().unwrap();
    let near = |a: Vec<f64>, b: Vec<f64>| {
        assert_eq!(a.len(), b.len());
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() <= 1e-12 * (1.0 + q.abs()), "{a:?} vs {b:?}");
        }
    };
    near(vals(fused.tensor()), vals(composed.tensor()));
    for v in [&x, &w, &b] {
        near(vals(gf.get(v).unwrap()), vals(gc.get(v).unwrap()));
    }
}
