//! The guard of every op without a CUDA path: `cpu_only!(op, operands..)`
//! (see `ops/mod.rs`) on its first line turns a GPU operand into an
//! [`Error::Device`] before any CPU kernel can touch device memory, and
//! operands on different devices into an error naming both.

use std::borrow::Borrow;

use crate::{Device, Error, Result, Tensor};

/// What an op can take as tensor operands: a tensor, an optional one, or a
/// slice of them.
pub(crate) trait Operands {
    /// Calls `f` with the device of each tensor.
    fn devices(&self, f: &mut dyn FnMut(Device));
}

impl Operands for Tensor {
    fn devices(&self, f: &mut dyn FnMut(Device)) {
        f(self.device());
    }
}

impl<T: Operands + ?Sized> Operands for &T {
    fn devices(&self, f: &mut dyn FnMut(Device)) {
        (**self).devices(f);
    }
}

impl Operands for Option<&Tensor> {
    fn devices(&self, f: &mut dyn FnMut(Device)) {
        if let Some(t) = self {
            f(t.device());
        }
    }
}

impl<T: Borrow<Tensor>> Operands for [T] {
    fn devices(&self, f: &mut dyn FnMut(Device)) {
        for t in self {
            f(t.borrow().device());
        }
    }
}

/// `Ok(())` when every operand is in host memory. Errors, naming `op`:
/// operands on different devices (the error names both), or operands on a
/// GPU (`op` has no CUDA path).
pub(crate) fn host_only(op: &'static str, operands: &[&dyn Operands]) -> Result<()> {
    match same_device(op, operands)? {
        Some(d @ Device::Cuda(_)) => Err(no_kernel(op, d, "this op")),
        _ => Ok(()),
    }
}

/// The device every operand is on (`None` without operands). Errors,
/// naming `op` and both devices, when they differ: the first check of a
/// CUDA path, before it touches any device.
pub(crate) fn same_device(op: &'static str, operands: &[&dyn Operands]) -> Result<Option<Device>> {
    let mut first = None;
    let mut other = None;
    for o in operands {
        o.devices(&mut |d| match first {
            None => first = Some(d),
            Some(f) if f != d && other.is_none() => other = Some(d),
            _ => {}
        });
    }
    match (first, other) {
        (Some(a), Some(b)) => Err(Error::device(
            op,
            format!("operands are on different devices ({a} and {b}); move them to one device with .to_device first"),
        )),
        _ => Ok(first),
    }
}

/// The error for an op (or a dtype of it) without a CUDA kernel.
pub(crate) fn no_kernel(op: &'static str, dev: Device, what: impl std::fmt::Display) -> Error {
    Error::device(
        op,
        format!("not implemented on {dev} for {what}; call .to_device(Device::Cpu) first"),
    )
}

impl Tensor {
    /// `Err` naming `op` and the device when `self` is on a GPU: the guard
    /// of the CPU engines (`zip_map`, `make_mut`, ...).
    pub(crate) fn cpu_only(&self, op: &'static str) -> Result<()> {
        host_only(op, &[self])
    }
}
