//! Casts between dtypes (`Tensor::to_dtype`): round-to-nearest-even into
//! f16/bf16 at exact ties, and lossless round trips between every pair of
//! dtypes for values both represent.

use tessera_tensor::{bf16, f16, DType, Element, Tensor};

fn f32s(v: &[f32]) -> Tensor {
    Tensor::from_slice(v, &[v.len()]).unwrap()
}

fn as_f64(t: &Tensor) -> Vec<f64> {
    tessera_tensor::with_dtype!(t.dtype(), T => t.to_vec::<T>().unwrap().into_iter().map(|x| x.to_f64()).collect())
}

#[test]
fn f32_to_f16_rounds_ties_to_even() {
    let e = |k: i32| 2f32.powi(k);
    // (input, expected): f16 has 10 fraction bits, so 2^-10 is one ulp at 1.
    let cases = [
        (1.0 + e(-11), 1.0),                   // tie, 1.0 is even
        (1.0 + 3.0 * e(-11), 1.0 + e(-9)),     // tie, rounds up to even
        (1.0 + e(-11) + e(-20), 1.0 + e(-10)), // just above the tie
        (-(1.0 + e(-11)), -1.0),               // ties are symmetric
        (-(1.0 + 3.0 * e(-11)), -(1.0 + e(-9))),
        (2048.0 + 1.0, 2048.0), // ulp 2 at 2048
        (2048.0 + 3.0, 2052.0),
        (65504.0 + 8.0, 65504.0), // below the overflow tie
        (65520.0, f32::INFINITY), // tie with 2^16: overflows
        (e(-25), 0.0),            // half the least subnormal
        (3.0 * e(-25), e(-23)),   // subnormal tie to even
        (5.0 * e(-25), e(-23)),
    ];
    let input: Vec<f32> = cases.iter().map(|c| c.0).collect();
    let got = f32s(&input)
        .to_dtype(DType::F16)
        .unwrap()
        .to_vec::<f16>()
        .unwrap();
    for ((x, want), g) in cases.iter().zip(got) {
        assert_eq!(g.to_f32(), *want, "f16({x:e})");
    }
    let nan = f32s(&[f32::NAN])
        .to_dtype(DType::F16)
        .unwrap()
        .to_vec::<f16>()
        .unwrap();
    assert!(nan[0].is_nan());
}

#[test]
fn f32_to_bf16_rounds_ties_to_even() {
    let e = |k: i32| 2f32.powi(k);
    // bf16 has 7 fraction bits: one ulp at 1 is 2^-7.
    let cases = [
        (1.0 + e(-8), 1.0),
        (1.0 + 3.0 * e(-8), 1.0 + e(-6)),
        (1.0 + e(-8) + e(-20), 1.0 + e(-7)),
        (-(1.0 + 3.0 * e(-8)), -(1.0 + e(-6))),
        (f32::MAX, f32::INFINITY),
        (e(-133), e(-133)), // bf16 keeps f32's subnormal range
    ];
    let input: Vec<f32> = cases.iter().map(|c| c.0).collect();
    let got = f32s(&input)
        .to_dtype(DType::BF16)
        .unwrap()
        .to_vec::<bf16>()
        .unwrap();
    for ((x, want), g) in cases.iter().zip(got) {
        assert_eq!(g.to_f32(), *want, "bf16({x:e})");
    }
    let nan = f32s(&[f32::NAN, -f32::NAN])
        .to_dtype(DType::BF16)
        .unwrap()
        .to_vec::<bf16>()
        .unwrap();
    assert!(nan.iter().all(|x| x.is_nan()), "NaN must not round to infinity");
}

#[test]
fn f64_to_half_types_round_through_f32_like_pytorch() {
    // Just above a tie in f64 but exactly the tie once rounded to f32.
    // PyTorch (c10::Half/BFloat16 from double) rounds through f32 and so
    // lands on the even neighbour 1.0; so do we (checked against torch 2.x).
    let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    let t = Tensor::from_vec(vec![x], &[1]).unwrap();
    assert_eq!(
        t.to_dtype(DType::F16).unwrap().to_vec::<f16>().unwrap()[0].to_f64(),
        1.0
    );
    let y = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    let t = Tensor::from_vec(vec![y], &[1]).unwrap();
    assert_eq!(
        t.to_dtype(DType::BF16).unwrap().to_vec::<bf16>().unwrap()[0].to_f64(),
        1.0
    );
    // Away from such double ties, f64 rounds to the nearest half value.
    let z = 1.0 + 2f64.powi(-11) + 2f64.powi(-20);
    let t = Tensor::from_vec(vec![z], &[1]).unwrap();
    assert_eq!(
        t.to_dtype(DType::F16).unwrap().to_vec::<f16>().unwrap()[0].to_f64(),
        1.0 + 2f64.powi(-10)
    );
}

/// Whether `v` is exactly representable in `dtype`.
fn exact_in(v: f64, dtype: DType) -> bool {
    tessera_tensor::with_dtype!(dtype, T => T::from_f64(v).to_f64() == v)
}

#[test]
fn every_dtype_pair_round_trips_exact_values() {
    let candidates = [
        0.0,
        1.0,
        2.0,
        3.0,
        7.0,
        100.0,
        255.0,
        256.0,
        1000.0,
        2048.0,
        2049.0,
        65504.0,
        65536.0,
        16_777_216.0,
        16_777_217.0,
        2_147_483_648.0,
        4_294_967_295.0,
        9_007_199_254_740_992.0,
        -1.0,
        -2.0,
        -256.0,
        -65504.0,
        0.5,
        -0.25,
        1.5,
        0.1,
        1e-3,
        3.0e38,
        1e300,
    ];
    let mut checked_pairs = 0;
    for src in DType::ALL {
        for dst in DType::ALL {
            let vals: Vec<f64> = candidates
                .iter()
                .copied()
                .filter(|&v| exact_in(v, src) && exact_in(v, dst))
                .collect();
            assert!(vals.contains(&1.0), "{src} -> {dst}");
            let t = tessera_tensor::with_dtype!(src, T => {
                let v: Vec<T> = vals.iter().map(|&x| T::from_f64(x)).collect();
                // Store reversed and flip back: casts must follow the view.
                Tensor::from_vec(v.into_iter().rev().collect(), &[vals.len()]).unwrap().flip(&[0]).unwrap()
            });
            let there = t.to_dtype(dst).unwrap();
            assert_eq!(there.dtype(), dst);
            assert_eq!(as_f64(&there), vals, "{src} -> {dst}");
            let back = there.to_dtype(src).unwrap();
            assert_eq!(as_f64(&back), vals, "{src} -> {dst} -> {src}");
            checked_pairs += 1;
        }
    }
    assert_eq!(checked_pairs, 64);
}

#[test]
fn integer_casts_are_exact_beyond_f64_precision() {
    let big = vec![i64::MAX, i64::MIN, (1 << 53) + 1, -(1 << 53) - 1];
    let t = Tensor::from_vec(big.clone(), &[4]).unwrap();
    assert_eq!(t.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(), big);
    let u = Tensor::from_vec(vec![u32::MAX, 0, 123_456_789], &[3]).unwrap();
    let via_i64 = u.to_dtype(DType::I64).unwrap().to_dtype(DType::U32).unwrap();
    assert_eq!(via_i64.to_vec::<u32>().unwrap(), vec![u32::MAX, 0, 123_456_789]);
    // Out-of-range integers saturate (documented; PyTorch would wrap).
    let s = Tensor::from_vec(vec![300i64, -1, 5_000_000_000], &[3]).unwrap();
    assert_eq!(
        s.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(),
        vec![255, 0, 255]
    );
    assert_eq!(
        s.to_dtype(DType::U32).unwrap().to_vec::<u32>().unwrap(),
        vec![300, 0, u32::MAX]
    );
    assert_eq!(
        s.to_dtype(DType::Bool).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, true]
    );
}
