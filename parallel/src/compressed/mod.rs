//! [`CompressedAllReduce`]: DeepSpeed's error-compensated 1-bit all-reduce
//! (`NcclBackend.compressed_allreduce`, spec §4.1) over any
//! [`Communicator`], the [`CompressedReducer`] that `tessera-optim`'s
//! `OnebitAdam` and `OnebitLamb` exchange their momentum through.
//!
//! ```text
//! x = pad(m, P) + e_w ;  s_w = ‖x‖/√P ;  b = x ≥ 0 ;  e_w ← x − s_w(2b−1)
//! all-to-all of the packed bits (chunk j to rank j), all-gather of s_w
//! y = Σ_i (2b_i−1)·(s_w,i/n) + e_s   on this rank's chunk of P/n
//! s_s = ‖y‖/√(P/n) ;  c = y ≥ 0 ;  e_s ← y − s_s(2c−1)
//! all-gather of the packed c and of s_s ;  out[j·P/n + k] = s_s,j(2c_j,k − 1)
//! ```
//!
//! Bits travel as i64 words (the collectives' payload types), each chunk of
//! `P/(8n)` bytes padded to whole words; the byte counters include that
//! padding. The counts are what this rank's collectives send by their
//! algorithm: an all-to-all sends `n − 1` of its `n` blocks, an all-gather
//! forwards `n − 1` blocks around the ring, and an exact ring all-reduce of
//! `S` bytes sends `2(n − 1)/n · S`.

mod bits;

use tessera_optim::{padded_len, CompressedReducer, ErrorFeedback, WireStats};
use tessera_tensor::{Error, Result};

pub use bits::{packbits, unpackbits};

use crate::comm::{CommExt, Communicator};
use crate::error::CommError;
use bits::{pack_signs, sign_of};

/// The compressed all-reduce over a communicator, with per-call byte
/// counters. Build one per data-parallel rank and hand it to the optimizer
/// (`OnebitAdam::with_reducer`).
pub struct CompressedAllReduce<'c> {
    comm: &'c dyn Communicator,
    stats: WireStats,
}

impl<'c> CompressedAllReduce<'c> {
    /// A reducer over the ranks of `comm`.
    pub fn new(comm: &'c dyn Communicator) -> Self {
        CompressedAllReduce {
            comm,
            stats: WireStats::default(),
        }
    }

    /// The counters since the last [`CompressedReducer::take_wire_stats`],
    /// without resetting them.
    pub fn wire_stats(&self) -> WireStats {
        self.stats
    }
}

/// The bytes a ring all-reduce of `bytes` sends from each of `n` ranks.
pub fn ring_all_reduce_bytes(bytes: u64, n: usize) -> u64 {
    let n = n as u64;
    if n <= 1 {
        0
    } else {
        2 * (n - 1) * bytes / n
    }
}

impl CompressedReducer for CompressedAllReduce<'_> {
    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn compressed_all_reduce(&mut self, buf: &mut [f32], errors: &mut ErrorFeedback) -> Result<()> {
        const OP: &str = "compressed_all_reduce";
        let n = self.comm.world_size();
        let p = padded_len(buf.len(), n)?;
        let c = p / n;
        if errors.is_empty() {
            errors.worker = try_zeros(OP, p)?;
            errors.server = try_zeros(OP, c)?;
        } else if errors.worker.len() != p || errors.server.len() != c {
            return Err(Error::shape(
                OP,
                format!(
                    "error buffers of lengths {} and {} for {} elements over {n} ranks (expected {p} and {c})",
                    errors.worker.len(),
                    errors.server.len(),
                    buf.len()
                ),
            ));
        }
        let comm_err = |e: CommError| Error::io(OP, e.to_string());

        // Worker: error feedback, scale, signs.
        let we = &mut errors.worker;
        for (e, &m) in we.iter_mut().zip(buf.iter()) {
            *e += m;
        }
        // `we` now holds x; it becomes x − s_w·sign(x) below.
        let s_w = scale(we);
        let chunk_bytes = c / 8;
        let words = chunk_bytes.div_ceil(8);
        let mut send = try_zeros::<i64>(OP, n * words)?;
        {
            let send_bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut send);
            for j in 0..n {
                let dst = &mut send_bytes[j * words * 8..j * words * 8 + chunk_bytes];
                pack_signs(&we[j * c..(j + 1) * c], dst);
            }
        }
        for e in we.iter_mut() {
            *e -= if *e >= 0.0 { s_w } else { -s_w };
        }
        let mut recv = try_zeros::<i64>(OP, n * words)?;
        self.comm.all_to_all_slice(&send, &mut recv).map_err(comm_err)?;
        let mut worker_scales = vec![0f32; n];
        self.comm
            .all_gather_slice(&[s_w], &mut worker_scales)
            .map_err(comm_err)?;

        // Server: average this rank's chunk, compress it with its own error.
        let inv_n = 1.0 / n as f32;
        let weights: Vec<f32> = worker_scales.iter().map(|&s| s * inv_n).collect();
        let recv_bytes: &[u8] = bytemuck::cast_slice(&recv);
        let se = &mut errors.server;
        for (k, e) in se.iter_mut().enumerate() {
            let mut y = 0f32;
            for (i, &w) in weights.iter().enumerate() {
                y += sign_of(&recv_bytes[i * words * 8..], k) * w;
            }
            *e += y;
        }
        let s_s = scale(se);
        let mut mine = try_zeros::<i64>(OP, words)?;
        pack_signs(
            se,
            &mut bytemuck::cast_slice_mut::<i64, u8>(&mut mine)[..chunk_bytes],
        );
        for e in se.iter_mut() {
            *e -= if *e >= 0.0 { s_s } else { -s_s };
        }
        let mut gathered = try_zeros::<i64>(OP, n * words)?;
        self.comm
            .all_gather_slice(&mine, &mut gathered)
            .map_err(comm_err)?;
        let mut server_scales = vec![0f32; n];
        self.comm
            .all_gather_slice(&[s_s], &mut server_scales)
            .map_err(comm_err)?;

        // Every rank decodes the same gathered bits and scales.
        let gathered: &[u8] = bytemuck::cast_slice(&gathered);
        for (idx, out) in buf.iter_mut().enumerate() {
            let (j, k) = (idx / c, idx % c);
            *out = server_scales[j] * sign_of(&gathered[j * words * 8..], k);
        }

        let peers = (n - 1) as u64;
        self.stats.bit_bytes += 2 * peers * (words as u64) * 8;
        self.stats.scale_bytes += 2 * peers * 4;
        self.stats.compressed_calls += 1;
        Ok(())
    }

    fn take_wire_stats(&mut self) -> WireStats {
        std::mem::take(&mut self.stats)
    }
}

/// `‖x‖₂/√len` (accumulated in f64): the scale that preserves the norm.
fn scale(x: &[f32]) -> f32 {
    let sq: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    (sq.sqrt() / (x.len() as f64).sqrt()) as f32
}

/// `len` zeros, or an error naming `op` when the allocation fails.
fn try_zeros<T: Default + Clone>(op: &'static str, len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::arg(op, format!("cannot allocate {len} elements")))?;
    v.resize(len, T::default());
    Ok(v)
}
