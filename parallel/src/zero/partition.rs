//! How ZeRO lays a parameter group out flat and splits it among the ranks
//! (DeepSpeed's `stage_1_and_2.py`, spec §3.2).

/// DeepSpeed's `nccl_start_alignment_factor`: the flat buffer is padded to
/// a multiple of this factor times the world size, so every partition
/// starts at an even element (4-byte aligned for 2-byte types).
pub const ALIGNMENT_FACTOR: usize = 2;

/// The flat layout of one parameter group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatLayout {
    /// Element offset of each parameter in the flat buffer.
    pub offsets: Vec<usize>,
    /// Elements of the parameters together.
    pub numel: usize,
    /// The padded length: a multiple of `ALIGNMENT_FACTOR · world`.
    pub len: usize,
    /// Elements per partition, `len / world`.
    pub part: usize,
}

impl FlatLayout {
    /// The layout of parameters of `numels` elements over `world` ranks.
    pub fn new(numels: &[usize], world: usize) -> FlatLayout {
        let mut offsets = Vec::with_capacity(numels.len());
        let mut numel = 0;
        for &n in numels {
            offsets.push(numel);
            numel += n;
        }
        let align = ALIGNMENT_FACTOR * world.max(1);
        let len = numel.div_ceil(align) * align;
        FlatLayout {
            offsets,
            numel,
            len,
            part: len / world.max(1),
        }
    }

    /// The element range `[start, end)` of rank `rank`'s partition.
    pub fn partition(&self, rank: usize) -> (usize, usize) {
        (rank * self.part, (rank + 1) * self.part)
    }

    /// The zero padding at the end of the buffer.
    pub fn padding(&self) -> usize {
        self.len - self.numel
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The partitions cover the flat buffer exactly once, are equal, and
    /// start 4-byte aligned for 2-byte elements.
    #[test]
    fn partitions_cover_the_flat_parameters_once() {
        for world in 1..=8 {
            for numels in [vec![15], vec![3, 1, 7], vec![1; 5], vec![0, 4], vec![1000, 3]] {
                let l = FlatLayout::new(&numels, world);
                assert_eq!(l.numel, numels.iter().sum::<usize>());
                assert!(l.len >= l.numel && l.len - l.numel < ALIGNMENT_FACTOR * world);
                let mut covered = vec![0u8; l.len];
                for r in 0..world {
                    let (a, b) = l.partition(r);
                    assert_eq!(b - a, l.part);
                    assert_eq!((a * 2) % 4, 0, "partition {r} of {world} starts at {a}");
                    covered[a..b].iter_mut().for_each(|c| *c += 1);
                }
                assert!(covered.iter().all(|&c| c == 1));
            }
        }
    }
}
