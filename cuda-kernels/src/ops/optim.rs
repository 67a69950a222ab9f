//! Fused multi-tensor optimizer steps (Adam/AdamW, SGD with momentum, LAMB):
//! one launch per parameter group (two for LAMB). The host builds a table of the group's
//! tensors and a table of chunks (one block each), uploads both, and the
//! kernel walks them; parameters and state are f32 (master weights), the
//! gradients f32, f16 or bf16.

use super::Float;
use crate::launch::{check_len, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::{Error, Result};

/// Elements one block updates.
const CHUNK: usize = 4096;
const THREADS: u32 = 256;

/// One parameter of an Adam group: f32 master weights and moments, gradient in `G`.
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

/// Adam hyper-parameters for one step, in f64 as the CPU optimizers take
/// them: the kernel gets each coefficient they derive (1 − β1, lr/(1 − β1ᵗ),
/// ...) computed in f64 and rounded once to f32, as they do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Weight decay: decoupled (AdamW, `p *= 1 - lr·wd`) or coupled (Adam,
    /// `g += wd·p`) as `decoupled` says.
    pub weight_decay: f64,
    /// AdamW's decoupled decay (true) or Adam's L2 term (false).
    pub decoupled: bool,
    /// Ascend instead of descend.
    pub maximize: bool,
    /// Step number, from 1 (for the bias corrections).
    pub step: u64,
    /// Gradients are multiplied by this first (1/loss_scale).
    pub grad_scale: f32,
}

/// Host tables of a group: 5 u64 per tensor and 2 u64 per chunk. Upload both
/// and pass them to [`adamw`] or [`sgd`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdamTables {
    /// (param, grad, state0, state1, length) per tensor.
    pub tensors: Vec<u64>,
    /// (tensor index, first element) per block.
    pub chunks: Vec<u64>,
}

/// Builds the tables of an Adam group.
///
/// Errors: a tensor whose four buffers differ in length.
pub fn adamw_tables<G: Float>(group: &[AdamTensor<G>]) -> Result<AdamTables> {
    tables(
        "adamw",
        group.iter().map(|p| {
            (
                [p.param.len(), p.grad.len(), p.exp_avg.len(), p.exp_avg_sq.len()],
                [
                    p.param.addr(),
                    p.grad.addr(),
                    p.exp_avg.addr(),
                    p.exp_avg_sq.addr(),
                ],
            )
        }),
    )
}

/// One SGD parameter: f32 master weights, gradient in `G`, and the f32
/// momentum buffer (`None` without momentum).
#[derive(Debug, Clone, Copy)]
pub struct SgdTensor<G> {
    /// Parameter (updated in place).
    pub param: DevPtr<f32>,
    /// Gradient.
    pub grad: DevPtr<G>,
    /// Momentum buffer (updated in place).
    pub momentum_buffer: Option<DevPtr<f32>>,
}

/// SGD hyper-parameters for one step (`torch.optim.SGD`), in f64 as
/// [`AdamConfig`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: f64,
    /// Momentum (0: none, and no buffers).
    pub momentum: f64,
    /// Dampening of the gradient in the momentum update.
    pub dampening: f64,
    /// Coupled weight decay (`g += wd·p`).
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Ascend instead of descend.
    pub maximize: bool,
    /// The momentum buffers are new this step: they start as the gradient.
    pub fresh: bool,
    /// Gradients are multiplied by this first (1/loss_scale).
    pub grad_scale: f32,
}

/// Builds the tables of an SGD group.
///
/// Errors: a tensor whose buffers differ in length, or a momentum buffer
/// missing on some tensors only.
pub fn sgd_tables<G: Float>(group: &[SgdTensor<G>]) -> Result<AdamTables> {
    if group.iter().any(|t| t.momentum_buffer.is_some()) && group.iter().any(|t| t.momentum_buffer.is_none())
    {
        return Err(Error::arg(
            "sgd",
            "momentum buffers on some tensors of the group only",
        ));
    }
    tables(
        "sgd",
        group.iter().map(|p| {
            let b = p.momentum_buffer.unwrap_or(DevPtr::from_raw(0, p.param.len()));
            (
                [p.param.len(), p.grad.len(), b.len(), p.param.len()],
                [p.param.addr(), p.grad.addr(), b.addr(), 0],
            )
        }),
    )
}

fn tables(op: &'static str, rows: impl Iterator<Item = ([usize; 4], [u64; 4])>) -> Result<AdamTables> {
    let mut t = AdamTables {
        tensors: Vec::new(),
        chunks: Vec::new(),
    };
    for (i, (lens, addrs)) in rows.enumerate() {
        let n = lens[0];
        if lens.iter().any(|&l| l != n) {
            return Err(Error::arg(
                op,
                format!("tensor {i}: buffers of {lens:?} elements (param, grad, state, state)"),
            ));
        }
        t.tensors.extend(addrs);
        t.tensors.push(n as u64);
        t.chunks
            .extend((0..n).step_by(CHUNK).flat_map(|s| [i as u64, s as u64]));
    }
    Ok(t)
}

/// One Adam/AdamW step over a group whose tables (from [`adamw_tables`])
/// are on the device. `n_chunks` is `tables.chunks.len() / 2`. The element
/// math is `torch.optim.Adam(W)`'s single-tensor form in f32.
///
/// Errors: table buffers too short, step 0, betas outside [0, 1).
pub fn adamw<G: Float>(
    tensors: DevPtr<u64>,
    chunks: DevPtr<u64>,
    n_chunks: usize,
    c: &AdamConfig,
) -> Result<Launch> {
    const OP: &str = "adamw";
    check_tables(OP, &tensors, &chunks, n_chunks)?;
    if c.step == 0 || !(0.0..1.0).contains(&c.beta1) || !(0.0..1.0).contains(&c.beta2) {
        return Err(Error::arg(
            OP,
            format!(
                "step {} (from 1), beta1 {}, beta2 {} (in [0, 1))",
                c.step, c.beta1, c.beta2
            ),
        ));
    }
    // The scalars as the CPU optimizer forms them: in f64, then rounded.
    let t = c.step.min(i32::MAX as u64) as i32;
    let (lr, wd) = (c.lr, c.weight_decay);
    let bc1 = 1.0 - c.beta1.powi(t);
    let bc2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
    let flags = if c.weight_decay != 0.0 {
        if c.decoupled {
            1
        } else {
            2
        }
    } else {
        0
    } | if c.maximize { 4 } else { 0 };
    let hyper = Arg::fields(&[
        Arg::f32((lr / bc1) as f32),
        Arg::f32(bc2_sqrt as f32),
        Arg::f32((1.0 - c.beta1) as f32),
        Arg::f32(c.beta2 as f32),
        Arg::f32((1.0 - c.beta2) as f32),
        Arg::f32(c.eps as f32),
        Arg::f32((1.0 - lr * wd) as f32),
        Arg::f32(wd as f32),
        Arg::f32(c.grad_scale),
        Arg::i32(flags),
    ]);
    multi_launch(OP, format!("adam_{}", G::NAME), tensors, chunks, n_chunks, hyper)
}

/// One SGD step over a group whose tables (from [`sgd_tables`]) are on the
/// device, in `torch.optim.SGD`'s single-tensor form in f32.
///
/// Errors: table buffers too short, Nesterov without momentum.
pub fn sgd<G: Float>(
    tensors: DevPtr<u64>,
    chunks: DevPtr<u64>,
    n_chunks: usize,
    c: &SgdConfig,
) -> Result<Launch> {
    const OP: &str = "sgd";
    check_tables(OP, &tensors, &chunks, n_chunks)?;
    if c.nesterov && c.momentum <= 0.0 {
        return Err(Error::arg(OP, "Nesterov momentum needs a momentum"));
    }
    let flag = |b: bool, f: i32| if b { f } else { 0 };
    let flags = flag(c.weight_decay != 0.0, 1)
        | flag(c.maximize, 2)
        | flag(c.nesterov, 4)
        | flag(c.momentum != 0.0, 8)
        | flag(c.fresh, 16);
    let hyper = Arg::fields(&[
        Arg::f32(c.lr as f32),
        Arg::f32(c.weight_decay as f32),
        Arg::f32(c.momentum as f32),
        Arg::f32((1.0 - c.dampening) as f32),
        Arg::f32(c.grad_scale),
        Arg::i32(flags),
    ]);
    multi_launch(OP, format!("sgd_{}", G::NAME), tensors, chunks, n_chunks, hyper)
}

/// LAMB hyper-parameters for one step (timm `Lamb`, apex `FusedLAMB`), in
/// f64 as [`AdamConfig`]; the moments are [`adamw_tables`]' two states.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LambConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Weight decay λ (added to the update, or decoupled).
    pub weight_decay: f64,
    /// Divide the moments by 1 − βᵗ.
    pub bias_correction: bool,
    /// Scale the gradient by 1 − β1 in the first moment (else 1).
    pub grad_averaging: bool,
    /// Clip the trust ratio at 1.
    pub trust_clip: bool,
    /// Apply the trust ratio without weight decay too.
    pub always_adapt: bool,
    /// θ ← θ − γλθ before the update instead of adding λθ to it.
    pub decoupled_decay: bool,
    /// Step number, from 1.
    pub step: u64,
    /// The gradients are divided by this (the global norm clipping, ≥ 1).
    pub clip: f64,
    /// Gradients are multiplied by this first (1/loss_scale).
    pub grad_scale: f32,
}

/// One LAMB step over a group whose tables (from [`adamw_tables`]) are on
/// the device: the moments and per-chunk squared norms of θ and of the
/// update into `partials` (2 f32 per chunk), then each tensor's trust ratio
/// and the parameter update. Launch both, in order.
///
/// Errors: table or partials buffers too short, step 0, betas outside
/// [0, 1), a clip factor below 1 or not finite.
pub fn lamb<G: Float>(
    tensors: DevPtr<u64>,
    chunks: DevPtr<u64>,
    n_chunks: usize,
    partials: DevPtr<f32>,
    c: &LambConfig,
) -> Result<[Launch; 2]> {
    const OP: &str = "lamb";
    check_tables(OP, &tensors, &chunks, n_chunks)?;
    check_len(OP, "partials", &partials, 2 * n_chunks)?;
    let valid = c.step != 0
        && (0.0..1.0).contains(&c.beta1)
        && (0.0..1.0).contains(&c.beta2)
        && c.clip.is_finite()
        && c.clip >= 1.0;
    if !valid {
        return Err(Error::arg(
            OP,
            format!(
                "step {} (from 1), beta1 {}, beta2 {} (in [0, 1)), clip {} (finite, ≥ 1)",
                c.step, c.beta1, c.beta2, c.clip
            ),
        ));
    }
    // The scalars as the CPU rule forms them: in f64, then rounded.
    let t = c.step.min(i32::MAX as u64) as i32;
    let (bc1, bc2) = if c.bias_correction {
        (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t))
    } else {
        (1.0, 1.0)
    };
    let use_wd = c.weight_decay != 0.0;
    let flag = |b: bool, f: i32| if b { f } else { 0 };
    let flags = flag(use_wd && !c.decoupled_decay, 1)
        | flag(use_wd && c.decoupled_decay, 2)
        | flag(use_wd || c.always_adapt, 4)
        | flag(c.trust_clip, 8);
    let hyper = Arg::fields(&[
        Arg::f32(c.lr as f32),
        Arg::f32(c.beta1 as f32),
        Arg::f32(c.beta2 as f32),
        Arg::f32(if c.grad_averaging { 1.0 - c.beta1 } else { 1.0 } as f32),
        Arg::f32((1.0 - c.beta2) as f32),
        Arg::f32(bc1 as f32),
        Arg::f32(bc2.sqrt() as f32),
        Arg::f32(c.eps as f32),
        Arg::f32(c.weight_decay as f32),
        Arg::f32((-c.lr * c.weight_decay) as f32),
        Arg::f32(c.clip as f32),
        Arg::f32(c.grad_scale),
        Arg::i32(flags),
    ]);
    let mut moments = multi_launch(
        OP,
        format!("lamb_moments_{}", G::NAME),
        tensors,
        chunks,
        n_chunks,
        hyper.clone(),
    )?;
    moments.args.push(Arg::ptr(partials));
    let mut apply = multi_launch(
        OP,
        format!("lamb_apply_{}", G::NAME),
        tensors,
        chunks,
        n_chunks,
        hyper,
    )?;
    apply.args.push(Arg::ptr(partials));
    Ok([moments, apply])
}

fn check_tables(
    op: &'static str,
    tensors: &DevPtr<u64>,
    chunks: &DevPtr<u64>,
    n_chunks: usize,
) -> Result<()> {
    check_len(op, "chunks", chunks, 2 * n_chunks)?;
    if tensors.is_empty() && n_chunks > 0 {
        return Err(Error::arg(op, "empty tensor table"));
    }
    Ok(())
}

fn multi_launch(
    op: &'static str,
    kernel: String,
    tensors: DevPtr<u64>,
    chunks: DevPtr<u64>,
    n_chunks: usize,
    hyper: Arg,
) -> Result<Launch> {
    let grid =
        u32::try_from(n_chunks).map_err(|_| Error::arg(op, format!("{n_chunks} chunks exceed the grid")))?;
    Ok(Launch {
        module: Module::Optim,
        kernel,
        grid: [grid, 1, 1],
        block: [THREADS, 1, 1],
        shared_mem: 0,
        args: vec![Arg::ptr(tensors), Arg::ptr(chunks), Arg::i64(CHUNK as i64), hyper],
    })
}
