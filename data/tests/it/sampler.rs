//! DistributedSampler coverage and padding (proptest) and the samplers' epoch rules.

use proptest::prelude::*;
use tessera_data::{DataLoader, DistributedSampler, RandomSampler, Sampler, VecDataset};

proptest! {
    #[test]
    fn every_index_once_per_epoch_across_ranks(
        n in 0usize..300, world in 1usize..9, drop_last: bool, shuffle: bool, epoch in 0u64..4,
    ) {
        let per_rank: Vec<Vec<usize>> = (0..world)
            .map(|r| DistributedSampler::new(n, world, r, shuffle, 7, drop_last).unwrap().indices(epoch))
            .collect();
        let s = DistributedSampler::new(n, world, 0, shuffle, 7, drop_last).unwrap();
        for v in &per_rank {
            prop_assert_eq!(v.len(), s.num_samples());
        }
        let mut counts = vec![0usize; n];
        for v in &per_rank {
            for &i in v {
                prop_assert!(i < n);
                counts[i] += 1;
            }
        }
        if drop_last {
            // Truncated: each index at most once, exactly n - n % world of them.
            prop_assert!(counts.iter().all(|&c| c <= 1));
            let expect = if n % world == 0 { n } else { (n.saturating_sub(world)).div_ceil(world) * world };
            prop_assert_eq!(counts.iter().sum::<usize>(), expect);
        } else {
            // Padded: every index at least once; the extra copies are the
            // order's prefix, so no index appears more than once beyond ceil(total/n).
            prop_assert!(counts.iter().all(|&c| c >= 1));
            let total = n.div_ceil(world) * world;
            prop_assert_eq!(counts.iter().sum::<usize>(), total);
            if n > 0 {
                let max_rep = total.div_ceil(n);
                prop_assert!(counts.iter().all(|&c| c <= max_rep));
            }
        }
        // Rank r's j-th index is position j·world + r of the shared order.
        let mut interleaved = Vec::new();
        for j in 0..s.num_samples() {
            for v in &per_rank {
                interleaved.push(v[j]);
            }
        }
        let order = if shuffle { tessera_data::epoch_permutation(n, 7, epoch) } else { (0..n).collect() };
        for (k, &i) in interleaved.iter().enumerate() {
            prop_assert_eq!(i, order[k % n.max(1)]);
        }
    }
}

#[test]
fn random_sampler_epochs() {
    let s = RandomSampler::new(100, 3);
    assert_eq!(s.indices(4), s.indices(4));
    assert_ne!(s.indices(4), s.indices(5));
    assert_ne!(s.indices(4), RandomSampler::new(100, 4).indices(4));
}

#[test]
fn loader_with_distributed_sampler_uses_loader_epoch() {
    let mk = |rank| {
        let s = DistributedSampler::new(10, 4, rank, false, 0, false).unwrap();
        DataLoader::builder(VecDataset::new((0..10i64).collect()))
            .batch_size(2)
            .sampler(s)
            .build()
            .unwrap()
    };
    let mut l = mk(2);
    assert_eq!(l.len(), 2);
    let got: Vec<Vec<i64>> = l.iter().map(|b| b.unwrap().to_vec::<i64>().unwrap()).collect();
    assert_eq!(got, vec![vec![2, 6], vec![0]]);
}
