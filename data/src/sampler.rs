//! Samplers: the order in which a loader visits dataset indices. The order
//! for epoch `e` is a pure function of the sampler's seed and `e`.

use crate::{Error, Result, Rng};

/// An order over dataset indices, one per epoch.
pub trait Sampler: Send + Sync {
    /// The number of indices one epoch yields.
    fn len(&self) -> usize;

    /// True when an epoch yields nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indices of epoch `epoch`, in order.
    fn indices(&self, epoch: u64) -> Vec<usize>;
}

/// `0, 1, ..., n-1` every epoch.
#[derive(Debug, Clone)]
pub struct SequentialSampler {
    n: usize,
}

impl SequentialSampler {
    /// The sequential order over `n` indices.
    pub fn new(n: usize) -> Self {
        SequentialSampler { n }
    }
}

impl Sampler for SequentialSampler {
    fn len(&self) -> usize {
        self.n
    }
    fn indices(&self, _epoch: u64) -> Vec<usize> {
        (0..self.n).collect()
    }
}

/// A fresh permutation of `0 .. n` each epoch, drawn from a generator keyed
/// by `(seed, epoch)` (FFCV's RANDOM order convention `seed + epoch`, with
/// this crate's generator).
#[derive(Debug, Clone)]
pub struct RandomSampler {
    n: usize,
    seed: u64,
}

impl RandomSampler {
    /// The random order over `n` indices under `seed`.
    pub fn new(n: usize, seed: u64) -> Self {
        RandomSampler { n, seed }
    }
}

/// The permutation of `0 .. n` for `(seed, epoch)`, shared by the samplers.
pub fn epoch_permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    Rng::keyed(seed, &[epoch]).permutation(n)
}

impl Sampler for RandomSampler {
    fn len(&self) -> usize {
        self.n
    }
    fn indices(&self, epoch: u64) -> Vec<usize> {
        epoch_permutation(self.n, self.seed, epoch)
    }
}

/// PyTorch's `DistributedSampler`: each of `num_replicas` ranks takes every
/// `num_replicas`-th index of one shared (optionally shuffled) order, padded
/// by repetition from its start or truncated so every rank gets the same
/// count.
///
/// - `num_samples = ceil((N − R)/R)` when `drop_last` and `N % R ≠ 0`, else
///   `ceil(N/R)`; `total_size = num_samples·R`.
/// - the order is a permutation keyed by `(seed, epoch)` when shuffling
///   (not bit-identical to `torch.randperm`), else `0 .. N`.
/// - without `drop_last` the order is extended with its own prefix (repeated
///   whole when the padding exceeds `N`); with it, truncated to `total_size`.
/// - rank `r` takes `order[r .. total_size : R]`.
///
/// As in PyTorch the epoch is state: call [`DistributedSampler::set_epoch`]
/// before each epoch, otherwise every epoch has the same order. When the
/// sampler drives a [`crate::DataLoader`], the loader's epoch is used instead.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    n: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: u64,
}

impl DistributedSampler {
    /// The sampler of `rank` among `num_replicas` over `n` indices. Errors
    /// when `num_replicas == 0` or `rank >= num_replicas`.
    pub fn new(
        n: usize,
        num_replicas: usize,
        rank: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
    ) -> Result<Self> {
        if num_replicas == 0 || rank >= num_replicas {
            return Err(Error::arg(
                "DistributedSampler::new",
                format!("rank {rank} is not in [0, num_replicas = {num_replicas})"),
            ));
        }
        Ok(DistributedSampler {
            n,
            num_replicas,
            rank,
            shuffle,
            seed,
            drop_last,
            epoch: 0,
        })
    }

    /// The number of indices each rank gets per epoch.
    pub fn num_samples(&self) -> usize {
        let (n, r) = (self.n, self.num_replicas);
        if self.drop_last && n % r != 0 {
            // ceil((n - r) / r), which is 0 when n < r.
            n.saturating_sub(r).div_ceil(r)
        } else {
            n.div_ceil(r)
        }
    }

    /// `num_samples · num_replicas`: the length of the padded/truncated order.
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.num_replicas
    }

    /// Sets the epoch used by [`DistributedSampler::current_indices`].
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The epoch last set (0 initially).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This rank's indices for the epoch last set with `set_epoch`.
    pub fn current_indices(&self) -> Vec<usize> {
        self.indices(self.epoch)
    }
}

impl Sampler for DistributedSampler {
    fn len(&self) -> usize {
        self.num_samples()
    }

    fn indices(&self, epoch: u64) -> Vec<usize> {
        let mut order = if self.shuffle {
            epoch_permutation(self.n, self.seed, epoch)
        } else {
            (0..self.n).collect()
        };
        let total = self.total_size();
        if order.len() < total && !order.is_empty() {
            let base = order.clone();
            while order.len() < total {
                let take = (total - order.len()).min(base.len());
                order.extend_from_slice(&base[..take]);
            }
        }
        order.truncate(total);
        order
            .into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(n: usize, r: usize, drop_last: bool) -> Vec<Vec<usize>> {
        (0..r)
            .map(|k| {
                DistributedSampler::new(n, r, k, false, 0, drop_last)
                    .unwrap()
                    .indices(0)
            })
            .collect()
    }

    #[test]
    fn spec_vectors_without_shuffle() {
        // Spec §2.3 / §9: N=10, R=4 → num_samples 3, order = perm + perm[:2].
        let s = DistributedSampler::new(10, 4, 0, false, 0, false).unwrap();
        assert_eq!((s.num_samples(), s.total_size()), (3, 12));
        assert_eq!(
            ranks(10, 4, false),
            vec![vec![0, 4, 8], vec![1, 5, 9], vec![2, 6, 0], vec![3, 7, 1]]
        );
        // drop_last: num_samples = ceil(6/4) = 2, total 8.
        let s = DistributedSampler::new(10, 4, 0, false, 0, true).unwrap();
        assert_eq!((s.num_samples(), s.total_size()), (2, 8));
        assert_eq!(
            ranks(10, 4, true),
            vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        // Padding longer than N repeats the whole list: N=3, R=8.
        assert_eq!(
            ranks(3, 8, false),
            vec![
                vec![0],
                vec![1],
                vec![2],
                vec![0],
                vec![1],
                vec![2],
                vec![0],
                vec![1]
            ]
        );
        // drop_last with N < R gives nothing; N % R == 0 is unchanged by drop_last.
        assert!(ranks(3, 4, true).iter().all(Vec::is_empty));
        assert_eq!(ranks(8, 4, true), ranks(8, 4, false));
    }

    #[test]
    fn shuffled_padding_repeats_the_permutation_prefix() {
        let perm = epoch_permutation(10, 5, 2);
        let want: Vec<usize> = perm.iter().chain(&perm[..2]).copied().collect();
        for r in 0..4 {
            let s = DistributedSampler::new(10, 4, r, true, 5, false).unwrap();
            let got = s.indices(2);
            let exp: Vec<usize> = want.iter().skip(r).step_by(4).copied().collect();
            assert_eq!(got, exp);
        }
    }

    #[test]
    fn set_epoch_changes_order_and_is_reproducible() {
        let mut s = DistributedSampler::new(100, 2, 1, true, 0, false).unwrap();
        let e0 = s.current_indices();
        s.set_epoch(1);
        let e1 = s.current_indices();
        assert_ne!(e0, e1);
        s.set_epoch(0);
        assert_eq!(s.current_indices(), e0);
        assert!(DistributedSampler::new(10, 2, 2, true, 0, false).is_err());
    }
}
