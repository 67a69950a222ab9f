//! Fused multi-tensor AdamW: one launch per parameter group.

use super::Float;
use crate::launch::{check_len, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::{Error, Result};

/// Elements one block updates.
const CHUNK: usize = 4096;
const THREADS: u32 = 256;

/// One parameter of a group: f32 master weights and moments, gradient in `G`.
#[derive(Debug, Clone, Copy)]
pub struct AdamTensor<G> {
    /// Parameter (updated in place).
    pub param: DevPtr<f32>,
    /// Gradient.
    pub grad: DevPtr<G>,
    /// First moment (updated in place).
    pub exp_avg: DevPtr<f32>,
    /// Second moment (updated in place).
    pub exp_avg_sq: DevPtr<f32>,
}

/// AdamW hyper-parameters for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// Step number, from 1 (for the bias corrections).
    pub step: u64,
    /// Gradients are multiplied by this first (1/loss_scale).
    pub grad_scale: f32,
}

/// Host tables of a group: 5 u64 per tensor and 2 u64 per chunk. Upload both
/// and pass them to [`adamw`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdamTables {
    /// (param, grad, exp_avg, exp_avg_sq, length) per tensor.
    pub tensors: Vec<u64>,
    /// (tensor index, first element) per block.
    pub chunks: Vec<u64>,
}

/// Builds the tables of a group.
///
/// Errors: a tensor whose four buffers differ in length.
pub fn adamw_tables<G: Float>(group: &[AdamTensor<G>]) -> Result<AdamTables> {
    let mut t = AdamTables {
        tensors: Vec::new(),
        chunks: Vec::new(),
    };
    for (i, p) in group.iter().enumerate() {
        let n = p.param.len();
        if p.grad.len() != n || p.exp_avg.len() != n || p.exp_avg_sq.len() != n {
            return Err(Error::arg(
                "adamw",
                format!(
                    "tensor {i}: param {n}, grad {}, exp_avg {}, exp_avg_sq {} elements",
                    p.grad.len(),
                    p.exp_avg.len(),
                    p.exp_avg_sq.len()
                ),
            ));
        }
        t.tensors.extend([
            p.param.addr(),
            p.grad.addr(),
            p.exp_avg.addr(),
            p.exp_avg_sq.addr(),
            n as u64,
        ]);
        t.chunks
            .extend((0..n).step_by(CHUNK).flat_map(|s| [i as u64, s as u64]));
    }
    Ok(t)
}

/// One AdamW step over a group whose tables (from [`adamw_tables`]) are on
/// the device. `n_chunks` is `tables.chunks.len() / 2`.
///
/// Errors: table buffers too short, step 0, betas outside [0, 1).
pub fn adamw<G: Float>(
    tensors: DevPtr<u64>,
    chunks: DevPtr<u64>,
    n_chunks: usize,
    c: &AdamConfig,
) -> Result<Launch> {
    const OP: &str = "adamw";
    check_len(OP, "chunks", &chunks, 2 * n_chunks)?;
    if tensors.is_empty() && n_chunks > 0 {
        return Err(Error::arg(OP, "empty tensor table"));
    }
    if c.step == 0 || !(0.0..1.0).contains(&c.beta1) || !(0.0..1.0).contains(&c.beta2) {
        return Err(Error::arg(
            OP,
            format!(
                "step {} (from 1), beta1 {}, beta2 {} (in [0, 1))",
                c.step, c.beta1, c.beta2
            ),
        ));
    }
    let t = c.step.min(i32::MAX as u64) as i32;
    let bc1 = 1.0 - (c.beta1 as f64).powi(t);
    let bc2 = 1.0 - (c.beta2 as f64).powi(t);
    let hyper = Arg::fields(&[
        Arg::f32(c.lr),
        Arg::f32(c.beta1),
        Arg::f32(c.beta2),
        Arg::f32(c.eps),
        Arg::f32(c.weight_decay),
        Arg::f32(bc1 as f32),
        Arg::f32(bc2 as f32),
        Arg::f32(c.grad_scale),
    ]);
    let grid =
        u32::try_from(n_chunks).map_err(|_| Error::arg(OP, format!("{n_chunks} chunks exceed the grid")))?;
    Ok(Launch {
        module: Module::AdamW,
        kernel: format!("adamw_{}", G::NAME),
        grid: [grid, 1, 1],
        block: [THREADS, 1, 1],
        shared_mem: 0,
        args: vec![Arg::ptr(tensors), Arg::ptr(chunks), Arg::i64(CHUNK as i64), hyper],
    })
}
