//! Flash-style attention forward and backward.

use super::Float;
use crate::launch::{check_len, mul, to_i32, to_i64, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::{Error, Result};

const TILE: usize = 32;
const THREADS: u32 = 128;

/// Sizes of an attention call: Q is [batch*heads, lq, head_dim], K and V
/// [batch*heads, lk, head_dim], all contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Batch size.
    pub batch: usize,
    /// Heads per batch element.
    pub heads: usize,
    /// Query length.
    pub lq: usize,
    /// Key/value length.
    pub lk: usize,
    /// Head dimension, 1..=128.
    pub head_dim: usize,
}

/// Masking and scaling of scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnMask {
    /// Multiplies q·k (usually 1/√head_dim).
    pub scale: f32,
    /// Key j is visible to query i only when j <= i + lk - lq.
    pub causal: bool,
    /// Optional valid key count per batch element ([batch] i32): keys at or
    /// past it are hidden.
    pub kv_len: Option<DevPtr<i32>>,
}

struct Checked {
    dmax: usize,
    bh: usize,
    ints: [Arg; 4],
}

fn check(op: &'static str, s: &AttnShape, m: &AttnMask, q: usize, kv: &[(&str, usize)]) -> Result<Checked> {
    if s.head_dim == 0 || s.head_dim > 128 {
        return Err(Error::arg(op, format!("head_dim {} outside 1..=128", s.head_dim)));
    }
    if !m.scale.is_finite() {
        return Err(Error::arg(op, format!("scale {} is not finite", m.scale)));
    }
    let bh = mul(op, s.batch, s.heads)?;
    if bh > 65_535 {
        return Err(Error::arg(op, format!("batch*heads = {bh} above 65535")));
    }
    let need_q = mul(op, mul(op, bh, s.lq)?, s.head_dim)?;
    let need_k = mul(op, mul(op, bh, s.lk)?, s.head_dim)?;
    if q < need_q {
        return Err(Error::arg(
            op,
            format!("a query-side buffer has {q} elements, needs {need_q}"),
        ));
    }
    for (what, len) in kv {
        if *len < need_k {
            return Err(Error::arg(
                op,
                format!("{what} has {len} elements, needs {need_k}"),
            ));
        }
    }
    if let Some(kl) = &m.kv_len {
        check_len(op, "kv_len", kl, s.batch)?;
    }
    Ok(Checked {
        dmax: if s.head_dim <= 64 { 64 } else { 128 },
        bh,
        ints: [
            Arg::i32(to_i32(op, "heads", s.heads)?),
            Arg::i32(to_i32(op, "lq", s.lq)?),
            Arg::i32(to_i32(op, "lk", s.lk)?),
            Arg::i32(s.head_dim as i32),
        ],
    })
}

fn kv_arg(m: &AttnMask) -> Arg {
    m.kv_len.map(Arg::ptr).unwrap_or_else(|| Arg::u64(0))
}

/// O = softmax(scale · Q Kᵀ + mask) V, and the row log-sum-exp `lse`
/// ([batch*heads, lq] f32) the backward needs. Rows that see no key get
/// O = 0 and lse = -inf.
///
/// Errors: head_dim outside 1..=128, buffers too short, non-finite scale.
#[allow(clippy::too_many_arguments)]
pub fn attention_fwd<T: Float>(
    s: &AttnShape,
    m: &AttnMask,
    q: DevPtr<T>,
    k: DevPtr<T>,
    v: DevPtr<T>,
    o: DevPtr<T>,
    lse: DevPtr<f32>,
) -> Result<Launch> {
    const OP: &str = "attention_fwd";
    let c = check(OP, s, m, q.len().min(o.len()), &[("k", k.len()), ("v", v.len())])?;
    check_len(OP, "lse", &lse, c.bh * s.lq)?;
    let [h, lq, lk, d] = c.ints;
    Ok(Launch {
        module: Module::Attention,
        kernel: format!("attn_fwd_{}_d{}", T::NAME, c.dmax),
        grid: [s.lq.div_ceil(TILE) as u32, c.bh as u32, 1],
        block: [THREADS, 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(q),
            Arg::ptr(k),
            Arg::ptr(v),
            Arg::ptr(o),
            Arg::ptr(lse),
            kv_arg(m),
            h,
            lq,
            lk,
            d,
            Arg::f32(m.scale),
            Arg::i32(m.causal as i32),
        ],
    })
}

/// Buffers of the attention backward.
#[derive(Debug, Clone, Copy)]
pub struct AttnGrads<T> {
    /// Gradient of O (input).
    pub d_o: DevPtr<T>,
    /// Gradient of Q (output).
    pub d_q: DevPtr<T>,
    /// Gradient of K (output).
    pub d_k: DevPtr<T>,
    /// Gradient of V (output).
    pub d_v: DevPtr<T>,
    /// f32 workspace of batch*heads*lq elements (rowsum(dO ∘ O)).
    pub workspace: DevPtr<f32>,
}

/// Gradients of [`attention_fwd`] from its output `o` and `lse`: three
/// launches to run in order (rowsum(dO∘O), dQ, dK/dV).
///
/// Errors: as [`attention_fwd`].
#[allow(clippy::too_many_arguments)]
pub fn attention_bwd<T: Float>(
    s: &AttnShape,
    m: &AttnMask,
    q: DevPtr<T>,
    k: DevPtr<T>,
    v: DevPtr<T>,
    o: DevPtr<T>,
    lse: DevPtr<f32>,
    g: &AttnGrads<T>,
) -> Result<Vec<Launch>> {
    const OP: &str = "attention_bwd";
    let qside = [q.len(), o.len(), g.d_o.len(), g.d_q.len()]
        .into_iter()
        .min()
        .unwrap_or(0);
    let c = check(
        OP,
        s,
        m,
        qside,
        &[
            ("k", k.len()),
            ("v", v.len()),
            ("d_k", g.d_k.len()),
            ("d_v", g.d_v.len()),
        ],
    )?;
    let rows = c.bh * s.lq;
    check_len(OP, "lse", &lse, rows)?;
    check_len(OP, "workspace", &g.workspace, rows)?;
    let dot = Launch {
        module: Module::Attention,
        kernel: format!("attn_bwd_dot_{}", T::NAME),
        grid: [rows.div_ceil(8) as u32, 1, 1],
        block: [256, 1, 1],
        shared_mem: 0,
        args: vec![
            Arg::ptr(o),
            Arg::ptr(g.d_o),
            Arg::ptr(g.workspace),
            Arg::i64(to_i64(OP, "rows", rows)?),
            Arg::i32(s.head_dim as i32),
        ],
    };
    let tail = |c: &Checked| {
        let [h, lq, lk, d] = c.ints.clone();
        vec![
            kv_arg(m),
            h,
            lq,
            lk,
            d,
            Arg::f32(m.scale),
            Arg::i32(m.causal as i32),
        ]
    };
    let mut dq_args = vec![
        Arg::ptr(q),
        Arg::ptr(k),
        Arg::ptr(v),
        Arg::ptr(g.d_o),
        Arg::ptr(lse),
        Arg::ptr(g.workspace),
        Arg::ptr(g.d_q),
    ];
    dq_args.extend(tail(&c));
    let mut dkdv_args = vec![
        Arg::ptr(q),
        Arg::ptr(k),
        Arg::ptr(v),
        Arg::ptr(g.d_o),
        Arg::ptr(lse),
        Arg::ptr(g.workspace),
        Arg::ptr(g.d_k),
        Arg::ptr(g.d_v),
    ];
    dkdv_args.extend(tail(&c));
    let dq = Launch {
        module: Module::Attention,
        kernel: format!("attn_bwd_dq_{}_d{}", T::NAME, c.dmax),
        grid: [s.lq.div_ceil(TILE) as u32, c.bh as u32, 1],
        block: [THREADS, 1, 1],
        shared_mem: 0,
        args: dq_args,
    };
    let dkdv = Launch {
        module: Module::Attention,
        kernel: format!("attn_bwd_dkdv_{}_d{}", T::NAME, c.dmax),
        grid: [s.lk.div_ceil(TILE) as u32, c.bh as u32, 1],
        block: [THREADS, 1, 1],
        shared_mem: 0,
        args: dkdv_args,
    };
    Ok(vec![dot, dq, dkdv])
}
