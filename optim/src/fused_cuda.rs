//! Steps for parameters on a GPU (feature `cuda`): every parameter of a
//! group whose gradient is on a device is updated by one fused
//! multi-tensor kernel of `tessera-tensor` (Adam/AdamW, SGD or LAMB, as the
//! rule's [`Rule::device_step`] says), in place, per distinct (step count,
//! fresh-buffer) pair; the CPU parameters of the group take the CPU path.

use tessera_autograd::{Gradients, Parameter, ValueMut};
use tessera_tensor::fused_optim::{adam_step_, lamb_step_, sgd_step_, AdamConfig, LambConfig, SgdConfig};
use tessera_tensor::{Error, Result, Tensor};

use super::{DeviceStep, ParamState, Rule};

/// Steps every parameter of one group whose gradient is on a GPU.
///
/// Errors: the rule (or these options of it) has no fused kernel, and the
/// errors of the kernels (parameters not f32, a device failure).
pub(super) fn step<R: Rule>(
    rule: &R,
    h: &R::Hyper,
    params: &[Parameter],
    states: &mut [ParamState],
    grads: &Gradients,
) -> Result<()> {
    let on_device: Vec<usize> = (0..params.len())
        .filter(|&i| params[i].grad(grads).is_some_and(|g| !g.device().is_cpu()))
        .collect();
    if on_device.is_empty() {
        return Ok(());
    }
    let kernel = rule.device_step(h).ok_or_else(|| {
        Error::device(
            "step",
            format!(
                "{} has no fused GPU kernel for these options (Adam/AdamW without amsgrad, SGD and LAMB have one); move the parameters to the CPU",
                R::NAME
            ),
        )
    })?;
    let names = R::buffers(h);
    let mut keys = Vec::with_capacity(on_device.len());
    for &i in &on_device {
        let st = &mut states[i];
        let fresh = st.ensure(names, h, &params[i], R::init_value)?;
        st.step += 1;
        keys.push((st.step, fresh));
    }
    let mut distinct = keys.clone();
    distinct.sort_unstable();
    distinct.dedup();
    for key in distinct {
        let members: Vec<usize> = on_device
            .iter()
            .zip(&keys)
            .filter(|(_, k)| **k == key)
            .map(|(&i, _)| i)
            .collect();
        launch(kernel, key, names, params, states, grads, &members)?;
    }
    Ok(())
}

/// One fused launch over the parameters `members` (ascending indices), all
/// at step `step` with buffers `fresh` or not.
fn launch(
    kernel: DeviceStep,
    (step, fresh): (u64, bool),
    names: &[&'static str],
    params: &[Parameter],
    states: &mut [ParamState],
    grads: &Gradients,
    members: &[usize],
) -> Result<()> {
    let gs: Vec<&Tensor> = members
        .iter()
        .map(|&i| params[i].grad(grads).expect("members have a gradient"))
        .collect();
    let mut guards: Vec<ValueMut<'_>> = members.iter().map(|&i| params[i].value_mut()).collect();
    let mut ps: Vec<&mut Tensor> = guards.iter_mut().map(|g| &mut **g).collect();
    // The state buffers by name, in member order.
    let mut bufs: Vec<Vec<&mut Tensor>> = names.iter().map(|_| Vec::new()).collect();
    for (_, st) in states.iter_mut().enumerate().filter(|(i, _)| members.contains(i)) {
        for (name, t) in st.bufs.iter_mut() {
            if let Some(j) = names.iter().position(|n| n == name) {
                bufs[j].push(t);
            }
        }
    }
    match kernel {
        DeviceStep::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            maximize,
        } => {
            let [m, v] = &mut bufs[..] else {
                return Err(Error::arg(
                    "step",
                    "Adam steps on a GPU need exactly its two moment buffers",
                ));
            };
            let c = AdamConfig {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
                maximize,
                step,
                grad_scale: 1.0,
            };
            adam_step_(&mut ps, &gs, m, v, &c)
        }
        DeviceStep::Lamb {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            bias_correction,
            grad_averaging,
            trust_clip,
            always_adapt,
            decoupled_decay,
            clip,
        } => {
            let [m, v] = &mut bufs[..] else {
                return Err(Error::arg(
                    "step",
                    "LAMB steps on a GPU need exactly its two moment buffers",
                ));
            };
            let c = LambConfig {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                bias_correction,
                grad_averaging,
                trust_clip,
                always_adapt,
                decoupled_decay,
                step,
                clip,
                grad_scale: 1.0,
            };
            lamb_step_(&mut ps, &gs, m, v, &c)
        }
        DeviceStep::Sgd {
            lr,
            momentum,
            dampening,
            weight_decay,
            nesterov,
            maximize,
        } => {
            let mut none = Vec::new();
            let buf = bufs.first_mut().unwrap_or(&mut none);
            let c = SgdConfig {
                lr,
                momentum,
                dampening,
                weight_decay,
                nesterov,
                maximize,
                fresh,
                grad_scale: 1.0,
            };
            sgd_step_(&mut ps, &gs, buf, &c)
        }
    }
}

#[cfg(test)]
#[path = "fused_cuda_tests.rs"]
mod tests;
