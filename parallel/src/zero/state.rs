//! The optimizer state of a ZeRO run as one unsharded state dict (what the
//! wrapped optimizer would hold on one process), and back.

use tessera_tensor::{with_float_dtype, Element, StateDict, Tensor};

use super::ZeroOptimizer;
use crate::comm::CommExt;
use crate::error::{CommError, Result};

impl ZeroOptimizer<'_> {
    /// The optimizer state gathered from every rank's partitions into the
    /// state dict of the wrapped optimizer on one process (DeepSpeed's
    /// `zero_to_fp32`): per-parameter buffers with the parameters' shapes
    /// (padding dropped), step counts and hyperparameters, loadable by that
    /// optimizer with `load_state_dict` and by
    /// [`ZeroOptimizer::load_consolidated`] at any world size. A
    /// collective; every rank gets the result. Errors when communication
    /// fails.
    pub fn consolidated_state_dict(&self) -> Result<StateDict> {
        let inner = self.inner.state_dict();
        let mut out = StateDict::new();
        for (key, v) in inner.metadata() {
            if !key.starts_with("state.") {
                out.set(key.clone(), v.clone());
            }
        }
        for (g, grp) in self.groups.iter().enumerate() {
            out.set(format!("group.{g}.params"), grp.group_len);
            let prefix = format!("state.{g}.");
            for (key, part) in inner.iter().filter(|(k, _)| k.starts_with(&prefix)) {
                let buf = &key[prefix.len()..];
                let full = self.gather(part, grp.layout.len)?;
                for ((p, &off), &k) in grp.params.iter().zip(&grp.layout.offsets).zip(&grp.index) {
                    let t = full
                        .narrow(0, off, p.numel())?
                        .view(p.shape().as_slice())?
                        .contiguous()?;
                    out.insert(format!("state.{k}.{buf}"), copy(&t)?);
                }
            }
            if let Ok(step) = inner.meta("ZeroOptimizer", &format!("state.{g}.step")) {
                for &k in &grp.index {
                    out.set(format!("state.{k}.step"), step.clone());
                }
            }
        }
        Ok(out)
    }

    /// Restores a state saved by [`ZeroOptimizer::consolidated_state_dict`]
    /// (at any world size) or by the wrapped optimizer on one process:
    /// each rank keeps its partition of every buffer. Errors, changing
    /// nothing, when the state does not fit the optimizer (kind, groups,
    /// shapes) or the parameters' step counts differ within a group.
    pub fn load_consolidated(&mut self, sd: &StateDict) -> Result<()> {
        const OP: &str = "ZeroOptimizer::load_consolidated";
        let rank = self.comm.rank();
        let mut inner = StateDict::new();
        for (key, v) in sd.metadata() {
            if !key.starts_with("state.") {
                inner.set(key.clone(), v.clone());
            }
        }
        for (g, grp) in self.groups.iter().enumerate() {
            inner.set(format!("group.{g}.params"), 1usize);
            let (lo, hi) = grp.layout.partition(rank);
            let first = grp.index[0];
            let names: Vec<String> = sd
                .keys()
                .filter_map(|k| k.strip_prefix(&format!("state.{first}.")).map(str::to_string))
                .collect();
            for buf in names {
                let mut flat: Option<Tensor> = None;
                for ((p, &off), &k) in grp.params.iter().zip(&grp.layout.offsets).zip(&grp.index) {
                    let t = sd.require_shape(OP, &format!("state.{k}.{buf}"), &p.shape())?;
                    let f = match &mut flat {
                        Some(f) => f,
                        slot @ None => slot.insert(Tensor::zeros(&[grp.layout.len], t.dtype())?),
                    };
                    if t.dtype() != f.dtype() {
                        return Err(CommError::arg(
                            OP,
                            format!("state.{k}.{buf} is {}, not {}", t.dtype(), f.dtype()),
                        ));
                    }
                    with_float_dtype!(t.dtype(), T => {
                        f.make_mut::<T>()?[off..off + p.numel()].copy_from_slice(&t.contiguous()?.to_vec::<T>()?);
                    }, else return Err(CommError::arg(OP, format!("state.{k}.{buf} is {}, not floating point", t.dtype()))));
                }
                if let Some(f) = flat {
                    inner.insert(format!("state.{g}.{buf}"), copy(&f.narrow(0, lo, hi - lo)?)?);
                }
            }
            let steps: Vec<String> = grp
                .index
                .iter()
                .filter_map(|k| {
                    sd.meta(OP, &format!("state.{k}.step"))
                        .ok()
                        .map(|v| v.to_string())
                })
                .collect();
            if steps.iter().any(|s| s != &steps[0]) {
                return Err(CommError::arg(
                    OP,
                    format!(
                        "group {g}: the parameters' step counts differ ({steps:?}); ZeRO keeps one per group"
                    ),
                ));
            }
            if let Ok(step) = sd.meta(OP, &format!("state.{first}.step")) {
                inner.set(format!("state.{g}.step"), step.clone());
            }
        }
        self.inner.load_state_dict(&inner)?;
        Ok(())
    }

    /// Every rank's `part` all-gathered into one tensor of `len` elements.
    fn gather(&self, part: &Tensor, len: usize) -> Result<Tensor> {
        with_float_dtype!(part.dtype(), T => {
            let mut full = vec![<T as Element>::ZERO; len];
            self.comm.all_gather_slice(&part.contiguous()?.to_vec::<T>()?, &mut full)?;
            Ok(Tensor::from_vec(full, &[len])?)
        }, else Err(CommError::arg("ZeroOptimizer::consolidated_state_dict", format!("state buffer of dtype {}", part.dtype()))))
    }
}

/// A copy of `t` in its own storage (a state dict must not pin the flat
/// buffer a view comes from).
fn copy(t: &Tensor) -> Result<Tensor> {
    with_float_dtype!(t.dtype(), T => Ok(Tensor::from_vec(t.to_vec::<T>()?, t.shape())?),
        else Err(CommError::arg("ZeroOptimizer", format!("state buffer of dtype {}", t.dtype()))))
}
