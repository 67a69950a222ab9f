//! Gradient checking: analytic gradients from backward against central
//! finite differences, in f64.

use std::collections::BTreeSet;

use tessera_tensor::{DType, Error, Result, Tensor};

use crate::node::NodeKind;
use crate::{no_grad, Var};

/// Step and tolerances of [`gradcheck`]. An element passes when
/// `|analytic − numeric| ≤ atol + rtol·|numeric|`.
#[derive(Debug, Clone, Copy)]
pub struct GradcheckOptions {
    /// Finite-difference step.
    pub eps: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Default for GradcheckOptions {
    /// PyTorch's `gradcheck` defaults: eps 1e-6, atol 1e-5, rtol 1e-3.
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-6,
            atol: 1e-5,
            rtol: 1e-3,
        }
    }
}

/// What a passing [`gradcheck`] saw.
#[derive(Debug, Clone)]
pub struct GradcheckReport {
    /// Names of the recorded ops in the checked graph.
    pub ops: BTreeSet<&'static str>,
    /// The largest |analytic − numeric| over all checked elements.
    pub max_abs_err: f64,
}

/// Checks the gradients of `f` at `inputs` (f64 tensors; each becomes a leaf
/// that requires grad). The output is projected onto fixed pseudo-random
/// weights `w` (so every output element matters), the analytic gradient of
/// `Σ w·f(x)` comes from backward, and each input element is perturbed by
/// ±eps for the central difference.
///
/// Returns an `Err` naming the input, the element and both values at the
/// first mismatch, or when an input is not f64, `f` fails, or backward fails.
pub fn gradcheck(
    f: impl Fn(&[Var]) -> Result<Var>,
    inputs: &[Tensor],
    opts: GradcheckOptions,
) -> Result<GradcheckReport> {
    if let Some(bad) = inputs.iter().find(|t| t.dtype() != DType::F64) {
        return Err(Error::dtype(
            "gradcheck",
            format!("inputs must be float64, got {}", bad.dtype()),
        ));
    }
    let inputs = inputs
        .iter()
        .map(Tensor::contiguous)
        .collect::<Result<Vec<Tensor>>>()?;
    let leaves: Vec<Var> = inputs.iter().cloned().map(Var::leaf).collect();
    let out = f(&leaves)?;
    if out.dtype() != DType::F64 {
        return Err(Error::dtype(
            "gradcheck",
            format!("output must be float64, got {}", out.dtype()),
        ));
    }
    let ops = op_names(&out);
    let w: Vec<f64> = projection(out.numel());
    let w_t = Tensor::from_vec(w.clone(), out.shape())?;
    let grads = out.backward_with(&w_t)?;

    let project = |xs: &[Tensor]| -> Result<f64> {
        let vars: Vec<Var> = xs.iter().cloned().map(Var::constant).collect();
        let y = no_grad(|| f(&vars))?.tensor().contiguous()?.to_vec::<f64>()?;
        Ok(y.iter().zip(&w).map(|(a, b)| a * b).sum())
    };
    let mut max_abs_err = 0.0f64;
    for (i, leaf) in leaves.iter().enumerate() {
        let analytic = match grads.get(leaf) {
            Some(g) => g.contiguous()?.to_vec::<f64>()?,
            None => vec![0.0; leaf.numel()],
        };
        let base = inputs[i].to_vec::<f64>()?;
        for j in 0..base.len() {
            let mut perturbed = inputs.clone();
            let mut at = |delta: f64| -> Result<f64> {
                let mut v = base.clone();
                v[j] += delta;
                perturbed[i] = Tensor::from_vec(v, inputs[i].shape())?;
                project(&perturbed)
            };
            let numeric = (at(opts.eps)? - at(-opts.eps)?) / (2.0 * opts.eps);
            let err = (analytic[j] - numeric).abs();
            max_abs_err = max_abs_err.max(err);
            if err.is_nan() || err > opts.atol + opts.rtol * numeric.abs() {
                return Err(Error::arg(
                    "gradcheck",
                    format!(
                        "gradient mismatch for input {i} (shape {:?}) at flat index {j}: analytic {} vs numeric {numeric} (ops {ops:?})",
                        inputs[i].shape(),
                        analytic[j]
                    ),
                ));
            }
        }
    }
    Ok(GradcheckReport { ops, max_abs_err })
}

/// Names of the recorded ops reachable from `out`.
pub fn op_names(out: &Var) -> BTreeSet<&'static str> {
    let mut names = BTreeSet::new();
    let mut seen = std::collections::HashSet::new();
    let mut stack: Vec<_> = out.edge().map(|e| e.node.clone()).into_iter().collect();
    while let Some(node) = stack.pop() {
        if !seen.insert(node.id) {
            continue;
        }
        if let NodeKind::Op { name, inputs, .. } = &node.kind {
            names.insert(*name);
            stack.extend(inputs.iter().flatten().map(|e| e.node.clone()));
        }
    }
    names
}

/// Fixed weights in [0.5, 1.5) with alternating sign, so no output element
/// can hide another's error by cancellation.
fn projection(n: usize) -> Vec<f64> {
    let mut s: u64 = 0x2545_F491_4F6C_DD1D;
    (0..n)
        .map(|k| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mag = 0.5 + (s >> 11) as f64 / (1u64 << 53) as f64;
            if k % 2 == 0 {
                mag
            } else {
                -mag
            }
        })
        .collect()
}
