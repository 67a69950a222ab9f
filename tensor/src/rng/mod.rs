//! Random number generation: a counter-based Philox4x32-10 [`Generator`]
//! whose stream is a pure function of `(seed, offset)`.
//!
//! # How the stream is laid out
//!
//! The generator's key is its 64-bit seed (low word first). Block `c` of the
//! stream is `philox4x32_10([c_lo, c_hi, 0, 0], [seed_lo, seed_hi])`: four
//! 32-bit words. A random op producing `n` elements reserves
//! `ceil(n / per_block)` consecutive blocks starting at the generator's
//! `offset` and advances `offset` by that count; element `i` reads only
//! block `offset + i / per_block`, lane `i % per_block`. So each element's
//! value depends on `(seed, offset, i)` alone, and tensors are generated in
//! parallel with the same result on any thread count.
//!
//! `per_block` is 4 for `rand` of f32/f16/bf16 (one word each), and 2 for
//! everything else (two words, i.e. 64 random bits, per element: f64 `rand`,
//! `randint`, `bernoulli`, `randperm`, truncated normal; and `randn`, where a
//! block feeds one Box–Muller pair).
//!
//! # Checkpointing
//!
//! [`Generator::state`] is the whole state (`seed`, `offset`); restoring it
//! with [`Generator::set_state`] replays exactly the same tensors. The
//! per-thread default generator (used by the methods without a `_with`
//! suffix) is reseeded with [`manual_seed`] and saved/restored with
//! [`default_state`] / [`set_default_state`]. Named streams beside it
//! (Megatron's RNG tracker, for tensor parallelism) live in this thread's
//! table: [`add_tracked`], [`fork`], and [`snapshot`] / [`restore`] for all
//! streams at once.

mod philox;
mod tracker;

use std::cell::RefCell;

use rayon::prelude::*;

pub use philox::philox4x32_10;
pub use tracker::{
    add_tracked, fork, reset_tracked, restore, set_tracked_states, snapshot, tracked_states, RngSnapshot,
};

/// The seed of the default generator before any [`manual_seed`] call
/// (PyTorch's default seed).
pub const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// The complete state of a [`Generator`]: save it with a checkpoint and
/// restore it with [`Generator::set_state`] to replay the same stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RngState {
    /// The Philox key.
    pub seed: u64,
    /// The number of Philox blocks (4 × 32 bits each) consumed so far.
    pub offset: u64,
}

/// A Philox4x32-10 random generator: a seed (the key) and an offset (the
/// next unused counter). See the [module docs](self) for the stream layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generator {
    seed: u64,
    offset: u64,
}

impl Generator {
    /// A generator with key `seed` at offset 0.
    pub const fn new(seed: u64) -> Self {
        Generator { seed, offset: 0 }
    }

    /// Resets the key to `seed` and the offset to 0.
    pub fn manual_seed(&mut self, seed: u64) {
        *self = Generator::new(seed);
    }

    /// The key.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The number of Philox blocks consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The complete state, for checkpoints.
    pub fn state(&self) -> RngState {
        RngState {
            seed: self.seed,
            offset: self.offset,
        }
    }

    /// Restores a state saved with [`Generator::state`].
    pub fn set_state(&mut self, state: RngState) {
        self.seed = state.seed;
        self.offset = state.offset;
    }

    /// Reserves the blocks for `n` elements at `per_block` elements per block
    /// and advances the offset past them. The offset wraps after 2^64 blocks.
    pub(crate) fn reserve(&mut self, n: usize, per_block: usize) -> Stream {
        let stream = Stream {
            key: [self.seed as u32, (self.seed >> 32) as u32],
            start: self.offset,
            per_block,
        };
        self.offset = self.offset.wrapping_add(n.div_ceil(per_block) as u64);
        stream
    }
}

impl Default for Generator {
    /// A generator seeded with [`DEFAULT_SEED`].
    fn default() -> Self {
        Generator::new(DEFAULT_SEED)
    }
}

thread_local! {
    static DEFAULT: RefCell<Generator> = const { RefCell::new(Generator::new(DEFAULT_SEED)) };
}

/// Runs `f` with this thread's default generator. The random methods
/// without a `_with` suffix draw from it.
///
/// Unlike PyTorch's process-wide generator, each thread has its own, starting
/// at [`DEFAULT_SEED`]: data-parallel replicas and pipeline stages run as
/// threads here, and a shared generator would make their draws depend on how
/// the threads interleave.
pub fn with_default_generator<R>(f: impl FnOnce(&mut Generator) -> R) -> R {
    DEFAULT.with(|g| f(&mut g.borrow_mut()))
}

/// Reseeds the default generator with `seed` at offset 0 (PyTorch's
/// `torch.manual_seed`).
pub fn manual_seed(seed: u64) {
    with_default_generator(|g| g.manual_seed(seed));
}

/// The default generator's state, for checkpoints.
pub fn default_state() -> RngState {
    with_default_generator(|g| g.state())
}

/// Restores the default generator's state saved with [`default_state`].
pub fn set_default_state(state: RngState) {
    with_default_generator(|g| g.set_state(state));
}

/// Reserves a stream from `gen`, or from the default generator when `None`
/// (holding its lock only for the reservation, not the generation).
pub(crate) fn reserve(gen: Option<&mut Generator>, n: usize, per_block: usize) -> Stream {
    match gen {
        Some(g) => g.reserve(n, per_block),
        None => with_default_generator(|g| g.reserve(n, per_block)),
    }
}

/// A reserved run of Philox blocks: element `i` reads block `start + i /
/// per_block`, lane `i % per_block`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stream {
    key: [u32; 2],
    start: u64,
    per_block: usize,
}

impl Stream {
    /// The seed and the index of this stream's first 32-bit word (block
    /// `start` lane 0), the coordinates of the GPU generator.
    #[cfg(feature = "cuda")]
    pub(crate) fn seed_and_word(&self) -> (u64, u64) {
        (
            self.key[0] as u64 | (self.key[1] as u64) << 32,
            self.start.wrapping_mul(4),
        )
    }

    /// The seed and the index of this stream's first block, the
    /// coordinates of the GPU normal generator.
    #[cfg(feature = "cuda")]
    pub(crate) fn seed_and_block(&self) -> (u64, u64) {
        (self.key[0] as u64 | (self.key[1] as u64) << 32, self.start)
    }

    /// The four words of block `j` of this stream.
    #[inline]
    fn block(&self, j: u64) -> [u32; 4] {
        let c = self.start.wrapping_add(j);
        philox4x32_10([c as u32, (c >> 32) as u32, 0, 0], self.key)
    }

    /// Word `i` of this stream (block `start + i / 4`, lane `i % 4`): the
    /// word element `i` of an f32 `rand` reads.
    #[inline]
    pub(crate) fn word(&self, i: u64) -> u32 {
        self.block(i / 4)[(i % 4) as usize]
    }

    /// Writes `out[i] = f(i, block of element i, lane of element i)`, in
    /// parallel for large outputs; each block is computed once.
    pub(crate) fn fill<T: Send>(&self, out: &mut [T], f: impl Fn(usize, &[u32; 4], usize) -> T + Sync) {
        let pb = self.per_block;
        debug_assert!(matches!(pb, 1 | 2 | 4));
        // Chunks hold whole blocks, so every element's block is the same
        // whichever chunk it falls in.
        let chunk = crate::strided::chunk_len(out.len()).next_multiple_of(4);
        let fill_chunk = |first: usize, part: &mut [T]| {
            for (k, group) in part.chunks_mut(pb).enumerate() {
                let b = self.block(((first / pb) + k) as u64);
                for (lane, y) in group.iter_mut().enumerate() {
                    *y = f(first + k * pb + lane, &b, lane);
                }
            }
        };
        if out.len() <= chunk {
            fill_chunk(0, out);
        } else {
            out.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(c, part)| fill_chunk(c * chunk, part));
        }
    }
}

/// The top `digits` bits of `w` as a float in [0, 1) with `digits` bits of
/// resolution (exact in any float type with at least `digits` mantissa bits).
#[inline]
pub(crate) fn unit_from_u32(w: u32, digits: u32) -> f64 {
    (w >> (32 - digits)) as f64 * (-(digits as f64)).exp2()
}

/// Two words as one 64-bit integer (`hi` first).
#[inline]
pub(crate) fn u64_from(hi: u32, lo: u32) -> u64 {
    ((hi as u64) << 32) | lo as u64
}

/// A 53-bit uniform float in [0, 1) from two words.
#[inline]
pub(crate) fn unit_f64(hi: u32, lo: u32) -> f64 {
    (u64_from(hi, lo) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(stream: &Stream, n: usize) -> Vec<(u32, usize)> {
        let mut out = vec![(0u32, 0usize); n];
        stream.fill(&mut out, |i, b, lane| {
            assert_eq!(lane, i % stream.per_block);
            (b[lane], lane)
        });
        out
    }

    #[test]
    fn offset_advances_by_blocks_and_state_replays() {
        let mut g = Generator::new(7);
        let s1 = g.reserve(10, 4);
        assert_eq!(g.offset(), 3);
        let saved = g.state();
        let s2 = g.reserve(5, 2);
        assert_eq!(g.offset(), 6);
        g.set_state(saved);
        let s3 = g.reserve(5, 2);
        assert_eq!(collect(&s2, 5), collect(&s3, 5));
        assert_ne!(collect(&s1, 5), collect(&s2, 5));
        g.manual_seed(7);
        assert_eq!(g.state(), RngState { seed: 7, offset: 0 });
    }

    #[test]
    fn elements_read_their_own_block_and_lane() {
        let s = Generator::new(42).reserve(9, 4);
        let got = collect(&s, 9);
        for (i, &(w, lane)) in got.iter().enumerate() {
            let b = philox4x32_10([(i / 4) as u32, 0, 0, 0], [42, 0]);
            assert_eq!((w, lane), (b[i % 4], i % 4));
        }
    }

    #[test]
    fn parallel_fill_matches_sequential() {
        let n = crate::strided::PAR_THRESHOLD * 3 + 5;
        let s = Generator::new(3).reserve(n, 2);
        let want: Vec<u32> = (0..n)
            .map(|i| philox4x32_10([(i / 2) as u32, 0, 0, 0], [3, 0])[i % 2])
            .collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let one = pool.install(|| collect(&s, n));
        let many = collect(&s, n);
        assert_eq!(one, many);
        assert_eq!(many.iter().map(|p| p.0).collect::<Vec<_>>(), want);
    }

    #[test]
    fn unit_conversions_stay_in_range() {
        assert_eq!(unit_from_u32(0, 24), 0.0);
        assert!(unit_from_u32(u32::MAX, 24) < 1.0);
        assert_eq!(unit_from_u32(u32::MAX, 24) as f32, 1.0 - f32::EPSILON / 2.0);
        assert!(unit_f64(u32::MAX, u32::MAX) < 1.0);
        assert_eq!(unit_f64(0x8000_0000, 0), 0.5);
    }
}
