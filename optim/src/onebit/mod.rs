//! Communication-compressed data-parallel optimizers (DeepSpeed's
//! `runtime/fp16/onebit`): [`OnebitAdam`] (Tang et al. 2021), [`OnebitLamb`]
//! (Li et al. 2021), [`ZeroOneAdam`] (Lu et al. 2022), and the
//! [`CompressedReducer`] they exchange their momentum through.
//!
//! # How they plug into data-parallel training
//!
//! The optimizers own their communication once compression starts; before
//! that they expect gradients averaged over the ranks, as every other
//! optimizer does. [`crate::Optimizer::wants_averaged_grads`] says which,
//! before each backward pass: DDP's `backward_for(loss, &opt)` all-reduces
//! the gradients when it returns true and hands back this rank's local
//! gradients, with no communication, when it returns false (DeepSpeed's
//! `enable_backward_allreduce = false`). The optimizer is built over a
//! [`CompressedReducer`]: `tessera-parallel`'s `CompressedAllReduce` over
//! any communicator, or none on a single process (the compressed exchange
//! is then skipped, as DeepSpeed skips it when `world_size == 1`).
//!
//! # The compressed all-reduce
//!
//! DeepSpeed's `NcclBackend.compressed_allreduce` (spec §4.1): every rank
//! adds its worker error to its buffer, sends the signs (one bit each, packed
//! most significant bit first) and one scale `‖x‖₂/√P` per rank, each rank
//! averages one chunk as a "server", compresses it again with its server
//! error, and the chunks' bits and scales are all-gathered. Every rank
//! builds the output from the same gathered bits and scales, so the result
//! is bitwise the same everywhere. Buffers are padded with zeros to
//! [`padded_len`]. The error buffers ([`ErrorFeedback`]) are rank-local:
//! they are never saved, and a checkpoint load zeroes them (DeepSpeed's
//! rule).

mod adam;
mod lamb;
mod slots;
mod zoadam;

use tessera_tensor::{Error, Result};

pub use adam::OnebitAdam;
pub use lamb::{OnebitLamb, OnebitLambConfig};
pub use slots::{OnebitOptions, DEFAULT_VARIANCE_MASK};
pub use zoadam::{ZeroOneAdam, ZeroOneAdamConfig, ZeroOneStep};

/// Exchanges buffers as signs plus scales with error feedback, averaging
/// them over the ranks of a data-parallel group (a collective: every rank
/// makes the same calls, in the same order, with the same lengths).
///
/// Defined here so that the optimizers do not depend on a transport;
/// `tessera-parallel` implements it over every communicator.
pub trait CompressedReducer: Send {
    /// The number of ranks the buffers are averaged over.
    fn world_size(&self) -> usize;

    /// This rank's index, `0 .. world_size()`.
    fn rank(&self) -> usize;

    /// Replaces `buf` (any length) by the error-compensated 1-bit average
    /// over the ranks, bitwise the same on every rank, and updates `errors`
    /// (sized on first use: [`ErrorFeedback::is_empty`] buffers become
    /// zeros of lengths `P` and `P/n`). Errors when `errors` holds buffers
    /// of other lengths, when the ranks' lengths differ, or when
    /// communication fails (naming the call).
    fn compressed_all_reduce(&mut self, buf: &mut [f32], errors: &mut ErrorFeedback) -> Result<()>;

    /// The bytes this rank put on the wire since the last call, and resets
    /// the counters.
    fn take_wire_stats(&mut self) -> WireStats;
}

/// Bytes a rank sent, by kind of exchange.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Sign bits (both phases, with the transport's word padding).
    pub bit_bytes: u64,
    /// Worker and server scales.
    pub scale_bytes: u64,
    /// Compressed all-reduce calls.
    pub compressed_calls: u64,
}

impl WireStats {
    /// Every byte sent.
    pub fn total(&self) -> u64 {
        self.bit_bytes + self.scale_bytes
    }
}

/// The worker and server error of one compressed buffer: lengths `P` and
/// `P/n` (see [`padded_len`]) once used, empty before.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ErrorFeedback {
    /// `x − s_w·sign(x)` of this rank's last compression (length `P`).
    pub worker: Vec<f32>,
    /// `y − s_s·sign(y)` of this rank's server chunk (length `P/n`).
    pub server: Vec<f32>,
}

impl ErrorFeedback {
    /// True before the first compression (and after [`ErrorFeedback::reset`]).
    pub fn is_empty(&self) -> bool {
        self.worker.is_empty() && self.server.is_empty()
    }

    /// Drops the errors (a checkpoint load does: they are rank-local).
    pub fn reset(&mut self) {
        self.worker = Vec::new();
        self.server = Vec::new();
    }
}

/// DeepSpeed's padded length `P` of a compressed buffer of `numel` elements
/// over `n` ranks: `numel` rounded up to a multiple of `n·lcm(n, 8)`, so
/// each rank's server chunk `P/n` is a whole number of bytes of bits.
/// Errors when `n == 0` or the length overflows.
pub fn padded_len(numel: usize, n: usize) -> Result<usize> {
    if n == 0 {
        return Err(Error::arg("padded_len", "the group size must be at least 1"));
    }
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let unit = n
        .checked_mul(8 / gcd(n, 8))
        .and_then(|divider| divider.checked_mul(n))
        .ok_or_else(|| Error::arg("padded_len", format!("group size {n} overflows")))?;
    numel
        .div_ceil(unit)
        .max(1)
        .checked_mul(unit)
        .ok_or_else(|| Error::arg("padded_len", format!("{numel} elements over {n} ranks overflow")))
}

#[cfg(test)]
mod tests;
