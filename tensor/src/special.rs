//! Special functions the standard library lacks.

// The coefficients are the published ones, digit for digit.
#![allow(clippy::excessive_precision)]

/// The Gauss error function, with absolute error below 1.2e-16 (W. J. Cody's
/// rational Chebyshev approximations, as in most libm implementations).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let r = match erf_or_erfc(x.abs()) {
        Ok(erf) => erf,
        Err(erfc) => 1.0 - erfc,
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// The complementary error function 1 − erf(x), keeping its relative
/// accuracy in the right tail where 1 − erf(x) would cancel.
#[cfg(test)]
pub(crate) fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    match erf_or_erfc(x.abs()) {
        Ok(erf) if x < 0.0 => 1.0 + erf,
        Ok(erf) => 1.0 - erf,
        Err(erfc) if x < 0.0 => 2.0 - erfc,
        Err(erfc) => erfc,
    }
}

/// For `ax ≥ 0`: `Ok(erf(ax))` below 0.5, else `Err(erfc(ax))`.
fn erf_or_erfc(ax: f64) -> Result<f64, f64> {
    if ax < 0.5 {
        let t = ax * ax;
        let num = ((((1.857_777_061_846_031_5e-1 * t + 3.161_123_743_870_565_6) * t
            + 1.138_641_541_510_501_6e2)
            * t
            + 3.774_852_376_853_020_2e2)
            * t
            + 3.209_377_589_138_469_5e3)
            * ax;
        let den = (((t + 2.360_129_095_234_412_1e1) * t + 2.440_246_379_344_441_7e2) * t
            + 1.282_616_526_077_372_3e3)
            * t
            + 2.844_236_833_439_170_6e3;
        Ok(num / den)
    } else if ax < 4.0 {
        let num = (((((((2.153_115_354_744_038_3e-8 * ax + 5.641_884_969_886_700_9e-1) * ax
            + 8.883_149_794_388_376)
            * ax
            + 6.611_919_063_714_163e1)
            * ax
            + 2.986_351_381_974_001_3e2)
            * ax
            + 8.819_522_212_417_691e2)
            * ax
            + 1.712_047_612_634_070_7e3)
            * ax
            + 2.051_078_377_826_071_6e3)
            * ax
            + 1.230_339_354_797_997_2e3;
        let den = (((((((ax + 1.574_492_611_070_983_4e1) * ax + 1.176_939_508_913_125e2) * ax
            + 5.371_811_018_620_098_6e2)
            * ax
            + 1.621_389_574_566_690_2e3)
            * ax
            + 3.290_799_235_733_459_7e3)
            * ax
            + 4.362_619_090_143_247e3)
            * ax
            + 3.439_367_674_143_721_6e3)
            * ax
            + 1.230_339_354_803_749_4e3;
        Err((-ax * ax).exp() * num / den)
    } else {
        let z = 1.0 / (ax * ax);
        let num = ((((1.631_538_713_730_709_6e-2 * z + 3.053_266_349_612_323_4e-1) * z
            + 3.603_448_999_498_044_4e-1)
            * z
            + 1.257_817_261_112_292_6e-1)
            * z
            + 1.608_378_514_874_227_6e-2)
            * z
            + 6.587_491_615_298_378_5e-4;
        let den = ((((z + 2.568_520_192_289_822_5) * z + 1.872_952_849_923_460_3) * z
            + 5.279_051_029_514_284_1e-1)
            * z
            + 6.051_834_131_244_132e-2)
            * z
            + 2.335_204_976_268_691_8e-3;
        let frac_1_sqrt_pi = 0.564_189_583_547_756_3;
        let r = (frac_1_sqrt_pi - z * num / den) / ax;
        Err((-ax * ax).exp() * r)
    }
}

#[cfg(test)]
mod tests {
    use super::erf;

    #[test]
    fn erf_matches_known_values() {
        // Values from Abramowitz & Stegun table 7.1 / high-precision references.
        let cases = [
            (0.0, 0.0),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (4.5, 0.999_999_999_803_383),
            (-1.0, -0.842_700_792_949_714_9),
            (-0.3, -0.328_626_759_459_127_4),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {} want {want}", erf(x));
        }
    }
}
