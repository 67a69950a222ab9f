//! GEMM and matmul against a naive f64 product, over random shapes, strided
//! layouts, every micro-kernel, dtypes, epilogues and thread counts.

use proptest::prelude::*;

use super::gemm::{gemm, Bias, Epilogue, GemmShape, MatMut};
use super::kernel::Isa;
use super::pack::MatRef;
use super::Activation;
use crate::test_util::{layouts_of, rand_f64, tensor_of, values_f64};
use crate::{bf16, f16, DType, Element, Tensor};

/// Naive `[batch.., m, k] @ [batch.., k, n]` on row-major f64 values with
/// equal (already broadcast) batch counts.
fn naive(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; batch * m * n];
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                out[(t * m + i) * n + j] = (0..k)
                    .map(|p| a[(t * m + i) * k + p] * b[(t * k + p) * n + j])
                    .sum();
            }
        }
    }
    out
}

/// Absolute tolerance for a length-`k` dot product of values in [-1, 1],
/// computed in `dtype` (f16/bf16 add the final rounding, relative to |want|).
fn close(got: &[f64], want: &[f64], k: usize, dtype: DType) -> Result<(), String> {
    let (abs, rel) = match dtype {
        DType::F64 => (1e-13 * k as f64 + 1e-15, 0.0),
        DType::F32 => (2e-6 * k as f64 + 1e-6, 0.0),
        DType::F16 => (2e-6 * k as f64 + 1e-3, 1e-3),
        _ => (2e-6 * k as f64 + 1e-2, 8e-3),
    };
    if got.len() != want.len() {
        return Err(format!("length {} vs {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if (g - w).abs() > abs + rel * w.abs() || g.is_nan() != w.is_nan() {
            return Err(format!("element {i}: got {g}, want {w} (k = {k}, {dtype})"));
        }
    }
    Ok(())
}

fn pick<T: Element>(values: &[f64], shape: &[usize], sel: usize) -> Tensor {
    let all = layouts_of::<T>(values, shape);
    all[sel % all.len()].clone()
}

fn check_matmul(
    dtype: DType,
    m: usize,
    k: usize,
    n: usize,
    sa: usize,
    sb: usize,
    seed: u64,
) -> Result<(), String> {
    let av = rand_f64(seed, m * k);
    let bv = rand_f64(seed + 1, k * n);
    let (a, b) = crate::with_dtype!(dtype, T => (pick::<T>(&av, &[m, k], sa), pick::<T>(&bv, &[k, n], sb)));
    // The reference sees the operands as rounded to `dtype`.
    let want = naive(&values_f64(&a), &values_f64(&b), 1, m, k, n);
    let c = a.matmul(&b).map_err(|e| e.to_string())?;
    if c.shape() != [m, n] || c.dtype() != dtype {
        return Err(format!("shape {:?} dtype {}", c.shape(), c.dtype()));
    }
    close(&values_f64(&c), &want, k, dtype)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn matmul_f32_matches_naive(m in 1usize..300, k in 1usize..300, n in 1usize..300,
                                sa in 0usize..5, sb in 0usize..5, seed in 0u64..1000) {
        check_matmul(DType::F32, m, k, n, sa, sb, seed).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn matmul_f64_matches_naive(m in 1usize..200, k in 1usize..300, n in 1usize..200,
                                sa in 0usize..5, sb in 0usize..5, seed in 0u64..1000) {
        check_matmul(DType::F64, m, k, n, sa, sb, seed).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn matmul_half_types_match_naive(m in 1usize..120, k in 1usize..300, n in 1usize..120,
                                     sa in 0usize..5, sb in 0usize..5, seed in 0u64..1000, bf in any::<bool>()) {
        let dtype = if bf { DType::BF16 } else { DType::F16 };
        check_matmul(dtype, m, k, n, sa, sb, seed).map_err(TestCaseError::fail)?;
    }

    /// Every micro-kernel this CPU runs, through the driver directly, with
    /// alpha, beta and an epilogue, into a strided output.
    #[test]
    fn every_kernel_matches_naive(m in 1usize..300, k in 0usize..300, n in 1usize..300,
                                  sa in 0usize..5, sb in 0usize..5, seed in 0u64..1000,
                                  beta in prop::sample::select(vec![0.0, 1.0, -0.5]),
                                  row_bias in any::<bool>(), relu in any::<bool>()) {
        let av = rand_f64(seed, m * k);
        let bv = rand_f64(seed + 1, k * n);
        let cv = rand_f64(seed + 2, m * n);
        let biasv = rand_f64(seed + 3, m.max(n));
        let a = pick::<f32>(&av, &[m, k], sa);
        let b = pick::<f32>(&bv, &[k, n], sb);
        let (a64, b64) = (values_f64(&a), values_f64(&b));
        let prod = naive(&a64, &b64, 1, m, k, n);
        let alpha = 0.75;
        let want: Vec<f64> = (0..m * n).map(|e| {
            let (i, j) = (e / n, e % n);
            let mut v = alpha * prod[e] + if beta == 0.0 { 0.0 } else { beta * cv[e] };
            v += if row_bias { biasv[i] } else { biasv[j] };
            if relu { v.max(0.0) } else { v }
        }).collect();
        let bias32: Vec<f32> = biasv.iter().map(|&x| x as f32).collect();
        for isa in Isa::available() {
            // C stored column-major inside a larger buffer at an offset.
            let mut c = vec![f32::NAN; m * n + 5];
            for (e, &x) in cv.iter().enumerate() {
                let (i, j) = (e / n, e % n);
                c[5 + j * m + i] = if beta == 0.0 { f32::NAN } else { x as f32 };
            }
            let epi = Epilogue {
                bias: if row_bias { Bias::Row(&bias32[..m]) } else { Bias::Col(&bias32[..n]) },
                relu,
            };
            let shape = GemmShape { m, n, k, alpha: alpha as f32, beta: beta as f32 };
            gemm::<f32>(shape, mat(&a), mat(&b), MatMut { data: &mut c, off: 5, rs: 1, cs: m as isize }, epi, isa, true);
            let got: Vec<f64> = (0..m * n).map(|e| c[5 + (e % n) * m + e / n] as f64).collect();
            close(&got, &want, k, DType::F32).map_err(|e| TestCaseError::fail(format!("{isa:?}: {e}")))?;
        }
    }

    /// f16 operands on every micro-kernel this CPU runs (widened to f32
    /// while packing, contiguous runs by the SIMD conversion), against the
    /// f64 product of the f16 values: f32 accumulation, no f16 rounding.
    #[test]
    fn every_kernel_runs_f16_operands(m in 1usize..150, k in 1usize..300, n in 1usize..150,
                                      sa in 0usize..5, sb in 0usize..5, seed in 0u64..1000) {
        let a = pick::<f16>(&rand_f64(seed, m * k), &[m, k], sa);
        let b = pick::<f16>(&rand_f64(seed + 1, k * n), &[k, n], sb);
        let want = naive(&values_f64(&a), &values_f64(&b), 1, m, k, n);
        fn ref_of(t: &Tensor) -> MatRef<'_, f16> {
            super::mat_ref(t, t.layout())
        }
        for isa in Isa::available() {
            let mut c = vec![f32::NAN; m * n];
            let shape = GemmShape { m, n, k, alpha: 1.0, beta: 0.0 };
            gemm::<f16>(shape, ref_of(&a), ref_of(&b), MatMut { data: &mut c, off: 0, rs: n as isize, cs: 1 }, Epilogue::none(), isa, true);
            let got: Vec<f64> = c.iter().map(|&x| x as f64).collect();
            close(&got, &want, k, DType::F32).map_err(|e| TestCaseError::fail(format!("{isa:?}: {e}")))?;
        }
    }

    /// Every micro-kernel into a row-major output with a padded row stride,
    /// where whole tiles take the kernel's in-place path: against the naive
    /// product, and bitwise against the same product into a column-major
    /// output (the generic tile store), which must round identically.
    #[test]
    fn in_place_tiles_match_generic_store(m in 1usize..200, k in 1usize..300, n in 1usize..200,
                                          pad in 0usize..3, sa in 0usize..5, sb in 0usize..5,
                                          seed in 0u64..1000,
                                          beta in prop::sample::select(vec![0.0, 1.0, -0.5]),
                                          bias in 0usize..3, relu in any::<bool>()) {
        let av = rand_f64(seed, m * k);
        let bv = rand_f64(seed + 1, k * n);
        let cv = rand_f64(seed + 2, m * n);
        let biasv: Vec<f32> = rand_f64(seed + 3, m.max(n)).iter().map(|&x| x as f32).collect();
        let a = pick::<f32>(&av, &[m, k], sa);
        let b = pick::<f32>(&bv, &[k, n], sb);
        let prod = naive(&values_f64(&a), &values_f64(&b), 1, m, k, n);
        let want: Vec<f64> = (0..m * n).map(|e| {
            let (i, j) = (e / n, e % n);
            let mut v = prod[e] + if beta == 0.0 { 0.0 } else { beta * cv[e] };
            v += match bias { 1 => biasv[i] as f64, 2 => biasv[j] as f64, _ => 0.0 };
            if relu { v.max(0.0) } else { v }
        }).collect();
        let epi = Epilogue {
            bias: match bias { 1 => Bias::Row(&biasv[..m]), 2 => Bias::Col(&biasv[..n]), _ => Bias::None },
            relu,
        };
        let shape = GemmShape { m, n, k, alpha: 1.0f32, beta: beta as f32 };
        let ld = n + pad;
        for isa in Isa::available() {
            let mut rows = vec![f32::NAN; m * ld];
            let mut cols = vec![f32::NAN; m * n];
            for (e, &x) in cv.iter().enumerate() {
                let (i, j) = (e / n, e % n);
                let x = if beta == 0.0 { f32::NAN } else { x as f32 };
                rows[i * ld + j] = x;
                cols[j * m + i] = x;
            }
            gemm::<f32>(shape, mat(&a), mat(&b), MatMut { data: &mut rows, off: 0, rs: ld as isize, cs: 1 }, epi, isa, true);
            gemm::<f32>(shape, mat(&a), mat(&b), MatMut { data: &mut cols, off: 0, rs: 1, cs: m as isize }, epi, isa, true);
            let got: Vec<f64> = (0..m * n).map(|e| rows[(e / n) * ld + e % n] as f64).collect();
            close(&got, &want, k, DType::F32).map_err(|e| TestCaseError::fail(format!("{isa:?}: {e}")))?;
            for e in 0..m * n {
                let (i, j) = (e / n, e % n);
                prop_assert_eq!(rows[i * ld + j].to_bits(), cols[j * m + i].to_bits(), "{:?} at ({}, {})", isa, i, j);
            }
            // The padding between rows is never written.
            for i in 0..m {
                prop_assert!(rows[i * ld + n..(i + 1) * ld].iter().all(|v| v.is_nan()));
            }
        }
    }

    /// Batch dimensions broadcast, operands of 1 to 4 dimensions.
    #[test]
    fn batched_matmul_broadcasts(ba in prop::collection::vec(1usize..4, 0..3),
                                 bb in prop::collection::vec(1usize..4, 0..3),
                                 m in 1usize..20, k in 1usize..40, n in 1usize..20,
                                 sa in 0usize..5, sb in 0usize..5, seed in 0u64..1000) {
        // Make the batch shapes broadcastable: where both have a dim, one of them is 1 or equal.
        let mut bb = bb;
        for d in 1..=ba.len().min(bb.len()) {
            let (x, y) = (ba[ba.len() - d], bb.len() - d);
            if bb[y] != x && bb[y] != 1 && x != 1 {
                bb[y] = 1;
            }
        }
        let sha: Vec<usize> = ba.iter().copied().chain([m, k]).collect();
        let shb: Vec<usize> = bb.iter().copied().chain([k, n]).collect();
        let av = rand_f64(seed, sha.iter().product());
        let bv = rand_f64(seed + 1, shb.iter().product());
        let a = pick::<f64>(&av, &sha, sa);
        let b = pick::<f64>(&bv, &shb, sb);
        let c = a.matmul(&b).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let batch = crate::broadcast_shapes("t", &ba, &bb).unwrap();
        let mut full_a = batch.clone();
        full_a.extend([m, k]);
        let mut full_b = batch.clone();
        full_b.extend([k, n]);
        let ae = values_f64(&a.broadcast_to(&full_a).unwrap());
        let be = values_f64(&b.broadcast_to(&full_b).unwrap());
        let want = naive(&ae, &be, batch.iter().product(), m, k, n);
        let mut shape = batch;
        shape.extend([m, n]);
        prop_assert_eq!(c.shape(), &shape[..]);
        close(&values_f64(&c), &want, k, DType::F64).map_err(TestCaseError::fail)?;
    }
}

fn mat(t: &Tensor) -> MatRef<'_, f32> {
    super::mat_ref(t, t.layout())
}

#[test]
fn vector_cases_follow_torch() {
    let v = tensor_of::<f32>(&[1.0, 2.0, 3.0], &[3]);
    let m = tensor_of::<f32>(&[1.0, 0.0, 2.0, 1.0, 0.0, 3.0], &[3, 2]);
    let dot = v.matmul(&v).unwrap();
    assert_eq!(dot.shape(), &[] as &[usize]);
    assert_eq!(dot.to_scalar::<f32>().unwrap(), 14.0);
    let vm = v.matmul(&m).unwrap();
    assert_eq!(vm.shape(), &[2]);
    assert_eq!(vm.to_vec::<f32>().unwrap(), vec![5.0, 11.0]);
    let mv = m.t().unwrap().matmul(&v).unwrap();
    assert_eq!(mv.to_vec::<f32>().unwrap(), vec![5.0, 11.0]);
    // Batched with a 1-D operand on either side.
    let b = tensor_of::<f32>(&rand_f64(3, 4 * 3 * 2), &[4, 3, 2]);
    assert_eq!(v.matmul(&b).unwrap().shape(), &[4, 2]);
    assert_eq!(b.transpose(1, 2).unwrap().matmul(&v).unwrap().shape(), &[4, 2]);
    // The example from the docs.
    let x = tensor_of::<f32>(&rand_f64(4, 24), &[2, 1, 3, 4]);
    let y = tensor_of::<f32>(&rand_f64(5, 120), &[5, 4, 6]);
    assert_eq!(x.matmul(&y).unwrap().shape(), &[2, 5, 3, 6]);
}

#[test]
fn zero_sizes() {
    let a = tensor_of::<f32>(&[], &[0, 3]);
    let b = tensor_of::<f32>(&rand_f64(1, 6), &[3, 2]);
    assert_eq!(a.matmul(&b).unwrap().shape(), &[0, 2]);
    let a = tensor_of::<f32>(&[], &[2, 0]);
    let b = tensor_of::<f32>(&[], &[0, 3]);
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    let e = tensor_of::<f64>(&[], &[0, 2, 2]);
    assert_eq!(e.matmul(&e).unwrap().shape(), &[0, 2, 2]);
}

#[test]
fn errors_name_op_and_shapes() {
    let a = tensor_of::<f32>(&rand_f64(1, 6), &[2, 3]);
    let e = a.matmul(&a).unwrap_err();
    assert_eq!(e.op(), "matmul");
    assert!(e.to_string().contains("[2, 3]"), "{e}");
    let s = Tensor::scalar(1.0f32);
    assert!(s.matmul(&a).is_err());
    assert!(a.matmul(&a.to_dtype(DType::F64).unwrap().t().unwrap()).is_err());
    let i = a.to_dtype(DType::I64).unwrap();
    assert!(i.matmul(&i.t().unwrap()).is_err());
    let x = tensor_of::<f32>(&rand_f64(1, 24), &[2, 3, 4]);
    let y = tensor_of::<f32>(&rand_f64(1, 60), &[3, 4, 5]);
    assert!(x.matmul(&y).is_err());
    let w = tensor_of::<f32>(&rand_f64(1, 12), &[4, 3]);
    assert!(a.linear(&w.t().unwrap(), None).is_err());
    assert!(a.linear(&w, Some(&tensor_of::<f32>(&[0.0; 3], &[3]))).is_err());
    assert_eq!(a.linear(&w, None).unwrap().shape(), &[2, 4]);
    // An empty feature dimension gives the bias alone (as PyTorch does).
    let x0 = tensor_of::<f32>(&[], &[2, 0]);
    let w0 = tensor_of::<f32>(&[], &[3, 0]);
    let b0 = tensor_of::<f32>(&[1.0, 2.0, 3.0], &[3]);
    assert_eq!(
        x0.linear(&w0, Some(&b0)).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    );
    assert!(a.addmm(&a, &w.t().unwrap(), 1.0, 1.0).is_err());
}

/// linear and linear_act against matmul, then bias and ReLU composed.
#[test]
fn linear_epilogue_matches_composition() {
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let x = crate::with_dtype!(dtype, T => pick::<T>(&rand_f64(7, 3 * 5 * 40), &[3, 5, 40], 3));
        let w = crate::with_dtype!(dtype, T => pick::<T>(&rand_f64(8, 70 * 40), &[70, 40], 4));
        let b = crate::with_dtype!(dtype, T => tensor_of::<T>(&rand_f64(9, 70), &[70]));
        let plain = values_f64(&x.matmul(&w.t().unwrap()).unwrap());
        let bias = values_f64(&b);
        let y = x.linear_act(&w, Some(&b), Activation::Relu).unwrap();
        assert_eq!(y.shape(), &[3, 5, 70]);
        let want: Vec<f64> = plain
            .iter()
            .enumerate()
            .map(|(e, &v)| (v + bias[e % 70]).max(0.0))
            .collect();
        close(&values_f64(&y), &want, 40, dtype).unwrap();
        // Unfused matmul rounds to bf16 before the bias: compare f32/f64 bitwise only.
        if dtype != DType::BF16 {
            let y0 = x.linear(&w, None).unwrap();
            assert_eq!(values_f64(&y0), plain);
        }
    }
}

#[test]
fn addmm_matches_naive() {
    let a = tensor_of::<f64>(&rand_f64(1, 30 * 20), &[30, 20]);
    let b = tensor_of::<f64>(&rand_f64(2, 20 * 10), &[20, 10]);
    let c = tensor_of::<f64>(&rand_f64(3, 10), &[10]);
    let got = c.addmm(&a, &b, 0.5, -2.0).unwrap();
    let prod = naive(&values_f64(&a), &values_f64(&b), 1, 30, 20, 10);
    let cv = values_f64(&c);
    let want: Vec<f64> = prod
        .iter()
        .enumerate()
        .map(|(e, &p)| 0.5 * cv[e % 10] - 2.0 * p)
        .collect();
    close(&values_f64(&got), &want, 20, DType::F64).unwrap();
    // beta = 0 ignores NaNs in the input.
    let nan = tensor_of::<f64>(&[f64::NAN], &[1]);
    assert!(values_f64(&nan.addmm(&a, &b, 0.0, 1.0).unwrap())
        .iter()
        .all(|v| v.is_finite()));
}

/// The same product on a 1-thread pool and on the default pool is bitwise equal.
#[test]
fn results_do_not_depend_on_thread_count() {
    let a = tensor_of::<f32>(&rand_f64(11, 300 * 513), &[300, 513]);
    let b = pick::<f32>(&rand_f64(12, 513 * 257), &[513, 257], 3);
    let x = tensor_of::<f32>(&rand_f64(13, 6 * 9 * 40), &[6, 9, 40]);
    let run = || {
        (
            a.matmul(&b).unwrap(),
            x.matmul(&x.transpose(1, 2).unwrap()).unwrap(),
        )
    };
    let (c_many, d_many) = run();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let (c_one, d_one) = pool.install(run);
    let bits = |t: &Tensor| {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&c_many), bits(&c_one));
    assert_eq!(bits(&d_many), bits(&d_one));
}

/// Products whose tasks share packed blocks of A and B (each packed by
/// whichever task needs it first): small squares, skinny and wide shapes,
/// several depth and column blocks, transposed operands; on pools of 1, 2
/// and 5 threads (more threads than cores, so tasks race for blocks),
/// bitwise equal to each other and close to the naive product.
#[test]
fn shared_packing_is_thread_count_independent() {
    let pools: Vec<rayon::ThreadPool> = [1, 2, 5]
        .iter()
        .map(|&t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap())
        .collect();
    for (m, k, n, sel) in [
        (256, 256, 256, 0),
        (130, 300, 70, 3),
        (9, 784, 32, 4),
        (40, 513, 2100, 0),
        (300, 40, 33, 1),
        // Row-major B over the direct path's packing size, packed by the
        // kernel of the first tile over each part, rows below the last
        // whole tile and columns right of the last whole panel.
        (130, 513, 300, 0),
    ] {
        let a = pick::<f32>(&rand_f64(21, m * k), &[m, k], sel);
        let b = pick::<f32>(&rand_f64(22, k * n), &[k, n], sel + 1);
        let want = naive(&values_f64(&a), &values_f64(&b), 1, m, k, n);
        let runs: Vec<Vec<u32>> = pools
            .iter()
            .map(|p| {
                let c = p.install(|| a.matmul(&b).unwrap());
                c.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
            })
            .collect();
        let got: Vec<f64> = runs[0].iter().map(|&v| f32::from_bits(v) as f64).collect();
        close(&got, &want, k, DType::F32).unwrap();
        assert!(
            runs.iter().all(|r| r == &runs[0]),
            "{m}x{k}x{n}: thread counts disagree"
        );
    }
}

/// A B the direct path packs (a row-major one by the kernel of the first
/// whole tile over each part, tasks that find it still being packed
/// reading B in place; a transposed one by the packing routine), in one
/// region of the depth or in several with more parts than threads,
/// rounds exactly as the packed driver does (a column-major output goes
/// through it), with the fused bias and ReLU, on every ISA, both write
/// modes, on 1 and 3 threads (more threads than cores: tasks race for
/// the parts).
#[test]
fn direct_packed_b_rounds_as_the_packed_driver() {
    // (m, k, n, B stored transposed): 615 KB of row-major B, packed by the
    // tasks' kernels in one region; 3 MB, wide enough for parts beyond the
    // thread count and a region per depth block (600 = 3 × 200), with
    // columns right of the last panel; the same B stored transposed,
    // packed by the packing routine.
    for (m, k, n, bt) in [
        (130, 513, 300, false),
        (120, 600, 1300, false),
        (40, 600, 1300, true),
    ] {
        let a = tensor_of::<f32>(&rand_f64(31, m * k), &[m, k]);
        let b = match bt {
            false => tensor_of::<f32>(&rand_f64(32, k * n), &[k, n]),
            true => tensor_of::<f32>(&rand_f64(32, k * n), &[n, k]).t().unwrap(),
        };
        let c0: Vec<f32> = rand_f64(33, m * n).iter().map(|&x| x as f32).collect();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for isa in Isa::available() {
                for beta in [0.0f32, 1.0] {
                    let mut rows = c0.clone();
                    let mut cols: Vec<f32> = (0..m * n).map(|e| c0[(e % m) * n + e / m]).collect();
                    let shape = GemmShape {
                        m,
                        n,
                        k,
                        alpha: 1.0,
                        beta,
                    };
                    let bias: Vec<f32> = (0..n).map(|j| j as f32 / 7.0 - 20.0).collect();
                    let epi = || Epilogue {
                        bias: Bias::Col(&bias),
                        relu: true,
                    };
                    pool.install(|| {
                        let out = MatMut {
                            data: &mut rows,
                            off: 0,
                            rs: n as isize,
                            cs: 1,
                        };
                        gemm::<f32>(shape, mat(&a), mat(&b), out, epi(), isa, true);
                        let out = MatMut {
                            data: &mut cols,
                            off: 0,
                            rs: 1,
                            cs: m as isize,
                        };
                        gemm::<f32>(shape, mat(&a), mat(&b), out, epi(), isa, true);
                    });
                    for (e, r) in rows.iter().enumerate() {
                        let (i, j) = (e / n, e % n);
                        assert_eq!(
                            r.to_bits(),
                            cols[j * m + i].to_bits(),
                            "{m}x{k}x{n}, {isa:?}, {threads} threads, beta {beta}: ({i}, {j})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn half_operands_round_once() {
    // An exact product in f32 that f16 holds: the result must be exact.
    let a = tensor_of::<f16>(&[0.5, 0.25, 2.0, 4.0], &[2, 2]);
    let b = tensor_of::<bf16>(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    assert_eq!(values_f64(&a.matmul(&a).unwrap()), vec![0.75, 1.125, 9.0, 16.5]);
    assert_eq!(values_f64(&b.matmul(&b).unwrap()), vec![7.0, 10.0, 15.0, 22.0]);
}

/// A batch against a shared matrix runs as one GEMM over the stacked rows
/// (a layer's weight packed once): bitwise the products one at a time,
/// for contiguous batches, a batch-major row slice, and layouts that do not
/// fold (heads-inner rows, transposed matrices).
#[test]
fn batch_against_a_shared_matrix_is_bitwise_the_single_products() {
    let (m, k, n) = (13, 300, 70);
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        let base = Tensor::from_vec(rand_f64(7, 4 * 3 * 16 * k), &[4, 3, 16, k])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let b = Tensor::from_vec(rand_f64(8, k * n), &[k, n])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let cases = [
            base.narrow(2, 0, m).unwrap(),
            base.narrow(2, 0, m).unwrap().contiguous().unwrap(),
            base.narrow(2, 0, m).unwrap().transpose(1, 2).unwrap(),
            base.narrow(2, 0, m)
                .unwrap()
                .contiguous()
                .unwrap()
                .narrow(0, 1, 2)
                .unwrap(),
        ];
        for (c, a) in cases.iter().enumerate() {
            let got = a.matmul(&b).unwrap();
            let lead = &a.shape()[..2];
            for i in 0..lead[0] as isize {
                for j in 0..lead[1] as isize {
                    let ai = a.select(0, i).unwrap().select(0, j).unwrap();
                    let want = ai.matmul(&b).unwrap();
                    let g = got.select(0, i).unwrap().select(0, j).unwrap();
                    assert_eq!(
                        g.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
                        want.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
                        "{dtype} case {c}, product ({i}, {j})"
                    );
                }
            }
        }
    }
}

/// Products with a small output and a long depth sum in depth slices
/// (`split.rs`): the full epilogue (alpha, beta, bias, ReLU) on a strided
/// output matches the f64 reference, and the bits are the same on 1, 2 and
/// 3 threads and with parallelism refused, for f32 and bf16 operands and
/// strided, transposed and row-major layouts.
#[test]
fn depth_split_products_match_naive_on_any_thread_count() {
    let pools: Vec<rayon::ThreadPool> = [1, 2, 3]
        .iter()
        .map(|&t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap())
        .collect();
    for (m, k, n, sel) in [
        (7, 4100, 40, 0),
        (33, 9000, 19, 1),
        (70, 20000, 3, 3),
        (8, 8200, 32, 0),
    ] {
        assert!(super::split::slices(m, n, k).is_some(), "{m}x{k}x{n} is split");
        let av = rand_f64(41, m * k);
        let bv = rand_f64(42, k * n);
        let cv = rand_f64(43, m * n);
        let biasv = rand_f64(44, m);
        let bias32: Vec<f32> = biasv.iter().map(|&x| x as f32).collect();
        for dtype in [DType::F32, DType::BF16] {
            let (a, b) = crate::with_dtype!(dtype, T => (pick::<T>(&av, &[m, k], sel), pick::<T>(&bv, &[k, n], sel + 1)));
            let prod = naive(&values_f64(&a), &values_f64(&b), 1, m, k, n);
            let want: Vec<f64> = (0..m * n)
                .map(|e| (0.75 * prod[e] - 0.5 * cv[e] + biasv[e / n]).max(0.0))
                .collect();
            let runs: Vec<Vec<u32>> = pools
                .iter()
                .flat_map(|p| [(p, true), (p, false)])
                .map(|(p, par)| {
                    // Column-major C inside a larger buffer.
                    let mut c = vec![f32::NAN; m * n + 3];
                    for (e, &x) in cv.iter().enumerate() {
                        c[3 + (e % n) * m + e / n] = x as f32;
                    }
                    let shape = GemmShape {
                        m,
                        n,
                        k,
                        alpha: 0.75,
                        beta: -0.5,
                    };
                    let epi = Epilogue {
                        bias: Bias::Row(&bias32),
                        relu: true,
                    };
                    let out = MatMut {
                        data: &mut c,
                        off: 3,
                        rs: 1,
                        cs: m as isize,
                    };
                    p.install(|| match dtype {
                        DType::BF16 => {
                            let (ra, rb) = (
                                super::mat_ref::<bf16>(&a, a.layout()),
                                super::mat_ref::<bf16>(&b, b.layout()),
                            );
                            gemm::<bf16>(shape, ra, rb, out, epi, Isa::best(), par)
                        }
                        _ => gemm::<f32>(shape, mat(&a), mat(&b), out, epi, Isa::best(), par),
                    });
                    (0..m * n).map(|e| c[3 + (e % n) * m + e / n].to_bits()).collect()
                })
                .collect();
            assert!(
                runs.iter().all(|r| r == &runs[0]),
                "{dtype} {m}x{k}x{n}: thread counts or parallelism change the bits"
            );
            let got: Vec<f64> = runs[0].iter().map(|&x| f32::from_bits(x) as f64).collect();
            close(&got, &want, k, DType::F32).unwrap_or_else(|e| panic!("{dtype} {m}x{k}x{n}: {e}"));
        }
    }
}

/// Every partial-tile routine writes the corner it covers bit for bit as
/// the full register tile does (so a GEMM's edges sum exactly as its
/// interior), for every corner size, depth 0–37 and both write modes.
#[test]
fn edge_routines_equal_the_full_tile() {
    use super::kernel::GemmScalar;
    fn check<T: GemmScalar>(isa: Isa, to: impl Fn(f64) -> T) {
        let kern = T::kernel(isa);
        let Some(edge) = kern.edge else { return };
        let (mr, nr) = (kern.mr, kern.nr);
        for kc in [0, 1, 7, 37] {
            let a: Vec<T> = rand_f64(3, kc * mr).into_iter().map(&to).collect();
            let b: Vec<T> = rand_f64(4, kc * nr).into_iter().map(&to).collect();
            let c0: Vec<T> = rand_f64(5, mr * nr).into_iter().map(&to).collect();
            for add in [false, true] {
                let mut full = c0.clone();
                // SAFETY: the panels hold kc·mr and kc·nr elements, the tile
                // mr·nr, and `isa` is one this CPU runs.
                unsafe { (kern.run)(kc, a.as_ptr(), b.as_ptr(), full.as_mut_ptr(), nr, add) };
                for rows in 1..=mr {
                    for cols in 1..=nr {
                        let mut part = c0.clone();
                        // SAFETY: as above; the routine writes within the tile.
                        unsafe { edge(rows, cols)(kc, a.as_ptr(), b.as_ptr(), part.as_mut_ptr(), nr, add) };
                        for i in 0..rows {
                            let (got, want) = (&part[i * nr..i * nr + cols], &full[i * nr..i * nr + cols]);
                            assert!(
                                bytemuck::cast_slice::<T, u8>(got) == bytemuck::cast_slice::<T, u8>(want),
                                "{isa:?} {}: edge {rows}x{cols}, kc {kc}, add {add}, row {i}: {got:?} vs {want:?}",
                                std::any::type_name::<T>()
                            );
                        }
                    }
                }
            }
        }
    }
    for isa in Isa::available() {
        check::<f32>(isa, |v| v as f32);
        check::<f64>(isa, |v| v);
    }
}

/// Every direct routine of the first rows of the direct tile, in place
/// and packing, writes those rows bit for bit as the whole tile does, and
/// only those rows, and the packing routines copy B's rows into their
/// panel; for depths 0–37, both write modes and padded row strides.
#[test]
fn direct_row_and_packing_routines_equal_the_full_tile() {
    use super::kernel::GemmScalar;
    fn check<T: GemmScalar>(isa: Isa, to: impl Fn(f64) -> T) {
        let Some(direct) = T::direct(isa) else { return };
        let (mr, nr) = (direct.mr, T::kernel(isa).nr);
        let (lda, ldb, ldc) = (41, nr + 3, nr + 2);
        let bytes = |v: &[T]| bytemuck::cast_slice::<T, u8>(v).to_vec();
        for kc in [0, 1, 7, 37] {
            let a: Vec<T> = rand_f64(3, mr * lda).into_iter().map(&to).collect();
            let b: Vec<T> = rand_f64(4, kc.max(1) * ldb).into_iter().map(&to).collect();
            let c0: Vec<T> = rand_f64(5, mr * ldc).into_iter().map(&to).collect();
            let rows_of_b: Vec<T> = (0..kc)
                .flat_map(|p| b[p * ldb..p * ldb + nr].iter().copied())
                .collect();
            for add in [false, true] {
                let mut full = c0.clone();
                // SAFETY (of every call): A holds mr rows of lda ≥ kc
                // elements, B kc rows of ldb ≥ nr, C mr rows of ldc ≥ nr,
                // a panel kc×nr elements; `isa` is one this CPU runs.
                let (ap, bp) = (a.as_ptr(), b.as_ptr());
                unsafe { ((direct.rows)(mr).tile)(kc, ap, lda, bp, ldb, full.as_mut_ptr(), ldc, add) };
                for rows in 1..=mr {
                    let routines = (direct.rows)(rows);
                    let (mut part, mut packing) = (c0.clone(), c0.clone());
                    let mut panel = vec![to(f64::NAN); kc * nr];
                    unsafe {
                        (routines.tile)(kc, ap, lda, bp, ldb, part.as_mut_ptr(), ldc, add);
                        let (dst, c) = (panel.as_mut_ptr(), packing.as_mut_ptr());
                        (routines.packing)(kc, ap, lda, bp, ldb, dst, c, ldc, add);
                    }
                    let cut = rows * ldc;
                    let what = format!(
                        "{isa:?} {}: {rows} of {mr} rows, kc {kc}, add {add}",
                        std::any::type_name::<T>()
                    );
                    for (name, out) in [("in place", &part), ("packing", &packing)] {
                        assert!(bytes(&out[..cut]) == bytes(&full[..cut]), "{what}, {name}");
                        assert!(
                            bytes(&out[cut..]) == bytes(&c0[cut..]),
                            "{what}, {name}: wrote below its rows"
                        );
                    }
                    assert!(
                        bytes(&panel) == bytes(&rows_of_b),
                        "{what}: the panel is not B's rows"
                    );
                }
            }
        }
    }
    for isa in Isa::available() {
        check::<f32>(isa, |v| v as f32);
        check::<f64>(isa, |v| v);
    }
}
