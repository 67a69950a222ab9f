//! Creation ops: zeros, ones, full, arange, linspace, eye and the `*_like`
//! variants. Every creation op takes [`TensorOptions`] (a [`DType`], or a
//! `(DType, Device)` pair); only [`Device::Cpu`] can be allocated until the
//! CUDA backend exists.

use crate::tensor::checked_numel;
use crate::{with_dtype, DType, Device, Element, Error, Result, Tensor};

/// The dtype and device of a tensor to create. Converts from a [`DType`]
/// (on the CPU) or a `(DType, Device)` pair, so creation ops accept either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorOptions {
    /// The element type.
    pub dtype: DType,
    /// The device to allocate on.
    pub device: Device,
}

impl Default for TensorOptions {
    /// f32 on the CPU (PyTorch's defaults).
    fn default() -> Self {
        TensorOptions {
            dtype: DType::F32,
            device: Device::Cpu,
        }
    }
}

impl From<DType> for TensorOptions {
    fn from(dtype: DType) -> Self {
        TensorOptions {
            dtype,
            device: Device::Cpu,
        }
    }
}

impl From<(DType, Device)> for TensorOptions {
    fn from((dtype, device): (DType, Device)) -> Self {
        TensorOptions { dtype, device }
    }
}

impl TensorOptions {
    /// Checks that a tensor of `shape` can be allocated with these options
    /// and returns its element count. Errors, naming `op`, for a non-CPU
    /// device or a size that overflows the address space.
    pub(crate) fn check(&self, op: &'static str, shape: &[usize]) -> Result<usize> {
        crate::backend::on_device(op, self.device)?.host_kernel(op)?;
        let numel = checked_numel(op, shape)?;
        let bytes = numel as u128 * self.dtype.size_in_bytes() as u128;
        if bytes > isize::MAX as u128 {
            return Err(Error::out_of_memory(
                op,
                format!(
                    "shape {shape:?} of {} needs {bytes} bytes, more than memory can hold",
                    self.dtype
                ),
            ));
        }
        Ok(numel)
    }
}

impl Tensor {
    /// A tensor of `shape` filled with zeros (on a GPU, written on the host
    /// and copied). Errors for a device that is not available or a shape
    /// too large to allocate.
    pub fn zeros(shape: &[usize], opts: impl Into<TensorOptions>) -> Result<Tensor> {
        Self::full_named("zeros", shape, 0.0, opts.into())
    }

    /// A tensor of `shape` filled with ones. Errors as [`Tensor::zeros`].
    pub fn ones(shape: &[usize], opts: impl Into<TensorOptions>) -> Result<Tensor> {
        Self::full_named("ones", shape, 1.0, opts.into())
    }

    /// A tensor of `shape` filled with `value` converted to the dtype (as
    /// [`Tensor::to_dtype`] converts; an i64 beyond 2^53 rounds through f64).
    /// Errors as [`Tensor::zeros`].
    pub fn full(shape: &[usize], value: f64, opts: impl Into<TensorOptions>) -> Result<Tensor> {
        Self::full_named("full", shape, value, opts.into())
    }

    /// A tensor of this shape and device filled with zeros, of `dtype` or,
    /// when `None`, of this tensor's dtype.
    pub fn zeros_like(&self, dtype: impl Into<Option<DType>>) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.like_options(dtype.into()))
    }

    /// As [`Tensor::zeros_like`], filled with ones.
    pub fn ones_like(&self, dtype: impl Into<Option<DType>>) -> Result<Tensor> {
        Tensor::ones(self.shape(), self.like_options(dtype.into()))
    }

    /// As [`Tensor::zeros_like`], filled with `value`.
    pub fn full_like(&self, value: f64, dtype: impl Into<Option<DType>>) -> Result<Tensor> {
        Tensor::full(self.shape(), value, self.like_options(dtype.into()))
    }

    /// `start, start + step, ...` up to but excluding `end`, like
    /// `torch.arange` with float arguments: `ceil((end - start) / step)`
    /// elements, element `i` being `start + i * step` computed in f64 and
    /// converted to the dtype (integer dtypes truncate toward zero). Errors
    /// when `step` is 0, an argument is not finite, the sign of `step` does
    /// not lead from `start` toward `end`, or the device is not the CPU.
    pub fn arange(start: f64, end: f64, step: f64, opts: impl Into<TensorOptions>) -> Result<Tensor> {
        let opts = opts.into();
        let op = "arange";
        if !(start.is_finite() && end.is_finite() && step.is_finite()) {
            return Err(Error::arg(
                op,
                format!("start {start}, end {end} and step {step} must be finite"),
            ));
        }
        check_step(op, step == 0.0, step > 0.0, start <= end, start >= end, || {
            format!("start {start}, end {end}, step {step}")
        })?;
        let len = ((end - start) / step).ceil();
        if len >= usize::MAX as f64 {
            return Err(Error::arg(
                op,
                format!("start {start}, end {end}, step {step} give {len} elements, too many"),
            ));
        }
        let n = len as usize;
        opts.check(op, &[n])?;
        with_dtype!(opts.dtype, T => Tensor::build::<T>(op, &[n], |out| {
            for (i, y) in out.iter_mut().enumerate() {
                *y = T::from_f64(start + i as f64 * step);
            }
        }))
    }

    /// `start, start + step, ...` up to but excluding `end` in exact integer
    /// arithmetic, like `torch.arange` with integer arguments:
    /// `ceil((end - start) / step)` elements, converted to the dtype. Errors
    /// when `step` is 0, its sign does not lead from `start` toward `end`,
    /// the dtype is bool, a value is not exactly representable in the dtype,
    /// or the device is not the CPU.
    pub fn arange_int(start: i64, end: i64, step: i64, opts: impl Into<TensorOptions>) -> Result<Tensor> {
        let opts = opts.into();
        let op = "arange_int";
        check_step(op, step == 0, step > 0, start <= end, start >= end, || {
            format!("start {start}, end {end}, step {step}")
        })?;
        let (s, e, st) = (start as i128, end as i128, step as i128);
        // ceil for either sign of step, exactly.
        let n = ((e - s) + st - st.signum()) / st;
        let last = s + (n - 1).max(0) * st;
        let (lo, hi) = exact_int_range(opts.dtype);
        if opts.dtype == DType::Bool || n > 0 && (s.min(last) < lo || s.max(last) > hi) {
            return Err(Error::dtype(
                op,
                format!(
                    "values from {start} to {last} are not all exactly representable in {}",
                    opts.dtype
                ),
            ));
        }
        let n = usize::try_from(n).map_err(|_| Error::arg(op, format!("{n} elements are too many")))?;
        opts.check(op, &[n])?;
        with_dtype!(opts.dtype, T => Tensor::build::<T>(op, &[n], |out| {
            for (i, y) in out.iter_mut().enumerate() {
                *y = T::from_i64((s + i as i128 * st) as i64);
            }
        }))
    }

    /// `steps` evenly spaced values from `start` to `end` inclusive, like
    /// `torch.linspace`: computed in f64 from the nearer end point (so both
    /// end points are exact) and converted to the dtype. Errors when an end
    /// point is not finite or the device is not the CPU.
    pub fn linspace(start: f64, end: f64, steps: usize, opts: impl Into<TensorOptions>) -> Result<Tensor> {
        let opts = opts.into();
        if !(start.is_finite() && end.is_finite()) {
            return Err(Error::arg(
                "linspace",
                format!("start {start} and end {end} must be finite"),
            ));
        }
        opts.check("linspace", &[steps])?;
        let step = if steps > 1 {
            (end - start) / (steps - 1) as f64
        } else {
            0.0
        };
        // Both end points exact: the first half counts from start, the rest from end.
        let half = (steps / 2).max(1);
        with_dtype!(opts.dtype, T => Tensor::build::<T>("linspace", &[steps], |out| {
            for (i, y) in out.iter_mut().enumerate() {
                let v = if i < half {
                    start + step * i as f64
                } else {
                    end - step * (steps - 1 - i) as f64
                };
                *y = T::from_f64(v);
            }
        }))
    }

    /// The `n × m` matrix with ones on the diagonal and zeros elsewhere
    /// (`m = n` when `None`). Errors as [`Tensor::zeros`].
    pub fn eye(n: usize, m: Option<usize>, opts: impl Into<TensorOptions>) -> Result<Tensor> {
        let opts = opts.into();
        let m = m.unwrap_or(n);
        opts.check("eye", &[n, m])?;
        with_dtype!(opts.dtype, T => Tensor::build::<T>("eye", &[n, m], |out| {
            for i in 0..n.min(m) {
                out[i * m + i] = T::ONE;
            }
        }))
    }

    /// Options with this tensor's device and `dtype` (this tensor's by default).
    pub(crate) fn like_options(&self, dtype: Option<DType>) -> TensorOptions {
        TensorOptions {
            dtype: dtype.unwrap_or(self.dtype()),
            device: self.device(),
        }
    }

    fn full_named(op: &'static str, shape: &[usize], value: f64, opts: TensorOptions) -> Result<Tensor> {
        crate::backend::on_device(op, opts.device)?.full(op, shape, value, opts)
    }

    /// The CPU kernel of the fills (`zeros`, `ones`, `full`, ...): fresh
    /// memory is zeroed, so +0 needs no pass of its own.
    pub(crate) fn full_cpu(
        op: &'static str,
        shape: &[usize],
        value: f64,
        opts: TensorOptions,
    ) -> Result<Tensor> {
        opts.check(op, shape)?;
        Ok(with_dtype!(opts.dtype, T => {
            if value.to_bits() == 0 {
                Tensor::build::<T>(op, shape, |_| {})?
            } else {
                let v = T::from_f64(value);
                Tensor::build::<T>(op, shape, |out| out.fill(v))?
            }
        }))
    }
}

/// The range of consecutive integers that `dtype` represents exactly.
pub(crate) fn exact_int_range(dtype: DType) -> (i128, i128) {
    match dtype {
        DType::F64 => (-(1 << 53), 1 << 53),
        DType::F32 => (-(1 << 24), 1 << 24),
        DType::F16 => (-(1 << 11), 1 << 11),
        DType::BF16 => (-(1 << 8), 1 << 8),
        DType::I64 => (i64::MIN as i128, i64::MAX as i128),
        DType::U32 => (0, u32::MAX as i128),
        DType::U8 => (0, u8::MAX as i128),
        DType::Bool => (0, 1),
    }
}

/// The checks `torch.arange` makes on its step.
fn check_step(
    op: &'static str,
    zero: bool,
    positive: bool,
    ascending: bool,
    descending: bool,
    args: impl Fn() -> String,
) -> Result<()> {
    if zero {
        return Err(Error::arg(op, format!("step must be non-zero ({})", args())));
    }
    if (positive && !ascending) || (!positive && !descending) {
        return Err(Error::arg(
            op,
            format!("the sign of step does not lead from start to end ({})", args()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::values_f64;

    #[test]
    fn constant_fills_every_dtype() {
        for dt in DType::ALL {
            let z = Tensor::zeros(&[2, 3], dt).unwrap();
            let o = Tensor::ones(&[2, 3], dt).unwrap();
            let f = Tensor::full(&[4], 2.0, (dt, Device::Cpu)).unwrap();
            assert_eq!((z.dtype(), o.dtype(), f.dtype()), (dt, dt, dt));
            assert_eq!(z.shape(), &[2, 3]);
            assert_eq!(values_f64(&z), vec![0.0; 6]);
            assert_eq!(values_f64(&o), vec![1.0; 6]);
            let want = if dt == DType::Bool { 1.0 } else { 2.0 };
            assert_eq!(values_f64(&f), vec![want; 4]);
        }
        assert_eq!(Tensor::zeros(&[], DType::F32).unwrap().numel(), 1);
        assert_eq!(Tensor::zeros(&[3, 0], DType::F32).unwrap().numel(), 0);
        assert!(Tensor::zeros(&[usize::MAX, 2], DType::F32).is_err());
        assert!(Tensor::zeros(&[usize::MAX / 4], DType::F64).is_err());
    }

    #[test]
    fn like_variants_keep_shape_and_take_dtype() {
        let a = Tensor::from_vec(vec![1u8; 6], &[3, 2]).unwrap().t().unwrap();
        let z = a.zeros_like(None).unwrap();
        assert_eq!((z.shape(), z.dtype()), (&[2usize, 3][..], DType::U8));
        let o = a.ones_like(DType::F64).unwrap();
        assert_eq!(o.to_vec::<f64>().unwrap(), vec![1.0; 6]);
        let f = a.full_like(-1.5, DType::F32).unwrap();
        assert_eq!(f.to_vec::<f32>().unwrap(), vec![-1.5; 6]);
    }

    #[test]
    fn arange_follows_torch_length_rule() {
        let cases: &[(f64, f64, f64, usize)] = &[
            (0.0, 5.0, 1.0, 5),
            (0.0, 1.0, 0.3, 4),
            (1.0, 2.5, 0.5, 3),
            (5.0, 0.0, -1.5, 4),
            (0.0, 0.0, 1.0, 0),
            (-1.0, 1.0, 0.1, 20),
        ];
        for &(s, e, st, n) in cases {
            let t = Tensor::arange(s, e, st, DType::F64).unwrap();
            assert_eq!(t.shape(), &[n], "arange({s}, {e}, {st})");
            let v = t.to_vec::<f64>().unwrap();
            for (i, &x) in v.iter().enumerate() {
                assert_eq!(x, s + i as f64 * st);
            }
        }
        let t = Tensor::arange(0.0, 3.0, 0.75, DType::I64).unwrap();
        assert_eq!(t.to_vec::<i64>().unwrap(), vec![0, 0, 1, 2]);
        assert!(Tensor::arange(0.0, 1.0, 0.0, DType::F32).is_err());
        assert!(Tensor::arange(0.0, 1.0, -1.0, DType::F32).is_err());
        assert!(Tensor::arange(1.0, 0.0, 1.0, DType::F32).is_err());
        assert!(Tensor::arange(0.0, f64::INFINITY, 1.0, DType::F32).is_err());
        assert!(Tensor::arange(0.0, 1e300, 1e-300, DType::F32).is_err());
    }

    #[test]
    fn arange_int_is_exact() {
        let cases: &[(i64, i64, i64, Vec<i64>)] = &[
            (0, 5, 1, vec![0, 1, 2, 3, 4]),
            (0, 10, 3, vec![0, 3, 6, 9]),
            (10, 0, -3, vec![10, 7, 4, 1]),
            (3, 3, 2, vec![]),
            (-2, 3, 2, vec![-2, 0, 2]),
        ];
        for (s, e, st, want) in cases {
            let t = Tensor::arange_int(*s, *e, *st, DType::I64).unwrap();
            assert_eq!(&t.to_vec::<i64>().unwrap(), want);
        }
        let big = Tensor::arange_int(i64::MAX - 2, i64::MAX, 1, DType::I64).unwrap();
        assert_eq!(big.to_vec::<i64>().unwrap(), vec![i64::MAX - 2, i64::MAX - 1]);
        let f = Tensor::arange_int(0, 4, 1, DType::F16).unwrap();
        assert_eq!(values_f64(&f), vec![0.0, 1.0, 2.0, 3.0]);
        assert!(Tensor::arange_int(0, 300, 1, DType::U8).is_err());
        assert!(Tensor::arange_int(-1, 3, 1, DType::U32).is_err());
        assert!(Tensor::arange_int(0, 2, 1, DType::Bool).is_err());
        assert!(Tensor::arange_int(0, 5, 0, DType::I64).is_err());
        assert!(Tensor::arange_int(5, 0, 1, DType::I64).is_err());
        assert!(Tensor::arange_int(i64::MIN, i64::MAX, 1, DType::I64).is_err());
    }

    #[test]
    fn linspace_hits_both_ends() {
        let t = Tensor::linspace(-1.0, 1.0, 5, DType::F64).unwrap();
        assert_eq!(t.to_vec::<f64>().unwrap(), vec![-1.0, -0.5, 0.0, 0.5, 1.0]);
        let t = Tensor::linspace(0.1, 0.7, 7, DType::F64)
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        assert_eq!((t[0], t[6]), (0.1, 0.7));
        for (i, x) in t.iter().enumerate() {
            assert!((x - (0.1 + 0.1 * i as f64)).abs() < 1e-15);
        }
        assert_eq!(
            Tensor::linspace(3.0, 9.0, 1, DType::F32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![3.0]
        );
        assert_eq!(Tensor::linspace(3.0, 9.0, 0, DType::F32).unwrap().numel(), 0);
        let i = Tensor::linspace(0.0, 10.0, 4, DType::I64).unwrap();
        assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 3, 6, 10]);
        assert!(Tensor::linspace(0.0, f64::NAN, 3, DType::F32).is_err());
    }

    #[test]
    fn extreme_arguments_are_ok_or_err_never_panic() {
        let specials = [
            0.0,
            1.0,
            -1.0,
            0.5,
            1e-300,
            -1e300,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for &s in &specials {
            for &e in &specials {
                for &st in &specials {
                    // Skip only valid requests too large to allocate in a test.
                    if ((e - s) / st).ceil() > 1e6 {
                        continue;
                    }
                    let _ = Tensor::arange(s, e, st, DType::F32);
                }
                let _ = Tensor::linspace(s, e, 5, DType::F16);
            }
        }
        let ints = [i64::MIN, i64::MIN + 1, -7, -1, 0, 1, 3, i64::MAX - 1, i64::MAX];
        for &s in &ints {
            for &e in &ints {
                for &st in &ints {
                    let n = (e as i128 - s as i128) / (st as i128).max(1);
                    if n.abs() > 1_000_000 && st.unsigned_abs() < 1 << 40 {
                        continue;
                    }
                    for dt in DType::ALL {
                        let _ = Tensor::arange_int(s, e, st, dt);
                    }
                }
            }
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn creation_on_a_gpu_needs_one() {
        match Tensor::zeros(&[2], (DType::F32, Device::Cuda(0))) {
            Ok(t) => assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0, 0.0]),
            Err(e) => assert!(matches!(e, Error::Device { .. }), "{e}"),
        }
        assert!(Tensor::arange(0.0, 3.0, 1.0, (DType::F32, Device::Cuda(1))).is_err());
    }

    #[test]
    fn eye_is_identity() {
        let e = Tensor::eye(3, None, DType::F32).unwrap();
        assert_eq!(
            e.to_vec::<f32>().unwrap(),
            vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        );
        let r = Tensor::eye(2, Some(3), DType::Bool).unwrap();
        assert_eq!(
            r.to_vec::<bool>().unwrap(),
            vec![true, false, false, false, true, false]
        );
        assert_eq!(Tensor::eye(0, Some(4), DType::I64).unwrap().shape(), &[0, 4]);
    }
}
