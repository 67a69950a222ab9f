//! Random tensors and init fills from the Philox [`Generator`]: rand, randn,
//! randint, bernoulli, randperm, normal, uniform and truncated normal.
//!
//! Each op has two forms: `op(..)` draws from this thread's default
//! generator (see [`crate::rng::manual_seed`]) and `op_with(.., &mut gen)`
//! from an explicit one. Arguments are checked before any randomness is
//! drawn, so an `Err` leaves the generator's offset unchanged. How many
//! Philox blocks each op consumes is documented in [`crate::rng`].

#[cfg(feature = "cuda")]
#[path = "random_cuda.rs"]
pub(crate) mod cuda;

use rayon::prelude::*;

use super::creation::{exact_int_range, TensorOptions};
use crate::rng::{reserve, u64_from, unit_f64, unit_from_u32, Generator};
use crate::{with_dtype, with_float_dtype, DType, Element, Error, Result, Tensor};

/// Generates a pair of public functions: `$name` on the default generator
/// and `$with` on an explicit one, both forwarding to `$imp`.
macro_rules! default_and_with {
    ($(#[$doc:meta])* $name:ident, $with:ident, $imp:ident ($($arg:ident : $ty:ty),*)) => {
        $(#[$doc])*
        ///
        /// Draws from the default generator.
        pub fn $name($($arg: $ty),*) -> Result<Tensor> {
            Self::$imp($($arg,)* None)
        }
        $(#[$doc])*
        ///
        /// Draws from `gen` and advances its offset.
        pub fn $with($($arg: $ty,)* gen: &mut Generator) -> Result<Tensor> {
            Self::$imp($($arg,)* Some(gen))
        }
    };
}

impl Tensor {
    default_and_with!(
        /// Uniform samples in [0, 1) of a float dtype: f32/f16/bf16 use 24/11/8
        /// random bits (exactly representable, never 1), f64 53. Errors for a
        /// non-float dtype or a shape [`Tensor::zeros`] rejects.
        rand, rand_with, rand_impl(shape: &[usize], opts: impl Into<TensorOptions>)
    );
    default_and_with!(
        /// Standard normal samples of a float dtype (Box–Muller in f64 from
        /// two 53-bit uniforms per pair). Errors as [`Tensor::rand`].
        randn, randn_with, randn_impl(shape: &[usize], opts: impl Into<TensorOptions>)
    );
    default_and_with!(
        /// Uniform integers in `low .. high` (64 random bits each, scaled by
        /// multiplication). Errors when `low >= high`, when the dtype cannot
        /// hold every value in the range exactly, or for a shape
        /// [`Tensor::zeros`] rejects.
        randint, randint_with, randint_impl(low: i64, high: i64, shape: &[usize], opts: impl Into<TensorOptions>)
    );
    default_and_with!(
        /// Samples that are 1 with probability `p` and 0 otherwise, in any
        /// dtype. Errors when `p` is outside [0, 1] or for a shape
        /// [`Tensor::zeros`] rejects.
        bernoulli_scalar, bernoulli_scalar_with, bernoulli_scalar_impl(p: f64, shape: &[usize], opts: impl Into<TensorOptions>)
    );
    default_and_with!(
        /// A random permutation of `0 .. n` (sorting 64-bit random keys).
        /// Errors when the dtype cannot hold `n - 1` exactly.
        randperm, randperm_with, randperm_impl(n: usize, opts: impl Into<TensorOptions>)
    );
    default_and_with!(
        /// Normal samples with mean `mean` and standard deviation `std`
        /// (PyTorch's `normal_` init). Errors for a non-float dtype, a
        /// non-finite argument or `std < 0`.
        normal, normal_with, normal_impl(shape: &[usize], mean: f64, std: f64, opts: impl Into<TensorOptions>)
    );
    default_and_with!(
        /// Uniform samples `a + (b - a) * u` with `u` as in [`Tensor::rand`],
        /// computed in f64 and rounded to the dtype (PyTorch's `uniform_`
        /// init). Errors for a non-float dtype, non-finite bounds or `a > b`.
        uniform, uniform_with, uniform_impl(shape: &[usize], a: f64, b: f64, opts: impl Into<TensorOptions>)
    );
    default_and_with!(
        /// Normal samples with `mean` and `std` truncated to the absolute
        /// bounds `[a, b]` (PyTorch's `trunc_normal_`, whose defaults are
        /// a = -2, b = 2): inverse-CDF sampling, then clamping. Errors for a
        /// non-float dtype, a non-finite mean or std, `std <= 0`, a NaN bound
        /// or `a >= b`.
        trunc_normal, trunc_normal_with, trunc_normal_impl(shape: &[usize], mean: f64, std: f64, a: f64, b: f64, opts: impl Into<TensorOptions>)
    );

    /// Samples that are 1 with the probability held by each element of this
    /// float tensor, of the same shape and dtype (`torch.bernoulli(p)`),
    /// from the default generator. Errors for a non-float dtype or a
    /// probability outside [0, 1].
    pub fn bernoulli(&self) -> Result<Tensor> {
        self.bernoulli_impl(None)
    }

    /// As [`Tensor::bernoulli`], drawing from `gen`.
    pub fn bernoulli_with(&self, gen: &mut Generator) -> Result<Tensor> {
        self.bernoulli_impl(Some(gen))
    }

    /// [`Tensor::rand`] with this tensor's shape and device, of `dtype` or,
    /// when `None`, of this tensor's dtype.
    pub fn rand_like(&self, dtype: impl Into<Option<DType>>) -> Result<Tensor> {
        Tensor::rand(self.shape(), self.like_options(dtype.into()))
    }

    /// [`Tensor::randn`] with this tensor's shape and device, of `dtype` or,
    /// when `None`, of this tensor's dtype.
    pub fn randn_like(&self, dtype: impl Into<Option<DType>>) -> Result<Tensor> {
        Tensor::randn(self.shape(), self.like_options(dtype.into()))
    }

    fn rand_impl(
        shape: &[usize],
        opts: impl Into<TensorOptions>,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        Self::uniform_impl(shape, 0.0, 1.0, opts, gen)
    }

    fn randn_impl(
        shape: &[usize],
        opts: impl Into<TensorOptions>,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        Self::normal_impl(shape, 0.0, 1.0, opts, gen)
    }

    fn uniform_impl(
        shape: &[usize],
        a: f64,
        b: f64,
        opts: impl Into<TensorOptions>,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        let opts = opts.into();
        crate::backend::on_device("uniform", opts.device)?.uniform(shape, a, b, opts, gen)
    }

    /// The CPU kernel of [`Tensor::uniform`].
    pub(crate) fn uniform_cpu(
        shape: &[usize],
        a: f64,
        b: f64,
        opts: TensorOptions,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        let op = "uniform";
        let n = opts.check(op, shape)?;
        float_only(op, opts.dtype)?;
        if !(a.is_finite() && b.is_finite() && (b - a).is_finite() && a <= b) {
            return Err(Error::arg(
                op,
                format!("bounds [{a}, {b}] must be finite with a <= b"),
            ));
        }
        let (a, w) = (a, b - a);
        if opts.dtype == DType::F64 {
            let s = reserve(gen, n, 2);
            return Tensor::build::<f64>(op, shape, |out| {
                s.fill(out, |_, blk, l| a + w * unit_f64(blk[2 * l], blk[2 * l + 1]))
            });
        }
        let s = reserve(gen, n, 4);
        Ok(with_float_dtype!(opts.dtype, T => {
            let digits = mantissa_digits(opts.dtype);
            Tensor::build::<T>(op, shape, |out| s.fill(out, |_, blk, l| T::from_f64(a + w * unit_from_u32(blk[l], digits))))?
        }, else unreachable!("checked float above")))
    }

    fn normal_impl(
        shape: &[usize],
        mean: f64,
        std: f64,
        opts: impl Into<TensorOptions>,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        let opts = opts.into();
        crate::backend::on_device("normal", opts.device)?.normal(shape, mean, std, opts, gen)
    }

    /// The CPU kernel of [`Tensor::normal`].
    pub(crate) fn normal_cpu(
        shape: &[usize],
        mean: f64,
        std: f64,
        opts: TensorOptions,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        let op = "normal";
        let n = opts.check(op, shape)?;
        float_only(op, opts.dtype)?;
        check_normal(op, mean, std)?;
        let s = reserve(gen, n, 2);
        with_dtype!(opts.dtype, T => Tensor::build::<T>(op, shape, |out| {
            s.fill(out, |_, blk, l| T::from_f64(mean + std * box_muller(blk, l)))
        }))
    }

    fn trunc_normal_impl(
        shape: &[usize],
        mean: f64,
        std: f64,
        a: f64,
        b: f64,
        opts: impl Into<TensorOptions>,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        let opts = opts.into();
        let op = "trunc_normal";
        let n = opts.check(op, shape)?;
        float_only(op, opts.dtype)?;
        if !(mean.is_finite() && std.is_finite() && std > 0.0 && a < b) {
            return Err(Error::arg(
                op,
                format!("needs finite mean {mean}, std {std} > 0 and bounds a {a} < b {b}"),
            ));
        }
        let cdf = |x: f64| 0.5 * (1.0 + crate::erf((x - mean) / (std * std::f64::consts::SQRT_2)));
        // Uniform on [2 cdf(a) - 1, 2 cdf(b) - 1] mapped through erfinv is
        // the normal restricted to [a, b]; the clamp catches rounding.
        let lo = 2.0 * cdf(a) - 1.0;
        let w = 2.0 * cdf(b) - 1.0 - lo;
        let scale = std * std::f64::consts::SQRT_2;
        let s = reserve(gen, n, 2);
        with_dtype!(opts.dtype, T => Tensor::build::<T>(op, shape, |out| {
            s.fill(out, |_, blk, l| {
                let u = lo + w * unit_f64(blk[2 * l], blk[2 * l + 1]);
                T::from_f64((mean + scale * erfinv(u)).clamp(a, b))
            })
        }))
    }

    fn randint_impl(
        low: i64,
        high: i64,
        shape: &[usize],
        opts: impl Into<TensorOptions>,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        let opts = opts.into();
        let op = "randint";
        let n = opts.check(op, shape)?;
        if low >= high {
            return Err(Error::arg(op, format!("low {low} must be less than high {high}")));
        }
        let (lo, hi) = exact_int_range(opts.dtype);
        if (low as i128) < lo || (high as i128 - 1) > hi {
            return Err(Error::dtype(
                op,
                format!("{} cannot hold every integer in {low} .. {high}", opts.dtype),
            ));
        }
        let range = (high as i128 - low as i128) as u128;
        let s = reserve(gen, n, 2);
        with_dtype!(opts.dtype, T => Tensor::build::<T>(op, shape, |out| {
            s.fill(out, |_, blk, l| {
                let x = u64_from(blk[2 * l], blk[2 * l + 1]) as u128;
                T::from_i64((low as i128 + ((x * range) >> 64) as i128) as i64)
            })
        }))
    }

    fn bernoulli_scalar_impl(
        p: f64,
        shape: &[usize],
        opts: impl Into<TensorOptions>,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        let opts = opts.into();
        let op = "bernoulli";
        let n = opts.check(op, shape)?;
        check_probability(op, p)?;
        let s = reserve(gen, n, 2);
        with_dtype!(opts.dtype, T => Tensor::build::<T>(op, shape, |out| {
            s.fill(out, |_, blk, l| bernoulli_draw::<T>(blk, l, p))
        }))
    }

    fn bernoulli_impl(&self, gen: Option<&mut Generator>) -> Result<Tensor> {
        let op = "bernoulli";
        self.like_options(None).check(op, self.shape())?;
        float_only(op, self.dtype())?;
        let p = self.contiguous()?;
        with_float_dtype!(self.dtype(), T => {
            let probs = p.as_slice::<T>()?;
            if let Some(bad) = probs.iter().find(|q| !(0.0..=1.0).contains(&q.to_f64())) {
                return Err(Error::arg(op, format!("probability {bad:?} is outside [0, 1]")));
            }
            let s = reserve(gen, probs.len(), 2);
            Tensor::build::<T>(op, self.shape(), |out| {
                s.fill(out, |i, blk, l| bernoulli_draw::<T>(blk, l, probs[i].to_f64()))
            })
        }, else unreachable!("checked float above"))
    }

    fn randperm_impl(
        n: usize,
        opts: impl Into<TensorOptions>,
        gen: Option<&mut Generator>,
    ) -> Result<Tensor> {
        let opts = opts.into();
        let op = "randperm";
        opts.check(op, &[n])?;
        let (_, hi) = exact_int_range(opts.dtype);
        if n as i128 - 1 > hi {
            return Err(Error::dtype(
                op,
                format!("{} cannot hold {} exactly", opts.dtype, n - 1),
            ));
        }
        if n.checked_mul(16).is_none_or(|b| b > isize::MAX as usize) {
            return Err(Error::arg(op, format!("n = {n} is too large to sort")));
        }
        let s = reserve(gen, n, 2);
        let mut keyed = vec![(0u64, 0usize); n];
        s.fill(&mut keyed, |i, blk, l| (u64_from(blk[2 * l], blk[2 * l + 1]), i));
        // (key, index) pairs are distinct, so the order is fully determined.
        keyed.par_sort_unstable();
        with_dtype!(opts.dtype, T => Tensor::build::<T>(op, &[n], |out| {
            for (y, &(_, i)) in out.iter_mut().zip(&keyed) {
                *y = T::from_i64(i as i64);
            }
        }))
    }
}

/// Errors, naming `op`, unless `dtype` is a float dtype.
fn float_only(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(Error::dtype(op, format!("needs a float dtype, got {dtype}")))
    }
}

/// Errors, naming `op`, unless `mean` and `std` are finite and `std >= 0`.
fn check_normal(op: &'static str, mean: f64, std: f64) -> Result<()> {
    if mean.is_finite() && std.is_finite() && std >= 0.0 {
        Ok(())
    } else {
        Err(Error::arg(
            op,
            format!("mean {mean} and std {std} must be finite with std >= 0"),
        ))
    }
}

/// Errors, naming `op`, unless `p` is a probability.
fn check_probability(op: &'static str, p: f64) -> Result<()> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::arg(op, format!("probability {p} is outside [0, 1]")))
    }
}

/// 1 with probability `p` from the 53-bit uniform in lane `l` of `blk`.
#[inline]
fn bernoulli_draw<T: Element>(blk: &[u32; 4], l: usize, p: f64) -> T {
    if unit_f64(blk[2 * l], blk[2 * l + 1]) < p {
        T::ONE
    } else {
        T::ZERO
    }
}

/// The significand bits (with the implicit one) of a float dtype below f64.
fn mantissa_digits(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => 24,
    }
}

/// Lane `l` (0 → cosine, 1 → sine) of the Box–Muller pair from one block.
#[inline]
fn box_muller(blk: &[u32; 4], l: usize) -> f64 {
    // 1 - u lies in (0, 1], so the logarithm is finite.
    let u1 = 1.0 - unit_f64(blk[0], blk[1]);
    let u2 = unit_f64(blk[2], blk[3]);
    let r = (-2.0 * u1.ln()).sqrt();
    let theta = std::f64::consts::TAU * u2;
    if l == 0 {
        r * theta.cos()
    } else {
        r * theta.sin()
    }
}

/// The inverse error function on [-1, 1] (±inf at ±1, NaN outside): Giles'
/// single-precision approximation refined by three Halley steps on `erf`.
fn erfinv(y: f64) -> f64 {
    if !(-1.0..=1.0).contains(&y) {
        return f64::NAN;
    }
    if y.abs() == 1.0 {
        return y * f64::INFINITY;
    }
    let mut w = -((1.0 - y) * (1.0 + y)).ln();
    let p = if w < 5.0 {
        w -= 2.5;
        [
            3.432_739_39e-7,
            -3.523_387_7e-6,
            -4.391_506_54e-6,
            2.185_808_7e-4,
            -1.253_725_03e-3,
            -4.177_681_64e-3,
            2.466_407_27e-1,
            1.501_409_41,
        ]
        .iter()
        .fold(2.810_226_36e-8, |p, &c| c + p * w)
    } else {
        w = w.sqrt() - 3.0;
        [
            1.009_505_58e-4,
            1.349_343_22e-3,
            -3.673_428_44e-3,
            5.739_507_73e-3,
            -7.622_461_3e-3,
            9.438_870_47e-3,
            1.001_674_06,
            2.832_976_82,
        ]
        .iter()
        .fold(-2.002_142_57e-4, |p, &c| c + p * w)
    };
    let mut x = p * y;
    // Halley steps: erf'' / erf' = -2x, so the step is r / (1 + x r) with
    // r the Newton step. Plain Newton converges slowly in the flat tails.
    for _ in 0..3 {
        let r = (crate::erf(x) - y) / (std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp());
        let step = r / (1.0 + x * r);
        if step.is_finite() {
            x -= step;
        }
    }
    x
}

#[cfg(test)]
#[path = "random_tests.rs"]
mod tests;
