//! Vectorised f32 elementary functions, generic over [`Vf32`]: exp (Cephes'
//! minimax polynomial on a ln 2 range reduction), tanh, the logistic
//! sigmoid, SiLU and both GELUs (the exact one through erf/erfc from W. J.
//! Cody's rational approximations, so the negative tail keeps its relative
//! accuracy instead of cancelling in 1 + erf).
//!
//! Special values follow the scalar kernels: NaN propagates, exp(−∞) = 0,
//! exp(+∞) = +∞, results that underflow come out as subnormals, then 0.

// The coefficients are the published ones, digit for digit.
#![allow(clippy::excessive_precision)]

use super::vector::Vf32;

/// e^x.
#[inline(always)]
pub(crate) fn exp<V: Vf32>(x: V) -> V {
    let (p, s1, s2) = exp_split(x);
    p.mul(s1).mul(s2)
}

/// e^x as p·s1·s2 with p in [0.7, 1.5] and s1, s2 powers of two, so that a
/// factor multiplied into p first is rounded only once, at the final scaling
/// (which keeps a product like x·e^x accurate when e^x alone is subnormal).
#[inline(always)]
fn exp_split<V: Vf32>(x: V) -> (V, V, V) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so n·C1 is exact for |n| ≤ 2^15.
    const C1: f32 = 0.693_359_375;
    const C2: f32 = -2.121_944_400_546_905_8e-4;
    // Below −104 the result rounds to 0, above 89 to +∞; the clamps keep NaN
    // (x86 min/max return the second operand when either is NaN).
    let x = V::splat(89.0).min(x);
    let x = V::splat(-104.0).max(x);
    let n = x.mul(V::splat(LOG2E)).round();
    let r = n.fma(V::splat(-C1), x);
    let r = n.fma(V::splat(-C2), r);
    let mut p = V::splat(1.987_569_150_0e-4);
    p = p.fma(r, V::splat(1.398_199_950_7e-3));
    p = p.fma(r, V::splat(8.333_451_907_3e-3));
    p = p.fma(r, V::splat(4.166_579_589_4e-2));
    p = p.fma(r, V::splat(1.666_666_545_9e-1));
    p = p.fma(r, V::splat(5.000_000_120_1e-1));
    let p = p.fma(r.mul(r), r).add(V::splat(1.0));
    // 2^n in two factors so that subnormal results and n = 128 stay exact.
    let n1 = n.mul(V::splat(0.5)).round();
    let n2 = n.sub(n1);
    (p, n1.pow2i(), n2.pow2i())
}

/// m · e where e = p·s1·s2 from [`exp_split`], rounded once; m·0 (NaN for
/// infinite m) where e is 0.
#[inline(always)]
fn times_exp<V: Vf32>(m: V, (p, s1, s2): (V, V, V), e: V) -> V {
    let scaled = m.mul(p).mul(s1).mul(s2);
    V::select(V::splat(0.0).lt(e), scaled, m.mul(e))
}

/// m · sigmoid(x), with one rounding on the negative side (see [`times_exp`]).
#[inline(always)]
fn times_sigmoid<V: Vf32>(x: V, m: V) -> V {
    let parts = exp_split(V::splat(0.0).sub(x.abs()));
    let e = parts.0.mul(parts.1).mul(parts.2);
    let mr = m.div(V::splat(1.0).add(e));
    V::select(x.lt(V::splat(0.0)), times_exp(mr, parts, e), mr)
}

/// 1 / (1 + e^−x) from e = e^−|x| ≤ 1, so nothing overflows and the negative
/// side keeps full relative accuracy down to the subnormals.
#[inline(always)]
pub(crate) fn sigmoid<V: Vf32>(x: V) -> V {
    times_sigmoid(x, V::splat(1.0))
}

/// tanh x: Cephes' odd polynomial below |x| = 0.625, else 1 − 2/(e^{2|x|} + 1),
/// with the sign of x.
#[inline(always)]
pub(crate) fn tanh<V: Vf32>(x: V) -> V {
    let a = x.abs();
    let z = a.mul(a);
    let mut p = V::splat(-5.704_988_727_45e-3);
    p = p.fma(z, V::splat(2.063_908_879_54e-2));
    p = p.fma(z, V::splat(-5.373_971_555_31e-2));
    p = p.fma(z, V::splat(1.333_144_220_36e-1));
    p = p.fma(z, V::splat(-3.333_328_194_22e-1));
    let small = a.mul(z).fma(p, a);
    let e = exp(a.add(a));
    let large = V::splat(1.0).sub(V::splat(2.0).div(e.add(V::splat(1.0))));
    V::select(a.lt(V::splat(0.625)), small, large).copysign(x)
}

/// SiLU: x · sigmoid(x).
#[inline(always)]
pub(crate) fn silu<V: Vf32>(x: V) -> V {
    times_sigmoid(x, x)
}

/// GELU, tanh form, as x · sigmoid(2u) with u = √(2/π)(x + 0.044715 x³):
/// equal to x/2 · (1 + tanh u) without its cancellation for negative x.
#[inline(always)]
pub(crate) fn gelu_tanh<V: Vf32>(x: V) -> V {
    const K2: f32 = 1.595_769_121_605_731; // 2·√(2/π)
    let x2 = x.mul(x);
    let u2 = x
        .mul(V::splat(K2))
        .mul(x2.fma(V::splat(0.044_715), V::splat(1.0)));
    times_sigmoid(u2, x)
}

/// GELU, exact form: x · Φ(x) with Φ(x) = ½ erfc(−x/√2), taking erfc for
/// |x/√2| ≥ 0.5 so both tails keep their accuracy.
#[inline(always)]
pub(crate) fn gelu_erf<V: Vf32>(x: V) -> V {
    let t = NormalTail::new(x);
    let neg = times_exp(x.mul(t.q), t.parts, t.e);
    let pos = x.mul(t.q.mul(t.e).fma(V::splat(-1.0), V::splat(1.0)));
    let big = V::select(x.lt(V::splat(0.0)), neg, pos);
    let small = x.mul(erf_small(t.z).fma(V::splat(0.5), V::splat(0.5)));
    V::select(t.az.lt(V::splat(0.5)), small, big)
}

/// The derivative of the exact GELU times `g`: g · (Φ(x) + x·φ(x)), with
/// φ(x) = e^{−x²/2}/√(2π) from the same exact x²/2 as Φ's tail.
#[inline(always)]
pub(crate) fn gelu_erf_backward<V: Vf32>(g: V, x: V) -> V {
    const FRAC_1_SQRT_2PI: f32 = 0.398_942_280_401_432_7;
    let t = NormalTail::new(x);
    let tail = t.q.mul(t.e);
    let big = V::select(x.lt(V::splat(0.0)), tail, V::splat(1.0).sub(tail));
    let small = erf_small(t.z).fma(V::splat(0.5), V::splat(0.5));
    let cdf = V::select(t.az.lt(V::splat(0.5)), small, big);
    let pdf = t.e.mul(V::splat(1.0).sub(t.lo)).mul(V::splat(FRAC_1_SQRT_2PI));
    g.mul(x.fma(pdf, cdf))
}

/// The pieces of Φ(x) shared by the exact GELU and its derivative: z =
/// x/√2, a = min(|z|, 10.5), e = e^{−hi} where hi + lo = x²/2 exactly (z
/// itself is rounded, and e^{−z²} would amplify that in the tail), its
/// [`exp_split`] parts, and q with ½ erfc(a) = q·e.
struct NormalTail<V> {
    z: V,
    az: V,
    lo: V,
    parts: (V, V, V),
    e: V,
    q: V,
}

impl<V: Vf32> NormalTail<V> {
    #[inline(always)]
    fn new(x: V) -> Self {
        let z = x.mul(V::splat(std::f32::consts::FRAC_1_SQRT_2));
        // Beyond 10.5, e^{−z²} is 0 in f32: clamping keeps inf out of the
        // polynomials (so gelu(+∞) = +∞ and gelu(−∞) = −∞ · 0 = NaN, as the
        // scalar form gives).
        let az = V::splat(10.5).min(z.abs());
        let xc = V::splat(14.849_242).min(x.abs());
        let (hi, lo) = xc.mul_err(xc);
        let (hi, lo) = (hi.mul(V::splat(0.5)), lo.mul(V::splat(0.5)));
        let q = erfc_scaled(az).mul(V::splat(1.0).sub(lo)).mul(V::splat(0.5));
        let parts = exp_split(V::splat(0.0).sub(hi));
        let e = parts.0.mul(parts.1).mul(parts.2);
        NormalTail {
            z,
            az,
            lo,
            parts,
            e,
            q,
        }
    }
}

/// The derivative of the tanh GELU times `g`: with s = sigmoid(2u) =
/// ½(1 + tanh u), g · (s + 2x·s(1 − s)·u′), u′ = √(2/π)(1 + 3·0.044715 x²).
#[inline(always)]
pub(crate) fn gelu_tanh_backward<V: Vf32>(g: V, x: V) -> V {
    const K: f32 = 0.797_884_560_802_865_4; // √(2/π)
    const C: f32 = 0.044_715;
    let x2 = x.mul(x);
    let u2 = x.mul(V::splat(2.0 * K)).mul(x2.fma(V::splat(C), V::splat(1.0)));
    let s = sigmoid(u2);
    let du = x2.fma(V::splat(3.0 * C * K), V::splat(K));
    let ds = s.mul(V::splat(1.0).sub(s)).mul(x.add(x)).mul(du);
    g.mul(s.add(ds))
}

/// The derivative of SiLU times `g`: g · σ(x)·(1 + x·(1 − σ(x))).
#[inline(always)]
pub(crate) fn silu_backward<V: Vf32>(g: V, x: V) -> V {
    let s = sigmoid(x);
    g.mul(s.mul(x.fma(V::splat(1.0).sub(s), V::splat(1.0))))
}

/// The derivative of ReLU from its output `y`, times `g`: g where y > 0,
/// else 0 (also for NaN y).
#[inline(always)]
pub(crate) fn relu_backward<V: Vf32>(g: V, y: V) -> V {
    V::select(V::splat(0.0).lt(y), g, V::splat(0.0))
}

/// The derivative of the sigmoid from its output `y`, times `g`.
#[inline(always)]
pub(crate) fn sigmoid_backward<V: Vf32>(g: V, y: V) -> V {
    g.mul(y.mul(V::splat(1.0).sub(y)))
}

/// The derivative of tanh from its output `y`, times `g`.
#[inline(always)]
pub(crate) fn tanh_backward<V: Vf32>(g: V, y: V) -> V {
    g.mul(V::splat(1.0).sub(y.mul(y)))
}

/// erf z for |z| < 0.5 (Cody's first rational function).
#[inline(always)]
fn erf_small<V: Vf32>(z: V) -> V {
    let t = z.mul(z);
    let mut num = V::splat(1.857_777_061_846_031_5e-1);
    num = num.fma(t, V::splat(3.161_123_743_870_565_6));
    num = num.fma(t, V::splat(1.138_641_541_510_501_6e2));
    num = num.fma(t, V::splat(3.774_852_376_853_020_2e2));
    num = num.fma(t, V::splat(3.209_377_589_138_469_5e3));
    let mut den = t.add(V::splat(2.360_129_095_234_412_1e1));
    den = den.fma(t, V::splat(2.440_246_379_344_441_7e2));
    den = den.fma(t, V::splat(1.282_616_526_077_372_3e3));
    den = den.fma(t, V::splat(2.844_236_833_439_170_6e3));
    z.mul(num).div(den)
}

/// erfc(a)·e^{a²} for 0.5 ≤ a ≤ 10.5 (Cody's second and third rational
/// functions).
#[inline(always)]
fn erfc_scaled<V: Vf32>(a: V) -> V {
    let mut num = V::splat(2.153_115_354_744_038_3e-8);
    for c in [
        5.641_884_969_886_700_9e-1,
        8.883_149_794_388_376,
        6.611_919_063_714_163e1,
        2.986_351_381_974_001_3e2,
        8.819_522_212_417_691e2,
        1.712_047_612_634_070_7e3,
        2.051_078_377_826_071_6e3,
        1.230_339_354_797_997_2e3,
    ] {
        num = num.fma(a, V::splat(c));
    }
    let mut den = a.add(V::splat(1.574_492_611_070_983_4e1));
    for c in [
        1.176_939_508_913_125e2,
        5.371_811_018_620_098_6e2,
        1.621_389_574_566_690_2e3,
        3.290_799_235_733_459_7e3,
        4.362_619_090_143_247e3,
        3.439_367_674_143_721_6e3,
        1.230_339_354_803_749_4e3,
    ] {
        den = den.fma(a, V::splat(c));
    }
    let mid = num.div(den);
    let in_mid = a.lt(V::splat(4.0));
    // Activations rarely reach a ≥ 4 (|x| ≥ 5.7 for GELU): a vector without
    // such a lane skips the tail's three divisions, whose result the select
    // below would discard.
    if V::all(in_mid) {
        return mid;
    }
    let zz = V::splat(1.0).div(a.mul(a));
    let mut tn = V::splat(1.631_538_713_730_709_6e-2);
    for c in [
        3.053_266_349_612_323_4e-1,
        3.603_448_999_498_044_4e-1,
        1.257_817_261_112_292_6e-1,
        1.608_378_514_874_227_6e-2,
        6.587_491_615_298_378_5e-4,
    ] {
        tn = tn.fma(zz, V::splat(c));
    }
    let mut td = zz.add(V::splat(2.568_520_192_289_822_5));
    for c in [
        1.872_952_849_923_460_3,
        5.279_051_029_514_284_1e-1,
        6.051_834_131_244_132e-2,
        2.335_204_976_268_691_8e-3,
    ] {
        td = td.fma(zz, V::splat(c));
    }
    let frac_1_sqrt_pi = V::splat(0.564_189_583_547_756_3);
    let tail = zz.mul(tn).div(td);
    let tail = frac_1_sqrt_pi.sub(tail).div(a);
    V::select(in_mid, mid, tail)
}

/// max(x, 0); NaN stays NaN and −0 stays −0, like the scalar relu.
#[inline(always)]
pub(crate) fn relu<V: Vf32>(x: V) -> V {
    V::select(x.lt(V::splat(0.0)), V::splat(0.0), x)
}
