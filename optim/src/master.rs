//! f32 master weights for f16/bf16 parameters (apex's O2, DeepSpeed's and
//! Megatron's mixed-precision optimizers): the optimizer keeps an f32 copy
//! of each low-precision parameter and f32 state buffers, updates the copy
//! from the gradient cast to f32, and writes the copy, rounded, back into
//! the parameter. An update smaller than half an f16/bf16 ulp of the weight
//! then accumulates in the master instead of being rounded away, and the
//! per-parameter memory is ZeRO's 2 (weight) + 2 (gradient) + 4 (master) +
//! 4·k (k state buffers) bytes.

use tessera_autograd::Parameter;
use tessera_tensor::{bf16, f16, DType, Error, Result, Tensor};

/// True for the dtypes whose parameters get an f32 master copy.
pub(crate) fn needs_master(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// The dtype of a parameter's optimizer state (master and buffers): f32
/// for f16/bf16 parameters, the parameter's own dtype otherwise.
pub(crate) fn state_dtype(param: DType) -> DType {
    if needs_master(param) {
        DType::F32
    } else {
        param
    }
}

/// Writes `master` (f32, `p`'s shape) rounded to nearest into the f16/bf16
/// parameter `p`, in place when nothing else holds its value. Errors when
/// `p` is not f16/bf16 or the master is not f32.
pub(crate) fn write_back(p: &Parameter, master: &Tensor) -> Result<()> {
    let m = master.as_slice::<f32>()?;
    match p.dtype() {
        DType::F16 => p.update_::<f16, _>(|x| {
            x.iter_mut().zip(m).for_each(|(o, &v)| *o = f16::from_f32(v));
        }),
        DType::BF16 => p.update_::<bf16, _>(|x| {
            x.iter_mut().zip(m).for_each(|(o, &v)| *o = bf16::from_f32(v));
        }),
        d => Err(Error::dtype(
            "step",
            format!("master weights are kept for f16/bf16 parameters, not {d}"),
        )),
    }
}

#[cfg(test)]
#[path = "master_tests.rs"]
mod tests;
